#include "elastic/gguf_writer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "elastic/output_file.h"

namespace elastic::gguf {
namespace {

void put16(std::vector<uint8_t>& o, uint16_t v) { o.insert(o.end(), reinterpret_cast<uint8_t*>(&v), reinterpret_cast<uint8_t*>(&v) + 2); }

template <class T>
void put(std::vector<uint8_t>& o, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  o.insert(o.end(), p, p + sizeof(T));
}
void put_str(std::vector<uint8_t>& o, const std::string& s) {
  put<uint64_t>(o, s.size());
  o.insert(o.end(), s.begin(), s.end());
}

void put_scalar(std::vector<uint8_t>& o, ValueType t, int64_t i, double f) {
  switch (t) {
    case ValueType::U8: put<uint8_t>(o, static_cast<uint8_t>(i)); break;
    case ValueType::I8: put<int8_t>(o, static_cast<int8_t>(i)); break;
    case ValueType::U16: put<uint16_t>(o, static_cast<uint16_t>(i)); break;
    case ValueType::I16: put<int16_t>(o, static_cast<int16_t>(i)); break;
    case ValueType::U32: put<uint32_t>(o, static_cast<uint32_t>(i)); break;
    case ValueType::I32: put<int32_t>(o, static_cast<int32_t>(i)); break;
    case ValueType::U64: put<uint64_t>(o, static_cast<uint64_t>(i)); break;
    case ValueType::I64: put<int64_t>(o, i); break;
    case ValueType::BOOL: put<uint8_t>(o, i ? 1 : 0); break;
    case ValueType::F32: put<float>(o, static_cast<float>(f)); break;
    case ValueType::F64: put<double>(o, f); break;
    default: throw std::invalid_argument("gguf writer: not a scalar type");
  }
}

void put_value(std::vector<uint8_t>& o, const Value& v) {
  if (v.type == ValueType::STRING) {
    put_str(o, v.s);
  } else if (v.type == ValueType::ARRAY) {
    put<uint32_t>(o, static_cast<uint32_t>(v.elem));
    put<uint64_t>(o, v.size());
    if (v.elem == ValueType::STRING)
      for (auto& s : v.strs) put_str(o, s);
    else if (v.elem == ValueType::ARRAY)
      for (auto& a : v.arrays) put_value(o, a);
    else
      for (size_t k = 0; k < v.nums.size(); ++k)
        put_scalar(o, v.elem, k < v.ints.size() ? v.ints[k] : static_cast<int64_t>(v.nums[k]), v.nums[k]);
  } else {
    put_scalar(o, v.type, v.type == ValueType::U64 ? static_cast<int64_t>(v.u) : v.i, v.f);
  }
}

}  // namespace

std::vector<uint8_t> quantize(GgmlType t, const float* x, int64_t n) {
  std::vector<uint8_t> o;
  switch (t) {
    case GgmlType::F32:
      o.resize(static_cast<size_t>(n) * 4);
      std::memcpy(o.data(), x, o.size());
      return o;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) put16(o, fp32_to_fp16(x[i]));
      return o;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint32_t b;
        std::memcpy(&b, &x[i], 4);
        b += 0x7FFF + ((b >> 16) & 1);  // round to nearest even
        put16(o, static_cast<uint16_t>(b >> 16));
      }
      return o;
    default:
      break;
  }
  if (n % 32) throw std::invalid_argument(std::string("gguf quantize: ") + type_name(t) + " needs a multiple of 32");
  for (int64_t b = 0; b < n; b += 32) {
    const float* v = x + b;
    if (t == GgmlType::Q8_0) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
      const float d = amax / 127.f, id = d ? 1.f / d : 0.f;
      put16(o, fp32_to_fp16(d));
      for (int j = 0; j < 32; ++j) put<int8_t>(o, static_cast<int8_t>(std::lround(v[j] * id)));
    } else if (t == GgmlType::Q4_0) {
      // Scale by the signed extreme so it maps exactly to -8; the opposite side reaches at most +7 (clamped).
      float ext = 0;
      for (int j = 0; j < 32; ++j)
        if (std::fabs(v[j]) > std::fabs(ext)) ext = v[j];
      const float d = ext / -8.f, id = d ? 1.f / d : 0.f;
      put16(o, fp32_to_fp16(d));
      uint8_t q[32];
      for (int j = 0; j < 32; ++j) q[j] = static_cast<uint8_t>(std::clamp(static_cast<int>(v[j] * id + 8.5f), 0, 15));
      for (int j = 0; j < 16; ++j) put<uint8_t>(o, static_cast<uint8_t>(q[j] | q[j + 16] << 4));
    } else if (t == GgmlType::Q4_1) {
      float mn = v[0], mx = v[0];
      for (int j = 1; j < 32; ++j) {
        mn = std::min(mn, v[j]);
        mx = std::max(mx, v[j]);
      }
      const float d = (mx - mn) / 15.f, id = d ? 1.f / d : 0.f;
      put16(o, fp32_to_fp16(d));
      put16(o, fp32_to_fp16(mn));
      uint8_t q[32];
      for (int j = 0; j < 32; ++j)
        q[j] = static_cast<uint8_t>(std::clamp(static_cast<int>((v[j] - mn) * id + 0.5f), 0, 15));
      for (int j = 0; j < 16; ++j) put<uint8_t>(o, static_cast<uint8_t>(q[j] | q[j + 16] << 4));
    } else {
      throw std::invalid_argument(std::string("gguf quantize: no quantizer for ") + type_name(t));
    }
  }
  return o;
}

