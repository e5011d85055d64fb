// End-to-end eval on the tiny fixture (random-id mode), resume after a killed run, report files, methods, plots.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "elastic/eval.h"
#include "elastic/heatmap_svg.h"
#include "elastic/plot_svg.h"
#include "elastic/router.h"
#include "elastic/sequence_backend.h"
#include "scratch_dir.h"

using namespace elastic;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string fixture() { return std::string(ELASTIC_FIXTURE_DIR) + "/qwen3_tiny"; }

std::string tmp_dir(const std::string& name) {
  const std::string d = elastic::test::scratch_path("eval_" + name);
  fs::remove_all(d);
  return d;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> v;
  std::ifstream f(path);
  for (std::string l; std::getline(f, l);)
    if (!l.empty()) v.push_back(l);
  return v;
}

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

// A streaming routing that really skips work at 96 tokens: no sink, a one-block window.
SparseSettings tiny_window() {
  SparseSettings s;
  s.block = 64;
  s.sink = 0;
  s.local = 64;
  return s;
}

std::vector<Method> two_methods() { return {method_uniform("full", HeadMode::Full), method_uniform("ssa-tiny", HeadMode::Streaming, tiny_window())}; }

EvalOptions small_opts(const std::string& dir, int* computed = nullptr) {
  EvalOptions o;
  o.tasks = {"niah_single_1", "vt", "continue_text"};
  o.lengths = {92, 96};
  o.samples = 2;
  o.seed = 4;
  o.out_dir = dir;
  o.model_id = "qwen3_tiny";
  o.progress = [computed](const EvalProgress& p) {
    EXPECT_LE(p.done, p.total);
    EXPECT_GE(p.eta_s, 0.0);
    if (computed) *computed = p.computed;
  };
  return o;
}

// The deterministic part of a summary (wall times differ between runs).
json stable(const EvalSummary& s) {
  json j = s.to_json();
  for (auto& c : j["cells"]) c.erase("wall_s");
  for (auto& m : j["per_method"]) m.erase("wall_s");
  return j;
}

Model& tiny() {
  static Model m = Model::load(fixture());
  return m;
}

// The fixture model is tiny: one thread is fastest, and avoids OpenMP spin-waits on a loaded CI box.
class EvalRun : public ::testing::Test {
 protected:
  void SetUp() override {
    threads_ = omp_get_max_threads();
    omp_set_num_threads(1);
  }
  void TearDown() override { omp_set_num_threads(threads_); }
  int threads_ = 1;
};

}  // namespace

