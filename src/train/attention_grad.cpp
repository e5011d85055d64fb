#include "train/attention_grad.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "model/ops.h"
#include "train/grad_ops.h"

#include "elastic/sparse_pattern.h"

namespace elastic::train {

namespace {

// Tiles. The forward and the dQ pass take one query block of one query head against its kept keys; the dK/dV pass
// one key block of one KV head against the query rows of its group that keep it, so every unit writes rows no other
// unit writes (no atomics, no per-thread copies of dK/dV) at the cost of computing the scores and dP twice in the
// backward (FlashAttention-2's split). The products run through gemm on the tensors in place (row strides Hq*hd and
// Hkv*hd; OpenBLAS single-threaded inside the OpenMP loop), so nothing is gathered: the row-by-row loops these
// replace spent 85% of a CPU training step at 1K tokens doing scalar dot products.

struct Run {
  int p0, p1;  // positions [p0, p1)
};

// Query head h's kept keys for query block qb, clipped to the block's last row, as runs of consecutive blocks.
void key_runs(const BlockKeep& keep, int h, int qb, int B, int last, std::vector<Run>& runs) {
  runs.clear();
  for (int kb = 0; kb <= qb; ++kb) {
    if (!keep(h, qb, kb)) continue;
    const int p0 = kb * B, p1 = std::min(last + 1, p0 + B);
    if (!runs.empty() && runs.back().p1 == p0) runs.back().p1 = p1;
    else runs.push_back({p0, p1});
  }
}

// Query head h's rows that keep key block kb (query blocks qb >= kb), as runs of rows.
void query_runs(const BlockKeep& keep, int h, int kb, int B, int T, std::vector<Run>& runs) {
  runs.clear();
  for (int qb = kb; qb * B < T; ++qb) {
    if (!keep(h, qb, kb)) continue;
    const int p0 = qb * B, p1 = std::min(T, p0 + B);
    if (!runs.empty() && runs.back().p1 == p0) runs.back().p1 = p1;
    else runs.push_back({p0, p1});
  }
}

int run_total(const std::vector<Run>& runs) {
  int n = 0;
  for (const Run& r : runs) n += r.p1 - r.p0;
  return n;
}

template <class Real>
void exp_row(Real* x, int n) {
  for (int i = 0; i < n; ++i) x[i] = std::exp(x[i]);
}
template <>
void exp_row<float>(float* x, int n) {
  exp_inplace(x, n);
}

// The double instances serve the gradient checks only: they run serially (cblas_dgemm's own threads are not pinned
// to one inside OpenMP the way sgemm's are).
template <class Real>
constexpr bool kParallel = std::is_same_v<Real, float>;

// S[nq, nk] = scale * Q K^T over a query block's key runs (columns in run order); Q rows of head h at rows i0..
template <class Real>
void block_scores(const Real* q, const Real* k, int Hq, int Hkv, int hd, int h, int kvh, int i0, int nq,
                  const std::vector<Run>& runs, int nk, Real scale, Real* s) {
  int col = 0;
  for (const Run& r : runs) {
    gemm<Real>(false, true, nq, r.p1 - r.p0, hd, scale, q + (static_cast<size_t>(i0) * Hq + h) * hd, Hq * hd,
               k + (static_cast<size_t>(r.p0) * Hkv + kvh) * hd, Hkv * hd, Real(0), s + col, nk);
    col += r.p1 - r.p0;
  }
}

// Row m (position i0 + m) of a query block's scores: the keys past its position are the last columns, when the
// diagonal block is kept (it ends the last run at i0 + nq); otherwise no kept key lies past any row of the block.
template <class Real>
void mask_causal_row(Real* srow, int m, int nq, int nk, const std::vector<Run>& runs, int i0) {
  if (runs.empty() || runs.back().p1 != i0 + nq) return;
  for (int c = nk - (nq - 1 - m); c < nk; ++c) srow[c] = -INFINITY;
}

}  // namespace

template <class Real>
void attn_fwd(const Real* q, const Real* k, const Real* v, int T, int Hq, int Hkv, int hd, const BlockKeep& keep,
              Real* out, Real* lse) {
  const int B = keep.sparse->block, nqb = (T + B - 1) / B;
  const Real scale = Real(1) / std::sqrt(Real(hd));
#pragma omp parallel if (kParallel<Real>)
  {
    std::vector<Run> runs;
    std::vector<Real> s, inv;
#pragma omp for schedule(dynamic, 1) collapse(2)
    for (int qb = nqb - 1; qb >= 0; --qb)  // the longest rows first
      for (int h = 0; h < Hq; ++h) {
        const int kvh = h / keep.group, i0 = qb * B, nq = std::min(T, i0 + B) - i0;
        key_runs(keep, h, qb, B, i0 + nq - 1, runs);
        const int nk = run_total(runs);
        s.resize(static_cast<size_t>(nq) * nk);
        block_scores(q, k, Hq, Hkv, hd, h, kvh, i0, nq, runs, nk, scale, s.data());
        inv.resize(nq);
        for (int m = 0; m < nq; ++m) {
          Real* srow = s.data() + static_cast<size_t>(m) * nk;
          mask_causal_row(srow, m, nq, nk, runs, i0);
          Real mx = -INFINITY;
          for (int c = 0; c < nk; ++c) mx = std::max(mx, srow[c]);
          for (int c = 0; c < nk; ++c) srow[c] -= mx;
          exp_row(srow, nk);
          Real sum = 0;
          for (int c = 0; c < nk; ++c) sum += srow[c];
          inv[m] = Real(1) / sum;
          lse[static_cast<size_t>(h) * T + i0 + m] = mx + std::log(sum);
        }
        // O = P V run by run into the output rows in place, then each row divided by its sum.
        Real* o = out + (static_cast<size_t>(i0) * Hq + h) * hd;
        int col = 0;
        for (size_t r = 0; r < runs.size(); ++r) {
          const int len = runs[r].p1 - runs[r].p0;
          gemm<Real>(false, false, nq, hd, len, Real(1), s.data() + col, nk,
                     v + (static_cast<size_t>(runs[r].p0) * Hkv + kvh) * hd, Hkv * hd, r ? Real(1) : Real(0), o,
                     Hq * hd);
          col += len;
        }
        for (int m = 0; m < nq; ++m)
          for (int c = 0; c < hd; ++c) o[static_cast<size_t>(m) * Hq * hd + c] *= inv[m];
      }
  }
}

template <class Real>
void attn_bwd(const Real* q, const Real* k, const Real* v, const Real* out, const Real* lse, const Real* dout, int T,
              int Hq, int Hkv, int hd, const BlockKeep& keep, Real* dq, Real* dk, Real* dv) {
  const int B = keep.sparse->block, nb = (T + B - 1) / B, ldq = Hq * hd, ldk = Hkv * hd;
  const Real scale = Real(1) / std::sqrt(Real(hd));
  // D[h, i] = rowsum(dO * O): the softmax backward's correction term.
  std::vector<Real> D(static_cast<size_t>(Hq) * T);
#pragma omp parallel for schedule(static) if (kParallel<Real>)
  for (int i = 0; i < T; ++i)
    for (int h = 0; h < Hq; ++h) {
      const size_t o = (static_cast<size_t>(i) * Hq + h) * hd;
      Real d = 0;
      for (int c = 0; c < hd; ++c) d += dout[o + c] * out[o + c];
      D[static_cast<size_t>(h) * T + i] = d;
    }
#pragma omp parallel if (kParallel<Real>)
  {
    std::vector<Run> runs;
    std::vector<Real> p, dp, lse_col, d_col;
    // dQ: per query block of a query head, P and dS over its kept keys, then dQ += dS K.
#pragma omp for schedule(dynamic, 1) collapse(2)
    for (int qb = nb - 1; qb >= 0; --qb)
      for (int h = 0; h < Hq; ++h) {
        const int kvh = h / keep.group, i0 = qb * B, nq = std::min(T, i0 + B) - i0;
        if (!keep.backward[kvh]) continue;
        key_runs(keep, h, qb, B, i0 + nq - 1, runs);
        const int nk = run_total(runs);
        p.resize(static_cast<size_t>(nq) * nk);
        dp.resize(p.size());
        block_scores(q, k, Hq, Hkv, hd, h, kvh, i0, nq, runs, nk, scale, p.data());
        int col = 0;
        for (const Run& r : runs) {
          gemm<Real>(false, true, nq, r.p1 - r.p0, hd, Real(1), dout + (static_cast<size_t>(i0) * Hq + h) * hd, ldq,
                     v + (static_cast<size_t>(r.p0) * Hkv + kvh) * hd, ldk, Real(0), dp.data() + col, nk);
          col += r.p1 - r.p0;
        }
        for (int m = 0; m < nq; ++m) {
          Real *prow = p.data() + static_cast<size_t>(m) * nk, *dsrow = dp.data() + static_cast<size_t>(m) * nk;
          const Real li = lse[static_cast<size_t>(h) * T + i0 + m], Di = D[static_cast<size_t>(h) * T + i0 + m];
          for (int c = 0; c < nk; ++c) prow[c] -= li;
          mask_causal_row(prow, m, nq, nk, runs, i0);
          exp_row(prow, nk);
          for (int c = 0; c < nk; ++c) dsrow[c] = prow[c] * (dsrow[c] - Di) * scale;
        }
        col = 0;
        for (const Run& r : runs) {
          gemm<Real>(false, false, nq, hd, r.p1 - r.p0, Real(1), dp.data() + col, nk,
                     k + (static_cast<size_t>(r.p0) * Hkv + kvh) * hd, ldk, Real(1),
                     dq + (static_cast<size_t>(i0) * Hq + h) * hd, ldq);
          col += r.p1 - r.p0;
        }
      }
    // dK, dV: per key block of a KV head, over each query head of its group, the transposed tiles P^T and dS^T
    // against the rows that keep the block; dV += P^T dO, dK += dS^T Q.
#pragma omp for schedule(dynamic, 1) collapse(2)
    for (int kb = 0; kb < nb; ++kb)  // the longest columns first
      for (int kvh = 0; kvh < Hkv; ++kvh) {
        if (!keep.backward[kvh]) continue;
        const int j0 = kb * B, nk = std::min(T, j0 + B) - j0;
        const size_t ko = (static_cast<size_t>(j0) * Hkv + kvh) * hd;
        for (int h = kvh * keep.group; h < (kvh + 1) * keep.group; ++h) {
          query_runs(keep, h, kb, B, T, runs);
          const int nr = run_total(runs);
          if (nr == 0) continue;
          p.resize(static_cast<size_t>(nk) * nr);
          dp.resize(p.size());
          lse_col.resize(nr);
          d_col.resize(nr);
          int col = 0;
          for (const Run& r : runs) {
            const size_t qo = (static_cast<size_t>(r.p0) * Hq + h) * hd;
            gemm<Real>(false, true, nk, r.p1 - r.p0, hd, scale, k + ko, ldk, q + qo, ldq, Real(0), p.data() + col, nr);
            gemm<Real>(false, true, nk, r.p1 - r.p0, hd, Real(1), v + ko, ldk, dout + qo, ldq, Real(0),
                       dp.data() + col, nr);
            std::copy_n(lse + static_cast<size_t>(h) * T + r.p0, r.p1 - r.p0, lse_col.data() + col);
            std::copy_n(D.data() + static_cast<size_t>(h) * T + r.p0, r.p1 - r.p0, d_col.data() + col);
            col += r.p1 - r.p0;
          }
          // Key row a (position j0 + a) sees query rows >= its position: in the diagonal block (the first run
          // starting at j0) the first a columns are rows before it.
          const bool diag = runs.front().p0 == j0;
          for (int a = 0; a < nk; ++a) {
            Real *prow = p.data() + static_cast<size_t>(a) * nr, *dsrow = dp.data() + static_cast<size_t>(a) * nr;
            for (int c = 0; c < nr; ++c) prow[c] -= lse_col[c];
            if (diag)
              for (int c = 0; c < a; ++c) prow[c] = -INFINITY;
            exp_row(prow, nr);
            for (int c = 0; c < nr; ++c) dsrow[c] = prow[c] * (dsrow[c] - d_col[c]) * scale;
          }
          col = 0;
          for (const Run& r : runs) {
            const size_t qo = (static_cast<size_t>(r.p0) * Hq + h) * hd;
            gemm<Real>(false, false, nk, hd, r.p1 - r.p0, Real(1), p.data() + col, nr, dout + qo, ldq, Real(1),
                       dv + ko, ldk);
            gemm<Real>(false, false, nk, hd, r.p1 - r.p0, Real(1), dp.data() + col, nr, q + qo, ldq, Real(1),
                       dk + ko, ldk);
            col += r.p1 - r.p0;
          }
        }
      }
  }
}

template <class Real>
std::vector<BlockMask> xattn_masks(const Real* q, const Real* k, int T, int Hq, int Hkv, int hd, const HeadMode* modes,
                                   const SparseSettings& s) {
  const int group = Hq / Hkv;
  std::vector<BlockMask> m(Hq);
  std::vector<float> qh(static_cast<size_t>(T) * hd), kh(qh.size());
  for (int h = 0; h < Hq; ++h) {
    const SparsePattern& pat = sparse_pattern(modes[h / group]);
    if (!pat.select) continue;
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < hd; ++c) {
        qh[static_cast<size_t>(t) * hd + c] = static_cast<float>(q[(static_cast<size_t>(t) * Hq + h) * hd + c]);
        kh[static_cast<size_t>(t) * hd + c] = static_cast<float>(k[(static_cast<size_t>(t) * Hkv + h / group) * hd + c]);
      }
    m[h] = pat.select(qh.data(), kh.data(), T, hd, s, 0);
  }
  return m;
}

#define ELASTIC_INSTANTIATE(R)                                                                                    \
  template void attn_fwd<R>(const R*, const R*, const R*, int, int, int, int, const BlockKeep&, R*, R*);         \
  template void attn_bwd<R>(const R*, const R*, const R*, const R*, const R*, const R*, int, int, int, int,      \
                            const BlockKeep&, R*, R*, R*);                                                        \
  template std::vector<BlockMask> xattn_masks<R>(const R*, const R*, int, int, int, int, const HeadMode*,         \
                                                 const SparseSettings&);
ELASTIC_INSTANTIATE(float)
ELASTIC_INSTANTIATE(double)
#undef ELASTIC_INSTANTIATE

}  // namespace elastic::train
