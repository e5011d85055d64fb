#pragma once
// XAttention's greedy block choice found as a threshold instead of by sorting (the fused estimator's selection,
// xattn_estimate_fused.cu), host and device, so tests/test_xattn_threshold.cpp checks on the CPU the very
// code the kernel runs.
//
// The rule (elastic::xattn_select): block 0 and the diagonal are kept; the other causal blocks ("candidates"), ordered
// by descending mass with ties to the lower index, are taken while the mass kept so far is < tau * total. Give each
// candidate the key (mass bits << 16 | 0xffff - kb): descending key order is exactly that order (masses are >= 0, so
// their float bits order as integers). A candidate is kept iff forced + (mass of the candidates with a larger key) <
// required, and that sum only grows as the key falls, so the kept candidates are those whose key exceeds
// t = the largest key at which forced + above(t) is not below `required`; the bisection over the 47 key bits finds it
// with 48 evaluations of above(t) (a warp's sum in the kernel). Masses are summed in 2^-44 fixed point: exact, so the
// order of the additions cannot change a sum (every lane of a warp agrees, runs repeat bit for bit).
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define ELASTIC_XT_HD __host__ __device__ __forceinline__
#else
#define ELASTIC_XT_HD inline
#endif

namespace elastic::cuda::xattn_threshold {

constexpr double kFixedOne = 17592186044416.0;  // 2^44; a block's mass is at most block/stride <= 16: sums < 2^60
constexpr uint64_t kNone = ~0ull;               // threshold: no candidate kept
constexpr int kMaxBlocks = 65535;               // the key's index field holds 16 bits

ELASTIC_XT_HD uint64_t to_fixed(float mass) {
  return static_cast<uint64_t>(static_cast<double>(mass) * kFixedOne + 0.5);
}

ELASTIC_XT_HD uint64_t order_key(float mass, int kb) {
#if defined(__CUDA_ARCH__)
  const uint32_t bits = __float_as_uint(mass);
#else
  uint32_t bits;
  std::memcpy(&bits, &mass, sizeof bits);
#endif
  return (static_cast<uint64_t>(bits) << 16) | static_cast<uint64_t>(0xffff - kb);
}

// The threshold key for one (query head, query block): `forced` is the fixed-point mass of block 0 and the diagonal,
// `required` = tau * the fixed-point total, above(t) the fixed-point mass of the candidates whose key exceeds t.
// kNone when nothing is kept (no candidates, or the forced blocks already reach `required`), 0 when every candidate
// is (their keys are > 0).
template <class Above>
ELASTIC_XT_HD uint64_t kept_threshold(bool has_candidates, uint64_t forced, double required, Above&& above) {
  if (!has_candidates || !(static_cast<double>(forced) < required)) return kNone;
  if (static_cast<double>(forced + above(0ull)) < required) return 0ull;
  uint64_t t = 0;  // invariant: forced + above(t) >= required; it fails at 2^47 - 1 (no key above it)
  for (int bit = 46; bit >= 0; --bit) {
    const uint64_t c = t | (1ull << bit);
    if (!(static_cast<double>(forced + above(c)) < required)) t = c;
  }
  return t;
}

// Whether candidate kb of mass `mass` is kept under threshold t.
ELASTIC_XT_HD bool kept(uint64_t t, float mass, int kb) { return t != kNone && order_key(mass, kb) > t; }

}  // namespace elastic::cuda::xattn_threshold
