// The GPU model's slots as the server's BatchBackend: a prefill advances one chunk of one layer per step (the
// scheduler runs the running slots' decode steps between them), decode steps run every running slot as one batch,
// and admission counts pages: a request reserves kv_bytes_for (the pages its routing keeps at its capacity) against
// the pool.
#include <optional>
#include <stdexcept>
#include <string>

#include "elastic/batch_backend.h"
#include "elastic/gpu_model.h"

namespace elastic::cuda {
namespace {

class GpuBatchBackend : public BatchBackend {
 public:
  explicit GpuBatchBackend(GpuModel& g) : g_(g), seqs_(static_cast<size_t>(g.slots())) {}
  int slots() const override { return g_.slots(); }
  bool budgets_kv() const override { return true; }
  size_t kv_bytes_for(int prompt, int capacity, const RoutingTable& routing) const override {
    return g_.kv_bytes_for(prompt, capacity, routing);
  }

  void prefill_start(int slot, const std::vector<int32_t>& prompt, int capacity, const RoutingTable* routing,
                     const PromptRouter* router) override {
    Seq& s = at(slot);
    if (prompt.empty()) throw std::invalid_argument("gpu_batch_backend: empty prompt");
    if (capacity > g_.max_ctx())
      throw std::invalid_argument("the cuda backend holds " + std::to_string(g_.max_ctx()) +
                                  " positions per sequence, the request needs " + std::to_string(capacity));
    // The model runs one prefill at a time: this one starts on the device at its first step (the scheduler steps
    // the oldest prefill until it is done).
    s = Seq{};
    s.pending = Pending{prompt, routing ? std::optional<RoutingTable>(*routing) : std::nullopt, router};
    s.capacity = capacity;
  }

  bool prefill_step(int slot, std::vector<float>& logits, RoutingTable& used) override {
    Seq& s = at(slot);
    if (s.pending) {
      const Pending p = std::move(*s.pending);
      s.pending.reset();
      g_.prefill_begin(slot, p.prompt.data(), static_cast<int>(p.prompt.size()), p.routing ? &*p.routing : nullptr,
                       p.router);
    } else if (g_.prefilling_slot() != slot) {
      throw std::logic_error("gpu_batch_backend: prefill_step without prefill_start");
    }
    if (!g_.prefill_step()) return false;
    g_.prefill_end(&logits, false);
    used = g_.routing(slot);
    return true;
  }

  void decode(const std::vector<int>& slots, const std::vector<int32_t>& ids, std::vector<float>& logits) override {
    for (int slot : slots)
      if (g_.length(slot) >= at(slot).capacity)
        throw std::invalid_argument("gpu_batch_backend: slot " + std::to_string(slot) + " is at its capacity of " +
                                    std::to_string(at(slot).capacity));
    g_.decode_batch(slots, ids, &logits);
  }

  void release(int slot) override {
    at(slot) = Seq{};
    g_.release(slot);  // its pages back to the pool now; a prefill running in it is dropped
  }
  int length(int slot) const override { return g_.length(slot); }
  int capacity(int slot) const override { return at(slot).capacity; }
  size_t kv_bytes(int slot) const override { return g_.kv_bytes(slot); }
  size_t kv_bytes_all_full(int slot) const override { return g_.kv_bytes_all_full(slot); }
  AttentionStats figures(int slot) const override {
    // The device counts nothing: the routing's figures over the rows the sequence ran (run_attention_figures' rule).
    const int n = g_.length(slot);
    return n > 0 ? routed_prefill_stats(g_.routing(slot), n) : AttentionStats{};
  }

 private:
  struct Pending {
    std::vector<int32_t> prompt;
    std::optional<RoutingTable> routing;
    const PromptRouter* router;
  };
  struct Seq {
    std::optional<Pending> pending;  // between prefill_start and its first step
    int capacity = 0;
  };
  Seq& at(int slot) { return const_cast<Seq&>(static_cast<const GpuBatchBackend*>(this)->at(slot)); }
  const Seq& at(int slot) const {
    if (slot < 0 || slot >= slots()) throw std::out_of_range("gpu_batch_backend: no slot " + std::to_string(slot));
    return seqs_[static_cast<size_t>(slot)];
  }
  GpuModel& g_;
  std::vector<Seq> seqs_;
};

}  // namespace

std::unique_ptr<BatchBackend> gpu_batch_backend(GpuModel& g) { return std::make_unique<GpuBatchBackend>(g); }

}  // namespace elastic::cuda
