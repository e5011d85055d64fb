// Router files: safetensors, one F32 tensor per linear per layer, and metadata describing what it routes.
#include <climits>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "elastic/generate.h"
#include "elastic/json_file.h"
#include "elastic/router.h"
#include "elastic/safetensors.h"
#include "elastic/sparse_pattern.h"
#include "router/router_mlp.h"

namespace elastic {
namespace {

constexpr const char* kFormat = "elastic-router";
constexpr const char* kVersion = "1";

// Tensor names and shapes of one layer, in parameter layout order.
std::vector<std::pair<std::string, std::vector<int64_t>>> layer_tensors(int l, int d, int C) {
  const std::string p = "layers." + std::to_string(l) + ".";
  const int64_t d4 = 4 * d;
  return {{p + "task.fc1.weight", {d4, d}}, {p + "task.fc1.bias", {d4}},   {p + "task.fc2.weight", {d, d4}},
          {p + "task.fc2.bias", {d}},       {p + "router.fc1.weight", {d4, d}}, {p + "router.fc1.bias", {d4}},
          {p + "router.fc2.weight", {d, d4}}, {p + "router.fc2.bias", {d}}, {p + "router.fc3.weight", {C, d}},
          {p + "router.fc3.bias", {C}}};
}

// A metadata value quoted in an error, cut to a readable length.
std::string quoted(const std::string& v) { return "'" + (v.size() > 64 ? v.substr(0, 64) + "..." : v) + "'"; }

// An integer metadata value in [lo, hi]; the error names the file, the key and the range.
int meta_int(const std::map<std::string, std::string>& m, const std::string& key, const std::string& path, int lo,
             int hi) {
  auto it = m.find(key);
  if (it == m.end()) throw std::runtime_error(path + ": router metadata lacks '" + key + "'");
  long long v = 0;
  try {
    size_t used = 0;
    v = std::stoll(it->second, &used);
    if (used != it->second.size()) throw std::invalid_argument("trailing");
  } catch (const std::exception&) {  // stoll's own errors say only "stoll"
    throw std::runtime_error(path + ": router metadata '" + key + "' is not an integer: " + quoted(it->second));
  }
  if (v < lo || v > hi)
    throw std::runtime_error(path + ": router metadata '" + key + "' = " + std::to_string(v) + " is out of range (" +
                             std::to_string(lo) + " to " + std::to_string(hi) + ")");
  return static_cast<int>(v);
}

std::string meta_str(const std::map<std::string, std::string>& m, const std::string& key, const std::string& path) {
  auto it = m.find(key);
  if (it == m.end()) throw std::runtime_error(path + ": router metadata lacks '" + key + "'");
  return it->second;
}

}  // namespace

void Router::save(const std::string& path) const {
  const int d = spec.head_dim, C = spec.classes();
  std::vector<F32Tensor> ts;
  for (int l = 0; l < spec.n_layers; ++l) {
    const float* p = layer(l);
    for (auto& [name, shape] : layer_tensors(l, d, C)) {
      int64_t n = 1;
      for (int64_t s : shape) n *= s;
      ts.push_back({name, shape, std::vector<float>(p, p + n)});
      p += n;
    }
  }
  nlohmann::json targets(spec.targets);
  const nlohmann::json sparse = sparse_settings_to_json(spec.sparse);
  std::map<std::string, std::string> meta = {
      {"format", kFormat},
      {"version", kVersion},
      {"base_model", spec.base_model},
      {"n_layers", std::to_string(spec.n_layers)},
      {"n_kv_heads", std::to_string(spec.n_kv_heads)},
      {"head_dim", std::to_string(spec.head_dim)},
      {"pool_first", std::to_string(spec.pool_first)},
      {"pool_last", std::to_string(spec.pool_last)},
      {"gate", spec.sigmoid ? "sigmoid" : "softmax"},
      {"input", router_input_name(spec.input)},
      {"dense_mode", head_mode_name(spec.dense_mode)},
      {"sparse_mode", head_mode_name(spec.sparse_mode)},
      {"sparse", dump_json(sparse)},
      {"targets", dump_json(targets)},
  };
  write_safetensors_f32(path, ts, meta);
}

Router Router::load(const std::string& path, const ModelConfig& model) {
  SafeTensors st = SafeTensors::open(path);
  const auto& m = st.metadata();
  if (meta_str(m, "format", path) != kFormat)
    throw std::runtime_error(path + ": not an Elastic router file (format '" + meta_str(m, "format", path) + "')");
  if (meta_str(m, "version", path) != kVersion)
    throw std::runtime_error(path + ": router file version " + meta_str(m, "version", path) + ", this build reads " +
                             kVersion);
  Router r;
  RouterSpec& s = r.spec;
  // Sizes match the model below; windows and sparse settings are token counts, at most the engine's context.
  s.n_layers = meta_int(m, "n_layers", path, 1, INT_MAX);
  s.n_kv_heads = meta_int(m, "n_kv_heads", path, 1, INT_MAX);
  s.head_dim = meta_int(m, "head_dim", path, 1, INT_MAX);
  s.pool_first = meta_int(m, "pool_first", path, 0, kMaxContext);
  s.pool_last = meta_int(m, "pool_last", path, 0, kMaxContext);
  s.base_model = meta_str(m, "base_model", path);
  const std::string gate = meta_str(m, "gate", path);
  if (gate != "softmax" && gate != "sigmoid") throw std::runtime_error(path + ": unknown router gate '" + gate + "'");
  s.sigmoid = gate == "sigmoid";
  try {
    const std::string sparse_mode = meta_str(m, "sparse_mode", path);
    try {
      s.sparse_mode = parse_head_mode(sparse_mode);
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(path + ": router metadata 'sparse_mode': " + e.what());
    }
    // Files written before the learned-static control had no input: they read pooled keys.
    if (m.count("input")) {
      try {
        s.input = parse_router_input(m.at("input"));
      } catch (const std::invalid_argument& e) {
        throw std::runtime_error(path + ": router metadata 'input': " + e.what());
      }
    }
    // Files written before the configurations had no dense_mode: their dense class is full attention.
    if (m.count("dense_mode")) {
      try {
        s.dense_mode = parse_head_mode(m.at("dense_mode"));
      } catch (const std::runtime_error& e) {
        throw std::runtime_error(path + ": router metadata 'dense_mode': " + e.what());
      }
    }
    const nlohmann::json sp = parse_json_text(meta_str(m, "sparse", path), path + ": router metadata 'sparse'");
    // Every field required: router files always write them all (sparse_pattern.h: one reader for routing files too).
    s.sparse = sparse_settings_from_json(sp, path + ": router metadata 'sparse'", true);
    const nlohmann::json targets = parse_json_text(meta_str(m, "targets", path), path + ": router metadata 'targets'");
    if (!targets.is_object()) throw std::runtime_error(path + ": router metadata 'targets' is not a JSON object");
    for (auto& [k, v] : targets.items()) {
      if (!v.is_number()) throw std::runtime_error(path + ": router target for '" + k + "' is not a number");
      s.targets[k] = v.get<double>();
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": malformed router metadata: " + e.what());
  }
  validate_router_spec(s, path);  // the one home of the router's shape and pooling-window rules
  validate_sparse(s.sparse, path);
  // The router must match the backbone it routes.
  if (s.n_layers != model.n_layers || s.n_kv_heads != model.n_kv_heads || s.head_dim != model.head_dim)
    throw std::runtime_error(path + ": router is for " + std::to_string(s.n_layers) + " layers x " +
                             std::to_string(s.n_kv_heads) + " KV heads x head_dim " + std::to_string(s.head_dim) +
                             ", the model has " + std::to_string(model.n_layers) + " x " +
                             std::to_string(model.n_kv_heads) + " x " + std::to_string(model.head_dim));
  if (s.base_model != model_fingerprint(model))
    throw std::runtime_error(path + ": router was trained for model '" + s.base_model + "', this model is '" +
                             model_fingerprint(model) + "'");
  r.params.resize(r.layer_size() * s.n_layers);
  for (int l = 0; l < s.n_layers; ++l) {
    float* p = r.layer(l);
    for (auto& [name, shape] : layer_tensors(l, s.head_dim, s.classes())) {
      const TensorView& t = st.require(name, shape);
      to_f32(t, p);
      p += t.numel();
    }
  }
  return r;
}

}  // namespace elastic
