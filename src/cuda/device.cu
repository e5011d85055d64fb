#include <cuda_runtime.h>

#include <atomic>
#include <stdexcept>
#include <string>

#include "elastic/cuda.h"

namespace elastic::cuda {

void check(int err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return;
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + what + " failed: " +
                           cudaGetErrorString(static_cast<cudaError_t>(err)));
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

int sm_count() {
  static std::atomic<int> cached[64] = {};
  int dev = 0;
  ELASTIC_CUDA_CHECK(cudaGetDevice(&dev));
  int n = dev >= 0 && dev < 64 ? cached[dev].load(std::memory_order_relaxed) : 0;
  if (n == 0) {
    ELASTIC_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    if (dev >= 0 && dev < 64) cached[dev].store(n, std::memory_order_relaxed);
  }
  return n;
}

std::string device_name(int device) {
  cudaDeviceProp p{};
  ELASTIC_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  return p.name;
}

}  // namespace elastic::cuda
