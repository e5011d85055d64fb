// XAttention block selection (Xu et al. 2025, "XAttention: Block Sparse Attention with Antidiagonal Scoring"),
// CPU reference for one causal head with aligned queries and keys.
//
// Pipeline (mirrors xattn_estimate + find_blocks_chunked of the published implementation; the scores as one sgemm per
// group of folded query rows, as the GPU's cuBLASLt form does):
//   1. Reshape with stride S: reshaped key j = concat_s k[j*S + s], reshaped query i = concat_s q[i*S + S-1-s]
//      (s = 0..S-1), zero-padded past T. Their dot product is the antidiagonal sum
//      score(i,j) = sum_s q[i*S + S-1-s] . k[j*S + s], scaled by 1/sqrt(hd)/S.
//   2. Causal mask on the reshaped grid (j <= i), softmax over j for each reshaped row i (fp32).
//   3. Block scores: sum of probabilities over the (B/S) x (B/S) reshaped tiles.
//   4. Per query block qb: force kb = 0 and kb = qb; then add the other causal blocks by descending score
//      (ties: lower kb first) while the cumulative selected mass is < tau * (row total mass).
#include <cstddef>  // elastic/xattn.h uses size_t without including <cstddef>

#include "elastic/xattn.h"
#include "model/ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace elastic {

int64_t BlockMask::selected() const {
  int64_t n = 0;
  for (uint8_t v : mask) n += (v != 0) ? 1 : 0;
  return n;
}

namespace {

void validate(const float* q, const float* k, int T, int hd, const XAttnParams& p) {
  if (p.stride < 1) throw std::invalid_argument("xattn_select: stride must be >= 1 (got " + std::to_string(p.stride) + ")");
  if (p.block < 1) throw std::invalid_argument("xattn_select: block must be positive (got " + std::to_string(p.block) + ")");
  if (p.block % p.stride != 0)
    throw std::invalid_argument("xattn_select: block (" + std::to_string(p.block) + ") must be a multiple of stride (" +
                                std::to_string(p.stride) + ")");
  if (!(p.tau > 0.f && p.tau <= 1.f))  // also rejects NaN
    throw std::invalid_argument("xattn_select: tau must be in (0, 1] (got " + std::to_string(p.tau) + ")");
  if (T < 0) throw std::invalid_argument("xattn_select: T must be >= 0 (got " + std::to_string(T) + ")");
  if (hd < 1) throw std::invalid_argument("xattn_select: hd must be >= 1 (got " + std::to_string(hd) + ")");
  if (T > 0 && (q == nullptr || k == nullptr)) throw std::invalid_argument("xattn_select: null q or k");
}

}  // namespace

BlockMask xattn_select(const float* q, const float* k, int T, int hd, const XAttnParams& p, int q_begin) {
  validate(q, k, T, hd, p);
  if (q_begin < 0 || q_begin % p.block != 0)
    throw std::invalid_argument("xattn_select: q_begin must be a non-negative multiple of the block (got " +
                                std::to_string(q_begin) + ")");

  const int B = p.block;
  const int S = p.stride;
  const int nb = (T + B - 1) / B;     // blocks in original tokens
  const int R = (T + S - 1) / S;      // reshaped rows / columns (last one partially zero-padded)
  const int rb = B / S;               // reshaped rows per block
  const size_t D = static_cast<size_t>(S) * hd;  // reshaped feature dim

  BlockMask out;
  out.n_blocks = nb;
  out.mask.assign(static_cast<size_t>(nb) * nb, 0);
  if (T == 0) return out;

  // Reshaped (concatenated) queries and keys, zero-padded past T; query rows from the first asked block on.
  const int qb_begin = std::min(nb, q_begin / B), i_begin = qb_begin * rb;
  std::vector<float> Qr(static_cast<size_t>(R) * D, 0.f), Kr(static_cast<size_t>(R) * D, 0.f);
  for (int i = 0; i < R; ++i) {
    for (int s = 0; s < S; ++s) {
      const int tk = i * S + s;
      const int tq = i * S + (S - 1 - s);
      float* kd = &Kr[static_cast<size_t>(i) * D + static_cast<size_t>(s) * hd];
      float* qd = &Qr[static_cast<size_t>(i) * D + static_cast<size_t>(s) * hd];
      if (tk < T) std::copy(k + static_cast<size_t>(tk) * hd, k + static_cast<size_t>(tk + 1) * hd, kd);
      if (tq < T && i >= i_begin)
        std::copy(q + static_cast<size_t>(tq) * hd, q + static_cast<size_t>(tq + 1) * hd, qd);
    }
  }

  const float scale = 1.f / std::sqrt(static_cast<float>(hd)) / static_cast<float>(S);

  // block_score[qb * nb + kb]. The scores are one matrix product, Qr Kr^T (about 1/S of the head's QK^T): sgemm over
  // a group of folded query rows at a time, against the key rows the group can see (causal), then each query block's
  // rows (one thread per block) go through the softmax and into their block sums in a fixed order.
  std::vector<float> bs(static_cast<size_t>(nb) * nb, 0.f);
  const int group_rows = std::max(1, 256 / rb) * rb;  // whole query blocks per product
  std::vector<float> sc(static_cast<size_t>(std::min(group_rows, R)) * R);
  for (int g0 = i_begin; g0 < R; g0 += group_rows) {
    const int rows = std::min(group_rows, R - g0), cols = g0 + rows;  // row i sees key rows [0, i]
    sgemm(false, true, rows, cols, static_cast<int>(D), 1.f, &Qr[static_cast<size_t>(g0) * D], static_cast<int>(D),
          Kr.data(), static_cast<int>(D), 0.f, sc.data(), cols);
    const int qb_first = g0 / rb, qb_end = std::min(nb, (g0 + rows + rb - 1) / rb);
#pragma omp parallel for schedule(dynamic, 1)
    for (int qb = qb_first; qb < qb_end; ++qb) {
      float* brow = &bs[static_cast<size_t>(qb) * nb];
      const int i_end = std::min(R, (qb + 1) * rb);
      for (int i = qb * rb; i < i_end; ++i) {
        float* row = &sc[static_cast<size_t>(i - g0) * cols];
        float mx = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          row[j] *= scale;
          mx = std::max(mx, row[j]);
        }
        float sum = 0.f;
        for (int j = 0; j <= i; ++j) {
          row[j] = std::exp(row[j] - mx);
          sum += row[j];
        }
        const float inv = 1.f / sum;
        for (int j = 0; j <= i; ++j) brow[j / rb] += row[j] * inv;
      }
    }
  }

  // Greedy selection per query-block row (threshold arithmetic in double, like the reference).
  std::vector<int> order;
  for (int qb = qb_begin; qb < nb; ++qb) {
    const float* brow = &bs[static_cast<size_t>(qb) * nb];
    uint8_t* mrow = &out.mask[static_cast<size_t>(qb) * nb];
    double total = 0.0;
    for (int kb = 0; kb <= qb; ++kb) total += brow[kb];
    const double required = total * static_cast<double>(p.tau);

    mrow[0] = 1;
    mrow[qb] = 1;
    double cum = static_cast<double>(brow[0]) + (qb > 0 ? static_cast<double>(brow[qb]) : 0.0);

    order.clear();
    for (int kb = 1; kb < qb; ++kb) order.push_back(kb);
    std::stable_sort(order.begin(), order.end(), [brow](int a, int b) { return brow[a] > brow[b]; });
    for (int kb : order) {
      if (!(cum < required)) break;
      mrow[kb] = 1;
      cum += brow[kb];
    }
  }
  return out;
}

}  // namespace elastic
