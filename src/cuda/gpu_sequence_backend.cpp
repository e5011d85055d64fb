// The GPU model's slot 0 as a SequenceBackend: the engine's generate and `eval --device cuda` run every prefill
// (routed by a table or by the router, layer by layer) and decode step on the device. (`serve --device cuda` runs on
// all its slots: gpu_batch_backend.cpp.)
#include <memory>

#include "elastic/sequence_backend.h"
#include "elastic/gpu_model.h"

namespace elastic::cuda {
namespace {

class GpuSequenceBackend : public SequenceBackend {
 public:
  explicit GpuSequenceBackend(GpuModel& g) : g_(g) {}
  void prefill(const std::vector<int32_t>& prompt, const RoutingTable* routing, const PromptRouter* router,
               std::vector<float>& logits, RoutingTable& used) override {
    g_.prefill(prompt.data(), static_cast<int>(prompt.size()), routing, router, &logits, false);
    used = g_.routing();
  }
  void decode(int32_t id, std::vector<float>& logits) override { g_.decode(id, &logits); }
  int32_t decode_greedy(int32_t id) override { return g_.decode(id, nullptr); }  // argmax on the device
  int length() const override { return g_.length(); }
  void release() override { g_.release(); }
  std::string name() const override { return "cuda"; }
  int capacity() const override { return g_.max_ctx(); }
  size_t kv_bytes() const override { return g_.kv_bytes(); }  // live: pages grow as the sequence decodes
  size_t kv_bytes_all_full() const override { return g_.kv_bytes_all_full(); }

 private:
  GpuModel& g_;
};

}  // namespace

std::shared_ptr<SequenceBackend> gpu_sequence_backend(GpuModel& g) { return std::make_shared<GpuSequenceBackend>(g); }

}  // namespace elastic::cuda
