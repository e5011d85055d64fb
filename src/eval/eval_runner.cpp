#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "elastic/engine.h"
#include "elastic/sparse_pattern.h"
#include "elastic/eval.h"
#include "elastic/haystack.h"
#include "elastic/heatmap_svg.h"
#include "elastic/json_file.h"
#include "elastic/model_shapes.h"
#include "elastic/output_file.h"
#include "elastic/scoring.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace elastic {

namespace {

char mode_char(HeadMode m) { return sparse_pattern(m).letter; }

std::string fmt_omega(double omega) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", omega);
  return buf;
}

// One seed per sample index, shared by every method, so all methods see the same prompts.
uint64_t sample_seed(uint64_t seed, int index) {
  SplitMix64 r(seed ^ (0xA5A5F00Dull + static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull));
  return r.next();
}

std::string fmt_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  char buf[64];
  const long t = std::lround(s);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

// At most ~2 lines a second (and always the last), so logs of long runs stay readable.
void default_progress(const EvalProgress& p) {
  static auto last = std::chrono::steady_clock::time_point{};
  const auto now = std::chrono::steady_clock::now();
  if (p.done != p.total && now - last < std::chrono::milliseconds(500)) return;
  last = now;
  std::fprintf(stderr, "\reval %d/%d | %s | %s | %d tok | %.2f samples/s | eta %s      ", p.done, p.total,
               p.method.c_str(), p.task.c_str(), p.length, p.rate, fmt_duration(p.eta_s).c_str());
  if (p.done == p.total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

TaskSpec spec_for(const EvalOptions& o, int32_t vocab, const std::string& task) {
  TaskSpec spec;
  spec.name = task;
  spec.haystack_file = o.haystack_file;
  spec.code_corpus = o.code_corpus;
  spec.chat = o.chat;
  spec.vocab = vocab;
  spec.paraphrase = o.paraphrase;
  return spec;
}

json run_config(const EvalOptions& o, const Tokenizer* tok) {
  return json{{"seed", o.seed},           {"haystack", o.haystack_file}, {"code_corpus", o.code_corpus},
              {"model", o.model_id},      {"tokenizer", tok != nullptr}, {"chat_template", static_cast<bool>(o.chat)},
              {"device", o.backend ? o.backend->name() : std::string("cpu")}, {"paraphrase", o.paraphrase}};
}

}  // namespace

Method method_fixed(const std::string& name, const RoutingTable& r) {
  Method me;
  me.name = name;
  me.route = [r](const Model&, const std::vector<int32_t>&) { return r; };
  return me;
}

Method method_uniform(const std::string& name, HeadMode mode, const SparseSettings& s) {
  Method me;
  me.name = name;
  me.route = [mode, s](const Model& m, const std::vector<int32_t>&) {
    RoutingTable r = RoutingTable::uniform(m.config.n_layers, m.config.n_kv_heads, mode);
    r.sparse = s;
    return r;
  };
  return me;
}

Method method_static(double omega, const HeadScores& scores, HeadMode sparse_mode, const SparseSettings& s) {
  RoutingTable r = static_routing(scores, omega, sparse_mode);
  r.sparse = s;
  return method_fixed("static@" + fmt_omega(omega), r);
}

const std::vector<std::string>& builtin_method_names() {
  // The default set; builtin_method also takes any other registered pattern's name (the toy "strided").
  static const std::vector<std::string> v = {"full", "ssa", "xattn", "static@0.5", "static@0.7", "static@0.9"};
  return v;
}

namespace {

// "<omega>" of static@<omega> / random@<omega>[:seed], the whole text a number in [0, 1].
double method_omega(const std::string& name, const std::string& v, const char* form) {
  char* end = nullptr;
  const double omega = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !(omega >= 0.0 && omega <= 1.0))
    throw std::runtime_error("method '" + name + "': " + form + " needs omega in [0, 1]");
  return omega;
}

}  // namespace

Method method_random(double omega, uint64_t seed, const Model& m, HeadMode sparse_mode, const SparseSettings& s) {
  RoutingTable r = random_routing(m.config.n_layers, m.config.n_kv_heads, omega, sparse_mode, seed);
  r.sparse = s;
  return method_fixed("random@" + fmt_omega(omega) + ":" + std::to_string(seed), r);
}

