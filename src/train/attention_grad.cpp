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

// Appends positions [p0, p1), extending the last run when they follow it.
void append_run(std::vector<Run>& runs, int p0, int p1) {
  if (!runs.empty() && runs.back().p1 == p0) runs.back().p1 = p1;
  else runs.push_back({p0, p1});
}

// Query head h's kept keys for query block qb, clipped to the block's last row, as runs of consecutive blocks.
void key_runs(const BlockKeep& keep, int h, int qb, int B, int last, std::vector<Run>& runs) {
  runs.clear();
  for (int kb = 0; kb <= qb; ++kb)
    if (keep(h, qb, kb)) append_run(runs, kb * B, std::min(last + 1, kb * B + B));
}

// Query head h's rows that keep key block kb (query blocks qb >= kb), as runs of rows.
void query_runs(const BlockKeep& keep, int h, int kb, int B, int T, std::vector<Run>& runs) {
  runs.clear();
  for (int qb = kb; qb * B < T; ++qb)
    if (keep(h, qb, kb)) append_run(runs, qb * B, std::min(T, qb * B + B));
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

// The two products every tile is made of. X[positions, H, hd] is a tensor in place; "the runs' rows of X" are its rows
// at the runs' positions for one head, `head` of H (row stride H * hd), in run order.
// S[M, cols] = alpha * A[M, hd] (the runs' rows of X)^T: A's rows lda apart, S's columns in run order, rows ldS apart.
template <class Real>
void product_with_runs_t(const Real* A, int lda, int M, const std::vector<Run>& runs, const Real* X, int H, int head,
                         int hd, Real alpha, Real* S, int ldS) {
  int col = 0;
  for (const Run& r : runs) {
    gemm<Real>(false, true, M, r.p1 - r.p0, hd, alpha, A, lda, X + (static_cast<size_t>(r.p0) * H + head) * hd, H * hd,
               Real(0), S + col, ldS);
    col += r.p1 - r.p0;
  }
}
// C[M, hd] = (or += when `add`) S[M, cols] (the runs' rows of X): S's columns in run order.
template <class Real>
void product_with_runs(const Real* S, int ldS, int M, const std::vector<Run>& runs, const Real* X, int H, int head,
                       int hd, bool add, Real* C, int ldc) {
  int col = 0;
  for (const Run& r : runs) {
    gemm<Real>(false, false, M, hd, r.p1 - r.p0, Real(1), S + col, ldS,
               X + (static_cast<size_t>(r.p0) * H + head) * hd, H * hd, add || col ? Real(1) : Real(0), C, ldc);
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
        const size_t qo = (static_cast<size_t>(i0) * Hq + h) * hd;  // the block's rows of head h in q and out
        Real* o = out + qo;
        product_with_runs_t(q + qo, Hq * hd, nq, runs, k, Hkv, kvh, hd, scale, s.data(), nk);
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
        // O = P V into the output rows in place, then each row divided by its sum.
        product_with_runs(s.data(), nk, nq, runs, v, Hkv, kvh, hd, false, o, Hq * hd);
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
        const size_t qo = (static_cast<size_t>(i0) * Hq + h) * hd;  // the block's rows of head h in q, dout, dq
        product_with_runs_t(q + qo, ldq, nq, runs, k, Hkv, kvh, hd, scale, p.data(), nk);
        product_with_runs_t(dout + qo, ldq, nq, runs, v, Hkv, kvh, hd, Real(1), dp.data(), nk);
        for (int m = 0; m < nq; ++m) {
          Real *prow = p.data() + static_cast<size_t>(m) * nk, *dsrow = dp.data() + static_cast<size_t>(m) * nk;
          const Real li = lse[static_cast<size_t>(h) * T + i0 + m], Di = D[static_cast<size_t>(h) * T + i0 + m];
          for (int c = 0; c < nk; ++c) prow[c] -= li;
          mask_causal_row(prow, m, nq, nk, runs, i0);
          exp_row(prow, nk);
          for (int c = 0; c < nk; ++c) dsrow[c] = prow[c] * (dsrow[c] - Di) * scale;
        }
        product_with_runs(dp.data(), nk, nq, runs, k, Hkv, kvh, hd, true, dq + qo, ldq);
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
          product_with_runs_t(k + ko, ldk, nk, runs, q, Hq, h, hd, scale, p.data(), nr);
          product_with_runs_t(v + ko, ldk, nk, runs, dout, Hq, h, hd, Real(1), dp.data(), nr);
          int col = 0;
          for (const Run& r : runs) {
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
          product_with_runs(p.data(), nr, nk, runs, dout, Hq, h, hd, true, dv + ko, ldk);
          product_with_runs(dp.data(), nr, nk, runs, q, Hq, h, hd, true, dk + ko, ldk);
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
