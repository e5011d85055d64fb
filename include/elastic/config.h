#pragma once
// Model hyper-parameters read from a Hugging Face config.json (Qwen3ForCausalLM, LlamaForCausalLM).
#include <cstdint>
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

// Upper bounds on the sizes a model's metadata gives (config.json and GGUF alike), far above any released model
// (Llama-3.1-405B: hidden 16384, intermediate 53248, 126 layers, 128 heads; Gemma 3: vocabulary 262,144): the loaders
// allocate per layer and per token before the checkpoint's shapes can contradict the metadata, so an absurd value must
// stop at the metadata.
namespace config_limits {
constexpr long long kMaxWidth = 1 << 20;       // hidden_size, intermediate_size
constexpr long long kMaxLayers = 4096;         // num_hidden_layers
constexpr long long kMaxHeads = 4096;          // attention heads, KV heads, head_dim
constexpr long long kMaxVocab = 1 << 24;       // vocab_size
constexpr long long kMaxInt = (1LL << 31) - 1;  // positions and token ids: only an int
}  // namespace config_limits

// Throws std::runtime_error "<what> exceeds the model's context of N tokens" when n is more than c.max_positions (0:
// not known, anything passes). Past its positions RoPE runs on angles the model never trained on, so a run that would
// go there (a bench row, a prompt, a server's context) is refused before anything is sized for it.
void check_within_context(const ModelConfig& c, int64_t n, const std::string& what);

// Throws std::runtime_error naming `source` and the offending field.
ModelConfig parse_config(const nlohmann::json& j, const std::string& source);
ModelConfig load_config(const std::string& config_json_path);
const char* arch_name(Arch a);

}  // namespace elastic
