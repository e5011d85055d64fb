// The XAttention estimator with the scores kept on chip (XAttnEstimateKernel::Fused; GpuOptions::xattn_estimate picks
// it, `bench --xa-estimator fused`), the candidate to replace the engine's default cuBLASLt form
// (xattn_estimate_gemm.cu) once a GPU run shows it faster with the same selections. Written 2026-12-07 without device
// time, moved out of the dev area 2026-12-08 so the whole model can be timed with it: compiled, not yet run on a GPU.
//
// Why: the cuBLASLt form spends about 60% of its time outside the product (ncu at 32K, docs/PERFORMANCE.md): packing
// the folded Q and K into scratch (a copy of Q), writing every fp32 score, reading it twice (row statistics, block
// masses), and a bitonic sort per (query head, query block). Here:
//   1. scores_block_lse: the same product, Qf [rows, S*hd] x Kf [keys, S*hd]^T per query head, on wgmma, with the
//      folding done by the TMA copies (a 4-D tensor map over [position / S][position % S][head][d]: the folded rows
//      are read in place, no packing), 128 folded query rows x 256 folded keys per CTA; the epilogue applies the
//      causal mask and the scale and writes, per (row, key block), the log-sum-exp of the row's scores in the block:
//      1/(B/S) of the scores' bytes, written once;
//   2. partial_row_block_lse: the chunk's last folded row when T is not a multiple of S (its positions past the end
//      are zero, which a tile copy cannot express without reading past q): one warp per key block, fp32 dots;
//   3. select_by_threshold: one warp per (query head, query block): the rows' log-sum-exps over the blocks, the block
//      masses (sum over the block's rows of exp(lse - row lse)), then the same greedy rule as xattn_select (block 0
//      and the diagonal kept, then blocks by descending mass, ties to the lower index, while the kept mass < tau *
//      total) found without sorting: the kept candidates are exactly those whose (mass, index) key lies above a
//      threshold, and the threshold is the largest key t at which the masses above t plus the forced blocks still
//      reach tau * total: a bisection over the 47-bit keys with warp sums. Sums are in 2^-44 fixed point (exact, so
//      the order of the additions does not matter and every lane agrees).
// Per call (one prefill chunk), in groups of kGroupRows folded query rows (bounds the scratch): kernels 1 and 2 write
// the group's per-(row, block) log-sum-exps into scratch, kernel 3 selects every query block of the group.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "cuda/mma_sync.cuh"  // smem_addr
#include "cuda/wgmma_tma.cuh"
#include "cuda/xattn_estimate_check.h"
#include "cuda/xattn_select_blocks.cuh"  // warp_combine_max_sum
#include "cuda/xattn_threshold.h"
#include "elastic/cuda.h"
#include "elastic/cuda_attention.h"
#include "cuda/xattn_estimate_fused.h"

