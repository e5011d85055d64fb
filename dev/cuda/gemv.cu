// Dev area: a decode GEMV (gemv.h), measured slower than cuBLASLt inside the model (see gemv.h). Block = 8 warps; the block first builds the m input rows x' in shared memory (plain
// copy, RMSNorm or SwiGLU), then each warp takes output features n = block * 8 + warp, + grid * 8, ... and streams
// W's row n: lane l reads 16-byte chunks l, l + 32, ... four at a time (64 B in flight per lane before any use), dots
// them with x' from shared memory into one fp32 sum per input row, and the warp reduces by shuffles.
//
// The RMSNorm prologue sums squares in rmsnorm_bf16's order (thread t takes i = t, t + 256, ...; shuffles in the warp;
// warp 0 sums the warp totals), so x' has the bits rmsnorm_bf16 writes: the fused form changes no result.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <string>

#include "elastic/cuda.h"
#include "cuda/bf16_dot.cuh"
#include "gemv.h"

namespace elastic::cuda {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kUnroll = 4;  // 16-byte chunks of W in flight per lane
constexpr size_t kMaxSmem = 160u << 10;  // the rebuilt inputs x' (m * k bf16) gemv_bf16 accepts

__device__ __forceinline__ float bf2f(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }
__device__ __forceinline__ uint16_t f2bf(float f) {
  const __nv_bfloat16 h = __float2bfloat16(f);
  return *reinterpret_cast<const uint16_t*>(&h);
}

// The chunk's dot product from zero (its first term a plain product), added to the row's sum by the caller.
__device__ __forceinline__ float dot8(const uint4& w, const uint4& x) { return dot8_bf16(w, x, 0.f); }

// Sum over the block in rmsnorm_bf16's order (see the file comment). Every thread gets the total.
__device__ float block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // scratch may still be read from the previous row
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kWarps ? scratch[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) scratch[kWarps] = v;
  }
  __syncthreads();
  return scratch[kWarps];
}

template <int M, bool F32, bool VEC>
__global__ void __launch_bounds__(kThreads) gemv_kernel(GemvParams p) {
  extern __shared__ __align__(16) uint16_t xs[];  // [M, K] x'
  __shared__ float scratch[kWarps + 1];
  const int K = p.k, N = p.n;
  const uint16_t* x = p.x;
  for (int r = 0; r < M; ++r) {
    uint16_t* dst = xs + size_t(r) * K;
    if (p.norm_w) {
      const uint16_t* xr = x + size_t(r) * K;
      float ss = 0.f;
      for (int i = threadIdx.x; i < K; i += kThreads) {
        const float v = bf2f(xr[i]);
        ss += v * v;
      }
      const float inv = rsqrtf(block_sum(ss, scratch) / K + p.eps);
      for (int i = threadIdx.x; i < K; i += kThreads) dst[i] = f2bf(bf2f(p.norm_w[i]) * (bf2f(xr[i]) * inv));
    } else if (p.swiglu) {
      const uint16_t* gr = x + size_t(r) * 2 * K;
      for (int i = threadIdx.x; i < K; i += kThreads) {
        const float g = bf2f(gr[i]);
        dst[i] = f2bf(g / (1.f + expf(-g)) * bf2f(gr[K + i]));
      }
    } else {
      const uint16_t* xr = x + size_t(r) * K;
      for (int i = threadIdx.x; i < K; i += kThreads) dst[i] = xr[i];
    }
  }
  __syncthreads();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int n = blockIdx.x * kWarps + warp; n < N; n += gridDim.x * kWarps) {
    float acc[M];
#pragma unroll
    for (int r = 0; r < M; ++r) acc[r] = 0.f;
    if constexpr (VEC) {
      const int K8 = K / 8;
      const uint4* wr = reinterpret_cast<const uint4*>(p.w + size_t(n) * K);
      const uint4* x4 = reinterpret_cast<const uint4*>(xs);
      int i = lane;
      for (; i + (kUnroll - 1) * 32 < K8; i += kUnroll * 32) {
        uint4 wv[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) wv[u] = __ldcs(wr + i + u * 32);  // W is read once: stream it past L1/L2
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
#pragma unroll
          for (int r = 0; r < M; ++r) acc[r] += dot8(wv[u], x4[size_t(r) * K8 + i + u * 32]);
      }
      for (; i < K8; i += 32) {
        const uint4 wv = __ldcs(wr + i);
#pragma unroll
        for (int r = 0; r < M; ++r) acc[r] += dot8(wv, x4[size_t(r) * K8 + i]);
      }
    } else {
      const uint16_t* wr = p.w + size_t(n) * K;
      for (int i = lane; i < K; i += 32) {
        const float wv = bf2f(wr[i]);
#pragma unroll
        for (int r = 0; r < M; ++r) acc[r] = fmaf(wv, bf2f(xs[size_t(r) * K + i]), acc[r]);
      }
    }
    float v = warp_row_total<M>(acc, lane);
    if (lane < M) {
      const size_t at = size_t(lane) * N + n;
      if constexpr (F32) {
        static_cast<float*>(p.y)[at] = v;
      } else {
        uint16_t* y = static_cast<uint16_t*>(p.y);
        if (p.accumulate) v += bf2f(y[at]);
        y[at] = f2bf(v);
      }
    }
  }
}