Method builtin_method(const std::string& name, const Model& m, const HeadScores* scores, const SparseSettings& s) {
  for (const std::string& p : sparse_pattern_names())
    if (name == p) return method_uniform(name, parse_head_mode(name), s);
  if (name.rfind("random@", 0) == 0) {
    const std::string v = name.substr(7);
    const size_t colon = v.find(':');
    const double omega = method_omega(name, v.substr(0, colon), "random@<omega>[:seed]");
    uint64_t seed = 1;
    if (colon != std::string::npos) {
      const std::string t = v.substr(colon + 1);
      char* end = nullptr;
      errno = 0;
      const unsigned long long x = std::strtoull(t.c_str(), &end, 10);
      if (t.empty() || t[0] == '-' || *end != '\0' || errno == ERANGE)
        throw std::runtime_error("method '" + name + "': the seed after ':' must be a non-negative integer");
      seed = x;
    }
    Method me = method_random(omega, seed, m, HeadMode::Streaming, s);
    me.name = name;
    return me;
  }
  if (name.rfind("static@", 0) == 0) {
    const double omega = method_omega(name, name.substr(7), "static@<omega>");
    if (!scores) throw std::runtime_error("method '" + name + "' needs retrieval head scores (--scores heads.json)");
    if (scores->n_layers != m.config.n_layers || scores->n_kv_heads != m.config.n_kv_heads)
      throw std::runtime_error("method '" + name + "': head scores do not match the model's layers x KV heads");
    Method me = method_static(omega, *scores, HeadMode::Streaming, s);
    me.name = name;
    return me;
  }
  std::string all;
  for (const auto& n : builtin_method_names()) all += (all.empty() ? "" : ", ") + n;
  throw std::runtime_error("unknown method '" + name + "' (built-ins: " + all + "; router methods need --router)");
}

Method method_router(const std::string& name, std::shared_ptr<const PromptRouter> router) {
  if (!router) throw std::runtime_error("method '" + name + "': no router");
  Method me;
  me.name = name;
  me.router = std::move(router);
  return me;
}

std::string SampleResult::key() const {
  return method + "|" + task + "|" + std::to_string(length) + "|" + std::to_string(sample);
}

json SampleResult::to_json() const {
  json j = {{"method", method},   {"task", task},     {"split", task_split(task)}, {"class", task_class}, {"metric", metric},
            {"length", length},   {"sample", sample}, {"score", score},      {"msr", msr},
            {"esr", esr},         {"flops", flops},   {"kv", kv},            {"wall_s", wall_s},
            {"prefill_s", prefill_s},
            {"decode_s", decode_s}, {"new_tokens", new_tokens}, {"modes", modes}, {"n_layers", n_layers},
            {"n_kv_heads", n_kv_heads}};
  if (!templates.empty()) j["templates"] = templates;
  if (metric == "likelihood") {
    j["logprob"] = logprob;
    j["greedy_acc"] = greedy_acc;
  } else {
    j["prediction"] = prediction;
    j["prediction_ids"] = prediction_ids;
  }
  return j;
}

SampleResult SampleResult::from_json(const json& j, const std::string& where) {
  if (!j.is_object()) throw std::runtime_error(where + ": result must be a JSON object");
  SampleResult r;
  auto need = [&](const char* k) -> const json& {
    if (!j.contains(k)) throw std::runtime_error(where + ": missing '" + k + "'");
    return j[k];
  };
  // get<int>() of a float (1e300) is an unchecked cast, undefined out of range: integers are checked by hand.
  auto as_int = [&](const json& v, const std::string& k) -> int {
    const bool ok = v.is_number_integer() &&
                    (v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(INT32_MAX)
                                            : v.get<int64_t>() >= INT32_MIN && v.get<int64_t>() <= INT32_MAX);
    if (!ok) throw std::runtime_error(where + ": '" + k + "' must be an integer in the int32 range, got " + dump_json(v));
    return static_cast<int>(v.get<int64_t>());
  };
  auto opt_int = [&](const char* k) { return j.contains(k) && !j[k].is_null() ? as_int(j[k], k) : 0; };
  try {
    r.method = need("method").get<std::string>();
    r.task = need("task").get<std::string>();
    r.task_class = need("class").get<std::string>();
    r.metric = need("metric").get<std::string>();
    r.length = as_int(need("length"), "length");
    r.sample = as_int(need("sample"), "sample");
    r.score = need("score").get<double>();
    r.msr = need("msr").get<double>();
    // null: not known for this sample (XAttention heads on a backend that does not count blocks).
    r.esr = need("esr").is_null() ? NAN : need("esr").get<double>();
    r.flops = need("flops").is_null() ? NAN : need("flops").get<double>();
    // Rows written before the KV figure was recorded have none.
    r.kv = j.contains("kv") && j["kv"].is_number() ? j["kv"].get<double>() : NAN;
    r.wall_s = need("wall_s").get<double>();
    r.prefill_s = j.value("prefill_s", 0.0);
    r.decode_s = j.value("decode_s", 0.0);
    r.new_tokens = opt_int("new_tokens");
    r.modes = j.value("modes", std::string());
    r.templates = j.value("templates", std::string());
    r.n_layers = opt_int("n_layers");
    r.n_kv_heads = opt_int("n_kv_heads");
    r.logprob = j.value("logprob", 0.0);
    r.greedy_acc = j.value("greedy_acc", 0.0);
    r.prediction = j.value("prediction", std::string());
    if (j.contains("prediction_ids")) {
      const json& ids = j["prediction_ids"];
      if (!ids.is_array()) throw std::runtime_error(where + ": 'prediction_ids' must be a list of integers");
      for (const json& id : ids) r.prediction_ids.push_back(as_int(id, "prediction_ids"));
    }
  } catch (const json::exception& e) {
    throw std::runtime_error(where + ": bad field: " + e.what());
  }
  return r;
}

