#include <cstring>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "elastic/json_file.h"
#include "elastic/output_file.h"
#include "elastic/safetensors.h"

namespace elastic {

void write_safetensors_f32(const std::string& path, const std::vector<F32Tensor>& tensors,
                           const std::map<std::string, std::string>& metadata) {
  nlohmann::json h = nlohmann::json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const F32Tensor& t : tensors) {
    int64_t n = 1;
    for (int64_t s : t.shape) n *= s;
    if (n != static_cast<int64_t>(t.data.size()))
      throw std::invalid_argument(path + ": tensor '" + t.name + "' has " + std::to_string(t.data.size()) +
                                  " values for its shape's " + std::to_string(n));
    const uint64_t bytes = t.data.size() * sizeof(float);
    h[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  std::string hs = dump_json(h);
  hs.append((8 - hs.size() % 8) % 8, ' ');  // keep the data 8-byte aligned, as the format recommends
  OutputFile f(path, "safetensors file");
  const uint64_t hl = hs.size();
  f.write(&hl, 8);
  f.write(hs);
  for (const F32Tensor& t : tensors) f.write(t.data.data(), t.data.size() * sizeof(float));
  f.close();
}

}  // namespace elastic
