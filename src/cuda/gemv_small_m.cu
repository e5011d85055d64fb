// The small-M projection kernel (gemv_small_m.cuh says why and how).
#include <cuda_bf16.h>

#include "elastic/cuda.h"
#include "bf16_dot.cuh"
#include "gemv_small_m.cuh"
#include "programmatic_launch.cuh"

namespace elastic::cuda {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kInFlight = 8;  // 16-byte chunks of W a lane loads before using any

// W is read once per step: bypass L1, and ask L2 to fetch the whole 256-byte sector group (the next lanes' chunks).
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

template <int M, bool F32>
__global__ void __launch_bounds__(kThreads) small_m_kernel(const uint16_t* __restrict__ X,
                                                            const uint16_t* __restrict__ W, void* __restrict__ Y,
                                                            int N, int K, const uint16_t* __restrict__ bias,
                                                            float beta) {
  const int lane = threadIdx.x & 31;
  const int n = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (n >= N) {  // a tail warp: nothing to compute, but it waits like the rest (no CTA leaves before its wait)
    pdl_enter();
    return;
  }
  const int K8 = K >> 3;
  const uint4* w = reinterpret_cast<const uint4*>(W + size_t(n) * K);
  const uint4* x = reinterpret_cast<const uint4*>(X);
  // One chunk of W against every row's chunk u of X.
  auto step = [&](const uint4& wv, int at, float (&acc)[M]) {
#pragma unroll
    for (int r = 0; r < M; ++r) acc[r] = dot8_bf16(wv, __ldg(x + size_t(r) * K8 + at), acc[r]);
  };
  float acc[M];
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = 0.f;
  int i = lane;
  uint4 wv[kInFlight];
  bool more = i + (kInFlight - 1) * 32 < K8;
  // The first chunks of W go out before the wait: no kernel writes the weights, so under programmatic launch
  // (programmatic_launch.cuh) they stream in while the kernel before this one finishes. X and Y only after it.
  if (more) {
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) wv[u] = load_stream(w + i + u * 32);
  }
  pdl_enter();  // X (and Y below) only after it: griddepcontrol.wait makes the previous grid's writes visible here
  while (more) {
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) step(wv[u], i + u * 32, acc);
    i += kInFlight * 32;
    more = i + (kInFlight - 1) * 32 < K8;
    if (more) {
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) wv[u] = load_stream(w + i + u * 32);
    }
  }
  {  // the row's tail: every remaining chunk of this lane (fewer than kInFlight) loaded before any is used
#pragma unroll
    for (int u = 0; u < kInFlight - 1; ++u)
      if (i + u * 32 < K8) wv[u] = load_stream(w + i + u * 32);
#pragma unroll
    for (int u = 0; u < kInFlight - 1; ++u)
      if (i + u * 32 < K8) step(wv[u], i + u * 32, acc);
  }
  float v = warp_row_total<M>(acc, lane);
  if (lane >= M) return;
  const size_t at = size_t(lane) * N + n;
  if constexpr (F32) {
    static_cast<float*>(Y)[at] = v;
  } else {
    uint16_t* y = static_cast<uint16_t*>(Y);
    // As cuBLASLt: bias and beta * C join the fp32 sum, then one rounding to bf16 (the model never passes both; were
    // it to, the fp32 order here, bias first, could differ from cuBLASLt's in the last fp32 bit).
    if (bias) v += __uint_as_float(uint32_t(bias[n]) << 16);
    if (beta != 0.f) v = fmaf(beta, __uint_as_float(uint32_t(y[at]) << 16), v);
    const __nv_bfloat16 h = __float2bfloat16(v);
    y[at] = *reinterpret_cast<const uint16_t*>(&h);
  }
}

template <bool F32>
void launch_rows(const uint16_t* X, const uint16_t* W, void* Y, int M, int N, int K, const uint16_t* bias,
                 float beta, cudaStream_t stream) {
  const int blocks = (N + kWarps - 1) / kWarps;
  auto kernel = M == 1   ? small_m_kernel<1, F32>
                : M == 2 ? small_m_kernel<2, F32>
                : M == 3 ? small_m_kernel<3, F32>
                         : small_m_kernel<4, F32>;
  launch_programmatic(kernel, blocks, kThreads, 0, stream, X, W, Y, N, K, bias, beta);
}

}  // namespace

bool small_m_gemv_fits(const void* X, const void* W, int M, int K) {
  return M >= 1 && M <= kSmallMMaxRows && K > 0 && K % 8 == 0 && reinterpret_cast<uintptr_t>(X) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(W) % 16 == 0;
}

void small_m_gemv(const uint16_t* X, const uint16_t* W, void* Y, bool y_f32, int M, int N, int K,
                  const uint16_t* bias, float beta, cudaStream_t stream) {
  if (y_f32) launch_rows<true>(X, W, Y, M, N, K, nullptr, 0.f, stream);
  else launch_rows<false>(X, W, Y, M, N, K, bias, beta, stream);
}

}  // namespace elastic::cuda
