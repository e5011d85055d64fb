#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <vector>
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

double copy_bandwidth_gbs(size_t bytes) {
  void *a = nullptr, *b = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  std::vector<float> ms;
  try {
    ELASTIC_CUDA_CHECK(cudaMalloc(&a, bytes));
    ELASTIC_CUDA_CHECK(cudaMalloc(&b, bytes));
    ELASTIC_CUDA_CHECK(cudaMemset(a, 1, bytes));
    ELASTIC_CUDA_CHECK(cudaEventCreate(&e0));
    ELASTIC_CUDA_CHECK(cudaEventCreate(&e1));
    for (int i = 0; i < 11; ++i) {  // the first is a warm-up
      ELASTIC_CUDA_CHECK(cudaEventRecord(e0));
      ELASTIC_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
      ELASTIC_CUDA_CHECK(cudaEventRecord(e1));
      ELASTIC_CUDA_CHECK(cudaEventSynchronize(e1));
      float t = 0;
      ELASTIC_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
      if (i > 0) ms.push_back(t);
    }
  } catch (...) {
    cudaFree(a), cudaFree(b);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    throw;
  }
  cudaFree(a), cudaFree(b);
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return 2.0 * double(bytes) / (ms[ms.size() / 2] * 1e-3) * 1e-9;
}

std::string device_name(int device) {
  cudaDeviceProp p{};
  ELASTIC_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  return p.name;
}

}  // namespace elastic::cuda
