#pragma once
// Long-context evaluation: runs (method x task x length x sample) with greedy decoding (or reference likelihood for
// robust tasks), records score, Omega_MSR, Omega_ESR, attention FLOPs vs full and wall time per sample, and is
// resumable: every finished sample is one JSONL line in <out>/results.jsonl and finished keys are skipped on restart.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "elastic/attention.h"
#include "elastic/generate.h"
#include "elastic/model.h"
#include "elastic/probe.h"
#include "elastic/sequence_backend.h"
#include "elastic/tasks.h"
#include "elastic/tokenizer.h"

namespace elastic {

// A way of routing a prompt: fixed tables (full, all-SSA, static retrieval-head routing) ignore the prompt; a
// function of the prompt can compute its own table; a trained router (`router` set) routes the prompt layer by layer
// inside the prefill (Model::prefill given the router), so its decision costs no extra pass.
struct Method {
  std::string name;
  std::function<RoutingTable(const Model& m, const std::vector<int32_t>& prompt)> route;  // unused when router is set
  std::shared_ptr<const PromptRouter> router;
};

Method method_fixed(const std::string& name, const RoutingTable& r);
Method method_uniform(const std::string& name, HeadMode mode, const SparseSettings& s = {});
// "static@<omega>": the top (1 - omega) heads by retrieval score stay full, the rest go to sparse_mode.
Method method_static(double omega, const HeadScores& scores, HeadMode sparse_mode = HeadMode::Streaming,
                     const SparseSettings& s = {});
// "random@<omega>:<seed>": the random-head control, round(omega * L * Hkv) heads drawn uniformly (random_routing) go
// to sparse_mode, the same draw for every prompt; seeds give independent draws.
Method method_random(double omega, uint64_t seed, const Model& m, HeadMode sparse_mode = HeadMode::Streaming,
                     const SparseSettings& s = {});
// full, ssa, xattn, static@0.5, static@0.7, static@0.9
const std::vector<std::string>& builtin_method_names();
// Builds a built-in by name (static@* need scores; any static@<omega> with omega in [0, 1] is accepted, and any
// random@<omega>[:seed], seed 1 when omitted).
// Throws on unknown names, naming the known ones.
// s: block / sink / local / XAttention settings of the sparse heads of every built-in method.
Method builtin_method(const std::string& name, const Model& m, const HeadScores* scores, const SparseSettings& s = {});

// A trained router as a method (FA-SSA or FA-XA, after the router's sparse mode).
Method method_router(const std::string& name, std::shared_ptr<const PromptRouter> router);


struct EvalProgress {
  int done = 0, total = 0;  // samples finished (including ones found in results.jsonl) / all
  int computed = 0;         // samples computed by this run
  double elapsed_s = 0, rate = 0, eta_s = 0;  // rate: computed samples per second
  std::string method, task;
  int length = 0;
};

struct EvalOptions {
  std::vector<std::string> tasks;  // empty = every task of ruler_task_names()
  std::vector<int> lengths;        // prompt lengths in tokens
  int samples = 50;
  uint64_t seed = 0;
  std::string haystack_file, code_corpus;
  ChatFormat chat;                 // chat-template hook (none by default)
  std::string out_dir;             // required
  std::string model_id;            // recorded in run.json; a resumed run must match it
  bool paraphrase = false;         // held-out templates (TaskSpec::paraphrase); recorded in run.json and every row
  int prefill_chunk = kDefaultPrefillChunk;
  std::function<void(const EvalProgress&)> progress;  // empty = a progress line on stderr
  // Where samples run: null = the CPU model. Another backend's Omega_ESR and FLOPs figures are computed from the
  // routing over the prompt's blocks (exact for full and streaming heads; NaN when XAttention heads ran).
  std::shared_ptr<SequenceBackend> backend;
};

struct SampleResult {
  std::string method, task, task_class, metric;
  int length = 0, sample = 0;
  double score = 0;             // 0..100 (string match x 100, or 100 * exp(mean log-prob) for likelihood tasks)
  double msr = 0, esr = 0, flops = 1;  // Omega_MSR, Omega_ESR, attention FLOPs / full
  double kv = 1;  // KV memory after the prompt / all heads full (kept_kv_share); NaN if not recorded
  double wall_s = 0, prefill_s = 0, decode_s = 0;
  int new_tokens = 0;
  double logprob = 0, greedy_acc = 0;  // likelihood tasks only
  std::string templates;               // "paraphrase" for held-out templates (EvalOptions::paraphrase), else empty
  std::string prediction;              // text mode
  std::vector<int32_t> prediction_ids;
  std::string modes;                   // routing used: one char per (layer, KV head): F full, S streaming, X xattn
  int n_layers = 0, n_kv_heads = 0;
  std::string key() const;             // method|task|length|sample
  nlohmann::json to_json() const;
  // Throws naming `where` (file:line) on missing or mistyped fields.
  static SampleResult from_json(const nlohmann::json& j, const std::string& where);
};

// Runs one prepared sample routed by `policy` (its table, or its router's decision at prefill).
// backend: run it there instead of on the CPU model.
SampleResult run_sample(const Model& m, const Tokenizer* tok, const TaskSample& s, const RoutePolicy& policy,
                        int prefill_chunk = kDefaultPrefillChunk, SequenceBackend* backend = nullptr);

struct CellSummary {
  std::string method, task, task_class, metric;
  int length = 0, n = 0;
  double score = 0, msr = 0, esr = 0, flops = 1, wall_s = 0, logprob = 0, greedy_acc = 0;  // means over samples
};
struct MethodSummary {
  std::string method;
  int n = 0;
  double score = 0, msr = 0, esr = 0, flops = 1, wall_s = 0;  // means over cells (score) / samples (the rest)
  int n_layers = 0, n_kv_heads = 0;
  std::vector<double> sparse_fraction;  // [L*Hkv] fraction of samples where the head was routed sparse
};
struct EvalSummary {
  std::vector<std::string> methods, tasks;
  std::vector<int> lengths;
  std::vector<CellSummary> cells;        // methods x tasks x lengths that have samples
  std::vector<MethodSummary> per_method;
  const CellSummary* find(const std::string& method, const std::string& task, int length) const;
  nlohmann::json to_json() const;
};

// Runs everything not yet in <out>/results.jsonl, then summarizes the requested grid. Throws on bad options
// (unknown task, non-positive length or a length over the model's max_positions, no methods, duplicate method
// names, missing out_dir, a run.json in out_dir written with another seed / haystack / model).
// The checks run_eval starts with (also generates each task's first sample per length); callers that do costly
// set-up first (probing head scores) can call it before.
void check_eval_options(const Model& m, const Tokenizer* tok, const std::vector<Method>& methods, const EvalOptions& o);
// Each method routes every sample by its own policy (its router, or its routing function); the model is not changed.
EvalSummary run_eval(const Model& m, const Tokenizer* tok, const std::vector<Method>& methods, const EvalOptions& o);

// Reads results.jsonl; a torn last line (a killed run) is dropped and the file truncated to its last full line.
// Any other malformed line throws naming the file and line.
std::vector<SampleResult> load_results(const std::string& jsonl_path);
EvalSummary summarize(const std::vector<SampleResult>& results, const std::vector<std::string>& methods,
                      const std::vector<std::string>& tasks, const std::vector<int>& lengths);

// Report files in out_dir: results.md (Markdown tables), summary.json, score_vs_length.svg,
// score_vs_length_<task>.svg, msr_per_task.svg, pareto.svg, headmap_<method>.svg.
std::string markdown_report(const EvalSummary& s);
void write_report(const EvalSummary& s, const std::string& out_dir);

// "4k,8k,16k" (k = 1024) or plain token counts; throws on empty or malformed entries.
std::vector<int> parse_lengths(const std::string& s);

// Head scores for static routing: from `scores_path` when given, else <out_dir>/heads.json when present, else probed
// once (all-full model, NIAH prompts of min(shortest length, 4096) tokens, 5 depths) and saved there with a heat map.
HeadScores eval_head_scores(const Model& m, const Tokenizer* tok, const std::string& scores_path, const EvalOptions& o);

}  // namespace elastic
