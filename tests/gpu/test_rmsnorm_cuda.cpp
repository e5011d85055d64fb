// GPU test (CTest label "gpu", run on the GPU machine): CUDA RMSNorm vs the fp32 CPU formula, bf16 tolerance.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "elastic/cuda.h"
#include "elastic/safetensors.h"

using namespace elastic;

static uint16_t f32_to_bf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

TEST(CudaRmsNorm, MatchesCpuReference) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  const int rows = 37, n = 4096;
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> N(0.f, 1.f);
  std::vector<uint16_t> x(rows * n), w(n), y(rows * n, 0xffff);  // poisoned output
  for (auto& v : x) v = f32_to_bf16(N(rng));
  for (auto& v : w) v = f32_to_bf16(1.f + 0.1f * N(rng));
  uint16_t *dx, *dw, *dy;
  ELASTIC_CUDA_CHECK(cudaMalloc(&dx, x.size() * 2));
  ELASTIC_CUDA_CHECK(cudaMalloc(&dw, w.size() * 2));
  ELASTIC_CUDA_CHECK(cudaMalloc(&dy, y.size() * 2));
  ELASTIC_CUDA_CHECK(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  ELASTIC_CUDA_CHECK(cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
  ELASTIC_CUDA_CHECK(cudaMemcpy(dy, y.data(), y.size() * 2, cudaMemcpyHostToDevice));
  cuda::rmsnorm_bf16(dx, dw, dy, rows, n, 1e-6f);
  ELASTIC_CUDA_CHECK(cudaDeviceSynchronize());
  ELASTIC_CUDA_CHECK(cudaMemcpy(y.data(), dy, y.size() * 2, cudaMemcpyDeviceToHost));
  double max_err = 0, max_ref = 0;
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < n; ++i) ss += double(bf16_to_f32(x[r * n + i])) * bf16_to_f32(x[r * n + i]);
    double inv = 1.0 / std::sqrt(ss / n + 1e-6);
    for (int i = 0; i < n; ++i) {
      double ref = bf16_to_f32(w[i]) * bf16_to_f32(x[r * n + i]) * inv;
      max_err = std::max(max_err, std::abs(ref - bf16_to_f32(y[r * n + i])));
      max_ref = std::max(max_ref, std::abs(ref));
    }
  }
  EXPECT_LT(max_err / max_ref, 1e-2);
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dy);
}
