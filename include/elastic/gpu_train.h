#pragma once
// Router training on one GPU: the same training step as the CPU's (src/train/router_step.cpp) on the bf16 GPU
// backbone. Per sequence, the forward runs layer by layer keeping only the residual stream at each layer boundary
// ([L + 1, T, D] bf16); the backward recomputes each layer from its saved input (both attention branches, the
// gate's mixture), then walks it back with cuBLASLt for the projections (dX = dY W), our backward kernels for
// RMSNorm, SwiGLU, RoPE and the q/k norms, the block-sparse attention backward, and the cross-entropy fused with the
// lm_head in row chunks (the [T, V] logits never exist whole). The router itself (0.26M parameters a layer) runs on
// the host in fp32, as on the CPU: only its pooled keys and its gate gradients cross the bus.
#include <cstddef>
#include <memory>
#include <string>

#include "elastic/gpu_model.h"
#include "elastic/router.h"
#include "elastic/train.h"

namespace elastic::cuda {

// The trainer's device memory for sequences of up to max_T tokens, in bytes (printed at start).
struct GpuTrainPlan {
  size_t weights = 0;       // the backbone (the GpuModel's, shared; filled from its plan, 0 in gpu_train_plan)
  size_t boundaries = 0;    // residual stream at every layer boundary, [L + 1, T, D] bf16
  size_t layer_acts = 0;    // one layer's recomputed activations (bf16) and its gradients (fp32)
  size_t head = 0;          // lm_head row chunk: fp32 logits, bf16 dlogits
  size_t xattn = 0;         // XAttention block lists
  size_t total() const { return weights + boundaries + layer_acts + head + xattn; }
  std::string describe(int max_T) const;
};

// Bytes the trainer allocates at max_T tokens beyond the resident weights, and the longest T that fits `free_bytes`.
GpuTrainPlan gpu_train_plan(const ModelConfig& c, int max_T, HeadMode sparse_mode);
int gpu_train_max_tokens(const ModelConfig& c, size_t free_bytes, HeadMode sparse_mode);

class GpuRouterTrainer;  // device buffers for one max_T, reused by every step

// A StepRunnerFactory for train_router: every step runs on `g`'s device. Buffers are allocated once for sequences
// of up to max_T tokens (throws std::runtime_error naming the sizes when they do not fit).
StepRunnerFactory gpu_step_runner_factory(GpuModel& g, int max_T, bool verbose = true);

}  // namespace elastic::cuda
