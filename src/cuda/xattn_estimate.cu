// XAttention block estimation on the GPU: the pipeline of elastic::xattn_select (src/attention/xattn_select.cpp)
// for every query head of an XAttn-routed KV head, for the query blocks of one (block-aligned) prefill chunk.
//
// One CTA per (query block, query head), 256 threads:
//   1. the B/S reshaped query rows of the block go to shared memory as fp32 (row i, segment s = q[i*S + S-1-s]);
//   2. antidiagonal scores against every causal reshaped key row j (= concat_s k[j*S + s]), one warp per j, fp32
//      CUDA-core dot products over S*hd, kept in shared memory ([B/S, (qb+1)*B/S]);
//   3. causal softmax per reshaped row, summed into per-key-block mass (deterministic: one thread per key block);
//   4. greedy selection: kb = 0 and kb = qb forced, the rest by descending mass (ties: lower kb) while the mass so
//      far is < tau * total, done as a bitonic sort of (mass, kb) keys + an exclusive prefix sum in double;
//   5. the selected blocks are written ascending into the triangular list of (h, qb).
// This is the simple version: the scores are CUDA-core fp32 and every CTA rereads the key prefix (see
// docs/CUDA_ATTENTION.md for its cost and the tensor-core plan).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "elastic/cuda.h"
#include "elastic/cuda_attention.h"

namespace elastic::cuda {
namespace {

constexpr int kThreads = 256;

template <int HD>
__global__ void __launch_bounds__(kThreads)
    xattn_estimate_kernel(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k, int T, int pos0,
                          int Hq, int Hkv, int B, int S, float tau, const KVHeadMeta* __restrict__ meta,
                          int32_t* __restrict__ blocks, int32_t* __restrict__ offsets, int32_t* __restrict__ counts,
                          float* __restrict__ block_scores) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int n_pos = pos0 + T, nb = (n_pos + B - 1) / B, R = (n_pos + S - 1) / S, rb = B / S;
  const int qb = pos0 / B + blockIdx.x, h = blockIdx.y, kvh = h / (Hq / Hkv);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const size_t row_off = static_cast<size_t>(h) * nb + qb;
  if (tid == 0) {
    offsets[row_off] = static_cast<int32_t>(static_cast<int64_t>(h) * nb * (nb + 1) / 2 + int64_t(qb) * (qb + 1) / 2);
    if (meta[kvh].mode != 2) counts[row_off] = 0;
  }
  if (meta[kvh].mode != 2) return;

  const int D = S * HD;
  const int i0 = qb * rb, n_rows = min(rb, R - i0);  // reshaped query rows of this block
  const int n_cols = i0 + n_rows;                    // causal reshaped key rows [0, n_cols)
  float* sq = reinterpret_cast<float*>(smem);        // [rb, D]
  float* sc = sq + rb * D;                           // [rb, n_cols] scores, then probabilities
  float* bs = sc + static_cast<size_t>(rb) * n_cols;  // [nb] block mass
  // [pow2 >= qb] sort keys, 8-byte aligned after the floats
  const size_t n_floats = static_cast<size_t>(rb) * D + static_cast<size_t>(rb) * n_cols + nb;
  unsigned long long* keys = reinterpret_cast<unsigned long long*>(smem + ((n_floats * 4 + 15) & ~size_t(15)));

  const size_t ldq = static_cast<size_t>(Hq) * HD, ldk = static_cast<size_t>(Hkv) * HD;
  for (int idx = tid; idx < rb * D; idx += kThreads) {
    const int r = idx / D, s = (idx % D) / HD, d = idx % HD;
    const int pos = (i0 + r) * S + (S - 1 - s);
    float val = 0.f;
    if (r < n_rows && pos < n_pos && pos >= pos0)
      val = __bfloat162float(q[static_cast<size_t>(pos - pos0) * ldq + static_cast<size_t>(h) * HD + d]);
    sq[idx] = val;
  }
  __syncthreads();

