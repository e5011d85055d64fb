#include "elastic/batch_decode.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <unordered_set>

#include "model/cached_attention.h"
#include "model/ops.h"

namespace elastic {

namespace {

// ---- Batch-invariant projections.
// OpenBLAS's sgemm chooses its kernel, and with it the summation order of each output, by the row count: row 0 of a
// 4-row product differs in the last bits from the same row computed alone. Those bits flip sampled tokens, so a seeded
// request would answer differently batched than alone. Here every output y[b, n] is one dot product whose order of
// operations depends only on K: the same bits for any batch size, any batch position and any thread count. Each
// weight row is read once for all batch rows, so at decode batch sizes this is memory-bound like the sgemm it
// replaces.

constexpr int kLanes = 16;  // two 8-wide accumulators; the scalar form below does the same operations in the same order

// Dot products of R rows of x (stride K) with one weight row w, written to y[r * ystride].
template <int R>
void dot_rows(const float* x, const float* w, int K, float* y, size_t ystride) {
  int k = 0;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 s0[R], s1[R];
  for (int r = 0; r < R; ++r) s0[r] = s1[r] = _mm256_setzero_ps();
  for (; k + kLanes <= K; k += kLanes) {
    const __m256 w0 = _mm256_loadu_ps(w + k), w1 = _mm256_loadu_ps(w + k + 8);
    for (int r = 0; r < R; ++r) {
      s0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + static_cast<size_t>(r) * K + k), w0, s0[r]);
      s1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + static_cast<size_t>(r) * K + k + 8), w1, s1[r]);
    }
  }
  float lane[R][kLanes];
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(lane[r], s0[r]);
    _mm256_storeu_ps(lane[r] + 8, s1[r]);
  }
#else
  float lane[R][kLanes] = {};
  for (; k + kLanes <= K; k += kLanes)
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < kLanes; ++j) lane[r][j] = std::fma(x[static_cast<size_t>(r) * K + k + j], w[k + j], lane[r][j]);
#endif
  for (int r = 0; r < R; ++r) {
    const float* L = lane[r];
    float a[8];
    for (int j = 0; j < 8; ++j) a[j] = L[j] + L[j + 8];  // s0 + s1, lane by lane
    float s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    for (int t = k; t < K; ++t) s = std::fma(x[static_cast<size_t>(r) * K + t], w[t], s);
    y[r * ystride] = s;
  }
}

// y[B, N] = x[B, K] * W[N, K]^T (+ b), batch-invariant (see above).
void linear_invariant(const float* x, const float* W, const std::vector<float>& b, float* y, int B, int N, int K) {
  const size_t ys = static_cast<size_t>(N);
#pragma omp parallel for schedule(static) if (static_cast<double>(N) * K * B > 1e5)
  for (int n = 0; n < N; ++n) {
    const float* w = W + static_cast<size_t>(n) * K;
    int r = 0;
    for (; r + 4 <= B; r += 4) dot_rows<4>(x + static_cast<size_t>(r) * K, w, K, y + r * ys + n, ys);
    for (; r < B; ++r) dot_rows<1>(x + static_cast<size_t>(r) * K, w, K, y + r * ys + n, ys);
    if (!b.empty())
      for (int t = 0; t < B; ++t) y[t * ys + n] += b[n];
  }
}

// The routing a slot decodes under, chosen as Model::forward does: the slot's own, else the one its cache was built
// for, else the model's.
const RoutingTable& slot_routing(const Model& m, const DecodeSlot& s) {
  return s.routing ? *s.routing : s.cache->routing.n_layers ? s.cache->routing : m.routing;
}

