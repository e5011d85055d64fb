// Decode attention: one new query token against each KV head's own cache (split-K, "flash decoding").
//
// Grid (Hkv, splits): a CTA takes up to `chunk` (64, 128 or 256; DecodeParams::split) of the positions its KV head
// attends to and does all `group` query heads of that KV head at once, so each cached key/value row is read once per
// split. Full and XAttn heads attend
// to [0, n_pos); streaming heads to the sink blocks and the local window (streaming_keeps at block granularity),
// read through the head's slot mapping (sink slots, then a ring). Partials (max, sum, unnormalized output) go to a
// workspace and a second kernel merges them.
//
// CUDA graphs: with DecodeParams::n_pos_dev the kernels read n_pos from device memory at run time, and the grid is
// sized for max_pos (or for DecodeParams::max_kept, when smaller). Splits past the live positions write empty partials (max -inf, sum 0), which the merge skips
// (it also stops at the last live split), so a replay with a smaller n_pos never merges stale partials of an
// earlier, larger one. Live splits run the same
// code on the same inputs as the host-n_pos path, so both paths give bit-identical outputs.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "cuda/env_choice.h"
#include "cuda/mma_sync.cuh"
#include "elastic/cuda.h"
#include "elastic/cuda_attention.h"
#include "contiguous_decode.h"

