#pragma once
// CUDA backend entry points (compiled when ELASTIC_CUDA is on). Every CUDA call is checked.
#include <cstddef>
#include <cstdint>
#include <string>

namespace elastic::cuda {

// Throws std::runtime_error with the CUDA error string and call site.
void check(int err, const char* what, const char* file, int line);
#define ELASTIC_CUDA_CHECK(call) ::elastic::cuda::check(static_cast<int>(call), #call, __FILE__, __LINE__)

int device_count();           // 0 when no driver or GPU
std::string device_name(int device);
int sm_count();
// Device-to-device copy rate of the current device, read + written bytes per second (GB/s), median of 10 copies of
// `bytes`: the ceiling of a step that reads its weights and K/V once (decode's roofline figure).
double copy_bandwidth_gbs(size_t bytes = size_t(1) << 30);               // SMs of the current device (queried once per device; for grid sizing)

// y[rows, n] = w[n] * x * rsqrt(mean(x^2) + eps), bf16 in/out, fp32 math. Device pointers, async on stream 0.
void rmsnorm_bf16(const uint16_t* x, const uint16_t* w, uint16_t* y, int rows, int n, float eps);

}  // namespace elastic::cuda
