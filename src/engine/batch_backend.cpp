// The server's batch backends (batch_backend.h): the CPU model's slots over decode_batch, and one slot on a
// SequenceBackend.
#include "elastic/batch_backend.h"

#include <optional>
#include <stdexcept>
#include <string>

#include "elastic/batch_decode.h"
#include "elastic/engine.h"

namespace elastic {
namespace {

class CpuBatchBackend : public BatchBackend {
 public:
  CpuBatchBackend(const Model& m, int slots, int chunk) : m_(m), chunk_(chunk), seqs_(static_cast<size_t>(slots)) {
    if (slots < 1) throw std::invalid_argument("cpu_batch_backend: slots must be >= 1, got " + std::to_string(slots));
    if (chunk < 1) throw std::invalid_argument("cpu_batch_backend: prefill chunk must be >= 1");
  }
  int slots() const override { return static_cast<int>(seqs_.size()); }
  bool budgets_kv() const override { return true; }
  size_t kv_bytes_for(int, int capacity, const RoutingTable& routing) const override {
    return kv_cache_bytes_for(m_.config, capacity, routing);  // allocated whole at prefill_start
  }

  void prefill_start(int slot, const std::vector<int32_t>& prompt, int capacity, const RoutingTable* routing,
                     const PromptRouter* router) override {
    Seq& s = at(slot);
    s = Seq{};
    if (prompt.empty()) throw std::invalid_argument("cpu_batch_backend: empty prompt");
    s.prompt = prompt;  // the cursor reads the ids until the last step
    const PromptRouter* r = init_sequence_cache(m_.config, capacity, routing, router, s.cache);
    s.cursor = std::make_unique<PrefillCursor>(m_, s.prompt.data(), static_cast<int>(s.prompt.size()), chunk_, s.cache,
                                               r, &s.stats);
  }

  bool prefill_step(int slot, std::vector<float>& logits, RoutingTable& used) override {
    Seq& s = at(slot);
    if (!s.cursor) throw std::logic_error("cpu_batch_backend: prefill_step without prefill_start");
    s.cursor->step();
    if (!s.cursor->done()) return false;
    s.cursor->finish(logits);
    s.cursor.reset();
    s.prompt = {};
    used = s.cache.routing;  // finish() stored the routing the prefill ran under
    return true;
  }

  void decode(const std::vector<int>& slots, const std::vector<int32_t>& ids, std::vector<float>& logits) override {
    if (slots.size() != ids.size()) throw std::invalid_argument("cpu_batch_backend: one id per slot");
    std::vector<DecodeSlot> d;
    d.reserve(slots.size());
    for (size_t b = 0; b < slots.size(); ++b) {
      Seq& s = at(slots[b]);
      d.push_back({ids[b], &s.cache, &s.stats});
    }
    decode_batch(m_, d, logits);
  }

  void release(int slot) override { at(slot) = Seq{}; }
  int length(int slot) const override { return at(slot).cache.length; }
  int capacity(int slot) const override { return at(slot).cache.capacity; }
  size_t kv_bytes(int slot) const override { return at(slot).cache.bytes(); }
  size_t kv_bytes_all_full(int slot) const override { return at(slot).cache.bytes_all_full(); }
  AttentionStats figures(int slot) const override { return at(slot).stats; }

 private:
  struct Seq {
    KVCache cache;  // holds the sequence's routing once its prefill starts (deciding it, with a router)
    AttentionStats stats;  // prefill and decode rows, counted
    std::vector<int32_t> prompt;            // while its prefill runs
    std::unique_ptr<PrefillCursor> cursor;  // while its prefill runs
  };
  Seq& at(int slot) { return const_cast<Seq&>(static_cast<const CpuBatchBackend*>(this)->at(slot)); }
  const Seq& at(int slot) const {
    if (slot < 0 || slot >= slots()) throw std::out_of_range("cpu_batch_backend: no slot " + std::to_string(slot));
    return seqs_[static_cast<size_t>(slot)];
  }
  const Model& m_;
  int chunk_;
  std::vector<Seq> seqs_;
};

class SingleSlotBackend : public BatchBackend {
 public:
  explicit SingleSlotBackend(std::shared_ptr<SequenceBackend> be) : be_(std::move(be)) {
    if (!be_) throw std::invalid_argument("single_slot_backend: null backend");
  }
  int slots() const override { return 1; }
  bool budgets_kv() const override { return false; }
  size_t kv_bytes_for(int, int, const RoutingTable&) const override { return 0; }  // held up front

