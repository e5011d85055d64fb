// Paged decode attention (cuda_paged_decode.h).
//
// A warp's unit: keys [key_begin, key_end) of one KV head, 16 keys (one tile, inside one page) at a time. With
// g = lane / 4 and q = lane % 4 (the mma fragment coordinates):
//   scores  S^T [16 keys x 8 heads] = K_tile [16 x hd] . Q^T [hd x 8]: A = K rows g and g + 8, read as 16-byte
//           pieces at dims i*32 + q*8 (i < hd/32): the dot product does not care which dims a k-slot holds as long
//           as K and Q agree, and this order makes each load instruction read 64 contiguous bytes of 8 rows.
//   outputs O^T [hd x 8 heads] += V^T [hd x 16 keys] . P^T [16 keys x 8]: A = V rows 2q, 2q + 1, 2q + 8, 2q + 9,
//           dims c*64 + g*8 (16-byte pieces, 128 contiguous bytes of 4 rows per instruction); an mma A register
//           pairs two keys of one dim, built from two rows' words with one byte permute (no shared-memory
//           transpose). P goes through 256 bytes of shared memory per warp to change from the scores' fragment
//           (keys by g) to the B fragment (heads by g).
// Online softmax in base 2 per query head; the unit's unnormalized output, max and sum go to the workspace and
// paged_decode_merge combines a head's units. More than 8 query heads per KV head: two n-tiles of 8 heads.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "cuda/mma_sync.cuh"
#include "elastic/cuda.h"
#include "elastic/cuda_paged_decode.h"
#include "programmatic_launch.cuh"

namespace elastic::cuda {
namespace {

constexpr int kWarps = 4, kThreads = kWarps * 32, kMaxGroup = 16;

__device__ __forceinline__ uint32_t word(const uint4& v, int k) { return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w; }

__device__ __forceinline__ uint4 load16(const __nv_bfloat16* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

template <int HD, int NT>
__global__ void __launch_bounds__(kThreads) paged_decode_partial(const PagedDecodeParams p, float scale_log2) {
  pdl_enter();  // programmatic_launch.cuh: before the first read of an earlier kernel's output
  constexpr int KI = HD / 32, VC = HD / 64, MT = HD / 16;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  __shared__ __align__(16) __nv_bfloat16 sp[kWarps][NT * 8][kPagedTile];  // P of this warp's tile, [head][key]
  const int n_units = p.n_units_dev ? *p.n_units_dev : p.n_units;
  const int u = blockIdx.x * kWarps + warp;
  if (u >= n_units) return;  // per warp; the kernel has no block-wide barrier
  const PagedDecodeUnit unit = p.units[u];
  const PagedDecodeHead head = p.heads[unit.head];
  const int G = p.n_heads / p.n_kv_heads, seq = unit.head / p.n_kv_heads, kvh = unit.head % p.n_kv_heads;
  const int key_end = min(unit.key_end, head.kept);  // a unit cut for a larger capacity reads only what is kept
  float* ws = p.workspace + size_t(u) * G * (HD + 2);
  if (unit.key_begin >= key_end) {  // no keys: max -inf marks the partial empty for the merge
    if (lane < G) ws[lane * (HD + 2) + HD] = -INFINITY, ws[lane * (HD + 2) + HD + 1] = 0.f;
    return;
  }
  const __nv_bfloat16* qg = static_cast<const __nv_bfloat16*>(p.q) + (size_t(seq) * p.n_heads + kvh * G) * HD;
  uint4 qf[NT][KI];  // B fragments of Q: head nt*8 + g, dims i*32 + q*8 .. + 8 (zero past the group)
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < KI; ++i)
      qf[nt][i] = nt * 8 + g < G ? load16(qg + (nt * 8 + g) * HD + i * 32 + q * 8) : make_uint4(0, 0, 0, 0);
  float m_run[NT][2], l_run[NT][2], acc[MT][NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    m_run[nt][0] = m_run[nt][1] = -INFINITY;
    l_run[nt][0] = l_run[nt][1] = 0.f;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;
  }
  const int32_t* pages = p.page_table + head.page_offset;
  const int P = p.page_size;
  const __nv_bfloat16* kpool = static_cast<const __nv_bfloat16*>(p.k_pool);
  const __nv_bfloat16* vpool = static_cast<const __nv_bfloat16*>(p.v_pool);
  for (int t0 = unit.key_begin; t0 < key_end; t0 += kPagedTile) {
    const size_t base = (size_t(pages[t0 / P]) * P + t0 % P) * HD;  // the tile's 16 rows lie in one page
    const int n_valid = key_end - t0;  // rows past it: the next unit's or past the head's kept positions
    uint4 kr[2][KI], vr[4][VC];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int i = 0; i < KI; ++i) kr[r][i] = load16(kpool + base + (g + 8 * r) * HD + i * 32 + q * 8);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int row = 2 * q + (r & 1) + 8 * (r >> 1);
#pragma unroll
      for (int c = 0; c < VC; ++c) {
        // Past the unit: zeros, not whatever a reused page holds (0 * NaN would poison the sums).
        vr[r][c] = row < n_valid ? load16(vpool + base + row * HD + c * 64 + g * 8) : make_uint4(0, 0, 0, 0);
      }
    }
    float s[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
      for (int st = 0; st < HD / 16; ++st) {
        const int i = st >> 1, h = st & 1;
        const uint32_t a[4] = {word(kr[0][i], 2 * h), word(kr[1][i], 2 * h), word(kr[0][i], 2 * h + 1),
                               word(kr[1][i], 2 * h + 1)};
        mma_bf16(s[nt], a, word(qf[nt][i], 2 * h), word(qf[nt][i], 2 * h + 1));
      }
    }
    const bool ok0 = g < n_valid, ok1 = g + 8 < n_valid;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int j = 0; j < 2; ++j) {  // query head nt*8 + 2q + j; keys g and g + 8
        const float x0 = ok0 ? s[nt][j] * scale_log2 : -INFINITY, x1 = ok1 ? s[nt][2 + j] * scale_log2 : -INFINITY;
        float mx = fmaxf(x0, x1);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        const float m_new = fmaxf(m_run[nt][j], mx);  // finite: the tile's first key is always valid
        const float alpha = exp2f(m_run[nt][j] - m_new), p0 = exp2f(x0 - m_new), p1 = exp2f(x1 - m_new);
        l_run[nt][j] = l_run[nt][j] * alpha + p0 + p1;
        m_run[nt][j] = m_new;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) acc[mt][nt][j] *= alpha, acc[mt][nt][2 + j] *= alpha;
        sp[warp][nt * 8 + 2 * q + j][g] = __float2bfloat16(p0);
        sp[warp][nt * 8 + 2 * q + j][g + 8] = __float2bfloat16(p1);
      }
    __syncwarp();
    uint32_t b0[NT], b1[NT];  // P^T: head nt*8 + g, keys 2q, 2q + 1 and 2q + 8, 2q + 9
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      b0[nt] = *reinterpret_cast<const uint32_t*>(&sp[warp][nt * 8 + g][2 * q]);
      b1[nt] = *reinterpret_cast<const uint32_t*>(&sp[warp][nt * 8 + g][2 * q + 8]);
    }
    __syncwarp();  // the next tile overwrites sp
