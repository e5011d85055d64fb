#pragma once
// Router training on the CPU: data (JSONL or the built-in task mix), the loop (Gumbel straight-through gates,
// temperature annealing, LM loss + per-task-class Lagrangian with multipliers trained by gradient ascent), AdamW with
// warmup + cosine decay, logs (a line per step, JSONL) and curve plots.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "elastic/comm.h"
#include "elastic/model.h"
#include "elastic/router.h"
#include "elastic/tasks.h"
#include "elastic/tokenizer.h"

namespace elastic {
namespace train {
class StepRunner;  // src/train/router_step.h: one sequence's forward + backward (CPU or GPU)
}

// Makes the runner of one training step for the router's current parameters (read at each forward). Empty: the CPU
// runner. elastic::cuda::gpu_step_runner_factory (include/elastic/gpu_train.h) gives the GPU one.
using StepRunnerFactory = std::function<std::unique_ptr<train::StepRunner>(const RouterSpec& spec, const float* params)>;

struct TrainExample {
  std::string task_class;              // "qa", "retrieval", "summarization", "code", ... (a key of the targets)
  std::vector<int32_t> input_ids;      // the prompt (the router pools its boundary)
  std::vector<int32_t> output_ids;     // the answer: the loss is on these tokens only
};

// Target Omega per task class: sparsity-sensitive classes 0.7, robust ones 1.0.
std::map<std::string, double> default_targets();

struct DataReport {
  int lines = 0, used = 0;
  std::vector<std::string> problems;  // "FILE:LINE: what is wrong" per skipped line
};

// JSONL, one sample per line: {"task": T, "input": "...", "output": "..."} or with "input_ids"/"output_ids" arrays.
// T is a task class of `targets`, or a task name mapped to one by `task_classes`. Bad lines are skipped and reported
// (file and line number); throws when no line is usable, or when text needs a tokenizer and tok is null.
// Token ids must lie in [0, vocab) (the model's vocabulary; 0 = the tokenizer's, or only int32 without one): an id
// outside it is a skipped line, not a wrapped id or a crash at the step that meets it.
std::vector<TrainExample> load_train_jsonl(const std::string& path, const Tokenizer* tok,
                                           const std::map<std::string, double>& targets,
                                           const std::map<std::string, std::string>& task_classes, DataReport* report,
                                           int32_t vocab = 0);

// The built-in mix, from the eval task generators: sensitive (needle retrieval, multi-key retrieval, QA over
// documents) and robust (summary recap, passage continuation, code continuation) samples of `tokens` prompt tokens.
// chat: the model's chat format (as `elastic eval` applies it), so the router trains on the prompts it will route.
// lengths: prompt tokens; sample i is task i % 6 at lengths[(i / 6) % lengths.size()], so every task appears at every
// length (a router trained at several lengths routes long prompts it would otherwise only extrapolate to).
std::vector<TrainExample> builtin_train_mix(const Tokenizer* tok, int32_t vocab, int n_samples,
                                            const std::vector<int>& lengths, uint64_t seed,
                                            const std::string& haystack_file = "", const ChatFormat& chat = {});

// Fits input + output into max_len tokens: the answer stays whole (cut to max_len / 2 if longer), the input loses
// tokens from its middle so both of its boundaries (what the router reads) stay.
void fit_to_length(TrainExample& e, int max_len);

struct TrainOptions {
  int steps = 300, batch = 4, max_len = 4096;
  double lr = 5e-4, multiplier_lr = 1e-3, warmup = 0.2;  // warmup fraction, then cosine decay to 0
  double beta1 = 0.9, beta2 = 0.95, weight_decay = 0.1, clip = 5.0;
  double tau_start = 1.5, tau_end = 1.0;
  std::string tau_schedule = "cosine";  // "cosine" over the first tau_fraction of steps, or "exp": max(end, start*e^-r p)
  double tau_fraction = 0.6, tau_rate = 0.6;
  bool hard = true;                     // straight-through hard routing
  RouterSpec spec;                      // shapes, pooling, gate variant, sparse mode and settings
  std::map<std::string, double> targets = default_targets();
  uint64_t seed = 0;
  std::string log_jsonl;                // one JSON object per step (empty = none)
};

struct StepLog {
  int step = 0;
  double lm = 0, reg = 0, tau = 0, lr = 0, tok_per_s = 0, eta_s = 0;
  // Share of the batch's gates whose FULL probability (noise included) lies in [0.05, 0.95]: the gates that still get
  // a straight-through gradient. Near 0 means the router has saturated and its routing is frozen.
  double open = 0;
  std::map<std::string, double> msr;                         // mean Omega per class in this batch
  std::map<std::string, std::pair<double, double>> lambdas;  // (l1, l2) per class
};

double tau_at(const TrainOptions& o, int step);  // step in [0, steps)
double lr_at(const TrainOptions& o, int step, double base);

// Trains a router for the frozen model; on_step sees every step's log (the CLI prints the line).
// runner: where each step runs (empty: the CPU); the same data, schedule, losses and logs either way.
// comm (data parallel; null = one rank): every rank draws the same batches and gate noise, runs the batch entries
// i with i % size == rank, and the ranks sum gradients, multiplier gradients and log sums before the identical
// update, so N ranks train the same router as one rank with the same global batch. Only rank 0 writes the log and
// calls on_step.
Router train_router(const Model& m, const std::vector<TrainExample>& data, const TrainOptions& o,
                    const std::function<void(const StepLog&)>& on_step = {}, const StepRunnerFactory& runner = {},
                    Communicator* comm = nullptr);
std::string format_step_line(const StepLog& s, int steps);
// A warning when the gates have saturated early: under 2% open gates in the first half of the steps (the routing is
// then frozen for the rest of the run; a lower learning rate keeps gates trainable). Empty otherwise.
std::string saturation_warning(const StepLog& s, int steps, double lr);
// A warning when the router's two classes would attend to the same positions on every training sequence (each class's
// block rule keeps every causal block up to max_len: e.g. FA-SSA with a streaming window that covers the sequence):
// both branches then give the same output, so the LM loss carries no signal about the routing and the gates follow
// the Omega targets alone. XAttention's blocks depend on the data, so a class running it never counts as covering.
// Empty otherwise.
std::string identical_classes_warning(const RouterSpec& spec, int max_len);

// Bytes the CPU trainer holds for one sequence of T tokens: each layer's input, kept for the backward, plus one
// layer's activations and gradients (the backward recomputes a layer at a time), as src/train/router_step.cpp sizes
// them. train-router compares max_len's figure with the memory available before it builds any data.
size_t cpu_train_bytes(const ModelConfig& c, int T);
// The error train-router gives when max_len's figure exceeds 90% of `available` bytes (naming the length that fits);
// empty when it fits or `available` is 0 (unknown).
std::string cpu_train_memory_error(const ModelConfig& c, int max_len, size_t available);

// Writes the curves of a training log (lm loss, regularizer, Omega per class, tau) as SVG line charts:
// <prefix>_loss.svg and <prefix>_sparsity.svg.
void write_training_plots(const std::vector<StepLog>& logs, const std::string& prefix);

}  // namespace elastic
