// Backward of the fused block-sparse (hybrid) attention, FlashAttention-2 style, for router training (pos0 = 0).
//
// 1. Preprocess (one warp per (query head, row)): delta = rowsum(dO * O) and lse converted to the log2 domain, into
//    the workspace, both padded to whole 64-row tiles (padding rows: delta 0, lse +inf, so they contribute P = 0 and
//    the main kernel can cp.async whole tiles of them without bounds checks).
// 2. Main kernel: CTA = 4 warps = one 64-key tile of one KV head (16 keys per warp), dK and dV of those keys in fp32
//    registers. It walks, for every query head of the KV head's group, the 64-row query tiles whose sparse block
//    keeps this key block, and per query tile (mma.sync m16n8k16 bf16, fp32 accumulate):
//      S^T = K Q^T, P^T = exp2(S^T * scale*log2e - lse2)  (token causality on the diagonal tile only),
//      dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - delta) * scale, dK += dS^T Q,
//      dQ += dS K: dS^T goes through shared memory (bf16) and each warp adds 16 query rows x hd into global fp32 dQ
//      with float2 atomics (no separate dQ pass; the dQ GEMM reuses the K tile already in shared memory).
//    Keys are the M dimension of S^T, so P^T / dS^T accumulators become A fragments of the dV / dK products directly.
//    Q, dO, lse, delta of the next query tile are double-buffered with cp.async (XOR-swizzled rows, ldmatrix).
//    Query-block lists: at start the CTA builds, per query head of its group, a bitmask over query blocks qb >= kb of
//    "qb keeps key block kb" (Full: all; Streaming: kb < sink || qb - kb < local; XAttn: binary search of kb in the
//    ascending (h, qb) list, one query block per thread), then walks set bits with __ffs (uniform across the CTA).
//    CTAs are ordered so the longest ones (early key tiles) start first.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "elastic/streaming_rule.h"
#include "elastic/cuda.h"
#include "cuda/mma_sync.cuh"
#include "elastic/cuda_attention_bwd.h"

namespace elastic::cuda {
namespace {

constexpr int kBN = 64;  // keys per CTA (16 per warp)
constexpr int kBM = 64;  // query rows per step
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;

// Swizzled chunk offset (bytes) of chunk c ^ x, for a compile-time even c and a per-thread x in [0, 8): the four
// possible low parts are precomputed per thread (co[i] = ((2 i) ^ x) << 4), so every ldmatrix address in the
// unrolled loops is a per-thread register plus an immediate instead of one hoisted register per address.
__device__ __forceinline__ uint32_t coff(const uint32_t (&co)[4], int c) {
  return static_cast<uint32_t>((c & ~7) << 4) + co[(c & 7) >> 1];
}

// acc = A B^T for this warp's 16 rows of A (keys or values) and the 64 rows of B (query-side rows), both [rows, HD]
// swizzled tiles, as 8 n-fragments: S^T = K Q^T and dP^T = V dO^T.
template <int HD>
__device__ __forceinline__ void rows_times_tile_t(float (&acc)[kBM / 8][4], uint32_t A, uint32_t Bt, uint32_t row_a,
                                                  uint32_t row_b, const uint32_t (&co_a)[4],
                                                  const uint32_t (&co_b)[4]) {
#pragma unroll
  for (int j = 0; j < kBM / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    uint32_t a[4];
    ldsm_x4(A + row_a + coff(co_a, kk * 2), a[0], a[1], a[2], a[3]);
#pragma unroll
    for (int j = 0; j < kBM / 8; j += 2) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4(Bt + row_b + j * 8 * HD * 2 + coff(co_b, kk * 2), b0, b1, b2, b3);
      mma_bf16(acc[j], a, b0, b1);
      mma_bf16(acc[j + 1], a, b2, b3);
    }
  }
}

// Rows [row0, row0 + 64) of one head (row stride ld elements) into a swizzled tile; rows >= n_rows are zero.
template <int HD>
__device__ __forceinline__ void load_tile(uint32_t tile, const __nv_bfloat16* base, int row0, int n_rows, size_t ld,
                                          int tid) {
  constexpr int kChunks = HD / 8;
#pragma unroll
  for (int i = 0; i < 64 * kChunks / kThreads; ++i) {
    const int idx = tid + i * kThreads;
    const int r = idx / kChunks, c = idx % kChunks;
    const int row = row0 + r;
    const bool ok = row < n_rows;
    cp_async16(tile + swz<HD>(r, c), base + static_cast<size_t>(ok ? row : 0) * ld + c * 8, ok ? 16 : 0);
  }
}

// delta[h, t] = sum_d dO[t, h, d] * O[t, h, d]; lse2[h, t] = lse * log2(e). Rows t in [T, T_pad): 0 and +inf. A row
// with no computed key (lse = -inf, does not happen with the diagonal always kept) also gets +inf, i.e. P = 0.
__global__ void attn_bwd_preprocess(const __nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ dout,
                                    const float* __restrict__ lse, float* __restrict__ delta,
                                    float* __restrict__ lse2, int T, int T_pad, int Hq, int hd) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= static_cast<int64_t>(Hq) * T_pad) return;
  const int h = static_cast<int>(row / T_pad), t = static_cast<int>(row % T_pad);
  if (t >= T) {
    if (lane == 0) delta[row] = 0.f, lse2[row] = INFINITY;
    return;
  }
  const size_t off = (static_cast<size_t>(t) * Hq + h) * hd;
  float s = 0.f;
  for (int d = lane * 2; d < hd; d += 64) {
    const float2 o = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(out + off + d));
    const float2 g = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(dout + off + d));
    s += o.x * g.x + o.y * g.y;
  }
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
  if (lane == 0) {
    const float l = lse[static_cast<size_t>(h) * T + t];
    delta[row] = s;
    lse2[row] = l == -INFINITY ? INFINITY : l * kLog2e;
  }
}

