// XAttention block estimation on the GPU (xattn_estimate_cuda), the scores through cuBLASLt: the pipeline of
// elastic::xattn_select (src/attention/xattn_select.cpp) for the KV heads routed to XAttention.
//
// Why a product: with stride S the antidiagonal scores of a chunk are one matrix product per KV head,
//   score(i, j) = Qf[i] . Kf[j] * scale,  Qf[i] = concat_s q[i*S + S-1-s],  Kf[j] = concat_s k[j*S + s]   (S*hd long),
// about 1/S of the chunk's QK^T work. The earlier mma.sync kernels (now dev/cuda/xattn_estimate_variants.cu) scored
// it from a 16-32-row query tile per CTA that rereads the whole key prefix (0.7-1.4x of a full attention layer on an
// H100); cuBLASLt runs the product at its tensor-core rate instead, and the softmax and the selection read the scores
// once.
//
// Per call (one prefill chunk: folded query rows [i0, R), i0 = pos0 / S, R = ceil(n_pos / S)):
//   1. pack: Qf [X][Rc_pad][G][S*hd] (row m = local row * G + query head g of the KV head; position-major, so a run
//      of query positions is a run of rows) and Kf [X][Rk_pad][S*hd], bf16, zero past the end; X = the scored KV heads;
//   2. per group of kRowGroup folded query rows: C[x] = Qf[x] rows of the group x Kf[x]^T over the key rows the group
//      can see (rounded up to kPad), fp32, one strided-batched cuBLASLt call over the X heads;
//   3. per (query block of the group, KV head): for each of its G query heads, the causal softmax of each folded row,
//      the block masses (one thread per (head, key block), rows in fixed order), then select_blocks (shared with the
//      dev variants).
// Shapes are padded to multiples of kPad so that the product's shapes (hence cuBLASLt plans) come from a bounded set.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "elastic/cuda.h"
#include "elastic/cuda_attention.h"
#include "elastic/cuda_gemm.h"
#include "xattn_estimate_check.h"
#include "xattn_estimate_fused.h"
#include "xattn_select_blocks.cuh"

namespace elastic::cuda {
namespace {

using xattn_detail::kThreads;
using xattn_detail::pow2_at_least;
using xattn_detail::select_blocks;

constexpr int kRowGroup = 256;  // folded query rows per product (4096 positions at stride 16)
constexpr int kPad = 256;       // row and column counts of the products are multiples of this
size_t align256(size_t n) { return (n + 255) & ~size_t(255); }

// The scratch regions of one call.
struct Layout {
  int R = 0, i0 = 0, Rc = 0, Rc_pad = 0, Rk_pad = 0, D = 0, G = 0, X = 0;
  size_t qf_bytes = 0, kf_bytes = 0, c_bytes = 0;
  size_t total() const { return qf_bytes + kf_bytes + c_bytes; }
};
Layout layout_for(int T, int pos0, int X, int G, int hd, int S) {
  Layout l;
  const int n_pos = pos0 + T;
  l.R = (n_pos + S - 1) / S;
  l.i0 = pos0 / S;
  l.Rc = l.R - l.i0;
  l.Rc_pad = static_cast<int>(round_up(l.Rc, kRowGroup));
  l.Rk_pad = static_cast<int>(round_up(l.R, kPad));
  l.D = S * hd;
  l.G = G;
  l.X = X;
  l.qf_bytes = align256(size_t(X) * l.Rc_pad * G * l.D * 2);
  l.kf_bytes = align256(size_t(X) * l.Rk_pad * l.D * 2);
  l.c_bytes = align256(size_t(X) * kRowGroup * G * size_t(l.Rk_pad) * 4);
  return l;
}

// Step 1, queries: one thread per 16 bytes (8 bf16) of Qf.
__global__ void pack_queries(const uint16_t* __restrict__ q, uint16_t* __restrict__ qf, int pos0, int n_pos, int Hq,
                             int G, int hd, int S, int i0, int Rc_pad, int X, HeadList heads) {
  const int per_row = S * hd / 8;  // 16-byte pieces of one folded row
  const int64_t n = int64_t(X) * Rc_pad * G * per_row;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * blockDim.x) {
    const int piece = static_cast<int>(idx % per_row);
    const int64_t row = idx / per_row;  // (x, il, g)
    const int g = static_cast<int>(row % G), il = static_cast<int>((row / G) % Rc_pad),
              x = static_cast<int>(row / (int64_t(G) * Rc_pad));
    const int s = piece * 8 / hd, d = piece * 8 % hd;
    const int pos = (i0 + il) * S + (S - 1 - s);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (pos < n_pos)
      v = *reinterpret_cast<const uint4*>(q + (int64_t(pos - pos0) * Hq + int64_t(heads.kv[x]) * G + g) * hd + d);
    reinterpret_cast<uint4*>(qf)[idx] = v;
  }
}

// Step 1, keys: one thread per 16 bytes of Kf.
__global__ void pack_keys(const uint16_t* __restrict__ k, uint16_t* __restrict__ kf, int n_pos, int Hkv, int hd,
                          int S, int Rk_pad, int X, HeadList heads) {
  const int per_row = S * hd / 8;
  const int64_t n = int64_t(X) * Rk_pad * per_row;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * blockDim.x) {
    const int piece = static_cast<int>(idx % per_row);
    const int64_t row = idx / per_row;
    const int j = static_cast<int>(row % Rk_pad), x = static_cast<int>(row / Rk_pad);
    const int s = piece * 8 / hd, d = piece * 8 % hd;
    const int pos = j * S + s;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (pos < n_pos) v = *reinterpret_cast<const uint4*>(k + (int64_t(pos) * Hkv + heads.kv[x]) * hd + d);
    reinterpret_cast<uint4*>(kf)[idx] = v;
  }
}

