#include "elastic/probe.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "elastic/haystack.h"
#include "elastic/json_file.h"
#include "elastic/output_file.h"

namespace elastic {

using nlohmann::json;

namespace {

// The probe's RNG and haystack live in haystack.cpp, shared with the long-context task generators.
using Rng = SplitMix64;

// Haystack token ids, exactly n long.
std::vector<int32_t> haystack_tokens(const Tokenizer& tok, const ProbeOptions& o, int n) {
  return haystack_token_ids(tok, o.haystack_file, n, o.seed ^ 0x5EEDF111E7ull);
}

double depth_of(int i, int n_depths) { return n_depths == 1 ? 0.5 : static_cast<double>(i) / (n_depths - 1); }

}  // namespace

LastRowAttention cpu_last_row_attention(const Model& m) {
  // Dense attention is what a probe measures: each prompt's cache is built all full (KVCache::init without a routing).
  return [&m](const std::vector<int32_t>& ids) {
    const int T = static_cast<int>(ids.size());
    KVCache cache;
    cache.init(m.config, T);
    std::vector<float> logits;
    std::vector<std::vector<float>> probs;
    m.forward(ids.data(), T, cache, logits, false, nullptr, &probs);
    return probs;
  };
}

HeadScores probe_retrieval_heads(const Model& m, const Tokenizer* tok, const ProbeOptions& o,
                                 const std::function<void(int done, int total)>& progress) {
  return probe_retrieval_heads(m.config, tok, o, cpu_last_row_attention(m), progress);
}

HeadScores probe_retrieval_heads(const ModelConfig& c, const Tokenizer* tok, const ProbeOptions& o,
                                 const LastRowAttention& attention,
                                 const std::function<void(int done, int total)>& progress) {
  const int L = c.n_layers, Hq = c.n_heads, Hkv = c.n_kv_heads, V = c.vocab;
  if (L <= 0 || Hkv <= 0 || Hq % Hkv != 0) throw std::runtime_error("probe: invalid model head configuration");
  if (o.n_depths < 1) throw std::runtime_error("probe: n_depths must be >= 1 (got " + std::to_string(o.n_depths) + ")");
  if (o.n_needles_per_depth < 1)
    throw std::runtime_error("probe: n_needles_per_depth must be >= 1 (got " + std::to_string(o.n_needles_per_depth) + ")");
  if (o.context <= 0) throw std::runtime_error("probe: context must be positive (got " + std::to_string(o.context) + ")");
  if (c.max_positions > 0 && o.context > c.max_positions)
    throw std::runtime_error("probe: context " + std::to_string(o.context) + " exceeds the model's max_positions " +
                             std::to_string(c.max_positions));
  if (tok && !o.haystack_file.empty()) {
    std::ifstream f(o.haystack_file);
    if (!f) throw std::runtime_error(o.haystack_file + ": cannot open haystack file");
  }

  const int group = Hq / Hkv;
  HeadScores out;
  out.n_layers = L;
  out.n_kv_heads = Hkv;
  out.score.assign(static_cast<size_t>(L) * Hkv, 0.0);
  out.prompts = 0;
  // One prompt's contribution: per KV head, the last position's attention mass on the needle spans, averaged over the
  // head's query heads.
  auto score_prompt = [&](const std::vector<int32_t>& ids, const std::vector<std::pair<int, int>>& spans) {
    const int T = static_cast<int>(ids.size());
    const std::vector<std::vector<float>> probs = attention(ids);
    if (static_cast<int>(probs.size()) != L) throw std::runtime_error("probe: model returned no attention probabilities");
    for (int l = 0; l < L; ++l) {
      const std::vector<float>& P = probs[l];
      if (P.size() != static_cast<size_t>(Hq) * T) throw std::runtime_error("probe: attention probabilities have the wrong shape");
      for (int kh = 0; kh < Hkv; ++kh) {
        double s = 0;
        for (int g = 0; g < group; ++g) {
          const float* row = P.data() + static_cast<size_t>(kh * group + g) * T;
          for (const auto& [n0, n1] : spans)
            for (int t = n0; t < n1; ++t) s += row[t];
        }
        out.score[static_cast<size_t>(l) * Hkv + kh] += s / group;
      }
    }
    ++out.prompts;
  };

  if (!o.task.empty()) {
    if (o.prompts < 1) throw std::runtime_error("probe: prompts must be >= 1 (got " + std::to_string(o.prompts) + ")");
    TaskSpec ts;
    ts.name = o.task;
    ts.haystack_file = o.haystack_file;
    ts.chat = o.chat;
    ts.vocab = V;
    for (int i = 0; i < o.prompts; ++i) {
      const TaskSample smp = make_sample(ts, tok, o.context, o.seed + static_cast<uint64_t>(i));
      if (smp.evidence.empty())
        throw std::runtime_error("probe: task '" + o.task + "' marks no evidence tokens to probe (use a needle task)");
      // Overlapping spans (two needles sharing tokens) count once.
      std::vector<std::pair<int, int>> spans = smp.evidence;
      std::sort(spans.begin(), spans.end());
      std::vector<std::pair<int, int>> merged;
      for (const auto& sp : spans) {
        if (!merged.empty() && sp.first <= merged.back().second) merged.back().second = std::max(merged.back().second, sp.second);
        else merged.push_back(sp);
      }
      score_prompt(smp.prompt_ids, merged);
      if (progress) progress(i + 1, o.prompts);
    }
    for (double& s : out.score) s = std::clamp(s / out.prompts, 0.0, 1.0);
    return out;
  }

  const int total = o.n_depths * o.n_needles_per_depth;

  Rng rng(o.seed);
  std::vector<int32_t> question;
  std::vector<int32_t> base_hay;  // tokenizer path: one haystack, cut per prompt
  if (tok) {
    question = tok->encode("\nWhat is the special magic number?");
  } else {
    question.resize(8);
    for (auto& q : question) q = static_cast<int32_t>(rng.below(V));
  }

  int done = 0;
  for (int di = 0; di < o.n_depths; ++di) {
    for (int ni = 0; ni < o.n_needles_per_depth; ++ni) {
      std::vector<int32_t> needle;
      if (tok) {
        const uint64_t number = 1000000 + rng.below(9000000);
        needle = tok->encode(" The special magic number is " + std::to_string(number) + ". ");
      } else {
        needle.resize(8);
        for (auto& t : needle) t = static_cast<int32_t>(rng.below(V));
      }
      const int n_hay = o.context - static_cast<int>(needle.size()) - static_cast<int>(question.size());
      if (n_hay < 16)
        throw std::runtime_error("probe: context " + std::to_string(o.context) + " must exceed needle (" +
                                 std::to_string(needle.size()) + ") + question (" + std::to_string(question.size()) +
                                 ") + 16 tokens");
      std::vector<int32_t> hay;
      if (tok) {
        if (base_hay.size() < static_cast<size_t>(n_hay)) base_hay = haystack_tokens(*tok, o, n_hay);
        hay.assign(base_hay.begin(), base_hay.begin() + n_hay);
      } else {
        hay.resize(n_hay);
        for (auto& t : hay) t = static_cast<int32_t>(rng.below(V));
      }
      for (int32_t t : hay)
        if (t < 0 || t >= V) throw std::runtime_error("probe: haystack token id outside the model vocabulary");
      const int pos = static_cast<int>(std::lround(depth_of(di, o.n_depths) * n_hay));
      std::vector<int32_t> ids;
      ids.reserve(o.context);
      ids.insert(ids.end(), hay.begin(), hay.begin() + pos);
      ids.insert(ids.end(), needle.begin(), needle.end());
      ids.insert(ids.end(), hay.begin() + pos, hay.end());
      ids.insert(ids.end(), question.begin(), question.end());
      score_prompt(ids, {{pos, pos + static_cast<int>(needle.size())}});
      ++done;
      if (progress) progress(done, total);
    }
  }
  for (double& s : out.score) s = std::clamp(s / out.prompts, 0.0, 1.0);
  return out;
}

void save_head_scores(const HeadScores& s, const std::string& path) {
  if (s.n_layers <= 0 || s.n_kv_heads <= 0 || s.score.size() != static_cast<size_t>(s.n_layers) * s.n_kv_heads)
    throw std::runtime_error(path + ": cannot save head scores with inconsistent shape");
  json j;
  j["n_layers"] = s.n_layers;
  j["n_kv_heads"] = s.n_kv_heads;
  j["prompts"] = s.prompts;
  j["scores"] = json::array();
  for (int l = 0; l < s.n_layers; ++l) {
    json row = json::array();
    for (int h = 0; h < s.n_kv_heads; ++h) row.push_back(s.at(l, h));
    j["scores"].push_back(row);
  }
  write_text_file(path, dump_json(j, 1) + "\n", "head scores");
}

HeadScores load_head_scores(const std::string& path) {
  const json j = read_json_file(path, "head scores file");
  if (!j.is_object()) throw std::runtime_error(path + ": head scores must be a JSON object");
  auto get_int = [&](const char* key, int min) {
    if (!j.contains(key)) throw std::runtime_error(path + ": missing '" + key + "'");
    const json& v = j[key];
    if (!v.is_number_integer()) throw std::runtime_error(path + ": '" + key + "' must be an integer");
    const long long x = v.get<long long>();
    if (x < min || x > (1 << 20)) throw std::runtime_error(path + ": '" + key + "' out of range (" + std::to_string(x) + ")");
    return static_cast<int>(x);
  };
  HeadScores s;
  s.n_layers = get_int("n_layers", 1);
  s.n_kv_heads = get_int("n_kv_heads", 1);
  s.prompts = get_int("prompts", 0);
  if (!j.contains("scores") || !j["scores"].is_array())
    throw std::runtime_error(path + ": missing 'scores' (one list of KV-head scores per layer)");
  const json& S = j["scores"];
  if (static_cast<int>(S.size()) != s.n_layers)
    throw std::runtime_error(path + ": 'scores' has " + std::to_string(S.size()) + " layers, n_layers is " +
                             std::to_string(s.n_layers));
  // No reserve from the two counts: they are checked against the rows below, one row at a time, and 2^20 x 2^20
  // asked for 8 TiB before the first row was read.
  for (int l = 0; l < s.n_layers; ++l) {
    const json& row = S[l];
    if (!row.is_array()) throw std::runtime_error(path + ": scores[" + std::to_string(l) + "] must be a list");
    if (static_cast<int>(row.size()) != s.n_kv_heads)
      throw std::runtime_error(path + ": scores[" + std::to_string(l) + "] has " + std::to_string(row.size()) +
                               " heads, n_kv_heads is " + std::to_string(s.n_kv_heads));
    for (int h = 0; h < s.n_kv_heads; ++h) {
      if (!row[h].is_number())
        throw std::runtime_error(path + ": scores[" + std::to_string(l) + "][" + std::to_string(h) + "] is not a number");
      const double v = row[h].get<double>();
      if (!std::isfinite(v))
        throw std::runtime_error(path + ": scores[" + std::to_string(l) + "][" + std::to_string(h) + "] is not finite");
      s.score.push_back(v);
    }
  }
  return s;
}

HeadScores load_head_scores(const std::string& path, int n_layers, int n_kv_heads) {
  HeadScores s = load_head_scores(path);
  if (s.n_layers != n_layers || s.n_kv_heads != n_kv_heads)
    throw std::runtime_error(path + ": head scores are for " + std::to_string(s.n_layers) + " layers x " +
                             std::to_string(s.n_kv_heads) + " KV heads, the model has " + std::to_string(n_layers) +
                             " x " + std::to_string(n_kv_heads));
  return s;
}

RoutingTable static_routing(const HeadScores& s, double sparsity, HeadMode sparse_mode) {
  if (!(sparsity >= 0.0 && sparsity <= 1.0))
    throw std::runtime_error("static routing: sparsity must be in [0, 1] (got " + std::to_string(sparsity) + ")");
  const size_t n = static_cast<size_t>(s.n_layers) * s.n_kv_heads;
  if (s.n_layers <= 0 || s.n_kv_heads <= 0 || s.score.size() != n)
    throw std::runtime_error("static routing: head scores have an inconsistent shape");
  size_t keep = static_cast<size_t>(std::floor((1.0 - sparsity) * static_cast<double>(n) + 1e-9));
  keep = std::min(keep, n);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return s.score[a] > s.score[b]; });
  RoutingTable r = RoutingTable::uniform(s.n_layers, s.n_kv_heads, sparse_mode);
  for (size_t i = 0; i < keep; ++i) r.mode[order[i]] = HeadMode::Full;
  return r;
}

}  // namespace elastic