namespace elastic::cuda {
namespace {

constexpr int kMaxChunk = 256;  // positions per split at most (shared arrays); DecodeParams::split picks 64..256
constexpr int kMinChunk = 64;   // the workspace is sized for this, so every split choice fits
constexpr int kThreads = 128;
constexpr int kMaxGroup = 16;

struct Kept {  // positions [0, n1) then [s2, n_pos)
  int n1, s2, n;
  __device__ int at(int i) const { return i < n1 ? i : s2 + (i - n1); }
};

__device__ __forceinline__ Kept kept_positions(const DecodeKVHead& hk, int n_pos, int B) {
  if (hk.mode != kv_mode::kStreaming) return Kept{n_pos, n_pos, n_pos};
  const int qb = (n_pos - 1) / B;
  const int n1 = min(hk.sink_blocks * B, n_pos);
  const int s2 = max(hk.sink_blocks, qb - hk.local_blocks + 1) * B;
  return Kept{n1, s2, n1 + max(0, n_pos - s2)};
}

__device__ __forceinline__ int cache_slot(const DecodeKVHead& hk, int j) {
  return hk.ring_slots == 0 || j < hk.sink_slots ? j : hk.sink_slots + (j - hk.sink_slots) % hk.ring_slots;
}

// GM: the largest group this instance handles (4, 8 or 16), so accumulators and shared arrays are sized for the
// model's group, not for 16. The caller must pick GM >= G (launch() does): the shared arrays have GM rows.
// kStaged: the CTA first copies its kept K and V rows into shared memory with 16-byte cp.async (all of them in
// flight at once: chunk x HD x 2 bytes each, 64 KB at split 256 and hd 128, where the direct loads keep 8 rows per warp
// in flight), then computes from
// shared memory; the scores start once K has landed, while V is still arriving.
template <int HD, int GM, bool kStaged>
__global__ void __launch_bounds__(kThreads)
    decode_partial(const __nv_bfloat16* __restrict__ q, const DecodeKVHead* __restrict__ heads, int n_pos_arg,
                   const int32_t* __restrict__ n_pos_dev, int max_pos, int Hq, int Hkv, int B, float scale,
                   int chunk, float* __restrict__ ws) {
  const int kvh = blockIdx.x, split = blockIdx.y, G = Hq / Hkv;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  // Host path: n_pos_dev null, max_pos == n_pos_arg. A device n_pos outside [1, max_pos] (a caller bug) leaves
  // every partial empty, so the merge writes 0/0 = NaN instead of reading past the grid or the caches.
  const int n_pos = n_pos_dev ? *n_pos_dev : n_pos_arg;
  const bool valid = n_pos >= 1 && n_pos <= max_pos;
  const DecodeKVHead hk = heads[kvh];
  const Kept kp = kept_positions(hk, valid ? n_pos : 1, B);
  const int i0 = split * chunk, n = valid ? max(0, min(chunk, kp.n - i0)) : 0;
  // A grid cut short by DecodeParams::max_kept that misses some of this head's positions (a caller's bound too
  // small): the last split (then a full one, n == chunk) poisons its partial's sum, so the merge writes NaN for this
  // KV head's query heads rather than a silently wrong output.
  const bool short_grid = valid && split == static_cast<int>(gridDim.y) - 1 && kp.n > static_cast<int>(gridDim.y) * chunk;
  if (n == 0) {  // nothing to attend in this split (uniform per CTA): only the empty-partial marker is read
    if (tid < G) {
      float* w = ws + (static_cast<size_t>(split) * Hq + kvh * G + tid) * (HD + 2);
      w[HD] = -INFINITY;
      w[HD + 1] = 0.f;
    }
    return;
  }
  constexpr int kPer = HD / 32, kWarps = kThreads / 32;
  __shared__ float sq[GM][HD];      // the group's queries; later the cross-warp sums of the output
  __shared__ float sp[GM][kMaxChunk];  // scores, then unnormalized probabilities
  __shared__ float sm[GM], sl[GM];
  // Cache slot of each kept position, once per CTA: a streaming head's ring mapping costs an integer modulo, and
  // inside the loops it kept the loads from being issued ahead (a routed sequence decoded slower than a full one).
  __shared__ int sslot[kMaxChunk];
  for (int idx = tid; idx < G * HD; idx += kThreads)
    sq[idx / HD][idx % HD] = __bfloat162float(q[static_cast<size_t>(kvh * G + idx / HD) * HD + idx % HD]);
  for (int i = tid; i < n; i += kThreads) sslot[i] = cache_slot(hk, kp.at(i0 + i));
  __syncthreads();
  extern __shared__ __align__(16) unsigned char staged[];  // kStaged: K rows [chunk][HD], then V rows, bf16
  const __nv_bfloat16* sk = reinterpret_cast<const __nv_bfloat16*>(staged);
  const __nv_bfloat16* sv = sk + chunk * HD;
  if constexpr (kStaged) {
    constexpr int kRowChunks = HD / 8;  // 16-byte pieces per row
    const uint32_t sbase = smem_addr(staged);
    for (int part = 0; part < 2; ++part) {  // K, then V: two commit groups
      const __nv_bfloat16* src = reinterpret_cast<const __nv_bfloat16*>(part == 0 ? hk.k : hk.v);
      for (int idx = tid; idx < n * kRowChunks; idx += kThreads) {
        const int r = idx / kRowChunks, c = idx % kRowChunks;
        cp_async16(sbase + (part * chunk * HD + r * HD + c * 8) * 2, src + static_cast<size_t>(sslot[r]) * HD + c * 8,
                   16);
      }
      cp_async_commit();
    }
    cp_async_wait<1>();  // K has landed (this thread's copies); the barrier makes every thread's visible
    __syncthreads();
  }

  // A lane's kPer consecutive elements of a bf16 row, as floats (8- or 4-byte load).
  auto load_row = [&](const __nv_bfloat16* r, float* out) {
    if constexpr (kPer == 4) {
      const uint2 raw = *reinterpret_cast<const uint2*>(r);
      const float2 a0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
      const float2 a1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
      out[0] = a0.x, out[1] = a0.y, out[2] = a1.x, out[3] = a1.y;
    } else {
      const float2 a0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(r));
      out[0] = a0.x, out[1] = a0.y;
    }
  };
  // Scores: warp w takes positions w, w + kWarps, ... kU at a time, all kU key rows loaded before the dot products.
  constexpr int kU = 8;
  const __nv_bfloat16* kbase = (kStaged ? sk : reinterpret_cast<const __nv_bfloat16*>(hk.k)) + lane * kPer;
  for (int i = warp; i < n; i += kWarps * kU) {
    float kv[kU][kPer];
#pragma unroll
    for (int u = 0; u < kU; ++u) {  // past n: a valid row whose score is dropped
      const int r = min(i + u * kWarps, n - 1);
      load_row(kbase + static_cast<size_t>(kStaged ? r : sslot[r]) * HD, kv[u]);
    }
#pragma unroll
    for (int g = 0; g < GM; ++g) {
      if (g >= G) break;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        float a = 0.f;
#pragma unroll
        for (int e = 0; e < kPer; ++e) a += sq[g][lane * kPer + e] * kv[u][e];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
        if (lane == 0 && i + u * kWarps < n) sp[g][i + u * kWarps] = a * scale;
      }
    }
  }
  __syncthreads();
  for (int g = warp; g < G; g += kWarps) {
    float mx = -INFINITY;
    for (int i = lane; i < n; i += 32) mx = fmaxf(mx, sp[g][i]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.f;
    for (int i = lane; i < n; i += 32) {
      const float e = __expf(sp[g][i] - mx);
      sp[g][i] = e;
      sum += e;
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) sm[g] = mx, sl[g] = sum;
  }
  __syncthreads();
  // O partial: the same position split as the scores; a lane accumulates its kPer dimensions of every group head,
  // kU value rows in flight per warp. The warps' sums meet in sq (the queries are no longer needed), in warp order.
  if constexpr (kStaged) {
    cp_async_wait<0>();  // V has landed
    __syncthreads();
  }
  const __nv_bfloat16* vbase = (kStaged ? sv : reinterpret_cast<const __nv_bfloat16*>(hk.v)) + lane * kPer;
  float acc[GM][kPer];
#pragma unroll
  for (int g = 0; g < GM; ++g)
#pragma unroll
    for (int e = 0; e < kPer; ++e) acc[g][e] = 0.f;
  for (int i = warp; i < n; i += kWarps * kU) {
    float vv[kU][kPer];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int r = min(i + u * kWarps, n - 1);
      load_row(vbase + static_cast<size_t>(kStaged ? r : sslot[r]) * HD, vv[u]);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int ii = i + u * kWarps;
      if (ii < n)
#pragma unroll
        for (int g = 0; g < GM; ++g) {
          const float pr = g < G ? sp[g][ii] : 0.f;
#pragma unroll
          for (int e = 0; e < kPer; ++e) acc[g][e] += pr * vv[u][e];
        }
    }
  }
  for (int w = 0; w < kWarps; ++w) {  // fixed order: the same sums on every run (graph replays are bit-identical)
    if (warp == w)
#pragma unroll
      for (int g = 0; g < GM; ++g)
        if (g < G)
#pragma unroll
          for (int e = 0; e < kPer; ++e) {
            float& dst = sq[g][lane * kPer + e];
            dst = (w == 0 ? 0.f : dst) + acc[g][e];
          }
    __syncthreads();
  }
  for (int idx = tid; idx < G * HD; idx += kThreads)
    ws[(static_cast<size_t>(split) * Hq + kvh * G + idx / HD) * (HD + 2) + idx % HD] = sq[idx / HD][idx % HD];
  if (tid < G) {  // n > 0 here
    float* w = ws + (static_cast<size_t>(split) * Hq + kvh * G + tid) * (HD + 2);
    w[HD] = sm[tid];
    w[HD + 1] = short_grid ? NAN : sl[tid];
  }
}

