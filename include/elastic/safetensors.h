#pragma once
// Memory-mapped, validated safetensors reader: single file or sharded (model.safetensors.index.json).
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace elastic {

enum class DType { F32, F16, BF16 };
const char* dtype_name(DType d);
size_t dtype_size(DType d);

struct TensorView {
  std::string name;
  std::string file;             // which file holds it, for error messages
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // inside the mapping; valid while the SafeTensors lives
  size_t nbytes = 0;
  int64_t numel() const;
};

class MappedFile;

class SafeTensors {
 public:
  // `path` is a .safetensors file or a model folder (model.safetensors or the sharded index).
  // Every header is validated at open; errors name the file and tensor.
  static SafeTensors open(const std::string& path);
  SafeTensors(SafeTensors&&) noexcept;
  SafeTensors& operator=(SafeTensors&&) noexcept;
  ~SafeTensors();

  const TensorView* find(const std::string& name) const;  // nullptr if absent
  // Throws unless present with exactly `shape`; names file and tensor.
  const TensorView& require(const std::string& name, const std::vector<int64_t>& shape) const;
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  // The header's "__metadata__" string map (merged over shards).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafeTensors() = default;
  void add_file(const std::string& path);
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes F32 tensors and a metadata map as one .safetensors file (tensors in the given order).
struct F32Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};
void write_safetensors_f32(const std::string& path, const std::vector<F32Tensor>& tensors,
                           const std::map<std::string, std::string>& metadata = {});

// Widen any supported dtype to fp32.
void to_f32(const TensorView& t, float* dst);
std::vector<float> to_f32(const TensorView& t);

float bf16_to_f32(uint16_t v);
float f16_to_f32(uint16_t v);

}  // namespace elastic