#pragma unroll
    for (int c = 0; c < VC; ++c)
#pragma unroll
      for (int w = 0; w < 4; ++w) {  // m-tile 4c + w: dims c*64 + g*8 + 2w (rows g) and + 1 (rows g + 8)
        const uint32_t x0 = word(vr[0][c], w), x1 = word(vr[1][c], w), x2 = word(vr[2][c], w), x3 = word(vr[3][c], w);
        const uint32_t a[4] = {__byte_perm(x0, x1, 0x5410), __byte_perm(x0, x1, 0x7632), __byte_perm(x2, x3, 0x5410),
                               __byte_perm(x2, x3, 0x7632)};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma_bf16(acc[4 * c + w][nt], a, b0[nt], b1[nt]);
      }
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float l = l_run[nt][j];
      l += __shfl_xor_sync(0xffffffffu, l, 4);
      l += __shfl_xor_sync(0xffffffffu, l, 8);
      l += __shfl_xor_sync(0xffffffffu, l, 16);
      const int hq = nt * 8 + 2 * q + j;
      if (hq >= G) continue;
      float* w = ws + hq * (HD + 2);
#pragma unroll
      for (int c = 0; c < VC; ++c)
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          w[c * 64 + g * 8 + 2 * x] = acc[4 * c + x][nt][j];
          w[c * 64 + g * 8 + 2 * x + 1] = acc[4 * c + x][nt][2 + j];
        }
      if (g == 0) w[HD] = m_run[nt][j], w[HD + 1] = l;
    }
}

// One CTA per (sequence, query head) merges its KV head's units, each weighted by 2^(m_unit - max). The units are
// spread over the CTA's warps (warp w folds units w, w + kMergeWarps, ... with an online rescale, each lane holding
// HD / 32 dims), so a head's loads are in flight together: a full head at 128K has hundreds of units, and one loop
// over them (the first form) cost most of a batch-1 step. The warps' partials are combined in shared memory.
constexpr int kMergeWarps = 16;