// Whether query block qb of query head h computes key block kb (qb >= kb).
__device__ __forceinline__ bool block_keeps(const KVHeadMeta& m, const XAttnBlockLists& xl, int h, int nb, int qb,
                                            int kb) {
  if (m.mode == kv_mode::kStreaming) return streaming_block_kept(qb, kb, StreamingBlocks{m.sink_blocks, m.local_blocks});
  if (m.mode == kv_mode::kXAttn && xl.blocks != nullptr) {
    const int n = xl.counts[h * nb + qb];
    const int32_t* l = xl.blocks + xl.offsets[h * nb + qb];
    int lo = 0, hi = n;  // first index with l[i] >= kb (lists are ascending)
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (l[mid] < kb) lo = mid + 1;
      else hi = mid;
    }
    return lo < n && l[lo] == kb;
  }
  return true;
}

template <int HD>
__global__ void __launch_bounds__(kThreads, 2)
    attn_bwd_kernel(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                    const __nv_bfloat16* __restrict__ v, const __nv_bfloat16* __restrict__ dout,
                    const float* __restrict__ delta, const float* __restrict__ lse2, float* __restrict__ dq,
                    float* __restrict__ dk, float* __restrict__ dv, int T, int T_pad, int Hq, int Hkv, int block,
                    const KVHeadMeta* __restrict__ meta, XAttnBlockLists xattn, int mask_words, float scale,
                    float scale_log2) {
  constexpr int kTile = 64 * HD * 2;  // bytes of one 64-row bf16 tile
  constexpr int kOffDS = 6 * kTile;   // K, V, Q[2], dO[2] before it
  constexpr int kOffL = kOffDS + kBN * kBM * 2;
  constexpr int kOffD = kOffL + 2 * kBM * 4;
  constexpr int kOffMask = kOffD + 2 * kBM * 4;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t base = smem_addr(smem);
  const uint32_t sK = base, sV = base + kTile, sDS = base + kOffDS;
  auto sQ = [&](int b) { return base + (2 + 2 * b) * kTile; };
  auto sO = [&](int b) { return base + (3 + 2 * b) * kTile; };
  const float* sL = reinterpret_cast<const float*>(smem + kOffL);  // [2][64] lse2
  const float* sD = reinterpret_cast<const float*>(smem + kOffD);  // [2][64] delta
  uint32_t* masks = reinterpret_cast<uint32_t*>(smem + kOffMask);  // [group][mask_words]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int kvh = blockIdx.x, kt = blockIdx.y;  // key tiles in launch order: the longest CTAs first
  const int group = Hq / Hkv, R = block / kBN, kb = kt / R;
  const int nb = (T + block - 1) / block, nqt = (T + kBM - 1) / kBM;
  const size_t ldq = static_cast<size_t>(Hq) * HD, ldkv = static_cast<size_t>(Hkv) * HD;
  const KVHeadMeta m = meta[kvh];

  load_tile<HD>(sK, k + static_cast<size_t>(kvh) * HD, kt * kBN, T, ldkv, tid);
  load_tile<HD>(sV, v + static_cast<size_t>(kvh) * HD, kt * kBN, T, ldkv, tid);
  cp_async_commit();

  // Bit i of word w of head j: query block kb + 32 w + i keeps key block kb.
  const int span = nb - kb, n_words = (span + 31) / 32;
  for (int j = 0; j < group; ++j) {
    const int h = kvh * group + j;
    for (int b0 = 0; b0 < span; b0 += kThreads) {
      const int rel = b0 + tid;
      const bool keep = rel < span && block_keeps(m, xattn, h, nb, kb + rel, kb);
      const uint32_t word = __ballot_sync(0xffffffffu, keep);
      const int w = (b0 >> 5) + warp;
      if (lane == 0 && w < n_words) masks[j * mask_words + w] = word;
    }
  }
  __syncthreads();

  // First kept query block >= from of head j, or -1.
  auto find_from = [&](int j, int from) -> int {
    int rel = from - kb;
    if (rel >= span) return -1;
    int w = rel >> 5;
    uint32_t bits = masks[j * mask_words + w] & (0xffffffffu << (rel & 31));
    for (;;) {
      if (bits) return kb + w * 32 + __ffs(bits) - 1;
      if (++w >= n_words) return -1;
      bits = masks[j * mask_words + w];
    }
  };
  // Walk state: head j of the group, query block qb, query tile qt (qt >= kt: earlier tiles are fully causal-masked).
  int cj = 0, cqb = find_from(0, kb);
  while (cqb < 0 && ++cj < group) cqb = find_from(cj, kb);
  bool have = cqb >= 0;
  int cqt = have ? max(cqb * R, kt) : 0;
  auto advance = [&](int& j, int& qb, int& qt) -> bool {
    if (qt + 1 < min(qb * R + R, nqt)) {
      ++qt;
      return true;
    }
    qb = find_from(j, qb + 1);
    while (qb < 0) {
      if (++j >= group) return false;
      qb = find_from(j, kb);
    }
    qt = max(qb * R, kt);
    return true;
  };
  auto issue_loads = [&](int j, int qt, int b) {
    const int h = kvh * group + j;
    load_tile<HD>(sQ(b), q + static_cast<size_t>(h) * HD, qt * kBM, T, ldq, tid);
    load_tile<HD>(sO(b), dout + static_cast<size_t>(h) * HD, qt * kBM, T, ldq, tid);
    if (tid < 32) {  // 16 chunks of lse2 then 16 of delta (in bounds: the workspace rows are padded)
      const float* src = (tid < 16 ? lse2 : delta) + static_cast<size_t>(h) * T_pad + qt * kBM + (tid % 16) * 4;
      cp_async16(base + (tid < 16 ? kOffL : kOffD) + b * kBM * 4 + (tid % 16) * 16, src, 16);
    }
  };
  if (have) issue_loads(cj, cqt, 0);
  cp_async_commit();

  float dka[HD / 8][4], dva[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dka[n][e] = dva[n][e] = 0.f;
  const int key_r0 = kt * kBN + warp * 16 + g;  // this thread's first key row (second: +8)
  // Per-thread parts of the ldmatrix addresses. The row of every ldmatrix is (multiple of 8) + lane % 8, so its
  // swizzle XOR is lane % 8 and the chunk index is (even constant) ^ x with x below.
  const int l8 = lane % 8, hi8 = (lane / 8) % 2, hi16 = lane / 16;
  uint32_t co_a[4], co_b[4];  // x = hi16 ^ l8 (A loads of K / V, transposed B loads), x = hi8 ^ l8 (plain B loads)
#pragma unroll
  for (int i = 0; i < 4; ++i) co_a[i] = ((2 * i) ^ hi16 ^ l8) << 4, co_b[i] = ((2 * i) ^ hi8 ^ l8) << 4;
  const uint32_t row_a = (warp * 16 + hi8 * 8 + l8) * HD * 2;  // A (K, V): this warp's 16 keys
  const uint32_t row_b = (hi16 * 8 + l8) * HD * 2;             // plain B (Q, dO rows as n), + j * 8 rows
  const uint32_t row_t = (hi8 * 8 + l8) * HD * 2;              // transposed B (rows as k), + kk * 16 rows
  const uint32_t ds_a = sDS + (hi16 * 8 + l8) * kBM * 2 + (((2 * warp) ^ hi8 ^ l8) << 4);  // dS A loads, + kc * 16 rows

  for (int it = 0; have; ++it) {
    const int b = it & 1;
    cp_async_wait<0>();
    __syncthreads();  // tile it landed; every warp is done with step it-1 (buffer b^1 and sDS are free)
    int nj = cj, nqb = cqb, nqt_ = cqt;
    const bool has_next = advance(nj, nqb, nqt_);
    if (has_next) issue_loads(nj, nqt_, b ^ 1);
    cp_async_commit();

    const int h = kvh * group + cj, qt = cqt;
    const uint32_t Qs = sQ(b), Os = sO(b);
    const float* L = sL + b * kBM;
    const float* Dl = sD + b * kBM;

    // S^T = K Q^T: 16 keys x 64 query rows per warp.
    float s[kBM / 8][4];
    rows_times_tile_t<HD>(s, sK, Qs, row_a, row_b, co_a, co_b);
    // P^T = exp2(S^T * scale*log2e - lse2[q]); on the diagonal tile keys after the query are masked. P^T is kept as
    // bf16 A fragments (16 query rows each): the dV product needs it so, and dS is rounded to bf16 anyway; this
    // frees 16 registers while dP is accumulated (fp32 P spills at hd 128).
    const bool diag = qt == kt;
    uint32_t pa[kBM / 16][4];
#pragma unroll
    for (int j = 0; j < kBM / 8; ++j) {
      const float2 l = *reinterpret_cast<const float2*>(L + j * 8 + 2 * t4);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float p = exp2_ftz(s[j][e] * scale_log2 - ((e & 1) ? l.y : l.x));
        if (diag && key_r0 + (e >> 1) * 8 > qt * kBM + j * 8 + 2 * t4 + (e & 1)) p = 0.f;
        s[j][e] = p;
      }
      // A fragment layout: a0 (row g, k 0-7), a1 (row g + 8, k 0-7), a2 / a3 the same for k 8-15.
      pa[j / 2][(j % 2) * 2] = pack_bf16(s[j][0], s[j][1]);
      pa[j / 2][(j % 2) * 2 + 1] = pack_bf16(s[j][2], s[j][3]);
    }
    // dV += P^T dO.
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk)
#pragma unroll
      for (int n = 0; n < HD / 8; n += 2) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4_t(Os + row_t + kk * 16 * HD * 2 + coff(co_a, n), b0, b1, b2, b3);
        mma_bf16(dva[n], pa[kk], b0, b1);
        mma_bf16(dva[n + 1], pa[kk], b2, b3);
      }
    // dP^T = V dO^T.
    float dp[kBM / 8][4];
    rows_times_tile_t<HD>(dp, sV, Os, row_a, row_b, co_a, co_b);
    // dS^T = P^T (dP^T - delta[q]) * scale (the softmax scale folded in here serves both dK and dQ), as bf16 A
    // fragments (overwriting pa) and into shared memory as [key][query] for the dQ product.
