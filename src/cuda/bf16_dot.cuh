#pragma once
// bf16 pairs packed in 32-bit words (element 2i in the low half, 2i + 1 in the high half, as bf16 arrays load), and
// the 8-element dot product of two 16-byte chunks with fp32 fmas in element order. Shared by the engine's small-M
// kernel (gemv_small_m.cu) and the dev area's GEMV.
#include <cstdint>

namespace elastic::cuda {

__device__ __forceinline__ float bf16_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }

// s + sum_e w[e] * x[e], one fma per element in order e = 0..7.
__device__ __forceinline__ float dot8_bf16(const uint4& w, const uint4& x, float s) {
  s = fmaf(bf16_lo(w.x), bf16_lo(x.x), s);
  s = fmaf(bf16_hi(w.x), bf16_hi(x.x), s);
  s = fmaf(bf16_lo(w.y), bf16_lo(x.y), s);
  s = fmaf(bf16_hi(w.y), bf16_hi(x.y), s);
  s = fmaf(bf16_lo(w.z), bf16_lo(x.z), s);
  s = fmaf(bf16_hi(w.z), bf16_hi(x.z), s);
  s = fmaf(bf16_lo(w.w), bf16_lo(x.w), s);
  s = fmaf(bf16_hi(w.w), bf16_hi(x.w), s);
  return s;
}

}  // namespace elastic::cuda
