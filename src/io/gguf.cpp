#include "elastic/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace elastic::gguf {

const char* type_name(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return "F32";
    case GgmlType::F16: return "F16";
    case GgmlType::Q4_0: return "Q4_0";
    case GgmlType::Q4_1: return "Q4_1";
    case GgmlType::Q5_0: return "Q5_0";
    case GgmlType::Q5_1: return "Q5_1";
    case GgmlType::Q8_0: return "Q8_0";
    case GgmlType::Q8_1: return "Q8_1";
    case GgmlType::Q2_K: return "Q2_K";
    case GgmlType::Q3_K: return "Q3_K";
    case GgmlType::Q4_K: return "Q4_K";
    case GgmlType::Q5_K: return "Q5_K";
    case GgmlType::Q6_K: return "Q6_K";
    case GgmlType::Q8_K: return "Q8_K";
    case GgmlType::BF16: return "BF16";
  }
  thread_local std::string s;
  s = "type#" + std::to_string(static_cast<uint32_t>(t));
  return s.c_str();
}

bool type_supported(GgmlType t) {
  switch (t) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q8_0:
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q4_K: case GgmlType::Q6_K:
      return true;
    default:
      return false;
  }
}

int64_t block_elems(GgmlType t) {
  switch (t) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: return 1;
    case GgmlType::Q8_0: case GgmlType::Q4_0: case GgmlType::Q4_1: return 32;
    case GgmlType::Q4_K: case GgmlType::Q6_K: return 256;
    default: throw std::invalid_argument(std::string("gguf: unsupported tensor type ") + type_name(t));
  }
}

size_t block_bytes(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return 4;
    case GgmlType::F16: case GgmlType::BF16: return 2;
    case GgmlType::Q8_0: return 2 + 32;        // fp16 d, int8 q[32]
    case GgmlType::Q4_0: return 2 + 16;        // fp16 d, 32 nibbles
    case GgmlType::Q4_1: return 2 + 2 + 16;    // fp16 d, fp16 m, 32 nibbles
    case GgmlType::Q4_K: return 2 + 2 + 12 + 128;  // d, dmin, 6-bit scales/mins, 256 nibbles
    case GgmlType::Q6_K: return 128 + 64 + 16 + 2;  // ql, qh, int8 scales, d
    default: throw std::invalid_argument(std::string("gguf: unsupported tensor type ") + type_name(t));
  }
}

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::U8: return "uint8";
    case ValueType::I8: return "int8";
    case ValueType::U16: return "uint16";
    case ValueType::I16: return "int16";
    case ValueType::U32: return "uint32";
    case ValueType::I32: return "int32";
    case ValueType::F32: return "float32";
    case ValueType::BOOL: return "bool";
    case ValueType::STRING: return "string";
    case ValueType::ARRAY: return "array";
    case ValueType::U64: return "uint64";
    case ValueType::I64: return "int64";
    case ValueType::F64: return "float64";
  }
  return "unknown";
}

size_t Value::size() const {
  if (type != ValueType::ARRAY) return 0;
  if (elem == ValueType::STRING) return strs.size();
  if (elem == ValueType::ARRAY) return arrays.size();
  return nums.size();
}
bool Value::is_integer() const {
  switch (type) {
    case ValueType::U8: case ValueType::I8: case ValueType::U16: case ValueType::I16: case ValueType::U32:
    case ValueType::I32: case ValueType::U64: case ValueType::I64: case ValueType::BOOL:
      return true;
    default:
      return false;
  }
}
bool Value::is_float() const { return type == ValueType::F32 || type == ValueType::F64; }

namespace {

// Bounds-checked little-endian cursor over the mapping; every overrun is a "truncated" error.
struct Reader {
  const File* file;
  const uint8_t* base;
  size_t size, pos = 0;
  std::string where;  // what is being read, for the error message

  void need(size_t n) const {
    if (n > size - pos)
      file->fail("truncated file: need " + std::to_string(n) + " bytes at offset " + std::to_string(pos) +
                 " while reading " + where + ", file has " + std::to_string(size));
  }
  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, base + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string str() {
    const uint64_t n = get<uint64_t>();
    need(n);  // also rejects absurd lengths before allocating
    std::string s(reinterpret_cast<const char*>(base + pos), n);
    pos += n;
    return s;
  }
};

size_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::BOOL: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
    default: return 0;
  }
}

