#pragma once
// Test helper: writes small safetensors files (optionally corrupted) into a temp folder.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <random>
#include "scratch_dir.h"

namespace elastic::testing {

struct StTensor {
  std::string name, dtype;  // "F32", "F16", "BF16"
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

inline StTensor f32_tensor(const std::string& name, std::vector<int64_t> shape, float fill) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  StTensor t{name, "F32", shape, std::vector<uint8_t>(n * 4)};
  for (int64_t i = 0; i < n; ++i) std::memcpy(t.bytes.data() + 4 * i, &fill, 4);
  return t;
}

// Writes a well-formed file; `header_override` replaces the JSON header text when non-empty.
inline void write_safetensors(const std::string& path, const std::vector<StTensor>& ts,
                              const std::string& header_override = "", int64_t truncate_to = -1) {
  nlohmann::json h = nlohmann::json::object();
  uint64_t off = 0;
  for (auto& t : ts) {
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  std::string hs = header_override.empty() ? h.dump() : header_override;
  std::string buf(8, '\0');
  uint64_t hl = hs.size();
  std::memcpy(buf.data(), &hl, 8);
  buf += hs;
  for (auto& t : ts) buf.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  if (truncate_to >= 0) buf.resize(truncate_to);
  std::ofstream(path, std::ios::binary).write(buf.data(), buf.size());
}

inline std::string temp_dir(const std::string& tag) {
  const auto p = elastic::test::scratch_dir() / tag;
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

// A random-weight Qwen3 with the full Qwen3 vocabulary (so the real tokenizer fits), tiny everywhere else:
// 2 layers, hidden 16, 2 query / 1 KV heads of 8, tied embeddings. Writes config.json and model.safetensors.
inline void write_tiny_qwen3_full_vocab(const std::string& d, unsigned seed, float stddev) {
  const int V = 151669, D = 16, F = 32, hd = 8;
  std::ofstream(d + "/config.json") << R"({"architectures":["Qwen3ForCausalLM"],"hidden_size":16,"num_hidden_layers":2,
    "num_attention_heads":2,"num_key_value_heads":1,"head_dim":8,"intermediate_size":32,"vocab_size":151669,
    "max_position_embeddings":4096,"rope_theta":1000000,"tie_word_embeddings":true,"eos_token_id":151645})";
  std::mt19937 rng(seed);
  std::normal_distribution<float> N(0.f, stddev);
  auto rnd = [&](const std::string& name, std::vector<int64_t> shape) {
    StTensor t = f32_tensor(name, shape, 0.f);
    for (size_t i = 0; i < t.bytes.size(); i += 4) {
      float x = N(rng);
      std::memcpy(t.bytes.data() + i, &x, 4);
    }
    return t;
  };
  std::vector<StTensor> ts{rnd("model.embed_tokens.weight", {V, D}), f32_tensor("model.norm.weight", {D}, 1.f)};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    ts.push_back(f32_tensor(p + "input_layernorm.weight", {D}, 1.f));
    ts.push_back(rnd(p + "self_attn.q_proj.weight", {2 * hd, D}));
    ts.push_back(rnd(p + "self_attn.k_proj.weight", {hd, D}));
    ts.push_back(rnd(p + "self_attn.v_proj.weight", {hd, D}));
    ts.push_back(rnd(p + "self_attn.o_proj.weight", {D, 2 * hd}));
    ts.push_back(f32_tensor(p + "self_attn.q_norm.weight", {hd}, 1.f));
    ts.push_back(f32_tensor(p + "self_attn.k_norm.weight", {hd}, 1.f));
    ts.push_back(f32_tensor(p + "post_attention_layernorm.weight", {D}, 1.f));
    ts.push_back(rnd(p + "mlp.gate_proj.weight", {F, D}));
    ts.push_back(rnd(p + "mlp.up_proj.weight", {F, D}));
    ts.push_back(rnd(p + "mlp.down_proj.weight", {D, F}));
  }
  write_safetensors(d + "/model.safetensors", ts);
}

}  // namespace elastic::testing
