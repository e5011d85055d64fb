#include "elastic/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "elastic/json_file.h"

namespace elastic {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The format's own limit on the JSON header (the safetensors crate refuses longer ones).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// More dimensions than any tensor has; keeps a hostile shape from being a long array.
constexpr size_t kMaxDims = 16;

}  // namespace

const char* dtype_name(DType d) {
  switch (d) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
  }
  return "?";
}
size_t dtype_size(DType d) { return d == DType::F32 ? 4 : 2; }

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

class MappedFile {
 public:
  explicit MappedFile(const std::string& path) : path_(path) {
    // O_NONBLOCK: a FIFO opens at once and is refused below instead of blocking in open() (no effect on a regular
    // file, which is memory-mapped).
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) throw std::runtime_error(path + ": cannot open (" + std::strerror(errno) + ")");
    // A throwing constructor runs no destructor: close the descriptor before every error.
    auto fail = [&](const std::string& what) {
      release();
      throw std::runtime_error(path + ": " + what);
    };
    struct stat st{};
    if (fstat(fd_, &st) != 0) fail(std::string("cannot stat (") + std::strerror(errno) + ")");
    // mmap of a directory or device fails with a bare "No such device"; say what the path is instead.
    if (S_ISDIR(st.st_mode)) fail("is a directory, not a safetensors file");
    if (!S_ISREG(st.st_mode)) fail("not a regular file (a safetensors file is memory-mapped)");
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
      void* p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
      if (p == MAP_FAILED) fail(std::string("mmap failed (") + std::strerror(errno) + ")");
      data_ = static_cast<const uint8_t*>(p);
    }
  }
  ~MappedFile() { release(); }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void release() {
    if (data_) munmap(const_cast<uint8_t*>(data_), size_);
    if (fd_ >= 0) ::close(fd_);
    data_ = nullptr;
    fd_ = -1;
  }
  std::string path_;
  int fd_ = -1;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

SafeTensors::SafeTensors(SafeTensors&&) noexcept = default;
SafeTensors& SafeTensors::operator=(SafeTensors&&) noexcept = default;
SafeTensors::~SafeTensors() = default;

