// CUDA elementwise and row kernels of the decoder (include/elastic/cuda_ops.h): embedding, RMSNorm (plain and fused
// with the residual add), the fused q/k/v post-processing, SwiGLU, residual add, per-head KV cache writes, argmax and
// fills. bf16 in memory, fp32 math. Row ops run one block per row; elementwise ops use grid-stride loops and move 8
// bf16 (16 bytes) per access when the sizes and pointers allow it, else fall back to the same kernel one element at a
// time. Pointers are never __restrict__: the contract allows in-place use (x == y), and every thread reads and
// writes only its own elements, so aliasing is safe.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "elastic/cuda.h"
#include "elastic/cuda_ops.h"
#include "programmatic_launch.cuh"

namespace elastic::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;          // row kernels and grid-stride kernels
constexpr int kArgmaxThreads = 1024;   // one block per row over a whole vocabulary
constexpr int64_t kMaxBlocks = 8192;   // grid-stride kernels: enough to fill an H200 several times over

[[noreturn]] void bad(const char* fn, const std::string& what) {
  throw std::invalid_argument(std::string(fn) + ": " + what);
}
void need(bool ok, const char* fn, const std::string& what) {
  if (!ok) bad(fn, what);
}
std::string got(int64_t v) { return " (got " + std::to_string(v) + ")"; }

__host__ __device__ __forceinline__ const bf16* as_bf16(const uint16_t* p) { return reinterpret_cast<const bf16*>(p); }
__host__ __device__ __forceinline__ bf16* as_bf16(uint16_t* p) { return reinterpret_cast<bf16*>(p); }

__host__ __device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

int blocks_for(int64_t work, int threads) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((work + threads - 1) / threads, kMaxBlocks)));
}

// VEC contiguous bf16 <-> fp32. VEC == 8 is one 16-byte access (the caller guarantees alignment).
template <int VEC>
__device__ __forceinline__ void load_bf16(const bf16* p, float (&v)[VEC]) {
  if constexpr (VEC == 8) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = __bfloat1622float2(h[e]);
      v[2 * e] = f.x, v[2 * e + 1] = f.y;
    }
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) v[e] = __bfloat162float(p[e]);
  }
}

template <int VEC>
__device__ __forceinline__ void store_bf16(bf16* p, const float (&v)[VEC]) {
  if constexpr (VEC == 8) {
    uint4 u;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
    for (int e = 0; e < 4; ++e) h[e] = __floats2bfloat162_rn(v[2 * e], v[2 * e + 1]);
    *reinterpret_cast<uint4*>(p) = u;
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) p[e] = __float2bfloat16(v[e]);
  }
}

__device__ __forceinline__ float round_bf16(float f) { return __bfloat162float(__float2bfloat16(f)); }

// Sum over the block (blockDim.x a multiple of 32, at most 1024). Every thread must call it; it may be called again.
__device__ float block_sum(float v) {
  __shared__ float warp_sums[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x + 31) / 32 ? warp_sums[lane] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) warp_sums[0] = v;
  }
  __syncthreads();
  const float total = warp_sums[0];
  __syncthreads();  // nobody overwrites warp_sums before everyone has read the total
  return total;
}

// ---- embedding -----------------------------------------------------------------------------------------------

// One block per token; U is the copy unit (uint4 = 8 bf16, or one uint16_t). Raw bit copies: no rounding.
template <class U>
__global__ void embed_kernel(const U* table, const int32_t* ids, U* out, int du, int V) {
  pdl_enter();  // programmatic_launch.cuh: before the first read of an earlier kernel's output
  const int t = blockIdx.x, id = ids[t];
  const bool ok = id >= 0 && id < V;
  const U* src = table + static_cast<size_t>(ok ? id : 0) * du;
  U* dst = out + static_cast<size_t>(t) * du;
  for (int c = threadIdx.x; c < du; c += blockDim.x) dst[c] = ok ? src[c] : U{};
}

// ---- RMSNorm -------------------------------------------------------------------------------------------------