TEST_F(EvalRun, EndToEndWritesTableJsonAndSvgs) {
  const std::string dir = tmp_dir("e2e");
  int computed = 0;
  const EvalSummary s = run_eval(tiny(), nullptr, two_methods(), small_opts(dir, &computed));
  EXPECT_EQ(computed, 2 * 3 * 2 * 2);
  ASSERT_EQ(s.cells.size(), 12u);
  for (const CellSummary& c : s.cells) {
    EXPECT_EQ(c.n, 2);
    EXPECT_GE(c.score, 0.0);
    EXPECT_LE(c.score, 100.0);
    if (c.method == "full") {
      EXPECT_DOUBLE_EQ(c.msr, 0.0);
      EXPECT_DOUBLE_EQ(c.flops, 1.0);
      EXPECT_DOUBLE_EQ(c.esr, 0.0);
    } else {
      EXPECT_DOUBLE_EQ(c.msr, 1.0);
      EXPECT_LT(c.flops, 1.0);  // the one-block window skips the first block for the second query block
      EXPECT_GT(c.esr, 0.0);
    }
    if (c.task == "continue_text") {
      EXPECT_EQ(c.metric, "likelihood");
      EXPECT_LT(c.logprob, 0.0);
    }
  }
  EXPECT_EQ(lines_of(dir + "/results.jsonl").size(), 24u);
  // Each sample's KV figure is the routing's kept positions over the prompt (the engine's one KV rule): 1 for full,
  // and for all-SSA what kept_kv_positions gives; it survives the round trip through results.jsonl.
  for (const std::string& line : lines_of(dir + "/results.jsonl")) {
    const SampleResult r = SampleResult::from_json(nlohmann::json::parse(line), "results.jsonl");
    RoutingTable used = RoutingTable::uniform(2, 2, r.method == "full" ? HeadMode::Full : HeadMode::Streaming);
    used.sparse = tiny_window();
    const double want = double(kept_kv_positions(used, r.length)) / (4.0 * r.length);
    EXPECT_NEAR(r.kv, want, 1e-12) << line;
    if (r.method != "full") EXPECT_LT(r.kv, 1.0);
    // Each row names its split, so a reader of results.jsonl never needs the training mix's list.
    EXPECT_EQ(nlohmann::json::parse(line).at("split"), task_split(r.task)) << line;
  }
  write_report(s, dir);
  const std::string md = read_file(dir + "/results.md");
  EXPECT_NE(md.find("| task | length | full | ssa-tiny |"), std::string::npos);
  EXPECT_NE(md.find("| niah_single_1 | 92 |"), std::string::npos);
  EXPECT_NE(md.find("| continue_text | 96 |"), std::string::npos);
  EXPECT_NE(md.find("**average**"), std::string::npos);
  // Every task row names its split: the router's training mix (tasks.h) or held out.
  EXPECT_NE(md.find("| task | split | length | full | ssa-tiny |"), std::string::npos);
  EXPECT_NE(md.find("| niah_single_1 | held-out | 92 |"), std::string::npos);
  EXPECT_NE(md.find("| continue_text | train | 96 |"), std::string::npos);
  EXPECT_NE(md.find("| **average** | held-out |"), std::string::npos);
  EXPECT_NE(md.find("| **average** | train |"), std::string::npos);
  EXPECT_NE(md.find("## Likelihood tasks"), std::string::npos);
  EXPECT_NE(md.find("Omega_MSR / Omega_ESR"), std::string::npos);
  const json j = json::parse(read_file(dir + "/summary.json"));
  EXPECT_EQ(j["cells"].size(), 12u);
  for (const json& c : j["cells"]) EXPECT_EQ(c["split"], task_split(c["task"].get<std::string>())) << c.dump();
  EXPECT_EQ(j["per_method"].size(), 2u);
  const std::string line = read_file(dir + "/score_vs_length.svg");
  EXPECT_EQ(count(line, "class=\"series\""), 2u);
  EXPECT_EQ(count(line, "class=\"point\""), 4u);  // 2 methods x 2 lengths
  EXPECT_EQ(count(read_file(dir + "/msr_per_task.svg"), "class=\"bar\""), 6u);  // 2 methods x 3 tasks
  EXPECT_EQ(count(read_file(dir + "/pareto.svg"), "class=\"point\""), 2u);
  EXPECT_TRUE(fs::exists(dir + "/score_vs_length_vt.svg"));
  EXPECT_TRUE(fs::exists(dir + "/esr_per_task.svg"));
  const std::string hm = read_file(dir + "/headmap_ssa-tiny.svg");
  EXPECT_EQ(count(hm, "class=\"cell\""), static_cast<size_t>(tiny().config.n_layers * tiny().config.n_kv_heads));
  EXPECT_TRUE(fs::exists(dir + "/headmap_full.svg"));
  fs::remove_all(dir);
}

