#include "elastic/config.h"

#include <cmath>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "elastic/json_file.h"

namespace elastic {
namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw std::runtime_error(source + ": " + what);
}

using namespace config_limits;

int get_int(const json& j, const char* key, const std::string& src, long long max, bool required = true,
            int dflt = 0) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) fail(src, std::string("missing required field '") + key + "'");
    return dflt;
  }
  if (!it->is_number_integer()) fail(src, std::string("field '") + key + "' must be an integer");
  // An unsigned number above 2^63 reads as negative through long long: compare it unsigned.
  if (it->is_number_unsigned() && it->get<unsigned long long>() > static_cast<unsigned long long>(max))
    fail(src, std::string("field '") + key + "' out of range: " + it->dump() + " (at most " + std::to_string(max) + ")");
  long long v = it->get<long long>();
  if (v <= 0 || v > max)
    fail(src, std::string("field '") + key + "' out of range: " + std::to_string(v) + " (1 to " + std::to_string(max) +
                  ")");
  return static_cast<int>(v);
}

double get_num(const json& j, const char* key, const std::string& src, double dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_number()) fail(src, std::string("field '") + key + "' must be a number");
  const double v = it->get<double>();
  // JSON has no inf, but 1e400 parses as one.
  if (!std::isfinite(v)) fail(src, std::string("field '") + key + "' must be a finite number, got " + it->dump());
  return v;
}

// eos_token_id: one id or a list; an id must be a non-negative int.
void parse_eos(const json& e, std::vector<int>& ids, const std::string& src) {
  if (!e.is_number_integer()) return;  // a null or a stray non-integer entry is not an id (as before)
  if (e.is_number_unsigned() ? e.get<unsigned long long>() > static_cast<unsigned long long>(kMaxInt)
                             : (e.get<long long>() < 0 || e.get<long long>() > kMaxInt))
    fail(src, "eos_token_id " + e.dump() + " is out of range (0 to " + std::to_string(kMaxInt) + ")");
  ids.push_back(static_cast<int>(e.get<long long>()));
}

// json::value() would throw a bare library type_error for a field of another type: check it and name the field.
std::string get_str(const json& j, const char* key, const std::string& src, const std::string& dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_string()) fail(src, std::string("field '") + key + "' must be a string, got " + it->dump());
  return it->get<std::string>();
}

bool get_bool(const json& j, const char* key, const std::string& src, bool dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) fail(src, std::string("field '") + key + "' must be true or false");
  return it->get<bool>();
}

void parse_rope_scaling(const json& rs, RopeConfig& rope, const std::string& src) {
  if (rs.is_null()) return;
  if (!rs.is_object()) fail(src, "rope_scaling must be an object or null");
  const std::string type = get_str(rs, "rope_type", src, get_str(rs, "type", src, "default"));
  if (type == "default") return;
  if (type != "llama3")
    fail(src, "unsupported rope_scaling type '" + type + "' (supported: default, llama3)");
  rope.llama3 = true;
  rope.factor = get_num(rs, "factor", src, 8.0);
  rope.low_freq_factor = get_num(rs, "low_freq_factor", src, 1.0);
  rope.high_freq_factor = get_num(rs, "high_freq_factor", src, 4.0);
  rope.original_max_positions = get_int(rs, "original_max_position_embeddings", src, kMaxInt, false, 8192);
  if (rope.factor <= 0 || rope.low_freq_factor <= 0 || rope.high_freq_factor <= rope.low_freq_factor)
    fail(src, "rope_scaling llama3 needs factor > 0 and high_freq_factor > low_freq_factor > 0");
}

}  // namespace

const char* arch_name(Arch a) { return a == Arch::Qwen3 ? "Qwen3ForCausalLM" : "LlamaForCausalLM"; }