// One block per row. With ADD: residual = bf16(residual + x) is stored, and the norm is of that stored value.
// y = w * (v * rsqrt(mean(v^2) + eps)), the CPU model's order of operations.
template <int VEC, bool ADD>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_kernel(const bf16* x, bf16* residual, const bf16* w, bf16* y, int n, float eps) {
  pdl_enter();  // programmatic_launch.cuh: before the first read of an earlier kernel's output
  const size_t row = static_cast<size_t>(blockIdx.x) * n;
  const int nv = n / VEC;
  float ss = 0.f;
  for (int c = threadIdx.x; c < nv; c += blockDim.x) {
    const size_t o = row + static_cast<size_t>(c) * VEC;
    float v[VEC];
    load_bf16<VEC>(x + o, v);
    if constexpr (ADD) {
      float r[VEC];
      load_bf16<VEC>(residual + o, r);
#pragma unroll
      for (int e = 0; e < VEC; ++e) v[e] = round_bf16(r[e] + v[e]);
      store_bf16<VEC>(residual + o, v);
    }
#pragma unroll
    for (int e = 0; e < VEC; ++e) ss += v[e] * v[e];
  }
  const float inv = rsqrtf(block_sum(ss) / n + eps);
  const bf16* src = ADD ? residual : x;  // this thread re-reads only what it read (and, with ADD, wrote) above
  for (int c = threadIdx.x; c < nv; c += blockDim.x) {
    const size_t o = row + static_cast<size_t>(c) * VEC;
    float v[VEC], ww[VEC];
    load_bf16<VEC>(src + o, v);
    load_bf16<VEC>(w + static_cast<size_t>(c) * VEC, ww);
#pragma unroll
    for (int e = 0; e < VEC; ++e) v[e] = ww[e] * (v[e] * inv);
    store_bf16<VEC>(y + o, v);
  }
}

template <bool ADD>
void launch_rmsnorm(const uint16_t* x, uint16_t* residual, const uint16_t* w, uint16_t* y, int rows, int n, float eps,
                    cudaStream_t stream) {
  const bool vec = n % 8 == 0 && aligned16(x) && aligned16(w) && aligned16(y) && (!ADD || aligned16(residual));
  if (vec)
    launch_programmatic(rmsnorm_kernel<8, ADD>, rows, kThreads, 0, stream, as_bf16(x), as_bf16(residual), as_bf16(w),
                        as_bf16(y), n, eps);
  else
    launch_programmatic(rmsnorm_kernel<1, ADD>, rows, kThreads, 0, stream, as_bf16(x), as_bf16(residual), as_bf16(w),
                        as_bf16(y), n, eps);
}

// ---- q/k/v post-processing -----------------------------------------------------------------------------------

// Grid (T, Hq + Hkv): block (t, hh) does query head hh (hh < Hq) or KV head hh - Hq of token t. Thread i < hd/2
// owns the RoPE pair (i, i + hd/2) through bias, norm, pool and rotation, so the head never leaves registers.
// The pool gets the fp32 value after k_norm (not rounded to bf16), as the CPU model, which rounds nothing.
// RoPE angle = float(pos) * inv_freq[i] in fp32 (the CPU model's and HF's product), then full-range sincosf (no
// fast math): at pos ~256K the angle is ~2.6e5 rad with an fp32 spacing of ~0.016 rad, an error the reference
// implementations share because they form the same fp32 product.
__global__ void qkv_post_kernel(QkvPostParams p) {
  pdl_enter();  // programmatic_launch.cuh: before the first read of an earlier kernel's output
  const int t = blockIdx.x, hh = blockIdx.y, i = threadIdx.x;
  const int hd = p.head_dim, half = hd / 2, Hq = p.n_heads, Hkv = p.n_kv_heads;
  const int pos = p.pos_dev ? p.pos_dev[t] : (p.pos0_dev ? *p.pos0_dev : p.pos0) + t;
  const bool is_q = hh < Hq, active = i < half;
  const int kvh = hh - Hq;
  const size_t row = static_cast<size_t>(t) * (Hq + 2 * Hkv) * hd;
  const bf16* qkv = as_bf16(p.qkv);
  const bf16* bias = as_bf16(p.bias);
  const int col = hh * hd;  // q head h at h*hd, k head kvh at (Hq + kvh)*hd: both hh*hd
  float x1 = 0.f, x2 = 0.f;
  if (active) {
    x1 = __bfloat162float(qkv[row + col + i]);
    x2 = __bfloat162float(qkv[row + col + i + half]);
    if (bias) x1 += __bfloat162float(bias[col + i]), x2 += __bfloat162float(bias[col + i + half]);
  }
  const bf16* nw = as_bf16(is_q ? p.q_norm : p.k_norm);
  if (nw) {  // uniform over the block, so every thread reaches block_sum's barriers
    const float inv = rsqrtf(block_sum(x1 * x1 + x2 * x2) / hd + p.eps);
    x1 = active ? __bfloat162float(nw[i]) * (x1 * inv) : 0.f;
    x2 = active ? __bfloat162float(nw[i + half]) * (x2 * inv) : 0.f;
  }
  if (!active) return;
  if (!is_q && p.pool_sum && (pos < p.pool_first_end || pos >= p.pool_last_begin)) {
    atomicAdd(p.pool_sum + static_cast<size_t>(kvh) * hd + i, x1);
    atomicAdd(p.pool_sum + static_cast<size_t>(kvh) * hd + i + half, x2);
  }
  float s, c;
  sincosf(static_cast<float>(pos) * p.inv_freq[i], &s, &c);
  const float y1 = x1 * c - x2 * s, y2 = x2 * c + x1 * s;
  if (is_q) {
    bf16* o = as_bf16(p.q_out) + (static_cast<size_t>(t) * Hq + hh) * hd;
    o[i] = __float2bfloat16(y1);
    o[i + half] = __float2bfloat16(y2);
    return;
  }
  const size_t orow = (static_cast<size_t>(p.kv_rows_from_zero ? t : pos) * Hkv + kvh) * hd;
  bf16* ko = as_bf16(p.k_out) + orow;
  ko[i] = __float2bfloat16(y1);
  ko[i + half] = __float2bfloat16(y2);
  const int vcol = (Hq + Hkv + kvh) * hd;
  float v1 = __bfloat162float(qkv[row + vcol + i]), v2 = __bfloat162float(qkv[row + vcol + i + half]);
  if (bias) v1 += __bfloat162float(bias[vcol + i]), v2 += __bfloat162float(bias[vcol + i + half]);
  bf16* vo = as_bf16(p.v_out) + orow;
  vo[i] = __float2bfloat16(v1);
  vo[i + half] = __float2bfloat16(v2);
}

