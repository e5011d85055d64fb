// The one `elastic` command line: tokenize, logits, generate.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include <chrono>

#include "elastic/generate.h"
#include "elastic/heatmap_svg.h"
#include "elastic/probe.h"
#include "elastic/model.h"
#include "elastic/npy.h"
#include "elastic/tokenizer.h"

namespace fs = std::filesystem;
using namespace elastic;

namespace {

std::string ids_json(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s + "]";
}

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open");
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string tokenizer_path_for(const std::string& model_dir, const std::string& override_path) {
  if (!override_path.empty()) return override_path;
  fs::path p = fs::path(model_dir) / "tokenizer.json";
  if (!fs::exists(p))
    throw std::runtime_error(model_dir + ": no tokenizer.json in the model folder (pass --tokenizer or use --ids)");
  return p.string();
}

// --routing FILE or --mode full|ssa|xattn (all heads one mode); sparse sizes from the file or the defaults.
void apply_routing(Model& m, const std::string& routing_file, const std::string& mode) {
  if (!routing_file.empty() && !mode.empty()) throw std::runtime_error("give --routing or --mode, not both");
  if (!routing_file.empty()) m.routing = load_routing(routing_file, m.config.n_layers, m.config.n_kv_heads);
  else if (!mode.empty()) m.routing = RoutingTable::uniform(m.config.n_layers, m.config.n_kv_heads, parse_head_mode(mode));
  const SparseSettings& s = m.routing.sparse;
  // A routing file written for another model can ask for a window longer than this one's context.
  if (!routing_file.empty() && m.routing.msr() > 0 && s.sink + s.local > m.config.max_positions)
    throw std::runtime_error(routing_file + ": streaming sink + local (" +
                             std::to_string(s.sink) + " + " + std::to_string(s.local) + ") exceeds the model's context " +
                             std::to_string(m.config.max_positions) + " tokens");
}

void print_metrics(const RoutingTable& r, const AttentionStats& st) {
  std::fprintf(stderr, "routing: Omega_MSR %.3f | Omega_ESR %.3f | attention FLOPs %.3f of full\n", r.msr(), st.esr(),
               st.flops_ratio());
}

void set_threads(int t) {
  if (t > 0) omp_set_num_threads(t);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"elastic: long-context LLM inference with Elastic Attention"};
  app.require_subcommand(1);

  // tokenize
  auto* tok = app.add_subcommand("tokenize", "Print the token ids of a text as a JSON array");
  std::string tok_path, tok_file, tok_text;
  tok->add_option("--tokenizer", tok_path, "Path to tokenizer.json")->required();
  tok->add_option("--file", tok_file, "Read the text from this file");
  tok->add_option("text", tok_text, "Text to tokenize");

  // logits
  auto* lg = app.add_subcommand("logits", "Write float32 logits [T, vocab] for int32 token ids");
  std::string lg_model, lg_ids, lg_out;
  int lg_threads = 0;
  lg->add_option("-m,--model", lg_model, "Hugging Face model folder")->required();
  lg->add_option("--ids", lg_ids, "1-D int32 .npy of token ids")->required();
  lg->add_option("-o,--output", lg_out, "Output .npy")->required();
  lg->add_option("-t,--threads", lg_threads, "CPU threads")->check(CLI::NonNegativeNumber);
  std::string lg_routing, lg_mode;
  int lg_chunk = kDefaultPrefillChunk;
  lg->add_option("--chunk", lg_chunk, "Prefill chunk size in tokens")->check(CLI::PositiveNumber);
  lg->add_option("--routing", lg_routing, "Routing JSON: mode per layer per KV head plus sparse settings");
  lg->add_option("--mode", lg_mode, "Route every head to one mode")->check(CLI::IsMember({"full", "ssa", "xattn"}));

