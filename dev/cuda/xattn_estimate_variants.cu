// Dev area: the XAttention estimator's earlier forms, kept to be timed against the engine's (src/cuda/
// xattn_estimate_gemm.cu: the scores through cuBLASLt) and as the tests' second opinion. The pipeline of
// elastic::xattn_select (src/attention/xattn_select.cpp) for every query head of an XAttn-routed KV head, for the
// query blocks of one (block-aligned) prefill chunk.
//
// One CTA per (query block, query head), 256 threads:
//   1. the B/S reshaped query rows of the block go to shared memory as fp32 (row i, segment s = q[i*S + S-1-s]);
//   2. antidiagonal scores against every causal reshaped key row j (= concat_s k[j*S + s]), one warp per j, fp32
//      CUDA-core dot products over S*hd, kept in shared memory ([B/S, (qb+1)*B/S]);
//   3. causal softmax per reshaped row, summed into per-key-block mass (deterministic: one thread per key block);
//   4. greedy selection: kb = 0 and kb = qb forced, the rest by descending mass (ties: lower kb) while the mass so
//      far is < tau * total, done as a bitonic sort of (mass, kb) keys + an exclusive prefix sum in double;
//   5. the selected blocks are written ascending into the triangular list of (h, qb).
// That is the simple version (fp32 CUDA cores, every CTA rereads the key prefix for one query head); the tensor-core
// version below scores all query heads of a KV head per CTA and is the default where its shape fits.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "cuda/mma_sync.cuh"
#include "cuda/xattn_estimate_check.h"
#include "cuda/xattn_select_blocks.cuh"
#include "elastic/cuda.h"
#include "elastic/cuda_attention.h"
#include "xattn_estimate_variants.h"

namespace elastic::cuda {
namespace {

using xattn_detail::kThreads;
using xattn_detail::pow2_at_least;
using xattn_detail::select_blocks;

// The tensor-core kernel's shared memory starts with the query tile [16 * MT, D + 8] bf16 (MT row tiles of 16), whose
// space later holds the selection scratch (pow2_at_least(nb) sort keys, then nb flags); its floats start after the
// larger of the two.
__host__ __device__ inline size_t mma_float_offset(int D, int nb, int MT) {
  const size_t tile = static_cast<size_t>(16) * MT * (D + 8) * 2,
               scratch = sizeof(unsigned long long) * pow2_at_least(nb) + sizeof(int) * static_cast<size_t>(nb);
  return ((tile > scratch ? tile : scratch) + 15) & ~size_t(15);
}

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
    if (meta[kvh].mode != kv_mode::kXAttn) counts[row_off] = 0;
  }
  if (meta[kvh].mode != kv_mode::kXAttn) return;

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

  select_blocks(bs, qb, nb, tau, keys, reinterpret_cast<int*>(sc), h, row_off, blocks, counts);  // sc is free now
}

