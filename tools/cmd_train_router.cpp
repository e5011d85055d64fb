// elastic train-router: train the Elastic Attention router of a frozen model on task-labelled data.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "cli_common.h"
#include "rank_launcher.h"
#include "elastic/tokenizer.h"
#include "elastic/train.h"
#ifdef ELASTIC_HAVE_CUDA
#include "elastic/gpu_model.h"
#include "elastic/cuda.h"
#include "elastic/gpu_train.h"
#include "elastic/nccl_comm.h"
#endif

namespace fs = std::filesystem;

namespace elastic::cli {

void add_train_router_command(CLI::App& app, Commands& cmds) {
  struct Opts {
    std::string model, tok, out = "router.safetensors", log = "train_log.jsonl", plots, sparse_mode, config, haystack,
        device = "cpu";
    std::vector<std::string> data;
    std::vector<std::string> targets;  // class=value overrides
    int threads = 0, builtin_samples = 240, gpus = 1;
    std::vector<int> builtin_len;  // empty: max-len - 64
    TrainOptions to;
    bool sigmoid = false, no_chat = false;
    std::string input = "pooled";
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("train-router", "Train the router of a frozen model on task-labelled data");
  add_model_option(sub, o->model);
  sub->add_option("--data", o->data, "JSONL training data (repeatable); default: the built-in task mix");
  sub->add_option("--tokenizer", o->tok, "tokenizer.json (default: the model folder's; none = ids only)");
  sub->add_option("--builtin-samples", o->builtin_samples, "Samples of the built-in mix")
      ->check(in_range(1, 1000000));
  sub->add_option("--builtin-len", o->builtin_len,
                  "Prompt tokens of built-in samples, a comma list for several lengths (default: max-len - 64)")
      ->delimiter(',')
      ->check(in_range(1, kMaxTokens));
  sub->add_option("--haystack", o->haystack, "Text file for the built-in tasks' haystacks");
  sub->add_option("--steps", o->to.steps, "Optimizer steps")->check(in_range(1, 10000000));
  sub->add_option("--batch", o->to.batch, "Samples per step")->check(in_range(1, 100000));
  sub->add_option("--max-len", o->to.max_len, "Tokens per training sequence")->check(in_range(16, 1 << 20));
  sub->add_option("--lr", o->to.lr, "Router learning rate")->check(positive_up_to(10));
  sub->add_option("--multiplier-lr", o->to.multiplier_lr, "Lagrange multiplier learning rate")
      ->check(positive_up_to(10));
  sub->add_option("--warmup", o->to.warmup, "Warmup fraction of the steps")->check(in_range(0, 1));
  sub->add_option("--tau-schedule", o->to.tau_schedule, "Temperature schedule")->check(CLI::IsMember({"cosine", "exp"}));
  sub->add_option("--target", o->targets, "Target Omega of a task class, e.g. qa=0.7 (repeatable)");
  sub->add_flag("--no-chat", o->no_chat, "Built-in mix: do not apply the model's chat template (eval applies it)");
  sub->add_flag("--sigmoid", o->sigmoid, "Gumbel-sigmoid gate (1 logit) instead of the 2-class softmax");
  // The learned-static control: the same trainer, data and loss with a constant router input (docs/RESULTS.md).
  sub->add_option("--router-input", o->input,
                  "pooled (default: the prompt's pooled keys) or head-identity (learned-static control: one fixed "
                  "input per head, so the router learns a fixed routing)")
      ->check(CLI::IsMember({"pooled", "head-identity"}));
  // The paper's configurations (dense class -> sparse class); --sparse-mode xattn is the older spelling of fa-xa.
  sub->add_option("--config", o->config, "fa-ssa (default), fa-xa or xa-ssa: what the router's two classes run")
      ->check(CLI::IsMember({"fa-ssa", "fa-xa", "xa-ssa"}));
  sub->add_option("--sparse-mode", o->sparse_mode, "What sparse heads run (ssa or xattn; dense heads full)")
      ->check(CLI::IsMember({"ssa", "xattn"}));
  add_sparse_options(sub, o->to.spec.sparse);
  sub->add_option("--pool", o->to.spec.pool_first, "Boundary pooling: first and last N prompt tokens")
      ->check(in_range(1, kMaxTokens));
  sub->add_option("--seed", o->to.seed, "Seed (init, data order, gate noise)")->check(seed_check());
  add_threads_option(sub, o->threads);
  sub->add_option("--device", o->device, "cpu, or cuda (the bf16 GPU backbone; same data, schedule and logs)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--gpus", o->gpus,
                  "Data parallel over N GPUs of this host: one process per GPU, gradients summed with NCCL "
                  "(libnccl.so.2 loaded at run time); --batch is the global batch")
      ->check(in_range(1, 64));
  sub->add_option("-o,--output", o->out, "Router file (.safetensors)");
  sub->add_option("--log", o->log, "Per-step JSONL log");
  sub->add_option("--plots", o->plots, "Plot prefix (default: the log path without extension)");
  cmds.push_back({sub, [o] {
    resolve_model(o->model, "train-router");
    set_threads(o->threads);
    // --gpus N: this process either launches the N ranks and waits, or is one of them.
    const RankEnv env = rank_env();
    if (o->gpus > 1) {
      if (o->device != "cuda") throw std::runtime_error("train-router: --gpus needs --device cuda");
      if (env.rank < 0) {
#ifdef ELASTIC_HAVE_CUDA
        const int have = cuda::device_count();
        if (have < o->gpus)
          throw std::runtime_error("train-router: --gpus " + std::to_string(o->gpus) + " but this machine has " +
                                   std::to_string(have) + " CUDA device(s)");
#else
        no_cuda_backend("train-router", "--gpus");
#endif
        std::fprintf(stderr, "train-router: launching %d ranks (one per GPU)\n", o->gpus);
        launch_ranks(o->gpus);
        std::fprintf(stderr, "train-router: all %d ranks finished; rank 0 wrote %s\n", o->gpus, o->out.c_str());
        return;
      }
      if (env.world != o->gpus)
        throw std::runtime_error("train-router: ELASTIC_WORLD " + std::to_string(env.world) + " differs from --gpus " +
                                 std::to_string(o->gpus));
    }
    const int rank = o->gpus > 1 ? env.rank : 0;
    TrainOptions to = o->to;
    to.spec.pool_last = to.spec.pool_first;
    to.spec.sigmoid = o->sigmoid;
    to.spec.input = parse_router_input(o->input);
    if (!o->log.empty() && fs::path(o->log).lexically_normal() == fs::path(o->out).lexically_normal())
      throw std::runtime_error("train-router: -o and --log are both " + o->out + ": the router would replace the log");
    if (!o->config.empty() && !o->sparse_mode.empty())
      throw std::runtime_error("train-router: give --config or --sparse-mode, not both");
    parse_router_config(!o->config.empty() ? o->config : o->sparse_mode == "xattn" ? "fa-xa" : "fa-ssa",
                        to.spec.dense_mode, to.spec.sparse_mode);
    to.spec.sparse.xattn.block = to.spec.sparse.block;
    to.log_jsonl = o->log;
    std::vector<std::string> target_classes;  // the classes --target names, for the check against the data below
    for (const std::string& kv : o->targets) {
      const size_t eq = kv.find('=');
      if (eq == std::string::npos) throw std::runtime_error("--target '" + kv + "': expected CLASS=VALUE");
      // The whole value, as a number in [0, 1]: "0.5x" is refused, and so is "nan" (NaN fails every comparison).
      const std::string text = kv.substr(eq + 1);
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (text.empty() || *end) throw std::runtime_error("--target '" + kv + "': the value is not a number");
      if (!(v >= 0 && v <= 1)) throw std::runtime_error("--target '" + kv + "': the value must be in [0, 1]");
      target_classes.push_back(kv.substr(0, eq));
      to.targets[target_classes.back()] = v;
    }
    Model m = Model::load(o->model);
    m.weights.widen();  // the CPU trainer's backward reads fp32 rows; the GPU upload widens to bf16 either way
    // Before any data is built: a --max-len the CPU trainer cannot hold is an error naming the length that fits, not
    // minutes of data generation and then a bad_alloc or the OOM killer.
    if (o->device == "cpu") {
      const std::string err = cpu_train_memory_error(m.config, to.max_len, available_memory_bytes());
      if (!err.empty()) throw std::runtime_error(err);
    }
    // The device first: a missing GPU or an unsupported shape fails before data is built.
    StepRunnerFactory runner;  // empty: the CPU
    std::unique_ptr<Communicator> comm;
#ifdef ELASTIC_HAVE_CUDA
    std::unique_ptr<cuda::GpuModel> gpu;
#endif
    if (o->device == "cuda") {
#ifdef ELASTIC_HAVE_CUDA
      cuda::GpuOptions go;
      go.max_ctx = 64;  // the inference buffers stay small: the trainer sizes its own for --max-len
      go.graphs = false;
      go.device = rank;  // rank r trains on GPU r
      gpu = cuda::GpuModel::upload(m, go);
      runner = cuda::gpu_step_runner_factory(*gpu, to.max_len, rank == 0);
      if (o->gpus > 1) comm = cuda::nccl_communicator(rank, o->gpus, env.rendezvous);
#else
      no_cuda_backend("train-router");
#endif
    }
    std::unique_ptr<Tokenizer> tok = load_model_tokenizer(o->model, o->tok);
    // Past the model's positions RoPE runs on angles the model never saw: allowed (the tiny test models train past
    // their 128), but said, since generate and serve refuse such a context.
    if (m.config.max_positions > 0 && to.max_len > m.config.max_positions)
      std::fprintf(stderr, "warning: train-router: --max-len %d is more than the model's %d positions\n", to.max_len,
                   m.config.max_positions);
    std::vector<TrainExample> data;
    if (o->data.empty()) {
      const std::vector<int> lens = o->builtin_len.empty() ? std::vector<int>{std::max(16, to.max_len - 64)}
                                                           : o->builtin_len;
      std::string lens_s;
      for (int L : lens) {
        if (L + 16 > to.max_len)
          throw std::invalid_argument("train-router: --builtin-len " + std::to_string(L) +
                                      " leaves no room for the answer in --max-len " + std::to_string(to.max_len) +
                                      " (needs at least 16 tokens more)");
        lens_s += (lens_s.empty() ? "" : ",") + std::to_string(L);
      }
      std::fprintf(stderr, "train-router: built-in mix, %d samples of %s prompt tokens%s\n", o->builtin_samples,
                   lens_s.c_str(), tok ? "" : " (random-id mode: the model has no tokenizer)");
      // The router must see prompts as eval and serve format them: through the model's chat template.
      const ChatFormat chat = model_chat_format(o->model, tok != nullptr, o->no_chat, "train-router");
      data = builtin_train_mix(tok.get(), m.config.vocab, o->builtin_samples, lens, to.seed, o->haystack, chat);
    }
    for (const std::string& path : o->data) {
      DataReport rep;
      auto part = load_train_jsonl(path, tok.get(), to.targets, {}, &rep, m.config.vocab);
      for (const std::string& p : rep.problems) std::fprintf(stderr, "warning: skipped %s\n", p.c_str());
      std::fprintf(stderr, "train-router: %s: %d of %d lines used\n", path.c_str(), rep.used, rep.lines);
      data.insert(data.end(), part.begin(), part.end());
    }
    // A --target for a class no sample has (a typo such as "retreival") would change nothing: say so.
    for (const std::string& cls : target_classes)
      if (std::none_of(data.begin(), data.end(), [&](const TrainExample& e) { return e.task_class == cls; }))
        std::fprintf(stderr, "warning: train-router: --target %s=%g: no training sample has the class '%s'\n",
                     cls.c_str(), to.targets[cls], cls.c_str());
    if (rank == 0) {
      const std::string same = identical_classes_warning(to.spec, to.max_len);
      if (!same.empty()) std::fprintf(stderr, "%s\n", same.c_str());
    }
    std::vector<StepLog> logs;
    bool warned = false;
    Router r = train_router(
        m, data, to,
        [&](const StepLog& s) {
          logs.push_back(s);
          std::fprintf(stderr, "%s\n", format_step_line(s, to.steps).c_str());
          const std::string w = warned ? "" : saturation_warning(s, to.steps, to.lr);
          if (!w.empty()) std::fprintf(stderr, "%s\n", w.c_str()), warned = true;
        },
        runner, comm.get());
    if (rank != 0) return;  // rank 0 writes the router, the log and the plots
    r.save(o->out);
    const std::string prefix = o->plots.empty() ? fs::path(o->log).replace_extension("").string() : o->plots;
    write_training_plots(logs, prefix);
    std::fprintf(stderr, "wrote %s, %s and %s_{loss,sparsity}.svg\n", o->out.c_str(), o->log.c_str(), prefix.c_str());
  }});
}

}  // namespace elastic::cli
