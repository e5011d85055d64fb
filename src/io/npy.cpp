// .npy reader/writer. The header is a Python dict literal, {'descr': '<i4', 'fortran_order': False, 'shape': (3,), },
// read by a small hand-written parser (no std::regex: libstdc++'s regex recurses per character and a 30 KB header
// overflowed the stack). Every size is checked before anything is allocated: the header length against a cap, the
// element count for overflow, and the data against the file's size (or, for a pipe or device, against a cap).
#include "elastic/npy.h"

#include <cstring>
#include <limits>
#include <stdexcept>

#include "elastic/output_file.h"
#include "elastic/text_file.h"

namespace elastic {
namespace {

// numpy's own reader refuses headers over 10,000 bytes by default; ours are 128 bytes.
constexpr uint32_t kMaxHeaderBytes = 1 << 16;
// Data read from a pipe or device, whose size is unknown up front.
constexpr uint64_t kMaxStreamDataBytes = 1ULL << 30;

struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
  uint64_t numel = 1;
};

// Cursor over the header dict; every error names the file and what was expected.
class DictParser {
 public:
  DictParser(const std::string& path, const std::string& text) : path_(path), s_(text) {}

  NpyHeader parse() {
    NpyHeader h;
    bool have_descr = false, have_order = false, have_shape = false;
    expect('{');
    while (!peek('}')) {
      const std::string key = string_literal("a key");
      expect(':');
      auto once = [&](bool& seen) {
        if (seen) fail("key '" + key + "' appears twice");
        seen = true;
      };
      if (key == "descr") once(have_descr), h.descr = string_literal("the descr value");
      else if (key == "fortran_order") once(have_order), h.fortran_order = boolean();
      else if (key == "shape") once(have_shape), h.shape = tuple();
      else fail("unknown key '" + key + "' (expected descr, fortran_order, shape)");
      if (!peek('}')) expect(',');
    }
    expect('}');
    skip_space();
    if (i_ != s_.size()) fail("text after the closing '}' at byte " + std::to_string(i_));
    if (!have_descr) fail("no 'descr'");
    if (!have_order) fail("no 'fortran_order'");
    if (!have_shape) fail("no 'shape'");
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(path_ + ": bad .npy header: " + what);
  }
  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool peek(char c) {
    skip_space();
    return i_ < s_.size() && s_[i_] == c;
  }
  void expect(char c) {
    if (!peek(c)) fail(std::string("expected '") + c + "' at byte " + std::to_string(i_));
    ++i_;
  }
  // 'text' or "text" without escapes (numpy writes none in these fields).
  std::string string_literal(const char* what) {
    skip_space();
    if (i_ >= s_.size() || (s_[i_] != '\'' && s_[i_] != '"')) fail(std::string("expected a string as ") + what);
    const char q = s_[i_++];
    const size_t end = s_.find(q, i_);
    if (end == std::string::npos) fail(std::string("unterminated string as ") + what);
    std::string v = s_.substr(i_, end - i_);
    i_ = end + 1;
    return v;
  }
  bool boolean() {
    skip_space();
    if (s_.compare(i_, 4, "True") == 0) return i_ += 4, true;
    if (s_.compare(i_, 5, "False") == 0) return i_ += 5, false;
    fail("fortran_order must be True or False");
  }
  // A non-negative decimal integer that fits int64 (so "-5" is an error, not 5).
  int64_t dimension() {
    skip_space();
    const size_t start = i_;
    uint64_t v = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      const uint64_t digit = static_cast<uint64_t>(s_[i_] - '0');
      if (v > (static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) - digit) / 10)
        fail("shape entry " + s_.substr(start, 24) + "... does not fit in 64 bits");
      v = v * 10 + digit;
      ++i_;
    }
    if (i_ == start) {
      size_t end = start;
      while (end < s_.size() && end - start < 24 && s_[end] != ',' && s_[end] != ')') ++end;
      fail("shape entry '" + s_.substr(start, end - start) + "' is not a non-negative integer");
    }
    return static_cast<int64_t>(v);
  }
  // (d0, d1, ...) with an optional trailing comma; () is a scalar.
  std::vector<int64_t> tuple() {
    std::vector<int64_t> dims;
    expect('(');
    while (!peek(')')) {
      if (dims.size() >= 64) fail("shape has more than 64 dimensions");
      dims.push_back(dimension());
      if (!peek(')')) expect(',');
    }
    expect(')');
    return dims;
  }

  const std::string& path_;
  const std::string& s_;
  size_t i_ = 0;
};

