#pragma once
// Test helper: writes small safetensors files (optionally corrupted) into a temp folder.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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
  auto p = std::filesystem::temp_directory_path() / ("elastic_test_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

}  // namespace elastic::testing
