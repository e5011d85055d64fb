#pragma once
// One decode step's attention over paged K/V (kv_pages.h) for a batch of sequences, as data: which pages each
// (sequence, KV head) attends and how the work is cut into units (plan/run, as in FlashInfer). The plan is built on
// the host from the sequences' HeadPages; the CUDA kernel (cuda_paged_decode.h) and the CPU reference below read the
// same plan. Every head attends its `kept` positions (the query's own key and value are already stored); each of the
// KV head's query heads gets softmax(q k^T / sqrt(hd)) v over them.
#include <cstdint>
#include <vector>

#include "elastic/kv_pages.h"

namespace elastic {

// Keys of one unit: a multiple of this (the kernel's key tile), so a tile never straddles two pages.
constexpr int kPagedTile = 16;

struct PagedDecodeHead {  // one (sequence, KV head), sequence-major: index = seq * n_kv_heads + kv_head
  int32_t page_offset;    // its first entry in PagedDecodePlan::page_table
  int32_t kept;           // positions attended: pages [0, ceil(kept / page_size)) of its list
  int32_t unit_begin, unit_end;  // its units in PagedDecodePlan::units (merged into its query heads' outputs)
};

// One warp's work: keys [key_begin, key_end) of one head's kept list. Keys past the head's `kept` are not read, so a
// unit list cut for a larger capacity serves every step whose heads keep fewer positions (a unit left with no keys
// contributes nothing to the merge).
struct PagedDecodeUnit {
  int32_t head;           // index into PagedDecodePlan::heads
  int32_t key_begin, key_end;
};

struct PagedDecodePlan {
  int n_seqs = 0, n_kv_heads = 0, page_size = 0, keys_per_unit = 0;
  std::vector<int32_t> page_table;     // concatenated page lists
  std::vector<PagedDecodeHead> heads;  // [n_seqs * n_kv_heads]
  std::vector<PagedDecodeUnit> units;
};

#if defined(__CUDACC__)
#define ELASTIC_HOST_DEVICE __host__ __device__
#else
#define ELASTIC_HOST_DEVICE
#endif

// Keys per unit for a step that attends `total_keys` keys in all: enough units for `target_units` warps (the
// device's resident warps), at least 64 keys (a unit's partial costs about as much to merge as 64 keys to read) and
// at most 4096; a multiple of 64. The host plan and the device planner (cuda_paged_decode.h) both use it, so a
// plan made on either side cuts the same units.
ELASTIC_HOST_DEVICE inline int paged_keys_per_unit(int64_t total_keys, int target_units) {
  const int64_t t = target_units > 1 ? target_units : 1;
  const int64_t want = ((total_keys + t - 1) / t + 63) / 64 * 64;
  return static_cast<int>(want < 64 ? 64 : want > 4096 ? 4096 : want);
}

// Most units n_heads heads keeping at most max_total_keys positions in all can be cut into by paged_keys_per_unit,
// at any total up to that (a bound for the whole of a sequence's growth, not only at its largest): with the cut
// kpu >= total / target_units unless clamped, units = sum ceil(kept_h / kpu) <= total / kpu + n_heads, which is at
// most target_units + n_heads, or total / 4096 + n_heads where the 4096 clamp binds, and never more than one unit
// per 64 keys plus one per head.
ELASTIC_HOST_DEVICE inline int paged_max_units(int64_t max_total_keys, int n_heads, int target_units) {
  const int64_t t = target_units > 1 ? target_units : 1, by_clamp = (max_total_keys + 4095) / 4096;
  const int64_t by_min = (max_total_keys + 63) / 64, cut = t > by_clamp ? t : by_clamp;
  return static_cast<int>((cut < by_min ? cut : by_min) + n_heads);
}

// heads: [n_seqs * n_kv_heads] (sequence-major) page lists of one layer, each with kept >= 1. keys_per_unit: a
// positive multiple of kPagedTile. Throws std::invalid_argument otherwise.
PagedDecodePlan plan_paged_decode(const std::vector<const HeadPages*>& heads, int n_kv_heads, int page_size,
                                  int keys_per_unit);

// fp32 reference: q, out [n_seqs, n_heads, head_dim]; k_pool, v_pool [n_pages, page_size, head_dim].
void paged_decode_reference(const PagedDecodePlan& plan, const float* q, const float* k_pool, const float* v_pool,
                            int n_heads, int head_dim, float* out);

}  // namespace elastic