  void prefill_start(int slot, const std::vector<int32_t>& prompt, int capacity, const RoutingTable* routing,
                     const PromptRouter* router) override {
    check(slot);
    pending_ = Pending{prompt, capacity, routing ? std::optional<RoutingTable>(*routing) : std::nullopt, router};
  }
  bool prefill_step(int slot, std::vector<float>& logits, RoutingTable& used) override {  // the whole prefill
    check(slot);
    if (!pending_) throw std::logic_error("single_slot_backend: prefill_step without prefill_start");
    const Pending p = std::move(*pending_);
    pending_.reset();
    live_ = false;  // until this prefill succeeds: a failed one reports no figures, not the previous sequence's
    used_ = RoutingTable{};
    if (p.capacity > be_->capacity())
      throw std::invalid_argument("the " + be_->name() + " backend holds " + std::to_string(be_->capacity()) +
                                  " positions, the request needs " + std::to_string(p.capacity));
    capacity_ = p.capacity;
    be_->prefill(p.prompt, p.routing ? &*p.routing : nullptr, p.router, logits, used_);
    used = used_;
    live_ = true;
    return true;
  }

  void decode(const std::vector<int>& slots, const std::vector<int32_t>& ids, std::vector<float>& logits) override {
    if (slots.size() != 1 || ids.size() != 1) throw std::invalid_argument("single_slot_backend: one sequence a step");
    check(slots[0]);
    if (be_->length() >= capacity_)
      throw std::invalid_argument("single_slot_backend: the sequence is at its capacity of " + std::to_string(capacity_));
    be_->decode(ids[0], logits);
  }
  void release(int slot) override {
    check(slot);
    live_ = false;
    pending_.reset();
    be_->release();  // its memory back now (the GPU's pages to the pool)
  }
  int length(int slot) const override { return check(slot), live_ ? be_->length() : 0; }
  int capacity(int slot) const override { return check(slot), capacity_; }
  size_t kv_bytes(int slot) const override { return check(slot), live_ ? be_->kv_bytes() : 0; }
  size_t kv_bytes_all_full(int slot) const override { return check(slot), live_ ? be_->kv_bytes_all_full() : 0; }
  AttentionStats figures(int slot) const override {
    check(slot);
    return live_ ? run_attention_figures(*be_, used_, be_->length(), false) : AttentionStats{};
  }

 private:
  void check(int slot) const {
    if (slot != 0) throw std::out_of_range("single_slot_backend: no slot " + std::to_string(slot));
  }
  struct Pending {
    std::vector<int32_t> prompt;
    int capacity;
    std::optional<RoutingTable> routing;
    const PromptRouter* router;
  };
  std::shared_ptr<SequenceBackend> be_;
  std::optional<Pending> pending_;  // between prefill_start and its one step
  RoutingTable used_;
  int capacity_ = 0;
  bool live_ = false;
};

}  // namespace

std::unique_ptr<BatchBackend> cpu_batch_backend(const Model& m, int slots, int prefill_chunk) {
  return std::make_unique<CpuBatchBackend>(m, slots, prefill_chunk);
}

std::unique_ptr<BatchBackend> single_slot_backend(std::shared_ptr<SequenceBackend> be) {
  return std::make_unique<SingleSlotBackend>(std::move(be));
}

}  // namespace elastic
