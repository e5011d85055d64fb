// Dev area: copies into contiguous per-head caches (contiguous_decode.h), the layout dev/cuda/decode_attention.cu
// reads. The GPU model writes K/V into pages instead (src/cuda/paged_decode.cu: paged_scatter, paged_append).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "contiguous_decode.h"
#include "elastic/cuda.h"

namespace elastic::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;

void need(bool ok, const char* fn, const std::string& what) {
  if (!ok) throw std::invalid_argument(std::string(fn) + ": " + what);
}
std::string got(int64_t v) { return " (got " + std::to_string(v) + ")"; }
__host__ __device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
int blocks_for(int64_t work, int threads) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((work + threads - 1) / threads, kMaxBlocks)));
}

// ---- per-head KV caches --------------------------------------------------------------------------------------

// Position j's slot in a head's cache, or -1 when a ring head skips it (overwritten later in the same copy).
__device__ __forceinline__ int head_slot(int j, int sink, int ring, int n_pos) {
  if (ring == 0 || j < sink) return j;
  if (j < n_pos - ring) return -1;
  return sink + (j - sink) % ring;
}

// Grid-stride over units of VEC bf16: unit u = (j * Hkv + h) * (hd / VEC) + c, so source reads are coalesced.
// Head caches are device pointers we cannot inspect on the host: a 16-byte unit goes to a misaligned cache as
// 8 two-byte stores.
template <int VEC>
__global__ void scatter_kernel(const uint16_t* src, int n_pos, int Hkv, int hd, uint16_t* const* dst,
                               const int32_t* sink_slots, const int32_t* ring_slots) {
  const int hdv = hd / VEC;
  const int64_t total = static_cast<int64_t>(n_pos) * Hkv * hdv;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < total;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(u % hdv);
    const int64_t jh = u / hdv;
    const int h = static_cast<int>(jh % Hkv), j = static_cast<int>(jh / Hkv);
    const int slot = head_slot(j, sink_slots[h], ring_slots[h], n_pos);
    if (slot < 0) continue;
    uint16_t* d = dst[h] + static_cast<size_t>(slot) * hd + static_cast<size_t>(c) * VEC;
    const uint16_t* s = src + u * VEC;
    if constexpr (VEC == 8) {
      const uint4 val = *reinterpret_cast<const uint4*>(s);
      if (aligned16(d)) {
        *reinterpret_cast<uint4*>(d) = val;
      } else {
        const uint16_t* e = reinterpret_cast<const uint16_t*>(&val);
#pragma unroll
        for (int k = 0; k < 8; ++k) d[k] = e[k];
      }
    } else {
      *d = *s;
    }
  }
}

// One block per KV head: the new token's row into slot(pos) of the head's k and v caches.
__global__ void append_kernel(const uint16_t* k_new, const uint16_t* v_new, const int32_t* pos_dev, int hd,
                              uint16_t* const* k_dst, uint16_t* const* v_dst, const int32_t* sink_slots,
                              const int32_t* ring_slots) {
  const int h = blockIdx.x, j = *pos_dev;
  if (j < 0) return;
  const int sink = sink_slots[h], ring = ring_slots[h];
  const int slot = ring == 0 || j < sink ? j : sink + (j - sink) % ring;
  uint16_t* kd = k_dst[h] + static_cast<size_t>(slot) * hd;
  uint16_t* vd = v_dst[h] + static_cast<size_t>(slot) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    kd[d] = k_new[static_cast<size_t>(h) * hd + d];
    vd[d] = v_new[static_cast<size_t>(h) * hd + d];
  }
}

}  // namespace

void scatter_to_head_caches(const uint16_t* src, int n_pos, int n_kv_heads, int head_dim, uint16_t* const* dst,
                            const int32_t* sink_slots, const int32_t* ring_slots, cudaStream_t stream) {
  const char* fn = "scatter_to_head_caches";
  need(n_pos >= 0, fn, "n_pos must be >= 0" + got(n_pos));
  need(n_kv_heads > 0, fn, "n_kv_heads must be > 0" + got(n_kv_heads));
  need(head_dim > 0, fn, "head_dim must be > 0" + got(head_dim));
  if (n_pos == 0) return;
  need(src && dst && sink_slots && ring_slots, fn, "null src, dst, sink_slots or ring_slots");
  const int64_t n = static_cast<int64_t>(n_pos) * n_kv_heads * head_dim;
  if (head_dim % 8 == 0 && aligned16(src))
    scatter_kernel<8><<<blocks_for(n / 8, kThreads), kThreads, 0, stream>>>(src, n_pos, n_kv_heads, head_dim, dst,
                                                                            sink_slots, ring_slots);
  else
    scatter_kernel<1><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(src, n_pos, n_kv_heads, head_dim, dst,
                                                                        sink_slots, ring_slots);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

void append_to_head_caches(const uint16_t* k_new, const uint16_t* v_new, const int32_t* pos_dev, int n_kv_heads,
                           int head_dim, uint16_t* const* k_dst, uint16_t* const* v_dst, const int32_t* sink_slots,
                           const int32_t* ring_slots, cudaStream_t stream) {
  const char* fn = "append_to_head_caches";
  need(n_kv_heads > 0, fn, "n_kv_heads must be > 0" + got(n_kv_heads));
  need(head_dim > 0, fn, "head_dim must be > 0" + got(head_dim));
  need(k_new && v_new && pos_dev && k_dst && v_dst && sink_slots && ring_slots, fn,
       "null k_new, v_new, pos_dev, k_dst, v_dst, sink_slots or ring_slots");
  append_kernel<<<n_kv_heads, 128, 0, stream>>>(k_new, v_new, pos_dev, head_dim, k_dst, v_dst, sink_slots,
                                                ring_slots);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace elastic::cuda
