#pragma once
// Paged decode attention on the GPU: one launch runs a step's PagedDecodePlan (paged_decode.h) for a batch of
// sequences with different lengths and per-head capacities. Each warp takes one unit (up to keys_per_unit keys of one
// KV head) and does all of that KV head's query heads at once on tensor cores (mma.sync m16n8k16: 16 keys x 8 query
// heads per product), reading K and V straight from the page pool into registers (16-byte loads), so each cached
// row is read once per step; a second kernel merges the units of each query head. bf16 tensors, fp32 softmax.
//
// CUDA graphs: the plan's arrays live in device memory and n_units_dev (when set) is read at run time, so a graph
// captured with max_units warps replays any plan of up to max_units units written into the same buffers.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "elastic/paged_decode.h"

namespace elastic::cuda {

struct PagedDecodeParams {
  const void* q = nullptr;       // bf16 [n_seqs, n_heads, head_dim]
  void* out = nullptr;           // bf16 [n_seqs, n_heads, head_dim]
  const void* k_pool = nullptr;  // bf16 [n_pages, page_size, head_dim]
  const void* v_pool = nullptr;
  const int32_t* page_table = nullptr;      // PagedDecodePlan::page_table, device
  const PagedDecodeHead* heads = nullptr;   // [n_seqs * n_kv_heads], device
  const PagedDecodeUnit* units = nullptr;   // device
  int n_units = 0;                          // when n_units_dev is null
  const int32_t* n_units_dev = nullptr;     // else read on the device; the grid covers max_units
  int max_units = 0;
  float* workspace = nullptr;  // paged_decode_workspace_floats(max units, n_heads / n_kv_heads, head_dim), device
  int n_seqs = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, page_size = 0;
};

int64_t paged_decode_workspace_floats(int max_units, int group, int head_dim);
// What decode runs, for bench's "kernels:" line: the unit cut and the merge.
std::string describe_paged_decode();

// The device planner of a decode step for one sequence, all layers in one launch (what the GPU model's CUDA graph
// runs each step, since kept grows every step): heads [n_layers * n_kv_heads] arrive with page_offset and kept set;
// per layer l it cuts units exactly as plan_paged_decode does, with paged_keys_per_unit(the layer's kept keys,
// target_units), writes each head's unit_begin / unit_end, the units at units + l * max_units (unit.head indexes
// the layer's slice) and their count at n_units[l]. A layer that would need more than max_units gets none (its
// outputs are then NaN). paged_max_units (paged_decode.h) gives a max_units that is never exceeded.
// Sequences one planner launch cuts separately (seq_heads below).
constexpr int kPagedPlanMaxSeqs = 256;
// seq_heads > 0 (a batch of sequences of seq_heads heads each, at most kPagedPlanMaxSeqs): each sequence is cut by its own total,
// as it would be alone, so its units, and so its output bits, do not depend on the rest of the batch; max_units must
// then bound the sum of the sequences' paged_max_units.
void paged_decode_plan_device(PagedDecodeHead* heads, PagedDecodeUnit* units, int32_t* n_units, int n_layers,
                              int n_kv_heads, int max_units, int target_units, cudaStream_t stream,
                              int seq_heads = 0);
// Warps the partial kernel keeps resident on the current device: the target_units of paged_keys_per_unit.
int paged_target_units();

// Writes one position's keys and values ([n_kv_heads, head_dim] bf16 each) at pool rows rows[h] (device int64,
// row = page * page_size + offset, from SequencePages::row).
void paged_append(const void* k_new, const void* v_new, const int64_t* rows, void* k_pool, void* v_pool,
                  int n_kv_heads, int head_dim, cudaStream_t stream);
// Prefill: copies rows t < T of a layer's dense K or V ([T, n_kv_heads, head_dim] bf16) into the pool, position t
// of KV head h to page page_map[h * map_stride + t / page_size] (row offset t % page_size), skipping positions whose
// page is -1 (a streaming head's positions that left its window).
void paged_scatter(const void* src, int T, int n_kv_heads, int head_dim, const int32_t* page_map, int map_stride,
                   int page_size, void* pool, cudaStream_t stream);
// Copies pages src[i] -> dst[i] (device int32 ids, n pairs, no id in both lists) of both pools: a sequence forked
// into another slot.
void paged_copy_pages(const int32_t* src, const int32_t* dst, int n, int page_size, int head_dim, void* k_pool,
                      void* v_pool, cudaStream_t stream);
// Probing: out [n_heads, n_pos] fp32 = softmax over t < n_pos of q_h . k_t / sqrt(head_dim) for one decode step's
// queries q ([n_heads, head_dim] bf16), k_t row t of KV head (h / group)'s page list (heads[kvh].page_offset into
// page_table; heads keeping every position, in position order, as full heads do).
void last_row_probs_paged(const void* q, const void* k_pool, const int32_t* page_table, const PagedDecodeHead* heads,
                          int n_heads, int n_kv_heads, int head_dim, int page_size, int n_pos, float* out,
                          cudaStream_t stream);
// Throws std::invalid_argument naming the field for shapes it does not run: head_dim 64 or 128, group <= 16,
// page_size a multiple of 16.
void paged_decode_attention(const PagedDecodeParams& p, cudaStream_t stream);

}  // namespace elastic::cuda