TEST_F(EvalRun, ResumeRecomputesOnlyMissingSamples) {
  const std::string dir = tmp_dir("resume");
  int computed = 0;
  const EvalSummary first = run_eval(tiny(), nullptr, two_methods(), small_opts(dir, &computed));
  const std::string jsonl = dir + "/results.jsonl";
  std::vector<std::string> lines = lines_of(jsonl);
  ASSERT_EQ(lines.size(), 24u);
  // A killed run: half the lines kept, plus a torn half-written line.
  {
    std::ofstream f(jsonl, std::ios::trunc);
    for (size_t i = 0; i < 12; ++i) f << lines[i] << "\n";
    f << lines[12].substr(0, lines[12].size() / 2);
  }
  computed = -1;
  const EvalSummary second = run_eval(tiny(), nullptr, two_methods(), small_opts(dir, &computed));
  EXPECT_EQ(computed, 12);
  EXPECT_EQ(stable(second), stable(first));
  const std::vector<std::string> after = lines_of(jsonl);
  EXPECT_EQ(after.size(), 24u);
  std::set<std::string> keys;
  for (const std::string& l : after) keys.insert(SampleResult::from_json(json::parse(l), "line").key());
  EXPECT_EQ(keys.size(), 24u);
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(after[i], lines[i]);  // kept lines untouched
  // Nothing left: a third run computes nothing and reports the same.
  computed = -1;
  const EvalSummary third = run_eval(tiny(), nullptr, two_methods(), small_opts(dir, &computed));
  EXPECT_EQ(computed, 0);
  EXPECT_EQ(stable(third), stable(first));
  // A bigger grid reuses what exists: one more sample per cell costs only the new ones.
  EvalOptions more = small_opts(dir, &computed);
  more.samples = 3;
  run_eval(tiny(), nullptr, two_methods(), more);
  EXPECT_EQ(computed, 12);
  // Back to 2 samples: the summary covers the asked grid only, not the third sample now in the file.
  const EvalSummary fewer = run_eval(tiny(), nullptr, two_methods(), small_opts(dir, &computed));
  EXPECT_EQ(computed, 0);
  EXPECT_EQ(stable(fewer), stable(first));
  fs::remove_all(dir);
}

TEST_F(EvalRun, TrainedRouterRoutesEachPromptInsidePrefill) {
  Model& m = tiny();
  RouterSpec rs;
  rs.n_layers = m.config.n_layers;
  rs.n_kv_heads = m.config.n_kv_heads;
  rs.head_dim = m.config.head_dim;
  rs.pool_first = rs.pool_last = 16;
  rs.sparse = tiny_window();
  auto router = std::make_shared<Router>(Router::init(rs, 7));
  // A routed run equals a run with the routing it decided, given explicitly.
  TaskSpec ts;
  ts.name = "niah_single_1";
  ts.vocab = m.config.vocab;
  const TaskSample sample = make_sample(ts, nullptr, 96, 1);
  const SampleResult a = run_sample(m, nullptr, sample, RoutePolicy::routed(router));
  ASSERT_EQ(a.modes.size(), static_cast<size_t>(m.config.n_layers * m.config.n_kv_heads));
  RoutingTable t = RoutingTable::all_full(m.config.n_layers, m.config.n_kv_heads);
  t.sparse = tiny_window();
  for (size_t i = 0; i < a.modes.size(); ++i) t.mode[i] = a.modes[i] == 'S' ? HeadMode::Streaming : HeadMode::Full;
  const SampleResult b = run_sample(m, nullptr, sample, RoutePolicy::fixed(t));
  EXPECT_EQ(a.prediction_ids, b.prediction_ids);
  EXPECT_DOUBLE_EQ(a.flops, b.flops);
  EXPECT_DOUBLE_EQ(a.msr, t.msr());
  EXPECT_EQ(run_sample(m, nullptr, sample, RoutePolicy{}).msr, 0.0);  // no router, no table: all full
  // Through run_eval: each method routes by its own policy.
  const std::string dir = tmp_dir("router");
  EvalOptions o = small_opts(dir);
  o.tasks = {"niah_single_1", "continue_text"};
  o.lengths = {96};
  const EvalSummary s = run_eval(m, nullptr, {method_uniform("full", HeadMode::Full), method_router("router-fa-ssa", router)}, o);
  ASSERT_NE(s.find("router-fa-ssa", "continue_text", 96), nullptr);
  EXPECT_DOUBLE_EQ(s.find("router-fa-ssa", "niah_single_1", 96)->msr, a.msr);  // same prompts, same decisions
  EXPECT_THROW(method_router("r", nullptr), std::runtime_error);
  fs::remove_all(dir);
}

