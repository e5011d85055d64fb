#include "elastic/attention.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace elastic {

RoutingTable RoutingTable::all_full(int n_layers, int n_kv_heads) {
  RoutingTable r;
  r.n_layers = n_layers;
  r.n_kv_heads = n_kv_heads;
  r.mode.assign(static_cast<size_t>(n_layers) * n_kv_heads, HeadMode::Full);
  return r;
}

namespace {

// One query row against keys [0, n_keys): exact softmax (max-subtracted) in fp32.
void full_row(const float* q, const float* K, const float* V, int n_keys, int hd, float scale, float* scores,
              float* out) {
  float mx = -INFINITY;
  for (int j = 0; j < n_keys; ++j) {
    const float* kj = K + static_cast<size_t>(j) * hd;
    float s = 0.f;
    for (int d = 0; d < hd; ++d) s += q[d] * kj[d];
    s *= scale;
    scores[j] = s;
    mx = std::max(mx, s);
  }
  float sum = 0.f;
  for (int j = 0; j < n_keys; ++j) {
    scores[j] = std::exp(scores[j] - mx);
    sum += scores[j];
  }
  const float inv = 1.f / sum;
  std::fill(out, out + hd, 0.f);
  for (int j = 0; j < n_keys; ++j) {
    const float p = scores[j] * inv;
    const float* vj = V + static_cast<size_t>(j) * hd;
    for (int d = 0; d < hd; ++d) out[d] += p * vj[d];
  }
}

}  // namespace

void attention_forward(const AttentionArgs& a) {
  if (a.n_heads % a.n_kv_heads) throw std::invalid_argument("attention_forward: Hq not a multiple of Hkv");
  const int group = a.n_heads / a.n_kv_heads, hd = a.head_dim;
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  const int total = a.T * a.n_heads;
#pragma omp parallel
  {
    std::vector<float> scores(static_cast<size_t>(a.pos0 + a.T));
#pragma omp for schedule(dynamic, 4)
    for (int i = 0; i < total; ++i) {
      const int t = i / a.n_heads, h = i % a.n_heads, kvh = h / group;
      const size_t off = (static_cast<size_t>(t) * a.n_heads + h) * hd;
      switch (a.modes[kvh]) {
        case HeadMode::Full:
          full_row(a.q + off, a.k[kvh], a.v[kvh], a.pos0 + t + 1, hd, scale, scores.data(), a.out + off);
          break;
      }
    }
  }
}

}  // namespace elastic
