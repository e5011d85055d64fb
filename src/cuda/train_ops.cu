// Backward ops of router training on the GPU (include/elastic/cuda_train_ops.h). Row kernels run one CTA per row
// with a block reduction; elementwise kernels are grid-stride loops, 4 elements per access when sizes and pointers
// allow it. Every reduction runs in an order fixed by the launch shape alone (shuffles, then warp partials summed in
// index order; no float atomics), so a training step repeats bit for bit.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "elastic/cuda.h"
#include "elastic/cuda_train_ops.h"

namespace elastic::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;         // row and grid-stride kernels
constexpr int kCeThreads = 512;       // cross-entropy: one CTA walks a whole vocabulary row
constexpr int kMixChunks = 128;       // T slices per KV head in mix_bwd's first pass (the partials' stride)
constexpr int64_t kMaxBlocks = 8192;  // grid-stride kernels: several waves on an H200

[[noreturn]] void bad(const char* fn, const std::string& what) {
  throw std::invalid_argument(std::string(fn) + ": " + what);
}
void need(bool ok, const char* fn, const std::string& what) {
  if (!ok) bad(fn, what);
}
std::string got(int64_t v) { return " (got " + std::to_string(v) + ")"; }

int blocks_for(int64_t work) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((work + kThreads - 1) / kThreads, kMaxBlocks)));
}
bool aligned(const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0; }

void check_heads(const char* fn, int Hq, int Hkv, int hd) {
  need(Hq > 0 && Hkv > 0, fn, "n_heads and n_kv_heads must be > 0");
  need(Hq % Hkv == 0, fn, "n_heads must be a multiple of n_kv_heads (" + std::to_string(Hq) + " % " +
                              std::to_string(Hkv) + " != 0)");
  need(hd > 0 && hd % 2 == 0 && hd <= 256, fn, "head_dim must be even and in [2, 256]" + got(hd));
}

__device__ __forceinline__ float ld(const uint16_t* p, size_t i) {
  return __bfloat162float(reinterpret_cast<const bf16*>(p)[i]);
}
__device__ __forceinline__ void st(uint16_t* p, size_t i, float v) {
  reinterpret_cast<bf16*>(p)[i] = __float2bfloat16(v);
}

// VEC consecutive values; VEC == 4 is one 8-byte (bf16) or 16-byte (fp32) access, alignment guaranteed by the caller.
template <int VEC>
__device__ __forceinline__ void ld_bf16(const uint16_t* p, size_t i, float (&v)[VEC]) {
  if constexpr (VEC == 4) {
    const uint2 u = *reinterpret_cast<const uint2*>(p + i);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
    const float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
    v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) v[e] = ld(p, i + e);
  }
}
template <int VEC>
__device__ __forceinline__ void st_bf16(uint16_t* p, size_t i, const float (&v)[VEC]) {
  if constexpr (VEC == 4) {
    uint2 u;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
    h[0] = __floats2bfloat162_rn(v[0], v[1]);
    h[1] = __floats2bfloat162_rn(v[2], v[3]);
    *reinterpret_cast<uint2*>(p + i) = u;
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) st(p, i + e, v[e]);
  }
}
template <int VEC>
__device__ __forceinline__ void ld_f32(const float* p, size_t i, float (&v)[VEC]) {
  if constexpr (VEC == 4) {
    const float4 f = *reinterpret_cast<const float4*>(p + i);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) v[e] = p[i + e];
  }
}

// Block-wide sums / max (blockDim.x a multiple of 32, <= 1024); every thread must call, every thread gets the
// result; callable repeatedly. Warp partials are combined by one thread in index order.
__device__ float2 block_sum2(float2 v) {
  __shared__ float2 part[32];
  __shared__ float2 total;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    v.x += __shfl_xor_sync(0xffffffffu, v.x, o);
    v.y += __shfl_xor_sync(0xffffffffu, v.y, o);
  }
  __syncthreads();  // a previous call may still be reading part / total
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float2 s = make_float2(0.f, 0.f);
    for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) s.x += part[w].x, s.y += part[w].y;
    total = s;
  }
  __syncthreads();
  return total;
}
__device__ float block_sum(float v) { return block_sum2(make_float2(v, 0.f)).x; }

__device__ float block_max(float v) {
  __shared__ float part[32];
  __shared__ float total;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = -INFINITY;
    for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) m = fmaxf(m, part[w]);
    total = m;
  }
  __syncthreads();
  return total;
}

