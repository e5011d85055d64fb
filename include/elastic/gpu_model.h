#pragma once
// The decoder on one GPU: bf16 weights and activations, fp32 accumulation. cuBLASLt runs the projections and the
// MLP (q/k/v fused into one GEMM, gate/up into another); our kernels run the rest; the fused hybrid attention runs
// all heads of a layer in one launch, each KV head in its own mode.
//
// Prefill is layer-major: the whole prompt's residual stream stays on the device and one chunk's activations at a
// time, so a router decides layer l from the prompt's boundary keys before any of layer l's attention runs. After
// a layer, each KV head's keys and values move into pages of one pool (kv_pages.h): every position for full and
// XAttention heads, the sink and window blocks for streaming heads, so the pages a sequence holds fall with sparsity.
// The model holds several sequences (slots) over one page pool; a decode step runs any set of them together (one
// GEMM per projection over the batch, one paged attention launch over every sequence's heads) and replays a CUDA
// graph per batch size: the host writes each sequence's position, each head's kept count and the pool row of its
// new key into device memory, a device planner cuts the paged decode kernel's units, and paged_decode_attention
// reads K/V through the page lists (cuda_paged_decode.h).
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "elastic/cuda_attention.h"
#include "elastic/generate.h"
#include "elastic/model.h"

