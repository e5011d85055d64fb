#include "elastic/npy.h"

#include <cstring>
#include <fstream>
#include <limits>
#include <regex>
#include <stdexcept>

namespace elastic {
namespace {

struct NpyHeader {
  std::string descr;
  std::vector<int64_t> shape;
  size_t data_offset = 0;
};

NpyHeader parse_header(const std::string& path, const std::string& buf) {
  if (buf.size() < 10 || std::memcmp(buf.data(), "\x93NUMPY", 6) != 0)
    throw std::runtime_error(path + ": not a .npy file (bad magic)");
  int major = static_cast<unsigned char>(buf[6]);
  size_t hlen, hstart;
  if (major == 1) {
    hlen = static_cast<unsigned char>(buf[8]) | (static_cast<unsigned char>(buf[9]) << 8);
    hstart = 10;
  } else if (major == 2 || major == 3) {
    if (buf.size() < 12) throw std::runtime_error(path + ": truncated .npy header");
    hlen = 0;
    for (int i = 0; i < 4; ++i) hlen |= static_cast<size_t>(static_cast<unsigned char>(buf[8 + i])) << (8 * i);
    hstart = 12;
  } else {
    throw std::runtime_error(path + ": unsupported .npy version " + std::to_string(major));
  }
  if (hstart + hlen > buf.size()) throw std::runtime_error(path + ": truncated .npy header");
  std::string h = buf.substr(hstart, hlen);
  NpyHeader out;
  out.data_offset = hstart + hlen;
  std::smatch m;
  if (!std::regex_search(h, m, std::regex("'descr':\\s*'([^']*)'"))) throw std::runtime_error(path + ": .npy header has no descr");
  out.descr = m[1];
  if (std::regex_search(h, m, std::regex("'fortran_order':\\s*True"))) throw std::runtime_error(path + ": Fortran-order arrays are not supported");
  if (!std::regex_search(h, m, std::regex("'shape':\\s*\\(([^)]*)\\)"))) throw std::runtime_error(path + ": .npy header has no shape");
  std::string dims = m[1];
  std::regex num("(\\d+)");
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), num); it != std::sregex_iterator(); ++it)
    out.shape.push_back(std::stoll((*it)[1]));
  return out;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open");
  return std::string(std::istreambuf_iterator<char>(f), {});
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

void write_npy(const std::string& path, const char* descr, const void* data, size_t elem, const std::vector<int64_t>& shape) {
  std::string sh = "(";
  for (size_t i = 0; i < shape.size(); ++i) sh += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
  sh += ")";
  std::string h = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + sh + ", }";
  size_t total = 10 + h.size() + 1;
  h.append((64 - total % 64) % 64, ' ');
  h += '\n';
  std::ofstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot write");
  f.write("\x93NUMPY\x01\x00", 8);
  uint16_t hl = static_cast<uint16_t>(h.size());
  f.put(static_cast<char>(hl & 0xff));
  f.put(static_cast<char>(hl >> 8));
  f.write(h.data(), h.size());
  f.write(static_cast<const char*>(data), numel(shape) * elem);
  if (!f) throw std::runtime_error(path + ": write failed");
}

}  // namespace

std::vector<int32_t> read_npy_ids(const std::string& path) {
  std::string buf = slurp(path);
  NpyHeader h = parse_header(path, buf);
  if (h.shape.size() != 1) throw std::runtime_error(path + ": token ids must be a 1-D array, got " + std::to_string(h.shape.size()) + "-D");
  size_t n = h.shape[0];
  size_t esz = (h.descr == "<i4") ? 4 : (h.descr == "<i8") ? 8 : 0;
  if (!esz) throw std::runtime_error(path + ": token ids must be int32 or int64, got dtype '" + h.descr + "'");
  if (buf.size() < h.data_offset + n * esz) throw std::runtime_error(path + ": truncated data");
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; ++i) {
    if (esz == 4) std::memcpy(&ids[i], buf.data() + h.data_offset + 4 * i, 4);
    else {
      int64_t v;
      std::memcpy(&v, buf.data() + h.data_offset + 8 * i, 8);
      if (v < 0 || v > std::numeric_limits<int32_t>::max()) throw std::runtime_error(path + ": token id out of range at index " + std::to_string(i));
      ids[i] = static_cast<int32_t>(v);
    }
  }
  return ids;
}

std::vector<float> read_npy_f32(const std::string& path, std::vector<int64_t>* shape) {
  std::string buf = slurp(path);
  NpyHeader h = parse_header(path, buf);
  if (h.descr != "<f4") throw std::runtime_error(path + ": expected float32, got '" + h.descr + "'");
  size_t n = numel(h.shape);
  if (buf.size() < h.data_offset + n * 4) throw std::runtime_error(path + ": truncated data");
  std::vector<float> v(n);
  std::memcpy(v.data(), buf.data() + h.data_offset, n * 4);
  if (shape) *shape = h.shape;
  return v;
}

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  write_npy(path, "<f4", data, 4, shape);
}
void write_npy_i32(const std::string& path, const std::vector<int32_t>& data) {
  write_npy(path, "<i4", data.data(), 4, {static_cast<int64_t>(data.size())});
}

}  // namespace elastic