// Reads the magic, version, header length and header dict; leaves f at the first data byte.
NpyHeader read_header(InputFile& f) {
  const std::string& path = f.path();
  unsigned char pre[10];
  if (f.read_some(pre, sizeof pre) != sizeof pre || std::memcmp(pre, "\x93NUMPY", 6) != 0)
    throw std::runtime_error(path + ": not a .npy file (bad magic)");
  const int major = pre[6];
  uint32_t hlen = 0;
  if (major == 1) {
    hlen = pre[8] | (static_cast<uint32_t>(pre[9]) << 8);
  } else if (major == 2 || major == 3) {
    unsigned char more[2];
    f.read_exact(more, 2, "the header length");
    hlen = pre[8] | (static_cast<uint32_t>(pre[9]) << 8) | (static_cast<uint32_t>(more[0]) << 16) |
           (static_cast<uint32_t>(more[1]) << 24);
  } else {
    throw std::runtime_error(path + ": unsupported .npy version " + std::to_string(major));
  }
  if (hlen > kMaxHeaderBytes)
    throw std::runtime_error(path + ": .npy header is " + std::to_string(hlen) + " bytes, more than the limit of " +
                             std::to_string(kMaxHeaderBytes));
  std::string text(hlen, '\0');
  f.read_exact(text.data(), hlen, "the .npy header");
  NpyHeader h = DictParser(path, text).parse();
  if (h.fortran_order) throw std::runtime_error(path + ": Fortran-order arrays are not supported");
  for (int64_t d : h.shape) {
    if (d != 0 && h.numel > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d))
      throw std::runtime_error(path + ": .npy shape has more elements than 2^64");
    h.numel *= static_cast<uint64_t>(d);
  }
  return h;
}

// Checks that the data section (numel x elem bytes, from the current offset) is in the file, before the caller
// allocates for it; a pipe or device, whose size is unknown, may declare at most kMaxStreamDataBytes.
void check_data_size(const InputFile& f, const NpyHeader& h, size_t elem) {
  const std::string& path = f.path();
  const uint64_t limit = f.regular() ? (f.size() > f.offset() ? f.size() - f.offset() : 0) : kMaxStreamDataBytes;
  if (h.numel > limit / elem)
    throw std::runtime_error(path + ": " + (f.regular() ? "truncated data: the shape needs " : "the shape needs ") +
                             std::to_string(h.numel) + " x " + std::to_string(elem) + " bytes, " +
                             (f.regular() ? "the file holds " + std::to_string(limit) + " after the header"
                                          : "more than the limit of " + std::to_string(limit) + " for a non-file"));
}

void write_npy(const std::string& path, const char* descr, const void* data, size_t elem,
               const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  std::string sh = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) throw std::invalid_argument(path + ": negative .npy shape entry " + std::to_string(shape[i]));
    n *= static_cast<uint64_t>(shape[i]);
    sh += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
  }
  sh += ")";
  std::string h = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + sh + ", }";
  size_t total = 10 + h.size() + 1;
  h.append((64 - total % 64) % 64, ' ');
  h += '\n';
  if (h.size() > 0xffff) throw std::invalid_argument(path + ": .npy shape too long for a version 1 header");
  OutputFile f(path, ".npy file");
  f.write("\x93NUMPY\x01\x00", 8);
  const char hl[2] = {static_cast<char>(h.size() & 0xff), static_cast<char>(h.size() >> 8)};
  f.write(hl, 2);
  f.write(h);
  f.write(data, n * elem);
  f.close();
}

}  // namespace

std::vector<int32_t> read_npy_ids(const std::string& path) {
  InputFile f(path, ".npy file");
  const NpyHeader h = read_header(f);
  if (h.shape.size() != 1)
    throw std::runtime_error(path + ": token ids must be a 1-D array, got " + std::to_string(h.shape.size()) + "-D");
  const size_t esz = (h.descr == "<i4") ? 4 : (h.descr == "<i8") ? 8 : 0;
  if (!esz) throw std::runtime_error(path + ": token ids must be int32 or int64, got dtype '" + h.descr + "'");
  check_data_size(f, h, esz);
  std::string buf(static_cast<size_t>(h.numel * esz), '\0');
  f.read_exact(buf.data(), buf.size(), "the .npy data");
  std::vector<int32_t> ids(h.numel);
  for (size_t i = 0; i < ids.size(); ++i) {
    int64_t v;
    if (esz == 4) {
      int32_t v32;
      std::memcpy(&v32, buf.data() + 4 * i, 4);
      v = v32;
    } else {
      std::memcpy(&v, buf.data() + 8 * i, 8);
    }
    if (v < 0 || v > std::numeric_limits<int32_t>::max())
      throw std::runtime_error(path + ": token id " + std::to_string(v) + " at index " + std::to_string(i) +
                               " is out of range (0 .. 2^31-1)");
    ids[i] = static_cast<int32_t>(v);
  }
  return ids;
}

std::vector<float> read_npy_f32(const std::string& path, std::vector<int64_t>* shape) {
  InputFile f(path, ".npy file");
  const NpyHeader h = read_header(f);
  if (h.descr != "<f4") throw std::runtime_error(path + ": expected float32, got '" + h.descr + "'");
  check_data_size(f, h, 4);
  std::vector<float> v(h.numel);
  f.read_exact(v.data(), v.size() * 4, "the .npy data");
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
