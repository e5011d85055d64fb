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
// Throws std::invalid_argument naming the field for shapes it does not run: head_dim 64 or 128, group <= 16,
// page_size a multiple of 16.
void paged_decode_attention(const PagedDecodeParams& p, cudaStream_t stream);

}  // namespace elastic::cuda
