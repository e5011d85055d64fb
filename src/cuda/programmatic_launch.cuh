#pragma once
// Programmatic dependent launch (PDL, Hopper) for the decode step's kernels.
//
// Why: a batch-1 decode step is some 400 small kernels (11 a layer), each reading what the one before wrote. In
// plain stream order a kernel's CTAs start only after the previous grid has drained, so every boundary pays the
// tail of one grid, the launch of the next and its ramp-up, with DRAM idle meanwhile. With PDL the next grid is
// launched once every CTA of the running one has called pdl_launch_dependents; its CTAs take the SMs as they free up
// and block in pdl_wait until the running grid has completed and its writes are visible. What a kernel reads from no
// earlier kernel (a projection's weights) it may load before its wait, so those bytes stream in meanwhile.
//
// Rules that keep it correct:
//   * a kernel launched with launch_programmatic calls pdl_wait (pdl_enter) before it reads or writes anything an earlier kernel
//     of the stream writes or reads; only its constant inputs (weights) may be read before;
//   * it calls pdl_launch_dependents after its pdl_wait, so at most one grid waits ahead of the running one (no chain
//     of waiting grids filling the SMs), and when pdl_wait returns, every earlier kernel has completed;
//   * no thread returns before its pdl_wait (early exits come after it): a grid whose CTAs all left without waiting
//     would complete, and release the next grid's wait, while its own predecessor still runs;
//   * without the launch attribute (no enabled ProgrammaticLaunch scope, programmatic_launch.h) both instructions are
//     no-ops and the kernels run in plain stream order, with the same arithmetic: the same bits either way.
// The attribute is set only inside a ProgrammaticLaunch scope: GpuModel's decode step, when GpuOptions::
// programmatic_launch (fixed when the model is built) asks for it. Elsewhere (prefill, tests) the same launchers
// launch plainly.
#include <cuda_runtime.h>

#include <utility>

#include "elastic/cuda.h"
#include "programmatic_launch.h"

namespace elastic::cuda {

// The host sets the attribute whatever the device code was built for: a pass without griddepcontrol would let
// grids overlap with no wait, so device code for anything older than sm_90 must not build.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "programmatic_launch.cuh needs sm_90 or newer device code (griddepcontrol)"
#endif

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A PDL kernel's entry, in the order the rules above ask: wait for the previous grid, then let the next one launch.
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_launch_dependents();
}

// kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute inside an enabled ProgrammaticLaunch
// scope. Only for kernels that call pdl_wait before touching their predecessors' data (see the rules above).
// Checks the launch's own result (ELASTIC_CUDA_CHECK), so callers need no cudaGetLastError after it.
template <typename... KArgs, typename... Args>
void launch_programmatic(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                         Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = pdl_detail::enabled() ? 1 : 0;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  ELASTIC_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace elastic::cuda
