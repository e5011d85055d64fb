#include "elastic/attention.h"
#include "elastic/sparse_pattern.h"

#include "model/ops.h"

#include <algorithm>
#include <iterator>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace elastic {

double AttentionStats::esr() const {
  if (blocks_causal.empty()) return 0.0;
  double s = 0;
  for (size_t h = 0; h < blocks_causal.size(); ++h) s += blocks_causal[h] > 0 ? blocks_skipped[h] / blocks_causal[h] : 0;
  return s / blocks_causal.size();
}

bool block_kept(HeadMode m, const BlockMask* sel, int qb, int kb, const SparseSettings& s) {
  return sparse_pattern(m).keeps(qb, kb, s, sel);
}

namespace {

// ---- Tiles. One work unit is one query block's rows (of this call) for one set of query heads that keep the same key
// blocks: a KV head's whole GQA group (full and streaming heads), or a single XAttention head at prefill (its block
// selection is per query head). The unit's query rows are gathered into Q [heads x rows, hd]; its kept keys, read in
// place as runs of rows with one stride (the cache, its ring, this call's fresh rows), give the scores
// S [heads x rows, keys] and then O = softmax(S) V with matrix products, so each key row is read once per unit
// instead of once per query row, and the products run at BLAS speed. The softmax is exact (max-subtracted, fp32).

// A run of key positions [j0, j1) whose rows sit `stride` floats apart from k / v.
struct KeyRun {
  int j0, j1;
  const float *k, *v;
  int stride;
};

// The unit's kept key positions as runs: blocks kb <= qb with keep(kb), clipped to the last row's position.
template <class Keep>
void key_runs(const HeadKV& kv, int qb, int B, int last_pos, const Keep& keep, std::vector<KeyRun>& runs) {
  runs.clear();
  for (int kb = 0; kb <= qb; ++kb) {
    if (!keep(kb)) continue;
    const int j1 = std::min(last_pos + 1, (kb + 1) * B);
    for (int j = kb * B; j < j1; ++j) {
      const float *k = kv.k(j), *v = kv.v(j);
      const int stride = j >= kv.pos0 ? kv.new_stride : kv.hd;
      if (!runs.empty()) {
        KeyRun& r = runs.back();
        const size_t off = static_cast<size_t>(j - r.j0) * r.stride;
        if (r.j1 == j && r.stride == stride && r.k + off == k && r.v + off == v) {
          r.j1 = j + 1;
          continue;
        }
      }
      runs.push_back({j, j + 1, k, v, stride});
    }
  }
}

struct TileScratch {
  std::vector<float> q, s, o, inv;  // gathered queries, scores / probabilities, output rows, 1 / row sums
  std::vector<KeyRun> runs;
};

// One unit: query heads h0, h0 + 1, ... (n_h of them) at positions [p0, p1) of query block qb. Returns keys touched.
template <class Keep>
double attend_unit(const AttentionArgs& a, const HeadKV& kv, int h0, int n_h, int qb, int p0, int p1, int B,
                   float scale, const Keep& keep, TileScratch& w) {
  const int hd = a.head_dim, rows = p1 - p0, M = n_h * rows, n_pos = a.pos0 + a.T;
  key_runs(kv, qb, B, p1 - 1, keep, w.runs);
  int nk = 0;
  for (const KeyRun& r : w.runs) nk += r.j1 - r.j0;
  // Q rows: head-major, then position.
  w.q.resize(static_cast<size_t>(M) * hd);
  for (int i = 0; i < n_h; ++i)
    for (int r = 0; r < rows; ++r)
      std::copy_n(a.q + (static_cast<size_t>(p0 + r - a.pos0) * a.n_heads + h0 + i) * hd, hd,
                  w.q.data() + (static_cast<size_t>(i) * rows + r) * hd);
  // S = scale * Q K^T, run by run into S's columns.
  w.s.resize(static_cast<size_t>(M) * nk);
  int col = 0;
  for (const KeyRun& r : w.runs) {
    sgemm(false, true, M, r.j1 - r.j0, hd, scale, w.q.data(), hd, r.k, r.stride, 0.f, w.s.data() + col, nk);
    col += r.j1 - r.j0;
  }
  // Causal inside the diagonal block (keys past a row's position), softmax per row.
  double done = 0;
  std::vector<float>& inv = w.inv;
  inv.resize(static_cast<size_t>(M));
  for (int m = 0; m < M; ++m) {
    const int p = p0 + m % rows;
    float* srow = w.s.data() + static_cast<size_t>(m) * nk;
    int c = 0, kept = 0;
    for (const KeyRun& r : w.runs) {
      for (int j = r.j0; j < r.j1; ++j, ++c)
        if (j > p) srow[c] = -INFINITY;
        else ++kept;
    }
    done += kept;
    float mx = -INFINITY;
    for (int c2 = 0; c2 < nk; ++c2) mx = std::max(mx, srow[c2]);
    for (int c2 = 0; c2 < nk; ++c2) srow[c2] -= mx;
    exp_inplace(srow, nk);
    float sum = 0.f;
    for (int c2 = 0; c2 < nk; ++c2) sum += srow[c2];
    inv[m] = 1.f / sum;
    // Probing: the softmax weights of the call's last position.
    if (a.last_row_probs && p == n_pos - 1) {
      float* probs = a.last_row_probs + static_cast<size_t>(h0 + m / rows) * n_pos;
      c = 0;
      for (const KeyRun& r : w.runs)
        for (int j = r.j0; j < r.j1; ++j, ++c) probs[j] = srow[c] * inv[m];
    }
  }
  // O = P V, accumulated run by run; then each row divided by its sum and written to its head's output.
  w.o.resize(static_cast<size_t>(M) * hd);
  col = 0;
  for (size_t i = 0; i < w.runs.size(); ++i) {
    const KeyRun& r = w.runs[i];
    sgemm(false, false, M, hd, r.j1 - r.j0, 1.f, w.s.data() + col, nk, r.v, r.stride, i ? 1.f : 0.f, w.o.data(), hd);
    col += r.j1 - r.j0;
  }
  for (int m = 0; m < M; ++m) {
    const float* orow = w.o.data() + static_cast<size_t>(m) * hd;
    float* out = a.out + (static_cast<size_t>(p0 + m % rows - a.pos0) * a.n_heads + h0 + m / rows) * hd;
    for (int d = 0; d < hd; ++d) out[d] = orow[d] * inv[m];
  }
  return done;
}

}  // namespace

