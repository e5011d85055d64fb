// elastic route static: the DuoAttention-style baseline routing from probe scores.
// elastic route export: a learned-static router's one routing as a routing file.
// elastic route features: how well a trained router's input and task MLP separate tasks, per layer.
// elastic route init: an untrained router (random weights) for a model or a named shape, for throughput runs of the
// router-decided path (serve --shape): it decides per prompt like a trained one, with no claim about accuracy.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "cli_common.h"
#include "elastic/eval.h"
#include "elastic/model_shapes.h"
#include "elastic/plot_svg.h"
#include "elastic/probe.h"
#include "elastic/router_features.h"
#include "elastic/tasks.h"
#include "elastic/tokenizer.h"
#include "elastic/output_file.h"

namespace elastic::cli {

void add_route_command(CLI::App& app, Commands& cmds) {
  struct Opts { std::string scores, out = "routing.json", mode = "ssa"; double sparsity = 0.7; SparseSettings sparse; };
  auto o = std::make_shared<Opts>();
  auto* rt = app.add_subcommand("route", "Build routing files");
  rt->require_subcommand(1);
  auto* sub = rt->add_subcommand("static", "DuoAttention-style baseline: keep the top-scoring heads full");
  sub->add_option("--scores", o->scores, "heads.json from elastic probe")->required();
  sub->add_option("--sparsity", o->sparsity, "Target Omega_MSR in [0, 1]")->check(in_range(0, 1));
  sub->add_option("--sparse-mode", o->mode, "Mode of the sparse heads")->check(CLI::IsMember({"ssa", "xattn"}));
  add_sparse_options(sub, o->sparse);
  sub->add_option("-o,--output", o->out, "Routing JSON");
  cmds.push_back({sub, [o] {
    HeadScores hs = load_head_scores(o->scores);
    RoutingTable r = static_routing(hs, o->sparsity, parse_head_mode(o->mode));
    o->sparse.xattn.block = o->sparse.block;
    validate_sparse(o->sparse, "route static");
    r.sparse = o->sparse;
    save_routing(r, o->out);
    std::fprintf(stderr, "wrote %s: %d of %d KV heads full, Omega_MSR %.3f\n", o->out.c_str(),
                 static_cast<int>(std::count(r.mode.begin(), r.mode.end(), HeadMode::Full)),
                 static_cast<int>(r.mode.size()), r.msr());
  }});

  struct XOpts { std::string model, router, out = "routing.json"; };
  auto x = std::make_shared<XOpts>();
  auto* ex = rt->add_subcommand("export", "A learned-static router's one routing as a routing file (run it with --routing, no router)");
  add_model_option(ex, x->model);
  ex->add_option("--router", x->router, "Learned-static router file (train-router --router-input head-identity)")->required();
  ex->add_option("-o,--output", x->out, "Routing JSON");
  cmds.push_back({ex, [x] {
    const Model m = Model::load(x->model);
    const RoutingTable r = Router::load(x->router, m.config).fixed_routing();
    save_routing(r, x->out);
    std::fprintf(stderr, "wrote %s: %d of %d KV heads full, Omega_MSR %.3f\n", x->out.c_str(),
                 static_cast<int>(std::count(r.mode.begin(), r.mode.end(), HeadMode::Full)),
                 static_cast<int>(r.mode.size()), r.msr());
  }});

  struct IOpts {
    std::string model, shape, config = "fa-ssa", out = "router.safetensors";
    uint64_t seed = 1;
    double dense_bias = 0;
    SparseSettings sparse;
  };
  auto in = std::make_shared<IOpts>();
  auto* ini = rt->add_subcommand("init", "An untrained router (random weights, as train-router starts from): for "
                                           "throughput runs of per-request routing, not for accuracy");
  ini->add_option("-m,--model", in->model, "Model folder or GGUF whose shape the router matches");
  ini->add_option("--shape", in->shape, "Or a named shape (serve --shape NAME)")
      ->check(CLI::IsMember(named_shape_names()));
  ini->add_option("--config", in->config, "fa-ssa, fa-xa or xa-ssa: what the router's two classes run");
  ini->add_option("--seed", in->seed, "Seed of the weights")->check(seed_check());
  ini->add_option("--dense-bias", in->dense_bias,
                  "Added to the dense class's output bias in every layer: positive keeps more heads dense")
      ->check(in_range(-100, 100));
  add_sparse_options(ini, in->sparse);
  ini->add_option("-o,--output", in->out, "Router file");
  cmds.push_back({ini, [in] {
    if (in->model.empty() == in->shape.empty()) throw std::runtime_error("route init: give -m MODEL or --shape NAME");
    const ModelConfig c = in->shape.empty() ? Model::load(in->model).config : named_shape(in->shape);
    RouterSpec spec;
    spec.n_layers = c.n_layers;
    spec.n_kv_heads = c.n_kv_heads;
    spec.head_dim = c.head_dim;
    spec.base_model = model_fingerprint(c);
    try {
      parse_router_config(in->config, spec.dense_mode, spec.sparse_mode);
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(std::string("route init: --config: ") + e.what());
    }
    in->sparse.xattn.block = in->sparse.block;
    validate_sparse(in->sparse, "route init");
    spec.sparse = in->sparse;
    Router r = Router::init(spec, in->seed);
    // The dense class is class 1 of the softmax gate (the sigmoid gate's one logit is not made here).
    for (int l = 0; l < spec.n_layers; ++l) r.layer(l)[r.layer_size() - 1] += static_cast<float>(in->dense_bias);
    r.save(in->out);
    std::fprintf(stderr, "wrote %s: untrained %s router for %s (seed %llu, dense bias %+.2f)\n", in->out.c_str(),
                 in->config.c_str(), spec.base_model.c_str(), static_cast<unsigned long long>(in->seed),
                 in->dense_bias);
  }});

  struct FOpts {
    std::string model, router, tok, hay, code, out = "features.md";
    std::vector<std::string> tasks = {"niah_single_2", "niah_multikey_1", "qa_1", "sum_recap", "code_continue"};
    std::string length = "1024";
    int samples = 10, threads = 0;
    uint64_t seed = 3;
    bool no_chat = false;
  };
  auto f = std::make_shared<FOpts>();
  auto* fe = rt->add_subcommand("features", "Task separation of a router's input and task MLP, per layer (cosines, centred cosines, task share of variance)");
  add_model_option(fe, f->model);
  fe->add_option("--router", f->router, "Trained router file")->required();
  fe->add_option("--tasks", f->tasks, "Comma list of tasks (each a group)")->delimiter(',');
  fe->add_option("--length", f->length, "Prompt tokens, k = 1024 (one length)");
  fe->add_option("--samples", f->samples, "Prompts per task")->check(in_range(2, 100000));
  fe->add_option("--seed", f->seed, "Seed of the prompts")->check(seed_check());
  fe->add_option("--haystack", f->hay, "Haystack text file");
  fe->add_option("--code-corpus", f->code, "Source file or folder for code_continue");
  fe->add_option("--tokenizer", f->tok, "tokenizer.json (default: the model folder's)");
  fe->add_flag("--no-chat", f->no_chat, "Do not apply the model's chat template");
  add_threads_option(fe, f->threads);
  fe->add_option("-o,--output", f->out, "Markdown table (and <output without .md>.svg, the task share of variance per layer)");
  cmds.push_back({fe, [f] {
    resolve_model(f->model, "route features");
    set_threads(f->threads);
    Model m = Model::load(f->model);
    const Router r = Router::load(f->router, m.config);
    std::unique_ptr<Tokenizer> t = load_model_tokenizer(f->model, f->tok);
    const std::vector<int> lengths = parse_lengths(f->length);
    if (lengths.size() != 1) throw std::runtime_error("route features: --length takes one length");
    check_within_context(m.config, lengths[0], "route features: --length " + std::to_string(lengths[0]));
    TaskSpec ts;
    ts.haystack_file = f->hay;
    ts.code_corpus = f->code;
    ts.chat = model_chat_format(f->model, t != nullptr, f->no_chat, "route features");
    ts.vocab = m.config.vocab;
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::string> names;
    for (const std::string& task : f->tasks) {
      ts.name = task;
      for (int i = 0; i < f->samples; ++i) {
        prompts.push_back(make_sample(ts, t.get(), lengths[0], f->seed * 1000003ull + static_cast<uint64_t>(i)).prompt_ids);
        names.push_back(task);
      }
    }
    std::fprintf(stderr, "route features: %zu prompts of %d tokens\n", prompts.size(), lengths[0]);
    const auto t0 = std::chrono::steady_clock::now();
    const FeatureSeparation s =
        router_feature_separation(m, r, prompts, names, kDefaultPrefillChunk, [&](int done, int total) {
          const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          const double rate = done / std::max(el, 1e-9);
          std::fprintf(stderr, "\rroute features %d/%d prompts | %.2f prompts/s | eta %.0fs   ", done, total, rate,
                       (total - done) / std::max(rate, 1e-9));
          if (done == total) std::fprintf(stderr, "\n");
        });
    const std::string table = feature_separation_table(s);
    write_text_file(f->out, "# Router features: task separation per layer\n\n" + std::to_string(s.prompts) +
                                " prompts (" + std::to_string(f->samples) + " per task: " + [&] {
                                  std::string j;
                                  for (const auto& n : f->tasks) j += (j.empty() ? "" : ", ") + n;
                                  return j;
                                }() + "), " + std::to_string(lengths[0]) + " tokens. Cosine similarity of two "
                                "prompts' features, mean over KV heads; gap = within-task - between-task; centred: the same after "
                                "subtracting the mean feature over all prompts; task variance: the share of the "
                                "features' variance that the task explains (eta^2; for features unrelated to the task "
                                "about (tasks - 1) / (prompts - 1)).\n\n" + table,
                    "router features");
    std::vector<double> x(s.n_layers), gb(s.n_layers), ga(s.n_layers);
    for (int l = 0; l < s.n_layers; ++l)
      x[l] = l, gb[l] = s.before[l].task_variance_share, ga[l] = s.after[l].task_variance_share;
    const std::string svg = beside_markdown(f->out, ".svg");
    write_line_chart_svg(svg, "Share of feature variance explained by the task, per layer", "layer", "eta^2",
                         {{"pooled keys", x, gb}, {"after task MLP", x, ga}}, false, true);
    std::printf("%s", table.c_str());
    std::fprintf(stderr, "wrote %s and %s\n", f->out.c_str(), svg.c_str());
  }});
}

}  // namespace elastic::cli