  // generate
  auto* gen = app.add_subcommand("generate", "Generate a continuation of a prompt");
  std::string g_model, g_prompt, g_ids, g_tok;
  int g_n = 32, g_ctx = 0, g_threads = 0, g_topk = 0;
  float g_temp = 0.f, g_topp = 1.f;
  uint64_t g_seed = 0;
  bool g_print_ids = false, g_ignore_eos = false;
  gen->add_option("-m,--model", g_model, "Hugging Face model folder")->required();
  auto* opt_p = gen->add_option("-p,--prompt", g_prompt, "Prompt text");
  auto* opt_ids = gen->add_option("--ids", g_ids, "Prompt as a 1-D int32 .npy of token ids");
  opt_p->excludes(opt_ids);
  gen->add_option("--tokenizer", g_tok, "tokenizer.json (default: the model folder's)");
  gen->add_option("-n,--n-predict", g_n, "Tokens to generate")->check(CLI::NonNegativeNumber);
  gen->add_option("-c,--ctx-size", g_ctx, "Context size (default: prompt + n)")->check(CLI::NonNegativeNumber);
  gen->add_option("-t,--threads", g_threads, "CPU threads")->check(CLI::NonNegativeNumber);
  gen->add_option("--temp", g_temp, "Temperature (0 = greedy)")->check(CLI::NonNegativeNumber);
  gen->add_option("--top-k", g_topk, "Top-k (0 = off)")->check(CLI::NonNegativeNumber);
  gen->add_option("--top-p", g_topp, "Top-p (1 = off)")->check(CLI::Range(0.0f, 1.0f));
  gen->add_option("--seed", g_seed, "Sampling seed");
  gen->add_flag("--print-ids", g_print_ids, "Print the new ids as a JSON array instead of text");
  gen->add_flag("--ignore-eos", g_ignore_eos, "Do not stop at end-of-sequence tokens");
  std::string g_routing, g_mode;
  int g_chunk = kDefaultPrefillChunk;
  gen->add_option("--chunk", g_chunk, "Prefill chunk size in tokens")->check(CLI::PositiveNumber);
  gen->add_option("--routing", g_routing, "Routing JSON: mode per layer per KV head plus sparse settings");
  gen->add_option("--mode", g_mode, "Route every head to one mode")->check(CLI::IsMember({"full", "ssa", "xattn"}));

  // probe
  auto* pr = app.add_subcommand("probe", "Measure retrieval scores per (layer, KV head) with needle-in-a-haystack prompts");
  std::string pr_model, pr_hay, pr_out = "heads.json", pr_svg, pr_tok;
  ProbeOptions po;
  int pr_threads = 0;
  pr->add_option("-m,--model", pr_model, "Hugging Face model folder")->required();
  pr->add_option("--haystack", pr_hay, "Haystack text file (default: built-in filler)");
  pr->add_option("--tokenizer", pr_tok, "tokenizer.json (default: the model folder's; random ids when absent)");
  pr->add_option("-c,--ctx-size", po.context, "Prompt length in tokens")->check(CLI::PositiveNumber);
  pr->add_option("--depths", po.n_depths, "Needle depths")->check(CLI::PositiveNumber);
  pr->add_option("--needles", po.n_needles_per_depth, "Prompts per depth")->check(CLI::PositiveNumber);
  pr->add_option("--seed", po.seed, "Seed");
  pr->add_option("-t,--threads", pr_threads, "CPU threads")->check(CLI::NonNegativeNumber);
  pr->add_option("-o,--output", pr_out, "Scores JSON");
  pr->add_option("--svg", pr_svg, "Heat map SVG (default: output with .svg)");

  // route static
  auto* rt = app.add_subcommand("route", "Build routing files");
  rt->require_subcommand(1);
  auto* rts = rt->add_subcommand("static", "DuoAttention-style baseline: keep the top-scoring heads full");
  std::string rt_scores, rt_out = "routing.json", rt_mode = "ssa";
  double rt_sparsity = 0.7;
  SparseSettings rt_sparse;
  rts->add_option("--scores", rt_scores, "heads.json from elastic probe")->required();
  rts->add_option("--sparsity", rt_sparsity, "Target Omega_MSR in [0, 1]")->check(CLI::Range(0.0, 1.0));
  rts->add_option("--sparse-mode", rt_mode, "Mode of the sparse heads")->check(CLI::IsMember({"ssa", "xattn"}));
  rts->add_option("--block", rt_sparse.block, "Block size (64 or 128)");
  rts->add_option("--sink", rt_sparse.sink, "Streaming sink tokens");
  rts->add_option("--local", rt_sparse.local, "Streaming local window tokens");
  rts->add_option("-o,--output", rt_out, "Routing JSON");

  CLI11_PARSE(app, argc, argv);

