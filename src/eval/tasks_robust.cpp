// "Robust" tasks scored by the likelihood of a reference rather than by string matching:
//   sum_recap     (summarization): events logged at several depths of an essay haystack; the reference is the
//                 ordered recap of the events (an extractive summary, so it is fully determined by the prompt).
//   continue_text (continuation):  a passage of the haystack corpus; the reference is its next 32 tokens.
//   code_continue (code):          source code; the reference is its next 32 tokens. Corpus: --code-corpus FILE or
//                 DIR (files sorted by path, starting at a seed-chosen file), else a built-in generator of C-like
//                 code. /usr/include is not scanned by default: its contents differ between machines, and results
//                 must be reproducible from the seed alone.
#include <algorithm>
#include <filesystem>
#include <functional>
#include <set>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "elastic/text_file.h"
#include "tasks_common.h"

namespace fs = std::filesystem;

namespace elastic::task_detail {

namespace {

constexpr int kReferenceTokens = 32;

// Text of at least `min_bytes` from a corpus string, starting at a seed-chosen line so samples differ.
std::string slice_from(const std::string& text, size_t min_bytes, SplitMix64& r) {
  std::string out;
  size_t start = 0;
  if (text.size() > min_bytes + 1) {
    start = r.below(text.size() - min_bytes);
    const size_t nl = text.find('\n', start);
    start = nl == std::string::npos ? 0 : nl + 1;
  }
  out = text.substr(start);
  while (out.size() < min_bytes) out += "\n" + text;  // short corpus: wrap around
  return out;
}

std::string ident(SplitMix64& r) {
  std::string s = pseudo_word(r, 1, 2);
  if (r.below(2)) s += "_" + pseudo_word(r, 1, 2);
  return s;
}

// Built-in C-like code: structs, and functions that read their fields (so later code refers back to earlier code).
std::string builtin_code(SplitMix64& r, size_t min_bytes) {
  static const std::vector<std::string> types = {"int", "long", "double", "float", "unsigned", "size_t"};
  struct Struct { std::string name; std::vector<std::string> fields; };
  std::vector<Struct> structs;
  std::ostringstream o;
  o << "#include <stddef.h>\n#include <stdio.h>\n\n";
  while (static_cast<size_t>(o.tellp()) < min_bytes) {
    if (structs.empty() || r.below(3) == 0) {
      Struct s{ident(r), {}};
      o << "struct " << s.name << " {\n";
      const int nf = 2 + static_cast<int>(r.below(4));
      for (int i = 0; i < nf; ++i) {
        s.fields.push_back(ident(r));
        o << "  " << r.pick(types) << " " << s.fields.back() << ";\n";
      }
      o << "};\n\n";
      structs.push_back(std::move(s));
    } else {
      const Struct& s = r.pick(structs);
      const std::string fn = ident(r), a = r.pick(s.fields), b = r.pick(s.fields);
      const int k = 2 + static_cast<int>(r.below(30)), lim = 100 + static_cast<int>(r.below(9000));
      o << "static long " << fn << "(const struct " << s.name << " *items, size_t count) {\n"
        << "  long total = 0;\n"
        << "  for (size_t i = 0; i < count; ++i) {\n"
        << "    total += (long)items[i]." << a << " * " << k << ";\n"
        << "    if (total > " << lim << ") total -= (long)items[i]." << b << ";\n"
        << "  }\n"
        << "  return total;\n"
        << "}\n\n";
      if (r.below(4) == 0)
        o << "static void print_" << fn << "(const struct " << s.name << " *items, size_t count) {\n"
          << "  printf(\"" << fn << " = %ld\\n\", " << fn << "(items, count));\n"
          << "}\n\n";
    }
  }
  return o.str();
}

// A source file is kilobytes; a code corpus file past this is not code (a 2 GB file ended an eval in bad_alloc).
constexpr uint64_t kMaxCodeFileBytes = 64ULL << 20;

std::string code_corpus_text(const std::string& path, size_t min_bytes, SplitMix64& r) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw std::runtime_error(path + ": code corpus not found");
  if (fs::is_regular_file(path, ec)) {
    const std::string t = read_text_file(path, "code corpus file", kMaxCodeFileBytes);
    if (t.empty()) throw std::runtime_error(path + ": code corpus file is empty");
    if (t.find('\0') != std::string::npos) throw std::runtime_error(path + ": code corpus file is binary (holds NUL bytes)");
    return slice_from(t, min_bytes, r);
  }
  std::vector<fs::path> files;
  for (auto it = fs::recursive_directory_iterator(path, fs::directory_options::skip_permission_denied, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    if (it->is_regular_file(ec) && it->file_size(ec) > 0 && it->file_size(ec) <= kMaxCodeFileBytes)
      files.push_back(it->path());  // larger files are not source code, as binary ones below
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) throw std::runtime_error(path + ": code corpus folder has no files");
  std::string out;
  const size_t first = r.below(files.size());
  for (size_t i = 0; i < files.size() && out.size() < min_bytes; ++i) {
    const fs::path& p = files[(first + i) % files.size()];
    std::ifstream f(p, std::ios::binary);
    if (!f) continue;  // unreadable files are skipped, as a folder scan would
    std::string t((std::istreambuf_iterator<char>(f)), {});
    if (t.find('\0') != std::string::npos) continue;  // binary file
    out += "// file: " + fs::relative(p, path, ec).string() + "\n" + t + "\n";
  }
  if (out.empty()) throw std::runtime_error(path + ": code corpus folder has no readable text files");
  while (out.size() < min_bytes) out += out;
  return out;
}

// Exactly n ids of a text stream (tokenized once; ~8 bytes per token is ample for prose and code).
std::vector<int32_t> stream_ids(const Enc& enc, const std::function<std::string(size_t)>& text_of_bytes, int n,
                                const std::string& what) {
  size_t bytes = static_cast<size_t>(n) * 8 + 512;
  for (int tries = 0; tries < 6; ++tries, bytes *= 2) {
    std::vector<int32_t> ids = enc.ids(text_of_bytes(bytes));
    if (static_cast<int>(ids.size()) >= n) {
      ids.resize(n);
      return ids;
    }
  }
  throw std::runtime_error(what + ": corpus text yields too few tokens");
}

TaskSample continuation(const TaskSpec& spec, const Enc& enc, int target, const std::string& head,
                        const std::function<std::string(size_t)>& text_of_bytes, const std::string& cls) {
  // Chat-wrapped like every other task (issue 23: a bare prompt for the continuation tasks alone let prompt format
  // separate the classes): the context ends the user turn and the reference is the assistant's reply.
  const Frame f = make_frame(spec, enc, target, head, "", "", 16);
  std::vector<int32_t> ids = stream_ids(enc, text_of_bytes, f.budget + kReferenceTokens, spec.name);
  Context c;
  c.ids.assign(ids.begin(), ids.begin() + f.budget);
  TaskSample s = start_sample(spec, cls, TaskMetric::Likelihood, 0);
  finish(s, f, c, enc, target);
  s.reference_ids.assign(ids.begin() + f.budget, ids.end());
  if (enc.text()) s.output = enc.tok->decode(s.reference_ids);
  return s;
}

TaskSample sum_recap(const TaskSpec& spec, const Enc& enc, int target, uint64_t seed) {
  SplitMix64 r(seed);
  static const std::vector<std::string> acts = {"opened a new", "closed the old", "repaired the", "sold the",
                                                "painted the", "rebuilt the", "moved the", "lost the"};
  const bool para = spec.paraphrase;
  const std::string head = para ? "A text follows. A few of its sentences record events; keep track of them.\n"
                                : "Read the following text. Some sentences in it are logged events; remember them.\n";
  const std::string tail = para ? "\nGive a short account of the recorded events above, first to last."
                                : "\nSummarize the logged events of the text above, in the order they appear.";
  const std::string prefix = para ? " Account:" : " Summary:";
  std::vector<std::string> events;
  std::set<std::string> used;
  for (int i = 0; i < 5; ++i) {
    std::string who;
    do who = capitalized(pseudo_word(r, 2, 3)); while (!used.insert(who).second);
    events.push_back("the council of " + who + " " + r.pick(acts) + " " + r.pick(common_nouns()) + " in " +
                     std::to_string(1800 + r.below(200)));
  }
  std::vector<std::vector<int32_t>> needles;
  int needle_tokens = 0;
  for (const std::string& e : events) {
    needles.push_back(enc.ids((para ? " Recorded: " : " Logged event: ") + capitalized(e) + "."));
    needle_tokens += static_cast<int>(needles.back().size());
  }
  const Frame f = make_frame(spec, enc, target, head, tail, prefix, needle_tokens + 8);
  std::vector<int32_t> hay = essay_ids(spec, enc, f.budget - needle_tokens, seed);
  std::vector<double> depths;
  for (size_t i = 0; i < needles.size(); ++i) depths.push_back(r.uniform());
  Context c = insert_needles(hay, needles, depths, enc);
  std::string ref = para ? " The recorded events, first to last:" : " The logged events, in order:";
  for (size_t i = 0; i < events.size(); ++i) ref += std::string(i ? ";" : "") + " " + events[i];
  ref += ".";
  TaskSample s = start_sample(spec, "summarization", TaskMetric::Likelihood, 0);
  finish(s, f, c, enc, target);
  s.reference_ids = enc.ids(ref);
  s.output = ref;
  return s;
}

// Held out from the training mix (a robust task the router never saw): repeat the text's last sentence. The answer
// sits at the very end of the context, so local attention suffices, as for the other robust tasks. The sentence is
// generated, so the reference is known exactly whatever the haystack.
TaskSample recap_last(const TaskSpec& spec, const Enc& enc, int target, uint64_t seed) {
  SplitMix64 r(seed ^ 0x1A57ull);
  const bool para = spec.paraphrase;
  const std::string head = para ? "Here is a passage; pay attention to how it ends.\n" : "Read the following text.\n";
  const std::string tail = para ? "\nQuote the closing sentence of the passage exactly."
                                : "\nRepeat the last sentence of the text above, word for word.";
  const std::string prefix = para ? " Closing sentence:" : " Last sentence:";
  std::string sentence = filler_text(r, 1);
  while (!sentence.empty() && sentence.back() == '\n') sentence.pop_back();
  const std::vector<int32_t> last = enc.ids(" " + sentence);
  const Frame f = make_frame(spec, enc, target, head, tail, prefix, static_cast<int>(last.size()) + 8);
  std::vector<int32_t> hay = essay_ids(spec, enc, f.budget - static_cast<int>(last.size()), seed);
  Context c = insert_needles(hay, {last}, {1.0}, enc);  // depth 1: after the haystack's last token
  TaskSample s = start_sample(spec, "summarization", TaskMetric::Likelihood, 0);
  finish(s, f, c, enc, target);
  s.reference_ids = last;
  s.output = " " + sentence;
  return s;
}

}  // namespace

TaskSample make_robust(const TaskSpec& spec, const Enc& enc, int target, uint64_t seed) {
  if (spec.name == "sum_recap") return sum_recap(spec, enc, target, seed);
  if (spec.name == "recap_last") return recap_last(spec, enc, target, seed);
  if (spec.name == "continue_text") {
    std::string corpus;
    if (!spec.haystack_file.empty()) corpus = read_haystack_file(spec.haystack_file);
    auto text = [&](size_t bytes) {
      SplitMix64 r(seed);
      if (!corpus.empty()) return slice_from(corpus, bytes, r);
      std::string t;
      while (t.size() < bytes) t += (t.empty() ? "" : " ") + filler_text(r, 32);
      return t;
    };
    return continuation(spec, enc, target,
                        "Continue the following text from exactly where it stops; reply with the continuation only.\n",
                        text, "continuation");
  }
  if (spec.name == "code_continue") {
    auto text = [&](size_t bytes) {
      SplitMix64 r(seed);
      return spec.code_corpus.empty() ? builtin_code(r, bytes) : code_corpus_text(spec.code_corpus, bytes, r);
    };
    return continuation(spec, enc, target,
                        "Continue the following source code from exactly where it stops; reply with the code only.\n",
                        text, "code");
  }
  throw std::runtime_error(spec.name + ": not a robust task");
}

}  // namespace elastic::task_detail