// Tensor-core version of steps 1-3, one CTA per (query block, KV head) for all G = Hq / Hkv query heads of that KV
// head at once (M = G * B/S <= 16 * MT reshaped query rows: MT m16n8k16 row tiles, MT = 1 or 2; Qwen3-4B's G = 4 at
// block 128, stride 16 is M = 32), so each CTA reads the key prefix once for G heads and scores it with mma.sync
// (bf16 in, fp32 accumulate; the products are exact as in the fp32 version, only the summation order differs); each
// key fragment loaded feeds the MT row tiles:
//   1. the M reshaped query rows -> shared memory as bf16 [16 * MT, S*hd + 8] (rows >= M and past the end zero);
//   2. warps take groups of CW = max(8, B/S) reshaped key columns (whole key blocks, so a warp owns its blocks) and
//      run the S*hd-long dot products as m16n8k16 MMAs, B fragments loaded straight from the key rows in global
//      memory (a column's 16 consecutive elements sit in one key row); scores go through a per-warp staging tile to
//      one log-sum-exp per (row, key block): L [16 * MT, nb];
//   3. per head: row totals from L, block mass[kb] = sum over its rows of exp(L - row total) (one thread per key
//      block, fixed order), then select_blocks.
// kTwoPass (long inputs, where L [16 * MT, nb] does not fit in shared memory): the scores are computed twice and L never
// stored. Pass 1 folds each (row, key block) log-sum-exp into a running (max, sum) per row and warp, combined into
// the row totals; pass 2 recomputes the same scores and adds exp(L - row total) over a head's rows straight into
// that head's block masses [G, nb] (a warp owns whole key blocks, so each mass has one writer; rows in fixed order).
template <int HD, bool kTwoPass, int MT>
__global__ void __launch_bounds__(kThreads)
    xattn_estimate_mma_kernel(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k, int T,
                              int pos0, int Hq, int Hkv, int B, int S, float tau, const KVHeadMeta* __restrict__ meta,
                              int32_t* __restrict__ blocks, int32_t* __restrict__ offsets,
                              int32_t* __restrict__ counts, float* __restrict__ block_scores) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int G = Hq / Hkv, n_pos = pos0 + T, nb = (n_pos + B - 1) / B, R = (n_pos + S - 1) / S, rb = B / S;
  const int qb = pos0 / B + blockIdx.x, kvh = blockIdx.y;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid < G) {
    const int h = kvh * G + tid;
    const size_t row_off = static_cast<size_t>(h) * nb + qb;
    offsets[row_off] = static_cast<int32_t>(static_cast<int64_t>(h) * nb * (nb + 1) / 2 + int64_t(qb) * (qb + 1) / 2);
    if (meta[kvh].mode != kv_mode::kXAttn) counts[row_off] = 0;
  }
  if (meta[kvh].mode != kv_mode::kXAttn) return;

  constexpr int kWarps = kThreads / 32;
  const int D = S * HD, LDA = D + 8;  // +8 bf16 per row: the 32-bit fragment loads of 8 rows hit different banks
  const int M = G * rb, i0 = qb * rb, n_rows = min(rb, R - i0), n_cols = i0 + n_rows;
  const int n_keys = pow2_at_least(nb);  // select_blocks sorts a power of two >= its candidates (< nb)
  constexpr int MR = 16 * MT;  // rows of the query tile
  const size_t a_bytes = mma_float_offset(D, nb, MT);
  uint16_t* sa = reinterpret_cast<uint16_t*>(smem);             // [MR, LDA] bf16 query rows
  // One pass: L [MR, nb], bs [nb] (the current head's masses). Two passes: no L; bs [G, nb] (every head's masses).
  float* L = reinterpret_cast<float*>(smem + a_bytes);          // [MR, nb] log-sum-exp per (row, key block)
  float* bs = kTwoPass ? L : L + MR * nb;                       // [nb] or [G, nb] block masses
  float* stile = bs + (kTwoPass ? G : 1) * nb;                  // [kWarps][MR][16] score staging
  float* rowlse = stile + kWarps * MR * 16;                     // [MR]
  float* wl = rowlse + MR;                                      // two passes: [kWarps][MR][8] a group's L values
  float* wpart = wl + kWarps * MR * 8;                          // two passes: [kWarps][MR][2] per-warp (max, sum)
  // After the scores, the query tile's space holds the selection scratch (keys, then flags; see a_bytes).
  unsigned long long* keys = reinterpret_cast<unsigned long long*>(smem);
  int* flag = reinterpret_cast<int*>(smem + sizeof(unsigned long long) * static_cast<size_t>(n_keys));

  const size_t ldq = static_cast<size_t>(Hq) * HD, ldk = static_cast<size_t>(Hkv) * HD;
  for (int idx = tid; idx < MR * D; idx += kThreads) {
    const int m = idx / D, c = idx % D, s = c / HD, d = c % HD, g = m / rb, r = m % rb;
    uint16_t val = 0;
    if (m < M && r < n_rows) {
      const int pos = (i0 + r) * S + (S - 1 - s);
      if (pos >= pos0 && pos < n_pos)
        val = reinterpret_cast<const uint16_t*>(q)[static_cast<size_t>(pos - pos0) * ldq +
                                                   static_cast<size_t>(kvh * G + g) * HD + d];
    }
    sa[static_cast<size_t>(m) * LDA + c] = val;
  }
  if (!kTwoPass)
    for (int i = tid; i < MR * nb; i += kThreads) L[i] = -INFINITY;
  __syncthreads();

  const float scale = 1.f / sqrtf(static_cast<float>(HD)) / static_cast<float>(S);
  const int CW = max(8, rb), n_groups = (n_cols + CW - 1) / CW, gq = lane / 4, t4 = lane % 4;
  const int bpg = CW / rb;  // key blocks per group (<= 8)
  const uint16_t* kraw = reinterpret_cast<const uint16_t*>(k) + static_cast<size_t>(kvh) * HD;
  float* st = stile + warp * MR * 16;  // [MR][16]
  // This warp's groups of key columns: the scores, then one log-sum-exp per (row m, block b of the group) handed to
  // on_block(m, kb, b, lse) by the lanes (skipped where the row has no valid score in the block), then after(j0)
  // once the group's calls are done.
  auto score_groups = [&](auto&& on_block, auto&& after) {
    for (int grp = warp; grp < n_groups; grp += kWarps) {
      const int j0 = grp * CW;
      for (int nt = 0; nt < CW / 8; ++nt) {
        const int j = j0 + nt * 8 + gq;  // this lane's B column
        float acc[MT][4] = {};
#pragma unroll 4
        for (int kk = 0; kk < D; kk += 16) {
          const int pos = j * S + kk / HD;  // a 16-element step never crosses a key row (HD % 16 == 0)
          uint32_t b0 = 0u, b1 = 0u;
          if (j < n_cols && pos < n_pos) {  // past the end: zero padding, as in the fp32 version
            const uint16_t* kr = kraw + static_cast<size_t>(pos) * ldk + kk % HD + 2 * t4;
            b0 = __ldg(reinterpret_cast<const unsigned int*>(kr));
            b1 = __ldg(reinterpret_cast<const unsigned int*>(kr + 8));
          }
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {  // one key fragment, every row tile
            uint32_t a[4];
            const uint16_t* ar = sa + static_cast<size_t>(mt * 16 + gq) * LDA + kk + 2 * t4;
            a[0] = *reinterpret_cast<const uint32_t*>(ar);
            a[1] = *reinterpret_cast<const uint32_t*>(ar + 8 * LDA);
            a[2] = *reinterpret_cast<const uint32_t*>(ar + 8);
            a[3] = *reinterpret_cast<const uint32_t*>(ar + 8 * LDA + 8);
            mma_bf16(acc[mt], a, b0, b1);
          }
        }
        // Stage C[gq][2 t4 + e] and C[gq + 8][2 t4 + e] of each row tile, scaled and causally masked.
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int m = mt * 16 + gq + (e >= 2 ? 8 : 0), col = nt * 8 + 2 * t4 + (e & 1), jj = j0 + col,
                      r = m % rb;
            const bool ok = m < M && r < n_rows && jj < n_cols && jj <= i0 + r;
            st[m * 16 + col] = ok ? acc[mt][e] * scale : -INFINITY;
          }
      }
      __syncwarp();
      for (int pr = lane; pr < MR * bpg; pr += 32) {
        const int m = pr / bpg, b = pr % bpg, kb = j0 / rb + b;
        if (kb > qb || m >= M) continue;
        const float* x = st + m * 16 + b * rb;
        float mx = -INFINITY;
        for (int c = 0; c < rb; ++c) mx = fmaxf(mx, x[c]);
        if (mx == -INFINITY) continue;  // no valid score in this block for this row
        float sum = 0.f;
        for (int c = 0; c < rb; ++c) sum += expf(x[c] - mx);
        on_block(m, kb, b, mx + logf(sum));
      }
      __syncwarp();
      after(j0);
      __syncwarp();
    }
  };

  if constexpr (!kTwoPass) {
    score_groups([&](int m, int kb, int, float lse) { L[m * nb + kb] = lse; }, [](int) {});
    __syncthreads();
  } else {
    float* my_wl = wl + warp * MR * 8;  // [MR][8]: the current group's L values, -inf where not set
    auto clear_wl = [&] {
      for (int i = lane; i < MR * 8; i += 32) my_wl[i] = -INFINITY;
      __syncwarp();
    };
    // Pass 1: row totals. Lane m < MR keeps row m's running (max, sum) over this warp's blocks (MR <= 32).
    float run_m = -INFINITY, run_s = 0.f;
    clear_wl();
    score_groups([&](int m, int, int b, float lse) { my_wl[m * 8 + b] = lse; },
                 [&](int) {
                   if (lane < MR)
                     for (int b = 0; b < bpg; ++b) {
                       const float v = my_wl[lane * 8 + b];
                       if (v == -INFINITY) continue;
                       const float nm = fmaxf(run_m, v);
                       run_s = run_s * expf(run_m - nm) + expf(v - nm);
                       run_m = nm;
                     }
                   __syncwarp();
                   for (int i = lane; i < MR * 8; i += 32) my_wl[i] = -INFINITY;
                 });
    if (lane < MR) {
      wpart[(warp * MR + lane) * 2] = run_m;
      wpart[(warp * MR + lane) * 2 + 1] = run_s;
    }
    __syncthreads();
    if (tid < MR) {  // the warps in order: a fixed combination
      float tm = -INFINITY, ts = 0.f;
      for (int w = 0; w < kWarps; ++w) {
        const float wm = wpart[(w * MR + tid) * 2], ws = wpart[(w * MR + tid) * 2 + 1];
        if (wm == -INFINITY) continue;
        const float nm = fmaxf(tm, wm);
        ts = ts * expf(tm - nm) + ws * expf(wm - nm);
        tm = nm;
      }
      rowlse[tid] = tm == -INFINITY ? -INFINITY : tm + logf(ts);
    }
    __syncthreads();
    // Pass 2: the same scores again; the mass of (head g, block kb) = sum over the head's rows of exp(L - total).
    clear_wl();
    score_groups([&](int m, int, int b, float lse) { my_wl[m * 8 + b] = lse; },
                 [&](int j0) {
                   for (int pr = lane; pr < G * bpg; pr += 32) {
                     const int g = pr / bpg, b = pr % bpg, kb = j0 / rb + b;
                     if (kb > qb) continue;
                     float mass = 0.f;
                     for (int r = 0; r < n_rows; ++r) mass += expf(my_wl[(g * rb + r) * 8 + b] - rowlse[g * rb + r]);
                     bs[g * nb + kb] = mass;
                   }
                   __syncwarp();
                   for (int i = lane; i < MR * 8; i += 32) my_wl[i] = -INFINITY;
                 });
    __syncthreads();
  }

  for (int g = 0; g < G; ++g) {
    const int h = kvh * G + g;
    const size_t row_off = static_cast<size_t>(h) * nb + qb;
    float* bg = bs;  // this head's block masses
    if constexpr (kTwoPass) {
      bg = bs + g * nb;  // filled by pass 2
      if (block_scores)
        for (int kb = tid; kb <= qb; kb += kThreads) block_scores[row_off * nb + kb] = bg[kb];
    } else {
      for (int r = warp; r < n_rows; r += kWarps) {  // row totals (every row has key block 0)
        const float* lr = L + (g * rb + r) * nb;
        float mx = -INFINITY;
        for (int kb = lane; kb <= qb; kb += 32) mx = fmaxf(mx, lr[kb]);
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float sum = 0.f;
        for (int kb = lane; kb <= qb; kb += 32) sum += expf(lr[kb] - mx);
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (lane == 0) rowlse[r] = mx + logf(sum);
      }
      __syncthreads();
      for (int kb = tid; kb <= qb; kb += kThreads) {
        float m = 0.f;
        for (int r = 0; r < n_rows; ++r) m += expf(L[(g * rb + r) * nb + kb] - rowlse[r]);
        bs[kb] = m;
        if (block_scores) block_scores[row_off * nb + kb] = m;
      }
      __syncthreads();
    }
    select_blocks(bg, qb, nb, tau, keys, flag, h, row_off, blocks, counts);
    __syncthreads();
  }
}

