// Task generators: exact prompt length, answers inside the evidence spans (and nowhere else where that is
// checkable), determinism, random-id mode, corpus options and bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>

#include "elastic/haystack.h"
#include "elastic/tasks.h"
#include "scratch_dir.h"

using namespace elastic;
namespace fs = std::filesystem;

namespace {

const Tokenizer& qwen() {
  static std::unique_ptr<Tokenizer> t =
      std::make_unique<Tokenizer>(Tokenizer::from_file(std::string(ELASTIC_SHARED_DIR) + "/qwen3-tokenizer/tokenizer.json"));
  return *t;
}

std::string tmp_path(const std::string& name) {
  return elastic::test::scratch_path("tasks_" + name);
}

TaskSpec spec(const std::string& name) {
  TaskSpec s;
  s.name = name;
  s.vocab = 512;
  return s;
}

bool is_robust(const std::string& n) {
  return n == "sum_recap" || n == "recap_last" || n == "continue_text" || n == "code_continue";
}

std::vector<int32_t> slice(const std::vector<int32_t>& v, int b, int e) { return {v.begin() + b, v.begin() + e}; }

bool contains_ids(const std::vector<int32_t>& hay, const std::vector<int32_t>& needle) {
  return std::search(hay.begin(), hay.end(), needle.begin(), needle.end()) != hay.end();
}

// Checks shared by both modes: length, spans in range and ordered, metric and budget consistent with the class.
void check_common(const TaskSample& s, int target, int32_t vocab) {
  ASSERT_EQ(static_cast<int>(s.prompt_ids.size()), target) << s.task;
  for (int32_t id : s.prompt_ids) ASSERT_TRUE(id >= 0 && id < vocab) << s.task;
  int prev = 0;
  for (auto [b, e] : s.evidence) {
    EXPECT_LE(prev, b) << s.task;
    EXPECT_LT(b, e) << s.task;
    EXPECT_LE(e, target) << s.task;
    prev = e;
  }
  EXPECT_FALSE(s.task_class.empty());
  if (is_robust(s.task)) {
    EXPECT_EQ(s.metric, TaskMetric::Likelihood);
    EXPECT_FALSE(s.reference_ids.empty());
    for (int32_t id : s.reference_ids) EXPECT_TRUE(id >= 0 && id < vocab);
  } else {
    EXPECT_NE(s.metric, TaskMetric::Likelihood);
    EXPECT_GT(s.max_new_tokens, 0);
    EXPECT_FALSE(s.answer_ids.empty());
    EXPECT_FALSE(s.evidence.empty()) << s.task;
  }
}

}  // namespace

TEST(EvalTasks, NamesAreKnownAndUnique) {
  const auto& v = ruler_task_names();
  EXPECT_EQ(std::set<std::string>(v.begin(), v.end()).size(), v.size());
  EXPECT_GE(v.size(), 17u);
  EXPECT_TRUE(is_task_name("niah_single_1"));
  EXPECT_FALSE(is_task_name("niah"));
}

TEST(EvalTasks, TokenizerModeExactLengthAndAnswersInEvidence) {
  const Tokenizer& tok = qwen();
  for (int target : {512, 1500}) {
    for (const std::string& name : ruler_task_names()) {
      SCOPED_TRACE(name + " @ " + std::to_string(target));
      const TaskSample s = make_sample(spec(name), &tok, target, 11);
      check_common(s, target, tok.vocab_size());
      EXPECT_EQ(s.task, name);
      EXPECT_EQ(s.input, tok.decode(s.prompt_ids));
      if (is_robust(name)) {
        EXPECT_FALSE(s.output.empty());
        continue;
      }
      ASSERT_EQ(s.answers.size(), s.answer_ids.size());
      // Every answer is in the text of some evidence span.
      std::vector<std::string> ev_text;
      for (auto [b, e] : s.evidence) ev_text.push_back(tok.decode(slice(s.prompt_ids, b, e)));
      for (const std::string& a : s.answers) {
        bool found = false;
        for (const std::string& t : ev_text) found = found || t.find(a) != std::string::npos;
        EXPECT_TRUE(found) << "answer '" << a << "' not in any evidence span";
      }
      // NIAH and VT answers are unique strings: they must not occur outside the evidence spans.
      if (name.rfind("niah_", 0) == 0 || name == "vt") {
        std::string outside;
        int at = 0;
        for (auto [b, e] : s.evidence) {
          outside += tok.decode(slice(s.prompt_ids, at, b)) + "\n";
          at = e;
        }
        outside += tok.decode(slice(s.prompt_ids, at, target));
        for (const std::string& a : s.answers) EXPECT_EQ(outside.find(a), std::string::npos) << a;
      }
    }
  }
}

