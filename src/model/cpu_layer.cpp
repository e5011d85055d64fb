#include "model/cpu_layer.h"

#include <cmath>

#include "model/ops.h"

namespace elastic::cpu {

LayerActs::LayerActs(const ModelConfig& c, int T)
    : h(static_cast<size_t>(T) * c.hidden), q(static_cast<size_t>(T) * c.n_heads * c.head_dim),
      k(static_cast<size_t>(T) * c.n_kv_heads * c.head_dim), v(k.size()), att(q.size()), o(h.size()),
      g(static_cast<size_t>(T) * c.intermediate), u(g.size()) {}

namespace {
void product(const float* x, const WeightMatrix& W, const std::vector<float>& b, float* y, int T, Products p) {
  if (p == Products::RowWise) linear_rowwise(x, W, b, y, T);
  else linear(x, W, b, y, T);
}
}  // namespace

void layer_qkv(const Model& m, int l, const float* x, int T, LayerActs& w, Products p) {
  const ModelConfig& c = m.config;
  const LayerWeights& L = m.weights.layers[l];
  const int D = c.hidden, hd = c.head_dim;
  rmsnorm_rows(x, L.attn_norm.data(), w.h.data(), T, D, c.rms_eps);
  product(w.h.data(), L.wq, L.bq, w.q.data(), T, p);
  product(w.h.data(), L.wk, L.bk, w.k.data(), T, p);
  product(w.h.data(), L.wv, L.bv, w.v.data(), T, p);
  if (c.qk_norm) {
    rmsnorm_rows(w.q.data(), L.q_norm.data(), w.q.data(), T * c.n_heads, hd, c.rms_eps);
    rmsnorm_rows(w.k.data(), L.k_norm.data(), w.k.data(), T * c.n_kv_heads, hd, c.rms_eps);
  }
}

void layer_out_mlp(const Model& m, int l, float* x, int T, LayerActs& w, Products p) {
  const ModelConfig& c = m.config;
  const LayerWeights& L = m.weights.layers[l];
  const int D = c.hidden;
  const size_t n = static_cast<size_t>(T) * D, nf = static_cast<size_t>(T) * c.intermediate;
  product(w.att.data(), L.wo, {}, w.o.data(), T, p);
  for (size_t i = 0; i < n; ++i) x[i] += w.o[i];
  rmsnorm_rows(x, L.mlp_norm.data(), w.h.data(), T, D, c.rms_eps);
  product(w.h.data(), L.w_gate, {}, w.g.data(), T, p);
  product(w.h.data(), L.w_up, {}, w.u.data(), T, p);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < nf; ++i) w.g[i] = w.g[i] / (1.f + std::exp(-w.g[i])) * w.u[i];  // SwiGLU
  product(w.g.data(), L.w_down, {}, w.o.data(), T, p);
  for (size_t i = 0; i < n; ++i) x[i] += w.o[i];
}

}  // namespace elastic::cpu
