#pragma once
// Small random models for the GPU tests, weights rounded to bf16 so that the fp32 CPU path and the bf16 GPU path
// compute from the same weights.
#include <cmath>
#include <random>
#include <vector>

#include "elastic/cuda_ops.h"
#include "elastic/model.h"
#include "elastic/model_shapes.h"

namespace elastic::gpu_test {

inline void round_bf16(std::vector<float>& v) {
  for (float& x : v) x = cuda::bf16_to_f32(cuda::f32_to_bf16(x));
}

// Weights with the scale of a trained model (unit-variance activations), rounded to bf16 so that the CPU and the
// GPU compute from the same weights.
inline Model make_model(bool llama, uint64_t seed) {
  ModelConfig c;
  c.arch = llama ? Arch::Llama : Arch::Qwen3;
  c.hidden = llama ? 192 : 256;
  c.n_layers = 3;
  c.n_heads = llama ? 6 : 8;  // group 3 runs the simple kernel, group 4 the wgmma one
  c.n_kv_heads = 2;
  c.head_dim = llama ? 64 : 128;
  c.intermediate = llama ? 320 : 512;
  c.vocab = 1000;
  c.max_positions = 4096;
  c.rms_eps = llama ? 1e-5f : 1e-6f;
  c.rope.theta = llama ? 500000 : 1e6;
  if (llama) {
    c.rope.llama3 = true;
    c.rope.factor = 8;
    c.rope.original_max_positions = 256;
  }
  c.tie_embeddings = !llama;
  c.attention_bias = llama;
  c.qk_norm = !llama;
  Model m = random_model(c, seed);
  std::mt19937_64 rng(seed + 1);
  std::normal_distribution<float> N(0.f, 1.f);
  auto fill = [&](std::vector<float>& v, double sd, double mean = 0) {
    for (float& x : v) x = float(mean + sd * N(rng));
    round_bf16(v);
  };
  const int D = c.hidden, qd = c.n_heads * c.head_dim, kd = c.n_kv_heads * c.head_dim;
  fill(m.weights.embed.f32(), 1.0);
  fill(m.weights.final_norm, 0.1, 1.0);
  if (!m.weights.lm_head.empty()) fill(m.weights.lm_head.f32(), 1.0 / std::sqrt(D));
  for (LayerWeights& L : m.weights.layers) {
    fill(L.attn_norm, 0.1, 1.0);
    fill(L.mlp_norm, 0.1, 1.0);
    fill(L.wq.f32(), 1.0 / std::sqrt(D));
    fill(L.wk.f32(), 1.0 / std::sqrt(D));
    fill(L.wv.f32(), 1.0 / std::sqrt(D));
    fill(L.wo.f32(), 0.5 / std::sqrt(qd));
    fill(L.w_gate.f32(), 1.0 / std::sqrt(D));
    fill(L.w_up.f32(), 1.0 / std::sqrt(D));
    fill(L.w_down.f32(), 0.5 / std::sqrt(c.intermediate));
    if (c.qk_norm) {
      fill(L.q_norm, 0.1, 1.0);
      fill(L.k_norm, 0.1, 1.0);
    }
    if (c.attention_bias) {
      L.bq.resize(qd);
      L.bk.resize(kd);
      L.bv.resize(kd);
      fill(L.bq, 0.3);
      fill(L.bk, 0.3);
      fill(L.bv, 0.3);
    }
  }
  return m;
}

}  // namespace elastic::gpu_test