  try {
    if (*tok) {
      const bool has_text = tok->count("text") > 0, has_file = !tok_file.empty();
      if (has_text == has_file) throw std::runtime_error("tokenize: give exactly one of --file F or TEXT");
      Tokenizer t = Tokenizer::from_file(tok_path);
      std::string text = tok_file.empty() ? tok_text : read_text_file(tok_file);
      std::cout << ids_json(t.encode(text)) << "\n";
    } else if (*lg) {
      set_threads(lg_threads);
      std::vector<int32_t> ids = read_npy_ids(lg_ids);
      if (ids.empty()) throw std::runtime_error(lg_ids + ": no token ids");
      Model m = Model::load(lg_model);
      apply_routing(m, lg_routing, lg_mode);
      KVCache cache;
      cache.init(m.config, static_cast<int>(ids.size()));
      std::vector<float> logits;
      AttentionStats st;
      m.prefill(ids.data(), static_cast<int>(ids.size()), lg_chunk, cache, logits, true, &st);
      print_metrics(m.routing, st);
      write_npy_f32(lg_out, logits.data(), {static_cast<int64_t>(ids.size()), m.config.vocab});
    } else if (*gen) {
      set_threads(g_threads);
      if (g_prompt.empty() && g_ids.empty()) throw std::runtime_error("generate: give -p TEXT or --ids IDS.npy");
      Model m = Model::load(g_model);
      apply_routing(m, g_routing, g_mode);
      std::unique_ptr<Tokenizer> t;
      std::vector<int32_t> prompt;
      if (!g_ids.empty()) {
        prompt = read_npy_ids(g_ids);
      } else {
        t = std::make_unique<Tokenizer>(Tokenizer::from_file(tokenizer_path_for(g_model, g_tok)));
        prompt = t->encode(g_prompt);
      }
      if (!g_print_ids && !t && fs::exists(fs::path(g_model) / "tokenizer.json"))
        t = std::make_unique<Tokenizer>(Tokenizer::from_file(tokenizer_path_for(g_model, g_tok)));
      SamplerParams sp{g_temp, g_topk, g_topp, g_seed};
      GenerateStats st;
      auto stream = [&](int32_t id) {
        if (!g_print_ids && t) { std::cout << t->decode({id}) << std::flush; }
      };
      std::vector<int32_t> out = generate(m, prompt, g_n, g_ctx, sp, !g_ignore_eos, &st, stream, g_chunk);
      if (g_print_ids || !t) std::cout << ids_json(out);
      std::cout << std::endl;
      std::fprintf(stderr, "prompt: %d tokens in %.3f s (%.1f tok/s) | decode: %d tokens in %.3f s (%.1f tok/s)\n",
                   st.prompt_tokens, st.prefill_s, st.prompt_tokens / std::max(st.prefill_s, 1e-9), st.new_tokens,
                   st.decode_s, st.new_tokens > 1 ? (st.new_tokens - 1) / std::max(st.decode_s, 1e-9) : 0.0);
      print_metrics(m.routing, st.attn);
      std::fprintf(stderr, "kv cache: %.2f MiB\n", st.kv_bytes / 1048576.0);
    } else if (*pr) {
      set_threads(pr_threads);
      po.haystack_file = pr_hay;
      Model m = Model::load(pr_model);
      std::unique_ptr<Tokenizer> t;
      if (!pr_tok.empty() || fs::exists(fs::path(pr_model) / "tokenizer.json"))
        t = std::make_unique<Tokenizer>(Tokenizer::from_file(tokenizer_path_for(pr_model, pr_tok)));
      else
        std::fprintf(stderr, "probe: no tokenizer.json in %s: using random token ids for haystack and needle\n", pr_model.c_str());
      auto t0 = std::chrono::steady_clock::now();
      HeadScores hs = probe_retrieval_heads(m, t.get(), po, [&](int done, int total) {
        double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        double rate = done / std::max(el, 1e-9);
        std::fprintf(stderr, "\rprobe %d/%d prompts | %.2f prompts/s | eta %.0fs   ", done, total, rate,
                     (total - done) / std::max(rate, 1e-9));
      });
      std::fprintf(stderr, "\n");
      save_head_scores(hs, pr_out);
      std::string svg = pr_svg.empty() ? fs::path(pr_out).replace_extension(".svg").string() : pr_svg;
      write_heatmap_svg(svg, hs.score, hs.n_layers, hs.n_kv_heads, "Retrieval score per (layer, KV head)", "layer",
                        "KV head");
      std::fprintf(stderr, "wrote %s and %s (%d prompts)\n", pr_out.c_str(), svg.c_str(), hs.prompts);
    } else if (*rts) {
      HeadScores hs = load_head_scores(rt_scores);
      RoutingTable r = static_routing(hs, rt_sparsity, parse_head_mode(rt_mode));
      rt_sparse.xattn.block = rt_sparse.block;
      validate_sparse(rt_sparse, "route static");
      r.sparse = rt_sparse;
      save_routing(r, rt_out);
      std::fprintf(stderr, "wrote %s: %d of %d KV heads full, Omega_MSR %.3f\n", rt_out.c_str(),
                   static_cast<int>(std::count(r.mode.begin(), r.mode.end(), HeadMode::Full)),
                   static_cast<int>(r.mode.size()), r.msr());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
