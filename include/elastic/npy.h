#pragma once
// Minimal NumPy .npy reader/writer for token ids and logits (little-endian, C order).
#include <cstdint>
#include <string>
#include <vector>

namespace elastic {

// Reads a 1-D int32 or int64 array (int64 narrowed with a range check).
std::vector<int32_t> read_npy_ids(const std::string& path);
void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape);
void write_npy_i32(const std::string& path, const std::vector<int32_t>& data);
// Reads a float32 array of any shape (used by tests against fixtures).
std::vector<float> read_npy_f32(const std::string& path, std::vector<int64_t>* shape);

}  // namespace elastic
