#include "elastic/attention.h"

#include "model/ops.h"

#include <algorithm>
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

bool streaming_keeps(int qb, int kb, const SparseSettings& s) {
  // In 64 bits: settings built in code skip validate_sparse, and rounding INT_MAX up to a block would overflow (a
  // window larger than the sequence then keeps everything, as it should).
  const int64_t B = s.block, sink_blocks = (int64_t{s.sink} + B - 1) / B;
  const int64_t local_blocks = std::max<int64_t>(1, (int64_t{s.local} + B - 1) / B);
  return kb <= qb && (kb < sink_blocks || int64_t{qb} - kb < local_blocks);
}

namespace {

// One query row at absolute position p against the keys of the allowed blocks (token-causal inside them):
// exact softmax (max-subtracted) in fp32. keep(kb) says whether key block kb is computed. Returns keys touched.
// probs (optional, [p + 1], zeroed by the caller) receives the softmax weights, for probing.
template <class Keep>
int sparse_row(const float* q, const HeadKV& kv, int p, int hd, int B, float scale, const Keep& keep,
               float* scores, float* out, float* probs = nullptr) {
  const int qb = p / B;
  float mx = -INFINITY;
  int n = 0;
  for (int kb = 0; kb <= qb; ++kb) {
    if (!keep(kb)) continue;
    const int j1 = std::min(p + 1, (kb + 1) * B);
    for (int j = kb * B; j < j1; ++j) {
      const float s = dot(q, kv.k(j), hd) * scale;
      scores[j] = s;
      mx = std::max(mx, s);
      ++n;
    }
  }
  float sum = 0.f;
  std::fill(out, out + hd, 0.f);
  for (int kb = 0; kb <= qb; ++kb) {
    if (!keep(kb)) continue;
    const int j1 = std::min(p + 1, (kb + 1) * B);
    for (int j = kb * B; j < j1; ++j) {
      const float e = std::exp(scores[j] - mx);
      sum += e;
      if (probs) probs[j] = e;
      const float* vj = kv.v(j);
      for (int d = 0; d < hd; ++d) out[d] += e * vj[d];
    }
  }
  const float inv = 1.f / sum;
  for (int d = 0; d < hd; ++d) out[d] *= inv;
  if (probs)
    for (int j = 0; j <= p; ++j) probs[j] *= inv;
  return n;
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

  // XAttention selections per query head, for prefill calls that start on a block boundary. A query block's row of
  // the selection depends only on its own queries and the keys before it, so a later chunk scores its rows against
  // the whole key prefix (earlier query rows zero, their selection unused) and matches an unchunked prefill.
  std::vector<BlockMask> xmask(a.n_heads);
  if (a.prefill && a.pos0 % B == 0)
    for (int h = 0; h < a.n_heads; ++h)
      if (a.modes[h / group] == HeadMode::XAttn && (!a.kv_heads || a.kv_heads[h / group])) {
        XAttnParams xp = sp.xattn;
        xp.block = B;
        std::vector<float> qh(static_cast<size_t>(n_pos) * hd, 0.f);
        std::vector<float> kh(static_cast<size_t>(n_pos) * hd);
        for (int t = 0; t < a.T; ++t)
          std::copy_n(a.q + (static_cast<size_t>(t) * a.n_heads + h) * hd, hd, qh.data() + static_cast<size_t>(a.pos0 + t) * hd);
        for (int j = 0; j < n_pos; ++j) std::copy_n(a.kv[h / group].k(j), hd, kh.data() + static_cast<size_t>(j) * hd);
        xmask[h] = xattn_select(qh.data(), kh.data(), n_pos, hd, xp);
      }

  auto keeps = [&](int h, int qb, int kb) { return block_kept(a.modes[h / group], &xmask[h], qb, kb, sp); };

  // Softmax weights of the final query position per query head (zero where a block is skipped), for probing.
  if (a.last_row_probs) std::fill(a.last_row_probs, a.last_row_probs + static_cast<size_t>(a.n_heads) * n_pos, 0.f);
  const int total = a.T * a.n_heads;
  double done = 0;
#pragma omp parallel reduction(+ : done)
  {
    std::vector<float> scores(static_cast<size_t>(n_pos));
#pragma omp for schedule(dynamic, 4)
    for (int i = 0; i < total; ++i) {
      const int t = i / a.n_heads, h = i % a.n_heads, kvh = h / group, p = a.pos0 + t, qb = p / B;
      if (a.kv_heads && !a.kv_heads[kvh]) continue;  // another rank's head
      const size_t off = (static_cast<size_t>(t) * a.n_heads + h) * hd;
      float* probs = (a.last_row_probs && t == a.T - 1) ? a.last_row_probs + static_cast<size_t>(h) * n_pos : nullptr;
      done += sparse_row(a.q + off, a.kv[kvh], p, hd, B, scale, [&](int kb) { return keeps(h, qb, kb); },
                         scores.data(), a.out + off, probs);
    }
  }
  if (!a.stats) return;
  AttentionStats& st = *a.stats;
  st.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  st.pairs_done += done;
  for (int t = 0; t < a.T; ++t) st.pairs_full += static_cast<double>(a.pos0 + t + 1) * a.n_heads;
  if (a.track_esr) {
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

AttentionStats routed_prefill_stats(const RoutingTable& r, int T) {
  AttentionStats st;
  const SparseSettings& s = r.sparse;
  const int B = s.block, nb = (T + B - 1) / B, L = r.n_layers, Hkv = r.n_kv_heads;
  if (T <= 0 || L <= 0 || Hkv <= 0) return st;
  for (HeadMode m : r.mode)
    if (m == HeadMode::XAttn) {
      st.pairs_done = NAN;  // flops_ratio() and esr() come out NaN, not a made-up number
      st.pairs_full = 1;
      st.blocks_skipped.assign(Hkv, NAN);
      st.blocks_causal.assign(Hkv, 1.0);
      return st;
    }
  // Causal (query, key) pairs and causal / skipped blocks of one streaming head; a full head keeps all of them.
  double all_pairs = 0, ssa_pairs = 0, all_blocks = 0, ssa_skipped = 0;
  for (int qb = 0; qb < nb; ++qb) {
    const int q0 = qb * B, rows = std::min(T, q0 + B) - q0;
    for (int kb = 0; kb <= qb; ++kb) {
      const double pairs = kb < qb ? double(rows) * B : double(rows) * (rows + 1) / 2;
      const double w = double(rows) / B;  // a partial last block counts by its rows, as attention_forward does
      all_pairs += pairs;
      all_blocks += w;
      if (streaming_keeps(qb, kb, s)) ssa_pairs += pairs;
      else ssa_skipped += w;
    }
  }
  const size_t n = r.mode.size();
  for (size_t i = 0; i < n; ++i) st.pairs_done += r.mode[i] == HeadMode::Full ? all_pairs : ssa_pairs;
  st.pairs_full = all_pairs * double(n);
  // ESR: the last layer's KV heads.
  st.blocks_skipped.assign(Hkv, 0.0);
  st.blocks_causal.assign(Hkv, all_blocks);
  for (int h = 0; h < Hkv; ++h)
    if (r.at(L - 1, h) == HeadMode::Streaming) st.blocks_skipped[h] = ssa_skipped;
  return st;
}

}  // namespace elastic
