// The CPU model behind the SequenceBackend interface: the same prefill (routed by a table or by a router,
// into a hybrid cache) and decode steps as Model::prefill / Model::forward, one sequence at a time.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "elastic/sequence_backend.h"

namespace elastic {
namespace {

class CpuSequenceBackend : public SequenceBackend {
 public:
  CpuSequenceBackend(std::shared_ptr<const Model> m, int capacity, int chunk)
      : m_(std::move(m)), capacity_(capacity), chunk_(chunk) {
    if (!m_) throw std::invalid_argument("cpu_sequence_backend: null model");
    if (capacity_ <= 0 || chunk_ <= 0)
      throw std::invalid_argument("cpu_sequence_backend: capacity and prefill chunk must be > 0");
  }

  void prefill(const std::vector<int32_t>& prompt, const RoutingTable* routing, const PromptRouter* router,
               std::vector<float>& logits, RoutingTable& used) override {
    if (prompt.empty()) throw std::invalid_argument("cpu_sequence_backend: empty prompt");
    if (static_cast<int>(prompt.size()) > capacity_)
      throw std::invalid_argument("cpu_sequence_backend: prompt of " + std::to_string(prompt.size()) +
                                  " tokens exceeds the capacity of " + std::to_string(capacity_));
    cache_ = KVCache{};
    counted_ = AttentionStats{};
    const int T = static_cast<int>(prompt.size());
    // A router routes layer by layer inside the prefill; a table is what the cache is built for. Either way the
    // cache holds the sequence's routing afterwards.
    const PromptRouter* r = init_sequence_cache(m_->config, capacity_, routing, router, cache_);
    m_->prefill(prompt.data(), T, chunk_, cache_, logits, false, &counted_, r);
    used = cache_.routing;
    prompt_counted_ = counted_;
  }

  void decode(int32_t id, std::vector<float>& logits) override {
    if (cache_.length >= cache_.capacity)
      throw std::invalid_argument("cpu_sequence_backend: the sequence is at its capacity of " +
                                  std::to_string(cache_.capacity) + " positions");
    if (cache_.n_layers == 0) throw std::logic_error("cpu_sequence_backend: decode before prefill");
    if (id < 0 || id >= m_->config.vocab)
      throw std::invalid_argument("cpu_sequence_backend: token id " + std::to_string(id) + " is outside the vocabulary");
    m_->forward(&id, 1, cache_, logits, false, &counted_);
  }

  void extend(const std::vector<int32_t>& ids, std::vector<float>& all_logits) override {
    if (cache_.n_layers == 0) throw std::logic_error("cpu_sequence_backend: extend before prefill");
    if (ids.empty()) {
      all_logits.clear();
      return;
    }
    if (int64_t(cache_.length) + int64_t(ids.size()) > cache_.capacity)
      throw std::invalid_argument("cpu_sequence_backend: " + std::to_string(ids.size()) + " more tokens exceed the capacity of " +
                                  std::to_string(cache_.capacity) + " positions");
    for (const int32_t id : ids)
      if (id < 0 || id >= m_->config.vocab)
        throw std::invalid_argument("cpu_sequence_backend: token id " + std::to_string(id) + " is outside the vocabulary");
    m_->prefill(ids.data(), static_cast<int>(ids.size()), chunk_, cache_, all_logits, true, &counted_);
  }

  std::string name() const override { return "cpu"; }
  int capacity() const override { return capacity_; }
  size_t kv_bytes() const override { return cache_.bytes(); }
  int length() const override { return cache_.length; }
  void release() override { cache_ = KVCache{}; }
  size_t kv_bytes_all_full() const override { return cache_.bytes_all_full(); }
  const AttentionStats* counted_attention(bool prompt_only) const override {
    return prompt_only ? &prompt_counted_ : &counted_;
  }

 private:
  std::shared_ptr<const Model> m_;
  int capacity_, chunk_;
  KVCache cache_;
  AttentionStats counted_;         // the sequence's attention work: every prefill, decode and extend row
  AttentionStats prompt_counted_;  // its prompt's prefill
};

}  // namespace

std::shared_ptr<SequenceBackend> cpu_sequence_backend(std::shared_ptr<const Model> m, int capacity, int prefill_chunk) {
  return std::make_shared<CpuSequenceBackend>(std::move(m), capacity, prefill_chunk);
}

}  // namespace elastic