// Shared memory of the tensor-core kernel with MT row tiles: the query tile (reused for the selection scratch), L,
// bs, staging, rowlse.
size_t mma_smem_bytes(int D, int nb, int MT) {
  constexpr size_t kW = kThreads / 32;
  const size_t MR = 16 * static_cast<size_t>(MT);
  return mma_float_offset(D, nb, MT) + 4 * (MR * nb + nb + kW * MR * 16 + MR);
}
// The two-pass version: no L; every head's masses [G, nb], staging, rowlse, the per-warp group values and partials.
size_t mma_two_pass_smem_bytes(int D, int nb, int G, int MT) {
  constexpr size_t kW = kThreads / 32;
  const size_t MR = 16 * static_cast<size_t>(MT);
  return mma_float_offset(D, nb, MT) + 4 * (static_cast<size_t>(G) * nb + kW * MR * 16 + MR + kW * MR * 8 + kW * MR * 2);
}

void bad(const std::string& what) { throw std::invalid_argument("xattn_estimate_variant: " + what); }

template <int HD>
void launch(const XAttnEstimateParams& p, cudaStream_t stream) {
  const int n_pos = p.pos0 + p.T, nb = (n_pos + p.block - 1) / p.block, rb = p.block / p.stride;
  const int G = p.n_heads / p.n_kv_heads, qb0 = p.pos0 / p.block;
  int dev = 0, optin = 0;
  ELASTIC_CUDA_CHECK(cudaGetDevice(&dev));
  ELASTIC_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  const size_t limit = static_cast<size_t>(optin) - 4096;
  // Tensor cores when a KV head's G query heads fit one or two 16-row tiles: in one pass where the per-(row, block)
  // sums fit shared memory, else in two passes (scores computed twice, only O(G * nb) floats kept).
  const int MT = G * rb <= 16 ? 1 : 2;
  const size_t smem_one = mma_smem_bytes(p.stride * HD, nb, MT),
               smem_two = mma_two_pass_smem_bytes(p.stride * HD, nb, G, MT);
  const bool shape_ok = G * rb <= 32;
  const bool one_fits = shape_ok && smem_one <= limit, two_fits = shape_ok && smem_two <= limit;
  const bool want_two = p.kernel == XAttnEstimateKernel::TensorCoreTwoPass;
  if ((p.kernel == XAttnEstimateKernel::TensorCore && !one_fits && !two_fits) || (want_two && !two_fits))
    bad("the tensor-core estimator needs (query heads per KV head) x block/stride <= 32 (have " +
        std::to_string(G * rb) + ") and " + std::to_string(smem_one) + " bytes of shared memory in one pass or " +
        std::to_string(smem_two) + " in two (have " + std::to_string(limit) + ")");
  ELASTIC_CUDA_CHECK(cudaMemsetAsync(p.counts, 0, sizeof(int32_t) * p.n_heads * nb, stream));
  // Two row tiles (17-32 rows, e.g. Qwen3-4B's 4 query heads per KV head at block 128) run only when named, until
  // they have run on a GPU (written 2026-12-06 without device time): Auto keeps the fp32 kernel there.
  const bool tc_allowed = G * rb <= 16 || p.kernel != XAttnEstimateKernel::Auto;
  if (p.kernel != XAttnEstimateKernel::Simple && tc_allowed && (one_fits || two_fits)) {
    const bool two = want_two || !one_fits;
    auto kernel = MT == 1 ? (two ? xattn_estimate_mma_kernel<HD, true, 1> : xattn_estimate_mma_kernel<HD, false, 1>)
                          : (two ? xattn_estimate_mma_kernel<HD, true, 2> : xattn_estimate_mma_kernel<HD, false, 2>);
    const size_t smem = two ? smem_two : smem_one;
    ELASTIC_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    kernel<<<dim3(nb - qb0, p.n_kv_heads), kThreads, smem, stream>>>(
        reinterpret_cast<const __nv_bfloat16*>(p.q), reinterpret_cast<const __nv_bfloat16*>(p.k), p.T, p.pos0,
        p.n_heads, p.n_kv_heads, p.block, p.stride, p.tau, p.meta, p.blocks, p.offsets, p.counts, p.block_scores);
    ELASTIC_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const int n_cols_max = nb * rb;
  const int N = pow2_at_least(nb);
  const size_t n_floats = static_cast<size_t>(rb) * p.stride * HD + static_cast<size_t>(rb) * n_cols_max + nb;
  const size_t smem = ((n_floats * 4 + 15) & ~size_t(15)) + sizeof(unsigned long long) * N;
  if (smem > limit)
    bad("sequence too long for the shared-memory score rows (" + std::to_string(smem) + " bytes needed for " +
        std::to_string(n_pos) + " positions, block " + std::to_string(p.block) + ", stride " +
        std::to_string(p.stride) + ")");
  ELASTIC_CUDA_CHECK(cudaFuncSetAttribute(xattn_estimate_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
  xattn_estimate_kernel<HD><<<dim3(nb - qb0, p.n_heads), kThreads, smem, stream>>>(
      reinterpret_cast<const __nv_bfloat16*>(p.q), reinterpret_cast<const __nv_bfloat16*>(p.k), p.T, p.pos0,
      p.n_heads, p.n_kv_heads, p.block, p.stride, p.tau, p.meta, p.blocks, p.offsets, p.counts, p.block_scores);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void xattn_estimate_variant(const XAttnEstimateParams& p, cudaStream_t stream) {
  check_xattn_estimate(p, "xattn_estimate_variant");
  if (p.kernel == XAttnEstimateKernel::Gemm || p.kernel == XAttnEstimateKernel::Fused)
    bad("the Gemm and Fused forms are the engine's: xattn_estimate_cuda runs them");
  if (p.head_dim == 64)
    launch<64>(p, stream);
  else if (p.head_dim == 128)
    launch<128>(p, stream);
  else
    bad("head_dim must be 64 or 128 (got " + std::to_string(p.head_dim) + ")");
}

}  // namespace elastic::cuda
