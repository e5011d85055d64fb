#pragma once
// GGUF (llama.cpp / ggml model file, versions 2 and 3) reader: memory-mapped, validated at open.
//
// Layout: "GGUF" u32 version, u64 n_tensors, u64 n_kv, then n_kv (key, value) pairs, n_tensors tensor infos
// (name, n_dims, dims ne[0..] innermost first, ggml type, offset), padding to `alignment`, then tensor data.
// A [out, in] matrix is stored with ne = {in, out}, rows contiguous: the HF layout.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace elastic::gguf {

// ggml tensor types (numbering of ggml.h). Only the ones listed in `supported` can be dequantized.
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, BF16 = 30,
};
const char* type_name(GgmlType t);  // "Q4_K", or "type#N" for numbers we do not know
bool type_supported(GgmlType t);    // F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q4_K Q6_K
int64_t block_elems(GgmlType t);    // elements per block (1 for float types); supported types only
size_t block_bytes(GgmlType t);     // bytes per block; supported types only

// Dequantizes n elements (n a multiple of block_elems) from src to fp32.
void dequantize_row(GgmlType t, const uint8_t* src, float* dst, int64_t n);
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);  // round to nearest even
float bf16_to_fp32(uint16_t h);

// Metadata value types (gguf_type numbering).
enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STRING = 8, ARRAY = 9,
  U64 = 10, I64 = 11, F64 = 12,
};
const char* value_type_name(ValueType t);

struct Value {
  ValueType type = ValueType::U8;
  // Scalars: integers in i (signed) / u (unsigned, also bools), floats in f. Strings in s.
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  std::string s;
  // Arrays: element type, and the elements by kind (numbers widened, both i/u and f filled for numbers).
  ValueType elem = ValueType::U8;
  std::vector<std::string> strs;  // STRING arrays
  std::vector<int64_t> ints;      // integer / bool arrays
  std::vector<double> nums;       // every numeric array, as double
  std::vector<Value> arrays;      // arrays of arrays (rare; kept for completeness)
  size_t size() const;            // array length
  bool is_integer() const;        // scalar integer or bool
  bool is_float() const;
};

struct TensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // ne[0] first (innermost, contiguous)
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;        // from the start of the data section
  int64_t n_elements = 0;
  size_t n_bytes = 0;
  const uint8_t* data = nullptr;  // into the mapping
  int64_t rows() const { return n_elements / dims[0]; }
};

// Opens and validates a GGUF file. Every problem throws std::runtime_error("gguf: <path>: <problem>").
class File {
 public:
  static File open(const std::string& path);
  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }
  size_t data_offset() const { return data_offset_; }  // file offset of the data section
  const std::map<std::string, Value>& metadata() const { return kv_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

  const Value* find(const std::string& key) const;  // nullptr when absent
  const TensorInfo* find_tensor(const std::string& name) const;
  // Typed getters: throw naming the file and key when missing or of the wrong type.
  std::string get_string(const std::string& key) const;
  int64_t get_int(const std::string& key) const;  // any integer type
  double get_float(const std::string& key) const;  // F32/F64 (integers accepted too)
  const Value& get_array(const std::string& key, ValueType elem) const;
  const TensorInfo& tensor(const std::string& name) const;
  // Tensor widened to fp32 (OpenMP over rows).
  std::vector<float> dequantize(const TensorInfo& t) const;
  // Gives the pages of t's bytes back to the kernel (madvise MADV_DONTNEED on the read-only mapping: touched again,
  // they are read from the file again). A loader that has widened a tensor calls it, so the file's pages and the
  // fp32 copies are not resident together.
  void release(const TensorInfo& t) const;

  [[noreturn]] void fail(const std::string& what) const;

 private:
  File() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  size_t data_offset_ = 0;
  std::map<std::string, Value> kv_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace elastic::gguf
