#pragma once
// Test helper: writes a loaded model as a GGUF file the way llama.cpp's converter lays it out (q/k rows permuted,
// llama3 RoPE scaling as divisors), optionally with a tokenizer.json's vocabulary and a chat template in the
// metadata, so GGUF loading, tokenizing and serving are tested against the same weights as safetensors.
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "elastic/gguf_writer.h"
#include "elastic/model.h"
#include "model/ops.h"  // compute_rope_inv_freq

namespace elastic::testing {

using gguf::GgmlType;
using gguf::Writer;

// A tokenizer.json's vocabulary, added tokens and merges as tokenizer.ggml.* metadata, as llama.cpp's converter
// writes them for a Qwen2-style byte-level BPE (pre "qwen2"; special added tokens are type 3, others 4).
inline void add_gguf_tokenizer(Writer& w, const std::string& tj) {
  std::ifstream in(tj);
  if (!in) throw std::runtime_error("add_gguf_tokenizer: cannot open " + tj);
  nlohmann::json j = nlohmann::json::parse(in);
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (auto it = j["model"]["vocab"].begin(); it != j["model"]["vocab"].end(); ++it) {
    const size_t id = it.value().get<size_t>();
    if (tokens.size() <= id) {
      tokens.resize(id + 1);
      types.resize(id + 1, 1);
    }
    tokens[id] = it.key();
  }
  for (auto& a : j["added_tokens"]) {
    const size_t id = a["id"].get<size_t>();
    if (tokens.size() <= id) {
      tokens.resize(id + 1);
      types.resize(id + 1, 1);
    }
    tokens[id] = a["content"].get<std::string>();
    types[id] = a.value("special", true) ? 3 : 4;
  }
  std::vector<std::string> merges;
  for (auto& m : j["model"]["merges"])
    merges.push_back(m.is_string() ? m.get<std::string>() : m[0].get<std::string>() + " " + m[1].get<std::string>());
  w.set_str("tokenizer.ggml.model", "gpt2");
  w.set_str("tokenizer.ggml.pre", "qwen2");
  w.set_str_array("tokenizer.ggml.tokens", tokens);
  w.set_i32_array("tokenizer.ggml.token_type", types);
  w.set_str_array("tokenizer.ggml.merges", merges);
}

// llama.cpp's converter permutation (rows h*hd + j*hd/2 + i -> h*hd + 2i + j), applied to make the test file.
inline std::vector<float> permute_rows(const std::vector<float>& w, int heads, int hd, int cols) {
  std::vector<float> out(w.size());
  for (int h = 0; h < heads; ++h)
    for (int j = 0; j < 2; ++j)
      for (int i = 0; i < hd / 2; ++i)
        std::copy_n(&w[(static_cast<size_t>(h) * hd + j * hd / 2 + i) * cols], cols,
                    &out[(static_cast<size_t>(h) * hd + 2 * i + j) * cols]);
  return out;
}

struct GgufOpts {
  GgmlType mat = GgmlType::F32;
  bool tied = false;
  std::string drop;            // a tensor to leave out
  std::string tokenizer_json;  // when set: its vocabulary and merges as tokenizer.ggml.* (add_gguf_tokenizer)
  std::string chat_template;   // when set: tokenizer.chat_template
  uint32_t eos = 7;            // tokenizer.ggml.eos_token_id
};

// Writes a safetensors-loaded model as a GGUF file the way llama.cpp's converter lays it out.
inline void write_model_gguf(const Model& m, const std::string& path, const GgufOpts& o) {
  const ModelConfig& c = m.config;
  const bool llama = c.arch == Arch::Llama;
  const std::string a = llama ? "llama" : "qwen3";
  Writer w;
  w.set_str("general.architecture", a);
  w.set_str("general.name", "tiny");
  w.set_u32(a + ".embedding_length", c.hidden);
  w.set_u32(a + ".block_count", c.n_layers);
  w.set_u32(a + ".attention.head_count", c.n_heads);
  w.set_u32(a + ".attention.head_count_kv", c.n_kv_heads);
  w.set_u32(a + ".attention.key_length", c.head_dim);
  w.set_u32(a + ".attention.value_length", c.head_dim);
  w.set_u32(a + ".feed_forward_length", c.intermediate);
  w.set_u32(a + ".context_length", c.max_positions);
  w.set_u32(a + ".vocab_size", c.vocab);
  w.set_u32(a + ".rope.dimension_count", c.head_dim);
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", c.rms_eps);
  w.set_f32(a + ".rope.freq_base", static_cast<float>(c.rope.theta));
  w.set_u32("tokenizer.ggml.eos_token_id", o.eos);
  if (!o.tokenizer_json.empty()) add_gguf_tokenizer(w, o.tokenizer_json);
  if (!o.chat_template.empty()) w.set_str("tokenizer.chat_template", o.chat_template);
  auto put = [&](const std::string& name, const std::vector<float>& v, std::vector<int64_t> dims, bool matrix) {
    if (name == o.drop) return;
    w.add_tensor(name, std::move(dims), matrix ? o.mat : GgmlType::F32, v.data());
  };
  const int64_t D = c.hidden, hd = c.head_dim, F = c.intermediate, V = c.vocab;
  put("token_embd.weight", m.weights.embed.f32(), {D, V}, true);
  put("output_norm.weight", m.weights.final_norm, {D}, false);
  if (!o.tied) put("output.weight", m.weights.head().f32(), {D, V}, true);
  if (c.rope.llama3) {
    // The converter stores llama3 scaling as per-frequency divisors.
    ModelConfig plain = c;
    plain.rope.llama3 = false;
    const auto base = compute_rope_inv_freq(plain), scaled = compute_rope_inv_freq(c);
    std::vector<float> div(base.size());
    for (size_t i = 0; i < div.size(); ++i) div[i] = base[i] / scaled[i];
    put("rope_freqs.weight", div, {hd / 2}, false);
  }
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = m.weights.layers[l];
    const std::string b = "blk." + std::to_string(l) + ".";
    put(b + "attn_norm.weight", L.attn_norm, {D}, false);
    put(b + "attn_q.weight", llama ? permute_rows(L.wq.f32(), c.n_heads, c.head_dim, c.hidden) : L.wq.f32(), {D, c.n_heads * hd},
        true);
    put(b + "attn_k.weight", llama ? permute_rows(L.wk.f32(), c.n_kv_heads, c.head_dim, c.hidden) : L.wk.f32(),
        {D, c.n_kv_heads * hd}, true);
    put(b + "attn_v.weight", L.wv.f32(), {D, c.n_kv_heads * hd}, true);
    put(b + "attn_output.weight", L.wo.f32(), {c.n_heads * hd, D}, true);
    if (c.qk_norm) {
      put(b + "attn_q_norm.weight", L.q_norm, {hd}, false);
      put(b + "attn_k_norm.weight", L.k_norm, {hd}, false);
    }
    put(b + "ffn_norm.weight", L.mlp_norm, {D}, false);
    put(b + "ffn_gate.weight", L.w_gate.f32(), {D, F}, true);
    put(b + "ffn_up.weight", L.w_up.f32(), {D, F}, true);
    put(b + "ffn_down.weight", L.w_down.f32(), {F, D}, true);
  }
  w.write(path);
}


}  // namespace elastic::testing
