// Needle-in-a-haystack tasks (RULER's niah_single / multikey / multivalue / multiquery): "special magic" key-value
// needles hidden in a noise, essay or needle haystack; the answer lists every value of the queried keys.
#include <algorithm>
#include <set>
#include <stdexcept>

#include "tasks_common.h"

namespace elastic::task_detail {

namespace {

enum class Hay { Noise, Essay, Needle };
enum class Kind { Words, Numbers, Uuids };

struct NiahConfig {
  Hay hay;
  Kind key, value;
  int k = 1, v = 1, q = 1;  // keys inserted, values per key, keys queried
};

NiahConfig config_for(const std::string& name) {
  if (name == "niah_single_1") return {Hay::Noise, Kind::Words, Kind::Numbers};
  if (name == "niah_single_2") return {Hay::Essay, Kind::Words, Kind::Numbers};
  if (name == "niah_single_3") return {Hay::Essay, Kind::Words, Kind::Uuids};
  if (name == "niah_single_words") return {Hay::Essay, Kind::Words, Kind::Words};
  if (name == "niah_multikey_1") return {Hay::Essay, Kind::Words, Kind::Numbers, 4, 1, 1};
  if (name == "niah_multikey_2") return {Hay::Needle, Kind::Words, Kind::Numbers};
  if (name == "niah_multikey_3") return {Hay::Needle, Kind::Uuids, Kind::Uuids};
  if (name == "niah_multivalue") return {Hay::Essay, Kind::Words, Kind::Numbers, 1, 4, 1};
  if (name == "niah_multiquery") return {Hay::Essay, Kind::Words, Kind::Numbers, 4, 1, 4};
  throw std::runtime_error(name + ": not a needle-in-a-haystack task");
}

const char* kind_plural(Kind k) { return k == Kind::Words ? "words" : k == Kind::Numbers ? "numbers" : "uuids"; }

std::string draw(SplitMix64& r, Kind k) {
  switch (k) {
    case Kind::Words: return key_word(r);
    case Kind::Numbers: return number7(r);
    default: return uuid(r);
  }
}

// A value of kind k not in `used` (inserted).
std::string fresh(SplitMix64& r, Kind k, std::set<std::string>& used) {
  for (int tries = 0;; ++tries) {
    std::string s = draw(r, k);
    if (tries > 32) s += "-" + std::to_string(used.size());  // word pool exhausted at huge lengths
    if (used.insert(s).second) return s;
  }
}

std::string needle_text(const std::string& type_v, const std::string& key, const std::string& value,
                        bool paraphrase = false) {
  if (paraphrase) return " Keep in mind that " + value + " is among the hidden " + type_v + " tied to " + key + ".";
  return " One of the special magic " + type_v + " for " + key + " is: " + value + ".";
}

}  // namespace

std::string join_and(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += v.size() == 2 ? " and " : (i + 1 == v.size() ? ", and " : ", ");
    s += v[i];
  }
  return s;
}

TaskSample make_niah(const TaskSpec& spec, const Enc& enc, int target, uint64_t seed) {
  const NiahConfig cfg = config_for(spec.name);
  SplitMix64 r(seed);
  const std::string tv = kind_plural(cfg.value);
  std::set<std::string> used;
  std::vector<std::string> keys, values;                 // inserted needles (key per needle)
  std::vector<std::vector<int32_t>> needles;
  std::vector<std::string> key_list;
  for (int i = 0; i < cfg.k; ++i) key_list.push_back(fresh(r, cfg.key, used));
  for (const std::string& key : key_list)
    for (int j = 0; j < cfg.v; ++j) {
      keys.push_back(key);
      values.push_back(fresh(r, cfg.value, used));
    }
  // Needle order in the text is random; queried keys are the first q of the key list.
  std::vector<size_t> order(keys.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  r.shuffle(order);
  std::vector<std::string> queries(key_list.begin(), key_list.begin() + cfg.q);
  std::vector<std::string> answers;
  for (size_t i = 0; i < keys.size(); ++i)
    for (const std::string& q : queries)
      if (keys[i] == q) answers.push_back(values[i]);
  int needle_tokens = 0;
  for (size_t i : order) {
    needles.push_back(enc.ids(needle_text(tv, keys[i], values[i], spec.paraphrase)));
    needle_tokens += static_cast<int>(needles.back().size());
  }

  const std::string qs = join_and(queries);
  const bool para = spec.paraphrase;
  const std::string head = para ? "The passage below hides a few " + tv + ", each tied to a name. Note them as you "
                                  "read; afterwards you will be asked to recall them.\n"
                                : "Some special magic " + tv +
                                      " are hidden within the following text. Make sure to memorize them. I will quiz "
                                      "you about the " + tv + " afterwards.\n";
  const std::string tail = para ? "\nRecall the passage: which hidden " + tv + " were tied to " + qs + "? List every one."
                                : "\nWhat are all the special magic " + tv + " for " + qs +
                                      " mentioned in the provided text?";
  const std::string prefix = para ? " The hidden " + tv + " tied to " + qs + " are"
                                  : " The special magic " + tv + " for " + qs + " mentioned in the provided text are";
  const Frame f = make_frame(spec, enc, target, head, tail, prefix, needle_tokens + 8);

  Context c;
  if (cfg.hay == Hay::Needle) {
    // The haystack is made of distractor needles with other keys; real needles go at random slots among them.
    std::vector<std::vector<int32_t>> items;
    int total = needle_tokens;
    for (;;) {
      std::vector<int32_t> d =
          enc.ids(needle_text(tv, fresh(r, cfg.key, used), fresh(r, cfg.value, used), spec.paraphrase));
      if (total + static_cast<int>(d.size()) > f.budget) break;
      total += static_cast<int>(d.size());
      items.push_back(std::move(d));
    }
    std::vector<size_t> slots;  // insertion index into items for each real needle
    for (size_t i = 0; i < needles.size(); ++i) slots.push_back(r.below(items.size() + 1));
    std::sort(slots.begin(), slots.end());
    size_t ni = 0;
    for (size_t i = 0; i <= items.size(); ++i) {
      while (ni < needles.size() && slots[ni] == i) {
        const int b = static_cast<int>(c.ids.size());
        c.ids.insert(c.ids.end(), needles[ni].begin(), needles[ni].end());
        c.evidence.push_back({b, static_cast<int>(c.ids.size())});
        ++ni;
      }
      if (i < items.size()) c.ids.insert(c.ids.end(), items[i].begin(), items[i].end());
    }
    pad_to(c, f.budget, enc);
  } else {
    const int n_hay = f.budget - needle_tokens;
    std::vector<int32_t> hay = cfg.hay == Hay::Noise ? noise_ids(enc, n_hay, seed) : essay_ids(spec, enc, n_hay, seed);
    std::vector<double> depths;
    for (size_t i = 0; i < needles.size(); ++i) depths.push_back(r.uniform());
    c = insert_needles(hay, needles, depths, enc);
  }

  TaskSample s = start_sample(spec, "retrieval", TaskMetric::MatchAll, 128);
  // Evidence: only the needles that answer the query (distractor keys are not evidence).
  Context ev = c;
  ev.evidence.clear();
  for (size_t n = 0; n < needles.size(); ++n)
    for (const std::string& q : queries)
      if (keys[order[n]] == q) ev.evidence.push_back(c.evidence[n]);
  finish(s, f, ev, enc, target);
  set_answers(s, answers, enc);
  return s;
}

}  // namespace elastic::task_detail
