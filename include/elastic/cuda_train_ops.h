#pragma once
// CUDA backward ops of router training (everything but the projections, done by Gemm::bf16_dx_f32, and attention,
// done by the attention backward): RMSNorm, SwiGLU, the q/k/v post-processing (RoPE, q/k norms), the router gate's
// mixture of the two attention branches, the cross-entropy fused per row chunk with the lm_head, and conversions.
// Activations are bf16 (uint16_t device pointers, as the forward kernels write them), gradients fp32 with fp32 math;
// a gradient is written as bf16 only where a tensor-core GEMM or the attention backward reads it next. "Adds into"
// means dst += result. Reductions run in a fixed order (no float atomics): results repeat bit for bit. Every launch
// is asynchronous on `stream` and checked; bad shapes and null required pointers throw std::invalid_argument (sizes
// must be > 0). The math matches src/train/grad_ops.cpp (the CPU trainer); CPU references in
// tests/gpu/test_train_ops_cuda.cpp.
#include <cuda_runtime.h>

#include <cstdint>

namespace elastic::cuda {

// y = w * x * rsqrt(mean(x^2) + eps) over rows of n (x bf16 [rows, n], w bf16 [n]); dx (fp32 [rows, n]) adds
// d/dx of sum(dy * y), dy fp32 [rows, n].
void rmsnorm_bwd(const uint16_t* x, const uint16_t* w, const float* dy, float* dx, int rows, int n, float eps,
                 cudaStream_t stream);

// gate_up bf16 [T, 2F] (gate in columns [0, F), up in [F, 2F)), a = silu(gate) * up, da fp32 [T, F]; writes
// dgate_up bf16 [T, 2F] = (da * up * silu'(gate), da * silu(gate)) (bf16: the GEMM back to the hidden state reads it).
void swiglu_bwd(const uint16_t* gate_up, const float* da, uint16_t* dgate_up, int T, int F, cudaStream_t stream);

// Backward of qkv_post at pos0 = 0 (training, position t = row t): from the gradients w.r.t. the attention inputs
// (q and k after RoPE, v) to the gradient w.r.t. the projection output qkv (before its bias; the bias only shifts
// the q/k norms' input, and its own gradient is not needed). Per q / k head: RoPE's backward (rotation by the
// negative angle, the forward's fp32 angle float(t) * inv_freq[i]), for k then + dk_pre_rope_add (the router's
// pooled-key gradient: the router reads k after k_norm, before RoPE), then the q_norm / k_norm backward.
struct QkvPostBwdParams {
  const uint16_t* qkv = nullptr;           // [T, (Hq + 2 Hkv) hd] projection output, bias not added
  const uint16_t* bias = nullptr;          // [(Hq + 2 Hkv) hd] or null
  const uint16_t* q_norm = nullptr;        // [hd] or null
  const uint16_t* k_norm = nullptr;        // [hd] or null
  const float* inv_freq = nullptr;         // [hd / 2] device
  float eps = 1e-6f;
  int T = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;  // Hq % Hkv == 0, head_dim even and <= 256
  const float* dq_rot = nullptr;           // [T, Hq, hd]
  const float* dk_rot = nullptr;           // [T, Hkv, hd]
  const float* dv = nullptr;               // [T, Hkv, hd]
  const float* dk_pre_rope_add = nullptr;  // [T, Hkv, hd] or null
  uint16_t* dqkv = nullptr;                // [T, (Hq + 2 Hkv) hd] written (every element)
};
void qkv_post_bwd(const QkvPostBwdParams& p, cudaStream_t stream);

// The gate's mixture of the two attention outputs (bf16 [T, Hq, hd]): o[t, h] = z[h / group] * of[t, h] +
// (1 - z[h / group]) * os[t, h], z fp32 [Hkv] device, group = Hq / Hkv.
void mix_fwd(const uint16_t* of, const uint16_t* os, const float* z, uint16_t* o, int T, int Hq, int Hkv, int hd,
             cudaStream_t stream);
// Its backward, dO fp32 [T, Hq, hd]: writes dof = z dO and dos = (1 - z) dO (bf16, for the attention backward); dz
// (fp32 [Hkv] device) adds sum over t and the group's heads of dO . (of - os). Deterministic two-pass reduction:
// `partials` is a device workspace of mix_bwd_partials(Hkv) floats (contents on entry ignored).
int64_t mix_bwd_partials(int Hkv);
void mix_bwd(const float* dO, const uint16_t* of, const uint16_t* os, const float* z, uint16_t* dof, uint16_t* dos,
             float* dz, float* partials, int T, int Hq, int Hkv, int hd, cudaStream_t stream);

// Cross-entropy of logits rows (fp32 [rows, V], a chunk of the lm_head's output; V up to the int range) against
// targets (int32 device [rows]), one CTA per row. loss_sum (one fp32 device scalar) adds the sum of
// -log softmax[target]: per-row losses go to row_loss (fp32 device workspace [rows]), then one CTA sums them in a
// fixed order. dlogits (bf16 [rows, V], may be null) = scale * (softmax - onehot(target)), written. A target outside
// [0, V) marks an ignored row: loss 0 and, with dlogits, a zero gradient row.
void cross_entropy_rows(const float* logits, int rows, int V, const int32_t* targets, float scale, float* row_loss,
                        float* loss_sum, uint16_t* dlogits, cudaStream_t stream);

// n elements each (n > 0). Named apart from the host helpers f32_to_bf16(float) / bf16_to_f32(uint16_t) of
// cuda_ops.h. Round to nearest even.
void convert_f32_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream);
void convert_bf16_to_f32(const uint16_t* x, float* y, int64_t n, cudaStream_t stream);
// y[i] += x[i].
void add_inplace_f32(float* y, const float* x, int64_t n, cudaStream_t stream);

}  // namespace elastic::cuda