template <int HD>
__global__ void __launch_bounds__(kMergeWarps * 32) paged_decode_merge(const PagedDecodeParams p) {
  pdl_enter();  // programmatic_launch.cuh: before the first read of an earlier kernel's output
  constexpr int PL = HD / 32;  // dims per lane, as PL / 2 float2 loads (a unit's row of HD + 2 floats is 8-byte aligned)
  __shared__ float s_o[kMergeWarps][HD], s_m[kMergeWarps], s_l[kMergeWarps];
  const int seq = blockIdx.x / p.n_heads, hq = blockIdx.x % p.n_heads, G = p.n_heads / p.n_kv_heads;
  const PagedDecodeHead head = p.heads[size_t(seq) * p.n_kv_heads + hq / G];
  const int g = hq % G, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // A head whose units the partial kernel did not all run (a plan cut short by n_units_dev) merges none of them:
  // NaN, never a silently truncated sum.
  const int unit_end = head.unit_end <= (p.n_units_dev ? *p.n_units_dev : p.n_units) ? head.unit_end : head.unit_begin;
  float m = -INFINITY, l = 0.f, o[PL];
#pragma unroll
  for (int i = 0; i < PL; ++i) o[i] = 0.f;
#pragma unroll 4
  for (int u = head.unit_begin + warp; u < unit_end; u += kMergeWarps) {
    const float* w = p.workspace + (size_t(u) * G + g) * (HD + 2);
    float x[PL];
#pragma unroll
    for (int i = 0; i < PL / 2; ++i) {
      const float2 v = *reinterpret_cast<const float2*>(w + lane * PL + 2 * i);
      x[2 * i] = v.x, x[2 * i + 1] = v.y;
    }
    const float mu = w[HD], lu = w[HD + 1];
    // A unit with no kept keys (max -inf, sum 0) adds nothing; one whose keys were all NaN (max -inf, sum NaN) is
    // folded in, so the output is NaN rather than a sum without it.
    if (mu == -INFINITY && lu == 0.f) continue;
    const float mn = fmaxf(m, mu);
    const float a = exp2f(m - mn), b = exp2f(mu - mn);
    l = l * a + lu * b;
#pragma unroll
    for (int i = 0; i < PL; ++i) o[i] = o[i] * a + x[i] * b;
    m = mn;
  }
#pragma unroll
  for (int i = 0; i < PL; ++i) s_o[warp][lane * PL + i] = o[i];
  if (lane == 0) s_m[warp] = m, s_l[warp] = l;
  __syncthreads();
  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < kMergeWarps; ++w) M = fmaxf(M, s_m[w]);
  for (int d = threadIdx.x; d < HD; d += blockDim.x) {
    float acc = 0.f, L = 0.f;
#pragma unroll
    for (int w = 0; w < kMergeWarps; ++w) {
      const float c = s_m[w] == -INFINITY ? 0.f : exp2f(s_m[w] - M);  // a warp without units adds nothing
      acc += s_o[w][d] * c;
      L += s_l[w] * c;
    }
    // No units merged: 0/0 = NaN.
    static_cast<__nv_bfloat16*>(p.out)[(size_t(seq) * p.n_heads + hq) * HD + d] = __float2bfloat16(acc / L);
  }
}


