// Question answering over several documents. RULER draws its QA documents from SQuAD / HotpotQA; no such data set
// ships here, so the documents are synthetic encyclopedia-style entries about invented landmarks and architects:
// qa_1 asks a single-document fact (the town of a landmark), qa_2 a two-document one (the birth city of the
// landmark's designer). Distractor documents fill the prompt; scoring is string_match_part as in RULER.
#include <algorithm>
#include <set>
#include <stdexcept>

#include "tasks_common.h"

namespace elastic::task_detail {

namespace {

const std::vector<std::string>& kinds() {
  static const std::vector<std::string> v = {"bridge", "tower", "library", "theater", "museum", "lighthouse",
                                             "observatory", "cathedral", "market hall", "railway station"};
  return v;
}
const std::vector<std::string>& materials() {
  static const std::vector<std::string> v = {"stone", "brick", "granite", "timber", "iron", "marble", "limestone"};
  return v;
}

struct World {
  SplitMix64& r;
  std::set<std::string> used;
  std::string name(int min_syl, int max_syl) {
    for (;;) {
      std::string w = capitalized(pseudo_word(r, min_syl, max_syl));
      if (used.insert(w).second) return w;
    }
  }
};

struct Landmark { std::string name, kind, material, town, designer; int year; };
struct Person { std::string name, city, school; int born; };

Landmark new_landmark(World& w, const std::string& designer) {
  Landmark l;
  l.kind = w.r.pick(kinds());
  l.material = w.r.pick(materials());
  l.name = w.name(2, 3) + " " + capitalized(l.kind);
  l.town = w.name(2, 3);
  l.designer = designer;
  l.year = 1700 + static_cast<int>(w.r.below(300));
  return l;
}
Person new_person(World& w) {
  Person p;
  p.name = w.name(1, 2) + " " + w.name(2, 3);
  p.city = w.name(2, 3);
  p.school = w.name(2, 2);
  p.born = 1650 + static_cast<int>(w.r.below(300));
  return p;
}

std::string landmark_doc(const Landmark& l) {
  return l.name + "\nThe " + l.name + " is a " + l.material + " " + l.kind + " in the town of " + l.town +
         ". It was completed in " + std::to_string(l.year) + " to a design by " + l.designer +
         ", and it is still one of the best known buildings of the region.";
}
std::string person_doc(const Person& p) {
  return p.name + "\n" + p.name + " was an architect born in " + std::to_string(p.born) + " in the city of " + p.city +
         ". " + p.name + " trained at the school of " + p.school + " and later worked on many public buildings.";
}

}  // namespace

TaskSample make_qa(const TaskSpec& spec, const Enc& enc, int target, uint64_t seed) {
  const bool two_hop = spec.name == "qa_2";
  SplitMix64 r(seed);
  World w{r, {}};
  const Person designer = new_person(w);
  const Landmark gold = new_landmark(w, designer.name);
  std::vector<std::string> gold_docs = {landmark_doc(gold)};
  if (two_hop) gold_docs.push_back(person_doc(designer));
  const bool para = spec.paraphrase;
  const std::string question =
      two_hop ? (para ? "The architect who designed the " + gold.name + " was born in what city?"
                      : "In which city was the designer of the " + gold.name + " born?")
              : (para ? "The " + gold.name + " stands in what town?" : "In which town is the " + gold.name + "?");
  const std::string answer = two_hop ? designer.city : gold.town;
  const std::string instr = para ? "Use the documents below to reply to the question. Reply with the answer alone, "
                                   "no other words."
                                 : "Answer the question based on the given documents. Only give me the answer and do "
                                   "not output any other words.";
  const std::string head = instr + (para ? "\n\nDocuments:\n\n" : "\n\nThe following are given documents.\n\n");
  const std::string tail = "\n\n" + instr + (para ? "\n\nQ: " : "\n\nQuestion: ") + question;
  const Frame f = make_frame(spec, enc, target, head, tail, para ? " A:" : " Answer:", 1);

  // Documents: gold ones and distractors (other landmarks and architects), numbered in prompt order.
  auto doc_ids = [&](int index, const std::string& body) {
    return enc.ids((index > 1 ? "\n\n" : "") + std::string("Document ") + std::to_string(index) + ":\n" + body);
  };
  int gold_cost = 0;
  for (size_t i = 0; i < gold_docs.size(); ++i) gold_cost += static_cast<int>(doc_ids(99999, gold_docs[i]).size());
  if (gold_cost > f.budget)
    throw std::runtime_error(spec.name + ": " + std::to_string(target) + " tokens is too short for the gold documents (" +
                             std::to_string(gold_cost) + " tokens, " + std::to_string(f.budget) + " are left)");
  std::vector<std::string> bodies;
  int cost = gold_cost;
  for (;;) {
    // A distractor landmark designed by a distractor architect; one of the two documents per step.
    std::string b = r.below(2) ? landmark_doc(new_landmark(w, new_person(w).name)) : person_doc(new_person(w));
    const int c = static_cast<int>(doc_ids(99999, b).size());
    if (cost + c > f.budget) break;
    cost += c;
    bodies.push_back(std::move(b));
  }
  // Gold documents at random positions; then number, and drop distractors from the end if numbering ran longer.
  std::vector<int> is_gold(bodies.size(), -1);
  for (size_t g = 0; g < gold_docs.size(); ++g) {
    const size_t at = r.below(bodies.size() + 1);
    bodies.insert(bodies.begin() + at, gold_docs[g]);
    is_gold.insert(is_gold.begin() + at, static_cast<int>(g));
  }
  for (;;) {
    Context c;
    for (size_t i = 0; i < bodies.size(); ++i) {
      const std::vector<int32_t> ids = doc_ids(static_cast<int>(i) + 1, bodies[i]);
      const int at = static_cast<int>(c.ids.size());
      c.ids.insert(c.ids.end(), ids.begin(), ids.end());
      if (is_gold[i] >= 0) c.evidence.push_back({at, static_cast<int>(c.ids.size())});
    }
    if (static_cast<int>(c.ids.size()) <= f.budget) {
      pad_to(c, f.budget, enc);
      TaskSample s = start_sample(spec, "qa", TaskMetric::MatchPart, 32);
      finish(s, f, c, enc, target);
      set_answers(s, {answer}, enc);
      return s;
    }
    // Remove the last distractor.
    size_t k = bodies.size();
    while (k > 0 && is_gold[k - 1] >= 0) --k;
    if (k == 0) throw std::runtime_error(spec.name + ": gold documents do not fit in " + std::to_string(target) + " tokens");
    bodies.erase(bodies.begin() + (k - 1));
    is_gold.erase(is_gold.begin() + (k - 1));
  }
}

}  // namespace elastic::task_detail
