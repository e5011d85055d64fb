#pragma once
// The prefill attention kernels' device code and launchers (the "Simple" mma.sync kernel and the wgmma/TMA kernel
// template with its variant switches), shared by the engine's dispatch (attention_fwd.cu: Auto, Simple, WgmmaOverlap)
// and the dev area's measurement variants (dev/cuda/attention_variants.cu). Internal linkage: each including file
// instantiates what it launches. The kernels themselves are described in attention_fwd.cu.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cmath>
#include <stdexcept>
#include <string>

#include "cuda/mma_sync.cuh"
#include "cuda/tile_walk.h"
#include "cuda/wgmma_tma.cuh"
#include "elastic/streaming_rule.h"
#include "elastic/cuda.h"
#include "elastic/cuda_attention.h"
#include "elastic/sparse_pattern.h"

namespace elastic::cuda {
namespace {


constexpr int kBM = 64;   // query rows per CTA
constexpr int kBN = 64;   // keys per tile
constexpr int kWarps = 4;

// Both kernels' epilogues. A thread holds columns n * 8 + t4 * 2 + {0, 1} of accumulator row rr (o[n][rr * 2 + e]):
// they go to one output row scaled by inv = 1 / l; the log-sum-exp is natural-log, -inf for a row with no keys.
template <int HD>
__device__ __forceinline__ void store_row(__nv_bfloat16* orow, const float (&o)[HD / 8][4], int rr, float inv, int t4) {
#pragma unroll
  for (int n = 0; n < HD / 8; ++n)
    *reinterpret_cast<uint32_t*>(orow + n * 8 + t4 * 2) = pack_bf16(o[n][rr * 2] * inv, o[n][rr * 2 + 1] * inv);
}
__device__ __forceinline__ float row_lse(float m_log2, float l) {
  return l > 0.f ? (m_log2 + log2f(l)) * 0.69314718055994531f : -INFINITY;
}

// Copies rows [row0, row0 + 64) of one head (row stride `ld` elements) into a swizzled tile; rows >= n_rows -> 0.
template <int HD>
__device__ __forceinline__ void load_tile(uint32_t tile, const __nv_bfloat16* base, int row0, int n_rows, size_t ld,
                                          int tid) {
  constexpr int kChunks = HD / 8;
#pragma unroll
  for (int i = 0; i < kBN * kChunks / (kWarps * 32); ++i) {
    const int idx = tid + i * kWarps * 32;
    const int r = idx / kChunks, c = idx % kChunks;
    const int row = row0 + r;
    const bool ok = row < n_rows;
    const __nv_bfloat16* src = base + static_cast<size_t>(ok ? row : 0) * ld + c * 8;
    cp_async16(tile + swz<HD>(r, c), src, ok ? 16 : 0);
  }
}

template <int HD>
__global__ void __launch_bounds__(kWarps * 32, 2)
    attn_fwd_simple(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                    const __nv_bfloat16* __restrict__ v, __nv_bfloat16* __restrict__ out, float* __restrict__ lse,
                    int T, int pos0, int Hq, int Hkv, int block, const KVHeadMeta* __restrict__ meta,
                    XAttnBlockLists xattn, int n_qtiles, float scale_log2) {
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sQ = smem_addr(smem);
  const uint32_t sK = sQ + kBM * HD * 2;
  const uint32_t sV = sK + kBN * HD * 2;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  // Longest (latest) query tiles first for causal load balance.
  const int qt_local = n_qtiles - 1 - static_cast<int>(blockIdx.x);
  const int h = blockIdx.y;
  const int group = Hq / Hkv, kvh = h / group;
  const int qt = pos0 / kBM + qt_local;  // absolute query tile
  const int n_keys = pos0 + T;

  // Which key tiles this CTA visits.
  const KVHeadMeta m = meta[kvh];
  const walk::TileList tl = walk::tile_list(m.mode, m.sink_blocks, m.local_blocks, xattn.blocks, xattn.offsets,
                                            xattn.counts, h, qt, n_keys, block);

  // Q tile: rows of absolute positions [qt*64, qt*64 + 64) that lie in [pos0, pos0 + T); others zero.
  const size_t ldq = static_cast<size_t>(Hq) * HD, ldkv = static_cast<size_t>(Hkv) * HD;
  {
    constexpr int kChunks = HD / 8;
#pragma unroll
    for (int i = 0; i < kBM * kChunks / (kWarps * 32); ++i) {
      const int idx = tid + i * kWarps * 32;
      const int r = idx / kChunks, c = idx % kChunks;
      const int t = qt * kBM + r - pos0;
      const bool ok = t >= 0 && t < T;
      const __nv_bfloat16* src = q + static_cast<size_t>(ok ? t : 0) * ldq + static_cast<size_t>(h) * HD + c * 8;
      cp_async16(sQ + swz<HD>(r, c), src, ok ? 16 : 0);
    }
  }
  const __nv_bfloat16* kbase = k + static_cast<size_t>(kvh) * HD;
  const __nv_bfloat16* vbase = v + static_cast<size_t>(kvh) * HD;
  if (tl.n > 0) load_tile<HD>(sK, kbase, tl.at(0) * kBN, n_keys, ldkv, tid);
  cp_async_commit();

  float o[HD / 8][4];
#pragma unroll
  for (int i = 0; i < HD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float row_m[2] = {-INFINITY, -INFINITY}, row_l[2] = {0.f, 0.f};
  uint32_t qf[HD / 16][4];
  const int g = lane / 4, t4 = lane % 4;
  const int row_pos0 = qt * kBM + warp * 16 + g;  // absolute position of this thread's first row (second: +8)

  for (int it = 0; it < tl.n; ++it) {
    const int kt = tl.at(it);
    cp_async_wait<0>();
    __syncthreads();  // K_it landed; every warp is done with V_{it-1}
    load_tile<HD>(sV, vbase, kt * kBN, n_keys, ldkv, tid);
    cp_async_commit();
    if (it == 0) {
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) {
        const int r = warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8, c = kk * 2 + lane / 16;
        ldsm_x4(sQ + swz<HD>(r, c), qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3]);
      }
    }
    // S = Q K^T for 16 rows x 64 keys per warp.
    float s[kBN / 8][4];
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
#pragma unroll
      for (int j = 0; j < kBN / 8; j += 2) {
        const int r = j * 8 + (lane % 8) + (lane / 16) * 8, c = kk * 2 + (lane / 8) % 2;
        uint32_t b0, b1, b2, b3;
        ldsm_x4(sK + swz<HD>(r, c), b0, b1, b2, b3);
        mma_bf16(s[j], qf[kk], b0, b1);
        mma_bf16(s[j + 1], qf[kk], b2, b3);
      }
    }
    // Token causality inside the tile (only tiles reaching past the first row of this query tile need it).
    if (kt * kBN + kBN - 1 > qt * kBM) {
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = kt * kBN + j * 8 + t4 * 2 + (e & 1);
          const int p = row_pos0 + (e >> 1) * 8;
          if (key > p) s[j][e] = -INFINITY;
        }
    }
    // Online softmax: rows g (e = 0, 1) and g + 8 (e = 2, 3); a row's 64 scores live in the 4 threads of a quad.
    float corr[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) mx = fmaxf(mx, fmaxf(s[j][rr * 2], s[j][rr * 2 + 1]));
      mx = quad_max(mx);
      const float m_new = fmaxf(row_m[rr], mx * scale_log2);
      const float base = m_new == -INFINITY ? 0.f : m_new;  // fully masked so far: keep exp finite
      corr[rr] = exp2_ftz(row_m[rr] - base);
      row_m[rr] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) {
        s[j][rr * 2] = exp2_ftz(s[j][rr * 2] * scale_log2 - base);
        s[j][rr * 2 + 1] = exp2_ftz(s[j][rr * 2 + 1] * scale_log2 - base);
        sum += s[j][rr * 2] + s[j][rr * 2 + 1];
      }
      row_l[rr] = row_l[rr] * corr[rr] + sum;  // quad-partial sums, reduced at the end
    }