// One CTA per layer: thread 0 cuts the units per head (plan_paged_decode's loop), then every thread writes units.
// seq_heads > 0: each run of seq_heads heads (one sequence) is cut by its own total, so a sequence's units do not
// depend on the others in the batch; 0: one cut for the layer's heads together.
__global__ void paged_plan_kernel(PagedDecodeHead* heads, PagedDecodeUnit* units, int32_t* n_units, int n_kv_heads,
                                  int seq_heads, int max_units, int target_units) {
  pdl_enter();  // programmatic_launch.cuh: before the first read of an earlier kernel's output
  const int l = blockIdx.x;
  PagedDecodeHead* H = heads + size_t(l) * n_kv_heads;
  PagedDecodeUnit* U = units + size_t(l) * max_units;
  __shared__ int s_n, s_kpu[kPagedPlanMaxSeqs];  // the cut of each run of heads
  const int run = seq_heads > 0 ? seq_heads : n_kv_heads;
  if (threadIdx.x == 0) {
    int n = 0;
    for (int h0 = 0; h0 < n_kv_heads; h0 += run) {
      int64_t total = 0;
      for (int h = h0; h < h0 + run && h < n_kv_heads; ++h) total += H[h].kept;
      const int kpu = paged_keys_per_unit(total, target_units);
      s_kpu[h0 / run] = kpu;
      for (int h = h0; h < h0 + run && h < n_kv_heads; ++h) {
        H[h].unit_begin = n;
        n += (max(H[h].kept, 0) + kpu - 1) / kpu;
        H[h].unit_end = n;
      }
    }
    if (n > max_units) {  // never with paged_max_units; a bound too small gives NaN outputs, not a partial sum
      for (int h = 0; h < n_kv_heads; ++h) H[h].unit_begin = H[h].unit_end = 0;
      n = 0;
    }
    s_n = n, n_units[l] = n;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < s_n; i += blockDim.x) {
    // The head whose units hold i: the first with unit_end > i (unit_end is non-decreasing; a binary search, since a
    // batch has hundreds of heads).
    int lo = 0, hi = n_kv_heads - 1;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (H[mid].unit_end <= i) lo = mid + 1;
      else hi = mid;
    }
    const int h = lo;
    const int kpu = s_kpu[h / run], k0 = (i - H[h].unit_begin) * kpu;
    U[i] = PagedDecodeUnit{h, k0, min(H[h].kept, k0 + kpu)};
  }
}

// grid (n_kv_heads), head_dim / 8 threads: 16 bytes each of K and V.
__global__ void paged_append_kernel(const uint4* k_new, const uint4* v_new, const int64_t* rows, uint4* k_pool,
                                    uint4* v_pool, int head_dim) {
  pdl_enter();  // programmatic_launch.cuh: before the first read of an earlier kernel's output
  const int h = blockIdx.x, i = threadIdx.x, per_row = head_dim / 8;
  const size_t dst = size_t(rows[h]) * per_row + i;
  k_pool[dst] = k_new[size_t(h) * per_row + i];
  v_pool[dst] = v_new[size_t(h) * per_row + i];
}

// One thread per 16 bytes of src [T, Hkv, hd].
__global__ void paged_scatter_kernel(const uint4* src, int T, int n_kv_heads, int head_dim, const int32_t* page_map,
                                     int map_stride, int page_size, uint4* pool) {
  const int per_row = head_dim / 8;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(T) * n_kv_heads * per_row) return;
  const int c = int(i % per_row), h = int(i / per_row % n_kv_heads), t = int(i / (int64_t(per_row) * n_kv_heads));
  const int32_t page = page_map[size_t(h) * map_stride + t / page_size];
  if (page < 0) return;
  pool[(size_t(page) * page_size + t % page_size) * per_row + c] = src[i];
}

// One CTA per page pair: 16-byte copies of the page's K and V rows.
__global__ void paged_copy_kernel(const int32_t* src, const int32_t* dst, int64_t page_uint4, uint4* k_pool,
                                  uint4* v_pool) {
  const int64_t s = int64_t(src[blockIdx.x]) * page_uint4, d = int64_t(dst[blockIdx.x]) * page_uint4;
  for (int64_t i = threadIdx.x; i < page_uint4; i += blockDim.x) {
    k_pool[d + i] = k_pool[s + i];
    v_pool[d + i] = v_pool[s + i];
  }
}

void bad(const std::string& what) { throw std::invalid_argument("paged_decode_attention: " + what); }

template <int HD, int NT>
void launch(const PagedDecodeParams& p, cudaStream_t stream) {
  const int units = p.n_units_dev ? p.max_units : p.n_units;
  const float scale_log2 = 1.4426950408889634f / std::sqrt(static_cast<float>(HD));
  if (units > 0) {
    launch_programmatic(paged_decode_partial<HD, NT>, (units + kWarps - 1) / kWarps, kThreads, 0, stream, p,
                        scale_log2);
  }
  launch_programmatic(paged_decode_merge<HD>, p.n_seqs * p.n_heads, kMergeWarps * 32, 0, stream, p);
}

}  // namespace

int64_t paged_decode_workspace_floats(int max_units, int group, int head_dim) {
  return int64_t(max_units) * group * (head_dim + 2);
}

