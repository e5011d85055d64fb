#pragma once
// XAttention's greedy block selection on the device (steps 4-5 of elastic::xattn_select,
// src/attention/xattn_select.cpp), shared by the engine's estimator (xattn_estimate_gemm.cu, scores through cuBLASLt)
// and the dev area's earlier forms (dev/cuda/xattn_estimate_variants.cu, scores on CUDA cores or mma.sync): given one
// (query head, query block)'s block masses, keep block 0 and the diagonal, then blocks by descending mass (ties: lower
// kb) while the mass so far is < tau * total, and write the kept blocks ascending into the triangular list of (h, qb).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace elastic::cuda::xattn_detail {

constexpr int kThreads = 256;  // every estimator kernel's block size; select_blocks needs all of them

__host__ __device__ inline int pow2_at_least(int n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

// A warp's running softmax statistics (max m, sum s of exp(x - m)) combined across its lanes: every lane ends with
// the warp's (a lane with no values holds m = -inf, s = 0). Shared by the estimators' row statistics.
__device__ __forceinline__ void warp_combine_max_sum(float& m, float& s) {
  for (int o = 16; o > 0; o >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, m, o), os = __shfl_xor_sync(0xffffffffu, s, o);
    const float nm = fmaxf(m, om);
    s = (m == -INFINITY ? 0.f : s * expf(m - nm)) + (om == -INFINITY ? 0.f : os * expf(om - nm));
    m = nm;
  }
}

// Steps 4-5 for one (query head h, query block qb), all kThreads threads: greedy selection over the block masses
// bs[0..qb] and the ascending write of the selected blocks. keys: [pow2 >= qb - 1] scratch; flag: [qb + 1] scratch.
__device__ inline void select_blocks(const float* bs, int qb, int nb, float tau, unsigned long long* keys, int* flag,
                                     int h, size_t row_off, int32_t* __restrict__ blocks,
                                     int32_t* __restrict__ counts) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  // Candidates kb in [1, qb): key = mass bits (non-negative floats order as integers) : ~kb (lower kb first).
  const int n_cand = max(0, qb - 1);
  const int N = pow2_at_least(n_cand);
  for (int i = tid; i < N; i += kThreads) {
    unsigned long long key = 0ull;
    if (i < n_cand) {
      const int kb = 1 + i;
      key = (static_cast<unsigned long long>(__float_as_uint(bs[kb])) << 32) | (0xffffffffu - static_cast<uint32_t>(kb));
    }
    keys[i] = key;
  }
  __syncthreads();
  for (int size = 2; size <= N; size <<= 1)
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      for (int i = tid; i < N; i += kThreads) {
        const int j = i ^ stride;
        if (j > i) {
          const bool desc = (i & size) == 0;  // descending overall
          const unsigned long long a = keys[i], b = keys[j];
          if ((a < b) == desc) keys[i] = b, keys[j] = a;
        }
      }
      __syncthreads();
    }

  // Exclusive prefix of sorted masses in double; selected while base + prefix < tau * total. Each thread sums its run
  // of `per` sorted keys, then the runs are scanned across the block (warp shuffles, then the warps' totals by warp
  // 0), and the total is reduced the same way: fixed assignments and orders, so the result does not vary run to run.
  __shared__ double s_warp[kThreads / 32], s_warp_total[kThreads / 32];
  __shared__ double s_total;
  const int per = (N + kThreads - 1) / kThreads;
  double local = 0.0;
  for (int i = tid * per; i < min(N, (tid + 1) * per); ++i) local += static_cast<double>(__uint_as_float(keys[i] >> 32));
  double tot_part = 0.0;
  for (int kb = tid; kb <= qb; kb += kThreads) tot_part += static_cast<double>(bs[kb]);
  double incl = local;  // inclusive scan of `local` within the warp
  for (int o = 1; o < 32; o <<= 1) {
    const double v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  for (int o = 16; o > 0; o >>= 1) tot_part += __shfl_xor_sync(0xffffffffu, tot_part, o);
  if (lane == 31) s_warp[warp] = incl;
  if (lane == 0) s_warp_total[warp] = tot_part;
  __syncthreads();
  if (tid == 0) {
    double run = 0.0, tot = 0.0;
    for (int w = 0; w < kThreads / 32; ++w) {
      const double v = s_warp[w];
      s_warp[w] = run;  // exclusive: what the warps before w hold
      run += v;
      tot += s_warp_total[w];
    }
    s_total = tot;
  }
  __syncthreads();
  const double excl = s_warp[warp] + incl - local;  // the sorted masses before this thread's run
  for (int kb = tid; kb <= qb; kb += kThreads) flag[kb] = (kb == 0 || kb == qb) ? 1 : 0;
  __syncthreads();
  {
    const double required = s_total * static_cast<double>(tau);
    double cum = static_cast<double>(bs[0]) + (qb > 0 ? static_cast<double>(bs[qb]) : 0.0) + excl;
    for (int i = tid * per; i < min(n_cand, (tid + 1) * per); ++i) {
      if (!(cum < required)) break;
      const int kb = static_cast<int>(0xffffffffu - static_cast<uint32_t>(keys[i] & 0xffffffffull));
      flag[kb] = 1;
      cum += static_cast<double>(__uint_as_float(keys[i] >> 32));
    }
  }
  __syncthreads();
  // Ascending compaction by warp 0 (ballot + popc).
  if (warp == 0) {
    int32_t* out = blocks + (static_cast<int64_t>(h) * nb * (nb + 1) / 2 + int64_t(qb) * (qb + 1) / 2);
    int n = 0;
    for (int base = 0; base <= qb; base += 32) {
      const int kb = base + lane;
      const bool f = kb <= qb && flag[kb];
      const unsigned bal = __ballot_sync(0xffffffffu, f);
      if (f) out[n + __popc(bal & ((1u << lane) - 1u))] = kb;
      n += __popc(bal);
    }
    if (lane == 0) counts[row_off] = n;
  }
}

}  // namespace elastic::cuda::xattn_detail