// Reads one scalar of type t into v (i/u/f filled for numbers).
void read_scalar(Reader& r, ValueType t, Value& v) {
  v.type = t;
  switch (t) {
    case ValueType::U8: v.u = r.get<uint8_t>(); v.i = static_cast<int64_t>(v.u); break;
    case ValueType::I8: v.i = r.get<int8_t>(); v.u = static_cast<uint64_t>(v.i); break;
    case ValueType::U16: v.u = r.get<uint16_t>(); v.i = static_cast<int64_t>(v.u); break;
    case ValueType::I16: v.i = r.get<int16_t>(); v.u = static_cast<uint64_t>(v.i); break;
    case ValueType::U32: v.u = r.get<uint32_t>(); v.i = static_cast<int64_t>(v.u); break;
    case ValueType::I32: v.i = r.get<int32_t>(); v.u = static_cast<uint64_t>(v.i); break;
    case ValueType::U64: v.u = r.get<uint64_t>(); v.i = static_cast<int64_t>(v.u); break;
    case ValueType::I64: v.i = r.get<int64_t>(); v.u = static_cast<uint64_t>(v.i); break;
    case ValueType::BOOL: {
      const uint8_t b = r.get<uint8_t>();
      if (b > 1) r.file->fail("bool value " + std::to_string(b) + " is not 0 or 1 while reading " + r.where);
      v.u = b;
      v.i = b;
      break;
    }
    case ValueType::F32: v.f = r.get<float>(); break;
    case ValueType::F64: v.f = r.get<double>(); break;
    default: break;
  }
  if (!v.is_float()) v.f = static_cast<double>(v.i);
}

void read_value(Reader& r, ValueType t, Value& v, int depth) {
  if (t == ValueType::STRING) {
    v.type = t;
    v.s = r.str();
    return;
  }
  if (t == ValueType::ARRAY) {
    if (depth > 4) r.file->fail("arrays nested too deep while reading " + r.where);
    v.type = t;
    const uint32_t et = r.get<uint32_t>();
    if (et > static_cast<uint32_t>(ValueType::F64))
      r.file->fail("unknown array element type " + std::to_string(et) + " while reading " + r.where);
    v.elem = static_cast<ValueType>(et);
    const uint64_t n = r.get<uint64_t>();
    // Every element takes at least one byte (strings 8): reject counts the file cannot hold before reserving.
    const size_t min_elem = v.elem == ValueType::STRING ? 8 : v.elem == ValueType::ARRAY ? 12 : scalar_size(v.elem);
    if (n > (r.size - r.pos) / min_elem)
      r.file->fail("truncated file: array of " + std::to_string(n) + " " + value_type_name(v.elem) +
                   " does not fit in the file while reading " + r.where);
    if (v.elem == ValueType::STRING) {
      v.strs.reserve(n);
      for (uint64_t k = 0; k < n; ++k) v.strs.push_back(r.str());
    } else if (v.elem == ValueType::ARRAY) {
      v.arrays.resize(n);
      for (uint64_t k = 0; k < n; ++k) read_value(r, ValueType::ARRAY, v.arrays[k], depth + 1);
    } else {
      const bool integral = v.elem != ValueType::F32 && v.elem != ValueType::F64;
      v.nums.reserve(n);
      if (integral) v.ints.reserve(n);
      Value e;
      for (uint64_t k = 0; k < n; ++k) {
        read_scalar(r, v.elem, e);
        v.nums.push_back(e.f);
        if (integral) v.ints.push_back(e.i);
      }
    }
    return;
  }
  if (static_cast<uint32_t>(t) > static_cast<uint32_t>(ValueType::F64))
    r.file->fail("unknown metadata value type " + std::to_string(static_cast<uint32_t>(t)) + " while reading " +
                 r.where);
  read_scalar(r, t, v);
}

}  // namespace

void File::fail(const std::string& what) const { throw std::runtime_error("gguf: " + path_ + ": " + what); }

File::File(File&& o) noexcept { *this = std::move(o); }
File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    if (map_) munmap(map_, size_);
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    size_ = std::exchange(o.size_, 0);
    version_ = o.version_;
    alignment_ = o.alignment_;
    data_offset_ = o.data_offset_;
    kv_ = std::move(o.kv_);
    tensors_ = std::move(o.tensors_);
    tensor_index_ = std::move(o.tensor_index_);
  }
  return *this;
}
File::~File() {
  if (map_) munmap(map_, size_);
}