void Writer::set(const std::string& key, Value v) {
  for (auto& [k, old] : kv_)
    if (k == key) {
      old = std::move(v);
      return;
    }
  kv_.emplace_back(key, std::move(v));
}
void Writer::set_u32(const std::string& key, uint32_t x) {
  Value v;
  v.type = ValueType::U32;
  v.i = x;
  v.u = x;
  set(key, v);
}
void Writer::set_i32(const std::string& key, int32_t x) {
  Value v;
  v.type = ValueType::I32;
  v.i = x;
  set(key, v);
}
void Writer::set_u64(const std::string& key, uint64_t x) {
  Value v;
  v.type = ValueType::U64;
  v.u = x;
  v.i = static_cast<int64_t>(x);
  set(key, v);
}
void Writer::set_f32(const std::string& key, float x) {
  Value v;
  v.type = ValueType::F32;
  v.f = x;
  set(key, v);
}
void Writer::set_bool(const std::string& key, bool x) {
  Value v;
  v.type = ValueType::BOOL;
  v.i = x;
  set(key, v);
}
void Writer::set_str(const std::string& key, const std::string& x) {
  Value v;
  v.type = ValueType::STRING;
  v.s = x;
  set(key, v);
}
void Writer::set_str_array(const std::string& key, const std::vector<std::string>& x) {
  Value v;
  v.type = ValueType::ARRAY;
  v.elem = ValueType::STRING;
  v.strs = x;
  set(key, v);
}
void Writer::set_i32_array(const std::string& key, const std::vector<int32_t>& x) {
  Value v;
  v.type = ValueType::ARRAY;
  v.elem = ValueType::I32;
  for (int32_t e : x) {
    v.ints.push_back(e);
    v.nums.push_back(e);
  }
  set(key, v);
}
void Writer::set_f32_array(const std::string& key, const std::vector<float>& x) {
  Value v;
  v.type = ValueType::ARRAY;
  v.elem = ValueType::F32;
  v.nums.assign(x.begin(), x.end());
  set(key, v);
}
void Writer::set_alignment(uint32_t a) {
  alignment_ = a;
  set_u32("general.alignment", a);
}

void Writer::add_tensor(const std::string& name, std::vector<int64_t> dims, GgmlType t, const float* data) {
  int64_t n = 1;
  for (auto d : dims) n *= d;
  if (!dims.empty() && t != GgmlType::F32 && t != GgmlType::F16 && t != GgmlType::BF16 && dims[0] % 32)
    throw std::invalid_argument("gguf writer: tensor '" + name + "' row length not a multiple of 32");
  tensors_.push_back({name, std::move(dims), static_cast<uint32_t>(t), quantize(t, data, n)});
}

void Writer::add_raw(const std::string& name, std::vector<int64_t> dims, uint32_t type_code,
                     std::vector<uint8_t> bytes) {
  tensors_.push_back({name, std::move(dims), type_code, std::move(bytes)});
}

std::vector<uint8_t> Writer::serialize(uint32_t version) const {
  std::vector<uint8_t> o;
  o.insert(o.end(), {'G', 'G', 'U', 'F'});
  put<uint32_t>(o, version);
  put<uint64_t>(o, tensors_.size());
  put<uint64_t>(o, kv_.size());
  for (auto& [k, v] : kv_) {
    put_str(o, k);
    put<uint32_t>(o, static_cast<uint32_t>(v.type));
    put_value(o, v);
  }
  const auto align = [&](uint64_t x) { return (x + alignment_ - 1) / alignment_ * alignment_; };
  uint64_t off = 0;
  for (auto& t : tensors_) {
    put_str(o, t.name);
    put<uint32_t>(o, static_cast<uint32_t>(t.dims.size()));
    for (auto d : t.dims) put<uint64_t>(o, static_cast<uint64_t>(d));
    put<uint32_t>(o, t.type);
    put<uint64_t>(o, off);
    off = align(off + t.bytes.size());
  }
  o.resize(align(o.size()), 0);
  for (auto& t : tensors_) {
    o.insert(o.end(), t.bytes.begin(), t.bytes.end());
    o.resize(o.size() + (align(t.bytes.size()) - t.bytes.size()), 0);
  }
  return o;
}

void Writer::write(const std::string& path, uint32_t version) const {
  const std::vector<uint8_t> b = serialize(version);
  OutputFile f(path, "GGUF file");
  f.write(b.data(), b.size());
  f.close();
}

}  // namespace elastic::gguf