void paged_decode_attention(const PagedDecodeParams& p, cudaStream_t stream) {
  if (!p.q || !p.out || !p.k_pool || !p.v_pool || !p.page_table || !p.heads || !p.units || !p.workspace)
    bad("null q, out, pool, plan or workspace pointer");
  if (p.n_seqs <= 0) bad("n_seqs must be > 0 (got " + std::to_string(p.n_seqs) + ")");
  if (p.n_heads <= 0 || p.n_kv_heads <= 0 || p.n_heads % p.n_kv_heads)
    bad("n_heads must be a positive multiple of n_kv_heads");
  const int G = p.n_heads / p.n_kv_heads;
  if (G > kMaxGroup) bad("query heads per KV head must be <= 16 (got " + std::to_string(G) + ")");
  if (p.page_size < kPagedTile || p.page_size % kPagedTile)
    bad("page_size must be a positive multiple of 16 (got " + std::to_string(p.page_size) + ")");
  if (p.n_units_dev ? p.max_units <= 0 : p.n_units < 0)
    bad("n_units must be >= 0, or max_units > 0 with n_units_dev");
  const bool two = G > 8;
  if (p.head_dim == 64)
    two ? launch<64, 2>(p, stream) : launch<64, 1>(p, stream);
  else if (p.head_dim == 128)
    two ? launch<128, 2>(p, stream) : launch<128, 1>(p, stream);
  else
    bad("head_dim must be 64 or 128 (got " + std::to_string(p.head_dim) + ")");
}

int paged_target_units() {
  int dev = 0, sms = 0;
  ELASTIC_CUDA_CHECK(cudaGetDevice(&dev));
  ELASTIC_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms * 16;  // 4 CTAs of 4 warps per SM at the partial kernel's register count
}

void paged_decode_plan_device(PagedDecodeHead* heads, PagedDecodeUnit* units, int32_t* n_units, int n_layers,
                              int n_kv_heads, int max_units, int target_units, cudaStream_t stream, int seq_heads) {
  if (n_layers <= 0 || n_kv_heads <= 0 || max_units <= 0)
    throw std::invalid_argument("paged_decode_plan_device: n_layers, n_kv_heads and max_units must be > 0");
  if (seq_heads < 0 || (seq_heads > 0 && (n_kv_heads % seq_heads || n_kv_heads / seq_heads > kPagedPlanMaxSeqs)))
    throw std::invalid_argument("paged_decode_plan_device: seq_heads must be 0 or divide n_kv_heads into at most " +
                                std::to_string(kPagedPlanMaxSeqs) + " sequences");
  launch_programmatic(paged_plan_kernel, n_layers, 256, 0, stream, heads, units, n_units, n_kv_heads, seq_heads,
                      max_units, target_units);
}

void paged_append(const void* k_new, const void* v_new, const int64_t* rows, void* k_pool, void* v_pool,
                  int n_kv_heads, int head_dim, cudaStream_t stream) {
  if (head_dim % 8 || head_dim <= 0 || n_kv_heads <= 0)
    throw std::invalid_argument("paged_append: head_dim must be a positive multiple of 8");
  launch_programmatic(paged_append_kernel, n_kv_heads, head_dim / 8, 0, stream, static_cast<const uint4*>(k_new),
                      static_cast<const uint4*>(v_new), rows, static_cast<uint4*>(k_pool), static_cast<uint4*>(v_pool),
                      head_dim);
}

void paged_scatter(const void* src, int T, int n_kv_heads, int head_dim, const int32_t* page_map, int map_stride,
                   int page_size, void* pool, cudaStream_t stream) {
  if (head_dim % 8 || head_dim <= 0 || n_kv_heads <= 0 || page_size <= 0)
    throw std::invalid_argument("paged_scatter: head_dim must be a positive multiple of 8");
  if (T <= 0) return;
  const int64_t n = int64_t(T) * n_kv_heads * (head_dim / 8);
  paged_scatter_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
      static_cast<const uint4*>(src), T, n_kv_heads, head_dim, page_map, map_stride, page_size,
      static_cast<uint4*>(pool));
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

void paged_copy_pages(const int32_t* src, const int32_t* dst, int n, int page_size, int head_dim, void* k_pool,
                      void* v_pool, cudaStream_t stream) {
  if (head_dim % 8 || head_dim <= 0 || page_size <= 0 || n < 0)
    throw std::invalid_argument("paged_copy_pages: head_dim must be a positive multiple of 8, page_size positive");
  if (n == 0) return;
  paged_copy_kernel<<<n, 256, 0, stream>>>(src, dst, int64_t(page_size) * head_dim / 8, static_cast<uint4*>(k_pool),
                                           static_cast<uint4*>(v_pool));
  ELASTIC_CUDA_CHECK(cudaGetLastError());
}

std::string describe_paged_decode() {
  return "paged (a warp per unit of 16-key tiles on tensor cores, units cut on the device per step for " +
         std::to_string(paged_target_units()) + " resident warps, merge over " + std::to_string(kMergeWarps) +
         " warps)";
}

}  // namespace elastic::cuda