namespace elastic::cuda {

struct GpuWeights;  // src/cuda/gpu_weights.h
struct GpuExec;

// Sequences a GPU model holds at most (GpuOptions::slots): a decode step's logits rows and the planner's per-sequence
// cuts are sized for this many.
constexpr int kMaxGpuSlots = 256;

struct GpuOptions {
  // Prefill attention kernel (cuda_attention.h), fixed for the model's life; unset: attention_config_from_env() when
  // the model is built. Printed with the plan.
  std::optional<AttnKernelConfig> attention;
  int max_ctx = 8192;   // positions a sequence may hold (prompt + generated tokens)
  int slots = 1;        // sequences held at once (a server's running requests), decoded together; 1..kMaxGpuSlots
  // K/V page pool shared by the slots, in bytes (K and V); 0: every slot's heads full at max_ctx. A smaller pool
  // holds more sequences when routing keeps fewer pages: admission counts pages (kv_bytes_for).
  size_t kv_pool_bytes = 0;
  // Decode rows get the same bits alone and in any batch (a server's contract: a request answers what it would alone):
  // the projections run one cuBLASLt algorithm for every batch size up to `slots` (Gemm::pin_rows) and each
  // sequence's attention units are cut by its own length. Costs speed at small batches (measured in
  // docs/PERFORMANCE.md); off, each batch size gets the heuristic's fastest algorithm and one cut for the batch.
  bool batch_invariant = false;
  // Projections of up to this many rows (decode) through Elastic's small-M kernel instead of cuBLASLt
  // (Gemm::set_small_m_rows, 0..4; 0 = cuBLASLt for all). 2: measured faster than cuBLASLt at 1 and 2 rows and slower
  // at 4 (H100, docs/PERFORMANCE.md). batch_invariant overrides it (one cuBLASLt algorithm for every batch size).
  // Printed with the plan.
  int small_m_rows = 2;
  // Decode steps launch their kernels with programmatic dependent launch (src/cuda/programmatic_launch.cuh): each
  // kernel's grid starts while the one before it finishes, and the projections start streaming their weights then.
  // Same kernels, same arithmetic, same bits; off: plain stream order. On: measured 6% more decode tokens/s at 8K and
  // 2-3% at 127K (H100, docs/PERFORMANCE.md). Printed with the plan.
  bool programmatic_launch = true;
  // XAttention estimator (cuda_attention.h): Gemm (cuBLASLt scores, the default) or Fused (wgmma, the candidate, not
  // yet run on a GPU; head_dim 64 or 128). Prefill and GPU router training use the same one. Printed with the plan.
  XAttnEstimateKernel xattn_estimate = XAttnEstimateKernel::Gemm;
  int chunk = 16384;    // prefill chunk; a multiple of the sparse block size when XAttention heads run
  bool graphs = true;   // decode through a CUDA graph
  int device = 0;
};

// The one device allocation plan, in bytes (printed at start). kv_pool is the page pool (GpuOptions::kv_pool_bytes,
// by default every slot's heads full at max_ctx); a routed prompt holds only the pages its heads keep
// (GpuPrefillStats::kv_bytes).
struct GpuPlan {
  size_t weights = 0, kv_pool = 0, prefill_kv = 0, activations = 0, xattn = 0, workspace = 0;
  int slots = 1;
  std::string kernels;  // what the model runs: "attention overlap (...); decode paged (...)"
  size_t total() const { return weights + kv_pool + prefill_kv + activations + xattn + workspace; }
  std::string describe() const;
};

struct GpuPrefillStats {
  double total_ms = 0;      // host wall time of the prefill, synchronized
  double attention_ms = 0;  // attention kernels (XAttention estimation included), from CUDA events
  size_t kv_bytes = 0;      // the pages this sequence holds (K and V)
  // Key blocks the XAttention heads kept, summed over query heads, query blocks and layers (the estimator's counts);
  // 0 when no head was routed to XAttention. bench turns it into the measured attention-FLOPs share.
  int64_t xattn_kept_blocks = 0;
};

// One decode step's GPU time by part (ms), from CUDA events recorded between the parts of an uncaptured step: what
// `bench --decode` reports beside the graph-replay speed. The parts sum to the eager step's GPU time; a graph replay
// runs the same kernels without the gaps between launches, so total() against the replay's step time shows what
// launches cost.
struct GpuDecodeParts {
  enum Part {
    EmbedPlan,  // embedding row + the paged decode planner
    Norms,      // RMSNorms before attention and MLP, and the final one
    Qkv,        // q/k/v projection (one GEMV)
    QkvPost,    // q/k norms, RoPE, writing the new K/V into its pages
    Attention,  // paged decode attention (partial + merge)
    OProj,      // output projection (+ residual)
    Mlp,        // gate/up GEMV, SwiGLU, down GEMV (+ residual)
    Logits,     // LM head GEMV and argmax
    kCount
  };
  static constexpr const char* kNames[kCount] = {"embed+plan", "norms", "qkv GEMV", "qkv post+append",
                                                 "attention",  "o GEMV", "MLP",     "logits"};
  double ms[kCount] = {};
  double total() const {
    double t = 0;
    for (double x : ms) t += x;
    return t;
  }
};

class GpuModel {
 public:
  // Uploads a loaded CPU model's weights as bf16. Throws std::invalid_argument for shapes the kernels do not run
  // (head_dim other than 64 / 128) and std::runtime_error when the plan does not fit in device memory.
  static std::unique_ptr<GpuModel> upload(const Model& m, const GpuOptions& o);
  // Random bf16 weights of a config, made on the device (speed runs without a checkpoint).
  static std::unique_ptr<GpuModel> random(const ModelConfig& c, const GpuOptions& o, uint64_t seed);
  ~GpuModel();

  const ModelConfig& config() const;
  const GpuPlan& plan() const;

  // Sequences live in slots 0 .. slots() - 1. The single-sequence calls (prefill, decode, length, release, ...)
  // are slot 0's.
  int slots() const;

  // Starts a new sequence in slot 0 with T prompt tokens. routing: a fixed table; when null, `router` decides per
  // layer (when also null: all heads full). logits (optional): fp32 [T, V] when all_logits, else [V] of the last
  // token.
  void prefill(const int32_t* ids, int T, const RoutingTable* routing, const PromptRouter* router,
               std::vector<float>* logits, bool all_logits, GpuPrefillStats* stats = nullptr);
  // The same prefill in steps, for a server: prefill_begin drops the slot's previous sequence and embeds the prompt;
  // each prefill_step runs one chunk of one layer (a router decides a layer at its first chunk) and returns true
  // when the last layer is done; then prefill_end writes the logits and makes the sequence live. One prefill runs at
  // a time: beginning one in another slot while one runs throws std::logic_error (beginning again in the same slot
  // restarts it); release() of its slot drops it. A step that throws drops the prefill and its pages.
  void prefill_begin(int slot, const int32_t* ids, int T, const RoutingTable* routing, const PromptRouter* router);
  bool prefill_step();
  void prefill_end(std::vector<float>* logits, bool all_logits, GpuPrefillStats* stats = nullptr);
  int prefilling_slot() const;  // the slot whose prefill runs, or -1

