#pragma once
// A projection weight [rows, cols] (HF [out, in] layout, rows contiguous) in the form the CPU reads it: fp32, or one
// of ggml's 32-element block formats kept as the GGUF file stores it. Decode reads a block matrix in place and
// widens each block in registers (src/model/linear.cpp), so a token reads the file's bytes rather than fp32 copies:
// SmolLM2-135M Q4_1 holds 92 MB of weights where fp32 held 538 MB. Prefill widens one panel of rows at a time into
// a scratch buffer for sgemm. Every path widens with the formulas of gguf::dequantize_row, so a block matrix gives
// the same bits as its fp32 widening.
//
// The trainer and the GPU upload read fp32: `f32()` refuses a block matrix by name; `to_f32()` widens a copy and
// `widen()` converts in place.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace elastic {

// Q8_0 [fp16 d][int8 q[32]]: x = d*q. Q4_0 [fp16 d][u8 qs[16]]: x = d*(nibble-8). Q4_1 [fp16 d][fp16 m][u8 qs[16]]:
// x = fma(d, nibble, m). Nibbles: element j low nibble of qs[j], element j+16 high nibble (ggml's order).
enum class WeightFormat : uint8_t { F32, Q8_0, Q4_0, Q4_1 };
const char* weight_format_name(WeightFormat f);
constexpr int kWeightBlock = 32;          // elements per block of every block format
size_t weight_block_bytes(WeightFormat f);  // 34, 18, 20; 4 per element for F32 (returns 4 * kWeightBlock)

class WeightMatrix {
 public:
  WeightMatrix() = default;
  static WeightMatrix from_f32(std::vector<float> values, int64_t rows, int64_t cols);
  // `bytes` holds rows x (cols / 32) blocks of `format`; cols must be a multiple of 32.
  static WeightMatrix from_blocks(WeightFormat format, std::vector<uint8_t> bytes, int64_t rows, int64_t cols);

  WeightFormat format() const { return format_; }
  bool is_f32() const { return format_ == WeightFormat::F32; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  bool empty() const { return rows_ == 0; }
  size_t bytes() const;      // what it holds in memory
  size_t row_bytes() const;  // bytes of one row in its format

  // The fp32 values; throws std::logic_error naming the format for a block matrix (call widen() first).
  const std::vector<float>& f32() const;
  std::vector<float>& f32();
  // Row r's first byte in its format (block matrices) or its first float (F32), for the kernels.
  const uint8_t* row_data(int64_t r) const;
  // Rows [r0, r0 + n) widened to fp32 into out [n, cols].
  void rows_to_f32(int64_t r0, int64_t n, float* out) const;
  std::vector<float> to_f32() const;
  void widen();  // in place: the matrix becomes F32 with the same values
  // Reorders whole rows: row i of the result is row src[i] of this one (GGUF's Q/K head permutation).
  void permute_rows(const std::vector<int64_t>& src);

 private:
  WeightFormat format_ = WeightFormat::F32;
  int64_t rows_ = 0, cols_ = 0;
  std::vector<float> f32_;       // F32: [rows, cols]
  std::vector<uint8_t> blocks_;  // block formats: rows x row_bytes()
};

}  // namespace elastic
