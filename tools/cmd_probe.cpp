// elastic probe: retrieval scores per (layer, KV head) from needle-in-a-haystack prompts, plus a heat map.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli_common.h"
#include "elastic/heatmap_svg.h"
#include "elastic/probe.h"
#include "elastic/tokenizer.h"
#ifdef ELASTIC_HAVE_CUDA
#include "elastic/gpu_model.h"
#endif

namespace fs = std::filesystem;

namespace elastic::cli {

void add_probe_command(CLI::App& app, Commands& cmds) {
  struct Opts { std::string model, hay, out = "heads.json", svg, tok, device = "cpu"; ProbeOptions po; int threads = 0;
                bool no_chat = false; };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("probe", "Measure retrieval scores per (layer, KV head) with needle-in-a-haystack prompts");
  add_model_option(sub, o->model);
  sub->add_option("--haystack", o->hay, "Haystack text file (default: built-in filler)");
  sub->add_option("--tokenizer", o->tok, "tokenizer.json (default: the model folder's; random ids when absent)");
  sub->add_option("-c,--ctx-size", o->po.context, "Prompt length in tokens (at most the model's context)")
      ->check(in_range(1, kMaxTokens));
  sub->add_option("--depths", o->po.n_depths, "Needle depths")->check(in_range(1, 1000));
  sub->add_option("--needles", o->po.n_needles_per_depth, "Prompts per depth")->check(in_range(1, 1000));
  sub->add_option("--seed", o->po.seed, "Seed")->check(seed_check());
  // Task mode: the eval's own prompts (its needle phrasing and chat template), scored on their evidence tokens.
  sub->add_option("--task", o->po.task,
                  "Probe with the eval's prompts of this needle task (e.g. niah_single_2) instead of the magic-number "
                  "needle; --depths/--needles are then unused")
      ->check(CLI::IsMember(ruler_task_names()));
  sub->add_option("--prompts", o->po.prompts, "Task mode: number of prompts")->check(in_range(1, 100000));
  sub->add_flag("--no-chat", o->no_chat, "Task mode: do not apply the model's chat template (eval applies it)");
  add_threads_option(sub, o->threads);
  sub->add_option("-o,--output", o->out, "Scores JSON");
  sub->add_option("--svg", o->svg, "Heat map SVG (default: output with .svg)");
  // cuda: the same prompts and scoring; each prompt's last-row attention comes from the bf16 GPU backend.
  sub->add_option("--device", o->device, "cpu, or cuda (bf16 GPU backend)")->check(CLI::IsMember({"cpu", "cuda"}));
  cmds.push_back({sub, [o] {
    // The heat map's path, checked before the run: -o p.svg (or --svg equal to -o) wrote the scores and then the
    // heat map over them.
    const std::string svg = o->svg.empty() ? fs::path(o->out).replace_extension(".svg").string() : o->svg;
    if (fs::path(svg).lexically_normal() == fs::path(o->out).lexically_normal())
      throw std::runtime_error("probe: the scores (-o) and the heat map (--svg, default -o with .svg) would both be " +
                               o->out + ": give them different paths");
    resolve_model(o->model, "probe");
    set_threads(o->threads);
    o->po.haystack_file = o->hay;
    Model m = Model::load(o->model);
    std::unique_ptr<Tokenizer> t = load_model_tokenizer(o->model, o->tok);
    if (!t)
      std::fprintf(stderr, "probe: no tokenizer.json in %s: using random token ids for haystack and needle\n",
                   o->model.c_str());
    if (!o->po.task.empty()) o->po.chat = model_chat_format(o->model, t != nullptr, o->no_chat, "probe");
    auto t0 = std::chrono::steady_clock::now();
    auto progress = [&](int done, int total) {
      double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      double rate = done / std::max(el, 1e-9);
      std::fprintf(stderr, "\rprobe %d/%d prompts | %.2f prompts/s | eta %.0fs   ", done, total, rate,
                   (total - done) / std::max(rate, 1e-9));
    };
    HeadScores hs;
    if (o->device == "cuda") {
#ifdef ELASTIC_HAVE_CUDA
      cuda::GpuOptions go;
      go.max_ctx = o->po.context;
      auto g = cuda::GpuModel::upload(m, go);
      std::fprintf(stderr, "%s\n", g->plan().describe().c_str());
      hs = probe_retrieval_heads(m.config, t.get(), o->po,
                                 [&](const std::vector<int32_t>& ids) { return g->last_row_attention(ids); }, progress);
#else
      no_cuda_backend("probe");
#endif
    } else {
      hs = probe_retrieval_heads(m, t.get(), o->po, progress);
    }
    std::fprintf(stderr, "\n");
    save_head_scores(hs, o->out);
    write_heatmap_svg(svg, hs.score, hs.n_layers, hs.n_kv_heads, "Retrieval score per (layer, KV head)", "layer",
                      "KV head");
    std::fprintf(stderr, "wrote %s and %s (%d prompts)\n", o->out.c_str(), svg.c_str(), hs.prompts);
  }});
}

}  // namespace elastic::cli
