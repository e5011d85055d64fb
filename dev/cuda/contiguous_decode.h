#pragma once
// Dev area (llm.c's dev/cuda): the decode path over contiguous per-head caches that the GPU model used before the
// paged KV pool (src/cuda/paged_decode.cu). Nothing in src/ or tools/ calls it; bench_attention_gpu --decode times it
// beside the paged kernel and its GPU tests keep it correct while it is measured. Its variants are chosen by the
// environment (ELASTIC_DECODE_LOADS, ELASTIC_DECODE_COMBINE, ELASTIC_DECODE_SPLIT), which only this area reads.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "elastic/kv_head_mode.h"

namespace elastic::cuda {

// Decode: one new query token at position n_pos - 1 whose key/value are already stored in the caches. Each KV head
// has its own cache: slot(j) = j for full caches (ring_slots == 0), else sink slots then a ring of ring_slots
// (elastic::HeadKV::slot). Full and XAttn heads attend to all positions; streaming heads to the kept blocks of
// streaming_keeps (the cache must hold them: sink_slots >= sink_blocks*block, ring_slots >= local_blocks*block).
struct DecodeKVHead {
  const uint16_t* k = nullptr;  // [slots, hd] bf16, 16-byte aligned (staged loads copy 16-byte pieces)
  const uint16_t* v = nullptr;  // [slots, hd] bf16, 16-byte aligned
  int32_t sink_slots = 0, ring_slots = 0;
  int32_t mode = kv_mode::kFull, sink_blocks = 0, local_blocks = 1, pad = 0;  // mode: kv_head_mode.h
};
// How the per-split partials are merged. Serial: one thread per output dimension walks every split in turn (two
// dependent passes). Parallel: the split maxima are reduced by the whole CTA, then the splits are shared among
// 256 / hd groups of threads, 4 loads in flight each, summed in a fixed order (so graph replays stay bit-identical).
// Auto: ELASTIC_DECODE_COMBINE (serial or parallel) when set, else Parallel (H200, Qwen3-4B shape: 330 against
// 438 us per layer at 128K all-full, 57 against 80 us all-streaming; docs/PERFORMANCE.md).
enum class DecodeCombine : int { Auto = 0, Serial = 1, Parallel = 2 };
// How a split's K and V rows reach the cores. Direct: each warp loads 8 rows at a time from the caches as it
// computes. Staged: the CTA first copies all its rows into shared memory with cp.async (128 KB in flight per CTA at
// split 256 and hd 128), the scores starting once K has landed. Auto: ELASTIC_DECODE_LOADS (direct or staged) when set, else
// Direct: staged measured 3-3.6x slower on the H200 (1,204 against 330 us at 128K all-full with the parallel
// merge, 446 against 1,628 GB/s, split 256; one CTA per SM
// with its 128 KB of shared memory leaves too few loads in flight), kept only as the measured alternative.
enum class DecodeLoads : int { Auto = 0, Direct = 1, Staged = 2 };
struct DecodeParams {
  const uint16_t* q = nullptr;        // [Hq, hd] bf16
  uint16_t* out = nullptr;            // [Hq, hd] bf16
  const DecodeKVHead* heads = nullptr;  // [Hkv] device array
  int n_pos = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, block = 64;
  float* workspace = nullptr;  // decode_workspace_floats(...) floats, device
  // CUDA-graph replay: when set, the kernels read n_pos from this device int at run time (p.n_pos is ignored), so
  // one captured launch serves every step. A value outside [1, max_pos] yields NaN outputs.
  const int32_t* n_pos_dev = nullptr;
  // With n_pos_dev: the largest n_pos it will hold (> 0). The grid and the workspace are sized for it
  // (decode_workspace_floats(n_heads, head_dim, max_pos)); splits past the live n_pos write empty partials.
  int max_pos = 0;
  DecodeCombine combine = DecodeCombine::Auto;
  DecodeLoads loads = DecodeLoads::Auto;
  // Positions per split (one CTA each): 64, 128 or 256; 0 (Auto) = ELASTIC_DECODE_SPLIT when set, else the largest
  // split that gives at least 4 CTAs per SM (64 when none does). Smaller splits mean more CTAs with fewer dependent
  // loads each, which is what layers with few kept positions (streaming heads, short contexts) need.
  int split = 0;
  // An upper bound on the positions any head of this layer attends (decode_max_kept of the host head table), or 0
  // for none. The grid then covers that many positions instead of n_pos (max_pos): a layer of streaming heads at
  // 128K launches the CTAs of its sink and window, not of 128K. A bound whose grid (whole splits) misses some of a
  // KV head's kept positions makes that KV head's query-head outputs NaN (never a silently truncated sum).
  int max_kept = 0;
};
// The largest number of positions any of these heads attends at up to n_pos positions: n_pos when a head is full
// or XAttention, else (sink_blocks + local_blocks) * block. For DecodeParams::max_kept (host head table).
int decode_max_kept(const DecodeKVHead* host_heads, int n_kv_heads, int block, int n_pos);
// Host check of a head table before it goes to the device: throws naming the head when a streaming head's cache
// cannot hold its sink blocks or its window (or the mode is unknown).
void validate_decode_heads(const DecodeKVHead* host_heads, int n_kv_heads, int block);
// Floats of decode workspace for up to n_pos positions: sized for the smallest split (64 positions), so every split
// choice fits (about 34 MB at 32 query heads, hd 128 and 128K positions).
int64_t decode_workspace_floats(int n_heads, int head_dim, int n_pos);
void decode_attention(const DecodeParams& p, cudaStream_t stream);
// The split (positions per CTA) decode_attention(p) runs, for a p it accepts: p.split, or what Auto picks for p's
// grid on the current device. Throws std::invalid_argument on a bad ELASTIC_DECODE_SPLIT.
int decode_split(const DecodeParams& p);
// What DecodeLoads::Auto / DecodeCombine::Auto / split 0 resolve to under the current environment: "loads direct,
// merge parallel, split by grid (...)" or, with ELASTIC_DECODE_SPLIT, "split 64". Throws std::invalid_argument on a
// bad variable.
std::string describe_decode_auto();

// Copies rows [0, n_pos) of a layer's dense prefill K or V ([n_pos, Hkv, hd]) into each KV head's own cache
// ([slots, hd], slot(j) = j when ring_slots[h] == 0, else j < sink_slots[h] ? j :
// sink_slots[h] + (j - sink_slots[h]) % ring_slots[h]); for ring heads only positions j < sink_slots or
// j >= n_pos - ring_slots are written (the rest would be overwritten anyway). dst: [Hkv] device array of device
// pointers; sink_slots / ring_slots: [Hkv] device arrays.
void scatter_to_head_caches(const uint16_t* src, int n_pos, int n_kv_heads, int head_dim, uint16_t* const* dst,
                            const int32_t* sink_slots, const int32_t* ring_slots, cudaStream_t stream);

// Decode: writes one token's k/v ([Hkv, hd], k_new / v_new) at position pos (device scalar) into each head's cache
// through the same slot mapping.
void append_to_head_caches(const uint16_t* k_new, const uint16_t* v_new, const int32_t* pos_dev, int n_kv_heads,
                           int head_dim, uint16_t* const* k_dst, uint16_t* const* v_dst, const int32_t* sink_slots,
                           const int32_t* ring_slots, cudaStream_t stream);

}  // namespace elastic::cuda
