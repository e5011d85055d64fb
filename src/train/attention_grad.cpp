#include "train/attention_grad.h"

#include <algorithm>
#include <cmath>

#include "elastic/sparse_pattern.h"

namespace elastic::train {

template <class Real>
void attn_fwd(const Real* q, const Real* k, const Real* v, int T, int Hq, int Hkv, int hd, const BlockKeep& keep,
              Real* out, Real* lse) {
  const int B = keep.sparse->block;
  const Real scale = Real(1) / std::sqrt(Real(hd));
#pragma omp parallel
  {
    std::vector<Real> s(T);
#pragma omp for schedule(dynamic, 8) collapse(2)
    for (int h = 0; h < Hq; ++h)
      for (int i = 0; i < T; ++i) {
        const int kvh = h / keep.group, qb = i / B;
        const Real* qi = q + (static_cast<size_t>(i) * Hq + h) * hd;
        Real* oi = out + (static_cast<size_t>(i) * Hq + h) * hd;
        Real mx = -INFINITY;
        for (int kb = 0; kb <= qb; ++kb) {
          if (!keep(h, qb, kb)) continue;
          for (int j = kb * B; j < std::min(i + 1, (kb + 1) * B); ++j) {
            const Real* kj = k + (static_cast<size_t>(j) * Hkv + kvh) * hd;
            Real d = 0;
            for (int c = 0; c < hd; ++c) d += qi[c] * kj[c];
            s[j] = d * scale;
            mx = std::max(mx, s[j]);
          }
        }
        Real sum = 0;
        std::fill(oi, oi + hd, Real(0));
        for (int kb = 0; kb <= qb; ++kb) {
          if (!keep(h, qb, kb)) continue;
          for (int j = kb * B; j < std::min(i + 1, (kb + 1) * B); ++j) {
            const Real e = std::exp(s[j] - mx);
            sum += e;
            const Real* vj = v + (static_cast<size_t>(j) * Hkv + kvh) * hd;
            for (int c = 0; c < hd; ++c) oi[c] += e * vj[c];
          }
        }
        for (int c = 0; c < hd; ++c) oi[c] /= sum;
        lse[static_cast<size_t>(h) * T + i] = mx + std::log(sum);
      }
  }
}

template <class Real>
void attn_bwd(const Real* q, const Real* k, const Real* v, const Real* out, const Real* lse, const Real* dout, int T,
              int Hq, int Hkv, int hd, const BlockKeep& keep, Real* dq, Real* dk, Real* dv) {
  const int B = keep.sparse->block;
  const Real scale = Real(1) / std::sqrt(Real(hd));
  // One thread per KV head: its dK/dV gather from all of its query heads' rows without atomics.
#pragma omp parallel for schedule(dynamic, 1)
  for (int kvh = 0; kvh < Hkv; ++kvh)
    for (int h = kvh * keep.group; h < (kvh + 1) * keep.group; ++h)
      for (int i = 0; i < T; ++i) {
        const int qb = i / B;
        const size_t qo = (static_cast<size_t>(i) * Hq + h) * hd;
        const Real* qi = q + qo;
        const Real* doi = dout + qo;
        Real Di = 0;  // rowsum(dO * O): the softmax backward's correction term
        for (int c = 0; c < hd; ++c) Di += doi[c] * out[qo + c];
        const Real li = lse[static_cast<size_t>(h) * T + i];
        for (int kb = 0; kb <= qb; ++kb) {
          if (!keep(h, qb, kb)) continue;
          for (int j = kb * B; j < std::min(i + 1, (kb + 1) * B); ++j) {
            const size_t ko = (static_cast<size_t>(j) * Hkv + kvh) * hd;
            Real sd = 0, dp = 0;
            for (int c = 0; c < hd; ++c) {
              sd += qi[c] * k[ko + c];
              dp += doi[c] * v[ko + c];
            }
            const Real p = std::exp(sd * scale - li);
            const Real ds = p * (dp - Di) * scale;
            for (int c = 0; c < hd; ++c) {
              dq[qo + c] += ds * k[ko + c];
              dk[ko + c] += ds * qi[c];
              dv[ko + c] += p * doi[c];
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
