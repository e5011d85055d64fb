// Last-row attention weights for probing (cuda_paged_decode.h: last_row_probs_paged). Speed is secondary here (a
// probe runs one such step per prompt), so one CTA per query head walks its KV head's pages with a thread per key,
// in fp32.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "elastic/cuda.h"
#include "elastic/cuda_paged_decode.h"

namespace elastic::cuda {
namespace {

constexpr int kThreads = 256;

__device__ float block_reduce(float x, bool is_max, float* red) {
  for (int o = 16; o > 0; o >>= 1) {
    const float y = __shfl_xor_sync(0xffffffffu, x, o);
    x = is_max ? fmaxf(x, y) : x + y;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();  // red is reused between calls
  if (lane == 0) red[warp] = x;
  __syncthreads();
  x = red[0];
  for (int w = 1; w < kThreads / 32; ++w) x = is_max ? fmaxf(x, red[w]) : x + red[w];
  return x;
}

// grid: n_heads; out[h, t] = softmax_t(q_h . k_t / sqrt(hd)) over t < n_pos of KV head h / group's pages.
__global__ void __launch_bounds__(kThreads) last_row_probs_kernel(const __nv_bfloat16* q, const __nv_bfloat16* k_pool,
                                                                  const int32_t* page_table,
                                                                  const PagedDecodeHead* heads, int group,
                                                                  int head_dim, int page_size, int n_pos, float scale,
                                                                  float* out) {
  extern __shared__ float qs[];  // [head_dim]
  __shared__ float red[kThreads / 32];
  const int h = blockIdx.x;
  const int32_t* pages = page_table + heads[h / group].page_offset;
  for (int d = threadIdx.x; d < head_dim; d += kThreads) qs[d] = __bfloat162float(q[size_t(h) * head_dim + d]);
  __syncthreads();
  float* o = out + size_t(h) * n_pos;
  float mx = -INFINITY;
  for (int t = threadIdx.x; t < n_pos; t += kThreads) {
    const __nv_bfloat16* kr = k_pool + (size_t(pages[t / page_size]) * page_size + t % page_size) * head_dim;
    float s = 0.f;
    for (int d = 0; d < head_dim; ++d) s += qs[d] * __bfloat162float(kr[d]);
    s *= scale;
    o[t] = s;
    mx = fmaxf(mx, s);
  }
  mx = block_reduce(mx, true, red);
  float sum = 0.f;
  for (int t = threadIdx.x; t < n_pos; t += kThreads) {
    const float e = expf(o[t] - mx);
    o[t] = e;
    sum += e;
  }
  const float inv = 1.f / block_reduce(sum, false, red);
  for (int t = threadIdx.x; t < n_pos; t += kThreads) o[t] *= inv;
}

}  // namespace

void last_row_probs_paged(const void* q, const void* k_pool, const int32_t* page_table, const PagedDecodeHead* heads,
                          int n_heads, int n_kv_heads, int head_dim, int page_size, int n_pos, float* out,
                          cudaStream_t stream) {
  if (n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads)
    throw std::invalid_argument("last_row_probs: n_heads must be a positive multiple of n_kv_heads");
  if (head_dim <= 0 || head_dim > 1024)
    throw std::invalid_argument("last_row_probs: head_dim must be in [1, 1024] (got " + std::to_string(head_dim) + ")");
  if (n_pos <= 0 || page_size <= 0)
    throw std::invalid_argument("last_row_probs: n_pos and page_size must be > 0 (got " + std::to_string(n_pos) +
                                ", " + std::to_string(page_size) + ")");
  last_row_probs_kernel<<<n_heads, kThreads, head_dim * sizeof(float), stream>>>(
      static_cast<const __nv_bfloat16*>(q), static_cast<const __nv_bfloat16*>(k_pool), page_table, heads,
      n_heads / n_kv_heads, head_dim, page_size, n_pos, 1.f / std::sqrt(static_cast<float>(head_dim)), out);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace elastic::cuda
