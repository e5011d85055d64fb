#include "tasks_common.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <stdexcept>

namespace elastic::task_detail {

namespace {

uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

bool word_char(unsigned char c) { return std::isalnum(c) || c == '_' || c >= 0x80; }

// Marks where the context goes inside the chat-wrapped user text; control bytes never occur in task text.
const std::string kContextMark = "\x01\x02ELASTIC_CONTEXT\x02\x01";

bool ends_sentence(const std::string& t) {
  for (auto it = t.rbegin(); it != t.rend(); ++it) {
    if (*it == '\n' || *it == '.' || *it == '!' || *it == '?') return true;
    if (*it != ' ') return false;
  }
  return false;
}

}  // namespace

std::vector<int32_t> pseudo_ids(const std::string& s, int32_t vocab) {
  std::vector<int32_t> out;
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    if (std::isspace(c)) { ++i; continue; }
    size_t j = i + 1;
    if (word_char(c))
      while (j < s.size() && word_char(static_cast<unsigned char>(s[j]))) ++j;
    out.push_back(static_cast<int32_t>(fnv1a(s.substr(i, j - i)) % static_cast<uint64_t>(vocab)));
    i = j;
  }
  return out;
}

std::vector<int32_t> Enc::ids(const std::string& s) const { return tok ? tok->encode(s) : pseudo_ids(s, vocab); }

Frame make_frame(const TaskSpec& spec, const Enc& enc, int target, const std::string& head, const std::string& tail,
                 const std::string& answer_prefix, int min_context, bool use_chat) {
  std::string pre = head, post = tail;
  if (enc.text() && use_chat && spec.chat) {
    const std::string wrapped = spec.chat(head + kContextMark + tail);
    const size_t at = wrapped.find(kContextMark);
    if (at == std::string::npos || wrapped.find(kContextMark, at + 1) != std::string::npos)
      throw std::runtime_error(spec.name + ": the chat format must contain the user text exactly once");
    pre = wrapped.substr(0, at);
    post = wrapped.substr(at + kContextMark.size());
  }
  post += answer_prefix;
  Frame f;
  f.head = enc.ids(pre);
  f.tail = enc.ids(post);
  const int fixed = static_cast<int>(f.head.size() + f.tail.size());
  f.budget = target - fixed;
  if (f.budget < min_context)
    throw std::runtime_error(spec.name + ": " + std::to_string(target) + " tokens is too short (the fixed parts take " +
                             std::to_string(fixed) + " tokens, the task needs at least " + std::to_string(min_context) +
                             " more)");
  return f;
}

std::vector<int32_t> random_ids(SplitMix64& r, int n, int32_t vocab) {
  std::vector<int32_t> v(std::max(n, 0));
  for (auto& t : v) t = static_cast<int32_t>(r.below(static_cast<uint64_t>(vocab)));
  return v;
}

std::vector<int32_t> essay_ids(const TaskSpec& spec, const Enc& enc, int n, uint64_t seed) {
  if (!enc.text()) {
    SplitMix64 r(seed ^ 0xE55A7ull);
    return random_ids(r, n, enc.vocab);
  }
  return haystack_token_ids(*enc.tok, spec.haystack_file, n, seed ^ 0x5EEDF111E7ull);
}

std::vector<int32_t> noise_ids(const Enc& enc, int n, uint64_t seed) {
  if (!enc.text()) {
    SplitMix64 r(seed ^ 0x9015Eull);
    return random_ids(r, n, enc.vocab);
  }
  return noise_token_ids(*enc.tok, n);
}

Context insert_needles(const std::vector<int32_t>& hay, const std::vector<std::vector<int32_t>>& needles,
                       std::vector<double> depths, const Enc& enc) {
  if (depths.size() != needles.size()) throw std::logic_error("insert_needles: one depth per needle");
  std::sort(depths.begin(), depths.end());
  const int n = static_cast<int>(hay.size());
  std::vector<int> pos(depths.size());
  for (size_t i = 0; i < depths.size(); ++i) {
    int p = static_cast<int>(std::lround(std::clamp(depths[i], 0.0, 1.0) * n));
    if (enc.text() && p > 0 && p < n) {
      // Snap to the nearest sentence end within a small window, preferring later positions.
      int best = -1;
      for (int d = 0; d <= 48 && best < 0; ++d) {
        if (p + d <= n && ends_sentence(enc.tok->token_text(hay[p + d - 1]))) best = p + d;
        else if (p - d >= 1 && ends_sentence(enc.tok->token_text(hay[p - d - 1]))) best = p - d;
      }
      if (best >= 0) p = best;
    }
    pos[i] = p;
  }
  for (size_t i = 1; i < pos.size(); ++i) pos[i] = std::max(pos[i], pos[i - 1]);  // keep the needles' order
  Context c;
  c.ids.reserve(hay.size() + 64 * needles.size());
  int at = 0;
  for (size_t i = 0; i < needles.size(); ++i) {
    c.ids.insert(c.ids.end(), hay.begin() + at, hay.begin() + pos[i]);
    at = pos[i];
    const int b = static_cast<int>(c.ids.size());
    c.ids.insert(c.ids.end(), needles[i].begin(), needles[i].end());
    c.evidence.push_back({b, static_cast<int>(c.ids.size())});
  }
  c.ids.insert(c.ids.end(), hay.begin() + at, hay.end());
  return c;
}