// Live splits for a device n_pos: merge only those (the rest are empty anyway); this keeps the merge as cheap as on
// the host path when max_pos is far above n_pos. n_pos <= 0 merges nothing (NaN output, as documented).
__device__ __forceinline__ int live_splits(int n_splits, const int32_t* n_pos_dev, int chunk) {
  return n_pos_dev ? min(n_splits, max(0, (*n_pos_dev + chunk - 1) / chunk)) : n_splits;
}

// Parallel merge, one CTA of kCombineThreads per query head. The split maxima: strided over all threads, then a
// block reduction. The weighted sums: thread (part, d) takes splits part, part + kParts, ... (4 loads in flight per
// thread instead of one dependent load per split), and the kParts partial sums meet in shared memory in part order.
constexpr int kCombineThreads = 256;
template <int HD>
__global__ void __launch_bounds__(kCombineThreads)
    decode_combine_parallel(const float* __restrict__ ws, int n_splits, int Hq, __nv_bfloat16* __restrict__ out,
                            const int32_t* __restrict__ n_pos_dev, int chunk) {
  constexpr int kParts = kCombineThreads / HD;
  const int h = blockIdx.x, tid = threadIdx.x, d = tid % HD, part = tid / HD, lane = tid % 32, warp = tid / 32;
  n_splits = live_splits(n_splits, n_pos_dev, chunk);
  __shared__ float red[kCombineThreads / 32], so[kParts][HD], sls[kParts];
  __shared__ float smax;
  float M = -INFINITY;
  for (int s = tid; s < n_splits; s += kCombineThreads)
    M = fmaxf(M, ws[(static_cast<size_t>(s) * Hq + h) * (HD + 2) + HD]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
  if (lane == 0) red[warp] = M;
  __syncthreads();
  if (tid == 0) {
    float m = -INFINITY;
    for (int w = 0; w < kCombineThreads / 32; ++w) m = fmaxf(m, red[w]);
    smax = m;
  }
  __syncthreads();
  M = smax;
  float o = 0.f, l = 0.f;
#pragma unroll 4
  for (int s = part; s < n_splits; s += kParts) {
    const float* w = ws + (static_cast<size_t>(s) * Hq + h) * (HD + 2);
    const float m = w[HD];
    if (m == -INFINITY) continue;  // empty split: its output rows were never written
    const float c = __expf(m - M);
    o += w[d] * c;
    l += w[HD + 1] * c;
  }
  so[part][d] = o;
  if (d == 0) sls[part] = l;
  __syncthreads();
  if (part == 0) {
    float ot = 0.f, lt = 0.f;
#pragma unroll
    for (int p = 0; p < kParts; ++p) ot += so[p][d], lt += sls[p];
    out[static_cast<size_t>(h) * HD + d] = __float2bfloat16(ot / lt);
  }
}

template <int HD>
__global__ void decode_combine(const float* __restrict__ ws, int n_splits, int Hq, __nv_bfloat16* __restrict__ out,
                               const int32_t* __restrict__ n_pos_dev, int chunk) {
  const int h = blockIdx.x;
  n_splits = live_splits(n_splits, n_pos_dev, chunk);
  float M = -INFINITY;
  for (int s = 0; s < n_splits; ++s) M = fmaxf(M, ws[(static_cast<size_t>(s) * Hq + h) * (HD + 2) + HD]);
  for (int d = threadIdx.x; d < HD; d += blockDim.x) {
    float o = 0.f, l = 0.f;
    for (int s = 0; s < n_splits; ++s) {
      const float* w = ws + (static_cast<size_t>(s) * Hq + h) * (HD + 2);
      if (w[HD] == -INFINITY) continue;  // empty split: past this head's kept positions (or past a device n_pos)
      const float c = __expf(w[HD] - M);
      o += w[d] * c;
      l += w[HD + 1] * c;
    }
    out[static_cast<size_t>(h) * HD + d] = __float2bfloat16(o / l);
  }
}

void bad(const std::string& what) { throw std::invalid_argument("decode_attention: " + what); }

constexpr Choice<DecodeLoads> kLoadsNames[] = {{"direct", DecodeLoads::Direct}, {"staged", DecodeLoads::Staged}};
constexpr Choice<DecodeCombine> kCombineNames[] = {{"serial", DecodeCombine::Serial},
                                                   {"parallel", DecodeCombine::Parallel}};

// Auto: ELASTIC_DECODE_LOADS when set, else Direct (staged measured 3-3.6x slower, cuda_attention.h).
DecodeLoads loads_for(DecodeLoads l) {
  if (l != DecodeLoads::Auto) return l;
  return env_choice("ELASTIC_DECODE_LOADS", kLoadsNames, DecodeLoads::Direct);
}

// Auto: ELASTIC_DECODE_COMBINE when set, else Parallel (measured faster at every length); a graph captures
// whichever merge was in force at capture time.
DecodeCombine combine_for(DecodeCombine c) {
  if (c != DecodeCombine::Auto) return c;
  return env_choice("ELASTIC_DECODE_COMBINE", kCombineNames, DecodeCombine::Parallel);
}

// Auto: ELASTIC_DECODE_SPLIT (64, 128 or 256) when set, else the largest split that still gives at least 4 CTAs
// per SM over `grid_pos` positions (64 when none does). Decode is latency-bound when few CTAs run: on the H200 at the
// Qwen3-4B shape an 8K all-full layer took 50 us at split 256 (256 CTAs) against 37 us at 128 (512), an
// all-streaming layer 47 us at 256 (72 CTAs) against 24 us at 64 (272); at 32K all-full (1,024 CTAs at 256) the
// larger split won, 89 against 106 us (docs/results/gpu_2026-12-03e/run7/decode_kernel.md).
int split_for(int split, int grid_pos, int n_kv_heads) {
  if (split != 0) return split;
  static constexpr Choice<int> kSplits[] = {{"64", 64}, {"128", 128}, {"256", 256}};
  const int env = env_choice("ELASTIC_DECODE_SPLIT", kSplits, 0);
  if (env != 0 || grid_pos <= 0) return env;
  const int sms = sm_count();  // cached per device: an eager decode step launches this per layer
  for (const int c : {256, 128})
    if (int64_t(n_kv_heads) * ((grid_pos + c - 1) / c) >= 4 * int64_t(sms)) return c;
  return 64;
}

int n_splits_for(int n_pos, int chunk) { return (n_pos + chunk - 1) / chunk; }

// The positions the grid covers: every position up to n_pos (max_pos under a graph; the kernels find the live
// splits themselves), or fewer when the caller bounds what any head keeps (streaming heads: sink and window only).
int all_positions(const DecodeParams& p) { return p.n_pos_dev ? p.max_pos : p.n_pos; }
int grid_positions(const DecodeParams& p) {
  return p.max_kept > 0 ? std::min(all_positions(p), p.max_kept) : all_positions(p);
}

template <int HD>
void launch(const DecodeParams& p, cudaStream_t stream) {
  const bool parallel_merge = combine_for(p.combine) == DecodeCombine::Parallel;  // may throw: before any launch
  const bool staged = loads_for(p.loads) == DecodeLoads::Staged;
  const int all_pos = all_positions(p), grid_pos = grid_positions(p);
  const int chunk = split_for(p.split, grid_pos, p.n_kv_heads);
  const int splits = n_splits_for(grid_pos, chunk);
  const float scale = 1.f / std::sqrt(static_cast<float>(HD));
  const int G = p.n_heads / p.n_kv_heads;
  auto kernel = staged ? (G <= 4   ? decode_partial<HD, 4, true>
                          : G <= 8 ? decode_partial<HD, 8, true>
                                   : decode_partial<HD, 16, true>)
                       : (G <= 4   ? decode_partial<HD, 4, false>
                          : G <= 8 ? decode_partial<HD, 8, false>
                                   : decode_partial<HD, 16, false>);
  const int staged_bytes = staged ? 2 * chunk * HD * 2 : 0;  // K and V rows of one split
  // Per launch: the limit is a per-device setting (a second GPU in the process needs it too); not a stream operation,
  // so also fine inside a graph capture. Always the largest split's size, so a smaller split's launch never lowers
  // the limit under a graph or another thread that launches with a larger one.
  if (staged)
    ELASTIC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            2 * kMaxChunk * HD * 2));
  kernel<<<dim3(p.n_kv_heads, splits), kThreads, staged_bytes, stream>>>(
      reinterpret_cast<const __nv_bfloat16*>(p.q), p.heads, p.n_pos, p.n_pos_dev, all_pos, p.n_heads, p.n_kv_heads,
      p.block, scale, chunk, p.workspace);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
  if (parallel_merge)
    decode_combine_parallel<HD><<<p.n_heads, kCombineThreads, 0, stream>>>(
        p.workspace, splits, p.n_heads, reinterpret_cast<__nv_bfloat16*>(p.out), p.n_pos_dev, chunk);
  else
    decode_combine<HD><<<p.n_heads, HD, 0, stream>>>(p.workspace, splits, p.n_heads,
                                                     reinterpret_cast<__nv_bfloat16*>(p.out), p.n_pos_dev, chunk);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void validate_decode_heads(const DecodeKVHead* hh, int n_kv_heads, int block) {
  for (int h = 0; h < n_kv_heads; ++h) {
    const DecodeKVHead& x = hh[h];
    const std::string who = "KV head " + std::to_string(h);
    if (x.mode < 0 || x.mode > 2) bad(who + ": mode must be 0, 1 or 2");
    if (!x.k || !x.v) bad(who + ": null cache pointer");
    if (x.mode == kv_mode::kStreaming && x.ring_slots > 0 &&
        (x.sink_slots < x.sink_blocks * block || x.ring_slots < x.local_blocks * block))
      bad(who + ": streaming cache too small (sink_slots " + std::to_string(x.sink_slots) + " < " +
          std::to_string(x.sink_blocks * block) + " or ring_slots " + std::to_string(x.ring_slots) + " < " +
          std::to_string(x.local_blocks * block) + ")");
    if (x.mode != kv_mode::kStreaming && x.ring_slots != 0) bad(who + ": a ring cache only fits a streaming head");
  }
}