template <int M, bool F32, bool VEC>
void launch(const GemvParams& p, size_t smem, cudaStream_t stream) {
  // Large K (a 14336-wide MLP at m = 4 needs 112 KiB) needs the opt-in shared memory limit; set once per kernel to
  // the most gemv_bf16 accepts (kMaxSmem, below every sm_90 part's 227 KiB opt-in).
  static std::once_flag once;
  std::call_once(once, [] {
    ELASTIC_CUDA_CHECK(cudaFuncSetAttribute(gemv_kernel<M, F32, VEC>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            int(kMaxSmem)));
  });
  static int sms = [] {
    int dev = 0, n = 0;
    ELASTIC_CUDA_CHECK(cudaGetDevice(&dev));
    ELASTIC_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  }();
  // Enough blocks to fill every SM several times over; beyond that warps loop over features, which spreads the
  // prologue (rebuilding x') over more rows of W.
  const int blocks = std::min((p.n + kWarps - 1) / kWarps, sms * 8);
  gemv_kernel<M, F32, VEC><<<blocks, kThreads, smem, stream>>>(p);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

template <bool F32, bool VEC>
void dispatch_rows(const GemvParams& p, size_t smem, cudaStream_t stream) {
  switch (p.m) {
    case 1: return launch<1, F32, VEC>(p, smem, stream);
    case 2: return launch<2, F32, VEC>(p, smem, stream);
    case 3: return launch<3, F32, VEC>(p, smem, stream);
    default: return launch<4, F32, VEC>(p, smem, stream);
  }
}

void need(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("gemv_bf16: " + what);
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

}  // namespace

void gemv_bf16(const GemvParams& p, cudaStream_t stream) {
  need(p.m >= 1 && p.m <= kGemvMaxRows,
       "m must be 1.." + std::to_string(kGemvMaxRows) + " (larger batches go through cuBLASLt), got " +
           std::to_string(p.m));
  need(p.n > 0 && p.k > 0, "n and k must be > 0, got n " + std::to_string(p.n) + ", k " + std::to_string(p.k));
  need(p.x && p.w && p.y, "null x, w or y");
  need(!(p.norm_w && p.swiglu), "norm_w and swiglu are exclusive");
  need(!(p.accumulate && p.y_f32), "accumulate needs bf16 output");
  const size_t x_bytes = size_t(p.m) * p.k * (p.swiglu ? 4 : 2);
  const size_t y_bytes = size_t(p.m) * p.n * (p.y_f32 ? 4 : 2);
  need(!overlaps(p.x, x_bytes, p.y, y_bytes), "x and y overlap (blocks read x while others write y)");
  const size_t smem = size_t(p.m) * p.k * 2;
  need(smem <= kMaxSmem, "m * k bf16 inputs must fit 160 KiB of shared memory, got m " + std::to_string(p.m) +
                                 ", k " + std::to_string(p.k));
  const bool vec = p.k % 8 == 0 && reinterpret_cast<uintptr_t>(p.w) % 16 == 0;
  if (p.y_f32)
    vec ? dispatch_rows<true, true>(p, smem, stream) : dispatch_rows<true, false>(p, smem, stream);
  else
    vec ? dispatch_rows<false, true>(p, smem, stream) : dispatch_rows<false, false>(p, smem, stream);
}

}  // namespace elastic::cuda