// Step 3 for the query blocks [qb_begin, qb_begin + gridDim.x) of one row group (folded rows from grow0) and KV head
// blockIdx.y, every query head of the KV head at once (a warp per folded row, a thread per (head, key block)), so the
// CTA keeps many loads in flight; then the selection head by head. c: [X][kRowGroup * G][ldc] raw dot products (ldc
// and the rows' starts are multiples of 4 floats). Shared: keys [pow2 >= nb], bs [G][nb], flag [nb], row statistics
// [G * rb][2].
__global__ void __launch_bounds__(kThreads)
    select_from_scores(const float* __restrict__ c, int64_t c_stride, int ldc, int grow0, int qb_begin, int R,
                       int nb, int B, int S, int G, float scale, float tau, const KVHeadMeta* __restrict__ meta,
                       HeadList heads, int32_t* __restrict__ blocks, int32_t* __restrict__ offsets,
                       int32_t* __restrict__ counts, float* __restrict__ block_scores) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int qb = qb_begin + blockIdx.x, kvh = blockIdx.y, rb = B / S;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid < G) {
    const int h = kvh * G + tid;
    const size_t row_off = static_cast<size_t>(h) * nb + qb;
    offsets[row_off] = static_cast<int32_t>(static_cast<int64_t>(h) * nb * (nb + 1) / 2 + int64_t(qb) * (qb + 1) / 2);
  }
  const int x = heads.slot[kvh];
  if (meta[kvh].mode != kv_mode::kXAttn || x < 0) return;  // counts stay 0 (cleared before)

  const int N = pow2_at_least(nb);
  unsigned long long* keys = reinterpret_cast<unsigned long long*>(smem);  // [N]
  float* bs = reinterpret_cast<float*>(keys + N);                           // [G][nb]
  int* flag = reinterpret_cast<int*>(bs + G * nb);                          // [nb]
  float* rstat = reinterpret_cast<float*>(flag + nb);                       // [G * rb][2]: max, 1 / sum
  const int n_rows = min(rb, R - qb * rb);
  const float* cx = c + x * c_stride;
  auto row_of = [&](int g, int r) { return cx + (int64_t(qb * rb + r - grow0) * G + g) * ldc; };

  // Causal softmax statistics of each (head, folded row): row i sees key rows [0, i].
  for (int pr = warp; pr < G * n_rows; pr += kThreads / 32) {
    const int g = pr / n_rows, r = pr % n_rows, n = qb * rb + r + 1;
    const float* row = row_of(g, r);
    // One read: each lane keeps a running (max, sum) of its scaled scores, then the warp combines them.
    float mx = -INFINITY, sum = 0.f;
    for (int j = lane * 4; j < n; j += 128) {
      const float4 v = *reinterpret_cast<const float4*>(row + j);
      const float e[4] = {v.x * scale, j + 1 < n ? v.y * scale : -INFINITY, j + 2 < n ? v.z * scale : -INFINITY,
                          j + 3 < n ? v.w * scale : -INFINITY};
      const float m4 = fmaxf(fmaxf(e[0], e[1]), fmaxf(e[2], e[3])), nm = fmaxf(mx, m4);
      sum = sum * expf(mx - nm) + expf(e[0] - nm) + expf(e[1] - nm) + expf(e[2] - nm) + expf(e[3] - nm);
      mx = nm;
    }
    xattn_detail::warp_combine_max_sum(mx, sum);
    if (lane == 0) rstat[2 * (g * rb + r)] = mx, rstat[2 * (g * rb + r) + 1] = 1.f / sum;
  }
  __syncthreads();
  // Block masses of every head: a thread per (head, key block), rows in order.
  for (int it = tid; it < G * (qb + 1); it += kThreads) {
    const int g = it / (qb + 1), kb = it % (qb + 1);
    float m = 0.f;
    for (int r = 0; r < n_rows; ++r) {
      const float* row = row_of(g, r);
      const float mx = rstat[2 * (g * rb + r)], inv = rstat[2 * (g * rb + r) + 1];
      const int j_end = min((kb + 1) * rb, qb * rb + r + 1);
      if (rb % 4 == 0) {
        for (int j = kb * rb; j < j_end; j += 4) {
          const float4 v = *reinterpret_cast<const float4*>(row + j);
          m += (expf(v.x * scale - mx) + (j + 1 < j_end ? expf(v.y * scale - mx) : 0.f) +
                (j + 2 < j_end ? expf(v.z * scale - mx) : 0.f) + (j + 3 < j_end ? expf(v.w * scale - mx) : 0.f)) *
               inv;
        }
      } else {
        for (int j = kb * rb; j < j_end; ++j) m += expf(row[j] * scale - mx) * inv;
      }
    }
    bs[g * nb + kb] = m;
    if (block_scores) block_scores[(static_cast<size_t>(kvh * G + g) * nb + qb) * nb + kb] = m;
  }
  __syncthreads();
  for (int g = 0; g < G; ++g) {
    const int h = kvh * G + g;
    select_blocks(bs + g * nb, qb, nb, tau, keys, flag, h, static_cast<size_t>(h) * nb + qb, blocks, counts);
    __syncthreads();
  }
}