#pragma unroll
    for (int i = 0; i < HD / 8; ++i) {
      o[i][0] *= corr[0];
      o[i][1] *= corr[0];
      o[i][2] *= corr[1];
      o[i][3] *= corr[1];
    }
    cp_async_wait<0>();
    __syncthreads();  // V_it landed; every warp is done with K_it
    if (it + 1 < tl.n) load_tile<HD>(sK, kbase, tl.at(it + 1) * kBN, n_keys, ldkv, tid);
    cp_async_commit();
    // O += P V: P's accumulators become A fragments 16 keys at a time.
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      uint32_t a[4];
      a[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
      a[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
      a[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int n = 0; n < HD / 8; n += 2) {
        const int r = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8, c = n + lane / 16;
        uint32_t b0, b1, b2, b3;
        ldsm_x4_t(sV + swz<HD>(r, c), b0, b1, b2, b3);
        mma_bf16(o[n], a, b0, b1);
        mma_bf16(o[n + 1], a, b2, b3);
      }
    }
  }
  cp_async_wait<0>();

  // Normalize and store; lse in natural log.
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const float l = quad_sum(row_l[rr]);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int t = row_pos0 + rr * 8 - pos0;
    if (t < 0 || t >= T) continue;
    store_row<HD>(out + static_cast<size_t>(t) * ldq + static_cast<size_t>(h) * HD, o, rr, inv, t4);
    if (lse != nullptr && t4 == 0) lse[static_cast<size_t>(h) * T + t] = row_lse(row_m[rr], l);
  }
}