// Held-out templates: the same seed gives the same facts (answers, reference length class) in other words. The
// paraphrased prompt keeps the exact length and answers-in-evidence rules, shares neither its opening nor its closing
// words with the training template (what the router pools), and never uses the training phrasing.
TEST(EvalTasks, ParaphrasedTemplatesAskTheSameFactsInOtherWords) {
  const Tokenizer& tok = qwen();
  for (const std::string& name : {"niah_single_2", "niah_multikey_1", "niah_multivalue", "niah_multikey_2", "qa_1",
                                  "qa_2", "sum_recap", "recap_last"}) {
    SCOPED_TRACE(name);
    TaskSpec plain = spec(name), para = spec(name);
    para.paraphrase = true;
    const TaskSample a = make_sample(plain, &tok, 1500, 21), b = make_sample(para, &tok, 1500, 21);
    check_common(b, 1500, tok.vocab_size());
    EXPECT_EQ(b.answers, a.answers);
    EXPECT_EQ(b.task_class, a.task_class);
    EXPECT_NE(b.input.substr(0, 60), a.input.substr(0, 60));
    EXPECT_NE(b.input.substr(b.input.size() - 60), a.input.substr(a.input.size() - 60));
    for (const char* train_words : {"special magic", "Answer the question based", "logged event", "Logged event"})
      EXPECT_EQ(b.input.find(train_words), std::string::npos) << train_words;
    for (auto [s0, e0] : b.evidence) {
      const std::string ev = tok.decode(slice(b.prompt_ids, s0, e0));
      if (name.rfind("niah_", 0) == 0) EXPECT_NE(ev.find("Keep in mind that"), std::string::npos) << ev;
    }
    for (const std::string& ans : b.answers) EXPECT_NE(b.input.find(ans), std::string::npos) << ans;
  }
  // Tasks without a template to vary are unchanged.
  TaskSpec plain = spec("vt"), para = spec("vt");
  para.paraphrase = true;
  EXPECT_EQ(make_sample(para, &tok, 800, 3).prompt_ids, make_sample(plain, &tok, 800, 3).prompt_ids);
}

TEST(EvalTasks, NiahShapes) {
  const Tokenizer& tok = qwen();
  EXPECT_EQ(make_sample(spec("niah_single_1"), &tok, 600, 1).answers.size(), 1u);
  EXPECT_EQ(make_sample(spec("niah_multivalue"), &tok, 600, 1).answers.size(), 4u);
  EXPECT_EQ(make_sample(spec("niah_multiquery"), &tok, 600, 1).answers.size(), 4u);
  const TaskSample mk = make_sample(spec("niah_multikey_1"), &tok, 600, 1);
  EXPECT_EQ(mk.answers.size(), 1u);
  EXPECT_EQ(std::count(mk.input.begin(), mk.input.end(), ':'), 4);  // 4 needles "... is: value."
  const TaskSample u = make_sample(spec("niah_single_3"), &tok, 600, 1);
  ASSERT_EQ(u.answers.size(), 1u);
  EXPECT_EQ(u.answers[0].size(), 36u);  // uuid
  const TaskSample v = make_sample(spec("vt"), &tok, 600, 1);
  EXPECT_EQ(v.answers.size(), 5u);
  const TaskSample c = make_sample(spec("cwe"), &tok, 2000, 1);
  EXPECT_EQ(c.answers.size(), 10u);
  const TaskSample f = make_sample(spec("fwe"), &tok, 600, 1);
  EXPECT_EQ(f.answers.size(), 3u);
  EXPECT_EQ(make_sample(spec("qa_2"), &tok, 600, 1).evidence.size(), 2u);
  EXPECT_EQ(make_sample(spec("qa_1"), &tok, 600, 1).metric, TaskMetric::MatchPart);
}