File File::open(const std::string& path) {
  File f;
  f.path_ = path;
  // O_NONBLOCK: a FIFO then opens at once and is refused below as not a regular file, instead of blocking in open()
  // until a writer comes (no effect on a regular file, which is memory-mapped).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) f.fail(std::string("cannot open file: ") + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    f.fail(std::string("cannot stat file: ") + std::strerror(errno));
  }
  // mmap of a directory or device fails with a bare "No such device"; say what the path is instead.
  if (S_ISDIR(st.st_mode) || !S_ISREG(st.st_mode)) {
    ::close(fd);
    f.fail(S_ISDIR(st.st_mode) ? "is a directory, not a GGUF file" : "not a regular file (a GGUF file is memory-mapped)");
  }
  f.size_ = static_cast<size_t>(st.st_size);
  if (f.size_ < 4) {
    ::close(fd);
    f.fail("truncated file: " + std::to_string(f.size_) + " bytes, too short for a GGUF header");
  }
  void* m = mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) f.fail(std::string("mmap failed: ") + std::strerror(errno));
  f.map_ = m;

  Reader r{&f, static_cast<const uint8_t*>(m), f.size_, 0, {}};
  r.where = "the header";
  if (std::memcmp(r.base, "GGUF", 4) != 0) {
    std::string got;
    for (int k = 0; k < 4; ++k) {
      const unsigned char c = r.base[k];
      got += (c >= 32 && c < 127) ? std::string(1, static_cast<char>(c)) : "\\x" + std::to_string(c);
    }
    f.fail("bad magic '" + got + "' (not a GGUF file)");
  }
  r.pos = 4;
  f.version_ = r.get<uint32_t>();
  // v1 used 32-bit counts and lengths; v2 and v3 differ only in big-endian support (v3), which we reject below.
  if (__builtin_bswap32(f.version_) == 2 || __builtin_bswap32(f.version_) == 3)
    f.fail("big-endian GGUF (version " + std::to_string(__builtin_bswap32(f.version_)) + ") is not supported");
  if (f.version_ != 2 && f.version_ != 3)
    f.fail("unsupported GGUF version " + std::to_string(f.version_) + " (supported: 2, 3)");
  const uint64_t n_tensors = r.get<uint64_t>();
  const uint64_t n_kv = r.get<uint64_t>();
  // Minimal sizes: a KV pair takes >= 8+4 bytes, a tensor info >= 8+4+8+4+8: reject impossible counts early.
  if (n_kv > f.size_ / 12 || n_tensors > f.size_ / 32)
    f.fail("truncated file: header claims " + std::to_string(n_tensors) + " tensors and " + std::to_string(n_kv) +
           " metadata entries, more than " + std::to_string(f.size_) + " bytes can hold (wrong endianness?)");

  for (uint64_t k = 0; k < n_kv; ++k) {
    r.where = "metadata entry #" + std::to_string(k);
    std::string key = r.str();
    r.where = "metadata '" + key + "'";
    const uint32_t t = r.get<uint32_t>();
    Value v;
    read_value(r, static_cast<ValueType>(t), v, 0);
    if (f.kv_.count(key)) f.fail("duplicate metadata key '" + key + "'");
    f.kv_.emplace(std::move(key), std::move(v));
  }

  if (const Value* a = f.find("general.alignment")) {
    if (!a->is_integer() || a->type == ValueType::BOOL) f.fail("general.alignment must be an integer");
    if (a->u == 0 || (a->u & (a->u - 1)) || a->u > (1u << 20))
      f.fail("general.alignment " + std::to_string(a->u) + " is not a power of two in [1, 2^20]");
    f.alignment_ = static_cast<size_t>(a->u);
  }

  f.tensors_.resize(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    TensorInfo& ti = f.tensors_[k];
    r.where = "tensor info #" + std::to_string(k);
    ti.name = r.str();
    r.where = "tensor info '" + ti.name + "'";
    const uint32_t nd = r.get<uint32_t>();
    if (nd == 0 || nd > 4) f.fail("tensor '" + ti.name + "' has " + std::to_string(nd) + " dimensions (1..4 allowed)");
    ti.n_elements = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      const uint64_t ne = r.get<uint64_t>();
      if (ne == 0 || ne > (1ULL << 40) || static_cast<uint64_t>(ti.n_elements) > (1ULL << 40) / ne)
        f.fail("tensor '" + ti.name + "' has an invalid dimension " + std::to_string(ne));
      ti.dims.push_back(static_cast<int64_t>(ne));
      ti.n_elements *= static_cast<int64_t>(ne);
    }
    const uint32_t ty = r.get<uint32_t>();
    ti.type = static_cast<GgmlType>(ty);
    ti.offset = r.get<uint64_t>();
    if (!type_supported(ti.type))
      f.fail("tensor '" + ti.name + "' has " + (std::string(type_name(ti.type)).rfind("type#", 0) == 0
                                                    ? "an unknown tensor type " + std::to_string(ty)
                                                    : std::string("an unsupported tensor type ") +
                                                          type_name(ti.type)) +
             " (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K)");
    const int64_t be = block_elems(ti.type);
    if (ti.dims[0] % be)
      f.fail("tensor '" + ti.name + "': row length " + std::to_string(ti.dims[0]) + " is not a multiple of the " +
             type_name(ti.type) + " block size " + std::to_string(be));
    ti.n_bytes = static_cast<size_t>(ti.n_elements / be) * block_bytes(ti.type);
    if (ti.offset % f.alignment_)
      f.fail("tensor '" + ti.name + "' offset " + std::to_string(ti.offset) + " is not a multiple of the alignment " +
             std::to_string(f.alignment_));
    if (!f.tensor_index_.emplace(ti.name, k).second) f.fail("duplicate tensor name '" + ti.name + "'");
  }

  f.data_offset_ = (r.pos + f.alignment_ - 1) / f.alignment_ * f.alignment_;
  if (n_tensors && f.data_offset_ > f.size_)
    f.fail("truncated file: the data section would start at " + std::to_string(f.data_offset_) + ", past the end (" +
           std::to_string(f.size_) + " bytes)");
  for (TensorInfo& ti : f.tensors_) {
    const size_t avail = f.size_ - f.data_offset_;
    if (ti.offset > avail || ti.n_bytes > avail - ti.offset)
      f.fail("tensor '" + ti.name + "' (" + type_name(ti.type) + ", " + std::to_string(ti.n_bytes) +
             " bytes at data offset " + std::to_string(ti.offset) + ") is out of bounds: the data section holds " +
             std::to_string(avail) + " bytes (file truncated?)");
    ti.data = static_cast<const uint8_t*>(f.map_) + f.data_offset_ + ti.offset;
  }
  return f;
}