// All checks up front, so a bad slot leaves every cache untouched.
void check_slots(const Model& m, const std::vector<DecodeSlot>& slots) {
  const ModelConfig& c = m.config;
  std::unordered_set<const KVCache*> seen;
  for (size_t b = 0; b < slots.size(); ++b) {
    const DecodeSlot& s = slots[b];
    const std::string who = "decode_batch: slot " + std::to_string(b);
    if (!s.cache) throw std::invalid_argument(who + " has no KV cache");
    if (!seen.insert(s.cache).second) throw std::invalid_argument(who + " repeats another slot's KV cache");
    const KVCache& kc = *s.cache;
    if (kc.n_layers != c.n_layers || kc.n_kv_heads != c.n_kv_heads || kc.head_dim != c.head_dim)
      throw std::invalid_argument(who + ": KV cache was built for another model shape");
    if (kc.length + 1 > kc.capacity)
      throw std::runtime_error(who + ": context overflow: " + std::to_string(kc.length + 1) +
                               " tokens exceed the KV cache capacity " + std::to_string(kc.capacity));
    if (s.token < 0 || s.token >= c.vocab)
      throw std::runtime_error(who + ": token id " + std::to_string(s.token) + " is outside the vocabulary [0, " +
                               std::to_string(c.vocab) + ")");
    const RoutingTable& r = slot_routing(m, s);
    if (r.n_layers != c.n_layers || r.n_kv_heads != c.n_kv_heads ||
        r.mode.size() != static_cast<size_t>(c.n_layers) * c.n_kv_heads)
      throw std::invalid_argument(who + ": routing table is " + std::to_string(r.n_layers) + " x " +
                                  std::to_string(r.n_kv_heads) + ", the model has " + std::to_string(c.n_layers) +
                                  " layers x " + std::to_string(c.n_kv_heads) + " KV heads");
    // A ring cache holds only a streaming head's window: any other mode would read overwritten keys.
    for (size_t i = 0; i < r.mode.size(); ++i)
      if (kc.ring_slots[i] && r.mode[i] != HeadMode::Streaming)
        throw std::runtime_error(who + ": KV cache was built for another routing: layer " +
                                 std::to_string(i / c.n_kv_heads) + " KV head " + std::to_string(i % c.n_kv_heads) +
                                 " has a streaming window cache but is routed " + head_mode_name(r.mode[i]));
  }
}

}  // namespace

void decode_batch(const Model& m, const std::vector<DecodeSlot>& slots, std::vector<float>& logits) {
  const ModelConfig& c = m.config;
  const int B = static_cast<int>(slots.size());
  logits.clear();
  if (B == 0) return;
  check_slots(m, slots);
  const int D = c.hidden, hd = c.head_dim, Hq = c.n_heads, Hkv = c.n_kv_heads, F = c.intermediate, V = c.vocab;
  const ModelWeights& W = m.weights;

  // Row b of every activation belongs to slot b (one new position each).
  std::vector<float> x(static_cast<size_t>(B) * D), h(x.size()), q(static_cast<size_t>(B) * Hq * hd),
      k(static_cast<size_t>(B) * Hkv * hd), v(k.size()), att(q.size()), o(x.size()), g(static_cast<size_t>(B) * F),
      u(g.size());
  for (int b = 0; b < B; ++b)
    std::copy_n(W.embed.data() + static_cast<size_t>(slots[b].token) * D, D, x.data() + static_cast<size_t>(b) * D);

  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = W.layers[l];
    rmsnorm_rows(x.data(), L.attn_norm.data(), h.data(), B, D, c.rms_eps);
    linear_invariant(h.data(), L.wq.data(), L.bq, q.data(), B, Hq * hd, D);
    linear_invariant(h.data(), L.wk.data(), L.bk, k.data(), B, Hkv * hd, D);
    linear_invariant(h.data(), L.wv.data(), L.bv, v.data(), B, Hkv * hd, D);
    if (c.qk_norm) {
      rmsnorm_rows(q.data(), L.q_norm.data(), q.data(), B * Hq, hd, c.rms_eps);
      rmsnorm_rows(k.data(), L.k_norm.data(), k.data(), B * Hkv, hd, c.rms_eps);
    }
    for (int b = 0; b < B; ++b) {
      const int pos0 = slots[b].cache->length;
      float* qb = q.data() + static_cast<size_t>(b) * Hq * hd;
      float* kb = k.data() + static_cast<size_t>(b) * Hkv * hd;
      const float* vb = v.data() + static_cast<size_t>(b) * Hkv * hd;
      apply_rope(qb, 1, Hq, hd, pos0, m.rope_inv_freq);  // each row at its own sequence's position
      apply_rope(kb, 1, Hkv, hd, pos0, m.rope_inv_freq);
      cached_attention(c, l, qb, kb, vb, 1, pos0, *slots[b].cache, slot_routing(m, slots[b]),
                       att.data() + static_cast<size_t>(b) * Hq * hd, slots[b].stats, nullptr, false);
    }
    linear_invariant(att.data(), L.wo.data(), {}, o.data(), B, D, Hq * hd);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];

    rmsnorm_rows(x.data(), L.mlp_norm.data(), h.data(), B, D, c.rms_eps);
    linear_invariant(h.data(), L.w_gate.data(), {}, g.data(), B, F, D);
    linear_invariant(h.data(), L.w_up.data(), {}, u.data(), B, F, D);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];  // SwiGLU
    linear_invariant(g.data(), L.w_down.data(), {}, o.data(), B, D, F);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
  }
  for (const DecodeSlot& s : slots) s.cache->length += 1;

  rmsnorm_rows(x.data(), W.final_norm.data(), h.data(), B, D, c.rms_eps);
  logits.resize(static_cast<size_t>(B) * V);
  linear_invariant(h.data(), W.head(), {}, logits.data(), B, V, D);
}

}  // namespace elastic