SampleResult run_sample(const Model& m, const Tokenizer* tok, const TaskSample& s, const RoutePolicy& policy,
                        int prefill_chunk, SequenceBackend* backend) {
  using clock = std::chrono::steady_clock;
  const ModelConfig& c = m.config;
  const RoutingTable* r = policy.fixed_table();
  const PromptRouter* router = policy.prompt_router();
  if (r && (r->n_layers != c.n_layers || r->n_kv_heads != c.n_kv_heads ||
            r->mode.size() != static_cast<size_t>(c.n_layers) * c.n_kv_heads))
    throw std::runtime_error("routing table is " + std::to_string(r->n_layers) + " x " + std::to_string(r->n_kv_heads) +
                             ", the model has " + std::to_string(c.n_layers) + " x " + std::to_string(c.n_kv_heads));
  const int T = static_cast<int>(s.prompt_ids.size());
  if (T == 0) throw std::runtime_error(s.task + ": empty prompt");
  SampleResult out;
  out.task = s.task;
  out.task_class = s.task_class;
  out.metric = task_metric_name(s.metric);
  out.length = T;
  const bool likelihood = s.metric == TaskMetric::Likelihood;
  // Positions the sample needs: the prompt, then the reference rows or the generated tokens fed back.
  int n_new = 0, need = 0;
  if (likelihood) {
    if (s.reference_ids.empty()) throw std::runtime_error(s.task + ": empty reference");
    need = T + static_cast<int>(s.reference_ids.size()) - 1;
    if (c.max_positions > 0 && need > c.max_positions)
      throw std::runtime_error("likelihood: prompt (" + std::to_string(T) + ") + reference (" +
                               std::to_string(s.reference_ids.size()) + ") tokens exceed the model context " +
                               std::to_string(c.max_positions));
  } else {
    // Generation budget: the task's, cut to what the model's context leaves.
    const int room = c.max_positions > 0 ? c.max_positions - T + 1 : s.max_new_tokens;
    n_new = std::min(s.max_new_tokens, room);
    if (n_new < 1)
      throw std::runtime_error(s.task + ": a " + std::to_string(T) + "-token prompt leaves no room to generate in the model's " +
                               std::to_string(c.max_positions) + "-token context");
    need = T + n_new - 1;
  }
  // One path on every device: the given backend, or the CPU model as a backend sized for this sample.
  std::shared_ptr<SequenceBackend> own;
  if (!backend) {
    own = cpu_sequence_backend(std::shared_ptr<const Model>(&m, [](const Model*) {}), need, prefill_chunk);
    backend = own.get();
  }
  RoutingTable used;
  std::vector<float> logits;
  const auto t0 = clock::now();
  if (likelihood) {
    const LikelihoodScore ls =
        backend_likelihood(*backend, s.prompt_ids, s.reference_ids, r, router, c.vocab, used);
    out.logprob = ls.mean_logprob;
    out.greedy_acc = ls.greedy_acc;
    out.score = ls.score();
    out.prefill_s = std::chrono::duration<double>(clock::now() - t0).count();
  } else {
    backend->prefill(s.prompt_ids, r, router, logits, used);
    const auto t1 = clock::now();
    Sampler greedy(SamplerParams{});
    auto score_of = [&](const std::vector<int32_t>& ids) {
      if (tok) {
        const std::string text = tok->decode(ids);
        return 100.0 * (s.metric == TaskMetric::MatchAll ? string_match_all(text, s.answers)
                                                         : string_match_part(text, s.answers));
      }
      return 100.0 * (s.metric == TaskMetric::MatchAll ? ids_match_all(ids, s.answer_ids)
                                                       : ids_match_part(ids, s.answer_ids));
    };
    int32_t id = greedy.sample(logits.data(), c.vocab);
    for (int i = 0; i < n_new; ++i) {
      if (std::find(c.eos_ids.begin(), c.eos_ids.end(), id) != c.eos_ids.end()) break;
      out.prediction_ids.push_back(id);
      if (i + 1 == n_new) break;
      // Both match scores only grow as the prediction grows (a reference found stays found), so once every reference
      // is found the score is final: stop there. Same scores, far fewer steps for right answers (models rarely end a
      // RULER answer with EOS and run to the 128-token budget).
      if (score_of(out.prediction_ids) >= 100.0) break;
      id = backend->decode_greedy(id);
    }
    const auto t2 = clock::now();
    out.prefill_s = std::chrono::duration<double>(t1 - t0).count();
    out.decode_s = std::chrono::duration<double>(t2 - t1).count();
    out.new_tokens = static_cast<int>(out.prediction_ids.size());
    if (tok) out.prediction = tok->decode(out.prediction_ids);
    out.score = score_of(out.prediction_ids);
  }
  out.wall_s = std::chrono::duration<double>(clock::now() - t0).count();
  // ESR and FLOPs describe the prompt's prefill (reference rows and decode steps are how the sample is read, not
  // its input's attention work): counted on the CPU, from the routing on a backend that does not count.
  const AttentionStats st = run_attention_figures(*backend, used, T, true);
  out.n_layers = used.n_layers;
  out.n_kv_heads = used.n_kv_heads;
  for (HeadMode md : used.mode) out.modes += mode_char(md);
  out.msr = used.msr();
  out.esr = st.esr();
  out.flops = st.flops_ratio();
  out.kv = kept_kv_share(used, T);
  return out;
}

