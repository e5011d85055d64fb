#pragma once
// Small GGUF v3 writer (tests and tools): metadata of every value type plus F32 / F16 / Q8_0 / Q4_0 / Q4_1 tensors
// quantized by our own reference quantizers, or raw pre-encoded blocks of any type code.
#include <cstdint>
#include <string>
#include <vector>

#include "elastic/gguf.h"

namespace elastic::gguf {

// Quantizes n floats (n a multiple of the block size) to `t`'s blocks. Supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1.
// Round-trip error per element: F16/BF16 their rounding; Q8_0 <= ~0.5 * amax/127 (+ fp16 rounding of the scale);
// Q4_0 <= amax/8 (the side opposite the extreme value may clamp at 15); Q4_1 <= ~0.5 * (max-min)/15.
std::vector<uint8_t> quantize(GgmlType t, const float* x, int64_t n);

class Writer {
 public:
  void set(const std::string& key, Value v);  // any value (arrays included)
  void set_u32(const std::string& key, uint32_t v);
  void set_i32(const std::string& key, int32_t v);
  void set_u64(const std::string& key, uint64_t v);
  void set_f32(const std::string& key, float v);
  void set_bool(const std::string& key, bool v);
  void set_str(const std::string& key, const std::string& v);
  void set_str_array(const std::string& key, const std::vector<std::string>& v);
  void set_i32_array(const std::string& key, const std::vector<int32_t>& v);
  void set_f32_array(const std::string& key, const std::vector<float>& v);
  void set_alignment(uint32_t a);  // also writes general.alignment

  // dims innermost first (a [out, in] matrix is {in, out}); data has prod(dims) floats.
  void add_tensor(const std::string& name, std::vector<int64_t> dims, GgmlType t, const float* data);
  // Pre-encoded bytes with any type code (tests: unknown types, K-quant blocks made elsewhere).
  void add_raw(const std::string& name, std::vector<int64_t> dims, uint32_t type_code, std::vector<uint8_t> bytes);

  // Serializes to bytes / a file. `version` is written as is (tests write bad versions).
  std::vector<uint8_t> serialize(uint32_t version = 3) const;
  void write(const std::string& path, uint32_t version = 3) const;

 private:
  struct T {
    std::string name;
    std::vector<int64_t> dims;
    uint32_t type;
    std::vector<uint8_t> bytes;
  };
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<T> tensors_;
  uint32_t alignment_ = 32;
};

}  // namespace elastic::gguf