void pad_to(Context& c, int budget, const Enc& enc) {
  if (static_cast<int>(c.ids.size()) > budget) throw std::logic_error("pad_to: context already exceeds its budget");
  int32_t pad = 0;
  if (enc.text()) {
    const std::vector<int32_t> nl = enc.tok->encode("\n");
    pad = nl.empty() ? 0 : nl[0];
  } else {
    pad = pseudo_ids(".", enc.vocab)[0];
  }
  c.ids.resize(budget, pad);
}

TaskSample start_sample(const TaskSpec& spec, const std::string& task_class, TaskMetric metric, int max_new_tokens) {
  TaskSample s;
  s.task = spec.name;
  s.task_class = task_class;
  s.metric = metric;
  s.max_new_tokens = max_new_tokens;
  return s;
}

void finish(TaskSample& s, const Frame& f, const Context& c, const Enc& enc, int target) {
  s.prompt_ids.clear();
  s.prompt_ids.reserve(target);
  s.prompt_ids.insert(s.prompt_ids.end(), f.head.begin(), f.head.end());
  s.prompt_ids.insert(s.prompt_ids.end(), c.ids.begin(), c.ids.end());
  s.prompt_ids.insert(s.prompt_ids.end(), f.tail.begin(), f.tail.end());
  if (static_cast<int>(s.prompt_ids.size()) != target)
    throw std::logic_error(s.task + ": built " + std::to_string(s.prompt_ids.size()) + " tokens instead of " +
                           std::to_string(target));
  const int off = static_cast<int>(f.head.size());
  s.evidence.clear();
  for (auto [b, e] : c.evidence) s.evidence.push_back({b + off, e + off});
  s.input = enc.text() ? enc.tok->decode(s.prompt_ids) : std::string();
}

void set_answers(TaskSample& s, const std::vector<std::string>& answers, const Enc& enc) {
  s.answers = answers;
  s.answer_ids.clear();
  s.output.clear();
  for (const std::string& a : answers) {
    // Text mode: ids of the answer as it appears after a space, the usual form in prompts and generations.
    s.answer_ids.push_back(enc.text() ? enc.tok->encode(" " + a) : pseudo_ids(a, enc.vocab));
    if (!s.output.empty()) s.output += ", ";
    s.output += a;
  }
  if (!enc.text()) s.answers.clear();  // random-id mode scores ids only
}

namespace {
const std::vector<std::string>& adjectives() {
  static const std::vector<std::string> v = {
      "brave", "calm", "eager", "fancy", "gentle", "happy", "jolly", "kind", "lively", "proud", "silly", "witty",
      "ancient", "bitter", "bright", "broad", "clever", "cold", "crisp", "curly", "damp", "dusty", "early", "empty",
      "faint", "fierce", "fresh", "glossy", "golden", "grand", "hollow", "humble", "icy", "lazy", "loud", "lucky",
      "mellow", "modern", "narrow", "noisy", "odd", "pale", "plain", "quick", "quiet", "rapid", "rough", "round",
      "rusty", "shiny", "silent", "sleepy", "smooth", "sour", "steep", "sticky", "sweet", "tall", "tender", "tiny"};
  return v;
}
}  // namespace

const std::vector<std::string>& common_nouns() {
  static const std::vector<std::string> v = {
      "apple", "anchor", "badge", "basket", "beacon", "blanket", "bottle", "bucket", "button", "candle", "canyon",
      "carpet", "castle", "cherry", "circle", "cloud", "comet", "copper", "cotton", "crystal", "desert", "diamond",
      "dragon", "engine", "falcon", "feather", "forest", "fossil", "garden", "glacier", "hammer", "harbor", "helmet",
      "island", "jacket", "jungle", "kettle", "ladder", "lantern", "lemon", "magnet", "marble", "meadow", "meteor",
      "mirror", "needle", "orchard", "oyster", "paddle", "parrot", "pencil", "pepper", "pillow", "planet", "pocket",
      "puzzle", "rabbit", "ribbon", "river", "rocket", "saddle", "shadow", "signal", "silver", "spider", "spoon",
      "statue", "summit", "teapot", "ticket", "timber", "tunnel", "turtle", "valley", "velvet", "violin", "wagon",
      "walnut", "window", "wizard"};
  return v;
}