void attention_forward(const AttentionArgs& a) {
  const auto t_start = std::chrono::steady_clock::now();
  if (a.n_heads % a.n_kv_heads) throw std::invalid_argument("attention_forward: Hq not a multiple of Hkv");
  static const SparseSettings kDefault;
  const SparseSettings& sp = a.sparse ? *a.sparse : kDefault;
  const int group = a.n_heads / a.n_kv_heads, hd = a.head_dim, B = sp.block;
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  const int n_pos = a.pos0 + a.T;
  const int nb = (n_pos + B - 1) / B;

  // Estimator selections per query head (XAttention), for prefill calls that start on a block boundary. A query
  // block's row of the selection depends only on its own queries and the keys before it, so a later chunk scores its
  // rows against the whole key prefix (earlier query blocks neither scored nor selected) and matches an unchunked
  // prefill.
  std::vector<BlockMask> xmask(a.n_heads);
  if (a.prefill && a.pos0 % B == 0)
    for (int h = 0; h < a.n_heads; ++h)
      if (const SparsePattern& pat = sparse_pattern(a.modes[h / group]);
          pat.select && (!a.kv_heads || a.kv_heads[h / group])) {
        std::vector<float> qh(static_cast<size_t>(n_pos) * hd, 0.f);
        std::vector<float> kh(static_cast<size_t>(n_pos) * hd);
        for (int t = 0; t < a.T; ++t)
          std::copy_n(a.q + (static_cast<size_t>(t) * a.n_heads + h) * hd, hd, qh.data() + static_cast<size_t>(a.pos0 + t) * hd);
        for (int j = 0; j < n_pos; ++j) std::copy_n(a.kv[h / group].k(j), hd, kh.data() + static_cast<size_t>(j) * hd);
        xmask[h] = pat.select(qh.data(), kh.data(), n_pos, hd, sp, a.pos0);
      }

  // Each KV head's block rule, looked up in the pattern registry once per call rather than once per asked block.
  std::vector<bool (*)(int, int, const SparseSettings&, const BlockMask*)> rule(a.n_kv_heads);
  for (int kvh = 0; kvh < a.n_kv_heads; ++kvh) rule[kvh] = sparse_pattern(a.modes[kvh]).keeps;
  auto keeps = [&](int h, int qb, int kb) { return rule[h / group](qb, kb, sp, &xmask[h]); };

  // Softmax weights of the final query position per query head (zero where a block is skipped), for probing.
  if (a.last_row_probs) std::fill(a.last_row_probs, a.last_row_probs + static_cast<size_t>(a.n_heads) * n_pos, 0.f);
  // Work units (see attend_unit): per query block of this call, per KV head its group, or per query head for
  // XAttention heads with a block selection.
  struct Unit {
    int h0, n_h, qb;
  };
  std::vector<Unit> units;
  const int qb0 = a.pos0 / B, qb1 = (n_pos - 1) / B;
  for (int qb = qb0; qb <= qb1; ++qb)
    for (int kvh = 0; kvh < a.n_kv_heads; ++kvh) {
      if (a.kv_heads && !a.kv_heads[kvh]) continue;  // another rank's head
      if (xmask[kvh * group].n_blocks > 0)  // a selection per query head: single-head units
        for (int h = kvh * group; h < (kvh + 1) * group; ++h) units.push_back({h, 1, qb});
      else units.push_back({kvh * group, group, qb});
    }
  double done = 0;
#pragma omp parallel reduction(+ : done)
  {
    TileScratch w;
#pragma omp for schedule(dynamic, 1)
    for (size_t u = 0; u < units.size(); ++u) {
      const Unit& un = units[u];
      const int p0 = std::max(a.pos0, un.qb * B), p1 = std::min(n_pos, (un.qb + 1) * B);
      done += attend_unit(a, a.kv[un.h0 / group], un.h0, un.n_h, un.qb, p0, p1, B, scale,
                          [&](int kb) { return keeps(un.h0, un.qb, kb); }, w);
    }
  }
  if (!a.stats) return;
  AttentionStats& st = *a.stats;
  st.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  st.pairs_done += done;
  for (int t = 0; t < a.T; ++t) st.pairs_full += static_cast<double>(a.pos0 + t + 1) * a.n_heads;
  if (a.track_esr) {
    // Selecting heads: what the GPU kernel's walk would compute for the selections made here, per 64-row query tile
    // as the kernel walks (tile_walk.h: 64-key tiles, a head's list cut at its query tile), for its two pairings:
    // head pairs (the query heads of a KV head paired in order, an odd group's last head alone, at one query tile)
    // and row pairs (one head's query tiles paired from the call's first, an odd count's last alone).
    const int R = B / 64, qt0 = a.pos0 / 64, qt1 = (n_pos - 1) / 64;
    auto tiles_of = [&](int h, int qt) {
      std::vector<int> t;
      const int qb = qt / R;
      for (int kb = 0; kb <= qb; ++kb)
        if (keeps(h, qb, kb))
          for (int r = 0; r < R && kb * R + r <= qt; ++r) t.push_back(kb * R + r);
      return t;
    };
    for (int kvh = 0; kvh < a.n_kv_heads; ++kvh) {
      if (xmask[kvh * group].n_blocks == 0) continue;
      for (int qt = qt0; qt <= qt1; ++qt)
        for (int h = kvh * group; h < (kvh + 1) * group; h += 2) {
          const int n_pair = std::min(2, (kvh + 1) * group - h);
          const std::vector<int> t0 = tiles_of(h, qt), t1 = n_pair > 1 ? tiles_of(h + 1, qt) : std::vector<int>{};
          st.xattn_kept_tiles += static_cast<double>(t0.size() + t1.size());
          st.xattn_paired_tiles += 2.0 * n_pair * paired_walk_steps(t0, t1);
        }
    }
    for (int h = 0; h < a.n_heads; ++h) {
      if (xmask[h].n_blocks == 0) continue;
      for (int qt = qt0; qt <= qt1; qt += 2) {
        const int n_half = qt + 1 <= qt1 ? 2 : 1;
        const std::vector<int> t0 = tiles_of(h, qt), t1 = n_half > 1 ? tiles_of(h, qt + 1) : std::vector<int>{};
        st.xattn_rowpair_kept += static_cast<double>(t0.size() + t1.size());
        st.xattn_rowpair_tiles += 2.0 * n_half * paired_walk_steps(t0, t1);
      }
    }
    // Per KV head: causal (query block, key block) pairs of the query blocks this call touched, and the skipped ones.
    if (static_cast<int>(st.blocks_causal.size()) != a.n_kv_heads) {
      st.blocks_skipped.assign(a.n_kv_heads, 0);
      st.blocks_causal.assign(a.n_kv_heads, 0);
    }
    // A query block split across calls (chunks, decode steps) counts by the share of its rows done in this call.
    const int qb0 = a.pos0 / B, qb1 = (n_pos - 1) / B;
    for (int qb = qb0; qb <= qb1 && qb < nb; ++qb) {
      const int rows = std::min(n_pos, (qb + 1) * B) - std::max(a.pos0, qb * B);
      const double w = static_cast<double>(rows) / B / group;
      for (int h = 0; h < a.n_heads; ++h)
        for (int kb = 0; kb <= qb; ++kb) {
          st.blocks_causal[h / group] += w;
          if (!keeps(h, qb, kb)) st.blocks_skipped[h / group] += w;
        }
    }
  }
}

}  // namespace elastic

