#pragma once
// Helpers of the GPU tests: bf16 rounding written independently of the library (a host reference), and a device
// buffer that is poisoned at allocation (all bytes 0xff: NaN as fp32 and as bf16), so an element a kernel should
// have written but did not shows up as NaN.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "elastic/cuda.h"

// At the top of a test body: GPU tests skip (not fail) on machines without a CUDA device, such as CI.
#define SKIP_WITHOUT_GPU() \
  if (elastic::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device"

namespace elastic::gpu_test {

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