// ---- RMSNorm backward ------------------------------------------------------------------------------------------

// y = w * x * r, r = rsqrt(mean(x^2) + eps): dx_j = r * w_j dy_j - x_j * r^3 * sum_i(w_i dy_i x_i) / n.
__global__ void __launch_bounds__(kThreads)
    rmsnorm_bwd_kernel(const uint16_t* x, const uint16_t* w, const float* dy, float* dx, int n, float eps) {
  const size_t row = static_cast<size_t>(blockIdx.x) * n;
  float2 acc = make_float2(0.f, 0.f);  // (sum x^2, sum w dy x)
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const float xv = ld(x, row + j);
    acc.x += xv * xv;
    acc.y += ld(w, j) * dy[row + j] * xv;
  }
  acc = block_sum2(acc);
  const float r = rsqrtf(acc.x / n + eps), c = r * r * r * acc.y / n;
  for (int j = threadIdx.x; j < n; j += blockDim.x) dx[row + j] += r * ld(w, j) * dy[row + j] - c * ld(x, row + j);
}

// ---- SwiGLU backward -------------------------------------------------------------------------------------------

// a = silu(g) * u, s = sigmoid(g): dg = da * u * s * (1 + g (1 - s)), du = da * g * s. Unit u covers VEC columns.
template <int VEC>
__global__ void swiglu_bwd_kernel(const uint16_t* gu, const float* da, uint16_t* dgu, int T, int F) {
  const int64_t fv = F / VEC, total = static_cast<int64_t>(T) * fv;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < total;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = u / fv, c = (u % fv) * VEC;
    const size_t ig = static_cast<size_t>(t) * 2 * F + c, iu = ig + F;
    float g[VEC], up[VEC], d[VEC], dg[VEC], du[VEC];
    ld_bf16<VEC>(gu, ig, g);
    ld_bf16<VEC>(gu, iu, up);
    ld_f32<VEC>(da, static_cast<size_t>(t) * F + c, d);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const float s = 1.f / (1.f + expf(-g[e]));
      dg[e] = d[e] * up[e] * s * (1.f + g[e] * (1.f - s));
      du[e] = d[e] * g[e] * s;
    }
    st_bf16<VEC>(dgu, ig, dg);
    st_bf16<VEC>(dgu, iu, du);
  }
}

// ---- q/k/v post-processing backward ----------------------------------------------------------------------------

// Grid (T, Hq + Hkv) as qkv_post: CTA (t, hh) handles query head hh (hh < Hq) or KV head hh - Hq of token t (the KV
// CTA also copies dv); thread i < hd/2 owns the RoPE pair (i, i + hd/2). The angle is formed exactly as the forward
// does (fp32 product float(t) * inv_freq[i], full-range sincosf), so the backward rotation undoes that very
// rotation. Rotation transpose: (g1, g2) -> (g1 c + g2 s, g2 c - g1 s).
__global__ void qkv_post_bwd_kernel(QkvPostBwdParams p) {
  const int t = blockIdx.x, hh = blockIdx.y, i = threadIdx.x;
  const int hd = p.head_dim, half = hd / 2, Hq = p.n_heads, Hkv = p.n_kv_heads;
  const bool is_q = hh < Hq, active = i < half;
  const int kvh = hh - Hq, col = hh * hd;  // q head h at h*hd, k head kvh at (Hq + kvh)*hd
  const size_t row = static_cast<size_t>(t) * (Hq + 2 * Hkv) * hd;
  const size_t grow = is_q ? (static_cast<size_t>(t) * Hq + hh) * hd : (static_cast<size_t>(t) * Hkv + kvh) * hd;
  float g1 = 0.f, g2 = 0.f, x1 = 0.f, x2 = 0.f;
  if (active) {
    const float* g = (is_q ? p.dq_rot : p.dk_rot) + grow;
    float s, c;
    sincosf(static_cast<float>(t) * p.inv_freq[i], &s, &c);
    g1 = g[i] * c + g[i + half] * s;
    g2 = g[i + half] * c - g[i] * s;
    if (!is_q && p.dk_pre_rope_add) g1 += p.dk_pre_rope_add[grow + i], g2 += p.dk_pre_rope_add[grow + i + half];
  }
  const uint16_t* nw = is_q ? p.q_norm : p.k_norm;
  if (nw) {  // uniform over the CTA, so every thread reaches the barriers
    float w1 = 0.f, w2 = 0.f;
    if (active) {
      x1 = ld(p.qkv, row + col + i), x2 = ld(p.qkv, row + col + i + half);
      if (p.bias) x1 += ld(p.bias, col + i), x2 += ld(p.bias, col + i + half);
      w1 = ld(nw, i), w2 = ld(nw, i + half);
    }
    const float2 s = block_sum2(make_float2(x1 * x1 + x2 * x2, w1 * g1 * x1 + w2 * g2 * x2));
    const float r = rsqrtf(s.x / hd + p.eps), c = r * r * r * s.y / hd;
    g1 = r * w1 * g1 - c * x1;
    g2 = r * w2 * g2 - c * x2;
  }
  if (!active) return;
  st(p.dqkv, row + col + i, g1);
  st(p.dqkv, row + col + i + half, g2);
  if (!is_q) {
    const size_t vcol = static_cast<size_t>(Hq + Hkv + kvh) * hd;
    st(p.dqkv, row + vcol + i, p.dv[grow + i]);
    st(p.dqkv, row + vcol + i + half, p.dv[grow + i + half]);
  }
}