template <int HD>
void launch_simple(const HybridAttnParams& p, cudaStream_t stream) {
  const int smem = (kBM + 2 * kBN) * HD * 2;
  static bool configured = false;  // raise the dynamic shared-memory limit once per instantiation
  if (!configured) {
    ELASTIC_CUDA_CHECK(cudaFuncSetAttribute(attn_fwd_simple<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    configured = true;
  }
  const int qt0 = p.pos0 / kBM, qt1 = (p.pos0 + p.T - 1) / kBM;
  const int n_qtiles = qt1 - qt0 + 1;
  const float scale_log2 = 1.f / std::sqrt(static_cast<float>(HD)) * 1.4426950408889634f;
  dim3 grid(n_qtiles, p.n_heads);
  attn_fwd_simple<HD><<<grid, kWarps * 32, smem, stream>>>(
      reinterpret_cast<const __nv_bfloat16*>(p.q), reinterpret_cast<const __nv_bfloat16*>(p.k),
      reinterpret_cast<const __nv_bfloat16*>(p.v), reinterpret_cast<__nv_bfloat16*>(p.out), p.lse, p.T, p.pos0,
      p.n_heads, p.n_kv_heads, p.block, p.meta, p.xattn, n_qtiles, scale_log2);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

// ---------------------------------------------------------------------------------------------------------------
// Kernel "Wgmma" (Hopper, sm_90a): warp-specialized, TMA + mbarrier pipeline, wgmma.
//   CTA = 3 warpgroups: WG0 is the producer (one thread issues the bulk tensor copies; setmaxnreg 40), WG1 and WG2
//   are consumers (setmaxnreg 232), each computing 64 query rows of one query head; the two heads (2p, 2p+1) share
//   a KV head (group even), so every K/V tile in shared memory feeds 128 query rows. Key tiles hold kWN = 128 keys
//   (two 64-key tiles of the sparse lists); shared tiles are column boxes of 64 bf16 in the 128-byte swizzle that
//   TMA writes and wgmma reads (hd 128 = two boxes). kStages K/V stages; K and V have separate "full" barriers so
//   S = Q K^T starts before V lands; each consumer warp arrives on the stage's "empty" barrier.
//   S = Q K^T: wgmma m64n128k16, A (Q) and B (K) from shared memory. O += P V: wgmma m64n{hd}k16 with P from
//   registers (the S accumulators, rounded to bf16) and V transposed from shared memory. The consumers take turns
//   issuing their products (pingpong, named barriers), so one's softmax overlaps the other's matrix work.
//   Sparse routing: each consumer walks the union of both heads' tile lists (identical for Full / Streaming; for
//   XAttn the per-head lists differ) and computes only the tiles of its own head; a 64-key half that is not in a
//   head's list is masked like a causal mask.
// D[64 x 64] += A[64 x 16] (registers) * B[16 x 64] (shared, MN-major: transposed).
__device__ __forceinline__ void wgmma_m64n64k16_rs_tb(float* d, const uint32_t* a, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
// D[64 x 128] += A[64 x 16] (registers) * B[16 x 128] (shared, MN-major: transposed).
__device__ __forceinline__ void wgmma_m64n128k16_rs_tb(float* d, const uint32_t* a, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}


constexpr int kStages = 3;
// Per-launch options of the wgmma kernel (defaults per AttnKernel in launch_wgmma; ELASTIC_ATTN_OPTS overrides).
constexpr int kOptAdjacentPairs = 1;  // walk::PairIter pairs adjacent tiles at any parity (else even pairs)
constexpr int kOptBulkStore = 2;      // non-persistent epilogue: O through shared memory and bulk tensor stores
// Persistent kernel: CTA b takes items b and b + grid (a grid of half the items, so several CTAs wait their turn per
// SM) instead of items from the device counter: the item-to-item handover (next Q and K/V loading during the last
// step and epilogue) without the dynamic scheduler, to tell which of the two costs the persistent kernel its speed.
constexpr int kOptStaticItems = 4;
// XAttention heads (with lists) walk the pair's union on the pipelined path that full and streaming heads take (both
// heads every step, each masking the halves it does not keep; pingpong and overlap apply), instead of the serial path
// where each head skips the steps it has no tile in.
constexpr int kOptXAttnPipelined = 8;
// Row pairs: a CTA's two consumer warpgroups take one query head's two adjacent 64-row query tiles (qt, qt + 1)
// instead of two query heads' same tile, and walk the union of the two tiles' lists (both on the pipelined path, each
// masking what its own list lacks). At block 128 both tiles lie in one query block, so an XAttention head's two
// tiles share one selection and its walk computes 1.04 tiles per kept one on SmolLM2's real selections (the first
// tile's masked copy of the second's diagonal), where a head pair's union computes 1.24 (1.45-1.46 either way at
// block 64: bench --density). Any GQA group.
constexpr int kOptRowPairs = 16;
constexpr int kOptsAll = 31;  // every option bit above
// Row pairs set explicitly (opts >= 0): the wgmma kernel then takes any GQA group.
inline bool row_pairs_asked(int opts) { return opts >= 0 && (opts & kOptRowPairs); }
constexpr int kWN = 128;  // keys per wgmma-kernel tile: two 64-key tiles of the sparse lists ("halves")



// S[64 x 64] = Q K^T for one warpgroup (issued, not waited).
template <int HD>
__device__ __forceinline__ void issue_s(float (&sacc)[kWN / 8][4], uint32_t q_tile, uint32_t k_tile) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    // 64-column box (Q: 64 rows, K: kWN rows of 128 B), then 16 columns (32 B) inside it
    const uint32_t qo = (kk / 4) * (kBM * 128) + (kk % 4) * 32, ko = (kk / 4) * (kWN * 128) + (kk % 4) * 32;
    wgmma_m64n128k16_ss(&sacc[0][0], make_desc(q_tile + qo, 16, 1024), make_desc(k_tile + ko, 16, 1024), kk > 0);
  }
  wgmma_commit();
}

// O[64 x HD] += P V (issued, not waited); V's tile is read transposed.
template <int HD>
__device__ __forceinline__ void issue_pv(float (&o)[HD / 8][4], const uint32_t (&pa)[kWN / 16][4], uint32_t v_tile) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kWN / 16; ++kk) {
    // 16 keys = 2 groups of 8 rows of 128 B; the next 64 columns of V start kWN rows further (LBO)
    const uint64_t dv = make_desc(v_tile + kk * 2048, kWN * 128, 1024);
    if constexpr (HD == 128)
      wgmma_m64n128k16_rs_tb(&o[0][0], pa[kk], dv);
    else
      wgmma_m64n64k16_rs_tb(&o[0][0], pa[kk], dv);
  }
  wgmma_commit();
}

