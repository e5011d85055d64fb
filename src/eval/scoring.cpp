#include "elastic/sequence_backend.h"
#include "elastic/scoring.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace elastic {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

double round2(double x) { return std::round(x * 100.0) / 100.0; }

bool contains(const std::vector<int32_t>& hay, const std::vector<int32_t>& needle) {
  if (needle.empty()) return true;  // as Python's "" in s
  return std::search(hay.begin(), hay.end(), needle.begin(), needle.end()) != hay.end();
}

template <class F>
double corpus(const std::vector<std::string>& preds, const std::vector<std::vector<std::string>>& refs, F per) {
  if (preds.empty()) throw std::runtime_error("scoring: no predictions");
  if (preds.size() != refs.size())
    throw std::runtime_error("scoring: " + std::to_string(preds.size()) + " predictions but " +
                             std::to_string(refs.size()) + " reference lists");
  double s = 0;
  for (size_t i = 0; i < preds.size(); ++i) s += per(preds[i], refs[i]);
  return round2(s / preds.size() * 100.0);
}

}  // namespace

std::string ruler_postprocess(const std::string& pred) {
  std::string s = pred;
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20) c = '\n';
  const auto ws = [](unsigned char c) { return std::isspace(c) != 0; };
  size_t b = 0, e = s.size();
  while (b < e && ws(s[b])) ++b;
  while (e > b && ws(s[e - 1])) --e;
  return s.substr(b, e - b);
}

double string_match_all(const std::string& pred, const std::vector<std::string>& refs) {
  if (refs.empty()) throw std::runtime_error("string_match_all: empty reference list");
  const std::string p = lower(ruler_postprocess(pred));
  double hit = 0;
  for (const std::string& r : refs) hit += p.find(lower(r)) != std::string::npos ? 1.0 : 0.0;
  return hit / refs.size();
}

double string_match_part(const std::string& pred, const std::vector<std::string>& refs) {
  if (refs.empty()) throw std::runtime_error("string_match_part: empty reference list");
  const std::string p = lower(ruler_postprocess(pred));
  for (const std::string& r : refs)
    if (p.find(lower(r)) != std::string::npos) return 1.0;
  return 0.0;
}

double ruler_string_match_all(const std::vector<std::string>& preds, const std::vector<std::vector<std::string>>& refs) {
  return corpus(preds, refs, [](const std::string& p, const std::vector<std::string>& r) { return string_match_all(p, r); });
}

double ruler_string_match_part(const std::vector<std::string>& preds, const std::vector<std::vector<std::string>>& refs) {
  return corpus(preds, refs, [](const std::string& p, const std::vector<std::string>& r) { return string_match_part(p, r); });
}

double ids_match_all(const std::vector<int32_t>& pred, const std::vector<std::vector<int32_t>>& refs) {
  if (refs.empty()) throw std::runtime_error("ids_match_all: empty reference list");
  double hit = 0;
  for (const auto& r : refs) hit += contains(pred, r) ? 1.0 : 0.0;
  return hit / refs.size();
}

double ids_match_part(const std::vector<int32_t>& pred, const std::vector<std::vector<int32_t>>& refs) {
  if (refs.empty()) throw std::runtime_error("ids_match_part: empty reference list");
  for (const auto& r : refs)
    if (contains(pred, r)) return 1.0;
  return 0.0;
}

double LikelihoodScore::score() const { return tokens > 0 ? 100.0 * std::exp(mean_logprob) : 0.0; }

LikelihoodScore likelihood_from_logits(const float* logits, int V, const std::vector<int32_t>& ref) {
  LikelihoodScore s;
  if (ref.empty()) throw std::runtime_error("likelihood: empty reference");
  double sum = 0;
  int correct = 0;
  for (size_t t = 0; t < ref.size(); ++t) {
    if (ref[t] < 0 || ref[t] >= V)
      throw std::runtime_error("likelihood: reference token " + std::to_string(ref[t]) + " outside the vocabulary");
    const float* row = logits + t * static_cast<size_t>(V);
    double mx = -std::numeric_limits<double>::infinity();
    int arg = 0;
    for (int v = 0; v < V; ++v)
      if (row[v] > mx) { mx = row[v]; arg = v; }
    double z = 0;
    for (int v = 0; v < V; ++v) z += std::exp(static_cast<double>(row[v]) - mx);
    sum += static_cast<double>(row[ref[t]]) - mx - std::log(z);
    correct += arg == ref[t];
  }
  s.tokens = static_cast<int>(ref.size());
  s.mean_logprob = sum / s.tokens;
  s.greedy_acc = static_cast<double>(correct) / s.tokens;
  return s;
}

LikelihoodScore reference_likelihood(const Model& m, const std::vector<int32_t>& prompt,
                                     const std::vector<int32_t>& ref, const RoutingTable* routing,
                                     const PromptRouter* router, AttentionStats* stats, int prefill_chunk,
                                     RoutingTable* routed_out) {
  if (prompt.empty()) throw std::runtime_error("likelihood: empty prompt");
  if (ref.empty()) throw std::runtime_error("likelihood: empty reference");
  if (!routing && !router) throw std::runtime_error("likelihood: no routing and no router");
  const int V = m.config.vocab;
  const int need = static_cast<int>(prompt.size() + ref.size()) - 1;
  if (m.config.max_positions > 0 && need > m.config.max_positions)
    throw std::runtime_error("likelihood: prompt (" + std::to_string(prompt.size()) + ") + reference (" +
                             std::to_string(ref.size()) + ") tokens exceed the model context " +
                             std::to_string(m.config.max_positions));
  const auto be = cpu_sequence_backend(std::shared_ptr<const Model>(&m, [](const Model*) {}), need, prefill_chunk);
  RoutingTable used;
  const LikelihoodScore ls = backend_likelihood(*be, prompt, ref, routing, routing ? nullptr : router, V, used);
  if (stats) *stats = *be->counted_attention(true);  // the prompt's work: the reference rows are how it is read
  if (routed_out) *routed_out = used;
  return ls;
}

LikelihoodScore backend_likelihood(SequenceBackend& be, const std::vector<int32_t>& prompt,
                                   const std::vector<int32_t>& ref, const RoutingTable* routing,
                                   const PromptRouter* router, int V, RoutingTable& used) {
  if (prompt.empty()) throw std::runtime_error("likelihood: empty prompt");
  if (ref.empty()) throw std::runtime_error("likelihood: empty reference");
  std::vector<float> all, rows;
  be.prefill(prompt, routing, router, all, used);  // row 0 (the prompt's last position) predicts ref[0]
  if (ref.size() > 1) {
    be.extend(std::vector<int32_t>(ref.begin(), ref.end() - 1), rows);
    all.insert(all.end(), rows.begin(), rows.end());
  }
  if (all.size() != ref.size() * static_cast<size_t>(V)) throw std::runtime_error("likelihood: unexpected logits shape");
  return likelihood_from_logits(all.data(), V, ref);
}

}  // namespace elastic
