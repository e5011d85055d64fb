#pragma once
// Several sequences at once, each in a slot: what the server's scheduler runs on, the same on every device. The CPU
// model batches its decode steps (decode_batch: one GEMM over every slot's row, attention per slot under its own
// routing), the GPU model too (cuda::gpu_batch_backend over GpuModel::decode_batch); single_slot_backend puts one
// slot on any SequenceBackend.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "elastic/sequence_backend.h"

namespace elastic {

class BatchBackend {
 public:
  virtual ~BatchBackend() = default;
  virtual int slots() const = 0;
  // True when admission reserves each sequence's KV memory (kv_bytes_for) against a budget: the CPU's caches, the
  // GPU's page pool; false when the backend holds its memory up front (one SequenceBackend slot).
  virtual bool budgets_kv() const = 0;
  // The most KV bytes a sequence under `routing` holds from a prefill of `prompt` positions until it reaches
  // `capacity` positions: what admission reserves against the budget (a router's request reserves all full until
  // its prefill has decided). The CPU's hybrid caches (kv_cache_bytes_for), the GPU's pages (pages_for_layer_major).
  virtual size_t kv_bytes_for(int prompt, int capacity, const RoutingTable& routing) const = 0;
  // Starts a sequence in free slot `slot` with room for `capacity` positions: prefill of `prompt` under `routing`,
  // or `router`'s decisions, in bounded steps, so the scheduler can run the other slots' decode steps between them
  // and a long prompt stalls them by one step: prefill_start, then prefill_step until it returns true (then the last
  // position's logits [V] and the routing used are written). The CPU steps one chunk through one layer
  // (PrefillCursor); a backend without steps runs the whole prefill in its first step.
  virtual void prefill_start(int slot, const std::vector<int32_t>& prompt, int capacity, const RoutingTable* routing,
                             const PromptRouter* router) = 0;
  virtual bool prefill_step(int slot, std::vector<float>& logits, RoutingTable& used) = 0;
  // One decode step: ids[b] appended to slots[b]. logits [slots.size(), V], row b for slots[b]. Throws before
  // changing any sequence when one cannot take the step.
  virtual void decode(const std::vector<int>& slots, const std::vector<int32_t>& ids, std::vector<float>& logits) = 0;
  virtual void release(int slot) = 0;  // frees the slot's sequence and its memory
  virtual int length(int slot) const = 0;
  virtual int capacity(int slot) const = 0;
  virtual size_t kv_bytes(int slot) const = 0;
  virtual size_t kv_bytes_all_full(int slot) const = 0;  // the same sequence with every head full
  // The slot's attention figures (run_attention_figures' rule): counted work where the backend counts, else the
  // routing's figures over the rows the sequence ran.
  virtual AttentionStats figures(int slot) const = 0;
};

// The GPU model's slots are cuda::gpu_batch_backend (elastic/gpu_model.h).
// The CPU model with `slots` slots, prefill in chunks of `prefill_chunk` (the model outlives the backend).
std::unique_ptr<BatchBackend> cpu_batch_backend(const Model& m, int slots, int prefill_chunk);
// One slot on a SequenceBackend.
std::unique_ptr<BatchBackend> single_slot_backend(std::shared_ptr<SequenceBackend> be);

}  // namespace elastic