TEST_F(EvalRun, BadInputErrors) {
  const std::string dir = tmp_dir("bad");
  auto msg = [&](const std::vector<Method>& ms, const EvalOptions& o) {
    try {
      run_eval(tiny(), nullptr, ms, o);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EvalOptions o = small_opts(dir);
  o.tasks = {"niah_nope"};
  EXPECT_NE(msg(two_methods(), o).find("unknown task 'niah_nope'"), std::string::npos);
  o = small_opts(dir);
  o.lengths = {4096};
  EXPECT_NE(msg(two_methods(), o).find("exceeds the model's 128-token context"), std::string::npos);
  o = small_opts(dir);
  EXPECT_NE(msg({method_uniform("full", HeadMode::Full), method_uniform("full", HeadMode::Streaming)}, o).find("given twice"),
            std::string::npos);
  EXPECT_NE(msg({}, o).find("no methods"), std::string::npos);
  o.out_dir.clear();
  EXPECT_NE(msg(two_methods(), o).find("no output folder"), std::string::npos);
  // A folder from a run with another seed is refused rather than mixed.
  o = small_opts(dir);
  o.tasks = {"niah_single_1"};
  o.lengths = {92};
  o.samples = 1;
  run_eval(tiny(), nullptr, two_methods(), o);
  o.seed = 99;
  EXPECT_NE(msg(two_methods(), o).find("another seed"), std::string::npos);
  // A malformed line in the middle of results.jsonl names the file and line.
  o.seed = 4;
  {
    std::ofstream f(dir + "/results.jsonl", std::ios::app);
    f << "{not json\n" << "{}\n";
  }
  const std::string m = msg(two_methods(), o);
  EXPECT_NE(m.find("results.jsonl:3: malformed JSON"), std::string::npos) << m;
  fs::remove_all(dir);
}

TEST_F(EvalRun, BuiltinMethodsAndLengths) {
  const Model& m = tiny();
  HeadScores hs;
  hs.n_layers = m.config.n_layers;
  hs.n_kv_heads = m.config.n_kv_heads;
  hs.score = {0.9, 0.1, 0.5, 0.7};
  const std::vector<int32_t> prompt(10, 1);
  EXPECT_DOUBLE_EQ(builtin_method("full", m, nullptr).route(m, prompt).msr(), 0.0);
  EXPECT_DOUBLE_EQ(builtin_method("ssa", m, nullptr).route(m, prompt).msr(), 1.0);
  EXPECT_EQ(builtin_method("xattn", m, nullptr).route(m, prompt).mode[0], HeadMode::XAttn);
  const RoutingTable r = builtin_method("static@0.5", m, &hs).route(m, prompt);
  EXPECT_DOUBLE_EQ(r.msr(), 0.5);
  EXPECT_EQ(r.mode[0], HeadMode::Full);  // highest scores stay full
  EXPECT_EQ(r.mode[3], HeadMode::Full);
  EXPECT_EQ(r.mode[1], HeadMode::Streaming);
  EXPECT_EQ(builtin_method("static@0.7", m, &hs).name, "static@0.7");
  EXPECT_THROW(builtin_method("static@0.5", m, nullptr), std::runtime_error);
  EXPECT_THROW(builtin_method("static@1.5", m, &hs), std::runtime_error);
  EXPECT_THROW(builtin_method("sparse-magic", m, nullptr), std::runtime_error);
  // The random-head control: the asked share of heads sparse, one draw per seed, the same for every prompt, and no
  // scores needed. Over 200 seeds every head is drawn sparse about half the time (a draw that ignored the seed, or
  // always took the first heads, would not be).
  EXPECT_DOUBLE_EQ(builtin_method("random@0.5:3", m, nullptr).route(m, prompt).msr(), 0.5);
  EXPECT_EQ(builtin_method("random@0.5", m, nullptr).route(m, prompt).mode,
            builtin_method("random@0.5:1", m, nullptr).route(m, prompt).mode);
  std::vector<int> sparse_count(4, 0);
  for (int seed = 0; seed < 200; ++seed) {
    const Method me = builtin_method("random@0.5:" + std::to_string(seed), m, nullptr);
    const RoutingTable a = me.route(m, prompt), b = me.route(m, std::vector<int32_t>(30, 2));
    EXPECT_EQ(a.mode, b.mode);
    for (int i = 0; i < 4; ++i) sparse_count[i] += a.mode[i] == HeadMode::Streaming;
  }
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(sparse_count[i], 100, 30) << "head " << i;
  for (const char* bad : {"random@", "random@2", "random@0.5:", "random@0.5:-1", "random@0.5:x",
                          "random@0.5:99999999999999999999999"})
    EXPECT_THROW(builtin_method(bad, m, nullptr), std::runtime_error) << bad;
  EXPECT_EQ(builtin_method_names().size(), 6u);
  EXPECT_EQ(builtin_method("strided", m, nullptr).route(m, prompt).mode[0], parse_head_mode("strided"));  // any pattern
  EXPECT_EQ(parse_lengths("4k, 8K,100"), (std::vector<int>{4096, 8192, 100}));
  EXPECT_THROW(parse_lengths("4q"), std::runtime_error);
  EXPECT_THROW(parse_lengths("4k,,8k"), std::runtime_error);
  EXPECT_THROW(parse_lengths("-1"), std::runtime_error);
  EXPECT_THROW(parse_lengths(""), std::runtime_error);
  // 2^53 + 1 thousands: the old v * 1024 overflowed long long and wrapped past the 16M bound check.
  EXPECT_THROW(parse_lengths("9007199254740993k"), std::runtime_error);
  EXPECT_THROW(parse_lengths("16385k"), std::runtime_error);
  EXPECT_EQ(parse_lengths("16384k"), (std::vector<int>{1 << 24}));
}

// Every report writer fails on a full disk: /dev/full takes the open and refuses the bytes, which a small SVG kept in
// the stream's buffer until after the old writers' last check.
TEST(EvalPlots, WritesToAFullDiskThrow) {
  if (access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no /dev/full";
  const std::vector<PlotSeries> s{{"a", {1, 2}, {3, 4}}};
  try {
    write_line_chart_svg("/dev/full", "t", "x", "y", s, false, true);
    ADD_FAILURE() << "plot written to /dev/full";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/full: cannot write SVG plot: No space left"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(write_heatmap_svg("/dev/full", {0.5}, 1, 1, "t", "r", "c"), std::runtime_error);
}

TEST_F(EvalRun, HeadScoresProbedOnceAndSaved) {
  const std::string dir = tmp_dir("scores");
  EvalOptions o = small_opts(dir);
  const HeadScores a = eval_head_scores(tiny(), nullptr, "", o);
  EXPECT_TRUE(fs::exists(dir + "/heads.json"));
  EXPECT_TRUE(fs::exists(dir + "/heads.svg"));
  const HeadScores b = eval_head_scores(tiny(), nullptr, "", o);  // loaded, not probed again
  EXPECT_EQ(a.prompts, b.prompts);
  ASSERT_EQ(a.score.size(), b.score.size());
  for (size_t i = 0; i < a.score.size(); ++i) EXPECT_NEAR(a.score[i], b.score[i], 1e-12);
  EXPECT_THROW(eval_head_scores(tiny(), nullptr, dir + "/missing.json", o), std::runtime_error);
  fs::remove_all(dir);
}

TEST(EvalPlots, ParetoFrontAndShapes) {
  const std::vector<ScatterPoint> p = {{"a", 1.0, 90}, {"b", 0.5, 80}, {"c", 0.6, 70}, {"d", 0.2, 40}, {"e", 0.5, 80}};
  const std::vector<size_t> f = pareto_front(p);
  EXPECT_EQ(f, (std::vector<size_t>{3, 1, 4, 0}));  // c is dominated by b; b and e tie (neither dominates)
  const std::string path = elastic::test::scratch_path("eval_plot.svg");
  EXPECT_THROW(write_line_chart_svg(path, "t", "x", "y", {{"s", {1, 2}, {1}}}), std::runtime_error);
  EXPECT_THROW(write_bar_chart_svg(path, "t", "y", {"g1", "g2"}, {"s"}, {{1.0}}), std::runtime_error);
  EXPECT_THROW(write_line_chart_svg(path, "t", "x", "y", {{"s", {0, 2}, {1, 2}}}, true), std::runtime_error);
  write_bar_chart_svg(path, "t <&>", "y", {"g1", "g2"}, {"s1", "s2"}, {{1.0, 2.0}, {3.0, std::nan("")}});
  const std::string svg = read_file(path);
  EXPECT_EQ(count(svg, "class=\"bar\""), 3u);  // the NaN bar is skipped
  // Axis ticks: context lengths as 8K / 16K on a log2 axis, large values with separators.
  write_line_chart_svg(path, "t", "x", "y", {{"s", {8192, 16384}, {1000, 60000}}}, true);
  const std::string line = read_file(path);
  EXPECT_NE(line.find(">16K</text>"), std::string::npos);
  EXPECT_NE(line.find(">60,000</text>"), std::string::npos);
  EXPECT_NE(svg.find("t &lt;&amp;&gt;"), std::string::npos);
  EXPECT_NE(line.find("width=\"720\""), std::string::npos);  // short labels: the standard canvas
  // A long legend label widens the canvas (here to 720 - 190 + 32 + 7 * 60 + 12 = 994 px) instead of being cut off.
  write_line_chart_svg(path, "t", "x", "y", {{std::string(60, 'a'), {1, 2}, {1, 2}}});
  EXPECT_NE(read_file(path).find("width=\"994\""), std::string::npos);
  EXPECT_THROW(write_scatter_svg("/nonexistent/dir/x.svg", "t", "x", "y", p), std::runtime_error);
  // Found by review: y values near 1e17 that differ by 16, fitted (not from zero), gave a tick step below the
  // doubles' resolution there, and the tick loop never ended (growing its list until memory ran out).
  write_line_chart_svg(path, "t", "x", "y", {{"s", {1, 2}, {1e17, 1e17 + 16}}}, false, false);
  EXPECT_NE(read_file(path).find("</svg>"), std::string::npos);
  // Values spanning more than a double holds (1e308 and -1e308) wrote NaN coordinates with success; now an error.
  EXPECT_THROW(write_line_chart_svg(path, "t", "x", "y", {{"s", {1, 2}, {1e308, -1e308}}}), std::runtime_error);
  // Text from the shell with control characters or bytes that are not UTF-8 made an SVG that does not parse.
  EXPECT_EQ(xml_escape(std::string("a\x01" "b\xff" "c <\xc3\xa9>")),
            "a\xef\xbf\xbd" "b\xef\xbf\xbd" "c &lt;\xc3\xa9&gt;");
  EXPECT_EQ(xml_escape("\xe2\x82"), "\xef\xbf\xbd\xef\xbf\xbd");  // a cut sequence: each byte replaced
  EXPECT_EQ(xml_escape("\xf0\x9f\x98\x80 \xed\xa0\x80"), "\xf0\x9f\x98\x80 \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
  fs::remove(path);
}

// Generation stops once every reference is found (the score cannot change after that) and otherwise runs to the
// task's budget: a backend that plays back a script of greedy ids shows both.
TEST_F(EvalRun, GenerationStopsOnceTheScoreIsFinal) {
  const Model& m = tiny();
  struct Scripted : SequenceBackend {
    std::vector<int32_t> script;
    size_t next = 0;
    int len = 0, V = 0, decodes = 0;
    void one_hot(std::vector<float>& logits) {
      logits.assign(V, 0.0f);
      logits[script[std::min(next++, script.size() - 1)]] = 1.0f;
    }
    void prefill(const std::vector<int32_t>& prompt, const RoutingTable*, const PromptRouter*,
                 std::vector<float>& logits, RoutingTable& used) override {
      len = static_cast<int>(prompt.size());
      used = RoutingTable::all_full(2, 2);
      one_hot(logits);
    }
    void decode(int32_t, std::vector<float>& logits) override { ++len, ++decodes, one_hot(logits); }
    int length() const override { return len; }
    void release() override {}
    std::string name() const override { return "scripted"; }
    int capacity() const override { return 1 << 20; }
  };
  TaskSample s;
  s.task = "niah_single_1";
  s.task_class = "retrieval";
  s.metric = TaskMetric::MatchAll;
  s.prompt_ids.assign(40, 1);
  s.max_new_tokens = 10;
  s.answer_ids = {{5, 6}, {8}};
  const RoutingTable r = RoutingTable::all_full(m.config.n_layers, m.config.n_kv_heads);
  Scripted right;
  right.V = m.config.vocab;
  right.script = {3, 5, 6, 4, 8, 9, 9, 9, 9, 9, 9};
  const SampleResult a = run_sample(m, nullptr, s, RoutePolicy::fixed(r), 64, &right);
  EXPECT_EQ(a.prediction_ids, (std::vector<int32_t>{3, 5, 6, 4, 8}));  // both references found at the fifth id
  EXPECT_EQ(a.score, 100.0);
  EXPECT_EQ(right.decodes, 4);
  Scripted half;
  half.V = m.config.vocab;
  half.script = {5, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7};
  const SampleResult b = run_sample(m, nullptr, s, RoutePolicy::fixed(r), 64, &half);
  EXPECT_EQ(b.new_tokens, 10);  // one reference of two: the budget runs out
  EXPECT_EQ(b.score, 50.0);
  s.metric = TaskMetric::MatchPart;  // any reference found is final for the part metric
  Scripted part;
  part.V = m.config.vocab;
  part.script = half.script;
  EXPECT_EQ(run_sample(m, nullptr, s, RoutePolicy::fixed(r), 64, &part).new_tokens, 2);
}

// ESR and FLOPs are the prompt's prefill figures on every path: the CPU's counted blocks (decode steps not counted)
// equal what routed_prefill_stats derives from the routing, which is what a SequenceBackend (the GPU) reports.
TEST_F(EvalRun, SampleFiguresAreThePromptsPrefill) {
  const Model& m = tiny();
  RoutingTable r = RoutingTable::all_full(m.config.n_layers, m.config.n_kv_heads);
  r.sparse = tiny_window();
  for (size_t i = 0; i < r.mode.size(); i += 2) r.mode[i] = HeadMode::Streaming;
  for (const char* task : {"niah_single_1", "continue_text"}) {
    TaskSpec spec;
    spec.name = task;
    spec.vocab = m.config.vocab;
    const TaskSample s = make_sample(spec, nullptr, 96, 7);
    const SampleResult got = run_sample(m, nullptr, s, RoutePolicy::fixed(r));
    const AttentionStats want = routed_prefill_stats(r, 96);
    EXPECT_NEAR(got.flops, want.flops_ratio(), 1e-12) << task;
    EXPECT_NEAR(got.esr, want.esr(), 1e-12) << task;
    EXPECT_GT(got.esr, 0.0) << task;
  }
}

// Found by review: a resumed results.jsonl row with a float where an integer belongs ("length": 1e300) went through
// get<int>(), an unchecked and undefined cast; a results path that is a folder failed with a message naming no path.
TEST(EvalResults, HostileRowsAndPathsAreRefusedByName) {
  const nlohmann::json ok = {{"method", "full"}, {"task", "qa_1"},   {"class", "qa"}, {"metric", "match"},
                             {"length", 128},    {"sample", 0},      {"score", 50.0}, {"msr", 0.0},
                             {"esr", 0.0},       {"flops", 1.0},     {"wall_s", 0.1}, {"prediction_ids", {1, 2}}};
  EXPECT_EQ(SampleResult::from_json(ok, "r.jsonl:1").prediction_ids.size(), 2u);
  auto error_of = [](const nlohmann::json& j) -> std::string {
    try {
      SampleResult::from_json(j, "r.jsonl:1");
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  };
  for (const auto& [key, bad] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"length", 1e300}, {"sample", 2.5}, {"length", 4294967301LL}, {"new_tokens", -1e20},
           {"n_layers", "two"}, {"prediction_ids", {1, 1e300}}}) {
    nlohmann::json j = ok;
    j[key] = bad;
    const std::string e = error_of(j);
    EXPECT_NE(e.find("r.jsonl:1: '" + key + "' must be an integer in the int32 range"), std::string::npos)
        << key << " = " << bad.dump() << ": " << e;
  }
  const std::string folder = ::testing::TempDir() + "/results_is_a_folder.jsonl";
  std::filesystem::create_directories(folder);
  try {
    load_results(folder);
    ADD_FAILURE() << "a folder was read as results";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(folder + ": is a folder"), std::string::npos) << e.what();
  }
}
