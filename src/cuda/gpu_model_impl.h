#pragma once
// GpuModel's state, shared by its two source files: gpu_weights.cpp (weights, plan, allocation) and
// gpu_model.cpp (prefill, decode, CUDA graph).
#include <cuda_runtime.h>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "cuda/device_buffer.h"
#include "elastic/cuda_attention.h"
#include "elastic/cuda_gemm.h"
#include "elastic/cuda_paged_decode.h"
#include "elastic/kv_pages.h"
#include "elastic/gpu_model.h"

namespace elastic::cuda {

std::string gib(size_t bytes);  // "1.25 GiB", for the printed allocation plans

struct GpuLayer {              // bf16, HF [out, in] layouts
  DeviceBuffer attn_norm;      // [D]
  DeviceBuffer w_qkv, b_qkv;   // [(Hq + 2 Hkv) hd, D], bias [(Hq + 2 Hkv) hd] or empty
  DeviceBuffer q_norm, k_norm; // [hd] (Qwen3) or empty
  DeviceBuffer wo;             // [D, Hq hd]
  DeviceBuffer mlp_norm;       // [D]
  DeviceBuffer w_gu;           // [2F, D]: gate rows then up rows
  DeviceBuffer w_down;         // [D, F]
};

struct GpuModel::Impl {
  ModelConfig c;
  GpuOptions o;
  GpuPlan plan;
  cudaStream_t stream = nullptr;
  std::unique_ptr<Gemm> gemm;

  // Weights.
  std::vector<GpuLayer> layers;
  DeviceBuffer embed, lm_head, final_norm;  // lm_head empty when tied
  DeviceBuffer inv_freq;                     // [hd/2] fp32

  // Prefill work (one plan, allocated once).
  int chunk = 0;           // rows of the chunk buffers
  DeviceBuffer ids;        // [max_ctx] int32
  DeviceBuffer hidden;     // [max_ctx, D] residual stream of the whole prompt
  DeviceBuffer kscr, vscr; // [max_ctx, Hkv, hd] current layer's keys (RoPE applied) and values
  DeviceBuffer xn, qkv, q, attn, gu, act;  // chunk rows: [D], [(Hq+2Hkv) hd], [Hq hd], [Hq hd], [2F], [F]
  DeviceBuffer pool;       // [Hkv, hd] fp32 boundary-pool sum
  DeviceBuffer meta;       // [L, Hkv] KVHeadMeta
  DeviceBuffer xa_blocks, xa_offsets, xa_counts;  // XAttention lists, allocated on first use
  int xa_block = 0;        // block size the lists were sized for
  static constexpr int kLogitRows = 256;
  DeviceBuffer logits;     // [kLogitRows, V] fp32

  // Paged KV memory (kv_pages.h): one pool of kPageSize-position pages (one KV head of one layer each) for K and one
  // for V, sized for every head full at max_ctx; the current sequence holds, per layer, a SequencePages under that
  // layer's routing (a router decides layer by layer), so a head holds exactly the pages its routing keeps.
  static constexpr int kPageSize = 64;  // divides both sparse block sizes (64, 128)
  size_t page_bytes() const { return size_t(kPageSize) * c.head_dim * 2; }  // one page of one pool (K or V), bf16
  std::unique_ptr<PagePool> pages;
  DeviceBuffer k_pool, v_pool;           // [n_pages, kPageSize, hd] bf16
  int pages_per_head = 0;                // ceil(max_ctx / kPageSize)
  DeviceBuffer page_table;               // int32 [L * Hkv * pages_per_head] capacity: the heads' lists, concatenated
  DeviceBuffer page_map;                 // int32 [Hkv * pages_per_head]: prefill's position page -> pool page
  std::vector<int32_t> h_table, h_offsets;  // host copy of the uploaded lists and each head's offset in them
  bool tables_dirty = true;              // a page list changed since the last upload

  // The current sequence.
  RoutingTable routing;
  int length = 0;
  std::vector<std::unique_ptr<SequencePages>> seq;  // [L], each under a one-layer routing

  // Decode work: one token. The host writes one step block each step (one upload): d_io = {input id, next id, pos,
  // n_pos}, then dec_heads (PagedDecodeHead [L * Hkv]: page_offset, kept; the device planner sets the unit ranges),
  // then dec_rows (int64 [L * Hkv]: the pool row of the new position per head).
  DeviceBuffer d_x, d_xn, d_qkv, d_q, d_k, d_v, d_attn, d_gu, d_act, d_ws;
  DeviceBuffer d_step;
  int32_t* d_io = nullptr;
  PagedDecodeHead* dec_heads = nullptr;
  int64_t* dec_rows = nullptr;
  std::vector<uint8_t> h_step;
  DeviceBuffer dec_units, dec_n_units;   // PagedDecodeUnit [L * max_units], int32 [L]
  int max_units = 0, target_units = 0;   // paged_max_units at max_ctx all full; paged_target_units()
  int32_t h_next = 0;                    // the step's greedy token, read back
  cudaGraphExec_t graph = nullptr;
  int eager_steps = 0;

  // Probing step (last_row_attention): per layer, the step's attention weights go to probe_probs ([Hq, n_pos]
  // fp32) and from there to (*probe_out)[l]. Set only around one eager decode step; never captured.
  std::vector<std::vector<float>>* probe_out = nullptr;
  DeviceBuffer probe_probs;

  // decode_parts: events recorded after each part of one uncaptured step (part index, event), in order.
  using Part = GpuDecodeParts::Part;
  std::vector<std::pair<Part, cudaEvent_t>>* part_marks = nullptr;
  std::vector<cudaEvent_t> part_events;     // made before the timed step, used in order by mark()
  void mark(Part p);                        // records an event for part p when part_marks is set

  ~Impl();
  void init_common();                       // plan, work buffers, stream, gemm (after weights are set)
  const uint16_t* head_weight() const { return (lm_head.ptr ? lm_head : embed).as<const uint16_t>(); }
  void drop_graph();
  void store_layer_pages(int l, const HeadMode* modes, const SparseSettings& s, int T);  // prefill: K/V into pages
  void upload_tables();                     // the sequence's page lists into page_table
  void prepare_step(int32_t id);            // host side of a decode step: pages, then the step block upload
  void decode_body();                       // the captured part of a decode step
};

}  // namespace elastic::cuda