#pragma unroll
    for (int j = 0; j < kBM / 8; ++j) {
      const float2 d = *reinterpret_cast<const float2*>(Dl + j * 8 + 2 * t4);
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        uint32_t& frag = pa[j / 2][(j % 2) * 2 + rr];
        const float2 pv = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&frag));
        frag = pack_bf16(pv.x * (dp[j][rr * 2] - d.x) * scale, pv.y * (dp[j][rr * 2 + 1] - d.y) * scale);
        *reinterpret_cast<uint32_t*>(smem + kOffDS + swz<kBM>(warp * 16 + g + rr * 8, j) + 4 * t4) = frag;
      }
    }
    // dK += dS^T Q.
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk)
#pragma unroll
      for (int n = 0; n < HD / 8; n += 2) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4_t(Qs + row_t + kk * 16 * HD * 2 + coff(co_a, n), b0, b1, b2, b3);
        mma_bf16(dka[n], pa[kk], b0, b1);
        mma_bf16(dka[n + 1], pa[kk], b2, b3);
      }
    __syncthreads();  // dS^T of all warps in shared memory

    // dQ[16 query rows of this warp, hd] += dS K, in 32-column chunks, float2 atomics into global fp32.
    uint32_t da[kBN / 16][4];  // A fragments of dS (query rows x keys) = transposed loads of dS^T