// ---- the gate's mixture ----------------------------------------------------------------------------------------

__global__ void mix_fwd_kernel(const uint16_t* of, const uint16_t* os, const float* z, uint16_t* o, int64_t n, int Hq,
                               int group, int hd) {
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < n;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float zz = z[static_cast<int>((u / hd) % Hq) / group];
    st(o, u, zz * ld(of, u) + (1.f - zz) * ld(os, u));
  }
}

// CTA (kvh, chunk) covers tokens [t0, t1) of KV head kvh's query heads, which sit contiguously in each token's row
// (span = group * hd values); the (token, value) pairs are flattened so small spans still fill the CTA. Writes dof,
// dos and the chunk's partial of dz.
__global__ void __launch_bounds__(kThreads)
    mix_bwd_kernel(const float* dO, const uint16_t* of, const uint16_t* os, const float* z, uint16_t* dof,
                   uint16_t* dos, float* partials, int T, int Hq, int Hkv, int hd) {
  const int kvh = blockIdx.x, chunk = blockIdx.y, group = Hq / Hkv, span = group * hd;
  const int per = (T + kMixChunks - 1) / kMixChunks, t0 = min(T, chunk * per), t1 = min(T, t0 + per);
  const float zz = z[kvh];
  const int64_t work = static_cast<int64_t>(t1 - t0) * span;
  float acc = 0.f;
  for (int64_t j = threadIdx.x; j < work; j += blockDim.x) {
    const int64_t t = t0 + j / span;
    const size_t i = static_cast<size_t>(t * Hq + static_cast<int64_t>(kvh) * group) * hd + j % span;
    const float g = dO[i];
    acc += g * (ld(of, i) - ld(os, i));
    st(dof, i, zz * g);
    st(dos, i, (1.f - zz) * g);
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[static_cast<size_t>(kvh) * kMixChunks + chunk] = acc;
}

__global__ void mix_reduce_kernel(const float* partials, float* dz, int Hkv) {
  for (int h = blockIdx.x * blockDim.x + threadIdx.x; h < Hkv; h += gridDim.x * blockDim.x) {
    float s = 0.f;
    for (int c = 0; c < kMixChunks; ++c) s += partials[static_cast<size_t>(h) * kMixChunks + c];
    dz[h] += s;
  }
}

// ---- cross-entropy ---------------------------------------------------------------------------------------------

// Online softmax statistics: m the running max, s the sum of exp(x - m). -inf logits add nothing (exp(-inf - -inf)
// would be NaN); a NaN logit makes s NaN, so it shows in the loss instead of vanishing.
__device__ __forceinline__ void online_add(float x, float& m, float& s) {
  if (x > m) {
    s = s * expf(m - x) + 1.f;  // m == -inf: expf(-inf) = 0
    m = x;
  } else {
    s += x == -INFINITY ? 0.f : expf(x - m);
  }
}

// One CTA per row: pass 1 the row's max and sum (accurate expf: the loss feeds a reported number, and the kernel is
// bandwidth-bound anyway), pass 2 (with dlogits) the scaled softmax minus the one-hot. A target outside [0, V) marks
// an ignored row: loss 0 and a zero gradient row.
template <int VEC>
__global__ void __launch_bounds__(kCeThreads)
    ce_kernel(const float* logits, int V, const int32_t* targets, float scale, float* row_loss, uint16_t* dlogits) {
  const size_t row = static_cast<size_t>(blockIdx.x) * V;
  const int tgt = targets[blockIdx.x];
  const bool ignored = tgt < 0 || tgt >= V;
  const int nv = V / VEC;
  float m = -INFINITY, s = 0.f;
  for (int c = threadIdx.x; c < nv; c += blockDim.x) {
    float v[VEC];
    ld_f32<VEC>(logits, row + static_cast<size_t>(c) * VEC, v);
#pragma unroll
    for (int e = 0; e < VEC; ++e) online_add(v[e], m, s);
  }
  for (int j = nv * VEC + threadIdx.x; j < V; j += blockDim.x) online_add(logits[row + j], m, s);
  const float M = block_max(m);
  const float S = block_sum(m == -INFINITY ? 0.f : s * expf(m - M));
  const float lse = M + logf(S);
  if (threadIdx.x == 0) row_loss[blockIdx.x] = ignored ? 0.f : lse - logits[row + tgt];
  if (!dlogits) return;
  const float k = ignored ? 0.f : scale;
  for (int c = threadIdx.x; c < nv; c += blockDim.x) {
    const int j0 = c * VEC;
    float v[VEC];
    ld_f32<VEC>(logits, row + j0, v);
#pragma unroll
    for (int e = 0; e < VEC; ++e) v[e] = k * (expf(v[e] - lse) - (j0 + e == tgt ? 1.f : 0.f));
    st_bf16<VEC>(dlogits, row + j0, v);
  }
  for (int j = nv * VEC + threadIdx.x; j < V; j += blockDim.x)
    st(dlogits, row + j, k * (expf(logits[row + j] - lse) - (j == tgt ? 1.f : 0.f)));
}

// One CTA: strided per-thread sums, then the block reduction; the order depends only on `rows`.
__global__ void sum_rows_kernel(const float* row_loss, int rows, float* loss_sum) {
  float s = 0.f;
  for (int r = threadIdx.x; r < rows; r += blockDim.x) s += row_loss[r];
  s = block_sum(s);
  if (threadIdx.x == 0) *loss_sum += s;
}

// ---- conversions -----------------------------------------------------------------------------------------------

__global__ void f32_to_bf16_kernel(const float* x, uint16_t* y, int64_t n) {
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < n;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x)
    st(y, u, x[u]);
}
__global__ void bf16_to_f32_kernel(const uint16_t* x, float* y, int64_t n) {
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < n;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[u] = ld(x, u);
}
__global__ void add_f32_kernel(float* y, const float* x, int64_t n) {
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < n;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[u] += x[u];
}

}  // namespace

