#pragma once
// The per-layer router network and its straight-through gate, in float (training, inference) or double (checks).
// Parameters of one layer, flat, in this order (d = head_dim, C = 2 classes, or 1 for the sigmoid variant):
//   task.fc1 W[4d,d] b[4d] | task.fc2 W[d,4d] b[d] | router.fc1 W[4d,d] b[4d] | router.fc2 W[d,4d] b[d] |
//   router.fc3 W[C,d] b[C]
// forward: logits = fc3(silu(fc2(silu(fc1(task(x)))))), task(x) = fc2(silu(fc1(x))); rows = KV heads.
#include <cmath>
#include <cstddef>
#include <vector>

#include "elastic/router.h"

namespace elastic::router {

size_t layer_param_count(int d, int C);

// Activations one forward keeps for its backward; n rows.
template <class Real>
struct MlpActs {
  std::vector<Real> u1, t, u3, u4, h4;  // [n,4d], [n,d], [n,4d], [n,d], [n,d] (silu recomputed from u*)
};

template <class Real>
void mlp_fwd(const Real* P, int d, int C, const Real* x, int n, Real* logits, MlpActs<Real>* acts);
// Adds parameter gradients into dP and input gradients into dx (may be null).
template <class Real>
void mlp_bwd(const Real* P, int d, int C, const Real* x, int n, const MlpActs<Real>& acts, const Real* dlogits,
             Real* dP, Real* dx);

// The router's pooling rule: out[w] = the mean of rows `rows` of k (row width w = Hkv * hd: one prompt position's keys
// after k_norm, before RoPE), each term divided by the count then summed in row order, so the CPU inference path and
// the CPU trainer pool bit for bit alike. Which rows: boundary_positions (model.h).
template <class Real>
void pool_rows(const Real* k, const std::vector<int>& rows, size_t w, Real* out) {
  const int n = static_cast<int>(rows.size());
  for (size_t j = 0; j < w; ++j) out[j] = Real(0);
  for (int r : rows)
    for (size_t j = 0; j < w; ++j) out[j] += k[static_cast<size_t>(r) * w + j] / n;
}

// The router's input rule, in place on x[n, d] (the pooled keys of n KV heads): Pooled reads them as they are; the
// learned-static control (HeadIdentity) replaces row h by sqrt(d) * e_h, the norm of a k_norm'ed key, so the MLP starts
// in the same range as under pooled keys. HeadIdentity needs n <= d (validate_router_spec). Inference, both trainers
// and the feature analysis all call this.
template <class Real>
void apply_router_input(RouterInput in, int n, int d, Real* x) {
  if (in == RouterInput::Pooled) return;
  for (size_t i = 0; i < static_cast<size_t>(n) * d; ++i) x[i] = Real(0);
  for (int h = 0; h < n; ++h) x[static_cast<size_t>(h) * d + h] = Real(std::sqrt(double(d)));
}

// Straight-through gate. The FULL probability is soft = sigmoid((l1 - l0 + noise) / tau) for C = 2 (2-class
// Gumbel-softmax: the difference of two Gumbel draws is logistic noise) and sigmoid((l0 + noise) / tau) for C = 1.
// Returns z = hard ? [soft > 1/2] : soft; dsoft_dlogits[C] receives d soft / d logits (the straight-through gradient).
template <class Real>
Real gate(const Real* logits, int C, Real noise, Real tau, bool hard, Real* dsoft_dlogits, Real* soft_out = nullptr);

// Inference decision: FULL when class 1 wins (C = 2) or the logit is positive (C = 1).
inline bool gate_full(const float* logits, int C) { return C == 2 ? logits[1] > logits[0] : logits[0] > 0.f; }

}  // namespace elastic::router
