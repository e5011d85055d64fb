// elastic bench: llama-bench-style prefill speed per context length and routing mode, on a model folder or on a
// random-weight model of a named shape. Full attention measured in the same run is the baseline of every ratio.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <memory>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "elastic/density_report.h"
#include "elastic/heatmap_svg.h"
#include "elastic/json_file.h"
#include "elastic/model_shapes.h"
#include "elastic/output_file.h"
#include "elastic/plot_svg.h"
#include "elastic/router.h"
#include "elastic/sparse_pattern.h"
#include "elastic/text_file.h"
#include "elastic/tokenizer.h"
#ifdef ELASTIC_HAVE_CUDA
#include "elastic/cuda.h"
#include "elastic/cuda_attention.h"
#include "elastic/cuda_paged_decode.h"
#include "elastic/gpu_model.h"
#endif

namespace elastic::cli {
namespace {

struct Row {
  std::string model, mode;
  int layers = 0, ctx = 0, reps = 0;
  double msr = 0, flops = 0, tok_s = 0, tok_s_sd = 0, attn_ms = 0, attn_ms_sd = 0, speedup = 0, tg = NAN;
  // GPU --decode: sequences decoded together (--batch), the bytes one step reads (weights + every sequence's K/V
  // pages) and their rate against the measured copy rate. tg is all sequences' tokens per second together.
  int batch = 1;
  double step_bytes = NAN, step_gbs = NAN;
  std::string note;  // why a row has no decode figures (the batch's pages did not fit)
  // GPU --decode: one more step, uncaptured, timed by part (ms, GpuDecodeParts' order). Empty on the CPU.
  std::vector<double> parts;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');)
    if (!x.empty()) out.push_back(x);
  return out;
}

// One -c entry: N or Nk (k = 1024), 1..kMaxTokens. Digits only, bounded before the multiply (99999999k overflows an
// int), and every failure names -c and the entry instead of std::stoi's bare "stoi".
int parse_ctx(const std::string& s) {
  std::string digits = s;
  int64_t mult = 1;
  if (!digits.empty() && (digits.back() == 'k' || digits.back() == 'K')) mult = 1024, digits.pop_back();
  const bool numeric = !digits.empty() && digits.size() <= 9 &&
                       std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  if (!numeric) throw std::runtime_error("bench: -c: bad context length '" + s + "' (use e.g. 512,8k)");
  const int64_t v = std::stoll(digits) * mult;
  if (v <= 0 || v > kMaxTokens)
    throw std::runtime_error("bench: -c: context length '" + s + "' must be in [1, " + std::to_string(kMaxTokens) + "]");
  return static_cast<int>(v);
}

// A mode: full, ssa or xattn (every head), or CONFIG@OMEGA with CONFIG one of the paper's configurations fa-ssa,
// fa-xa, xa-ssa (router.h's names; hybrid and hybrid-xa are fa-ssa and fa-xa): round(OMEGA x heads) heads drawn
// with the seed run the sparse class's mode, the rest the dense class's.
RoutingTable routing_for(const std::string& mode, const ModelConfig& c, const SparseSettings& s, uint64_t seed) {
  RoutingTable r;
  if (mode == "full" || mode == "ssa" || mode == "xattn") {
    r = RoutingTable::uniform(c.n_layers, c.n_kv_heads, parse_head_mode(mode));
  } else {
    const size_t at = mode.find('@');
    std::string cfg = at == std::string::npos ? mode : mode.substr(0, at);
    if (cfg == "hybrid") cfg = "fa-ssa";
    if (cfg == "hybrid-xa") cfg = "fa-xa";
    HeadMode dense = HeadMode::Full, sparse = HeadMode::Streaming;
    try {
      parse_router_config(cfg, dense, sparse);
    } catch (const std::invalid_argument&) {
      throw std::runtime_error("bench: unknown mode '" + mode +
                               "' (full, ssa, xattn, or fa-ssa@, fa-xa@, xa-ssa@ (hybrid@, hybrid-xa@) with an Omega)");
    }
    const std::string v = at == std::string::npos ? "" : mode.substr(at + 1);
    char* end = nullptr;
    const double omega = std::strtod(v.c_str(), &end);
    if (v.empty() || *end || !(omega >= 0 && omega <= 1))
      throw std::runtime_error("bench: mode '" + mode + "' needs an Omega in [0, 1]");
    r = random_routing(c.n_layers, c.n_kv_heads, omega, sparse, seed);
    for (HeadMode& m : r.mode)
      if (m == HeadMode::Full) m = dense;  // the dense class's heads
  }
  r.sparse = s;
  return r;
}

// Fraction of the causal key blocks the routing computes, from the patterns' block rules, and for XAttention (whose
// blocks depend on the input) from `xa_kept`: the blocks its query heads kept, as the GPU estimator counted them
// (GpuPrefillStats::xattn_kept_blocks over `group` query heads per KV head; NaN where not measured: the ratio is then
// NaN too). The GPU path reports this; the CPU path counts pairs as it runs. One count per pattern, weighted by its
// heads.
double routed_block_ratio(const RoutingTable& r, int T, double xa_kept = NAN, int group = 1) {
  const int B = r.sparse.block, nb = (T + B - 1) / B;
  std::vector<int64_t> heads(n_sparse_patterns(), 0);
  for (HeadMode m : r.mode) ++heads.at(static_cast<size_t>(m));
  const double all = double(nb) * (nb + 1) / 2;
  double kept = 0;
  for (size_t i = 0; i < heads.size(); ++i) {
    if (!heads[i]) continue;
    const HeadMode m = static_cast<HeadMode>(i);
    if (sparse_pattern(m).select) {  // the heads' measured blocks, per KV head
      if (!std::isfinite(xa_kept)) return NAN;
      kept += xa_kept / group;
      continue;
    }
    double k = 0;
    for (int qb = 0; qb < nb; ++qb)
      for (int kb = 0; kb <= qb; ++kb) k += pattern_holds(m, qb, kb, r.sparse);
    kept += k * double(heads[i]);
  }
  return r.mode.empty() ? 1.0 : kept / (all * double(r.mode.size()));
}

std::string fmt_or_dash(double v, const char* f) {
  if (!std::isfinite(v)) return "-";
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

void mean_sd(const std::vector<double>& v, double& mean, double& sd) {
  mean = 0;
  for (double x : v) mean += x / v.size();
  sd = 0;
  for (double x : v) sd += (x - mean) * (x - mean);
  sd = v.size() > 1 ? std::sqrt(sd / (v.size() - 1)) : 0;
}

// One series per mode, x = context length (log2 axis). Decode only where it was timed.
void write_plots(const std::vector<Row>& rows, const std::vector<std::string>& modes, const std::string& prefix,
                 const std::string& model, const std::string& device) {
  auto series = [&](double Row::*field) {
    std::vector<PlotSeries> out;
    for (const std::string& mode : modes) {
      PlotSeries ps{mode, {}, {}};
      for (const Row& r : rows)
        if (r.mode == mode && std::isfinite(r.*field)) ps.x.push_back(r.ctx), ps.y.push_back(r.*field);
      if (!ps.x.empty()) out.push_back(ps);
    }
    return out;
  };
  const std::string what = model + " on " + device;
  write_line_chart_svg(prefix + "_prefill.svg", "Prefill speed, " + what, "context (tokens)", "prefill tokens/s",
                       series(&Row::tok_s), true);
  write_line_chart_svg(prefix + "_attention.svg", "Attention time per prefill, " + what, "context (tokens)",
                       "attention ms (all layers)", series(&Row::attn_ms), true);
  const auto decode = series(&Row::tg);
  if (!decode.empty())
    write_line_chart_svg(prefix + "_decode.svg", "Decode speed after the prefill, " + what, "context (tokens)",
                         "decode tokens/s", decode, true);
  std::fprintf(stderr, "bench: plots written to %s_*.svg\n", prefix.c_str());
}

}  // namespace

void add_bench_command(CLI::App& app, Commands& cmds) {
  struct Opts {
    std::string model, shape = "tiny", ctx = "512,1024", modes = "full,ssa,xattn,hybrid@0.5,hybrid@0.7,hybrid@0.9",
                       out = "md";
    int layers = 0, vocab = 0, reps = 3, threads = 0, chunk = 16384, decode = 32, batch = 1;
    double kv_pool_gib = 0;
    bool batch_invariant = false;
    int pdl = -1;  // unset: GpuOptions' default (on); --pdl 1, --no-pdl 0
    int small_m_rows = -1;  // unset: GpuOptions' default
    std::string device = "cpu", attn_kernel, xa_estimator, plot, text, density;
    uint64_t seed = 0;
    SparseSettings sparse;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("bench", "Prefill speed per context length and routing mode (llama-bench style)");
  sub->add_option("-m,--model", o->model, "Model folder or .gguf (default: a random-weight model of --shape)");
  CLI::Option* shape_opt = sub->add_option("--shape", o->shape, "Named shape for a random-weight model: qwen3-0.6b, qwen3-4b, qwen3-8b, llama-3.1-8b, tiny");
  sub->add_option("--layers", o->layers, "Override the shape's layer count (time per layer is what scales)")
      ->check(in_range(1, 1024));
  sub->add_option("--vocab", o->vocab, "Override the shape's vocabulary (embedding memory)")
      ->check(in_range(1, kMaxTokens));
  sub->add_option("-c,--ctx", o->ctx, "Comma list of prompt lengths (k = 1024)");
  sub->add_option("--modes", o->modes,
                  "Comma list: full, ssa, xattn, or the paper's configurations with Omega_MSR: fa-ssa@OMEGA (alias "
                  "hybrid@), fa-xa@OMEGA (hybrid-xa@), xa-ssa@OMEGA (OMEGA: the sparse class's share of KV heads; the "
                  "table's Omega_MSR counts every head that is not full, so xa-ssa rows show 1)");
  sub->add_option("-r,--repeats", o->reps, "Repeats per row")->check(in_range(1, 10000));
  sub->add_option("--chunk", o->chunk, "Prefill chunk size")->check(in_range(1, kMaxTokens));
  add_sparse_options(sub, o->sparse);
  sub->add_option("--seed", o->seed, "Seed (weights, prompts, hybrid routings)")->check(seed_check());
  sub->add_option("--density", o->density,
                  "CPU: per (layer, KV head) share of key blocks XAttention heads kept in each row's last prefill, as "
                  "Markdown in this file and a heat map per row beside it (<file without .md>_<mode>_<T>.svg); "
                  "with --text, what real attention keeps");
  // Real text instead of random ids: what XAttention keeps depends on how peaked real attention is.
  sub->add_option("--text", o->text,
                  "Prompt text file, tokenized with -m's tokenizer; each row runs its first T tokens (default: random "
                  "token ids)");
  sub->add_option("-o,--output", o->out, "Output format")->check(CLI::IsMember({"md", "json", "csv"}));
  sub->add_option("--plot", o->plot,
                  "Also write speed curves per mode against context length: PREFIX_prefill.svg (tokens/s), "
                  "PREFIX_attention.svg (attention ms) and, with --decode on the GPU, PREFIX_decode.svg");
  add_threads_option(sub, o->threads);
  sub->add_option("--device", o->device, "cpu, or cuda (bf16 GPU backend)")->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--decode", o->decode, "GPU: decode steps timed after each row's prefill (0 = none)")
      ->check(in_range(0, kMaxTokens));
  sub->add_option("--batch", o->batch,
                  "GPU: sequences decoded together after each row's prefill (the prompt forked into each slot)")
      ->check(in_range(1, 256));  // cuda::kMaxGpuSlots (the header needs CUDA; the GPU model refuses more too)
  sub->add_option("--kv-pool-gib", o->kv_pool_gib,
                  "GPU: KV page pool (default: --batch sequences, every head full, at the longest row)")
      ->check(in_range(0.0, 1e6));  // CLI11's Range lets nan through
  sub->add_flag("--batch-invariant", o->batch_invariant,
               "GPU: decode as the server does, rows bitwise equal alone and batched (GpuOptions::batch_invariant)");
  sub->add_option("--small-m-rows", o->small_m_rows,
                  "GPU: projections of up to this many rows through Elastic's small-M kernel instead of cuBLASLt "
                  "(GpuOptions::small_m_rows, default 2; 0 = cuBLASLt)")
      ->check(in_range(0, 4));
  CLI::Option* pdl_on = sub->add_flag_callback(
      "--pdl", [o] { o->pdl = 1; },
      "GPU: decode steps launch their kernels with programmatic dependent launch (GpuOptions::programmatic_launch, "
      "the default)");
  sub->add_flag_callback("--no-pdl", [o] { o->pdl = 0; }, "GPU: decode steps launch their kernels plainly")
      ->excludes(pdl_on);
  sub->add_option("--attn-kernel", o->attn_kernel,
                  "GPU: prefill attention kernel (default auto; the measurement variants run in bench_attention_gpu, "
                  "docs/CUDA_ATTENTION.md)")
      ->check(CLI::IsMember({"auto", "simple", "overlap"}));
  sub->add_option("--xa-estimator", o->xa_estimator,
                  "GPU: XAttention estimator, cublaslt (the default) or fused (the wgmma candidate, "
                  "GpuOptions::xattn_estimate)")
      ->check(CLI::IsMember({"cublaslt", "fused"}));
  cmds.push_back({sub, [o, shape_opt] {
    // A model file has its own shape: these flags would be ignored without a word.
    if (!o->model.empty() && (shape_opt->count() || o->layers || o->vocab))
      throw std::runtime_error("bench: --shape, --layers and --vocab shape a random-weight model; -m gives its own");
    set_threads(o->threads);
    o->sparse.xattn.block = o->sparse.block;
    validate_sparse(o->sparse, "bench");
    std::vector<int> ctxs;
    for (const auto& s : split(o->ctx)) ctxs.push_back(parse_ctx(s));
    const std::vector<std::string> modes = split(o->modes);
    if (ctxs.empty() || modes.empty()) throw std::runtime_error("bench: give at least one context and one mode");
    const bool gpu = o->device == "cuda";
    if (!o->density.empty() && gpu)
      throw std::runtime_error("bench: --density counts blocks on the CPU reference (the GPU kernels do not count "
                               "them); run it with --device cpu");
    if (o->batch_invariant && o->small_m_rows > 0)
      throw std::runtime_error("bench: --small-m-rows and --batch-invariant exclude each other (batch invariance runs "
                               "one cuBLASLt algorithm for every batch size)");
    if (!gpu && (o->batch != 1 || o->kv_pool_gib > 0 || o->batch_invariant || o->small_m_rows >= 0 || o->pdl >= 0 ||
                 !o->xa_estimator.empty()))
      throw std::runtime_error("bench: --batch, --kv-pool-gib, --batch-invariant, --small-m-rows, --pdl/--no-pdl and "
                               "--xa-estimator need --device cuda (the CPU bench times prefill only)");
    if (!o->attn_kernel.empty()) {
      if (!gpu) throw std::runtime_error("bench: --attn-kernel needs --device cuda");
      std::fprintf(stderr, "bench: attention kernel %s\n", o->attn_kernel.c_str());
    }
#ifndef ELASTIC_HAVE_CUDA
    if (gpu) no_cuda_backend("bench");
#endif
    Model m;
    std::string name;
    if (!o->model.empty()) {
      m = Model::load(o->model);
      name = o->model;
    } else {
      ModelConfig c = named_shape(o->shape);
      if (o->layers) c.n_layers = o->layers;
      if (o->vocab) c.vocab = o->vocab;
      const double params = static_cast<double>(c.vocab) * c.hidden * (c.tie_embeddings ? 1 : 2) +
                            static_cast<double>(c.n_layers) * (2.0 * c.hidden * c.n_heads * c.head_dim +
                                                               2.0 * c.hidden * c.n_kv_heads * c.head_dim +
                                                               3.0 * c.hidden * c.intermediate);
      std::fprintf(stderr, "bench: random-weight %s, %d layers, %.2f GiB of %s weights\n", o->shape.c_str(),
                   c.n_layers, params * (gpu ? 2 : 4) / (1 << 30), gpu ? "bf16 (made on the GPU)" : "fp32");
      if (gpu) {
        m.config = c;  // the weights are made on the device
      } else {
        // The fp32 weights plus the longest row's all-full KV cache against this machine's memory: a shape that
        // cannot fit failed after a minute with a bare std::bad_alloc (qwen3-8b: 30.5 GiB of weights).
        const int longest = *std::max_element(ctxs.begin(), ctxs.end());
        const double kv = 2.0 * 4 * c.n_layers * c.n_kv_heads * c.head_dim * static_cast<double>(longest);
        const double need = params * 4 + kv, have = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
        if (have > 0 && need > have)
          throw std::runtime_error("bench: a random-weight " + o->shape + " on the CPU needs " +
                                   std::to_string(need / (1 << 30)).substr(0, 6) + " GiB (fp32 weights and the -c " +
                                   std::to_string(longest) + " KV cache), more than this machine's " +
                                   std::to_string(have / (1 << 30)).substr(0, 6) + " GiB: a smaller --shape, --layers or -c");
        m = random_model(c, o->seed);
      }
      name = o->shape;
    }
    std::vector<int32_t> text_ids;  // --text: the file's tokens; rows take prefixes of it
    if (!o->text.empty()) {
      if (o->model.empty()) throw std::runtime_error("bench: --text needs -m (a model with a tokenizer)");
      const std::unique_ptr<Tokenizer> tok = load_model_tokenizer(o->model, "", true);
      text_ids = tok->encode(read_text_file(o->text, "bench --text"));
      const int longest_ctx = *std::max_element(ctxs.begin(), ctxs.end());
      if (static_cast<int64_t>(text_ids.size()) < longest_ctx)
        throw std::runtime_error("bench: --text " + o->text + " has " + std::to_string(text_ids.size()) +
                                 " tokens, fewer than -c " + std::to_string(longest_ctx));
      std::fprintf(stderr, "bench: prompts are the first T of %zu tokens of %s\n", text_ids.size(), o->text.c_str());
    }
    // Before any buffer is sized for the longest row (a -c beyond the model's RoPE range is no measurement).
    const int64_t longest = *std::max_element(ctxs.begin(), ctxs.end()) + int64_t{gpu ? o->decode : 0};
    check_within_context(m.config, longest,
                         "bench: -c " + std::to_string(longest) + (gpu && o->decode ? " (with --decode)" : ""));
#ifdef ELASTIC_HAVE_CUDA
    std::unique_ptr<cuda::GpuModel> g;
    if (gpu) {
      cuda::GpuOptions go;
      go.max_ctx = *std::max_element(ctxs.begin(), ctxs.end()) + o->decode;
      go.chunk = o->chunk;
      go.slots = o->batch;
      go.batch_invariant = o->batch_invariant;
      if (o->small_m_rows >= 0) go.small_m_rows = o->small_m_rows;
      if (o->pdl >= 0) go.programmatic_launch = o->pdl == 1;
      if (o->xa_estimator == "fused") go.xattn_estimate = cuda::XAttnEstimateKernel::Fused;
      go.kv_pool_bytes = static_cast<size_t>(o->kv_pool_gib * double(size_t(1) << 30));
      go.attention = cuda::attention_config_from_env();  // ELASTIC_ATTN_OPTS still applies; --attn-kernel names the kernel
      if (!o->attn_kernel.empty())  // the flag wins over ELASTIC_ATTN_KERNEL
        go.attention->kernel = cuda::attention_kernel_by_name(o->attn_kernel);
      g = o->model.empty() ? cuda::GpuModel::random(m.config, go, o->seed) : cuda::GpuModel::upload(m, go);
      // The plan ends with the kernels this run uses, so a saved table says what it measured (docs/CUDA_ATTENTION.md).
      std::fprintf(stderr, "%s\n", g->plan().describe().c_str());
    }
#endif
    for (const std::string& mode : modes) (void)routing_for(mode, m.config, o->sparse, o->seed);  // fail fast
    std::string density_md;  // --density: one section per row with selecting heads
    std::vector<Row> rows;
    std::mt19937_64 rng(o->seed);
    const int total = static_cast<int>(ctxs.size() * modes.size());
    int done = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int T : ctxs) {
      std::vector<int32_t> ids(T);
      for (auto& id : ids) id = static_cast<int32_t>(rng() % m.config.vocab);
      if (!text_ids.empty()) std::copy_n(text_ids.begin(), T, ids.begin());
      double full_s = 0;
      for (const std::string& mode : modes) {
        RoutingTable r = routing_for(mode, m.config, o->sparse, o->seed);
        std::vector<double> tok_s, attn_ms;
        AttentionStats last;
        double tg = NAN, flops = NAN;
        std::vector<double> parts;
        std::string note;
        double step_bytes = NAN, step_gbs = NAN;
#ifdef ELASTIC_HAVE_CUDA
        if (gpu) {
          // Warm-up: one untimed prefill for every mode. A mode's first prefill can pay first-use costs the rest do
          // not (XAttention heads allocate their lists and the estimator's scratch and plan its products; cuBLASLt
          // loads kernels on first use), and with -r 1 the timed prefill would otherwise be that first one.
          g->prefill(ids.data(), T, &r, nullptr, nullptr, false);
          double xa_kept = NAN;  // the last repeat's kept XAttention blocks (the same input every repeat)
          for (int rep = 0; rep < o->reps; ++rep) {
            cuda::GpuPrefillStats st;
            g->prefill(ids.data(), T, &r, nullptr, nullptr, false, &st);
            tok_s.push_back(T / (st.total_ms / 1e3));
            attn_ms.push_back(st.attention_ms);
            xa_kept = static_cast<double>(st.xattn_kept_blocks);
          }
          if (o->decode > 0) {
            // The prompt forked into every other slot (the same K/V, pages of its own), then each step feeds every
            // sequence. Untimed: an eager step (cuBLASLt picks its algorithms), one step timed by part (uncaptured,
            // events between the parts), the step that captures the graph. Then the replays are timed.
            const int B = o->batch;
            std::vector<int> slots(B);
            for (int b = 0; b < B; ++b) slots[b] = b;
            try {
              for (int b = 1; b < B; ++b) g->fork(0, b);
            } catch (const OutOfPages&) {
              note = "the pages of " + std::to_string(B) + " sequences do not fit the pool (--kv-pool-gib)";
            }
            if (note.empty()) {
              std::vector<int32_t> ids_b(B, ids.back()), next;
              g->decode_batch(slots, ids_b, nullptr, &next);
              if (o->decode > 1) {
                const cuda::GpuDecodeParts p = g->decode_parts(next[0], nullptr, B);
                parts.assign(std::begin(p.ms), std::end(p.ms));
              }
              if (o->decode > 2) g->decode_batch(slots, next, nullptr, &next);
              double kv = 0;
              for (int b = 0; b < B; ++b) kv += double(g->kv_bytes(b));
              const auto a = std::chrono::steady_clock::now();
              for (int i = 3; i < o->decode; ++i) g->decode_batch(slots, next, nullptr, &next);
              const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
              if (o->decode > 3) {
                tg = double(B) * (o->decode - 3) / s;
                step_bytes = double(g->plan().weights) + kv;  // K/V at the start of the timed steps
                step_gbs = step_bytes * (o->decode - 3) / s * 1e-9;
              }
            }
            for (int b = 1; b < B; ++b) g->release(b);
          }
          flops = routed_block_ratio(r, T, xa_kept, m.config.n_heads / m.config.n_kv_heads);
        }
#endif
        for (int rep = 0; !gpu && rep < o->reps; ++rep) {
          KVCache cache;
          cache.init(m.config, T, &r);
          AttentionStats st;
          st.per_layer = !o->density.empty() && rep == o->reps - 1;  // counted once, on the last repeat
          std::vector<float> logits;
          const auto a = std::chrono::steady_clock::now();
          m.prefill(ids.data(), T, o->chunk, cache, logits, false, &st);  // under the routing the cache was built for
          const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
          tok_s.push_back(T / s);
          attn_ms.push_back(st.seconds * 1e3);
          last = st;
          flops = last.flops_ratio();
        }
        if (!o->density.empty() && !gpu) {
          const HeadDensity d = selected_head_density(last, r);
          if (d.heads() > 0) {
            const std::string svg = beside_markdown(o->density, "_" + mode + "_" + std::to_string(T) + ".svg");
            write_heatmap_svg(svg, d.kept, d.n_layers, d.n_kv_heads,
                              mode + ", " + std::to_string(T) + " tokens: share of key blocks kept", "layer",
                              "KV head");
            density_md += "## " + mode + ", " + std::to_string(T) + " tokens\n\n" + head_density_markdown(d) +
                          "\nHeat map: `" + std::filesystem::path(svg).filename().string() + "`\n\n";
          }
        }
        Row row;
        row.model = name;
        row.mode = mode;
        row.layers = m.config.n_layers;
        row.ctx = T;
        row.reps = o->reps;
        row.msr = r.msr();
        row.flops = flops;
        row.tg = tg;
        row.parts = parts;
        row.batch = gpu ? o->batch : 1;
        row.step_bytes = step_bytes;
        row.step_gbs = step_gbs;
        row.note = note;
        mean_sd(tok_s, row.tok_s, row.tok_s_sd);
        mean_sd(attn_ms, row.attn_ms, row.attn_ms_sd);
        if (mode == "full") full_s = row.attn_ms;
        row.speedup = full_s > 0 ? full_s / row.attn_ms : NAN;
        rows.push_back(row);
        ++done;
        const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::fprintf(stderr, "\rbench %d/%d rows | %.1f s | eta %.0f s   ", done, total, el, el / done * (total - done));
      }
    }
    std::fprintf(stderr, "\n");
    if (!o->plot.empty()) write_plots(rows, modes, o->plot, name, o->device);
    if (!o->density.empty()) {
      write_text_file(o->density,
                      "# Blocks XAttention keeps per (layer, KV head)\n\n" + name + (o->text.empty() ? ", random token ids" : ", the first T tokens of " + o->text) +
                          "; block " + std::to_string(o->sparse.block) + ", stride " + std::to_string(o->sparse.xattn.stride) +
                          ", tau " + std::to_string(o->sparse.xattn.tau).substr(0, 4) + ", prefill chunk " + std::to_string(o->chunk) +
                          ". Kept share = computed / causal key blocks of the head's query blocks (CPU reference).\n\n" +
                          (density_md.empty() ? "No row ran a head that selects blocks (use --modes xattn or hybrid-xa@...).\n" : density_md),
                      "bench --density");
      std::fprintf(stderr, "wrote %s\n", o->density.c_str());
    }
    if (o->out == "json") {
      nlohmann::json j = nlohmann::json::array();
      for (const Row& r : rows)
        j.push_back({{"model", r.model}, {"layers", r.layers}, {"ctx", r.ctx}, {"mode", r.mode}, {"omega_msr", r.msr},
                     {"attention_flops_ratio", r.flops}, {"prefill_tok_s", r.tok_s}, {"prefill_tok_s_sd", r.tok_s_sd},
                     {"attention_ms", r.attn_ms}, {"attention_ms_sd", r.attn_ms_sd},
                     {"attention_speedup_vs_full", std::isfinite(r.speedup) ? nlohmann::json(r.speedup) : nlohmann::json()},
                     {"decode_tok_s", std::isfinite(r.tg) ? nlohmann::json(r.tg) : nlohmann::json()},
                     {"decode_batch", r.batch},
                     {"decode_step_bytes", std::isfinite(r.step_bytes) ? nlohmann::json(r.step_bytes) : nlohmann::json()},
                     {"decode_gb_s", std::isfinite(r.step_gbs) ? nlohmann::json(r.step_gbs) : nlohmann::json()},
                     {"attention_flops_ratio_known", std::isfinite(r.flops)}, {"device", o->device},
                     {"repeats", r.reps}});
      std::cout << dump_json(j, 2) << "\n";
    } else if (o->out == "csv") {
      std::cout << "model,layers,ctx,mode,omega_msr,attention_flops_ratio,prefill_tok_s,prefill_tok_s_sd,attention_ms,"
                   "attention_ms_sd,attention_speedup_vs_full,decode_tok_s,repeats\n";
      for (const Row& r : rows)
        std::printf("%s,%d,%d,%s,%.3f,%.3f,%.2f,%.2f,%.3f,%.3f,%.3f,%.2f,%d\n", r.model.c_str(), r.layers, r.ctx,
                    r.mode.c_str(), r.msr, r.flops, r.tok_s, r.tok_s_sd, r.attn_ms, r.attn_ms_sd, r.speedup, r.tg, r.reps);
    } else {
      std::printf("| model | device | layers | ctx | mode | Omega_MSR | attn FLOPs vs full | prefill tok/s | attention ms | "
                  "attention speed vs full | decode tok/s |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
      for (const Row& r : rows)
        std::printf("| %s | %s | %d | %d | %s | %.2f | %s | %.1f ± %.1f | %.1f ± %.1f | %s | %s |\n", r.model.c_str(),
                    o->device.c_str(), r.layers, r.ctx, r.mode.c_str(), r.msr, fmt_or_dash(r.flops, "%.3f").c_str(),
                    r.tok_s, r.tok_s_sd, r.attn_ms, r.attn_ms_sd, fmt_or_dash(r.speedup, "%.2fx").c_str(),
                    fmt_or_dash(r.tg, "%.1f").c_str());
#ifdef ELASTIC_HAVE_CUDA
      if (gpu && o->decode > 3) {
        // Decode against the roofline: a step reads the weights once and every sequence's K/V pages once.
        const double copy = cuda::copy_bandwidth_gbs();
        std::printf("\nDecode, %d sequence%s a step; copy rate (device to device, read + write) %.0f GB/s\n\n"
                    "| ctx | mode | batch | tok/s (all) | tok/s per sequence | GiB read per step (weights + K/V) | "
                    "GB/s | of copy |\n|---|---|---|---|---|---|---|---|\n",
                    o->batch, o->batch == 1 ? "" : "s", copy);
        for (const Row& r : rows) {
          if (!r.note.empty()) {
            std::printf("| %d | %s | %d | - | - | - | - | %s |\n", r.ctx, r.mode.c_str(), r.batch, r.note.c_str());
            continue;
          }
          std::printf("| %d | %s | %d | %s | %s | %s | %s | %s |\n", r.ctx, r.mode.c_str(), r.batch,
                      fmt_or_dash(r.tg, "%.1f").c_str(), fmt_or_dash(r.tg / r.batch, "%.1f").c_str(),
                      fmt_or_dash(r.step_bytes / double(size_t(1) << 30), "%.2f").c_str(),
                      fmt_or_dash(r.step_gbs, "%.0f").c_str(), fmt_or_dash(r.step_gbs / copy * 100, "%.0f%%").c_str());
        }
      }
      if (std::any_of(rows.begin(), rows.end(), [](const Row& r) { return !r.parts.empty(); })) {
        // Shares of one uncaptured step's GPU time; "replay" is the graph step (batch / decode tok/s): what the parts
        // add up to beyond it is the gaps between launches that the graph removes.
        std::printf("\n| ctx | mode | replay ms | parts sum ms |");
        for (const char* p : cuda::GpuDecodeParts::kNames) std::printf(" %s |", p);
        std::printf("\n|---|---|---|---|");
        for (size_t i = 0; i < std::size(cuda::GpuDecodeParts::kNames); ++i) std::printf("---|");
        std::printf("\n");
        for (const Row& r : rows) {
          if (r.parts.empty()) continue;
          double sum = 0;
          for (double x : r.parts) sum += x;
          std::printf("| %d | %s | %s | %.3f |", r.ctx, r.mode.c_str(), fmt_or_dash(1e3 * r.batch / r.tg, "%.3f").c_str(), sum);
          for (double x : r.parts) std::printf(" %.3f (%.0f%%) |", x, 100 * x / sum);
          std::printf("\n");
        }
      }
#endif
    }
  }});
}

}  // namespace elastic::cli