#pragma unroll
    for (int kc = 0; kc < kBN / 16; ++kc)
      ldsm_x4_t(ds_a + kc * 16 * kBM * 2, da[kc][0], da[kc][1], da[kc][2], da[kc][3]);
    const int t0 = qt * kBM + warp * 16 + g, t1 = t0 + 8;
    float* dq0 = dq + (static_cast<size_t>(t0) * Hq + h) * HD + 2 * t4;
    float* dq1 = dq + (static_cast<size_t>(t1) * Hq + h) * HD + 2 * t4;
#pragma unroll
    for (int dc = 0; dc < HD / 32; ++dc) {
      float acc[4][4];
#pragma unroll
      for (int n = 0; n < 4; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
      for (int kc = 0; kc < kBN / 16; ++kc)
#pragma unroll
        for (int n = 0; n < 4; n += 2) {
          uint32_t b0, b1, b2, b3;
          ldsm_x4_t(sK + row_t + kc * 16 * HD * 2 + coff(co_a, dc * 4 + n), b0, b1, b2, b3);
          mma_bf16(acc[n], da[kc], b0, b1);
          mma_bf16(acc[n + 1], da[kc], b2, b3);
        }
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int col = dc * 32 + n * 8;
        if (t0 < T) atomicAdd(reinterpret_cast<float2*>(dq0 + col), make_float2(acc[n][0], acc[n][1]));
        if (t1 < T) atomicAdd(reinterpret_cast<float2*>(dq1 + col), make_float2(acc[n][2], acc[n][3]));
      }
    }
    cj = nj, cqb = nqb, cqt = nqt_, have = has_next;
  }
  cp_async_wait<0>();

  // dK, dV of this CTA's keys: no other CTA touches them, so a plain read-add-write.
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int key = key_r0 + rr * 8;
    if (key >= T) continue;
    const size_t off = (static_cast<size_t>(key) * Hkv + kvh) * HD + 2 * t4;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      float2* pk = reinterpret_cast<float2*>(dk + off + n * 8);
      float2* pv = reinterpret_cast<float2*>(dv + off + n * 8);
      float2 a = *pk, c = *pv;
      a.x += dka[n][rr * 2], a.y += dka[n][rr * 2 + 1];
      c.x += dva[n][rr * 2], c.y += dva[n][rr * 2 + 1];
      *pk = a, *pv = c;
    }
  }
}