size_t select_smem_bytes(int nb, int G, int rb) {
  return sizeof(unsigned long long) * pow2_at_least(nb) + 4 * (size_t(G) * nb + nb) + 8 * size_t(G) * rb;
}


// The selection kernel's shared memory against the device's opt-in limit.
bool select_smem_fits(const XAttnEstimateParams& p) {
  int dev = 0, optin = 0;
  ELASTIC_CUDA_CHECK(cudaGetDevice(&dev));
  ELASTIC_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  const int nb = (p.pos0 + p.T + p.block - 1) / p.block;
  return select_smem_bytes(nb, p.n_heads / p.n_kv_heads, p.block / p.stride) + 4096 <= static_cast<size_t>(optin);
}

}  // namespace

size_t xattn_gemm_scratch_bytes(int T, int n_pos, int n_kv_heads, int n_heads_per_kv, int head_dim, int stride) {
  if (T <= 0 || n_pos < T || n_kv_heads <= 0 || n_heads_per_kv <= 0 || head_dim <= 0 || stride <= 0) return 0;
  // The chunk's folded rows are ceil(T / S) wherever it starts (pos0 is a multiple of the block, hence of S); the key
  // rows grow with n_pos: the last chunk is the largest.
  const Layout a = layout_for(T, n_pos - T, n_kv_heads, n_heads_per_kv, head_dim, stride);
  return a.total();
}


size_t xattn_estimate_scratch_bytes(XAttnEstimateKernel form, int T, int n_pos, int n_kv_heads, int n_heads_per_kv,
                                    int head_dim, int stride, int block) {
  switch (form) {
    case XAttnEstimateKernel::Auto:
    case XAttnEstimateKernel::Gemm:
      return xattn_gemm_scratch_bytes(T, n_pos, n_kv_heads, n_heads_per_kv, head_dim, stride);
    case XAttnEstimateKernel::Fused:
      return xattn_fused_scratch_bytes(T, n_pos, n_kv_heads, n_heads_per_kv, head_dim, stride, block);
    default:
      return 0;
  }
}