namespace elastic::cuda {
namespace {

constexpr int kTM = 128;          // folded query rows per CTA: two consumer warpgroups of 64
constexpr int kTN = 256;          // folded key rows per CTA: two m64n128 products per consumer
constexpr int kTK = 64;           // elements per k-step: one 128-byte swizzled box column
constexpr int kStages = 4;        // k-step ring
constexpr int kGroupRows = 1024;  // folded query rows per group (16,384 positions at stride 16)
constexpr int kABytes = kTM * kTK * 2;
constexpr int kBBytes = kTN * kTK * 2;
constexpr int kStageBytes = kABytes + kBBytes;
constexpr int kScoreSmem = kStages * kStageBytes + 1024;  // + the swizzle atoms' 1024-byte alignment
constexpr int kSelectWarps = 8;

// The scratch of one group: [X * G][kGroupRows or fewer][lda] fp32 log-sum-exps, lda = nb rounded up to 4.
struct Shape {
  int S = 0, B = 0, rb = 0, G = 0, hd = 0, n_pos = 0, nb = 0, lda = 0;
  int i0 = 0, R = 0, R_full = 0, Rc = 0, group_rows = 0;
};
Shape shape_of(int T, int pos0, int n_heads_per_kv, int hd, int S, int B) {
  Shape s;
  s.S = S, s.B = B, s.rb = B / S, s.G = n_heads_per_kv, s.hd = hd;
  s.n_pos = pos0 + T;
  s.nb = (s.n_pos + B - 1) / B;
  s.lda = static_cast<int>(round_up(s.nb, 4));
  s.i0 = pos0 / S;
  s.R = (s.n_pos + S - 1) / S;  // folded rows, the last one partial when n_pos % S != 0
  s.R_full = s.n_pos / S;       // complete folded rows (the tile copies read these; pos0 % S == 0)
  s.Rc = s.R - s.i0;
  s.group_rows = std::min(kGroupRows, s.Rc);
  return s;
}

// Kernel 1. CTA (ct, rt, z = x * G + g): folded key rows [ct * 256, +256) against folded query rows
// [grow0 + rt * 128, +128) of query head kv[x] * G + g; rows at or past n_full (of the group) are not written.
// Warp-specialized like the prefill kernel (attention_fwd_kernels.cuh): WG0's thread 0 issues the copies, WG1 and
// WG2 each multiply 64 of the rows against all 256 keys. A k-step it covers elements [it * 64, +64) of the folded
// rows: fold offset s = it / (hd / 64), columns d0 = (it % (hd / 64)) * 64; the query row takes position
// i * S + S-1-s and the key row position j * S + s (elastic::xattn_select's reshape).
template <int RB>
__global__ void __launch_bounds__(384, 1)
    scores_block_lse(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                     float* __restrict__ lse, int64_t lse_head_stride, int lda, int grow0, int i0, int n_full, int S,
                     int hd, int G, HeadList heads, float scale) {
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bars[2 * kStages];  // full[s], empty[s]
  const int ct = blockIdx.x, rt = blockIdx.y, z = blockIdx.z;
  const int row_first = rt * kTM;  // of the group
  const int i_last = grow0 + min(row_first + kTM, n_full) - 1;
  if (ct * kTN > i_last) return;  // every key of the tile is after every row (causal): the whole CTA leaves
  const int x = z / G, g = z % G, kvh = heads.kv[x], h = kvh * G + g;
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  auto sA = [&](int st) { return base + st * kStageBytes; };
  auto sB = [&](int st) { return base + st * kStageBytes + kABytes; };
  auto bar_full = [&](int st) { return smem_addr(&bars[st]); };
  auto bar_empty = [&](int st) { return smem_addr(&bars[kStages + st]); };
  const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32, warp_in_wg = (tid % 128) / 32;
  const int per_s = hd / kTK, n_k = S * per_s;
  if (tid == 0) {
    for (int st = 0; st < kStages; ++st) {
      mbar_init(bar_full(st), 1);
      mbar_init(bar_empty(st), 8);  // one arrival per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (tid == 0) {
      const int il0 = grow0 - i0 + row_first;  // the chunk's folded query row of the tile's first row
      for (int it = 0; it < n_k; ++it) {
        const int st = it % kStages;
        if (it >= kStages) mbar_wait(bar_empty(st), ((it / kStages) - 1) & 1);
        const int s = it / per_s, d0 = (it % per_s) * kTK;
        mbar_expect_tx(bar_full(st), kStageBytes);  // out-of-range rows count too (they arrive as zeros)
        tma_load_4d(sA(st), &tmQ, d0, h, S - 1 - s, il0, bar_full(st));
        tma_load_4d(sB(st), &tmK, d0, kvh, s, ct * kTN, bar_full(st));
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  const int w = wg - 1;
  float acc[2][64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[0][i] = acc[1][i] = 0.f;
  for (int it = 0; it < n_k; ++it) {
    const int st = it % kStages;
    mbar_wait(bar_full(st), (it / kStages) & 1);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kTK / 16; ++kk) {
      const uint64_t da = make_desc(sA(st) + w * (64 * 128) + kk * 32, 16, 1024);
#pragma unroll
      for (int half = 0; half < 2; ++half)
        wgmma_m64n128k16_ss(acc[half], da, make_desc(sB(st) + half * (128 * 128) + kk * 32, 16, 1024),
                            (it > 0 || kk > 0) ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<1>();  // the previous k-step's products are done: its stage can be refilled
    if (it > 0 && lane == 0) mbar_arrive(bar_empty((it - 1) % kStages));
  }
  wgmma_wait<0>();
  fence_regs<64>(acc[0]);
  fence_regs<64>(acc[1]);

  // Epilogue. Thread (warp_in_wg, gq = lane / 4, t4 = lane % 4) holds, for accumulator row rr (0, 1) =
  // tile row w * 64 + warp_in_wg * 16 + gq + 8 * rr, the columns half * 128 + n * 8 + t4 * 2 + e in acc[half][n * 4 +
  // rr * 2 + e]. A key block is RB consecutive columns: RB 4 = the two lanes t4 = 2c, 2c + 1 of an 8-column group;
  // RB 8 = one group's four lanes; RB 16 = two adjacent groups' four lanes.
  const int gq = lane / 4, t4 = lane % 4;
  constexpr int kGroupsPerBlock = RB == 16 ? 2 : 1;
  float* out = lse + static_cast<int64_t>(z) * lse_head_stride;
  const int blk0 = ct * (kTN / RB);
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int row = row_first + w * 64 + warp_in_wg * 16 + gq + 8 * rr;  // of the group
    const int i = grow0 + row;
    const bool row_ok = row < n_full;
    float* orow = out + static_cast<int64_t>(row) * lda;
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int n = 0; n < 16; n += kGroupsPerBlock) {
        float v[2 * kGroupsPerBlock];
#pragma unroll
        for (int c = 0; c < kGroupsPerBlock; ++c)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int j = ct * kTN + half * 128 + (n + c) * 8 + t4 * 2 + e;
            v[c * 2 + e] = j <= i ? acc[half][(n + c) * 4 + rr * 2 + e] * scale : -INFINITY;
          }
        float m = v[0];
#pragma unroll
        for (int c = 1; c < 2 * kGroupsPerBlock; ++c) m = fmaxf(m, v[c]);
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        if (RB >= 8) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        float sum = 0.f;
        if (m != -INFINITY)
#pragma unroll
          for (int c = 0; c < 2 * kGroupsPerBlock; ++c) sum += expf(v[c] - m);
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        if (RB >= 8) sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const float l = m == -INFINITY ? -INFINITY : m + logf(sum);
        // Stores stop at the row's last key block: blocks past it are -inf and never read, and the last key tile
        // can reach past the row's lda (its keys past n_pos).
        if (RB == 4) {  // t4 0 holds block 2n of the half, t4 2 block 2n + 1: one 8-byte store by t4 0
          const float l_next = __shfl_down_sync(0xffffffffu, l, 2);
          const int blk = blk0 + half * 32 + n * 2;  // even, and lda is a multiple of 4: blk + 1 < lda
          if (row_ok && t4 == 0 && blk * RB <= i) *reinterpret_cast<float2*>(orow + blk) = make_float2(l, l_next);
        } else {
          const int blk = blk0 + (half * 128 + n * 8) / RB;
          if (row_ok && t4 == 0 && blk * RB <= i) orow[blk] = l;
        }
      }
  }
}

// Kernel 2: row `row` of the group (global folded row i = R - 1, positions past n_pos zero) for head slot z =
// blockIdx.y, key blocks blockIdx.x * 8 + warp; the query row in shared memory as fp32.
__global__ void __launch_bounds__(256)
    partial_row_block_lse(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                          float* __restrict__ lse, int64_t lse_head_stride, int lda, int row, int i, int pos0,
                          int n_pos, int Hq, int Hkv, int G, int hd, int S, int rb, HeadList heads, float scale) {
  extern __shared__ float qf[];  // [S * hd]
  const int z = blockIdx.y, x = z / G, g = z % G, kvh = heads.kv[x], h = kvh * G + g;
  const int D = S * hd;
  for (int e = threadIdx.x; e < D; e += blockDim.x) {
    const int s = e / hd, d = e % hd, pos = i * S + S - 1 - s;
    qf[e] = pos < n_pos ? __bfloat162float(q[(static_cast<int64_t>(pos - pos0) * Hq + h) * hd + d]) : 0.f;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, b = blockIdx.x * 8 + warp;
  if (b > i / rb) return;
  float m = -INFINITY, sum = 0.f;
  for (int j = b * rb; j <= min((b + 1) * rb - 1, i); ++j) {
    float dot = 0.f;
    for (int e = lane; e < D; e += 32) {
      const int s = e / hd, d = e % hd, pos = j * S + s;
      if (pos < n_pos) dot += qf[e] * __bfloat162float(k[(static_cast<int64_t>(pos) * Hkv + kvh) * hd + d]);
    }
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    const float v = dot * scale, nm = fmaxf(m, v);
    sum = sum * expf(m - nm) + expf(v - nm);  // m = -inf only before the first key, where sum is 0
    m = nm;
  }
  if (lane == 0) lse[static_cast<int64_t>(z) * lse_head_stride + static_cast<int64_t>(row) * lda + b] = m + logf(sum);
}

__device__ __forceinline__ unsigned long long warp_sum_u64(unsigned long long v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
using xattn_threshold::kept_threshold;
using xattn_threshold::order_key;
using xattn_threshold::to_fixed;

// Kernel 3: warp (kvh, g, query block qb_begin + j) of the group; A rows of the group, -inf past each row's keys.
__global__ void __launch_bounds__(kSelectWarps * 32)
    select_by_threshold(const float* __restrict__ lse, int64_t lse_head_stride, int lda, int grow0, int qb_begin,
                        int n_qb, int R, int nb, int rb, int G, int Hkv, float tau,
                        const KVHeadMeta* __restrict__ meta, HeadList heads, int32_t* __restrict__ blocks,
                        int32_t* __restrict__ offsets, int32_t* __restrict__ counts, float* __restrict__ block_scores) {
  extern __shared__ float masses_all[];  // [kSelectWarps][nb]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kSelectWarps + warp;
  if (item >= static_cast<int64_t>(Hkv) * G * n_qb) return;
  const int qb = qb_begin + static_cast<int>(item % n_qb), hg = static_cast<int>(item / n_qb);
  const int kvh = hg / G, g = hg % G, h = kvh * G + g;
  const size_t row_off = static_cast<size_t>(h) * nb + qb;
  if (lane == 0) offsets[row_off] = static_cast<int32_t>(static_cast<int64_t>(h) * nb * (nb + 1) / 2 +
                                                         int64_t(qb) * (qb + 1) / 2);
  const int x = heads.slot[kvh];
  if (meta[kvh].mode != kv_mode::kXAttn || x < 0) return;  // counts stay 0 (cleared before)
  float* ms = masses_all + static_cast<size_t>(warp) * nb;
  const float* a = lse + static_cast<int64_t>(x * G + g) * lse_head_stride;
  const int n_rows = min(rb, R - qb * rb);
  for (int b = lane; b <= qb; b += 32) ms[b] = 0.f;
  __syncwarp();
  for (int r = 0; r < n_rows; ++r) {
    const float* row = a + static_cast<int64_t>(qb * rb + r - grow0) * lda;
    float m = -INFINITY, s = 0.f;
    for (int b = lane; b <= qb; b += 32) {
      const float v = row[b];
      if (v == -INFINITY) continue;
      const float nm = fmaxf(m, v);
      s = s * expf(m - nm) + expf(v - nm);
      m = nm;
    }
    xattn_detail::warp_combine_max_sum(m, s);
    const float row_lse = __shfl_sync(0xffffffffu, m + logf(s), 0);  // lane 0's: every lane the same value
    for (int b = lane; b <= qb; b += 32) ms[b] += expf(row[b] - row_lse);  // each lane its own blocks, rows in order
  }
  __syncwarp();
  unsigned long long total = 0;
  for (int b = lane; b <= qb; b += 32) {
    total += to_fixed(ms[b]);
    if (block_scores) block_scores[row_off * nb + b] = ms[b];
  }
  total = warp_sum_u64(total);
  const unsigned long long forced = to_fixed(ms[0]) + (qb > 0 ? to_fixed(ms[qb]) : 0ull);
  const double required = static_cast<double>(total) * static_cast<double>(tau);
  // Candidates 1 <= kb < qb, kept iff their key exceeds the threshold (xattn_threshold.h says why that is the rule).
  auto above = [&](unsigned long long t) {  // fixed-point mass of the candidates with key > t, summed by the warp
    unsigned long long s = 0;
    for (int kb = 1 + lane; kb < qb; kb += 32)
      if (order_key(ms[kb], kb) > t) s += to_fixed(ms[kb]);
    return warp_sum_u64(s);
  };
  const unsigned long long t = kept_threshold(qb > 1, forced, required, above);
  // Ascending write: block 0, the kept candidates, the diagonal.
  int32_t* outl = blocks + (static_cast<int64_t>(h) * nb * (nb + 1) / 2 + int64_t(qb) * (qb + 1) / 2);
  int n = 0;
  for (int b0 = 0; b0 <= qb; b0 += 32) {
    const int kb = b0 + lane;
    const bool f = kb <= qb && (kb == 0 || kb == qb || xattn_threshold::kept(t, ms[kb], kb));
    const unsigned bal = __ballot_sync(0xffffffffu, f);
    if (f) outl[n + __popc(bal & ((1u << lane) - 1u))] = kb;
    n += __popc(bal);
  }
  if (lane == 0) counts[row_off] = n;
}

// Host: Q of the chunk as [folded row il][fold offset s'][head][d] (position il * S + s'), complete rows only; K the
// same over every position. Boxes: 64 columns x 1 x 1 x (128 query or 256 key rows).
CUtensorMap folded_map(const void* ptr, int hd, int heads, int S, int rows, int box_rows) {
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(hd), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(S), static_cast<cuuint64_t>(rows)};
  const cuuint64_t row_bytes = static_cast<cuuint64_t>(heads) * hd * 2;
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(hd) * 2, row_bytes, row_bytes * S};
  const cuuint32_t box[4] = {64, 1, 1, static_cast<cuuint32_t>(box_rows)};
  return encode_bf16_tensor_map(ptr, 4, dims, strides, box, "xattn_estimate_cuda (Fused)");
}

void bad(const std::string& what) { throw std::invalid_argument("xattn_estimate_cuda (Fused): " + what); }

template <int RB>
void launch_scores(const CUtensorMap& mq, const CUtensorMap& mk, float* lse, int64_t head_stride, const Shape& s,
                   int grow0, int n_full, int X, const HeadList& heads, float scale, cudaStream_t stream) {
  static unsigned long long configured = 0;  // a bit per device: the attribute is set per device
  int dev = 0;
  ELASTIC_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev >= 64 || !(configured >> dev & 1)) {
    ELASTIC_CUDA_CHECK(
        cudaFuncSetAttribute(scores_block_lse<RB>, cudaFuncAttributeMaxDynamicSharedMemorySize, kScoreSmem));
    if (dev < 64) configured |= 1ull << dev;
  }
  const dim3 grid(static_cast<unsigned>((grow0 + n_full + kTN - 1) / kTN),
                  static_cast<unsigned>((n_full + kTM - 1) / kTM), static_cast<unsigned>(X * s.G));
  scores_block_lse<RB><<<grid, 384, kScoreSmem, stream>>>(mq, mk, lse, head_stride, s.lda, grow0, s.i0, n_full, s.S,
                                                          s.hd, s.G, heads, scale);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

size_t xattn_fused_scratch_bytes(int T, int n_pos, int n_kv_heads, int n_heads_per_kv, int head_dim, int stride,
                                 int block) {
  if (T <= 0 || n_pos < T || n_kv_heads <= 0 || n_heads_per_kv <= 0 || head_dim <= 0 || stride <= 0 ||
      block < stride)
    return 0;
  const Shape s = shape_of(T, n_pos - T, n_heads_per_kv, head_dim, stride, block);
  return size_t(n_kv_heads) * n_heads_per_kv * s.group_rows * s.lda * sizeof(float);
}

void xattn_estimate_fused(const XAttnEstimateParams& p, cudaStream_t stream) {
  // xattn_estimate_cuda checked the common parameters (check_xattn_estimate): pos0 % block == 0, which the tile
  // coordinates rely on, tau, the pointers.
  const int G = p.n_heads / p.n_kv_heads, S = p.stride, B = p.block, hd = p.head_dim;
  if (hd != 64 && hd != 128) bad("head_dim must be 64 or 128 (got " + std::to_string(hd) + ")");
  if (S != 8 && S != 16) bad("stride must be 8 or 16 (got " + std::to_string(S) + ")");
  const int rb = B / S;
  if (rb != 4 && rb != 8 && rb != 16) bad("block / stride must be 4, 8 or 16 (got " + std::to_string(rb) + ")");
  int X = 0;
  const HeadList heads = head_list(p, X, "xattn_estimate_cuda (Fused)");
  const Shape s = shape_of(p.T, p.pos0, G, hd, S, B);
  if (s.nb > xattn_threshold::kMaxBlocks) bad("at most 65,535 key blocks (the order keys hold a 16-bit index)");
  if (!p.scratch) bad("needs scratch (xattn_fused_scratch_bytes)");
  const size_t need = xattn_fused_scratch_bytes(p.T, s.n_pos, X, G, hd, S, B);
  if (X > 0 && need > p.scratch_bytes)
    bad("needs " + std::to_string(need) + " bytes of scratch for this chunk, got " + std::to_string(p.scratch_bytes));
  const size_t sel_smem = size_t(kSelectWarps) * s.nb * sizeof(float);
  int dev = 0, optin = 0;
  ELASTIC_CUDA_CHECK(cudaGetDevice(&dev));
  ELASTIC_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (sel_smem > static_cast<size_t>(optin))
    bad("the selection's " + std::to_string(sel_smem) + " bytes of shared memory exceed the device's " +
        std::to_string(optin) + " (" + std::to_string(s.n_pos) + " positions at block " + std::to_string(B) + ")");
  ELASTIC_CUDA_CHECK(
      cudaFuncSetAttribute(select_by_threshold, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(sel_smem)));
  ELASTIC_CUDA_CHECK(cudaMemsetAsync(p.counts, 0, sizeof(int32_t) * p.n_heads * s.nb, stream));

  auto* lse = static_cast<float*>(p.scratch);
  const int64_t head_stride = int64_t(s.group_rows) * s.lda;
  const float scale = 1.f / std::sqrt(static_cast<float>(hd)) / static_cast<float>(S);
  const int Rq_full = s.R_full - s.i0;  // the chunk's complete folded query rows
  CUtensorMap mq{}, mk{};
  if (X > 0 && Rq_full > 0) {
    mq = folded_map(p.q, hd, p.n_heads, S, Rq_full, kTM);
    mk = folded_map(p.k, hd, p.n_kv_heads, S, s.R_full, kTN);
  }
  const int qb0 = p.pos0 / B;
  for (int r0 = 0; r0 < s.Rc; r0 += kGroupRows) {
    const int grow0 = s.i0 + r0, rows = std::min(kGroupRows, s.Rc - r0);
    const int n_full = std::min(rows, s.R_full - grow0);  // complete rows of the group
    if (X > 0 && n_full > 0) {
      if (rb == 4) launch_scores<4>(mq, mk, lse, head_stride, s, grow0, n_full, X, heads, scale, stream);
      else if (rb == 8) launch_scores<8>(mq, mk, lse, head_stride, s, grow0, n_full, X, heads, scale, stream);
      else launch_scores<16>(mq, mk, lse, head_stride, s, grow0, n_full, X, heads, scale, stream);
    }
    if (X > 0 && n_full < rows) {  // the partial last row (n_pos % S != 0) is the group's last
      const int i = s.R - 1, n_blocks = i / rb + 1;
      partial_row_block_lse<<<dim3((n_blocks + 7) / 8, X * G), 256, sizeof(float) * S * hd, stream>>>(
          reinterpret_cast<const __nv_bfloat16*>(p.q), reinterpret_cast<const __nv_bfloat16*>(p.k), lse, head_stride,
          s.lda, i - grow0, i, p.pos0, s.n_pos, p.n_heads, p.n_kv_heads, G, hd, S, rb, heads, scale);
      ELASTIC_CUDA_CHECK(cudaGetLastError());
    }
    // The group's query blocks (its rows start on a block: kGroupRows and i0 are multiples of rb).
    const int qb_begin = qb0 + r0 / rb, n_qb = (rows + rb - 1) / rb;
    const int64_t items = int64_t(p.n_kv_heads) * G * n_qb;
    select_by_threshold<<<static_cast<unsigned>((items + kSelectWarps - 1) / kSelectWarps), kSelectWarps * 32,
                          sel_smem, stream>>>(lse, head_stride, s.lda, grow0, qb_begin, n_qb, s.R, s.nb, rb, G,
                                              p.n_kv_heads, p.tau, p.meta, heads, p.blocks, p.offsets, p.counts,
                                              p.block_scores);
    ELASTIC_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace elastic::cuda