TEST(EvalTasks, DeterministicInSeed) {
  const Tokenizer& tok = qwen();
  for (const std::string& name : std::vector<std::string>{"niah_multikey_2", "cwe", "qa_1", "code_continue"}) {
    const TaskSample a = make_sample(spec(name), &tok, 400, 5), b = make_sample(spec(name), &tok, 400, 5);
    const TaskSample c = make_sample(spec(name), &tok, 400, 6);
    EXPECT_EQ(a.prompt_ids, b.prompt_ids) << name;
    EXPECT_EQ(a.answers, b.answers) << name;
    EXPECT_NE(a.prompt_ids, c.prompt_ids) << name;
  }
}

TEST(EvalTasks, RandomIdModeExactLengthAndAnswerIdsInEvidence) {
  for (int target : {256, 333}) {
    for (const std::string& name : ruler_task_names()) {
      SCOPED_TRACE(name + " @ " + std::to_string(target));
      const TaskSample s = make_sample(spec(name), nullptr, target, 3);
      check_common(s, target, 512);
      EXPECT_TRUE(s.input.empty());
      EXPECT_TRUE(s.answers.empty());  // scoring compares ids
      for (const auto& a : s.answer_ids) {
        ASSERT_FALSE(a.empty());
        bool found = false;
        for (auto [b, e] : s.evidence) found = found || contains_ids(slice(s.prompt_ids, b, e), a);
        EXPECT_TRUE(found);
      }
    }
  }
  EXPECT_EQ(make_sample(spec("vt"), nullptr, 256, 3).prompt_ids, make_sample(spec("vt"), nullptr, 256, 3).prompt_ids);
}

TEST(EvalTasks, ChatFormatWrapsThePrompt) {
  const Tokenizer& tok = qwen();
  TaskSpec s = spec("niah_single_2");
  s.chat = [](const std::string& u) { return "<|im_start|>user\n" + u + "<|im_end|>\n<|im_start|>assistant\n"; };
  const TaskSample x = make_sample(s, &tok, 700, 2);
  ASSERT_EQ(x.prompt_ids.size(), 700u);
  EXPECT_EQ(x.input.rfind("<|im_start|>user\n", 0), 0u);
  EXPECT_NE(x.input.find("<|im_end|>\n<|im_start|>assistant\n The special magic"), std::string::npos);
  s.chat = [](const std::string&) { return std::string("no user text"); };
  EXPECT_THROW(make_sample(s, &tok, 700, 2), std::runtime_error);
  // Every task is wrapped the same way, the continuation tasks too: the prompt opens the user turn and ends with the
  // assistant's, so prompt format alone cannot tell a task class apart.
  for (const std::string& name : ruler_task_names()) {
    TaskSpec t = spec(name);
    t.chat = [](const std::string& u) { return "<|im_start|>user\n" + u + "<|im_end|>\n<|im_start|>assistant\n"; };
    const TaskSample y = make_sample(t, &tok, 700, 3);
    EXPECT_EQ(y.input.rfind("<|im_start|>user\n", 0), 0u) << name;
    const std::string tail = tok.decode({y.prompt_ids.end() - 8, y.prompt_ids.end()});
    EXPECT_NE(y.input.find("<|im_end|>\n<|im_start|>assistant\n"), std::string::npos) << name;
    if (is_robust(name) && name != "sum_recap" && name != "recap_last")  // a continuation's reference: the whole reply
      EXPECT_NE(tail.find("<|im_start|>assistant\n"), std::string::npos) << name << ": " << tail;
  }
}

// recap_last, the held-out robust task: the reference is the context's final sentence, which ends the context right
// before the question; held out of the training mix.
TEST(EvalTasks, RecapLastAsksForTheFinalSentence) {
  const Tokenizer& tok = qwen();
  for (const int T : {300, 1200}) {
    const TaskSample s = make_sample(spec("recap_last"), &tok, T, 5);
    check_common(s, T, tok.vocab_size());
    EXPECT_EQ(s.metric, TaskMetric::Likelihood);
    const std::string ref = tok.decode(s.reference_ids);
    ASSERT_GT(ref.size(), 10u);
    const size_t at = s.input.rfind(ref);
    ASSERT_NE(at, std::string::npos) << ref;
    EXPECT_LT(s.input.find("Repeat the last sentence", at), s.input.size());  // the question comes after it
    EXPECT_EQ(s.input.find(ref, at + 1), std::string::npos);
  }
  EXPECT_STREQ(task_split("recap_last"), "held-out");
  EXPECT_NE(make_sample(spec("recap_last"), &tok, 600, 1).reference_ids, make_sample(spec("recap_last"), &tok, 600, 2).reference_ids);
}

