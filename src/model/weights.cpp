#include <filesystem>
#include <stdexcept>

#include "elastic/model.h"
#include "elastic/safetensors.h"

namespace elastic {

ModelWeights load_weights(const ModelConfig& c, const std::string& model_dir) {
  SafeTensors st = SafeTensors::open(model_dir);
  const int64_t D = c.hidden, hd = c.head_dim, Hq = c.n_heads, Hkv = c.n_kv_heads, F = c.intermediate, V = c.vocab;
  auto get = [&](const std::string& name, std::vector<int64_t> shape) { return to_f32(st.require(name, shape)); };
  ModelWeights w;
  w.embed = get("model.embed_tokens.weight", {V, D});
  w.final_norm = get("model.norm.weight", {D});
  if (!c.tie_embeddings) w.lm_head = get("lm_head.weight", {V, D});
  w.layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights& L = w.layers[l];
    L.attn_norm = get(p + "input_layernorm.weight", {D});
    L.wq = get(p + "self_attn.q_proj.weight", {Hq * hd, D});
    L.wk = get(p + "self_attn.k_proj.weight", {Hkv * hd, D});
    L.wv = get(p + "self_attn.v_proj.weight", {Hkv * hd, D});
    L.wo = get(p + "self_attn.o_proj.weight", {D, Hq * hd});
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
    L.w_gate = get(p + "mlp.gate_proj.weight", {F, D});
    L.w_up = get(p + "mlp.up_proj.weight", {F, D});
    L.w_down = get(p + "mlp.down_proj.weight", {D, F});
  }
  return w;
}

}  // namespace elastic