std::string key_word(SplitMix64& r) { return r.pick(adjectives()) + "-" + r.pick(common_nouns()); }

std::string number7(SplitMix64& r) { return std::to_string(1000000 + r.below(9000000)); }

std::string uuid(SplitMix64& r) {
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int g : {8, 4, 4, 4, 12}) {
    if (!s.empty()) s += '-';
    for (int i = 0; i < g; ++i) s += hex[r.below(16)];
  }
  return s;
}

std::string pseudo_word(SplitMix64& r, int min_syl, int max_syl) {
  static const std::vector<std::string> on = {"b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v",
                                              "z", "br", "dr", "gl", "pr", "st", "tr", "sh", "ch", "th"};
  static const std::vector<std::string> nu = {"a", "e", "i", "o", "u", "ai", "ou", "ea"};
  static const std::vector<std::string> co = {"", "", "", "n", "r", "l", "s", "m"};
  const int n = min_syl + static_cast<int>(r.below(static_cast<uint64_t>(max_syl - min_syl + 1)));
  std::string w;
  for (int i = 0; i < n; ++i) w += r.pick(on) + r.pick(nu) + r.pick(co);
  return w;
}

std::string capitalized(std::string s) {
  if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
  return s;
}

uint64_t mix_seed(uint64_t seed, const std::string& task, int target) {
  SplitMix64 r(seed ^ fnv1a(task) ^ (static_cast<uint64_t>(target) << 32));
  return r.next();
}

}  // namespace elastic::task_detail

namespace elastic {

const char* task_metric_name(TaskMetric m) {
  switch (m) {
    case TaskMetric::MatchAll: return "string_match_all";
    case TaskMetric::MatchPart: return "string_match_part";
    default: return "likelihood";
  }
}

const std::vector<std::string>& ruler_task_names() {
  static const std::vector<std::string> v = {
      "niah_single_1", "niah_single_2", "niah_single_3", "niah_single_words", "niah_multikey_1", "niah_multikey_2",
      "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2", "sum_recap",
      "recap_last", "continue_text", "code_continue"};
  return v;
}

const std::vector<std::string>& training_task_names() {
  // Sensitive tasks need far-back retrieval; robust tasks are solved from local context.
  static const std::vector<std::string> v = {"niah_single_2", "sum_recap", "niah_multikey_1", "continue_text", "qa_1",
                                             "code_continue"};
  return v;
}

const char* task_split(const std::string& name) {
  const auto& t = training_task_names();
  return std::find(t.begin(), t.end(), name) != t.end() ? "train" : "held-out";
}

bool is_task_name(const std::string& name) {
  const auto& v = ruler_task_names();
  return std::find(v.begin(), v.end(), name) != v.end();
}

TaskSample make_sample(const TaskSpec& spec, const Tokenizer* tok, int target_tokens, uint64_t seed) {
  using namespace task_detail;
  if (!is_task_name(spec.name)) {
    std::string all;
    for (const auto& n : ruler_task_names()) all += (all.empty() ? "" : ", ") + n;
    throw std::runtime_error("unknown task '" + spec.name + "' (tasks: " + all + ")");
  }
  if (target_tokens <= 0)
    throw std::runtime_error(spec.name + ": target length must be positive (got " + std::to_string(target_tokens) + ")");
  if (!tok && spec.vocab <= 1)
    throw std::runtime_error(spec.name + ": random-id mode (no tokenizer) needs the model's vocab size");
  // Corpus files are checked in both modes, so a typo fails even where random ids stand in for the text.
  if (!spec.haystack_file.empty() && !std::filesystem::is_regular_file(spec.haystack_file))
    throw std::runtime_error(spec.haystack_file + ": cannot open haystack file");
  if (!spec.code_corpus.empty() && !std::filesystem::exists(spec.code_corpus))
    throw std::runtime_error(spec.code_corpus + ": code corpus not found");
  Enc enc{tok, tok ? tok->vocab_size() : spec.vocab};
  const uint64_t s = mix_seed(seed, spec.name, target_tokens);
  const std::string& n = spec.name;
  if (n.rfind("niah_", 0) == 0) return make_niah(spec, enc, target_tokens, s);
  if (n == "vt") return make_variable_tracking(spec, enc, target_tokens, s);
  if (n == "cwe") return make_common_words(spec, enc, target_tokens, s);
  if (n == "fwe") return make_frequent_words(spec, enc, target_tokens, s);
  if (n == "qa_1" || n == "qa_2") return make_qa(spec, enc, target_tokens, s);
  return make_robust(spec, enc, target_tokens, s);
}

}  // namespace elastic