ModelConfig parse_config(const json& j, const std::string& src) {
  if (!j.is_object()) fail(src, "config must be a JSON object");
  ModelConfig c;
  std::string arch;
  if (auto it = j.find("architectures"); it != j.end() && it->is_array() && !it->empty() && (*it)[0].is_string())
    arch = (*it)[0].get<std::string>();
  else
    fail(src, "missing 'architectures' (expected [\"Qwen3ForCausalLM\"] or [\"LlamaForCausalLM\"])");
  if (arch == "Qwen3ForCausalLM") {
    c.arch = Arch::Qwen3;
    c.qk_norm = true;
  } else if (arch == "LlamaForCausalLM") {
    c.arch = Arch::Llama;
  } else {
    fail(src, "unknown architecture '" + arch + "' (supported: Qwen3ForCausalLM, LlamaForCausalLM)");
  }
  c.hidden = get_int(j, "hidden_size", src, kMaxWidth);
  c.n_layers = get_int(j, "num_hidden_layers", src, kMaxLayers);
  c.n_heads = get_int(j, "num_attention_heads", src, kMaxHeads);
  c.n_kv_heads = get_int(j, "num_key_value_heads", src, kMaxHeads, false, c.n_heads);
  c.head_dim = get_int(j, "head_dim", src, kMaxHeads, false, 0);
  if (c.head_dim == 0) {
    if (c.hidden % c.n_heads) fail(src, "hidden_size not divisible by num_attention_heads and no head_dim given");
    c.head_dim = c.hidden / c.n_heads;
  }
  if (c.head_dim % 2) fail(src, "head_dim must be even for RoPE, got " + std::to_string(c.head_dim));
  if (c.n_heads % c.n_kv_heads)
    fail(src, "num_attention_heads (" + std::to_string(c.n_heads) + ") not a multiple of num_key_value_heads (" +
                  std::to_string(c.n_kv_heads) + ")");
  c.intermediate = get_int(j, "intermediate_size", src, kMaxWidth);
  c.vocab = get_int(j, "vocab_size", src, kMaxVocab);
  c.max_positions = get_int(j, "max_position_embeddings", src, kMaxInt, false, 32768);
  const double eps = get_num(j, "rms_norm_eps", src, 1e-6);
  // Checked before the narrowing to float (a double beyond float's range does not convert); real values are 1e-5.
  if (!(eps >= 0 && eps <= 1)) fail(src, "rms_norm_eps must be in [0, 1], got " + std::to_string(eps));
  c.rms_eps = static_cast<float>(eps);
  c.tie_embeddings = get_bool(j, "tie_word_embeddings", src, false);
  c.attention_bias = get_bool(j, "attention_bias", src, false);
  if (get_bool(j, "mlp_bias", src, false)) fail(src, "unsupported field: mlp_bias = true");
  const std::string act = get_str(j, "hidden_act", src, "silu");
  if (act != "silu") fail(src, "unsupported hidden_act '" + act + "' (only silu)");
  if (get_bool(j, "use_sliding_window", src, false)) fail(src, "unsupported field: use_sliding_window = true");

  // rope_theta sits at the top level (transformers <5) or inside rope_parameters (transformers >=5).
  c.rope.theta = get_num(j, "rope_theta", src, 10000.0);
  if (auto it = j.find("rope_parameters"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) fail(src, "rope_parameters must be an object");
    c.rope.theta = get_num(*it, "rope_theta", src, c.rope.theta);
    parse_rope_scaling(*it, c.rope, src);
  }
  if (auto it = j.find("rope_scaling"); it != j.end()) parse_rope_scaling(*it, c.rope, src);
  if (c.rope.theta <= 0) fail(src, "rope_theta must be positive");

  if (auto it = j.find("eos_token_id"); it != j.end()) {
    if (it->is_array())
      for (auto& e : *it) parse_eos(e, c.eos_ids, src);
    else
      parse_eos(*it, c.eos_ids, src);
  }
  return c;
}

void check_within_context(const ModelConfig& c, int64_t n, const std::string& what) {
  if (c.max_positions > 0 && n > c.max_positions)
    throw std::runtime_error(what + " exceeds the model's context of " + std::to_string(c.max_positions) + " tokens");
}

ModelConfig load_config(const std::string& path) {
  return parse_config(read_json_file(path, "config file"), path);
}

}  // namespace elastic