const Value* File::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const TensorInfo* File::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& File::tensor(const std::string& name) const {
  const TensorInfo* t = find_tensor(name);
  if (!t) fail("missing tensor '" + name + "'");
  return *t;
}

std::string File::get_string(const std::string& key) const {
  const Value* v = find(key);
  if (!v) fail("missing metadata '" + key + "'");
  if (v->type != ValueType::STRING)
    fail("metadata '" + key + "' is " + value_type_name(v->type) + ", expected string");
  return v->s;
}

int64_t File::get_int(const std::string& key) const {
  const Value* v = find(key);
  if (!v) fail("missing metadata '" + key + "'");
  if (!v->is_integer() || v->type == ValueType::BOOL)
    fail("metadata '" + key + "' is " + value_type_name(v->type) + ", expected an integer");
  // A uint64 above 2^63 would come back negative (and a caller's range check would see the wrong number).
  if (v->type == ValueType::U64 && v->u > static_cast<uint64_t>(INT64_MAX))
    fail("metadata '" + key + "' = " + std::to_string(v->u) + " is out of range (more than 2^63-1)");
  return v->i;
}

double File::get_float(const std::string& key) const {
  const Value* v = find(key);
  if (!v) fail("missing metadata '" + key + "'");
  if (!v->is_float() && !(v->is_integer() && v->type != ValueType::BOOL))
    fail("metadata '" + key + "' is " + value_type_name(v->type) + ", expected a number");
  return v->f;
}

const Value& File::get_array(const std::string& key, ValueType elem) const {
  const Value* v = find(key);
  if (!v) fail("missing metadata '" + key + "'");
  if (v->type != ValueType::ARRAY) fail("metadata '" + key + "' is " + value_type_name(v->type) + ", expected an array");
  auto integral = [](ValueType t) {
    return t != ValueType::STRING && t != ValueType::ARRAY && t != ValueType::F32 && t != ValueType::F64;
  };
  // Numeric arrays are accepted whatever their width (int32 vs uint32 differs between converters), but an integer
  // request needs integer elements (their `ints` are filled); a float request takes any number (`nums`).
  const bool num_ok = (integral(elem) && integral(v->elem)) ||
                      ((elem == ValueType::F32 || elem == ValueType::F64) && v->elem != ValueType::STRING &&
                       v->elem != ValueType::ARRAY);
  if (v->elem != elem && !num_ok)
    fail("metadata '" + key + "' is an array of " + value_type_name(v->elem) + ", expected " + value_type_name(elem));
  return *v;
}

std::vector<float> File::dequantize(const TensorInfo& t) const {
  std::vector<float> out(static_cast<size_t>(t.n_elements));
  const int64_t ne0 = t.dims[0], rows = t.rows();
  const size_t row_bytes = static_cast<size_t>(ne0 / block_elems(t.type)) * block_bytes(t.type);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    dequantize_row(t.type, t.data + r * row_bytes, out.data() + r * ne0, ne0);
  return out;
}

void File::release(const TensorInfo& t) const {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t a = (reinterpret_cast<uintptr_t>(t.data) + page - 1) / page * page;
  const uintptr_t b = (reinterpret_cast<uintptr_t>(t.data) + t.n_bytes) / page * page;
  if (b > a) (void)madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);  // only whole pages inside t
}

}  // namespace elastic::gguf
