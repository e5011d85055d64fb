#include <filesystem>
#include <stdexcept>

#include "elastic/model.h"
#include "elastic/safetensors.h"

namespace elastic {

ModelWeights load_weights(const ModelConfig& c, const std::string& model_dir) {
  SafeTensors st = SafeTensors::open(model_dir);
  const int64_t D = c.hidden, hd = c.head_dim, Hq = c.n_heads, Hkv = c.n_kv_heads, F = c.intermediate, V = c.vocab;
  auto get = [&](const std::string& name, std::vector<int64_t> shape) { return to_f32(st.require(name, shape)); };
  auto mat = [&](const std::string& name, int64_t rows, int64_t cols) {
    return WeightMatrix::from_f32(get(name, {rows, cols}), rows, cols);
  };
  ModelWeights w;
  w.embed = mat("model.embed_tokens.weight", V, D);
  w.final_norm = get("model.norm.weight", {D});
  if (!c.tie_embeddings) w.lm_head = mat("lm_head.weight", V, D);
  w.layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights& L = w.layers[l];
    L.attn_norm = get(p + "input_layernorm.weight", {D});
    L.wq = mat(p + "self_attn.q_proj.weight", Hq * hd, D);
    L.wk = mat(p + "self_attn.k_proj.weight", Hkv * hd, D);
    L.wv = mat(p + "self_attn.v_proj.weight", Hkv * hd, D);
    L.wo = mat(p + "self_attn.o_proj.weight", D, Hq * hd);
    if (c.attention_bias) {
      L.bq = get(p + "self_attn.q_proj.bias", {Hq * hd});
      L.bk = get(p + "self_attn.k_proj.bias", {Hkv * hd});
      L.bv = get(p + "self_attn.v_proj.bias", {Hkv * hd});
    }
    if (c.qk_norm) {
      L.q_norm = get(p + "self_attn.q_norm.weight", {hd});
      L.k_norm = get(p + "self_attn.k_norm.weight", {hd});
    }
    L.mlp_norm = get(p + "post_attention_layernorm.weight", {D});
    L.w_gate = mat(p + "mlp.gate_proj.weight", F, D);
    L.w_up = mat(p + "mlp.up_proj.weight", F, D);
    L.w_down = mat(p + "mlp.down_proj.weight", D, F);
  }
  return w;
}

namespace {
// Calls fn on every projection matrix of w (const or not).
template <class Weights, class Fn>
void each_matrix(Weights& w, Fn fn) {
  fn(w.embed);
  fn(w.lm_head);
  for (auto& L : w.layers)
    for (auto* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) fn(*m);
}
}  // namespace

void ModelWeights::widen() {
  each_matrix(*this, [](WeightMatrix& m) { m.widen(); });
}

bool ModelWeights::all_f32() const {
  bool all = true;
  each_matrix(*this, [&](const WeightMatrix& m) { all = all && m.is_f32(); });
  return all;
}

size_t ModelWeights::bytes() const {
  size_t n = final_norm.size() * 4;
  each_matrix(*this, [&](const WeightMatrix& m) { n += m.bytes(); });
  for (const LayerWeights& L : layers)
    for (const std::vector<float>* v : {&L.attn_norm, &L.bq, &L.bk, &L.bv, &L.q_norm, &L.k_norm, &L.mlp_norm})
      n += v->size() * 4;
  return n;
}

}  // namespace elastic
