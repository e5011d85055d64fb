#pragma once
// One training sequence through the frozen backbone with the router in the loop: forward with both attention
// branches per layer mixed by the router's gate (z * O_full + (1 - z) * O_sparse per query head, z from its KV
// head), then the backward of the loss to the router's parameters. Activation memory is one layer's worth plus the
// residual stream (one [T, D] per layer boundary): each layer is recomputed from its saved input in the backward.
#include <cstdint>
#include <vector>

#include "elastic/model.h"
#include "elastic/router.h"

namespace elastic::train {

struct TrainSample {
  std::vector<int32_t> ids;  // prompt then answer
  int prompt_len = 0;        // loss on predicting ids[t + 1] for t in [prompt_len - 1, T - 1)
  int task_class = 0;        // index into the trainer's class list
};

struct GateSettings {
  double tau = 1.0;
  bool hard = true;                            // straight-through hard routing; false: soft mixture (checks)
  const std::vector<double>* noise = nullptr;  // [L * Hkv] logistic noise; nullptr = none
};

template <class Real>
struct StepResult {
  Real lm_loss = 0;          // mean cross-entropy over the answer tokens
  int n_answer = 0;
  std::vector<Real> z;       // [L * Hkv] gate value (weight of the FULL branch) per KV head
  std::vector<Real> p_full;  // [L * Hkv] the gate's FULL probability
  Real omega() const;        // Omega_MSR of the sample: mean over heads of (1 - z)
};

// One training sequence's forward and backward, on whichever device runs it: the trainer holds one of these per
// step. The CPU runner is RouterStep<float>; the GPU runner is elastic::cuda's GpuRouterStep (include/elastic/gpu_train.h).
class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual StepResult<float> forward(const TrainSample& s, const GateSettings& g) = 0;
  // Adds into dparams the gradient of  lm_weight * lm_loss + omega_weight * Omega  of the last forward.
  virtual void backward(float lm_weight, float omega_weight, float* dparams) = 0;
};

template <class Real>
class RouterStep {
 public:
  // params: the router's parameters as Real (n_layers x layer_param_count).
  RouterStep(const Model& m, const RouterSpec& spec, const Real* params);
  ~RouterStep();
  StepResult<Real> forward(const TrainSample& s, const GateSettings& g);
  // Adds into dparams the gradient of  lm_weight * lm_loss + omega_weight * Omega  of the last forward.
  void backward(Real lm_weight, Real omega_weight, Real* dparams);

 private:
  struct Impl;
  Impl* impl_;
};

// RouterStep<float> as a StepRunner (the CPU trainer's runner).
class CpuStepRunner : public StepRunner {
 public:
  CpuStepRunner(const Model& m, const RouterSpec& spec, const float* params) : step_(m, spec, params) {}
  StepResult<float> forward(const TrainSample& s, const GateSettings& g) override { return step_.forward(s, g); }
  void backward(float lm_weight, float omega_weight, float* dparams) override {
    step_.backward(lm_weight, omega_weight, dparams);
  }

 private:
  RouterStep<float> step_;
};

}  // namespace elastic::train
