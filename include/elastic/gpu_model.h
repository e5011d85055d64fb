#pragma once
// The decoder on one GPU: bf16 weights and activations, fp32 accumulation. cuBLASLt runs the projections and the
// MLP (q/k/v fused into one GEMM, gate/up into another); our kernels run the rest; the fused hybrid attention runs
// all heads of a layer in one launch, each KV head in its own mode.
//
// Prefill is layer-major: the whole prompt's residual stream stays on the device and one chunk's activations at a
// time, so a router decides layer l from the prompt's boundary keys before any of layer l's attention runs. After
// a layer, each KV head's keys and values move into pages of one pool (kv_pages.h): every position for full and
// XAttention heads, the sink and window blocks for streaming heads, so the pages a sequence holds fall with sparsity.
// Decode steps replay one CUDA graph: the host writes the step's position, each head's kept count and the pool row
// of its new key into device memory, a device planner cuts the paged decode kernel's units, and
// paged_decode_attention reads K/V through the page lists (cuda_paged_decode.h).
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

struct GpuOptions {
  // Prefill attention kernel (cuda_attention.h), fixed for the model's life; unset: attention_config_from_env() when
  // the model is built. Printed with the plan.
  std::optional<AttnKernelConfig> attention;
  int max_ctx = 8192;   // positions reserved per sequence (prompt + generated tokens)
  int chunk = 16384;    // prefill chunk; a multiple of the sparse block size when XAttention heads run
  bool graphs = true;   // decode through a CUDA graph
  int device = 0;
};

// The one device allocation plan, in bytes (printed at start). kv_full is the page pool, sized for every head full
// at max_ctx; a routed prompt holds only the pages its heads keep (GpuPrefillStats::kv_bytes).
struct GpuPlan {
  size_t weights = 0, kv_full = 0, prefill_kv = 0, activations = 0, xattn = 0, workspace = 0;
  std::string kernels;  // what the model runs: "attention overlap (...); decode paged (...)"
  size_t total() const { return weights + kv_full + prefill_kv + activations + xattn + workspace; }
  std::string describe() const;
};

struct GpuPrefillStats {
  double total_ms = 0;      // host wall time of the prefill, synchronized
  double attention_ms = 0;  // attention kernels (XAttention estimation included), from CUDA events
  size_t kv_bytes = 0;      // the pages this sequence holds (K and V)
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

  // Starts a new sequence with T prompt tokens. routing: a fixed table; when null, `router` decides per layer
  // (when also null: all heads full). logits (optional): fp32 [T, V] when all_logits, else [V] of the last token.
  void prefill(const int32_t* ids, int T, const RoutingTable* routing, const PromptRouter* router,
               std::vector<float>* logits, bool all_logits, GpuPrefillStats* stats = nullptr);
  // Appends one token at position length(); writes its logits ([V]) when asked; returns the greedy next token.
  int32_t decode(int32_t id, std::vector<float>* logits = nullptr);
  // Probing (`elastic probe --device cuda`): runs ids as a new all-full sequence (a prefill of all but the last id,
  // then a decode step of the last one, uncaptured) and returns per layer the [Hq * T] fp32 attention weights of the
  // last position's query heads over every position: what Model::forward's last_row_probs gives on the CPU.
  // Needs 2 <= T <= max_ctx.
  std::vector<std::vector<float>> last_row_attention(const std::vector<int32_t>& ids);
  // decode() of one token, run uncaptured with events between its parts (slower than a replay: use for shares).
  // next (optional): the step's greedy token, as decode returns it.
  GpuDecodeParts decode_parts(int32_t id, int32_t* next = nullptr);
  int length() const;
  int max_ctx() const;  // positions a sequence may hold (GpuOptions::max_ctx)
  size_t kv_bytes() const;  // K and V bytes of the pages the current sequence holds now (they grow as it decodes)
  size_t kv_bytes_all_full() const;  // the pages it would hold now were every head full
  // Ends the current sequence: its pages go back to the pool now, not at the next prefill (a server slot that
  // finished or was cancelled). decode() then refuses until the next prefill.
  void release();
  const RoutingTable& routing() const;  // the current sequence's routing

  struct Impl;
  Impl& internals() { return *impl_; }  // for src/cuda's trainer, which shares the weights, stream and GEMM

 private:
  explicit GpuModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace elastic::cuda

namespace elastic {
class SequenceBackend;  // elastic/sequence_backend.h
}

namespace elastic::cuda {

// The GPU model as eval's backend (`elastic eval --device cuda`): samples run on the device one at a time.
std::shared_ptr<SequenceBackend> gpu_sequence_backend(GpuModel& g);

}  // namespace elastic::cuda