void bad(const std::string& what) { throw std::invalid_argument("hybrid_attention_bwd: " + what); }

int64_t padded_rows(int T) { return (static_cast<int64_t>(T) + kBM - 1) / kBM * kBM; }

template <int HD>
void launch_main(const HybridAttnBwdParams& p, cudaStream_t stream, const float* delta, const float* lse2, int T_pad) {
  const int group = p.n_heads / p.n_kv_heads, nb = (p.T + p.block - 1) / p.block;
  const int mask_words = (nb + 31) / 32;
  const size_t smem = 6 * 64 * HD * 2 + kBN * kBM * 2 + 4 * kBM * 4 + static_cast<size_t>(group) * mask_words * 4;
  int dev = 0, max_smem = 0;
  ELASTIC_CUDA_CHECK(cudaGetDevice(&dev));
  ELASTIC_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (smem > static_cast<size_t>(max_smem))
    bad("T " + std::to_string(p.T) + " with " + std::to_string(group) + " query heads per KV head needs " +
        std::to_string(smem) + " bytes of shared memory (device allows " + std::to_string(max_smem) + ")");
  static size_t configured = 0;  // raise the dynamic shared-memory limit when a call needs more than before
  if (smem > configured) {
    ELASTIC_CUDA_CHECK(
        cudaFuncSetAttribute(attn_bwd_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    configured = smem;
  }
  const int nkt = (p.T + kBN - 1) / kBN;
  if (nkt > 65535) bad("T too large (" + std::to_string(p.T) + "): more than 65535 key tiles");
  const float scale = 1.f / std::sqrt(static_cast<float>(HD));
  dim3 grid(p.n_kv_heads, nkt);
  attn_bwd_kernel<HD><<<grid, kThreads, smem, stream>>>(
      reinterpret_cast<const __nv_bfloat16*>(p.q), reinterpret_cast<const __nv_bfloat16*>(p.k),
      reinterpret_cast<const __nv_bfloat16*>(p.v), reinterpret_cast<const __nv_bfloat16*>(p.dout), delta, lse2, p.dq,
      p.dk, p.dv, p.T, T_pad, p.n_heads, p.n_kv_heads, p.block, p.meta, p.xattn, mask_words, scale, scale * kLog2e);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

int64_t attention_bwd_workspace_floats(int T, int n_heads, int /*head_dim*/) {
  return 2 * static_cast<int64_t>(n_heads) * padded_rows(T);
}

void hybrid_attention_bwd(const HybridAttnBwdParams& p, cudaStream_t stream) {
  if (!p.q || !p.k || !p.v) bad("null q, k or v");
  if (!p.out || !p.lse || !p.dout) bad("null out, lse or dout");
  if (!p.dq || !p.dk || !p.dv) bad("null dq, dk or dv");
  if (!p.workspace) bad("null workspace");
  if (!p.meta) bad("null meta");
  if (p.T <= 0) bad("T must be > 0 (got " + std::to_string(p.T) + ")");
  if (p.n_heads <= 0 || p.n_kv_heads <= 0 || p.n_heads % p.n_kv_heads)
    bad("n_heads must be a positive multiple of n_kv_heads (got " + std::to_string(p.n_heads) + " and " +
        std::to_string(p.n_kv_heads) + ")");
  if (p.head_dim != 64 && p.head_dim != 128) bad("head_dim must be 64 or 128 (got " + std::to_string(p.head_dim) + ")");
  if (p.block != 64 && p.block != 128) bad("block must be 64 or 128 (got " + std::to_string(p.block) + ")");
  if (p.xattn.blocks && (!p.xattn.offsets || !p.xattn.counts)) bad("xattn lists need offsets and counts");
  if (reinterpret_cast<uintptr_t>(p.workspace) % 16) bad("workspace must be 16-byte aligned");
  if (reinterpret_cast<uintptr_t>(p.dq) % 8 || reinterpret_cast<uintptr_t>(p.dk) % 8 ||
      reinterpret_cast<uintptr_t>(p.dv) % 8)
    bad("dq, dk and dv must be 8-byte aligned");

  const int64_t T_pad = padded_rows(p.T);
  float* delta = p.workspace;
  float* lse2 = p.workspace + static_cast<int64_t>(p.n_heads) * T_pad;
  const int64_t rows = static_cast<int64_t>(p.n_heads) * T_pad;
  constexpr int kPreWarps = 8;
  attn_bwd_preprocess<<<static_cast<unsigned>((rows + kPreWarps - 1) / kPreWarps), kPreWarps * 32, 0, stream>>>(
      reinterpret_cast<const __nv_bfloat16*>(p.out), reinterpret_cast<const __nv_bfloat16*>(p.dout), p.lse, delta,
      lse2, p.T, static_cast<int>(T_pad), p.n_heads, p.head_dim);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
  if (p.head_dim == 64)
    launch_main<64>(p, stream, delta, lse2, static_cast<int>(T_pad));
  else
    launch_main<128>(p, stream, delta, lse2, static_cast<int>(T_pad));
}

}  // namespace elastic::cuda