  // Appends one token at position length(); writes its logits ([V]) when asked; returns the greedy next token.
  int32_t decode(int32_t id, std::vector<float>* logits = nullptr);
  // One decode step for several live sequences at once: ids[b] appended to slots[b] (distinct). logits (optional):
  // fp32 [B, V], row b for slots[b]; next (optional): each row's greedy token. Projections run as one GEMM over the
  // batch, attention as one paged launch over every sequence's heads. Throws before any sequence changes when one
  // cannot take the step (not live, full, id outside the vocabulary).
  void decode_batch(const std::vector<int>& slots, const std::vector<int32_t>& ids, std::vector<float>* logits,
                    std::vector<int32_t>* next = nullptr);
  // Probing (`elastic probe --device cuda`): runs ids as a new all-full sequence in slot 0 (a prefill of all but the
  // last id, then a decode step of the last one, uncaptured) and returns per layer the [Hq * T] fp32 attention
  // weights of the last position's query heads over every position: what Model::forward's last_row_probs gives on
  // the CPU. Needs 2 <= T <= max_ctx.
  std::vector<std::vector<float>> last_row_attention(const std::vector<int32_t>& ids);
  // decode() of one token, run uncaptured with events between its parts (slower than a replay: use for shares).
  // next (optional): the step's greedy token, as decode returns it. batch: that many live slots step together
  // (slots 0 .. batch - 1, each fed `id`), for the parts of a batched step.
  GpuDecodeParts decode_parts(int32_t id, int32_t* next = nullptr, int batch = 1);
  int length(int slot = 0) const;
  int max_ctx() const;  // positions a sequence may hold (GpuOptions::max_ctx)
  size_t kv_bytes(int slot = 0) const;  // K and V bytes of the pages the slot's sequence holds now (they grow)
  size_t kv_bytes_all_full(int slot = 0) const;  // the pages it would hold now were every head full
  // The most K and V bytes a sequence under `routing` holds from a prefill of `prompt` positions to `capacity`
  // positions (pages_for_layer_major): what a server reserves to admit it. kv_pool_bytes() is the whole pool.
  size_t kv_bytes_for(int prompt, int capacity, const RoutingTable& routing) const;
  size_t kv_pool_bytes() const;
  // Copies slot `from`'s live sequence into slot `to` (dropping what `to` held): the same routing, length and K/V,
  // in pages of its own, so the two decode on independently (several completions of one prompt; a batched bench
  // without prefilling each sequence). Throws OutOfPages, leaving `to` empty, when the pool cannot hold the copy.
  void fork(int from, int to);
  // Ends the slot's sequence: its pages go back to the pool now, not at the next prefill (a server slot that
  // finished or was cancelled); a prefill running in the slot is dropped. decode() then refuses it until the next
  // prefill.
  void release(int slot = 0);
  const RoutingTable& routing(int slot = 0) const;  // the slot's routing

  // What the GPU trainer shares (src/cuda/gpu_weights.h): the weights and the stream, GEMM and attention kernel
  // they run with; none of the sequences' state.
  const GpuWeights& weights() const;
  GpuExec exec() const;

  struct Impl;

 private:
  explicit GpuModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace elastic::cuda

namespace elastic {
class SequenceBackend;  // elastic/sequence_backend.h
}

namespace elastic::cuda {

// The GPU model as eval's backend (`elastic eval --device cuda`): samples run on the device one at a time, in
// slot 0.
std::shared_ptr<SequenceBackend> gpu_sequence_backend(GpuModel& g);

}  // namespace elastic::cuda

namespace elastic {
class BatchBackend;  // elastic/batch_backend.h
}

namespace elastic::cuda {

// The GPU model's slots as the server's batch backend (`serve --device cuda --parallel N`): prefill in steps of one
// chunk of one layer, decode steps batched over every running slot, KV admission by pages (kv_bytes_for against the
// pool).
std::unique_ptr<BatchBackend> gpu_batch_backend(GpuModel& g);

}  // namespace elastic::cuda
