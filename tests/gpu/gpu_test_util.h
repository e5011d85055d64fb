#pragma once
// Helpers of the GPU tests: bf16 rounding written independently of the library (a host reference), and a device
// buffer that is poisoned at allocation (all bytes 0xff: NaN as fp32 and as bf16), so an element a kernel should
// have written but did not shows up as NaN.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "elastic/cuda.h"

// At the top of a test body: GPU tests skip (not fail) on machines without a CUDA device, such as CI.
#define SKIP_WITHOUT_GPU() \
  if (elastic::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device"

// A fresh seed per test, printed with any failure; ELASTIC_TEST_SEED=<n> replays one (std::random_device gives 32
// bits, so a printed seed is always a valid value for the variable).
#define SEEDED_RNG(rng)                                      \
  const unsigned rng##_seed = elastic::gpu_test::test_seed(); \
  SCOPED_TRACE("random seed " + std::to_string(rng##_seed)); \
  std::mt19937 rng(rng##_seed)

// The same as a uint64_t named `seed` (for make_model and a test's own 64-bit generators).
#define TRACED_SEED(seed)                                          \
  const uint64_t seed = elastic::gpu_test::test_seed();            \
  SCOPED_TRACE("random seed " + std::to_string(seed))

namespace elastic::gpu_test {

inline unsigned test_seed() {
  if (const char* e = std::getenv("ELASTIC_TEST_SEED"); e && *e) return static_cast<unsigned>(std::strtoul(e, nullptr, 10));
  return std::random_device{}();
}

inline uint16_t to_bf16(float f) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}
inline float from_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
constexpr uint16_t kNaNBf16 = 0x7fc0;

// n bf16 values drawn from N(0, sd).
inline std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float sd) {
  std::normal_distribution<float> N(0.f, sd);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = to_bf16(N(rng));
  return v;
}

// A non-default stream, so a kernel's stream argument is exercised. Blocking (it synchronizes with the legacy
// default stream), so synchronous uploads before a launch are ordered before it.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { ELASTIC_CUDA_CHECK(cudaStreamCreate(&s)); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() { cudaStreamDestroy(s); }
  void sync() const { ELASTIC_CUDA_CHECK(cudaStreamSynchronize(s)); }
};

template <class T>
struct Dev {  // device buffer, poisoned at allocation, freed on scope exit
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    ELASTIC_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T)));
    poison();
  }
  Dev(const std::vector<T>& h) : Dev(h.size()) { up(h); }  // NOLINT: implicit from a host vector on purpose
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(p); }
  void poison() { ELASTIC_CUDA_CHECK(cudaMemset(p, 0xff, std::max<size_t>(1, n) * sizeof(T))); }
  void up(const std::vector<T>& h) {
    if (h.size() > n) throw std::logic_error("Dev::up: host vector larger than the buffer");
    ELASTIC_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  // Synchronizes the device first, so work on any stream has finished.
  std::vector<T> down(size_t off = 0, size_t cnt = SIZE_MAX) const {
    ELASTIC_CUDA_CHECK(cudaDeviceSynchronize());
    cnt = std::min(cnt, n - off);
    std::vector<T> h(cnt);
    ELASTIC_CUDA_CHECK(cudaMemcpy(h.data(), p + off, cnt * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

}  // namespace elastic::gpu_test