  const float scale = 1.f / sqrtf(static_cast<float>(HD)) / static_cast<float>(S);
  constexpr int kPer = HD / 32;  // elements of one key row per lane
  for (int j = warp; j < n_cols; j += kThreads / 32) {
    float acc[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) acc[r] = 0.f;
    for (int s = 0; s < S; ++s) {
      const int pos = j * S + s;
      if (pos >= n_pos) break;  // zero padding past the end
      const __nv_bfloat16* kr = k + static_cast<size_t>(pos) * ldk + static_cast<size_t>(kvh) * HD + lane * kPer;
      float kv[kPer];
      if constexpr (kPer == 4) {
        const uint2 raw = *reinterpret_cast<const uint2*>(kr);
        const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&raw);
        const float2 a0 = __bfloat1622float2(b[0]), a1 = __bfloat1622float2(b[1]);
        kv[0] = a0.x, kv[1] = a0.y, kv[2] = a1.x, kv[3] = a1.y;
      } else {
        const __nv_bfloat162 raw = *reinterpret_cast<const __nv_bfloat162*>(kr);
        const float2 a0 = __bfloat1622float2(raw);
        kv[0] = a0.x, kv[1] = a0.y;
      }
#pragma unroll
      for (int r = 0; r < 16; ++r) {
        if (r >= rb) break;
        const float* qr = sq + r * D + s * HD + lane * kPer;
#pragma unroll
        for (int e = 0; e < kPer; ++e) acc[r] += qr[e] * kv[e];
      }
    }
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      if (r >= rb) break;
      float a = acc[r];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
      if (lane == 0) sc[static_cast<size_t>(r) * n_cols + j] = (r < n_rows && j <= i0 + r) ? a * scale : -INFINITY;
    }
  }
  __syncthreads();

  // Softmax per reshaped row (one warp per row).
  for (int r = warp; r < n_rows; r += kThreads / 32) {
    float* row = sc + static_cast<size_t>(r) * n_cols;
    const int len = i0 + r + 1;
    float mx = -INFINITY;
    for (int j = lane; j < len; j += 32) mx = fmaxf(mx, row[j]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.f;
    for (int j = lane; j < len; j += 32) {
      const float e = expf(row[j] - mx);
      row[j] = e;
      sum += e;
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float inv = 1.f / sum;
    for (int j = lane; j < n_cols; j += 32) row[j] = j < len ? row[j] * inv : 0.f;
  }
  __syncthreads();
  // Block mass: one thread per key block, fixed order.
  for (int kb = tid; kb <= qb; kb += kThreads) {
    float m = 0.f;
    for (int r = 0; r < n_rows; ++r)
      for (int j = kb * rb; j < min(n_cols, (kb + 1) * rb); ++j) m += sc[static_cast<size_t>(r) * n_cols + j];
    bs[kb] = m;
    if (block_scores) block_scores[row_off * nb + kb] = m;
  }
  __syncthreads();

  // Candidates kb in [1, qb): key = mass bits (non-negative floats order as integers) : ~kb (lower kb first).
  const int n_cand = max(0, qb - 1);
  int N = 1;
  while (N < n_cand) N <<= 1;
  for (int i = tid; i < N; i += kThreads) {
    unsigned long long key = 0ull;
    if (i < n_cand) {
      const int kb = 1 + i;
      key = (static_cast<unsigned long long>(__float_as_uint(bs[kb])) << 32) | (0xffffffffu - static_cast<uint32_t>(kb));
    }
    keys[i] = key;
  }
  __syncthreads();
  for (int size = 2; size <= N; size <<= 1)
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      for (int i = tid; i < N; i += kThreads) {
        const int j = i ^ stride;
        if (j > i) {
          const bool desc = (i & size) == 0;  // descending overall
          const unsigned long long a = keys[i], b = keys[j];
          if ((a < b) == desc) keys[i] = b, keys[j] = a;
        }
      }
      __syncthreads();
    }

  // Exclusive prefix of sorted masses in double; selected while base + prefix < tau * total.
  __shared__ double s_part[kThreads];
  __shared__ double s_total;
  const int per = (N + kThreads - 1) / kThreads;
  double local = 0.0;
  for (int i = tid * per; i < min(N, (tid + 1) * per); ++i) local += static_cast<double>(__uint_as_float(keys[i] >> 32));
  s_part[tid] = local;
  if (tid == 0) {
    double tot = 0.0;
    for (int kb = 0; kb <= qb; ++kb) tot += static_cast<double>(bs[kb]);
    s_total = tot;
  }
  __syncthreads();
  if (tid == 0) {
    double run = 0.0;
    for (int i = 0; i < kThreads; ++i) {
      const double v = s_part[i];
      s_part[i] = run;
      run += v;
    }
  }
  __syncthreads();
  // Selection flags reuse sc (no longer needed) as ints, one per key block.
  int* flag = reinterpret_cast<int*>(sc);
  for (int kb = tid; kb <= qb; kb += kThreads) flag[kb] = (kb == 0 || kb == qb) ? 1 : 0;
  __syncthreads();
  {
    const double required = s_total * static_cast<double>(tau);
    double cum = static_cast<double>(bs[0]) + (qb > 0 ? static_cast<double>(bs[qb]) : 0.0) + s_part[tid];
    for (int i = tid * per; i < min(n_cand, (tid + 1) * per); ++i) {
      if (!(cum < required)) break;
      const int kb = static_cast<int>(0xffffffffu - static_cast<uint32_t>(keys[i] & 0xffffffffull));
      flag[kb] = 1;
      cum += static_cast<double>(__uint_as_float(keys[i] >> 32));
    }
  }
  __syncthreads();
  // Ascending compaction by warp 0 (ballot + popc).
  if (warp == 0) {
    int32_t* out = blocks + (static_cast<int64_t>(h) * nb * (nb + 1) / 2 + int64_t(qb) * (qb + 1) / 2);
    int n = 0;
    for (int base = 0; base <= qb; base += 32) {
      const int kb = base + lane;
      const bool f = kb <= qb && flag[kb];
      const unsigned bal = __ballot_sync(0xffffffffu, f);
      if (f) out[n + __popc(bal & ((1u << lane) - 1u))] = kb;
      n += __popc(bal);
    }
    if (lane == 0) counts[row_off] = n;
  }
}