// ---- SwiGLU and residual add ---------------------------------------------------------------------------------

template <int VEC>
__global__ void swiglu_kernel(const bf16* gate_up, bf16* out, int T, int F) {
  pdl_enter();  // programmatic_launch.cuh: before the first read of an earlier kernel's output
  const int64_t fv = F / VEC, total = static_cast<int64_t>(T) * fv;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < total;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = u / fv, c = (u % fv) * VEC;
    float g[VEC], up[VEC];
    load_bf16<VEC>(gate_up + t * 2 * F + c, g);
    load_bf16<VEC>(gate_up + t * 2 * F + F + c, up);
#pragma unroll
    for (int e = 0; e < VEC; ++e) g[e] = g[e] / (1.f + expf(-g[e])) * up[e];
    store_bf16<VEC>(out + t * F + c, g);
  }
}

// VEC-wide main part, then the n % VEC tail one element at a time.
template <int VEC>
__global__ void add_kernel(bf16* y, const bf16* x, int64_t n) {
  const int64_t nv = n / VEC, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t u = first; u < nv; u += stride) {
    float a[VEC], b[VEC];
    load_bf16<VEC>(y + u * VEC, a);
    load_bf16<VEC>(x + u * VEC, b);
#pragma unroll
    for (int e = 0; e < VEC; ++e) a[e] += b[e];
    store_bf16<VEC>(y + u * VEC, a);
  }
  for (int64_t i = nv * VEC + first; i < n; i += stride)
    y[i] = __float2bfloat16(__bfloat162float(y[i]) + __bfloat162float(x[i]));
}

// ---- argmax --------------------------------------------------------------------------------------------------

// (v, i) beats (bv, bi) when larger, or equal with a lower index: the lowest index wins ties. The start state
// (-inf, INT_MAX) loses to every element, so an all -inf row gives 0.
__device__ __forceinline__ void take_max(float v, int i, float& bv, int& bi) {
  if (v > bv || (v == bv && i < bi)) bv = v, bi = i;
}

