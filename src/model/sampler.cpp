#include <algorithm>
#include <cmath>
#include <numeric>

#include "elastic/generate.h"

namespace elastic {

int32_t Sampler::sample(const float* logits, int vocab) {
  if (p_.temperature <= 0.f)
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);  // first max, like torch.argmax
  std::vector<int32_t> idx(vocab);
  std::iota(idx.begin(), idx.end(), 0);
  int n = vocab;
  if (p_.top_k > 0 && p_.top_k < vocab) {
    std::partial_sort(idx.begin(), idx.begin() + p_.top_k, idx.end(),
                      [&](int a, int b) { return logits[a] > logits[b]; });
    n = p_.top_k;
  } else {
    std::sort(idx.begin(), idx.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  }
  std::vector<double> prob(n);
  const double mx = logits[idx[0]];
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += prob[i] = std::exp((logits[idx[i]] - mx) / p_.temperature);
  if (p_.top_p < 1.f) {  // smallest prefix whose mass reaches top_p
    double acc = 0;
    int keep = n;
    for (int i = 0; i < n; ++i) {
      acc += prob[i] / sum;
      if (acc >= p_.top_p) { keep = i + 1; break; }
    }
    n = keep;
    sum = std::accumulate(prob.begin(), prob.begin() + n, 0.0);
  }
  std::uniform_real_distribution<double> U(0.0, sum);
  double r = U(rng_), acc = 0;
  for (int i = 0; i < n; ++i) {
    acc += prob[i];
    if (r < acc) return idx[i];
  }
  return idx[n - 1];
}

}  // namespace elastic
