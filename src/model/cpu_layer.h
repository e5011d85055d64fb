#pragma once
// The CPU backend's decoder layer, in the two halves every CPU path shares (Model::forward and the layer-major
// prefill in model.cpp, decode_batch): what a layer does before attention (norm, q/k/v, q/k norms) and after it
// (o_proj, residual, MLP, residual). RoPE, attention and the cache append sit between them and differ per path: one
// sequence's rows at consecutive positions, or one row per sequence at its own position.
#include <vector>

#include "elastic/model.h"

namespace elastic::cpu {

// Activations of one call of T rows: normed h, q/k/v, attention out, projection out, MLP gate/up.
struct LayerActs {
  std::vector<float> h, q, k, v, att, o, g, u;  // [T, D], [T, Hq*hd], [T, Hkv*hd] x2, [T, Hq*hd], [T, D], [T, F] x2
  LayerActs(const ModelConfig& c, int T);
};

// How products run: one matrix product per call (prefill), or row by row (decode_batch: a row's bits then do not
// depend on which other sequences share the step).
enum class Products { Batched, RowWise };

// x [T, D] -> w.q, w.k, w.v after the projections and (Qwen3) the q/k norms, before RoPE.
void layer_qkv(const Model& m, int l, const float* x, int T, LayerActs& w, Products p = Products::Batched);

// w.att [T, Hq*hd] -> x += o_proj(att); x += down(SwiGLU(gate(h2), up(h2))) with h2 = rmsnorm(x). x updated in place.
void layer_out_mlp(const Model& m, int l, float* x, int T, LayerActs& w, Products p = Products::Batched);

}  // namespace elastic::cpu