int64_t decode_workspace_floats(int n_heads, int head_dim, int n_pos) {
  return int64_t(n_splits_for(n_pos, kMinChunk)) * n_heads * (head_dim + 2);
}

int decode_max_kept(const DecodeKVHead* hh, int n_kv_heads, int block, int n_pos) {
  int most = 0;
  for (int h = 0; h < n_kv_heads; ++h) {
    // A streaming head keeps at most its sink blocks and `local_blocks` blocks ending at the query's block.
    const int64_t keep =
        hh[h].mode == kv_mode::kStreaming ? (int64_t(hh[h].sink_blocks) + hh[h].local_blocks) * block : int64_t(n_pos);
    most = std::max(most, static_cast<int>(std::min<int64_t>(keep, n_pos)));
  }
  return most;
}

int decode_split(const DecodeParams& p) { return split_for(p.split, grid_positions(p), p.n_kv_heads); }

std::string describe_decode_auto() {
  const int split = split_for(0, 0, 0);
  return std::string("loads ") + choice_name(kLoadsNames, loads_for(DecodeLoads::Auto)) + ", merge " +
         choice_name(kCombineNames, combine_for(DecodeCombine::Auto)) + ", split " +
         (split ? std::to_string(split) : std::string("by grid (256, 128 or 64: >= 4 CTAs per SM)"));
}

