#pragma once
// An owning device allocation (cudaMalloc / cudaFree), movable, typed views by cast.
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "elastic/cuda.h"

namespace elastic::cuda {

struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;

  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { alloc(n); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr(std::exchange(o.ptr, nullptr)), bytes(std::exchange(o.bytes, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      ptr = std::exchange(o.ptr, nullptr);
      bytes = std::exchange(o.bytes, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { release(); }

  void alloc(size_t n) {
    release();
    if (n == 0) return;
    ELASTIC_CUDA_CHECK(cudaMalloc(&ptr, n));
    bytes = n;
  }
  void release() {
    if (ptr) cudaFree(ptr);  // no check: runs in destructors
    ptr = nullptr;
    bytes = 0;
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

}  // namespace elastic::cuda