template <int VEC>
__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const float* logits, int V, int32_t* out) {
  pdl_enter();  // programmatic_launch.cuh: before the first read of an earlier kernel's output
  const float* row = logits + static_cast<size_t>(blockIdx.x) * V;
  float bv = -INFINITY;
  int bi = INT_MAX;
  const int nv = V / VEC;
  for (int c = threadIdx.x; c < nv; c += blockDim.x) {
    if constexpr (VEC == 4) {
      const float4 f = reinterpret_cast<const float4*>(row)[c];
      take_max(f.x, 4 * c, bv, bi);
      take_max(f.y, 4 * c + 1, bv, bi);
      take_max(f.z, 4 * c + 2, bv, bi);
      take_max(f.w, 4 * c + 3, bv, bi);
    } else {
      take_max(row[c], c, bv, bi);
    }
  }
  for (int i = nv * VEC + threadIdx.x; i < V; i += blockDim.x) take_max(row[i], i, bv, bi);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    take_max(ov, oi, bv, bi);
  }
  __shared__ float sv[32];
  __shared__ int si[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sv[warp] = bv, si[warp] = bi;
  __syncthreads();
  if (warp == 0) {
    const bool have = lane < static_cast<int>(blockDim.x + 31) / 32;
    bv = have ? sv[lane] : -INFINITY;
    bi = have ? si[lane] : INT_MAX;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      take_max(ov, oi, bv, bi);
    }
    if (lane == 0) out[blockIdx.x] = bi;
  }
}

// ---- fills ---------------------------------------------------------------------------------------------------

// splitmix64's finalizer: a bijective 64-bit mixer.
__host__ __device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// u_i = the top 24 bits of mix64(key + (i + 1) * golden gamma) scaled to [0, 2) and shifted to [-1, 1): exact in
// fp32. key = mix64(seed) so nearby seeds give unrelated streams. Depends only on (seed, i), not on the launch.
__global__ void fill_uniform_kernel(bf16* x, int64_t n, uint64_t key, float scale) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t h = mix64(key + static_cast<uint64_t>(i + 1) * 0x9e3779b97f4a7c15ull);
    const float u = static_cast<float>(h >> 40) * 0x1p-23f - 1.f;
    x[i] = __float2bfloat16(scale * u);
  }
}

__global__ void fill_const_kernel(bf16* x, int64_t n, float value) {
  const bf16 v = __float2bfloat16(value);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = v;
}

}  // namespace

// ---- entry points ----------------------------------------------------------------------------------------------

void embed_rows_bf16(const uint16_t* table, const int32_t* ids, uint16_t* out, int T, int D, int V,
                     cudaStream_t stream) {
  const char* fn = "embed_rows_bf16";
  need(T >= 0, fn, "T must be >= 0" + got(T));
  need(D > 0, fn, "D must be > 0" + got(D));
  need(V > 0, fn, "V must be > 0" + got(V));
  if (T == 0) return;
  need(table && ids && out, fn, "null table, ids or out");
  if (D % 8 == 0 && aligned16(table) && aligned16(out))
    launch_programmatic(embed_kernel<uint4>, T, 128, 0, stream, reinterpret_cast<const uint4*>(table), ids,
                        reinterpret_cast<uint4*>(out), D / 8, V);
  else
    launch_programmatic(embed_kernel<uint16_t>, T, 128, 0, stream, table, ids, out, D, V);
}

void rmsnorm_bf16_stream(const uint16_t* x, const uint16_t* w, uint16_t* y, int rows, int n, float eps,
                         cudaStream_t stream) {
  const char* fn = "rmsnorm_bf16_stream";
  need(rows >= 0, fn, "rows must be >= 0" + got(rows));
  need(n > 0, fn, "n must be > 0" + got(n));
  if (rows == 0) return;
  need(x && w && y, fn, "null x, w or y");
  launch_rmsnorm<false>(x, nullptr, w, y, rows, n, eps, stream);
}

void add_rmsnorm_bf16(uint16_t* residual, const uint16_t* x, const uint16_t* w, uint16_t* y, int rows, int n,
                      float eps, cudaStream_t stream) {
  const char* fn = "add_rmsnorm_bf16";
  need(rows >= 0, fn, "rows must be >= 0" + got(rows));
  need(n > 0, fn, "n must be > 0" + got(n));
  if (rows == 0) return;
  need(x && w && y, fn, "null x, w or y");
  if (residual)
    launch_rmsnorm<true>(x, residual, w, y, rows, n, eps, stream);
  else  // no residual stream: the plain norm of x
    launch_rmsnorm<false>(x, nullptr, w, y, rows, n, eps, stream);
}

