// elastic bench: llama-bench-style prefill speed per context length and routing mode, on a model folder or on a
// random-weight model of a named shape. Full attention measured in the same run is the baseline of every ratio.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "elastic/model_shapes.h"

namespace elastic::cli {
namespace {

struct Row {
  std::string model, mode;
  int layers = 0, ctx = 0, reps = 0;
  double msr = 0, flops = 0, tok_s = 0, tok_s_sd = 0, attn_ms = 0, attn_ms_sd = 0, speedup = 0;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');)
    if (!x.empty()) out.push_back(x);
  return out;
}

int parse_ctx(const std::string& s) {
  size_t used = 0;
  int v = 0;
  try {
    v = std::stoi(s, &used);
  } catch (const std::exception&) {
    throw std::runtime_error("bench: bad context length '" + s + "'");
  }
  std::string rest = s.substr(used);
  if (rest == "k" || rest == "K") v *= 1024;
  else if (!rest.empty()) throw std::runtime_error("bench: bad context length '" + s + "'");
  if (v <= 0) throw std::runtime_error("bench: context length must be positive: '" + s + "'");
  return v;
}

// "full" | "ssa" | "xattn" | "hybrid@<omega>" (FA + SSA) | "hybrid-xa@<omega>" (FA + XAttention)
RoutingTable routing_for(const std::string& mode, const ModelConfig& c, const SparseSettings& s, uint64_t seed) {
  RoutingTable r;
  if (mode == "full" || mode == "ssa" || mode == "xattn") {
    r = RoutingTable::uniform(c.n_layers, c.n_kv_heads, parse_head_mode(mode));
  } else {
    const bool xa = mode.rfind("hybrid-xa@", 0) == 0;
    if (!xa && mode.rfind("hybrid@", 0) != 0) throw std::runtime_error("bench: unknown mode '" + mode + "'");
    const std::string v = mode.substr(xa ? 10 : 7);
    char* end = nullptr;
    const double omega = std::strtod(v.c_str(), &end);
    if (v.empty() || *end || !(omega >= 0 && omega <= 1))
      throw std::runtime_error("bench: mode '" + mode + "' needs an Omega in [0, 1]");
    r = random_routing(c.n_layers, c.n_kv_heads, omega, xa ? HeadMode::XAttn : HeadMode::Streaming, seed);
  }
  r.sparse = s;
  return r;
}

void mean_sd(const std::vector<double>& v, double& mean, double& sd) {
  mean = 0;
  for (double x : v) mean += x / v.size();
  sd = 0;
  for (double x : v) sd += (x - mean) * (x - mean);
  sd = v.size() > 1 ? std::sqrt(sd / (v.size() - 1)) : 0;
}

}  // namespace

void add_bench_command(CLI::App& app, Commands& cmds) {
  struct Opts {
    std::string model, shape = "tiny", ctx = "512,1024", modes = "full,ssa,xattn,hybrid@0.5,hybrid@0.7,hybrid@0.9",
                       out = "md";
    int layers = 0, vocab = 0, reps = 3, threads = 0, chunk = 16384;
    uint64_t seed = 0;
    SparseSettings sparse;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("bench", "Prefill speed per context length and routing mode (llama-bench style)");
  sub->add_option("-m,--model", o->model, "Model folder or .gguf (default: a random-weight model of --shape)");
  sub->add_option("--shape", o->shape, "Named shape for a random-weight model: qwen3-0.6b, qwen3-4b, qwen3-8b, llama-3.1-8b, tiny");
  sub->add_option("--layers", o->layers, "Override the shape's layer count (time per layer is what scales)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--vocab", o->vocab, "Override the shape's vocabulary (embedding memory)")->check(CLI::PositiveNumber);
  sub->add_option("-c,--ctx", o->ctx, "Comma list of prompt lengths (k = 1024)");
  sub->add_option("--modes", o->modes, "Comma list: full, ssa, xattn, hybrid@OMEGA (FA+SSA), hybrid-xa@OMEGA");
  sub->add_option("-r,--repeats", o->reps, "Repeats per row")->check(CLI::PositiveNumber);
  sub->add_option("--chunk", o->chunk, "Prefill chunk size")->check(CLI::PositiveNumber);
  sub->add_option("--block", o->sparse.block, "Sparse block size (64 or 128)");
  sub->add_option("--sink", o->sparse.sink, "Streaming sink tokens");
  sub->add_option("--local", o->sparse.local, "Streaming local window tokens");
  sub->add_option("--seed", o->seed, "Seed (weights, prompts, hybrid routings)");
  sub->add_option("-o,--output", o->out, "Output format")->check(CLI::IsMember({"md", "json", "csv"}));
  sub->add_option("-t,--threads", o->threads, "CPU threads")->check(CLI::NonNegativeNumber);
  cmds.push_back({sub, [o] {
    set_threads(o->threads);
    o->sparse.xattn.block = o->sparse.block;
    validate_sparse(o->sparse, "bench");
    std::vector<int> ctxs;
    for (const auto& s : split(o->ctx)) ctxs.push_back(parse_ctx(s));
    const std::vector<std::string> modes = split(o->modes);
    if (ctxs.empty() || modes.empty()) throw std::runtime_error("bench: give at least one context and one mode");
    Model m;
    std::string name;
    if (!o->model.empty()) {
      m = Model::load(o->model);
      name = o->model;
    } else {
      ModelConfig c = named_shape(o->shape);
      if (o->layers) c.n_layers = o->layers;
      if (o->vocab) c.vocab = o->vocab;
      const double gib = 4.0 * (static_cast<double>(c.vocab) * c.hidden * (c.tie_embeddings ? 1 : 2) +
                                static_cast<double>(c.n_layers) * (2.0 * c.hidden * c.n_heads * c.head_dim +
                                                                   2.0 * c.hidden * c.n_kv_heads * c.head_dim +
                                                                   3.0 * c.hidden * c.intermediate)) / (1 << 30);
      std::fprintf(stderr, "bench: random-weight %s, %d layers, %.2f GiB of fp32 weights\n", o->shape.c_str(),
                   c.n_layers, gib);
      m = random_model(c, o->seed);
      name = o->shape;
    }
    for (const std::string& mode : modes) (void)routing_for(mode, m.config, o->sparse, o->seed);  // fail fast
    std::vector<Row> rows;
    std::mt19937_64 rng(o->seed);
    const int total = static_cast<int>(ctxs.size() * modes.size());
    int done = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int T : ctxs) {
      std::vector<int32_t> ids(T);
      for (auto& id : ids) id = static_cast<int32_t>(rng() % m.config.vocab);
      double full_s = 0;
      for (const std::string& mode : modes) {
        RoutingTable r = routing_for(mode, m.config, o->sparse, o->seed);
        std::vector<double> tok_s, attn_ms;
        AttentionStats last;
        for (int rep = 0; rep < o->reps; ++rep) {
          KVCache cache;
          cache.init(m.config, T, &r);
          AttentionStats st;
          std::vector<float> logits;
          const auto a = std::chrono::steady_clock::now();
          m.prefill(ids.data(), T, o->chunk, cache, logits, false, &st, &r);
          const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
          tok_s.push_back(T / s);
          attn_ms.push_back(st.seconds * 1e3);
          last = st;
        }
        Row row;
        row.model = name;
        row.mode = mode;
        row.layers = m.config.n_layers;
        row.ctx = T;
        row.reps = o->reps;
        row.msr = r.msr();
        row.flops = last.flops_ratio();
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
    if (o->out == "json") {
      nlohmann::json j = nlohmann::json::array();
      for (const Row& r : rows)
        j.push_back({{"model", r.model}, {"layers", r.layers}, {"ctx", r.ctx}, {"mode", r.mode}, {"omega_msr", r.msr},
                     {"attention_flops_ratio", r.flops}, {"prefill_tok_s", r.tok_s}, {"prefill_tok_s_sd", r.tok_s_sd},
                     {"attention_ms", r.attn_ms}, {"attention_ms_sd", r.attn_ms_sd},
                     {"attention_speedup_vs_full", std::isfinite(r.speedup) ? nlohmann::json(r.speedup) : nlohmann::json()},
                     {"repeats", r.reps}});
      std::cout << j.dump(2) << "\n";
    } else if (o->out == "csv") {
      std::cout << "model,layers,ctx,mode,omega_msr,attention_flops_ratio,prefill_tok_s,prefill_tok_s_sd,attention_ms,"
                   "attention_ms_sd,attention_speedup_vs_full,repeats\n";
      for (const Row& r : rows)
        std::printf("%s,%d,%d,%s,%.3f,%.3f,%.2f,%.2f,%.3f,%.3f,%.3f,%d\n", r.model.c_str(), r.layers, r.ctx,
                    r.mode.c_str(), r.msr, r.flops, r.tok_s, r.tok_s_sd, r.attn_ms, r.attn_ms_sd, r.speedup, r.reps);
    } else {
      std::printf("| model | layers | ctx | mode | Omega_MSR | attn FLOPs vs full | prefill tok/s | attention ms | "
                  "attention speed vs full |\n|---|---|---|---|---|---|---|---|---|\n");
      for (const Row& r : rows)
        std::printf("| %s | %d | %d | %s | %.2f | %.3f | %.1f ± %.1f | %.1f ± %.1f | %s |\n", r.model.c_str(), r.layers,
                    r.ctx, r.mode.c_str(), r.msr, r.flops, r.tok_s, r.tok_s_sd, r.attn_ms, r.attn_ms_sd,
                    std::isfinite(r.speedup) ? (std::to_string(r.speedup).substr(0, 4) + "x").c_str() : "-");
    }
  }});
}

}  // namespace elastic::cli