void xattn_estimate_cuda(const XAttnEstimateParams& p, cudaStream_t stream) {
  check_xattn_estimate(p, "xattn_estimate_cuda");
  if (p.kernel == XAttnEstimateKernel::Fused) return xattn_estimate_fused(p, stream);
  if (p.kernel != XAttnEstimateKernel::Auto && p.kernel != XAttnEstimateKernel::Gemm)
    throw std::invalid_argument("xattn_estimate_cuda: the mma.sync and fp32 forms are measurement variants that "
                                "dev/cuda's xattn_estimate_variant runs");
  int X = 0;
  const HeadList heads = head_list(p, X, "xattn_estimate_cuda: the Gemm form");
  const int G = p.n_heads / p.n_kv_heads, S = p.stride, hd = p.head_dim, B = p.block, rb = B / S;
  const int n_pos = p.pos0 + p.T, nb = (n_pos + B - 1) / B, qb0 = p.pos0 / B;
  if (!p.gemm || !p.scratch) throw std::invalid_argument("xattn_estimate_cuda: the Gemm form needs gemm and scratch");
  if (hd % 8) throw std::invalid_argument("xattn_estimate_cuda: the Gemm form needs head_dim % 8 == 0");
  if (!select_smem_fits(p))
    throw std::invalid_argument("xattn_estimate_cuda: the Gemm form's selection needs more shared memory than the "
                                "device allows for " + std::to_string(n_pos) + " positions at block " +
                                std::to_string(B));
  const Layout l = layout_for(p.T, p.pos0, X, G, hd, S);
  if (X > 0 && l.total() > p.scratch_bytes)
    throw std::invalid_argument("xattn_estimate_cuda: the Gemm form needs " + std::to_string(l.total()) +
                                " bytes of scratch for this chunk, got " + std::to_string(p.scratch_bytes));
  ELASTIC_CUDA_CHECK(cudaMemsetAsync(p.counts, 0, sizeof(int32_t) * p.n_heads * nb, stream));

  auto* base = static_cast<unsigned char*>(p.scratch);
  auto* qf = reinterpret_cast<uint16_t*>(base);
  auto* kf = reinterpret_cast<uint16_t*>(base + l.qf_bytes);
  auto* cs = reinterpret_cast<float*>(base + l.qf_bytes + l.kf_bytes);
  constexpr int kPackThreads = 256, kPackBlocks = 132 * 8;
  if (X > 0) {
    pack_queries<<<kPackBlocks, kPackThreads, 0, stream>>>(p.q, qf, p.pos0, n_pos, p.n_heads, G, hd, S, l.i0,
                                                             l.Rc_pad, X, heads);
    ELASTIC_CUDA_CHECK(cudaGetLastError());
    pack_keys<<<kPackBlocks, kPackThreads, 0, stream>>>(p.k, kf, n_pos, p.n_kv_heads, hd, S, l.Rk_pad, X, heads);
    ELASTIC_CUDA_CHECK(cudaGetLastError());
  }
  const size_t smem = select_smem_bytes(nb, G, rb);
  ELASTIC_CUDA_CHECK(
      cudaFuncSetAttribute(select_from_scores, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const float scale = 1.f / std::sqrt(static_cast<float>(hd)) / static_cast<float>(S);
  const int M = kRowGroup * G;
  for (int r0 = 0; r0 < l.Rc; r0 += kRowGroup) {
    const int grow0 = l.i0 + r0, rows = std::min(kRowGroup, l.Rc - r0);
    const int n_cols = static_cast<int>(std::min<int64_t>(l.Rk_pad, round_up(grow0 + kRowGroup, kPad)));
    if (X > 0)
      p.gemm->bf16_out_f32_batched(qf + int64_t(r0) * G * l.D, kf, cs, M, n_cols, l.D, X,
                                   int64_t(l.Rc_pad) * G * l.D, int64_t(l.Rk_pad) * l.D, int64_t(M) * n_cols, stream);
    // The group's query blocks: its rows start on a block (kRowGroup and i0 are multiples of rb).
    const int qb_begin = qb0 + r0 / rb, n_qb = (rows + rb - 1) / rb;
    select_from_scores<<<dim3(n_qb, p.n_kv_heads), kThreads, smem, stream>>>(
        cs, int64_t(M) * n_cols, n_cols, grow0, qb_begin, l.R, nb, B, S, G, scale, p.tau, p.meta, heads, p.blocks,
        p.offsets, p.counts, p.block_scores);
    ELASTIC_CUDA_CHECK(cudaGetLastError());
  }
}

namespace {

__global__ void add_kept_blocks(const int32_t* __restrict__ counts, int n_heads, int G, int nb, int qb_begin, int n_qb,
                                const KVHeadMeta* __restrict__ meta, unsigned long long* __restrict__ total) {
  unsigned long long sum = 0;
  const int64_t n = int64_t(n_heads) * n_qb;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int h = static_cast<int>(i / n_qb), qb = qb_begin + static_cast<int>(i % n_qb);
    if (meta[h / G].mode == kv_mode::kXAttn) sum += static_cast<unsigned long long>(counts[int64_t(h) * nb + qb]);
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (threadIdx.x % 32 == 0 && sum) atomicAdd(total, sum);  // integer sums: the total does not depend on the order
}

}  // namespace

void xattn_add_kept_blocks(const int32_t* counts, int n_heads, int n_kv_heads, int nb, int qb_begin, int qb_end,
                           const KVHeadMeta* meta, unsigned long long* total, cudaStream_t stream) {
  if (!counts || !meta || !total || n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads || qb_begin < 0 ||
      qb_end > nb)
    throw std::invalid_argument("xattn_add_kept_blocks: null pointer or bad shape");
  if (qb_end <= qb_begin) return;
  const int n_qb = qb_end - qb_begin;
  const int64_t n = int64_t(n_heads) * n_qb;
  const int threads = 256, blocks = static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 264));
  add_kept_blocks<<<blocks, threads, 0, stream>>>(counts, n_heads, n_heads / n_kv_heads, nb, qb_begin, n_qb, meta,
                                                  total);
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace elastic::cuda