void bad(const std::string& what) { throw std::invalid_argument("xattn_estimate_cuda: " + what); }

template <int HD>
void launch(const XAttnEstimateParams& p, cudaStream_t stream) {
  const int n_pos = p.pos0 + p.T, nb = (n_pos + p.block - 1) / p.block, rb = p.block / p.stride;
  const int n_cols_max = nb * rb;
  int N = 1;
  while (N < nb) N <<= 1;
  const size_t n_floats = static_cast<size_t>(rb) * p.stride * HD + static_cast<size_t>(rb) * n_cols_max + nb;
  const size_t smem = ((n_floats * 4 + 15) & ~size_t(15)) + sizeof(unsigned long long) * N;
  int dev = 0, optin = 0;
  ELASTIC_CUDA_CHECK(cudaGetDevice(&dev));
  ELASTIC_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (smem > static_cast<size_t>(optin) - 4096)
    bad("sequence too long for the shared-memory score rows (" + std::to_string(smem) + " bytes needed for " +
        std::to_string(n_pos) + " positions, block " + std::to_string(p.block) + ", stride " +
        std::to_string(p.stride) + ")");
  ELASTIC_CUDA_CHECK(cudaFuncSetAttribute(xattn_estimate_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
  ELASTIC_CUDA_CHECK(cudaMemsetAsync(p.counts, 0, sizeof(int32_t) * p.n_heads * nb, stream));
  const int qb0 = p.pos0 / p.block;
  dim3 grid(nb - qb0, p.n_heads);
  xattn_estimate_kernel<HD><<<grid, kThreads, smem, stream>>>(
      reinterpret_cast<const __nv_bfloat16*>(p.q), reinterpret_cast<const __nv_bfloat16*>(p.k), p.T, p.pos0,
      p.n_heads, p.n_kv_heads, p.block, p.stride, p.tau, p.meta, p.blocks, p.offsets, p.counts, p.block_scores);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void xattn_estimate_cuda(const XAttnEstimateParams& p, cudaStream_t stream) {
  if (!p.q || !p.k || !p.meta || !p.blocks || !p.offsets || !p.counts) bad("null q, k, meta or output lists");
  if (p.T <= 0 || p.pos0 < 0) bad("T must be > 0 and pos0 >= 0");
  if (p.block != 64 && p.block != 128) bad("block must be 64 or 128 (got " + std::to_string(p.block) + ")");
  if (p.stride < 1 || p.block % p.stride || p.block / p.stride > 16)
    bad("stride must divide block with block/stride <= 16 (got stride " + std::to_string(p.stride) + ")");
  if (p.pos0 % p.block) bad("pos0 must be a multiple of block (got " + std::to_string(p.pos0) + ")");
  if (!(p.tau > 0.f && p.tau <= 1.f)) bad("tau must be in (0, 1]");
  if (p.n_heads <= 0 || p.n_kv_heads <= 0 || p.n_heads % p.n_kv_heads)
    bad("n_heads must be a positive multiple of n_kv_heads");
  if (p.head_dim == 64)
    launch<64>(p, stream);
  else if (p.head_dim == 128)
    launch<128>(p, stream);
  else
    bad("head_dim must be 64 or 128 (got " + std::to_string(p.head_dim) + ")");
}

}  // namespace elastic::cuda
