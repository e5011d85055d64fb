#pragma once
// A model runner behind a small interface, one sequence at a time: the GPU model (cuda::gpu_sequence_backend) and
// the CPU model (cpu_sequence_backend). The engine's loops run on it (engine.h): `generate` on either device,
// `eval --device cuda` and `serve --device cuda`.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "elastic/model.h"

namespace elastic {

class SequenceBackend {
 public:
  virtual ~SequenceBackend() = default;
  // Starts a sequence: prefill of `prompt` under `routing`, or, when routing is null, under `router`'s per-layer
  // decisions (when also null: every head full). Writes the last position's logits and the routing used.
  virtual void prefill(const std::vector<int32_t>& prompt, const RoutingTable* routing, const PromptRouter* router,
                       std::vector<float>& logits, RoutingTable& used) = 0;
  // Appends one token; writes its logits.
  virtual void decode(int32_t id, std::vector<float>& logits) = 0;
  // Appends one token; returns the greedy next id (the first largest logit, as Sampler's greedy). A backend may pick it
  // where the logits are (the GPU: on the device, without copying them out); the default decodes into a kept row.
  virtual int32_t decode_greedy(int32_t id);
  // Appends `ids` and writes the logits of each of their rows ([ids.size(), V]): a likelihood's reference. By
  // default one decode step per id; the CPU runs them as one prefill chunk (XAttention heads then select blocks for
  // the chunk when it starts on a block boundary, where decode steps attend densely).
  virtual void extend(const std::vector<int32_t>& ids, std::vector<float>& all_logits);
  virtual int length() const = 0;  // positions the current sequence holds
  // Ends the current sequence and frees its memory now (a server slot that finished, was cancelled or disconnected).
  virtual void release() = 0;
  virtual std::string name() const = 0;  // "cuda", "cpu"; recorded in run.json
  virtual int capacity() const = 0;      // positions a sequence may hold (prompt + generated tokens)
  virtual size_t kv_bytes() const { return 0; }  // the current sequence's KV caches (0 = not known)
  // What the same sequence would hold were every head full (0 = not known): kv_bytes against it is what routing saves.
  virtual size_t kv_bytes_all_full() const { return 0; }
  // The attention work this sequence ran, where the backend counts it (the CPU: blocks each row computed, XAttention's
  // selections included): its prompt's prefill, or every row since (decode steps, extend); nullptr: not counted (the
  // engine then uses the routing's figures).
  virtual const AttentionStats* counted_attention(bool prompt_only) const {
    (void)prompt_only;
    return nullptr;
  }

 protected:
  std::vector<float> greedy_logits_;  // decode_greedy's default: one vocabulary row kept, not allocated per token
};

// The CPU model as a SequenceBackend, caches of `capacity` positions, prefill in chunks of `prefill_chunk`.
std::shared_ptr<SequenceBackend> cpu_sequence_backend(std::shared_ptr<const Model> m, int capacity, int prefill_chunk);

}  // namespace elastic
