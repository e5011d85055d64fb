// Multi-hop tracing and aggregation tasks (RULER's vt, cwe, fwe).
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <stdexcept>

#include "tasks_common.h"

namespace elastic::task_detail {

namespace {

std::string var_name(SplitMix64& r) {
  std::string s;
  for (int i = 0; i < 5; ++i) s += static_cast<char>('A' + r.below(26));
  return s;
}

// Distinct pseudo-words, none in `avoid`.
std::vector<std::string> distinct_words(SplitMix64& r, size_t n, std::set<std::string>& used, int min_syl, int max_syl) {
  std::vector<std::string> out;
  int misses = 0;
  while (out.size() < n) {
    std::string w = pseudo_word(r, min_syl, max_syl + misses / 64);  // longer words when the short ones run out
    if (used.insert(w).second) out.push_back(w);
    else ++misses;
  }
  return out;
}

}  // namespace

// Variable tracking: one chain "VAR A = 12345", "VAR B = VAR A", ... (4 hops) spread in order through the noise
// haystack; the answer is every variable holding the value.
TaskSample make_variable_tracking(const TaskSpec& spec, const Enc& enc, int target, uint64_t seed) {
  SplitMix64 r(seed);
  const int hops = 4;
  std::set<std::string> used;
  std::vector<std::string> vars;
  while (static_cast<int>(vars.size()) < hops + 1) {
    std::string v = var_name(r);
    if (used.insert(v).second) vars.push_back(v);
  }
  const std::string value = std::to_string(10000 + r.below(90000));
  std::vector<std::vector<int32_t>> needles;
  int needle_tokens = 0;
  for (int i = 0; i <= hops; ++i) {
    const std::string rhs = i == 0 ? value : "VAR " + vars[i - 1];
    needles.push_back(enc.ids(" VAR " + vars[i] + " = " + rhs + "."));
    needle_tokens += static_cast<int>(needles.back().size());
  }
  const std::string head = "Memorize and track the chain of variable assignments hidden in the following text.\n\n";
  const std::string tail = "\nQuestion: Find all variables that are assigned the value " + value + " in the text above.";
  const std::string prefix = " Answer: According to the chain of variable assignments in the text above, " +
                             std::to_string(hops + 1) + " variables are assigned the value " + value + ", they are:";
  const Frame f = make_frame(spec, enc, target, head, tail, prefix, needle_tokens + 8);
  std::vector<int32_t> hay = noise_ids(enc, f.budget - needle_tokens, seed);
  std::vector<double> depths;
  for (int i = 0; i <= hops; ++i) depths.push_back(r.uniform());
  Context c = insert_needles(hay, needles, depths, enc);
  TaskSample s = start_sample(spec, "multi_hop", TaskMetric::MatchAll, 30);
  finish(s, f, c, enc, target);
  set_answers(s, vars, enc);
  return s;
}

// Common words extraction: a numbered word list where num_cw words appear freq_cw times and the rest freq_ucw times;
// the answer is the num_cw common words. Shorter prompts fall back to lower frequencies (as RULER does for short
// contexts), and the number of uncommon words is the most that fits.
TaskSample make_common_words(const TaskSpec& spec, const Enc& enc, int target, uint64_t seed) {
  SplitMix64 r(seed);
  struct Plan { int num_cw, freq_cw, freq_ucw; };
  const Plan plans[] = {{10, 30, 3}, {10, 10, 2}, {10, 4, 1}, {10, 2, 1}, {5, 2, 1}, {3, 2, 1}};
  const std::string head = "Below is a numbered list of words. In these words, some appear more often than others. "
                           "Memorize the ones that appear most often.\n";
  std::set<std::string> used;
  // Pool: common words are real nouns; uncommon words are pseudo-words (as many as the longest prompt needs).
  std::vector<std::string> nouns = common_nouns();
  r.shuffle(nouns);
  for (const std::string& w : nouns) used.insert(w);

  // Token cost of list entry i holding word w: ids(" <i+1>. w") in text mode, pieces encoded separately.
  std::map<std::string, int> word_cost;
  auto wcost = [&](const std::string& w) {
    auto it = word_cost.find(w);
    if (it != word_cost.end()) return it->second;
    return word_cost[w] = static_cast<int>(enc.ids(" " + w).size());
  };
  std::vector<int> num_cost;  // prefix sums of number-label costs
  auto labels_cost = [&](int n) {
    while (static_cast<int>(num_cost.size()) <= n) {
      const int i = static_cast<int>(num_cost.size());
      num_cost.push_back(i == 0 ? 0 : num_cost.back() + static_cast<int>(enc.ids(" " + std::to_string(i) + ".").size()));
    }
    return num_cost[n];
  };

  for (const Plan& p : plans) {
    const std::string tail = "\nQuestion: What are the " + std::to_string(p.num_cw) +
                             " most common words in the above list?";
    const std::string prefix = " Answer: The top " + std::to_string(p.num_cw) +
                               " words that appear most often in the list are:";
    Frame f;
    try {
      f = make_frame(spec, enc, target, head, tail, prefix, 1);
    } catch (const std::runtime_error&) {
      continue;
    }
    std::vector<std::string> cw(nouns.begin(), nouns.begin() + p.num_cw);
    int base = 0;
    for (const std::string& w : cw) base += p.freq_cw * wcost(w);
    // Add uncommon words while the list still fits; need at least num_cw of them so the common ones stand out.
    std::vector<std::string> ucw;
    int words_cost = base;
    for (;;) {
      std::vector<std::string> next = distinct_words(r, 1, used, 1, 3);
      const int items = p.num_cw * p.freq_cw + (static_cast<int>(ucw.size()) + 1) * p.freq_ucw;
      const int cost = words_cost + p.freq_ucw * wcost(next[0]) + labels_cost(items);
      if (cost > f.budget) break;
      words_cost += p.freq_ucw * wcost(next[0]);
      ucw.push_back(next[0]);
    }
    if (static_cast<int>(ucw.size()) < p.num_cw) continue;
    std::vector<std::string> list;
    for (const std::string& w : cw)
      for (int i = 0; i < p.freq_cw; ++i) list.push_back(w);
    for (const std::string& w : ucw)
      for (int i = 0; i < p.freq_ucw; ++i) list.push_back(w);
    r.shuffle(list);
    Context c;
    for (size_t i = 0; i < list.size(); ++i) {
      const std::vector<int32_t> a = enc.ids(" " + std::to_string(i + 1) + ".");
      const std::vector<int32_t> b = enc.ids(" " + list[i]);
      c.ids.insert(c.ids.end(), a.begin(), a.end());
      const int at = static_cast<int>(c.ids.size());
      c.ids.insert(c.ids.end(), b.begin(), b.end());
      if (std::find(cw.begin(), cw.end(), list[i]) != cw.end()) c.evidence.push_back({at, static_cast<int>(c.ids.size())});
    }
    pad_to(c, f.budget, enc);
    TaskSample s = start_sample(spec, "aggregation", TaskMetric::MatchAll, 120);
    finish(s, f, c, enc, target);
    set_answers(s, cw, enc);
    return s;
  }
  throw std::runtime_error(spec.name + ": " + std::to_string(target) +
                           " tokens is too short for a word list with 3 common words");
}

// Frequent words extraction: coded words drawn with Zipf-like counts (alpha = 2: count(rank) = C / rank^2); the
// answer is the three most frequent. C is the largest that fits, and at least 21 so that ranks 1-4 differ.
TaskSample make_frequent_words(const TaskSpec& spec, const Enc& enc, int target, uint64_t seed) {
  SplitMix64 r(seed);
  const double alpha = 2.0;
  const std::string head = "Read the following coded text and track the frequency of each coded word. Find the three "
                           "most frequently appeared coded words.\n";
  const std::string tail = "\nQuestion: Do not provide any explanation. What are the three most frequently appeared "
                           "words in the above coded text?";
  const std::string prefix = " Answer: According to the coded text above, the three most frequently appeared words are:";
  const Frame f = make_frame(spec, enc, target, head, tail, prefix, 1);
  std::set<std::string> used;
  std::vector<std::string> vocab;
  std::vector<int> cost;
  auto counts_for = [&](int C) {
    std::vector<int> n;
    for (int rank = 1;; ++rank) {
      const int k = static_cast<int>(std::floor(C / std::pow(rank, alpha)));
      if (k < 1) break;
      n.push_back(k);
    }
    return n;
  };
  auto total_cost = [&](int C) {
    const std::vector<int> n = counts_for(C);
    while (vocab.size() < n.size()) {
      vocab.push_back(distinct_words(r, 1, used, 1, 2)[0]);
      cost.push_back(static_cast<int>(enc.ids(" " + vocab.back()).size()));
    }
    long long t = 0;
    for (size_t i = 0; i < n.size(); ++i) t += static_cast<long long>(n[i]) * cost[i];
    return t;
  };
  int lo = 21;
  if (total_cost(lo) > f.budget)
    throw std::runtime_error(spec.name + ": " + std::to_string(target) + " tokens is too short (the coded text needs " +
                             std::to_string(total_cost(lo)) + " tokens, " + std::to_string(f.budget) + " are left)");
  int hi = lo;
  while (total_cost(hi * 2) <= f.budget) hi *= 2;
  int top = hi * 2;  // total_cost(top) > budget
  while (top - hi > 1) {
    const int mid = hi + (top - hi) / 2;
    (total_cost(mid) <= f.budget ? hi : top) = mid;
  }
  const std::vector<int> n = counts_for(hi);
  std::vector<int> list;
  for (size_t i = 0; i < n.size(); ++i)
    for (int j = 0; j < n[i]; ++j) list.push_back(static_cast<int>(i));
  r.shuffle(list);
  Context c;
  for (int w : list) {
    const std::vector<int32_t> ids = enc.ids(" " + vocab[w]);
    const int at = static_cast<int>(c.ids.size());
    c.ids.insert(c.ids.end(), ids.begin(), ids.end());
    if (w < 3) c.evidence.push_back({at, static_cast<int>(c.ids.size())});
  }
  pad_to(c, f.budget, enc);
  TaskSample s = start_sample(spec, "aggregation", TaskMetric::MatchAll, 50);
  finish(s, f, c, enc, target);
  set_answers(s, {vocab[0], vocab[1], vocab[2]}, enc);
  return s;
}

}  // namespace elastic::task_detail
