// Sparse-pattern parameters as JSON: block_size here, every other field in its pattern's file (read_params /
// write_params), so routing files and router metadata read and write them through one function.
#include <nlohmann/json.hpp>

#include "elastic/sparse_pattern.h"

namespace elastic {

using nlohmann::json;

int sparse_int_field(const json& j, const char* key, int def, const std::string& src, const std::string& name,
                     bool required) {
  const std::string quoted = "'" + name + "'";
  if (!j.is_object() || !j.contains(key)) {
    if (required) throw std::runtime_error(src + ": missing " + quoted);
    return def;
  }
  const json& v = j[key];
  if (!v.is_number_integer()) throw std::runtime_error(src + ": " + quoted + " must be an integer, got " + v.dump());
  if (v.is_number_unsigned() ? v.get<uint64_t>() > kMaxSparseWindow
                             : v.get<int64_t>() < -kMaxSparseWindow || v.get<int64_t>() > kMaxSparseWindow)
    throw std::runtime_error(src + ": " + quoted + " " + v.dump() + " is out of range (at most " +
                             std::to_string(kMaxSparseWindow) + ")");
  return static_cast<int>(v.get<int64_t>());
}

SparseSettings sparse_settings_from_json(const json& j, const std::string& src, bool required) {
  if (!j.is_object()) throw std::runtime_error(src + ": sparse settings must be a JSON object");
  SparseSettings s;
  s.block = sparse_int_field(j, "block_size", 64, src, "block_size", required);
  for (int m = 0; m < n_sparse_patterns(); ++m) {
    const SparsePattern& p = sparse_pattern(static_cast<HeadMode>(m));
    if (p.read_params) p.read_params(j, s, src, required);
  }
  s.xattn.block = s.block;
  validate_sparse(s, src);
  return s;
}

json sparse_settings_to_json(const SparseSettings& s) {
  json j = {{"block_size", s.block}};
  for (int m = 0; m < n_sparse_patterns(); ++m) {
    const SparsePattern& p = sparse_pattern(static_cast<HeadMode>(m));
    if (p.write_params) p.write_params(s, j);
  }
  return j;
}

}  // namespace elastic
