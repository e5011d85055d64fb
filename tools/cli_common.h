#pragma once
// Shared pieces of the `elastic` subcommands. Each tools/cmd_*.cpp registers one subcommand with add_*_command and
// hands back the function that runs it; tools/elastic.cpp only dispatches.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "elastic/attention.h"
#include "elastic/model.h"
#include "elastic/route_policy.h"
#include "elastic/tokenizer.h"

namespace elastic::cli {

struct Command {
  CLI::App* app = nullptr;
  std::function<void()> run;  // throws std::exception with a message naming the problem
};
using Commands = std::vector<Command>;

void add_tokenize_command(CLI::App& app, Commands& cmds);
void add_logits_command(CLI::App& app, Commands& cmds);
void add_generate_command(CLI::App& app, Commands& cmds);
void add_probe_command(CLI::App& app, Commands& cmds);
void add_route_command(CLI::App& app, Commands& cmds);
void add_train_router_command(CLI::App& app, Commands& cmds);
void add_eval_command(CLI::App& app, Commands& cmds);
void add_serve_command(CLI::App& app, Commands& cmds);
void add_bench_command(CLI::App& app, Commands& cmds);
void add_plot_command(CLI::App& app, Commands& cmds);

// Range checks for numeric flags, one per option: `->check(in_range(0, 1))`. CLI11's own Range and PositiveNumber let
// NaN through (every comparison with NaN is false) and accept 1e308; these take only finite values in [lo, hi], and
// CLI11 puts the flag in front of the message ("--temp: nan is not a finite number in [0, 100]").
CLI::Validator in_range(double lo, double hi);
// (0, hi]: learning rates and other values that must be strictly positive.
CLI::Validator positive_up_to(double hi);
// A seed: decimal digits only, at most 2^64 - 1. Into a uint64_t CLI11 wraps "-2" to 2^64 - 2 and saturates
// 99999999999999999999999 to 2^64 - 1 (the same run as --seed -1).
CLI::Validator seed_check();

// Upper bounds shared by the subcommands. Token counts (contexts, prompt lengths, chunks) stop at 16M, far beyond any
// model we run, so sizes computed from them (counts x head_dim x layers) stay far from int overflow.
constexpr int kMaxTokens = 1 << 24;
// -t: 0 (OpenMP's default: one thread per core) or 1..1024. libgomp crashes creating 100000 threads; no machine we run
// on has more than 1024 cores.
constexpr int kMaxThreads = 1024;
void add_threads_option(CLI::App* sub, int& threads);
// -m/--model: a Hugging Face folder or a .gguf file. Optional: without it a command runs the default model, the file
// scripts/setup.sh fetches (kDefaultModel), and resolve_model says so.
constexpr const char* kDefaultModel = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
void add_model_option(CLI::App* sub, std::string& model);
// Fills an empty `model` with the default model, looked up under the working folder and then beside the build folder
// of this executable (<repo>/build/elastic -> <repo>/models); prints "<cmd>: no -m given: ..." on stderr. Throws,
// naming the fetch script, when it is not there.
void resolve_model(std::string& model, const char* cmd);
// --block / --sink / --local of the sparse heads (the limits of validate_sparse).
void add_sparse_options(CLI::App* sub, SparseSettings& s, const std::string& what = "");

std::string ids_json(const std::vector<int32_t>& ids);
// A file beside a Markdown report: `md_path` without a trailing ".md", then `suffix` ("report.md", "_x.svg" ->
// "report_x.svg"; a path without ".md" keeps its whole name).
std::string beside_markdown(const std::string& md_path, const std::string& suffix);
// The tokenizer of model_tokenizer_path (the override, a GGUF file itself, or the folder's tokenizer.json), looked up
// once; null when there is none, or a throw naming the model when `required`.
std::unique_ptr<Tokenizer> load_model_tokenizer(const std::string& model, const std::string& override_path,
                                                bool required = false);
// --routing FILE, --mode full|ssa|xattn (all heads one mode) or --router R (routes each prompt); at most one.
// The run's routing policy (all heads full when none is given).
RoutePolicy route_policy(const ModelConfig& c, const std::string& routing_file, const std::string& mode,
                         const std::string& router = "");
// --routing / --mode / --router (and --chunk, the prefill chunk size) on a subcommand.
void add_routing_options(CLI::App* sub, std::string& routing, std::string& mode, std::string& router, int& chunk);
// The run's routing figures, the same on both devices: Omega_MSR, Omega_ESR and attention FLOPs from `st`, and the KV
// positions the routing keeps at the run's final length n_pos against all-full (kept_kv_positions).
void print_metrics(const RoutingTable& r, const AttentionStats& st, int n_pos);
// The model's chat template as a prompt formatter (what eval applies to task prompts and train-router to its built-in
// mix); empty when there is no tokenizer, --no-chat is given, or the template is not a known family. `who` prefixes
// the note printed on stderr.
std::function<std::string(const std::string&)> model_chat_format(const std::string& model, bool have_tokenizer,
                                                                 bool no_chat, const char* who,
                                                                 const char* off_hint = "--no-chat");
void set_threads(int t);

// Memory the kernel says a new allocation can get without swapping (MemAvailable in /proc/meminfo), in bytes; 0 when
// it cannot be read (then callers skip their check).
size_t available_memory_bytes();
// What every subcommand says when given a CUDA flag (`flag`: "--device cuda", "--gpus") in a build without the CUDA
// backend (configured with ELASTIC_CUDA=OFF, or where CMake found no nvcc).
[[noreturn]] void no_cuda_backend(const char* cmd, const char* flag = "--device cuda");

}  // namespace elastic::cli