std::vector<SampleResult> load_results(const std::string& path) {
  std::vector<SampleResult> out;
  // A folder opens as a stream on Linux and fails only at the read, with a message that names no path.
  if (fs::is_directory(path)) throw std::runtime_error(path + ": is a folder, not an eval results file");
  std::ifstream f(path, std::ios::binary);
  if (!f) return out;
  const std::string text((std::istreambuf_iterator<char>(f)), {});
  f.close();
  size_t pos = 0, good_end = 0;
  int line = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    ++line;
    if (nl == std::string::npos) break;  // torn tail: no newline, written by a killed run
    const std::string l = text.substr(pos, nl - pos);
    if (!l.empty()) {
      json j;
      try {
        j = json::parse(l);
      } catch (const json::exception& e) {
        throw std::runtime_error(path + ":" + std::to_string(line) + ": malformed JSON: " + e.what());
      }
      out.push_back(SampleResult::from_json(j, path + ":" + std::to_string(line)));
    }
    pos = nl + 1;
    good_end = pos;
  }
  if (good_end < text.size()) fs::resize_file(path, good_end);  // drop the torn line so appends stay well-formed
  return out;
}

HeadScores eval_head_scores(const Model& m, const Tokenizer* tok, const std::string& scores_path, const EvalOptions& o) {
  const ModelConfig& c = m.config;
  if (!scores_path.empty()) return load_head_scores(scores_path, c.n_layers, c.n_kv_heads);
  if (o.out_dir.empty()) throw std::runtime_error("eval: an output folder is needed to save probed head scores");
  const fs::path saved = fs::path(o.out_dir) / "heads.json";
  if (fs::exists(saved)) return load_head_scores(saved.string(), c.n_layers, c.n_kv_heads);
  ProbeOptions po;
  po.haystack_file = o.haystack_file;
  po.context = 4096;
  for (int L : o.lengths) po.context = std::min(po.context, L);
  if (c.max_positions > 0) po.context = std::min(po.context, c.max_positions);
  po.n_depths = 5;
  po.seed = o.seed;
  std::fprintf(stderr, "eval: probing retrieval heads (%d-token prompts) for static routing\n", po.context);
  HeadScores hs = probe_retrieval_heads(m, tok, po);
  fs::create_directories(o.out_dir);
  save_head_scores(hs, saved.string());
  write_heatmap_svg((fs::path(o.out_dir) / "heads.svg").string(), hs.score, hs.n_layers, hs.n_kv_heads,
                    "Retrieval score per (layer, KV head)", "layer", "KV head");
  return hs;
}

