#include "elastic/weight_matrix.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "elastic/gguf.h"

namespace elastic {

namespace {

gguf::GgmlType ggml_type(WeightFormat f) {
  switch (f) {
    case WeightFormat::F32: return gguf::GgmlType::F32;
    case WeightFormat::Q8_0: return gguf::GgmlType::Q8_0;
    case WeightFormat::Q4_0: return gguf::GgmlType::Q4_0;
    case WeightFormat::Q4_1: return gguf::GgmlType::Q4_1;
  }
  throw std::logic_error("WeightMatrix: unknown format");
}

}  // namespace

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::F32: return "F32";
    case WeightFormat::Q8_0: return "Q8_0";
    case WeightFormat::Q4_0: return "Q4_0";
    case WeightFormat::Q4_1: return "Q4_1";
  }
  return "unknown";
}

size_t weight_block_bytes(WeightFormat f) {
  switch (f) {
    case WeightFormat::F32: return 4 * kWeightBlock;
    case WeightFormat::Q8_0: return 34;
    case WeightFormat::Q4_0: return 18;
    case WeightFormat::Q4_1: return 20;
  }
  throw std::logic_error("WeightMatrix: unknown format");
}

WeightMatrix WeightMatrix::from_f32(std::vector<float> values, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0 || values.size() != static_cast<size_t>(rows) * static_cast<size_t>(cols))
    throw std::invalid_argument("WeightMatrix: " + std::to_string(values.size()) + " values for a " +
                                std::to_string(rows) + " x " + std::to_string(cols) + " matrix");
  WeightMatrix m;
  m.rows_ = values.empty() ? 0 : rows;
  m.cols_ = values.empty() ? 0 : cols;
  m.f32_ = std::move(values);
  return m;
}

WeightMatrix WeightMatrix::from_blocks(WeightFormat format, std::vector<uint8_t> bytes, int64_t rows, int64_t cols) {
  if (format == WeightFormat::F32) throw std::invalid_argument("WeightMatrix::from_blocks: F32 is not a block format");
  if (rows <= 0 || cols <= 0 || cols % kWeightBlock)
    throw std::invalid_argument(std::string("WeightMatrix: a ") + weight_format_name(format) + " matrix needs a column count that is a positive multiple of 32, got " +
                                std::to_string(rows) + " x " + std::to_string(cols));
  WeightMatrix m;
  m.format_ = format;
  m.rows_ = rows;
  m.cols_ = cols;
  if (bytes.size() != static_cast<size_t>(rows) * m.row_bytes())
    throw std::invalid_argument(std::string("WeightMatrix: ") + std::to_string(bytes.size()) + " bytes for a " +
                                std::to_string(rows) + " x " + std::to_string(cols) + " " +
                                weight_format_name(format) + " matrix");
  m.blocks_ = std::move(bytes);
  return m;
}

size_t WeightMatrix::row_bytes() const {
  return is_f32() ? static_cast<size_t>(cols_) * 4
                  : static_cast<size_t>(cols_ / kWeightBlock) * weight_block_bytes(format_);
}

size_t WeightMatrix::bytes() const { return is_f32() ? f32_.size() * 4 : blocks_.size(); }

const std::vector<float>& WeightMatrix::f32() const {
  if (!is_f32())
    throw std::logic_error(std::string("weight matrix is kept in ") + weight_format_name(format_) +
                           "; this path reads fp32 weights (widen the model's weights first)");
  return f32_;
}

std::vector<float>& WeightMatrix::f32() {
  return const_cast<std::vector<float>&>(static_cast<const WeightMatrix&>(*this).f32());
}

const uint8_t* WeightMatrix::row_data(int64_t r) const {
  return is_f32() ? reinterpret_cast<const uint8_t*>(f32_.data() + static_cast<size_t>(r) * cols_)
                  : blocks_.data() + static_cast<size_t>(r) * row_bytes();
}

void WeightMatrix::rows_to_f32(int64_t r0, int64_t n, float* out) const {
  if (r0 < 0 || n < 0 || r0 + n > rows_) throw std::out_of_range("WeightMatrix::rows_to_f32: rows out of range");
  const gguf::GgmlType t = ggml_type(format_);
#pragma omp parallel for schedule(static) if (n * cols_ > (1 << 16))
  for (int64_t i = 0; i < n; ++i)
    gguf::dequantize_row(t, row_data(r0 + i), out + static_cast<size_t>(i) * cols_, cols_);
}

std::vector<float> WeightMatrix::to_f32() const {
  if (is_f32()) return f32_;
  std::vector<float> v(static_cast<size_t>(rows_) * cols_);
  rows_to_f32(0, rows_, v.data());
  return v;
}

void WeightMatrix::widen() {
  if (is_f32()) return;
  f32_ = to_f32();
  blocks_ = {};
  format_ = WeightFormat::F32;
}

void WeightMatrix::permute_rows(const std::vector<int64_t>& src) {
  if (src.size() != static_cast<size_t>(rows_)) throw std::invalid_argument("WeightMatrix::permute_rows: wrong length");
  const size_t rb = row_bytes();
  std::vector<uint8_t> out(static_cast<size_t>(rows_) * rb);
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] < 0 || src[i] >= rows_) throw std::out_of_range("WeightMatrix::permute_rows: row out of range");
    const uint8_t* from = row_data(src[i]);
    std::copy(from, from + rb, out.data() + i * rb);
  }
  if (is_f32()) {
    std::copy(out.begin(), out.end(), reinterpret_cast<uint8_t*>(f32_.data()));
  } else {
    blocks_ = std::move(out);
  }
}

}  // namespace elastic