void SafeTensors::add_file(const std::string& path) {
  auto mf = std::make_unique<MappedFile>(path);
  const size_t size = mf->size();
  if (size < 8) throw std::runtime_error(path + ": truncated safetensors file (" + std::to_string(size) + " bytes, no header length)");
  uint64_t hlen = 0;
  std::memcpy(&hlen, mf->data(), 8);
  if (hlen > size - 8) throw std::runtime_error(path + ": header length " + std::to_string(hlen) + " exceeds file size " + std::to_string(size));
  if (hlen > kMaxHeaderBytes)
    throw std::runtime_error(path + ": header length " + std::to_string(hlen) + " is over the format's limit of " +
                             std::to_string(kMaxHeaderBytes) + " bytes");
  const std::string_view header_text(reinterpret_cast<const char*>(mf->data()) + 8, hlen);
  check_json_depth(header_text, path + ": safetensors header");
  json header;
  try {
    header = json::parse(header_text);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e400
    throw std::runtime_error(path + ": malformed safetensors header JSON: " + e.what());
  }
  if (!header.is_object()) throw std::runtime_error(path + ": safetensors header is not a JSON object");
  const uint8_t* base = mf->data() + 8 + hlen;
  const size_t data_size = size - 8 - hlen;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      // Safetensors metadata is a flat string -> string map; anything else is a malformed file.
      if (!info.is_object()) throw std::runtime_error(path + ": __metadata__ is not a JSON object");
      for (auto& [mk, mv] : info.items()) {
        if (!mv.is_string()) throw std::runtime_error(path + ": __metadata__ value '" + mk + "' is not a string");
        metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    auto where = path + ": tensor '" + name + "'";
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") || !info.contains("data_offsets"))
      throw std::runtime_error(where + ": needs dtype, shape and data_offsets");
    TensorView t;
    t.name = name;
    t.file = path;
    std::string dt = info["dtype"].is_string() ? info["dtype"].get<std::string>() : "";
    if (dt == "F32") t.dtype = DType::F32;
    else if (dt == "F16") t.dtype = DType::F16;
    else if (dt == "BF16") t.dtype = DType::BF16;
    else throw std::runtime_error(where + ": unsupported dtype '" + dt + "' (supported: F32, F16, BF16)");
    if (!info["shape"].is_array()) throw std::runtime_error(where + ": shape is not an array");
    if (info["shape"].size() > kMaxDims)
      throw std::runtime_error(where + ": shape has " + std::to_string(info["shape"].size()) + " dimensions, more than " +
                               std::to_string(kMaxDims));
    // The element count is checked against the data section below; here it only must not overflow on the way.
    uint64_t numel = 1;
    for (auto& s : info["shape"]) {
      if (!s.is_number_integer() || (!s.is_number_unsigned() && s.get<int64_t>() < 0))
        throw std::runtime_error(where + ": shape entry " + s.dump().substr(0, 40) + " is not a non-negative integer");
      const uint64_t d = s.get<uint64_t>();
      if (d > static_cast<uint64_t>(INT64_MAX) || (d != 0 && numel > data_size / d))
        throw std::runtime_error(where + ": shape entry " + std::to_string(d) + " makes more elements than the " +
                                 std::to_string(data_size) + "-byte data section holds");
      t.shape.push_back(static_cast<int64_t>(d));
      numel *= d;
    }
    auto& off = info["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw std::runtime_error(where + ": data_offsets must be [begin, end]");
    uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    if (b > e || e > data_size)
      throw std::runtime_error(where + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                               "] point outside the data section (" + std::to_string(data_size) + " bytes)");
    if (e - b != numel * dtype_size(t.dtype))
      throw std::runtime_error(where + ": byte size " + std::to_string(e - b) + " does not match shape and dtype");
    t.data = base + b;
    t.nbytes = e - b;
    ranges.emplace_back(b, e);
    if (tensors_.count(name)) throw std::runtime_error(where + ": defined in more than one file");
    tensors_.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second)
      throw std::runtime_error(path + ": tensors overlap in the data section at byte " + std::to_string(ranges[i].first));
  files_.push_back(std::move(mf));
}

SafeTensors SafeTensors::open(const std::string& path) {
  SafeTensors st;
  if (!fs::is_directory(path)) {
    st.add_file(path);
    return st;
  }
  fs::path dir(path);
  fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const json j = read_json_file(index.string(), "safetensors index");
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      throw std::runtime_error(index.string() + ": missing 'weight_map'");
    std::set<std::string> shards;
    for (auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string()) throw std::runtime_error(index.string() + ": weight_map['" + name + "'] is not a file name");
      // Shards live in the model folder: an index must not point the loader at files elsewhere.
      const fs::path shard(file.get<std::string>());
      bool escapes = shard.empty() || shard.is_absolute();
      for (const auto& part : shard) escapes |= part == "..";
      if (escapes)
        throw std::runtime_error(index.string() + ": weight_map['" + name + "'] = '" + shard.string() +
                                 "' is not a file inside the model folder");
      shards.insert(file.get<std::string>());
    }
    for (auto& s : shards) st.add_file((dir / s).string());
    for (auto& [name, file] : j["weight_map"].items()) {
      auto it = st.tensors_.find(name);
      if (it == st.tensors_.end())
        throw std::runtime_error(index.string() + ": tensor '" + name + "' listed for " + file.get<std::string>() + " but not found there");
    }
    return st;
  }
  fs::path single = dir / "model.safetensors";
  if (!fs::exists(single))
    throw std::runtime_error(path + ": no model.safetensors or model.safetensors.index.json in this folder");
  st.add_file(single.string());
  return st;
}

const TensorView* SafeTensors::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

static std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

const TensorView& SafeTensors::require(const std::string& name, const std::vector<int64_t>& shape) const {
  const TensorView* t = find(name);
  if (!t) {
    std::string files;
    for (auto& [n, v] : tensors_) { files = v.file; break; }
    throw std::runtime_error("missing tensor '" + name + "'" + (files.empty() ? "" : " (checkpoint " + files + ")"));
  }
  if (t->shape != shape)
    throw std::runtime_error(t->file + ": tensor '" + name + "' has shape " + shape_str(t->shape) + ", config expects " + shape_str(shape));
  return *t;
}

float bf16_to_f32(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, u;
  if (exp == 0) {
    if (mant == 0) u = sign;
    else {  // subnormal: renormalize
      exp = 127 - 15 + 1;
      while (!(mant & 0x400)) { mant <<= 1; --exp; }
      mant &= 0x3ff;
      u = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void to_f32(const TensorView& t, float* dst) {
  const int64_t n = t.numel();
  switch (t.dtype) {
    case DType::F32: std::memcpy(dst, t.data, n * 4); break;
    case DType::BF16: {
      const uint8_t* p = t.data;
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) { uint16_t v; std::memcpy(&v, p + 2 * i, 2); dst[i] = bf16_to_f32(v); }
      break;
    }
    case DType::F16: {
      const uint8_t* p = t.data;
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) { uint16_t v; std::memcpy(&v, p + 2 * i, 2); dst[i] = f16_to_f32(v); }
      break;
    }
  }
}

std::vector<float> to_f32(const TensorView& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  to_f32(t, v.data());
  return v;
}

}  // namespace elastic
