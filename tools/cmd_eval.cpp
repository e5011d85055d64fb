// elastic eval: RULER-style long-context suite over several routing methods, resumable, with a report.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>

#include "cli_common.h"
#include "elastic/sparse_pattern.h"
#include "elastic/eval.h"
#include "elastic/router.h"
#include "elastic/tokenizer.h"
#ifdef ELASTIC_HAVE_CUDA
#include "elastic/gpu_model.h"
#endif

namespace fs = std::filesystem;

namespace elastic::cli {

namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b == std::string::npos) throw std::runtime_error("eval: empty entry in list '" + s + "'");
    out.push_back(item.substr(b, e - b + 1));
  }
  return out;
}

}  // namespace

// Chat-template hook for `elastic eval`: empty = prompts are used raw. The lead sets this to the model's chat
// template formatter (a function of the model folder) once templates are supported.
void add_eval_command(CLI::App& app, Commands& cmds) {
  struct Opts {
    std::string model, suite = "ruler", tasks, lengths = "4k,8k,16k,32k", methods, routing, mode, scores, hay, code,
                       out = "eval_out", tok, router, device = "cpu";
    int samples = 50, threads = 0, chunk = kDefaultPrefillChunk;
    uint64_t seed = 0;
    SparseSettings sparse;
    bool no_chat = false, paraphrase = false;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("eval", "Long-context evaluation (RULER-style suite) over routing methods");
  add_model_option(sub, o->model);
  sub->add_option("--suite", o->suite, "Suite (only 'ruler' for now)");
  sub->add_option("--tasks", o->tasks, "Comma list of tasks (default: all)");
  sub->add_option("--lengths", o->lengths, "Comma list of prompt lengths, k = 1024 (e.g. 4k,8k)");
  sub->add_option("--samples", o->samples, "Samples per task and length")->check(in_range(1, 1000000));
  sub->add_option("--seed", o->seed, "Seed (prompts are the same for every method)")->check(seed_check());
  sub->add_option("--methods", o->methods,
                  "Comma list of methods: full, ssa, xattn, static@<omega> (retrieval heads kept full), random@<omega>[:seed] (random heads, the control), or none (only --router/--routing/--mode) (default: full,ssa,xattn,static@0.5,static@0.7,static@0.9)");
  sub->add_option("--routing", o->routing, "Extra method: a routing JSON file");
  sub->add_option("--mode", o->mode, "Extra method: every head in one mode")->check(CLI::IsMember(sparse_pattern_names()));
  sub->add_option("--router", o->router, "Extra methods: trained router file(s), comma list (FA-SSA / FA-XA variants)");
  sub->add_option("--scores", o->scores, "Retrieval head scores for static routing (default: probe once, save in -o)");
  sub->add_option("--haystack", o->hay, "Haystack text file (default: built-in English filler)");
  sub->add_option("--code-corpus", o->code, "Source file or folder for code_continue (default: built-in generator)");
  sub->add_option("--tokenizer", o->tok, "tokenizer.json (default: the model folder's; random ids when absent)");
  sub->add_option("--chunk", o->chunk, "Prefill chunk size in tokens")->check(in_range(1, kMaxTokens));
  sub->add_option("-o,--output", o->out, "Output folder (results.jsonl, results.md, summary.json, SVGs)");
  add_threads_option(sub, o->threads);
  sub->add_option("--device", o->device, "cpu, or cuda (samples run on the bf16 GPU backend; probing stays on the CPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_flag("--no-chat", o->no_chat, "Do not apply the model's chat template to prompts");
  sub->add_flag("--paraphrase", o->paraphrase,
                "Held-out templates: needle tasks, QA and sum_recap ask the same facts in other words");
  add_sparse_options(sub, o->sparse, " of the built-in methods");
  cmds.push_back({sub, [o] {
    resolve_model(o->model, "eval");
    o->sparse.xattn.block = o->sparse.block;
    validate_sparse(o->sparse, "eval");
    set_threads(o->threads);
    if (o->suite != "ruler") throw std::runtime_error("eval: unknown suite '" + o->suite + "' (only 'ruler' exists)");
    if (!o->routing.empty() && !o->mode.empty()) throw std::runtime_error("eval: give --routing or --mode, not both");
    Model m = Model::load(o->model);
    std::unique_ptr<Tokenizer> t = load_model_tokenizer(o->model, o->tok);
    if (!t)
      std::fprintf(stderr, "eval: no tokenizer.json in %s: random-id mode (prompts and answers are token ids)\n",
                   o->model.c_str());
    EvalOptions eo;
    if (!o->tasks.empty()) eo.tasks = split_list(o->tasks);
    try {
      eo.lengths = parse_lengths(o->lengths);
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string("eval: --") + e.what());  // "--lengths '4q': bad entry ..."
    }
    eo.samples = o->samples;
    eo.seed = o->seed;
    eo.haystack_file = o->hay;
    eo.code_corpus = o->code;
    eo.out_dir = o->out;
    eo.model_id = fs::weakly_canonical(fs::path(o->model)).string();
    eo.prefill_chunk = o->chunk;
    // Instruct models answer in their chat format: the user prompt goes through the model's template when it has a
    // known one (the answer prefix then opens the assistant turn).
    eo.chat = model_chat_format(o->model, t != nullptr, o->no_chat, "eval");
    eo.paraphrase = o->paraphrase;

    // Tasks, lengths and folders are checked before any probing, so bad options fail at once.
    check_eval_options(m, t.get(), {method_uniform("full", HeadMode::Full)}, eo);
    // Trained routers: router-fa-ssa, -fa-xa or -xa-ssa after each router's configuration; a second router of a kind
    // gets its file stem.
    std::vector<Method> routers;  // loaded before any probing: a bad router file fails at once
    if (!o->router.empty())
      for (const std::string& path : split_list(o->router)) {
        auto r = std::make_shared<Router>(Router::load(path, m.config));
        // A learned-static control (RouterInput::HeadIdentity) is marked "-static", so no table mistakes it for the
        // input-adaptive method.
        std::string name = "router-" + router_config_name(r->spec.dense_mode, r->spec.sparse_mode) +
                           (r->spec.input == RouterInput::HeadIdentity ? "-static" : "");
        for (const Method& me : routers)
          if (me.name == name) name += ":" + fs::path(path).stem().string();
        routers.push_back(method_router(name, r));
      }
    // "none": only the --router / --routing / --mode methods (one process per router, as scripts/gpu_controls.sh runs).
    const std::vector<std::string> names = o->methods.empty()    ? builtin_method_names()
                                           : o->methods == "none" ? std::vector<std::string>{}
                                                                  : split_list(o->methods);
    bool need_scores = false;
    HeadScores placeholder;  // validates every method name before the (slow) probe runs
    placeholder.n_layers = m.config.n_layers;
    placeholder.n_kv_heads = m.config.n_kv_heads;
    placeholder.score.assign(static_cast<size_t>(m.config.n_layers) * m.config.n_kv_heads, 0.0);
    for (const auto& n : names) {
      (void)builtin_method(n, m, &placeholder, o->sparse);
      need_scores = need_scores || n.rfind("static@", 0) == 0;
    }
    HeadScores hs;
    if (need_scores) hs = eval_head_scores(m, t.get(), o->scores, eo);
    std::vector<Method> methods;
    for (const auto& n : names) methods.push_back(builtin_method(n, m, need_scores ? &hs : nullptr, o->sparse));
    if (!o->routing.empty()) {
      const RoutePolicy file = route_policy(m.config, o->routing, "");  // validates the file against the model
      methods.push_back(method_fixed("routing:" + fs::path(o->routing).stem().string(), file.table));
    }
    if (!o->mode.empty()) methods.push_back(method_uniform("mode:" + o->mode, parse_head_mode(o->mode)));
    for (Method& me : routers) methods.push_back(std::move(me));
#ifdef ELASTIC_HAVE_CUDA
    std::unique_ptr<cuda::GpuModel> gpu;
#endif
    if (o->device == "cuda") {
#ifdef ELASTIC_HAVE_CUDA
      cuda::GpuOptions go;
      int longest = 0;
      for (int L : eo.lengths) longest = std::max(longest, L);
      go.max_ctx = longest + 1024;  // the prompt (a chat template adds a few tokens) and the answer or reference
      go.chunk = o->chunk;
      gpu = cuda::GpuModel::upload(m, go);
      std::fprintf(stderr, "%s\n", gpu->plan().describe().c_str());
      eo.backend = cuda::gpu_sequence_backend(*gpu);
#else
      no_cuda_backend("eval");
#endif
    }
    EvalSummary s = run_eval(m, t.get(), methods, eo);
    write_report(s, eo.out_dir);
    std::fprintf(stderr, "wrote %s/results.md, summary.json and SVG charts (results.jsonl holds every sample)\n",
                 eo.out_dir.c_str());
  }});
}

}  // namespace elastic::cli