void check_eval_options(const Model& m, const Tokenizer* tok, const std::vector<Method>& methods, const EvalOptions& o) {
  const ModelConfig& c = m.config;
  if (o.out_dir.empty()) throw std::runtime_error("eval: no output folder (-o)");
  if (methods.empty()) throw std::runtime_error("eval: no methods to run");
  std::set<std::string> names;
  for (const Method& me : methods) {
    if (me.name.empty() || me.name.find('|') != std::string::npos)
      throw std::runtime_error("eval: method names must be non-empty and free of '|' (got '" + me.name + "')");
    if (!names.insert(me.name).second) throw std::runtime_error("eval: method '" + me.name + "' given twice");
    if (!me.route && !me.router) throw std::runtime_error("eval: method '" + me.name + "' has neither a routing function nor a router");
  }
  std::vector<std::string> tasks = o.tasks.empty() ? ruler_task_names() : o.tasks;
  // A task or length given twice would run once and be counted twice in the report: refused like a method.
  std::set<std::string> task_names;
  for (const std::string& t : tasks)
    if (!task_names.insert(t).second) throw std::runtime_error("eval: --tasks names '" + t + "' twice");
  std::set<int> lengths;
  for (int L : o.lengths)
    if (!lengths.insert(L).second) throw std::runtime_error("eval: --lengths gives " + std::to_string(L) + " twice");
  for (const std::string& t : tasks)
    if (!is_task_name(t)) {
      TaskSpec bad;
      bad.name = t;
      (void)make_sample(bad, tok, 1, 0);  // throws the unknown-task message listing the tasks
    }
  if (o.lengths.empty()) throw std::runtime_error("eval: no lengths given");
  for (int L : o.lengths) {
    if (L <= 0) throw std::runtime_error("eval: lengths must be positive (got " + std::to_string(L) + ")");
    if (c.max_positions > 0 && L > c.max_positions)
      throw std::runtime_error("eval: length " + std::to_string(L) + " exceeds the model's " +
                               std::to_string(c.max_positions) + "-token context");
  }
  if (o.samples < 1) throw std::runtime_error("eval: --samples must be >= 1");

  // Pre-flight: every (task, length) must be buildable and fit the model, so bad options fail before hours of work.
  for (const std::string& task : tasks)
    for (int L : o.lengths) {
      const TaskSample s = make_sample(spec_for(o, c.vocab, task), tok, L, sample_seed(o.seed, 0));
      if (s.metric == TaskMetric::Likelihood && c.max_positions > 0 &&
          L + static_cast<int>(s.reference_ids.size()) - 1 > c.max_positions)
        throw std::runtime_error("eval: " + task + " at length " + std::to_string(L) + " needs " +
                                 std::to_string(s.reference_ids.size() - 1) + " more positions for its reference than the model's " +
                                 std::to_string(c.max_positions) + "-token context has");
    }
}

