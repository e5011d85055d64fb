#pragma once
// bf16 pairs packed in 32-bit words (element 2i in the low half, 2i + 1 in the high half, as bf16 arrays load), and
// the 8-element dot product of two 16-byte chunks with fp32 fmas in element order; then a warp's per-lane partial sums
// of up to M output rows reduced to their totals. Shared by the engine's small-M kernel (gemv_small_m.cu) and the dev
// area's GEMV.
#include <cstdint>

namespace elastic::cuda {

__device__ __forceinline__ float bf16_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }

// The 8 elements of a 16-byte chunk as 4 words (elements 2i, 2i + 1 in word i's low and high halves).
__device__ __forceinline__ void words4(const uint4& v, uint32_t (&u)[4]) { u[0] = v.x, u[1] = v.y, u[2] = v.z, u[3] = v.w; }

// s + sum_e w[e] * x[e], one fma per element in order e = 0..7.
__device__ __forceinline__ float dot8_bf16(const uint4& w, const uint4& x, float s) {
  uint32_t a[4], b[4];
  words4(w, a), words4(x, b);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    s = fmaf(bf16_lo(a[i]), bf16_lo(b[i]), s);
    s = fmaf(bf16_hi(a[i]), bf16_hi(b[i]), s);
  }
  return s;
}

// Sums each of the M per-lane partials over the warp (xor butterfly over offsets 16..1: every lane ends with the same
// bits) and returns row `lane`'s total, for lanes 0..M-1 to write (other lanes get row 0's).
template <int M>
__device__ __forceinline__ float warp_row_total(float (&acc)[M], int lane) {
#pragma unroll
  for (int r = 0; r < M; ++r)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
  float v = acc[0];
#pragma unroll
  for (int r = 1; r < M; ++r)
    if (lane == r) v = acc[r];
  return v;
}

}  // namespace elastic::cuda
