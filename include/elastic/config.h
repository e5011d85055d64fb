#pragma once
// Model hyper-parameters read from a Hugging Face config.json (Qwen3ForCausalLM, LlamaForCausalLM).
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace elastic {

enum class Arch { Qwen3, Llama };

struct RopeConfig {
  double theta = 10000.0;
  bool llama3 = false;             // rope_scaling.rope_type == "llama3"
  double factor = 1.0;             // llama3 scaling parameters
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_positions = 8192;
};

struct ModelConfig {
  Arch arch = Arch::Qwen3;
  int hidden = 0;         // D
  int n_layers = 0;       // L
  int n_heads = 0;        // Hq
  int n_kv_heads = 0;     // Hkv (GQA: Hq % Hkv == 0)
  int head_dim = 0;       // hd (Qwen3: not D / Hq)
  int intermediate = 0;   // F
  int vocab = 0;          // V
  int max_positions = 0;
  float rms_eps = 1e-6f;
  RopeConfig rope;
  bool tie_embeddings = false;
  bool attention_bias = false;
  bool qk_norm = false;   // Qwen3 normalizes q and k per head before RoPE
  std::vector<int> eos_ids;
};

// Throws std::runtime_error naming `source` and the offending field.
ModelConfig parse_config(const nlohmann::json& j, const std::string& source);
ModelConfig load_config(const std::string& config_json_path);
const char* arch_name(Arch a);

}  // namespace elastic