// Causal mask (where the tile reaches past the query tile's first row), then the online-softmax update of the two
// rows this thread holds: scores become exp2(s * scale_log2 - m), corr the factor for the previous output.
// valid: bit 0 / bit 1 = the first / second 64 keys of the tile belong to this head's list (else masked out).
__device__ __forceinline__ void softmax_step(float (&s)[kWN / 8][4], int first, int valid, int qt, int row_pos0, int t4,
                                             float* row_m, float* row_l, float* corr, float scale_log2) {
  if (first * kBN + kWN - 1 > qt * kBM) {
#pragma unroll
    for (int j = 0; j < kWN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = first * kBN + j * 8 + t4 * 2 + (e & 1);
        if (key > row_pos0 + (e >> 1) * 8) s[j][e] = -INFINITY;
      }
  }
  if (valid != 3) {
#pragma unroll
    for (int j = 0; j < kWN / 8; ++j)
      if (!((valid >> (j / 8)) & 1)) s[j][0] = s[j][1] = s[j][2] = s[j][3] = -INFINITY;
  }
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kWN / 8; ++j) mx = fmaxf(mx, fmaxf(s[j][rr * 2], s[j][rr * 2 + 1]));
    mx = quad_max(mx);
    const float m_new = fmaxf(row_m[rr], mx * scale_log2);
    const float bse = m_new == -INFINITY ? 0.f : m_new;
    corr[rr] = exp2_ftz(row_m[rr] - bse);
    row_m[rr] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kWN / 8; ++j) {
      s[j][rr * 2] = exp2_ftz(s[j][rr * 2] * scale_log2 - bse);
      s[j][rr * 2 + 1] = exp2_ftz(s[j][rr * 2 + 1] * scale_log2 - bse);
      sum += s[j][rr * 2] + s[j][rr * 2 + 1];
    }
    row_l[rr] = row_l[rr] * corr[rr] + sum;
  }
}

