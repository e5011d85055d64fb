// ggml block formats widened to fp32. Layouts (per ggml's published format, ggml-common.h):
//   Q8_0  [fp16 d][int8 q[32]]                         x = d*q
//   Q4_0  [fp16 d][u8 qs[16]]                          x = d*(nibble-8); element j in the low nibble of qs[j],
//                                                      element j+16 in the high nibble
//   Q4_1  [fp16 d][fp16 m][u8 qs[16]]                  x = fma(d, nibble, m), same nibble order
//   Q4_K  [fp16 d][fp16 dmin][u8 scales[12]][u8 qs[128]] 256 elements = 8 sub-blocks of 32 with 6-bit
//         scale/min pairs; x = d*sc*nibble - dmin*mn. Each 64-element chunk uses 32 bytes of qs: low nibbles
//         for its first 32 elements, high nibbles for the next 32.
//   Q6_K  [u8 ql[128]][u8 qh[64]][int8 scales[16]][fp16 d] 256 elements = 16 sub-blocks of 16;
//         x = d*scale*(q6-32), q6 = 4 low bits from ql and 2 high bits from qh.
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "elastic/gguf.h"

namespace elastic::gguf {

float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while (!(mant & 0x400));
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3FF) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t fp32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t ax = x & 0x7FFFFFFF;
  if (ax >= 0x7F800000) return sign | 0x7C00 | (ax > 0x7F800000 ? 0x200 : 0);  // inf / nan
  if (ax >= 0x477FF000) return sign | 0x7C00;                                  // rounds past 65504: inf
  if (ax < 0x38800000) {  // below the smallest normal fp16: subnormal or zero
    if (ax < 0x33000000) return sign;
    const uint32_t e = ax >> 23, m = (ax & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - e;  // 113 - e + 13
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t r = ax - 0x38000000;  // rebias exponent 127 -> 15
  const uint32_t rem = r & 0x1FFF;
  r >>= 13;
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) ++r;
  return sign | static_cast<uint16_t>(r);
}

float bf16_to_fp32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

namespace {

uint16_t rd16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// The 6-bit (scale, min) pair of Q4_K sub-block j (0..7) from its 12 packed bytes: sub-blocks 0..3 keep theirs in
// the low 6 bits of bytes j and j+4; 4..7 put the low 4 bits in byte j+4 and the top 2 bits in bytes j-4 / j.
void q4k_scale_min(int j, const uint8_t* q, int& sc, int& mn) {
  if (j < 4) {
    sc = q[j] & 63;
    mn = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

}  // namespace

void dequantize_row(GgmlType t, const uint8_t* src, float* dst, int64_t n) {
  const int64_t be = block_elems(t);
  if (n % be) throw std::invalid_argument("dequantize_row: length not a multiple of the block size");
  const int64_t nb = n / be;
  const size_t bb = block_bytes(t);
  switch (t) {
    case GgmlType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(rd16(src + 2 * i));
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(rd16(src + 2 * i));
      return;
    case GgmlType::Q8_0:
      for (int64_t b = 0; b < nb; ++b, src += bb, dst += 32) {
        const float d = fp16_to_fp32(rd16(src));
        const int8_t* q = reinterpret_cast<const int8_t*>(src + 2);
        for (int j = 0; j < 32; ++j) dst[j] = d * q[j];
      }
      return;
    case GgmlType::Q4_0:
      for (int64_t b = 0; b < nb; ++b, src += bb, dst += 32) {
        const float d = fp16_to_fp32(rd16(src));
        const uint8_t* q = src + 2;
        for (int j = 0; j < 16; ++j) {
          dst[j] = d * ((q[j] & 0x0F) - 8);
          dst[j + 16] = d * ((q[j] >> 4) - 8);
        }
      }
      return;
    case GgmlType::Q4_1:
      for (int64_t b = 0; b < nb; ++b, src += bb, dst += 32) {
        const float d = fp16_to_fp32(rd16(src)), m = fp16_to_fp32(rd16(src + 2));
        const uint8_t* q = src + 4;
        for (int j = 0; j < 16; ++j) {
          // One fused multiply-add, written out: the CPU's in-register widening (src/model/linear.cpp) uses the
          // same instruction, so a Q4_1 matrix read in place gives the bits of its fp32 copy.
          dst[j] = std::fma(d, static_cast<float>(q[j] & 0x0F), m);
          dst[j + 16] = std::fma(d, static_cast<float>(q[j] >> 4), m);
        }
      }
      return;
    case GgmlType::Q4_K:
      for (int64_t b = 0; b < nb; ++b, src += bb, dst += 256) {
        const float d = fp16_to_fp32(rd16(src)), dmin = fp16_to_fp32(rd16(src + 2));
        const uint8_t* scales = src + 4;
        const uint8_t* q = src + 16;
        for (int c = 0; c < 4; ++c) {  // 64-element chunks, two sub-blocks each
          int sc0, mn0, sc1, mn1;
          q4k_scale_min(2 * c, scales, sc0, mn0);
          q4k_scale_min(2 * c + 1, scales, sc1, mn1);
          const float d0 = d * sc0, m0 = dmin * mn0, d1 = d * sc1, m1 = dmin * mn1;
          float* y = dst + 64 * c;
          const uint8_t* qc = q + 32 * c;
          for (int l = 0; l < 32; ++l) {
            y[l] = d0 * (qc[l] & 0x0F) - m0;
            y[l + 32] = d1 * (qc[l] >> 4) - m1;
          }
        }
      }
      return;
    case GgmlType::Q6_K:
      for (int64_t b = 0; b < nb; ++b, src += bb, dst += 256) {
        const uint8_t* ql = src;
        const uint8_t* qh = src + 128;
        const int8_t* sc = reinterpret_cast<const int8_t*>(src + 192);
        const float d = fp16_to_fp32(rd16(src + 208));
        for (int h = 0; h < 2; ++h) {  // two halves of 128 elements: 64 bytes of ql, 32 of qh, 8 scales each
          const uint8_t* L = ql + 64 * h;
          const uint8_t* H = qh + 32 * h;
          const int8_t* S = sc + 8 * h;
          float* y = dst + 128 * h;
          for (int l = 0; l < 32; ++l) {
            const int s = l / 16;  // sub-blocks of 16
            const int q1 = ((L[l] & 0x0F) | ((H[l] & 3) << 4)) - 32;
            const int q2 = ((L[l + 32] & 0x0F) | (((H[l] >> 2) & 3) << 4)) - 32;
            const int q3 = ((L[l] >> 4) | (((H[l] >> 4) & 3) << 4)) - 32;
            const int q4 = ((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * S[s] * q1;
            y[l + 32] = d * S[s + 2] * q2;
            y[l + 64] = d * S[s + 4] * q3;
            y[l + 96] = d * S[s + 6] * q4;
          }
        }
      }
      return;
    default:
      throw std::invalid_argument(std::string("dequantize_row: unsupported type ") + type_name(t));
  }
}

}  // namespace elastic::gguf
