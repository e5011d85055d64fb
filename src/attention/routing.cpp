#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "elastic/json_file.h"
#include "elastic/output_file.h"

#include "elastic/attention.h"
#include "elastic/sparse_pattern.h"

namespace elastic {

using nlohmann::json;

const char* head_mode_name(HeadMode m) { return sparse_pattern(m).name; }

HeadMode parse_head_mode(const std::string& s) { return pattern_by_name(s); }

RoutingTable RoutingTable::uniform(int n_layers, int n_kv_heads, HeadMode m) {
  RoutingTable r;
  r.n_layers = n_layers;
  r.n_kv_heads = n_kv_heads;
  r.mode.assign(static_cast<size_t>(n_layers) * n_kv_heads, m);
  return r;
}

double RoutingTable::msr() const {
  if (mode.empty()) return 0;
  size_t sparse = 0;
  for (auto m : mode) sparse += m != HeadMode::Full;
  return static_cast<double>(sparse) / mode.size();
}

void validate_sparse(const SparseSettings& s, const std::string& src) {
  if (s.block != 64 && s.block != 128) throw std::runtime_error(src + ": block_size must be 64 or 128, got " + std::to_string(s.block));
  const std::string max = std::to_string(kMaxSparseWindow);
  if (s.sink < 0 || s.sink > kMaxSparseWindow)
    throw std::runtime_error(src + ": sink " + std::to_string(s.sink) + " must be in [0, " + max + "]");
  if (s.local < 1 || s.local > kMaxSparseWindow)
    throw std::runtime_error(src + ": local " + std::to_string(s.local) + " must be in [1, " + max + "]");
  if (s.xattn.stride < 1 || s.block % s.xattn.stride)
    throw std::runtime_error(src + ": xattn stride " + std::to_string(s.xattn.stride) + " must divide block_size " + std::to_string(s.block));
  if (!(s.xattn.tau > 0.f && s.xattn.tau <= 1.f)) throw std::runtime_error(src + ": xattn tau must be in (0, 1]");
}

RoutingTable load_routing(const std::string& path, int n_layers, int n_kv_heads) {
  const json j = read_json_file(path, "routing file");
  RoutingTable r = RoutingTable::all_full(n_layers, n_kv_heads);
  if (!j.is_object()) throw std::runtime_error(path + ": a routing file must be a JSON object");
  r.sparse = sparse_settings_from_json(j, path);  // each pattern's fields, from its own file
  if (!j.contains("layers") || !j["layers"].is_array()) throw std::runtime_error(path + ": missing 'layers' (one list of KV-head modes per layer)");
  const json& L = j["layers"];
  if (static_cast<int>(L.size()) != n_layers)
    throw std::runtime_error(path + ": has " + std::to_string(L.size()) + " layers, the model has " + std::to_string(n_layers));
  for (int l = 0; l < n_layers; ++l) {
    if (!L[l].is_array() || static_cast<int>(L[l].size()) != n_kv_heads)
      throw std::runtime_error(path + ": layer " + std::to_string(l) + " must list " + std::to_string(n_kv_heads) + " KV-head modes");
    for (int h = 0; h < n_kv_heads; ++h) {
      if (!L[l][h].is_string()) throw std::runtime_error(path + ": layer " + std::to_string(l) + " head " + std::to_string(h) + ": mode must be a string");
      try {
        r.mode[static_cast<size_t>(l) * n_kv_heads + h] = parse_head_mode(L[l][h].get<std::string>());
      } catch (const std::runtime_error& e) {
        throw std::runtime_error(path + ": layer " + std::to_string(l) + " head " + std::to_string(h) + ": " + e.what());
      }
    }
  }
  return r;
}

void save_routing(const RoutingTable& r, const std::string& path) {
  json j = sparse_settings_to_json(r.sparse);
  j["layers"] = json::array();
  for (int l = 0; l < r.n_layers; ++l) {
    json row = json::array();
    for (int h = 0; h < r.n_kv_heads; ++h) row.push_back(head_mode_name(r.at(l, h)));
    j["layers"].push_back(row);
  }
  write_text_file(path, dump_json(j, 1) + "\n", "routing file");
}

}  // namespace elastic