namespace elastic {

int paired_walk_steps(const std::vector<int>& a, const std::vector<int>& b) {
  std::vector<int> u;
  u.reserve(a.size() + b.size());
  std::set_union(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(u));
  int steps = 0;
  for (size_t i = 0; i < u.size(); ++steps) i += (i + 1 < u.size() && u[i + 1] == u[i] + 1) ? 2 : 1;
  return steps;
}

void AttentionStats::add_layer(int layer, int n_layers, const AttentionStats& one) {
  xattn_kept_tiles += one.xattn_kept_tiles;
  xattn_paired_tiles += one.xattn_paired_tiles;
  xattn_rowpair_kept += one.xattn_rowpair_kept;
  xattn_rowpair_tiles += one.xattn_rowpair_tiles;
  pairs_done += one.pairs_done;
  pairs_full += one.pairs_full;
  seconds += one.seconds;
  const size_t H = one.blocks_causal.size();
  if (H == 0) return;
  auto add = [](std::vector<double>& to, const std::vector<double>& from, size_t at) {
    for (size_t h = 0; h < from.size(); ++h) to[at + h] += from[h];
  };
  if (per_layer) {
    if (layer_blocks_causal.size() != static_cast<size_t>(n_layers) * H) {
      layer_blocks_skipped.assign(static_cast<size_t>(n_layers) * H, 0.0);
      layer_blocks_causal.assign(static_cast<size_t>(n_layers) * H, 0.0);
    }
    add(layer_blocks_skipped, one.blocks_skipped, static_cast<size_t>(layer) * H);
    add(layer_blocks_causal, one.blocks_causal, static_cast<size_t>(layer) * H);
  }
  if (layer == n_layers - 1) {
    if (blocks_causal.size() != H) blocks_skipped.assign(H, 0.0), blocks_causal.assign(H, 0.0);
    add(blocks_skipped, one.blocks_skipped, 0);
    add(blocks_causal, one.blocks_causal, 0);
  }
}

int64_t kept_kv_positions(const RoutingTable& r, int n_pos) {
  std::vector<int64_t> per_mode(n_sparse_patterns(), -1);  // one head's count: the same for every head of a mode
  int64_t total = 0;
  for (const HeadMode m : r.mode) {
    int64_t& k = per_mode.at(static_cast<size_t>(m));
    if (k < 0) k = pattern_kept_positions(m, n_pos, r.sparse);
    total += k;
  }
  return total;
}

double kept_kv_share(const RoutingTable& r, int n_pos) {
  const int64_t all = int64_t(n_pos) * int64_t(r.mode.size());
  return all > 0 ? double(kept_kv_positions(r, n_pos)) / double(all) : 0.0;
}

AttentionStats routed_prefill_stats(const RoutingTable& r, int T) {
  AttentionStats st;
  const int L = r.n_layers, Hkv = r.n_kv_heads;
  if (T <= 0 || L <= 0 || Hkv <= 0) return st;
  std::vector<PatternPrefillCost> cost(n_sparse_patterns());
  std::vector<bool> have(cost.size(), false);
  auto of = [&](HeadMode m) -> const PatternPrefillCost& {
    const size_t i = static_cast<size_t>(m);
    if (!have.at(i)) cost[i] = pattern_prefill_cost(m, T, r.sparse), have[i] = true;
    return cost[i];
  };
  // NaN where any head's work depends on the input (an estimator's pattern): flops_ratio() and esr() come out NaN.
  for (const HeadMode m : r.mode) {
    st.pairs_done += of(m).pairs;
    st.pairs_full += of(m).pairs_full;
  }
  // ESR: the last layer's KV heads.
  st.blocks_skipped.assign(Hkv, 0.0);
  st.blocks_causal.assign(Hkv, 0.0);
  for (int h = 0; h < Hkv; ++h) {
    st.blocks_skipped[h] = of(r.at(L - 1, h)).blocks_skipped;
    st.blocks_causal[h] = of(r.at(L - 1, h)).blocks_causal;
  }
  if (std::isnan(st.pairs_done)) st.blocks_skipped.assign(Hkv, NAN);
  return st;
}

}  // namespace elastic
