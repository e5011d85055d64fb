#include "train/adamw.h"

#include <cmath>

namespace elastic::train {

void AdamW::step(float* p, const double* g, size_t n, double lr, const char* active) {
  if (m.size() != n) {
    m.assign(n, 0.0);
    v.assign(n, 0.0);
    t.assign(n, 0);
  }
  const double sign = maximize ? -1.0 : 1.0;
  for (size_t i = 0; i < n; ++i) {
    if (active && !active[i]) continue;
    const long ti = ++t[i];
    const double c1 = 1.0 - std::pow(beta1, static_cast<double>(ti)), c2 = 1.0 - std::pow(beta2, static_cast<double>(ti));
    const double gi = sign * g[i];
    m[i] = beta1 * m[i] + (1 - beta1) * gi;
    v[i] = beta2 * v[i] + (1 - beta2) * gi * gi;
    double x = p[i];
    x -= lr * weight_decay * x;
    x -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
    p[i] = static_cast<float>(x);
  }
}

double clip_grad_norm(std::vector<double>& g, double max_norm) {
  double s = 0;
  for (double x : g) s += x * x;
  const double norm = std::sqrt(s);
  if (max_norm > 0 && norm > max_norm)
    for (double& x : g) x *= max_norm / norm;
  return norm;
}

}  // namespace elastic::train