void qkv_post(const QkvPostParams& p, cudaStream_t stream) {
  const char* fn = "qkv_post";
  need(p.T >= 0, fn, "T must be >= 0" + got(p.T));
  need(p.n_heads > 0, fn, "n_heads must be > 0" + got(p.n_heads));
  need(p.n_kv_heads > 0, fn, "n_kv_heads must be > 0" + got(p.n_kv_heads));
  need(p.n_heads + p.n_kv_heads <= 65535, fn, "n_heads + n_kv_heads must be <= 65535");
  need(p.head_dim > 0 && p.head_dim % 2 == 0 && p.head_dim <= 256, fn,
       "head_dim must be even and in [2, 256]" + got(p.head_dim));
  need(p.pos_dev || p.pos0_dev || p.pos0 >= 0, fn, "pos0 must be >= 0" + got(p.pos0));
  if (p.T == 0) return;
  need(p.qkv && p.inv_freq && p.q_out && p.k_out && p.v_out, fn, "null qkv, inv_freq, q_out, k_out or v_out");
  const int threads = std::max(32, (p.head_dim / 2 + 31) / 32 * 32);
  launch_programmatic(qkv_post_kernel, dim3(p.T, p.n_heads + p.n_kv_heads), threads, 0, stream, p);
}

void swiglu_bf16(const uint16_t* gate_up, uint16_t* out, int T, int F, cudaStream_t stream) {
  const char* fn = "swiglu_bf16";
  need(T >= 0, fn, "T must be >= 0" + got(T));
  need(F > 0, fn, "F must be > 0" + got(F));
  if (T == 0) return;
  need(gate_up && out, fn, "null gate_up or out");
  const int64_t n = static_cast<int64_t>(T) * F;
  if (F % 8 == 0 && aligned16(gate_up) && aligned16(out))
    launch_programmatic(swiglu_kernel<8>, blocks_for(n / 8, kThreads), kThreads, 0, stream, as_bf16(gate_up),
                        as_bf16(out), T, F);
  else
    launch_programmatic(swiglu_kernel<1>, blocks_for(n, kThreads), kThreads, 0, stream, as_bf16(gate_up),
                        as_bf16(out), T, F);
}

void add_inplace_bf16(uint16_t* y, const uint16_t* x, int64_t n, cudaStream_t stream) {
  const char* fn = "add_inplace_bf16";
  need(n >= 0, fn, "n must be >= 0" + got(n));
  if (n == 0) return;
  need(y && x, fn, "null y or x");
  if (aligned16(y) && aligned16(x))
    add_kernel<8><<<blocks_for(n / 8 + 1, kThreads), kThreads, 0, stream>>>(as_bf16(y), as_bf16(x), n);
  else
    add_kernel<1><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(as_bf16(y), as_bf16(x), n);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

void argmax_rows_f32(const float* logits, int rows, int V, int32_t* out, cudaStream_t stream) {
  const char* fn = "argmax_rows_f32";
  need(rows >= 0, fn, "rows must be >= 0" + got(rows));
  need(V > 0, fn, "V must be > 0" + got(V));
  if (rows == 0) return;
  need(logits && out, fn, "null logits or out");
  if (V % 4 == 0 && aligned16(logits))
    launch_programmatic(argmax_kernel<4>, rows, kArgmaxThreads, 0, stream, logits, V, out);
  else
    launch_programmatic(argmax_kernel<1>, rows, kArgmaxThreads, 0, stream, logits, V, out);
}

void fill_uniform_bf16(uint16_t* x, int64_t n, uint64_t seed, float scale, cudaStream_t stream) {
  const char* fn = "fill_uniform_bf16";
  need(n >= 0, fn, "n must be >= 0" + got(n));
  if (n == 0) return;
  need(x, fn, "null x");
  fill_uniform_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(as_bf16(x), n, mix64(seed), scale);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

void fill_const_bf16(uint16_t* x, int64_t n, float value, cudaStream_t stream) {
  const char* fn = "fill_const_bf16";
  need(n >= 0, fn, "n must be >= 0" + got(n));
  if (n == 0) return;
  need(x, fn, "null x");
  fill_const_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(as_bf16(x), n, value);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  // NaN: keep the sign and the top payload bits, force the quiet bit (truncation alone could turn it into inf).
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even; overflow carries into inf as it should
  return static_cast<uint16_t>(u >> 16);
}

float bf16_to_f32(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace elastic::cuda