TEST(EvalTasks, HaystackAndCodeCorpusFiles) {
  const Tokenizer& tok = qwen();
  const std::string hay = tmp_path("hay.txt");
  {
    std::ofstream f(hay);
    for (int i = 0; i < 200; ++i) f << "Zebrafish number " << i << " swims in the quiet aquarium tank.\n";
  }
  TaskSpec s = spec("niah_single_2");
  s.haystack_file = hay;
  const TaskSample a = make_sample(s, &tok, 500, 1);
  EXPECT_NE(a.input.find("Zebrafish number"), std::string::npos);
  // Each sample reads the file from its own line: two seeds give two haystacks (a fixed prefix made every prompt of
  // a length share its text), one seed always the same.
  EXPECT_NE(make_sample(s, &tok, 500, 2).prompt_ids, a.prompt_ids);
  EXPECT_EQ(make_sample(s, &tok, 500, 1).prompt_ids, a.prompt_ids);
  std::set<std::string> starts;
  for (uint64_t seed = 0; seed < 8; ++seed) {
    const std::vector<int32_t> h = haystack_token_ids(tok, hay, 40, seed);
    ASSERT_EQ(h.size(), 40u);
    starts.insert(tok.decode({h.begin(), h.begin() + 12}));
  }
  EXPECT_GE(starts.size(), 6u);
  // One long line (no newline at all): samples still start at different words.
  const std::string line = tmp_path("line.txt");
  {
    std::ofstream f(line);
    for (int i = 0; i < 300; ++i) f << "word" << i << " ";
  }
  std::set<std::vector<int32_t>> heads;
  for (uint64_t seed = 0; seed < 8; ++seed) {
    const std::vector<int32_t> h = haystack_token_ids(tok, line, 30, seed);
    heads.insert({h.begin(), h.begin() + 5});
  }
  EXPECT_GE(heads.size(), 6u);
  fs::remove(line);
  s.name = "continue_text";
  EXPECT_NE(make_sample(s, &tok, 300, 1).input.find("aquarium"), std::string::npos);

  const std::string dir = tmp_path("code");
  fs::create_directories(dir + "/sub");
  {
    std::ofstream(dir + "/a.c") << "int alpha_function(int x) { return x * 3; }\n";
    std::ofstream(dir + "/sub/b.h") << "#define BETA_MACRO 42\nstruct beta_struct { int field; };\n";
  }
  TaskSpec c = spec("code_continue");
  c.code_corpus = dir;
  const TaskSample k = make_sample(c, &tok, 300, 1);
  EXPECT_NE(k.input.find("// file: "), std::string::npos);
  EXPECT_NE(k.input.find("BETA_MACRO"), std::string::npos);
  // Built-in code generator when no corpus is given.
  EXPECT_NE(make_sample(spec("code_continue"), &tok, 300, 1).input.find("struct "), std::string::npos);
  fs::remove_all(dir);
  fs::remove(hay);
}

TEST(EvalTasks, BadInputErrors) {
  const Tokenizer& tok = qwen();
  auto msg = [&](TaskSpec s, const Tokenizer* t, int n) {
    try {
      make_sample(s, t, n, 0);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg(spec("niah_bogus"), &tok, 500).find("unknown task 'niah_bogus'"), std::string::npos);
  EXPECT_NE(msg(spec("niah_multiquery"), &tok, 100).find("too short"), std::string::npos);
  EXPECT_NE(msg(spec("cwe"), &tok, 60).find("too short"), std::string::npos);
  EXPECT_NE(msg(spec("vt"), &tok, 0).find("positive"), std::string::npos);
  TaskSpec h = spec("niah_single_2");
  h.haystack_file = "/nonexistent/hay.txt";
  EXPECT_NE(msg(h, &tok, 500).find("/nonexistent/hay.txt"), std::string::npos);
  EXPECT_NE(msg(h, nullptr, 500).find("/nonexistent/hay.txt"), std::string::npos);  // random-id mode too
  TaskSpec c = spec("code_continue");
  c.code_corpus = "/nonexistent/code";
  EXPECT_NE(msg(c, &tok, 300).find("/nonexistent/code: code corpus not found"), std::string::npos);
  TaskSpec v = spec("vt");
  v.vocab = 0;
  EXPECT_NE(msg(v, nullptr, 300).find("vocab"), std::string::npos);
}
