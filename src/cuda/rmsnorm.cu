#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "elastic/cuda.h"

namespace elastic::cuda {
namespace {

// One block per row; fp32 sum of squares reduced through warp shuffles then shared memory.
__global__ void rmsnorm_bf16_kernel(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int n,
                                    float eps) {
  const __nv_bfloat16* xr = x + static_cast<size_t>(blockIdx.x) * n;
  __nv_bfloat16* yr = y + static_cast<size_t>(blockIdx.x) * n;
  float ss = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float v = __bfloat162float(xr[i]);
    ss += v * v;
  }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  __shared__ float warp_sums[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = ss;
  __syncthreads();
  if (warp == 0) {
    ss = lane < (blockDim.x + 31) / 32 ? warp_sums[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) warp_sums[0] = ss;
  }
  __syncthreads();
  const float inv = rsqrtf(warp_sums[0] / n + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    yr[i] = __float2bfloat16(__bfloat162float(w[i]) * (__bfloat162float(xr[i]) * inv));
}

}  // namespace

void rmsnorm_bf16(const uint16_t* x, const uint16_t* w, uint16_t* y, int rows, int n, float eps) {
  if (rows <= 0) return;
  rmsnorm_bf16_kernel<<<rows, 256>>>(reinterpret_cast<const __nv_bfloat16*>(x),
                                     reinterpret_cast<const __nv_bfloat16*>(w), reinterpret_cast<__nv_bfloat16*>(y),
                                     n, eps);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace elastic::cuda