// ---- entry points ----------------------------------------------------------------------------------------------

void rmsnorm_bwd(const uint16_t* x, const uint16_t* w, const float* dy, float* dx, int rows, int n, float eps,
                 cudaStream_t stream) {
  const char* fn = "rmsnorm_bwd";
  need(rows > 0, fn, "rows must be > 0" + got(rows));
  need(n > 0, fn, "n must be > 0" + got(n));
  need(x && w && dy && dx, fn, "null x, w, dy or dx");
  rmsnorm_bwd_kernel<<<rows, kThreads, 0, stream>>>(x, w, dy, dx, n, eps);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

void swiglu_bwd(const uint16_t* gate_up, const float* da, uint16_t* dgate_up, int T, int F, cudaStream_t stream) {
  const char* fn = "swiglu_bwd";
  need(T > 0, fn, "T must be > 0" + got(T));
  need(F > 0, fn, "F must be > 0" + got(F));
  need(gate_up && da && dgate_up, fn, "null gate_up, da or dgate_up");
  const int64_t n = static_cast<int64_t>(T) * F;
  if (F % 4 == 0 && aligned(gate_up, 8) && aligned(dgate_up, 8) && aligned(da, 16))
    swiglu_bwd_kernel<4><<<blocks_for(n / 4), kThreads, 0, stream>>>(gate_up, da, dgate_up, T, F);
  else
    swiglu_bwd_kernel<1><<<blocks_for(n), kThreads, 0, stream>>>(gate_up, da, dgate_up, T, F);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

void qkv_post_bwd(const QkvPostBwdParams& p, cudaStream_t stream) {
  const char* fn = "qkv_post_bwd";
  need(p.T > 0, fn, "T must be > 0" + got(p.T));
  check_heads(fn, p.n_heads, p.n_kv_heads, p.head_dim);
  need(p.n_heads + p.n_kv_heads <= 65535, fn, "n_heads + n_kv_heads must be <= 65535");
  need(p.qkv && p.inv_freq && p.dq_rot && p.dk_rot && p.dv && p.dqkv, fn,
       "null qkv, inv_freq, dq_rot, dk_rot, dv or dqkv");
  const int threads = (p.head_dim / 2 + 31) / 32 * 32;
  qkv_post_bwd_kernel<<<dim3(p.T, p.n_heads + p.n_kv_heads), threads, 0, stream>>>(p);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

void mix_fwd(const uint16_t* of, const uint16_t* os, const float* z, uint16_t* o, int T, int Hq, int Hkv, int hd,
             cudaStream_t stream) {
  const char* fn = "mix_fwd";
  need(T > 0, fn, "T must be > 0" + got(T));
  check_heads(fn, Hq, Hkv, hd);
  need(of && os && z && o, fn, "null of, os, z or o");
  const int64_t n = static_cast<int64_t>(T) * Hq * hd;
  mix_fwd_kernel<<<blocks_for(n), kThreads, 0, stream>>>(of, os, z, o, n, Hq, Hq / Hkv, hd);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

int64_t mix_bwd_partials(int Hkv) { return static_cast<int64_t>(std::max(Hkv, 0)) * kMixChunks; }

void mix_bwd(const float* dO, const uint16_t* of, const uint16_t* os, const float* z, uint16_t* dof, uint16_t* dos,
             float* dz, float* partials, int T, int Hq, int Hkv, int hd, cudaStream_t stream) {
  const char* fn = "mix_bwd";
  need(T > 0, fn, "T must be > 0" + got(T));
  check_heads(fn, Hq, Hkv, hd);
  need(dO && of && os && z && dof && dos && dz && partials, fn, "null dO, of, os, z, dof, dos, dz or partials");
  mix_bwd_kernel<<<dim3(Hkv, kMixChunks), kThreads, 0, stream>>>(dO, of, os, z, dof, dos, partials, T, Hq, Hkv, hd);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
  mix_reduce_kernel<<<blocks_for(Hkv), kThreads, 0, stream>>>(partials, dz, Hkv);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

void cross_entropy_rows(const float* logits, int rows, int V, const int32_t* targets, float scale, float* row_loss,
                        float* loss_sum, uint16_t* dlogits, cudaStream_t stream) {
  const char* fn = "cross_entropy_rows";
  need(rows > 0, fn, "rows must be > 0" + got(rows));
  need(V > 0, fn, "V must be > 0" + got(V));
  need(logits && targets && row_loss && loss_sum, fn, "null logits, targets, row_loss or loss_sum");
  if (V % 4 == 0 && aligned(logits, 16) && (!dlogits || aligned(dlogits, 8)))
    ce_kernel<4><<<rows, kCeThreads, 0, stream>>>(logits, V, targets, scale, row_loss, dlogits);
  else
    ce_kernel<1><<<rows, kCeThreads, 0, stream>>>(logits, V, targets, scale, row_loss, dlogits);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
  sum_rows_kernel<<<1, kCeThreads, 0, stream>>>(row_loss, rows, loss_sum);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

void convert_f32_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  const char* fn = "convert_f32_to_bf16";
  need(n > 0, fn, "n must be > 0" + got(n));
  need(x && y, fn, "null x or y");
  f32_to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, n);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

void convert_bf16_to_f32(const uint16_t* x, float* y, int64_t n, cudaStream_t stream) {
  const char* fn = "convert_bf16_to_f32";
  need(n > 0, fn, "n must be > 0" + got(n));
  need(x && y, fn, "null x or y");
  bf16_to_f32_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, n);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

void add_inplace_f32(float* y, const float* x, int64_t n, cudaStream_t stream) {
  const char* fn = "add_inplace_f32";
  need(n > 0, fn, "n must be > 0" + got(n));
  need(y && x, fn, "null y or x");
  add_f32_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, x, n);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace elastic::cuda
