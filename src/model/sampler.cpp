#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

#include "elastic/generate.h"

namespace elastic {

namespace {

// Logits holding NaN or +inf (weights or activations that overflowed), or only -inf, define no distribution: the
// top-p path once indexed an empty candidate list on them, and argmax returned an arbitrary id. A finite logit, or
// -inf (a masked id) beside at least one finite one, is what sampling needs.
void check_logits(const float* logits, int vocab) {
  if (vocab <= 0) throw std::invalid_argument("sampler: no logits (vocabulary size " + std::to_string(vocab) + ")");
  bool any_finite = false;
  for (int i = 0; i < vocab; ++i) {
    const float v = logits[i];
    if (std::isnan(v) || v == INFINITY)
      throw std::runtime_error("sampler: logit of token " + std::to_string(i) + " is " + (std::isnan(v) ? "NaN" : "+inf") +
                               ": the model's weights or activations overflowed");
    any_finite = any_finite || v != -INFINITY;
  }
  if (!any_finite) throw std::runtime_error("sampler: every logit is -inf: there is no token to choose");
}

}  // namespace

int32_t Sampler::sample(const float* logits, int vocab) {
  check_logits(logits, vocab);
  if (p_.temperature <= 0.f)
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);  // first max, like torch.argmax
  // Only top-k and top-p need the candidates in order; plain temperature sampling draws in id order (no sort of a
  // 150k vocabulary per token).
  const float mx = *std::max_element(logits, logits + vocab);
  std::vector<int32_t> idx;
  int n = vocab;
  auto by_logit = [&](int a, int b) { return logits[a] > logits[b]; };
  if (p_.top_k > 0 && p_.top_k < vocab) {
    idx.resize(vocab);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + p_.top_k, idx.end(), by_logit);
    n = p_.top_k;
  } else if (p_.top_p < 1.f) {
    // Tokens below e^-40 of the best cannot change a top-p prefix: sort only the rest.
    for (int i = 0; i < vocab; ++i)
      if ((logits[i] - mx) / p_.temperature > -40.f) idx.push_back(i);
    std::sort(idx.begin(), idx.end(), by_logit);
    n = static_cast<int>(idx.size());
  } else {
    idx.resize(vocab);
    std::iota(idx.begin(), idx.end(), 0);
  }
  std::vector<double> prob(n);
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
