#pragma once
// GpuModel's state, shared by its two source files: gpu_weights.cpp (weights, plan, allocation) and
// gpu_model.cpp (prefill, decode, CUDA graph).
#include <cuda_runtime.h>

#include <array>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "cuda/device_buffer.h"
#include "cuda/gpu_weights.h"
#include "elastic/cuda_attention.h"
#include "elastic/cuda_gemm.h"
#include "elastic/cuda_paged_decode.h"
#include "elastic/kv_pages.h"
#include "elastic/gpu_model.h"

namespace elastic::cuda {

struct GpuModel::Impl : GpuWeights {  // c, layers, embed, lm_head, final_norm, inv_freq, head_weight()
  GpuOptions o;
  GpuPlan plan;
  cudaStream_t stream = nullptr;
  std::unique_ptr<Gemm> gemm;


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
  DeviceBuffer xa_scratch; // the estimator's scratch (xattn_estimate_scratch_bytes), allocated on first use
  DeviceBuffer xa_kept;    // [1] uint64: this prefill's kept XAttention blocks (GpuPrefillStats::xattn_kept_blocks)
  static constexpr int kLogitRows = 256;
  DeviceBuffer logits;     // [kLogitRows, V] fp32

  // Paged KV memory (kv_pages.h): one pool of kPageSize-position pages (one KV head of one layer each) for K and one
  // for V, shared by the model's slots: GpuOptions::kv_pool_bytes, or every slot's heads full at max_ctx. Each live
  // sequence holds, per layer, a SequencePages under that layer's routing (a router decides layer by layer), so a
  // head holds exactly the pages its routing keeps.
  static constexpr int kPageSize = 64;  // divides both sparse block sizes (64, 128)
  size_t page_bytes() const { return size_t(kPageSize) * c.head_dim * 2; }  // one page of one pool (K or V), bf16
  std::unique_ptr<PagePool> pages;
  DeviceBuffer k_pool, v_pool;           // [n_pages, kPageSize, hd] bf16
  int pages_per_head = 0;                // ceil(max_ctx / kPageSize): a full head at max_ctx
  DeviceBuffer page_table;               // int32 [n_pages]: every live head's list, concatenated (a page is in one)
  DeviceBuffer page_map;                 // int32 [Hkv * pages_per_head]: prefill's position page -> pool page
  std::vector<int32_t> h_table;          // host copy of the uploaded lists
  bool tables_dirty = true;              // a page list changed since the last upload

  // A sequence in one slot (GpuOptions::slots). seq is empty while the slot is free or its prefill runs.
  struct Slot {
    RoutingTable routing;
    int length = 0;
    std::vector<std::unique_ptr<SequencePages>> seq;  // [L], each under a one-layer routing
    std::vector<int32_t> offsets;  // [L * Hkv]: each head's first entry in page_table (upload_tables)
    bool live() const { return length > 0; }
  };
  std::vector<Slot> slots;

  // A prefill in steps (one chunk of one layer each), so a server can run the other slots' decode steps between
  // them; one at a time (the prompt's residual stream and the layer's K/V scratch are one buffer each).
  struct PrefillRun {
    int slot = -1;  // -1: none running
    int T = 0, l = 0, t0 = 0;  // the next step runs chunk [t0, t0 + chunk) of layer l
    RoutingTable r;
    const PromptRouter* router = nullptr;
    std::vector<int> pool_pos;  // the router's boundary rows (empty without a router)
    XAttnBlockLists lists;      // layer l's XAttention lists (set at its first chunk; null when it has no XA head)
    std::vector<int> xa_kv_heads;  // layer l's KV heads routed to XAttention (what the estimator scores)
    std::vector<std::pair<cudaEvent_t, cudaEvent_t>> events;  // around each chunk's attention
    std::chrono::steady_clock::time_point start;
  } run;
  void prefill_begin(int slot, const int32_t* ids, int T, const RoutingTable* fixed, const PromptRouter* router);
  bool prefill_advance();   // one step; true when every layer is done
  void prefill_end(std::vector<float>* logits, bool all_logits, GpuPrefillStats* stats);
  void abort_prefill();     // drops a running prefill and the pages it took
  size_t bytes_held(const Slot& sl) const;  // K and V bytes of the pages the slot's sequence holds

  // Decode work: one token for each of up to S = slots.size() sequences. The host writes one step block each step
  // (one upload): d_io = {ids [S], next ids [S], positions [S], unused [S]}, then dec_heads (PagedDecodeHead
  // [L * B * Hkv] for a batch of B: page_offset, kept; the device planner sets the unit ranges), then at a fixed
  // offset dec_rows (int64 [L * B * Hkv]: the pool row of each head's new position). Layer l's heads and rows are
  // entries [l * B * Hkv, (l + 1) * B * Hkv), sequence-major, as the kernels read one layer of a batch.
  DeviceBuffer d_x, d_xn, d_qkv, d_q, d_k, d_v, d_attn, d_gu, d_act, d_ws;  // [S] rows each
  DeviceBuffer d_step;
  int32_t* d_io = nullptr;
  PagedDecodeHead* dec_heads = nullptr;
  int64_t* dec_rows = nullptr;
  std::vector<uint8_t> h_step;
  size_t rows_offset = 0;                // byte offset of dec_rows in the step block
  DeviceBuffer dec_units, dec_n_units;   // PagedDecodeUnit [L * max_units(S)], int32 [L]
  int target_units = 0;                  // paged_target_units()
  int max_units(int B) const;            // paged_max_units for B sequences at max_ctx, all full
  std::vector<int32_t> h_next;           // the step's greedy tokens, read back [S]
  // One CUDA graph per batch size (index B), captured after one eager step of that size; the step block's layout
  // depends on B only, so a graph serves any B slots.
  std::vector<cudaGraphExec_t> graphs;
  std::vector<int> eager_steps;

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
  void drop_graphs();
  Slot& slot_at(int slot);                  // throws std::out_of_range for a slot the model does not have
  void store_layer_pages(Slot& s, int l, const HeadMode* modes, const SparseSettings& sp, int T);  // K/V into pages
  void upload_tables();                     // every live sequence's page lists into page_table
  // Host side of a decode step for B = batch.size() sequences: pages, then the step block upload.
  void prepare_step(const std::vector<int>& batch, const std::vector<int32_t>& ids);
  void decode_body(int B);                  // the captured part of a decode step
  int probe_n_pos = 0;                      // positions a probing step attends (set with probe_out)
};

}  // namespace elastic::cuda