__device__ __forceinline__ void to_bf16_frags(const float (&s)[kWN / 8][4], uint32_t (&pa)[kWN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kWN / 16; ++kk) {
    pa[kk][0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
    pa[kk][1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
    pa[kk][2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[kk][3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

template <int HD>
__device__ __forceinline__ void rescale(float (&o)[HD / 8][4], const float* corr) {
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) {
    o[n][0] *= corr[0];
    o[n][1] *= corr[0];
    o[n][2] *= corr[1];
    o[n][3] *= corr[1];
  }
}

// kPersistent: one CTA per SM walks work items (query tile, head pair), so the K/V stage ring and the Q buffer carry
// over from one item to the next and an item's prologue and epilogue overlap its neighbours' products. Items come in
// the order the non-persistent grid runs its CTAs (head pair major, latest query tile first within a pair), so the
// running items share one or two KV heads' K/V in L2 and the shortest items come last. The first item is blockIdx.x;
// the producer takes each next one from a global counter (atomicAdd: the items' lengths differ too much for a static
// round robin) and hands it to the consumers through a shared slot published by the Q barrier (-1: no more). The
// last CTA to finish resets the counter for the next launch. With kOptStaticItems the grid is half the items and CTA
// b takes items b and b + grid (at most two), without the counter. The consumers release Q once their item's last
// S = Q K^T has completed, so the next item's Q loads during its last step and epilogue.
// kOverlap: intra-warpgroup overlap of the softmax of S_{i+1} with P_i V_i (see the consumer loop).
template <int HD, bool kPingpong, bool kPersistent, bool kOverlap>
__global__ void __launch_bounds__(384, 1)
    attn_fwd_wgmma(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                   const __grid_constant__ CUtensorMap tmV, const __grid_constant__ CUtensorMap tmO,
                   __nv_bfloat16* __restrict__ out, float* __restrict__ lse,
                   int T, int pos0, int Hq, int Hkv, int block, const KVHeadMeta* __restrict__ meta,
                   XAttnBlockLists xattn, int n_qtiles, float scale_log2, int* __restrict__ sched,
                   int opts) {
  constexpr int kQBytes = kBM * HD * 2;     // one 64-row Q tile
  constexpr int kTileBytes = kWN * HD * 2;  // one K or V tile of kWN rows
  constexpr int kHalves = HD / 64;          // 64-column boxes per row
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bars[2 + 3 * kStages];  // q_full, full_k[s], full_v[s], empty[s], q_empty
  __shared__ int item_slot[2];                             // persistent: item k's index in slot k % 2
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;  // swizzle atoms need 1024-byte alignment
  const uint32_t sQ = base;                                      // [2][64 x HD]: column boxes of 64 rows x 128 B
  const uint32_t sK = sQ + 2 * kQBytes;                          // [kStages][kWN x HD]: boxes of kWN rows x 128 B
  const uint32_t sV = sK + kStages * kTileBytes;
  const uint32_t bar_q = smem_addr(&bars[0]);
  auto bar_fk = [&](int s) { return smem_addr(&bars[1 + s]); };
  auto bar_fv = [&](int s) { return smem_addr(&bars[1 + kStages + s]); };
  auto bar_em = [&](int s) { return smem_addr(&bars[1 + 2 * kStages + s]); };
  const uint32_t bar_qe = smem_addr(&bars[1 + 3 * kStages]);

  const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32, warp_in_wg = (tid % 128) / 32;
  const int group = Hq / Hkv, n_keys = pos0 + T, n_pairs = Hq / 2;
  const bool row_pairs = (opts & kOptRowPairs) != 0;
  // An item is (qt, h0): head pairs, heads h0 and h0 + 1 at query tile qt; row pairs, head h0 at tiles qt and qt + 1.
  // n_units: an item's query-tile units per head (pair); the last row pair of an odd count has no second tile.
  const int n_units = row_pairs ? (n_qtiles + 1) / 2 : n_qtiles, last_qt = (pos0 + T - 1) / kBM;
  const int n_items = kPersistent ? n_units * (row_pairs ? Hq : n_pairs) : 1;
  auto item_at = [&](int j, int& qt, int& h0) {  // head (pair) major, latest tiles first
    const int ju = kPersistent ? j % n_units : static_cast<int>(blockIdx.x);
    const int jh = kPersistent ? j / n_units : static_cast<int>(blockIdx.y);
    const int u = n_units - 1 - ju;
    qt = pos0 / kBM + (row_pairs ? 2 * u : u);
    h0 = row_pairs ? jh : jh * 2;
  };
  // Consumer w's query head and query tile in item (qt, h0).
  auto head_of = [&](int h0, int w) { return row_pairs ? h0 : h0 + w; };
  auto qtile_of = [&](int qt, int w) { return row_pairs ? qt + w : qt; };
  // An item's 128-key tiles: the union of both consumers' lists (producer and consumers walk the same sequence).
  auto tiles_of = [&](const KVHeadMeta& m, int qt, int h0) {
    auto list = [&](int h, int q) {
      return walk::tile_list(m.mode, m.sink_blocks, m.local_blocks, xattn.blocks, xattn.offsets, xattn.counts, h, q,
                             n_keys, block);
    };
    if (row_pairs) {  // the two tiles' lists differ in every mode (causal extent, window, selection): a real union
      const walk::TileList none{kv_mode::kFull, 0, 0, 0, 1, nullptr};
      walk::PairIter it{walk::UnionIter{list(h0, qt), qt + 1 <= last_qt ? list(h0, qt + 1) : none},
                        (opts & kOptAdjacentPairs) != 0};
      it.may_share = false;
      return it;
    }
    return walk::PairIter{walk::UnionIter{list(h0, qt), list(h0 + 1, qt)}, (opts & kOptAdjacentPairs) != 0};
  };

  if (tid == 0) {
    mbar_init(bar_q, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bar_fk(s), 1);
      mbar_init(bar_fv(s), 1);
      mbar_init(bar_em(s), 8);  // one arrival per consumer warp
    }
    mbar_init(bar_qe, 8);  // one arrival per consumer warp once its item no longer reads Q
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {  // producer: one thread issues every copy
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (tid == 0) {
      int i = 0;  // K/V tiles issued so far (the stage ring runs on across items)
      int j = kPersistent ? static_cast<int>(blockIdx.x) : 0;
      for (int k = 0;; ++k) {
        const int j_next = !kPersistent                ? n_items
                           : (opts & kOptStaticItems) ? j + static_cast<int>(gridDim.x)
                                                      : static_cast<int>(gridDim.x) + atomicAdd(&sched[0], 1);
        int qt, h0;
        item_at(j, qt, h0);
        const int kvh = h0 / group;
        const KVHeadMeta m = meta[kvh];
        walk::PairIter it = tiles_of(m, qt, h0);
        if (k > 0) mbar_wait(bar_qe, (k - 1) & 1);  // the previous item's Q is no longer read
        if (kPersistent) item_slot[k & 1] = j;       // published by the q_full arrival below
        mbar_expect_tx(bar_q, 2 * kQBytes);
        for (int w = 0; w < 2; ++w)
          for (int hf = 0; hf < kHalves; ++hf)
            tma_load_3d(sQ + w * kQBytes + hf * (kBM * 128), &tmQ, hf * 64, head_of(h0, w),
                        qtile_of(qt, w) * kBM - pos0, bar_q);
        int tile, m4;
        for (; it.next(tile, m4); ++i) {
          const int s = i % kStages;
          if (i >= kStages) mbar_wait(bar_em(s), ((i / kStages) - 1) & 1);
          mbar_expect_tx(bar_fk(s), kTileBytes);
          for (int hf = 0; hf < kHalves; ++hf)
            for (int rh = 0; rh < kWN / 64; ++rh)
              tma_load_3d(sK + s * kTileBytes + hf * (kWN * 128) + rh * 8192, &tmK, hf * 64, kvh, tile * kBN + rh * 64,
                          bar_fk(s));
          mbar_expect_tx(bar_fv(s), kTileBytes);
          for (int hf = 0; hf < kHalves; ++hf)
            for (int rh = 0; rh < kWN / 64; ++rh)
              tma_load_3d(sV + s * kTileBytes + hf * (kWN * 128) + rh * 8192, &tmV, hf * 64, kvh, tile * kBN + rh * 64,
                          bar_fv(s));
        }
        j = j_next;
        if (j >= n_items) {
          if (kPersistent) {  // tell the consumers there is no next item, then retire this CTA's scheduling
            mbar_wait(bar_qe, k & 1);
            item_slot[(k + 1) & 1] = -1;
            mbar_arrive(bar_q);
            __threadfence();
            if (!(opts & kOptStaticItems) &&
                atomicAdd(&sched[1], 1) == static_cast<int>(gridDim.x) - 1) {  // every CTA has taken its last item
              sched[0] = 0;
              sched[1] = 0;
              __threadfence();
            }
          }
          break;
        }
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    // Consumer warpgroup: head h, rows warp_in_wg * 16 + g (+ 8) of the query tile.
    const int w = wg - 1, g = lane / 4, t4 = lane % 4;
    int i0 = 0;  // K/V tiles consumed before this item (the stage ring's position)
    for (int k = 0;; ++k) {
      mbar_wait(bar_q, k & 1);
      const int j = kPersistent ? item_slot[k & 1] : 0;
      if (j < 0) break;
      int qt, h0;
      item_at(j, qt, h0);
      const KVHeadMeta m = meta[h0 / group];
      walk::PairIter it = tiles_of(m, qt, h0);
      const int h = head_of(h0, w), qtw = qtile_of(qt, w);  // this consumer's head and query tile
      const int row_pos0 = qtw * kBM + warp_in_wg * 16 + g;
      int n_steps = 0;  // K/V tiles of this item
      const uint32_t myQ = sQ + w * kQBytes;
      float o[HD / 8][4];
#pragma unroll
      for (int i = 0; i < HD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
      float row_m[2] = {-INFINITY, -INFINITY}, row_l[2] = {0.f, 0.f};
      float sacc[kWN / 8][4];
#pragma unroll
      for (int j = 0; j < kWN / 8; ++j) sacc[j][0] = sacc[j][1] = sacc[j][2] = sacc[j][3] = 0.f;
      uint32_t pa[kWN / 16][4];
      float corr[2];
      bool q_released = false;

      if (m.mode == kv_mode::kXAttn && xattn.blocks != nullptr && !(opts & (kOptXAttnPipelined | kOptRowPairs))) {
        // XAttn: the two heads' lists differ; walk their union, compute own tiles only (no overlap of steps).
        int tile, m4;
        for (int ii = 0; it.next(tile, m4); ++ii, ++n_steps) {
          const int i = i0 + ii, s = i % kStages;
          const uint32_t parity = (i / kStages) & 1;
          const int valid = walk::head_valid(m4, w);
          mbar_wait(bar_fk(s), parity);
          if (valid) {
            issue_s<HD>(sacc, myQ, sK + s * kTileBytes);
            wgmma_wait<0>();
            fence_regs<kWN / 2>(&sacc[0][0]);
            softmax_step(sacc, tile, valid, qtw, row_pos0, t4, row_m, row_l, corr, scale_log2);
            rescale<HD>(o, corr);
            to_bf16_frags(sacc, pa);
          }
          mbar_wait(bar_fv(s), parity);
          if (valid) {
            issue_pv<HD>(o, pa, sV + s * kTileBytes);
            wgmma_wait<0>();
            fence_regs<HD / 2>(&o[0][0]);
          }
          __syncwarp();
          if (lane == 0) mbar_arrive(bar_em(s));
        }
      } else {
        // Both heads visit the same tiles. Per step: O += P_i V_i and S_{i+1} = Q K_{i+1}^T go to the tensor cores
        // back to back (one wait for both), then the softmax of S_{i+1}. (Overlapping that softmax with P_i V_i
        // needs a wait_group 1, which ptxas answers by serializing every wgmma: C7514.)
        // Pingpong: the two consumer warpgroups take turns issuing their matrix work (named barriers 1 and 2), so one's
        // softmax runs while the other's products occupy the tensor cores. Warpgroup 0 goes first; warpgroup 1 skips
        // its arrival after its last turn so every barrier phase completes.
        auto my_turn = [&] {
          if (kPingpong) asm volatile("bar.sync %0, 256;\n" ::"r"(1 + w) : "memory");
        };
        auto pass_turn = [&] {
          if (kPingpong) asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - w) : "memory");
        };
        int tile, m4;
        if (it.next(tile, m4)) {
          if (w == 1) pass_turn();
          my_turn();
          mbar_wait(bar_fk(i0 % kStages), (i0 / kStages) & 1);
          issue_s<HD>(sacc, myQ, sK + (i0 % kStages) * kTileBytes);
          pass_turn();
          wgmma_wait<0>();
          fence_regs<kWN / 2>(&sacc[0][0]);
          softmax_step(sacc, tile, walk::head_valid(m4, w), qtw, row_pos0, t4, row_m, row_l, corr, scale_log2);
          to_bf16_frags(sacc, pa);
          if constexpr (kOverlap) {
            // S_{i+1} = Q K_{i+1}^T first, then O += P_i V_i; wait for S only (wait_group 1) and run its softmax
            // while P_i V_i is still on the tensor cores; O and P_i are touched only after wait_group 0. The last
            // step (P V alone) is peeled off so every wgmma and wait in the loop is unconditional: ptxas serializes
            // the wgmmas (C7514) when it cannot pair them up along every path.
            int i = i0, ntile, nm4;
            for (; it.next(ntile, nm4); ++i) {
              const int s = i % kStages, sn = (i + 1) % kStages;
              my_turn();
              mbar_wait(bar_fk(sn), ((i + 1) / kStages) & 1);
              issue_s<HD>(sacc, myQ, sK + sn * kTileBytes);
              mbar_wait(bar_fv(s), (i / kStages) & 1);
              issue_pv<HD>(o, pa, sV + s * kTileBytes);
              pass_turn();
              wgmma_wait<1>();
              fence_regs<kWN / 2>(&sacc[0][0]);
              softmax_step(sacc, ntile, walk::head_valid(nm4, w), qtw, row_pos0, t4, row_m, row_l, corr, scale_log2);
              wgmma_wait<0>();
              fence_regs<HD / 2>(&o[0][0]);
              __syncwarp();
              if (lane == 0) mbar_arrive(bar_em(s));  // K_i and V_i consumed
              rescale<HD>(o, corr);
              to_bf16_frags(sacc, pa);
            }
            const int s = i % kStages;
            // every S = Q K^T of the item has completed: the producer may load the next item's Q
            __syncwarp();
            if (lane == 0) mbar_arrive(bar_qe);
            q_released = true;
            my_turn();
            mbar_wait(bar_fv(s), (i / kStages) & 1);
            issue_pv<HD>(o, pa, sV + s * kTileBytes);
            if (w == 0) pass_turn();
            wgmma_wait<0>();
            fence_regs<HD / 2>(&o[0][0]);
            __syncwarp();
            if (lane == 0) mbar_arrive(bar_em(s));
            n_steps = i - i0 + 1;
          } else
          for (int i = i0;; ++i) {
            ++n_steps;
            const int s = i % kStages, sn = (i + 1) % kStages;
            int ntile, nm4;
            const bool has_next = it.next(ntile, nm4);
            my_turn();
            mbar_wait(bar_fv(s), (i / kStages) & 1);
            issue_pv<HD>(o, pa, sV + s * kTileBytes);
            if (has_next) {
              mbar_wait(bar_fk(sn), ((i + 1) / kStages) & 1);
              issue_s<HD>(sacc, myQ, sK + sn * kTileBytes);
            }
            if (has_next || w == 0) pass_turn();
            wgmma_wait<0>();
            fence_regs<HD / 2>(&o[0][0]);
            fence_regs<kWN / 2>(&sacc[0][0]);
            __syncwarp();
            if (lane == 0) mbar_arrive(bar_em(s));  // K_i and V_i consumed
            if (!has_next) break;
            softmax_step(sacc, ntile, walk::head_valid(nm4, w), qtw, row_pos0, t4, row_m, row_l, corr, scale_log2);
            rescale<HD>(o, corr);
            to_bf16_frags(sacc, pa);
          }
        }
      }

      // Every product that read Q has completed (each step waited for its wgmma): the producer may load the next Q.
      if (!q_released) {
        __syncwarp();
        if (lane == 0) mbar_arrive(bar_qe);
      }
      i0 += n_steps;

      const size_t ldq = static_cast<size_t>(Hq) * HD;
      // Non-persistent: this warpgroup's Q tile is no longer read, so O goes there in Q's swizzled layout
      // (conflict-free 4-byte writes) and leaves with one bulk tensor store per 64 columns (rows past T clipped),
      // instead of 64 scattered 4-byte global stores per thread. Not for the first tile of an unaligned chunk: a
      // bulk store at a negative row faults ("illegal instruction" on the H200), so that tile stores directly.
      // (Nor for a row pair's missing second tile, past the chunk: its rows are not stored at all.)
      const bool bulk_out = !kPersistent && (opts & kOptBulkStore) && qtw * kBM - pos0 >= 0 && qtw <= last_qt;
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const float l = quad_sum(row_l[rr]);
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const int t = row_pos0 + rr * 8 - pos0;
        if (bulk_out) {
          const int r = warp_in_wg * 16 + g + rr * 8;
#pragma unroll
          for (int n = 0; n < HD / 8; ++n) {
            const uint32_t a = myQ + (n / 8) * (kBM * 128) + r * 128 + (((n % 8) ^ (r % 8)) * 16) + t4 * 4;
            const uint32_t v = pack_bf16(o[n][rr * 2] * inv, o[n][rr * 2 + 1] * inv);
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a), "r"(v) : "memory");
          }
        } else if (t >= 0 && t < T) {
          store_row<HD>(out + static_cast<size_t>(t) * ldq + static_cast<size_t>(h) * HD, o, rr, inv, t4);
        }
        if (lse != nullptr && t4 == 0 && t >= 0 && t < T) lse[static_cast<size_t>(h) * T + t] = row_lse(row_m[rr], l);
      }
      if (bulk_out) {
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the writes above, visible to the copy
        asm volatile("bar.sync %0, 128;\n" ::"r"(3 + w) : "memory");    // this warpgroup's rows all written
        if ((tid % 128) == 0) {
          for (int hf = 0; hf < kHalves; ++hf)
            asm volatile(
                "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                    reinterpret_cast<uint64_t>(&tmO)),
                "r"(myQ + hf * (kBM * 128)), "r"(hf * 64), "r"(h), "r"(qtw * kBM - pos0)
                : "memory");
          asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
          // Until the writes are done, not just the reads of shared memory: a kernel that reads `out` next on
          // the stream saw stale rows with `.read` alone (the model's chunked prefill, on the H200).
          asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
        }
      }
      if (!kPersistent) break;
    }  // items
  }
}

// Host: a [rows, heads, hd] bf16 tensor as a 3-D tensor map with [64 rows x 1 head x 64 columns] boxes.
CUtensorMap make_map(const void* ptr, int hd, int heads, int rows) {
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(hd), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(hd) * 2, static_cast<cuuint64_t>(heads) * hd * 2};
  const cuuint32_t box[3] = {64, 1, 64};
  return encode_bf16_tensor_map(ptr, 3, dims, strides, box, "hybrid_attention_fwd");
}

// The persistent kernel's work counter and retired-CTA count, one pair per device, zero between launches (the last
// CTA of each launch resets them). Launches of the persistent kernel on one device must therefore not overlap in
// time (two streams running it at once would share the counter); static-item launches (kOptStaticItems) leave them
// untouched.
int* persistent_counters(cudaStream_t stream) {
  static int* counters[64] = {};
  int dev = 0;
  ELASTIC_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) throw std::runtime_error("hybrid_attention_fwd: device index out of range");
  if (!counters[dev]) {  // zeroed on the launch's stream, so the clear is ordered before the first launch
    ELASTIC_CUDA_CHECK(cudaMalloc(&counters[dev], 2 * sizeof(int)));
    ELASTIC_CUDA_CHECK(cudaMemsetAsync(counters[dev], 0, 2 * sizeof(int), stream));
  }
  return counters[dev];
}

// The wgmma kernel's default options: v4 (Wgmma, NoPingpong) keeps even pairs and direct stores, the path the
// whole-model GPU tests pass with; the overlap and persistent variants take adjacent pairs (and the overlap one bulk
// stores). HybridAttnParams::opts (from AttnKernelConfig, e.g. ELASTIC_ATTN_OPTS) replaces them.
int default_wgmma_opts(bool newer) { return newer ? kOptAdjacentPairs | kOptBulkStore : 0; }

template <int HD, bool kPingpong, bool kPersistent, bool kOverlap = false>
void launch_wgmma(const HybridAttnParams& p, cudaStream_t stream) {
  const int smem = 2 * kBM * HD * 2 + 2 * kStages * kWN * HD * 2 + 1024;  // Q tiles, K/V stages, alignment
  static bool configured = false;
  if (!configured) {
    ELASTIC_CUDA_CHECK(cudaFuncSetAttribute(attn_fwd_wgmma<HD, kPingpong, kPersistent, kOverlap>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    configured = true;
  }
  const CUtensorMap mq = make_map(p.q, HD, p.n_heads, p.T);
  const CUtensorMap mk = make_map(p.k, HD, p.n_kv_heads, p.pos0 + p.T);
  const CUtensorMap mv = make_map(p.v, HD, p.n_kv_heads, p.pos0 + p.T);
  const CUtensorMap mo = make_map(p.out, HD, p.n_heads, p.T);  // same shape as q: the epilogue's bulk stores
  const int qt0 = p.pos0 / kBM, qt1 = (p.pos0 + p.T - 1) / kBM, n_qtiles = qt1 - qt0 + 1;
  const float scale_log2 = 1.f / std::sqrt(static_cast<float>(HD)) * 1.4426950408889634f;
  const int opts = p.opts >= 0 ? p.opts : default_wgmma_opts(kOverlap || kPersistent);
  const bool row_pairs = (opts & kOptRowPairs) != 0;
  const int n_units = row_pairs ? (n_qtiles + 1) / 2 : n_qtiles, n_heads_units = row_pairs ? p.n_heads : p.n_heads / 2;
  dim3 grid(n_units, n_heads_units);
  // Persistent: one CTA per SM (the kernel's shared memory allows one), never more than the work items; with
  // kOptStaticItems ceil(items / 2) CTAs, each taking at most two.
  if (kPersistent) {
    const int n_sm = sm_count();
    const int n_items = n_units * n_heads_units;
    grid = dim3((opts & kOptStaticItems) ? (n_items + 1) / 2 : std::min(n_items, n_sm), 1);
  }
  attn_fwd_wgmma<HD, kPingpong, kPersistent, kOverlap><<<grid, 384, smem, stream>>>(
      mq, mk, mv, mo, reinterpret_cast<__nv_bfloat16*>(p.out), p.lse, p.T, p.pos0, p.n_heads, p.n_kv_heads, p.block,
      p.meta, p.xattn, n_qtiles, scale_log2, kPersistent ? persistent_counters(stream) : nullptr, opts);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace
}  // namespace elastic::cuda