EvalSummary run_eval(const Model& m, const Tokenizer* tok, const std::vector<Method>& methods, const EvalOptions& o) {
  check_eval_options(m, tok, methods, o);
  const ModelConfig& c = m.config;
  const std::vector<std::string> tasks = o.tasks.empty() ? ruler_task_names() : o.tasks;
  fs::create_directories(o.out_dir);
  const fs::path cfg_path = fs::path(o.out_dir) / "run.json";
  // As the file will hold it (bytes of paths that are not UTF-8 as U+FFFD), so a resumed run compares like for like.
  const json cfg = json::parse(dump_json(run_config(o, tok)));
  if (fs::exists(cfg_path)) {
    const json old = read_json_file(cfg_path.string(), "eval run config");
    for (auto it = cfg.begin(); it != cfg.end(); ++it)
      if (!old.contains(it.key()) && ((it.key() == "device" && it.value() == "cpu") ||
                                      (it.key() == "paraphrase" && it.value() == false))) {
        continue;  // folders from before the GPU backend (they ran on the CPU) or the paraphrased templates
      } else if (!old.contains(it.key()) || old[it.key()] != it.value())
        throw std::runtime_error(cfg_path.string() + ": this folder holds results of a run with another " + it.key() +
                                 " (" + (old.contains(it.key()) ? dump_json(old[it.key()]) : "none") + ", now " +
                                 dump_json(it.value()) + "): use another output folder");
  } else {
    write_text_file(cfg_path.string(), dump_json(cfg, 1) + "\n", "eval run config");
  }

  const std::string jsonl = (fs::path(o.out_dir) / "results.jsonl").string();
  std::vector<SampleResult> results = load_results(jsonl);
  std::set<std::string> have;
  for (const SampleResult& r : results) have.insert(r.key());
  // Appended to (OutputFile truncates): a resumed run keeps the samples already done. Checked after every line.
  errno = 0;
  std::ofstream out(jsonl, std::ios::app | std::ios::binary);
  if (!out) throw std::runtime_error(jsonl + ": cannot open for appending: " + std::strerror(errno));

  const int total = static_cast<int>(methods.size() * tasks.size() * o.lengths.size()) * o.samples;
  EvalProgress p;
  p.total = total;
  const auto t0 = std::chrono::steady_clock::now();
  const auto& report = o.progress ? o.progress : std::function<void(const EvalProgress&)>(default_progress);
  for (const std::string& task : tasks) {
    const TaskSpec spec = spec_for(o, c.vocab, task);
    for (int L : o.lengths) {
      for (int i = 0; i < o.samples; ++i) {
        auto key_of = [&](const Method& me) { return me.name + "|" + task + "|" + std::to_string(L) + "|" + std::to_string(i); };
        bool all_done = true;
        for (const Method& me : methods) all_done = all_done && have.count(key_of(me));
        if (all_done) {
          p.done += static_cast<int>(methods.size());
          continue;
        }
        const TaskSample s = make_sample(spec, tok, L, sample_seed(o.seed, i));
        for (const Method& me : methods) {
          if (have.count(key_of(me))) {
            ++p.done;
            continue;
          }
          // The method's router routes inside the prefill; else its routing function gives this prompt's table.
          const RoutePolicy policy = me.router ? RoutePolicy::routed(me.router) : RoutePolicy::fixed(me.route(m, s.prompt_ids));
          SampleResult r = run_sample(m, tok, s, policy, o.prefill_chunk, o.backend.get());
          r.method = me.name;
          r.sample = i;
          r.length = L;
          if (o.paraphrase) r.templates = "paraphrase";
          // Predictions can end inside a multi-byte character: invalid UTF-8 is written as U+FFFD, not refused.
          out << r.to_json().dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
          errno = 0;
          out.flush();  // one line per finished sample: a killed run loses at most the sample in flight
          if (!out) throw std::runtime_error(jsonl + ": cannot write eval results: " + std::strerror(errno));
          have.insert(r.key());
          results.push_back(std::move(r));
          ++p.done;
          ++p.computed;
          p.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          p.rate = p.computed / std::max(p.elapsed_s, 1e-9);
          p.eta_s = (total - p.done) / std::max(p.rate, 1e-9);
          p.method = me.name;
          p.task = task;
          p.length = L;
          report(p);
        }
      }
    }
  }
  if (p.computed == 0) {
    p.method = "-";
    p.task = "-";
    report(p);  // everything was already done: still tell the user
  }
  std::vector<std::string> mnames;
  for (const Method& me : methods) mnames.push_back(me.name);
  // Summarize the requested grid only: a folder may also hold more samples from an earlier, larger run.
  std::vector<SampleResult> grid;
  for (SampleResult& r : results)
    if (r.sample < o.samples) grid.push_back(std::move(r));
  return summarize(grid, mnames, tasks, o.lengths);
}

std::vector<int> parse_lengths(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::string t;
    for (char ch : item)
      if (!std::isspace(static_cast<unsigned char>(ch))) t += ch;
    if (t.empty()) throw std::runtime_error("lengths '" + s + "': empty entry");
    long long mult = 1;
    if (t.back() == 'k' || t.back() == 'K') {
      mult = 1024;
      t.pop_back();
    }
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(t, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != t.size() || t.empty() || v <= 0 || v > (1 << 24) / mult)  // divided: v * mult can overflow
      throw std::runtime_error("lengths '" + s + "': bad entry '" + item + "' (use e.g. 4k,8k or 4096)");
    out.push_back(static_cast<int>(v * mult));
  }
  if (out.empty()) throw std::runtime_error("lengths: none given");
  return out;
}

}  // namespace elastic
