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

struct HeadCache {             // one KV head's own cache, [slots, hd] bf16 each
  DeviceBuffer k, v;
  int sink_slots = 0, ring_slots = 0;  // ring 0: one slot per position
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

  // The current sequence.
  RoutingTable routing;
  int length = 0;
  std::vector<HeadCache> caches;            // [L * Hkv]
  DeviceBuffer k_ptrs, v_ptrs, sink_slots, ring_slots;  // [L * Hkv] device tables of the caches
  DeviceBuffer dec_heads;                   // [L * Hkv] DecodeKVHead
  std::vector<int> dec_max_kept;            // [L] DecodeParams::max_kept of each layer (decode_max_kept)

  // Decode work: one token.
  DeviceBuffer d_x, d_xn, d_qkv, d_q, d_k, d_v, d_attn, d_gu, d_act, d_ws;
  DeviceBuffer d_io;        // int32 [4]: input id, next id, pos, n_pos
  std::array<int32_t, 4> h_io{};
  cudaGraphExec_t graph = nullptr;
  int eager_steps = 0;
  // Positions the decode attention grid covers (its max_pos): the power of two at or above the sequence's length
  // (at least 256, at most max_ctx). A grid over max_ctx would launch a 128K plan's empty CTAs at every step of an
  // 8K sequence and size the split for 128K; the captured graph is replaced when the sequence outgrows it.
  int decode_grid_pos = 0;

  // Probing step (last_row_attention): per layer, the step's attention weights go to probe_probs ([Hq, n_pos]
  // fp32) and from there to (*probe_out)[l]. Set only around one eager decode step; never captured.
  std::vector<std::vector<float>>* probe_out = nullptr;
  DeviceBuffer probe_probs;

  ~Impl();
  void init_common();                       // plan, work buffers, stream, gemm (after weights are set)
  const uint16_t* head_weight() const { return (lm_head.ptr ? lm_head : embed).as<const uint16_t>(); }
  void drop_graph();
  void allocate_layer_caches(int l, const HeadMode* modes, const SparseSettings& s);
  void decode_body();                       // the captured part of a decode step
};

}  // namespace elastic::cuda
