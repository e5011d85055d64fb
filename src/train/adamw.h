#pragma once
// AdamW over a flat parameter vector (decoupled weight decay, bias-corrected moments).
#include <cstddef>
#include <vector>

namespace elastic::train {

struct AdamW {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.0;
  bool maximize = false;  // gradient ascent (the Lagrange multipliers)
  std::vector<double> m, v;
  std::vector<long> t;  // steps taken per element (elements can sit out a step)
  // One update of p with gradient g at learning rate lr. With `active`, only elements where active[i] is
  // nonzero move (moments included): the multipliers of a class absent from the batch must not drift on
  // momentum alone.
  void step(float* p, const double* g, size_t n, double lr, const char* active = nullptr);
};

// Scales g in place so its L2 norm is at most max_norm; returns the norm before clipping.
double clip_grad_norm(std::vector<double>& g, double max_norm);

}  // namespace elastic::train