void decode_attention(const DecodeParams& p, cudaStream_t stream) {
  if (!p.q || !p.out || !p.heads || !p.workspace) bad("null q, out, heads or workspace");
  if (p.n_pos_dev) {  // n_pos is read on the device; p.n_pos is ignored
    if (p.max_pos <= 0) bad("max_pos must be > 0 when n_pos_dev is set (got " + std::to_string(p.max_pos) + ")");
  } else if (p.n_pos <= 0) {
    bad("n_pos must be > 0 (got " + std::to_string(p.n_pos) + ")");
  }
  if (p.n_heads <= 0 || p.n_kv_heads <= 0 || p.n_heads % p.n_kv_heads)
    bad("n_heads must be a positive multiple of n_kv_heads");
  if (p.n_heads / p.n_kv_heads > kMaxGroup) bad("query heads per KV head must be <= 16");
  if (p.block != 64 && p.block != 128) bad("block must be 64 or 128");
  if (p.combine != DecodeCombine::Auto && p.combine != DecodeCombine::Serial && p.combine != DecodeCombine::Parallel)
    bad("unknown combine value " + std::to_string(static_cast<int>(p.combine)));
  if (p.loads != DecodeLoads::Auto && p.loads != DecodeLoads::Direct && p.loads != DecodeLoads::Staged)
    bad("unknown loads value " + std::to_string(static_cast<int>(p.loads)));
  if (p.max_kept < 0) bad("max_kept must be >= 0 (got " + std::to_string(p.max_kept) + ")");
  if (p.split != 0 && p.split != 64 && p.split != 128 && p.split != 256)
    bad("split must be 0 (auto), 64, 128 or 256 (got " + std::to_string(p.split) + ")");
  if (p.head_dim == 64)
    launch<64>(p, stream);
  else if (p.head_dim == 128)
    launch<128>(p, stream);
  else
    bad("head_dim must be 64 or 128 (got " + std::to_string(p.head_dim) + ")");
}

}  // namespace elastic::cuda
