// The router training loop: per step a batch of samples, each run forward and backward through the frozen model with
// the router's straight-through gates; LM loss + per-task-class Lagrangian; AdamW on the router, gradient ascent on
// the multipliers; temperature and learning-rate schedules; a log line and a JSONL record per step.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "elastic/json_file.h"
#include "elastic/output_file.h"
#include "elastic/plot_svg.h"
#include "elastic/sparse_pattern.h"
#include "elastic/train.h"
#include "train/adamw.h"
#include "train/router_step.h"

namespace elastic {

double tau_at(const TrainOptions& o, int step) {
  const double p = o.steps > 1 ? static_cast<double>(step) / (o.steps - 1) : 1.0;
  if (o.tau_schedule == "exp") return std::max(o.tau_end, o.tau_start * std::exp(-o.tau_rate * p));
  if (o.tau_schedule != "cosine") throw std::invalid_argument("unknown temperature schedule '" + o.tau_schedule + "'");
  if (p >= o.tau_fraction) return o.tau_end;
  return o.tau_end + (o.tau_start - o.tau_end) * 0.5 * (1.0 + std::cos(M_PI * p / o.tau_fraction));
}

double lr_at(const TrainOptions& o, int step, double base) {
  const int warm = static_cast<int>(std::ceil(o.warmup * o.steps));
  if (step < warm) return base * (step + 1) / warm;
  const double p = o.steps > warm ? static_cast<double>(step - warm) / (o.steps - warm) : 1.0;
  return base * 0.5 * (1.0 + std::cos(M_PI * p));
}

std::string format_step_line(const StepLog& s, int steps) {
  char buf[256];
  std::string line = "step " + std::to_string(s.step) + "/" + std::to_string(steps);
  std::snprintf(buf, sizeof buf, " | lm %.3f | reg %.3f | open %.2f |", s.lm, s.reg, s.open);
  line += buf;
  for (auto& [c, v] : s.msr) {
    std::snprintf(buf, sizeof buf, " msr[%s] %.2f", c.c_str(), v);
    line += buf;
  }
  const double eta = s.eta_s;
  if (eta >= 120) std::snprintf(buf, sizeof buf, " | tau %.2f | %.0f tok/s | eta %.0fm", s.tau, s.tok_per_s, eta / 60);
  else std::snprintf(buf, sizeof buf, " | tau %.2f | %.0f tok/s | eta %.0fs", s.tau, s.tok_per_s, eta);
  return line + buf;
}

std::string saturation_warning(const StepLog& s, int steps, double lr) {
  if (s.open >= 0.02 || 2 * s.step > steps) return "";
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "warning: step %d of %d: only %.1f%% of the gates are still open (FULL probability in [0.05, 0.95]); "
                "the routing is freezing early. A lower --lr (now %g) keeps the gates trainable longer.",
                s.step, steps, 100.0 * s.open, lr);
  return buf;
}

namespace {
// Does `mode`'s block rule, without data, keep every causal block of a max_len sequence? The pattern's own prefill
// figure says: no block skipped. XAttention's figure is NaN (its blocks depend on the data), which never equals 0.
bool keeps_every_block(HeadMode mode, const SparseSettings& s, int max_len) {
  return pattern_prefill_cost(mode, max_len, s).blocks_skipped == 0;
}
}  // namespace

std::string identical_classes_warning(const RouterSpec& spec, int max_len) {
  if (max_len <= 0 || spec.sparse.block <= 0) return "";
  if (!keeps_every_block(spec.dense_mode, spec.sparse, max_len) ||
      !keeps_every_block(spec.sparse_mode, spec.sparse, max_len))
    return "";
  return "warning: train-router: at --max-len " + std::to_string(max_len) + " both classes attend to every position (" +
         router_config_name(spec.dense_mode, spec.sparse_mode) + " with --sink " + std::to_string(spec.sparse.sink) +
         " --local " + std::to_string(spec.sparse.local) +
         "), so they give the same output and the LM loss teaches the router nothing: the gates will follow the "
         "Omega targets alone. Use a window shorter than the sequences (e.g. --local 256) or longer sequences.";
}

Router train_router(const Model& m, const std::vector<TrainExample>& data_in, const TrainOptions& o,
                    const std::function<void(const StepLog&)>& on_step, const StepRunnerFactory& runner,
                    Communicator* comm) {
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;
  if (data_in.empty()) throw std::invalid_argument("train-router: no training samples");
  if (o.steps <= 0 || o.batch <= 0) throw std::invalid_argument("train-router: steps and batch must be positive");
  const ModelConfig& c = m.config;
  RouterSpec spec = o.spec;
  spec.n_layers = c.n_layers;
  spec.n_kv_heads = c.n_kv_heads;
  spec.head_dim = c.head_dim;
  spec.base_model = model_fingerprint(c);
  spec.targets = o.targets;
  (void)router_config_name(spec.dense_mode, spec.sparse_mode);  // fa-ssa, fa-xa or xa-ssa, else a named error
  validate_sparse(spec.sparse, "train-router");
  validate_router_spec(spec, "train-router");
  Router router = Router::init(spec, o.seed);

  // Classes, their targets and the data fitted to the training length.
  std::vector<std::string> classes;
  std::vector<TrainExample> data = data_in;
  std::vector<int> cls_of(data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    auto t = o.targets.find(data[i].task_class);
    if (t == o.targets.end()) throw std::invalid_argument("train-router: task class '" + data[i].task_class + "' has no target");
    auto it = std::find(classes.begin(), classes.end(), data[i].task_class);
    cls_of[i] = static_cast<int>(it - classes.begin());
    if (it == classes.end()) classes.push_back(data[i].task_class);
    fit_to_length(data[i], o.max_len);
  }
  const int K = static_cast<int>(classes.size());
  std::vector<float> lambdas(2 * K, 0.f);  // (l1, l2) per class
  train::AdamW opt;
  opt.beta1 = o.beta1, opt.beta2 = o.beta2, opt.weight_decay = o.weight_decay;
  train::AdamW opt_mult;
  opt_mult.beta1 = o.beta1, opt_mult.beta2 = o.beta2, opt_mult.maximize = true;

  // One line per step, written as it ends (a killed run keeps its log); every write is checked, so a full disk
  // stops the run instead of leaving a silently truncated log.
  std::unique_ptr<OutputFile> jl;
  if (!o.log_jsonl.empty() && rank == 0) jl = std::make_unique<OutputFile>(o.log_jsonl, "training log");
  std::mt19937_64 rng(o.seed ^ 0x9e3779b97f4a7c15ULL);
  std::vector<size_t> order(data.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  size_t cursor = 0;
  std::uniform_real_distribution<double> unif(1e-9, 1.0 - 1e-9);
  const size_t P = router.params.size(), nh = static_cast<size_t>(c.n_layers) * c.n_kv_heads;
  std::vector<float> grad_f(P);
  std::vector<double> grad(P), noise(nh);
  const auto t_start = std::chrono::steady_clock::now();
  double tokens_done = 0;  // every rank's tokens so far

  for (int step = 0; step < o.steps; ++step) {
    std::vector<size_t> batch;
    for (int b = 0; b < o.batch; ++b) {
      if (cursor == order.size()) {
        std::shuffle(order.begin(), order.end(), rng);
        cursor = 0;
      }
      batch.push_back(order[cursor++]);
    }
    std::vector<int> n_in_class(K, 0);
    for (size_t i : batch) ++n_in_class[cls_of[i]];
    const int present = static_cast<int>(std::count_if(n_in_class.begin(), n_in_class.end(), [](int n) { return n > 0; }));
    StepLog log;
    log.step = step + 1;
    log.tau = tau_at(o, step);
    log.lr = lr_at(o, step, o.lr);
    std::fill(grad_f.begin(), grad_f.end(), 0.f);
    std::vector<double> dlam(2 * K, 0.0), msr_sum(K, 0.0);
    double step_tokens = 0;  // this rank's, then (reduced) every rank's
    double open_gates = 0;   // this rank's, then every rank's
    std::unique_ptr<train::StepRunner> run =
        runner ? runner(router.spec, router.params.data())
               : std::make_unique<train::CpuStepRunner>(m, router.spec, router.params.data());
    train::StepRunner& rs = *run;
    for (size_t b = 0; b < batch.size(); ++b) {
      const size_t i = batch[b];
      const TrainExample& e = data[i];
      const int k = cls_of[i];
      train::TrainSample s;
      s.ids = e.input_ids;
      s.ids.insert(s.ids.end(), e.output_ids.begin(), e.output_ids.end());
      s.prompt_len = static_cast<int>(e.input_ids.size());
      s.task_class = k;
      for (double& z : noise) {
        const double u = unif(rng);
        z = std::log(u) - std::log1p(-u);  // logistic = difference of two Gumbel draws
      }
      if (static_cast<int>(b % world) != rank) continue;  // another rank's sample (its noise was drawn all the same)
      train::GateSettings g;
      g.tau = log.tau;
      g.hard = o.hard;
      g.noise = &noise;
      auto r = rs.forward(s, g);
      const double omega = r.omega(), t = o.targets.at(e.task_class), dev = omega - t;
      const double w = 1.0 / (n_in_class[k] * present);  // mean within the class, then across classes
      const double l1 = lambdas[2 * k], l2 = lambdas[2 * k + 1];
      log.reg += w * (l1 * dev + l2 * dev * dev);
      dlam[2 * k] += w * dev;
      dlam[2 * k + 1] += w * dev * dev;
      log.lm += r.lm_loss / o.batch;
      msr_sum[k] += omega / n_in_class[k];
      for (float p : r.p_full) open_gates += p >= 0.05f && p <= 0.95f;
      rs.backward(1.f / o.batch, static_cast<float>(w * (l1 + 2 * l2 * dev)), grad_f.data());
      step_tokens += s.ids.size();
    }
    if (world > 1) {
      // One collective per step: gradients, multiplier gradients, per-class Omega sums, loss sums, tokens.
      std::vector<float> buf(grad_f);
      for (double v : dlam) buf.push_back(static_cast<float>(v));
      for (double v : msr_sum) buf.push_back(static_cast<float>(v));
      buf.push_back(static_cast<float>(log.lm));
      buf.push_back(static_cast<float>(log.reg));
      buf.push_back(static_cast<float>(step_tokens));
      buf.push_back(static_cast<float>(open_gates));
      comm->all_reduce_sum(buf.data(), buf.size());
      size_t at = 0;
      for (size_t j = 0; j < P; ++j) grad_f[j] = buf[at++];
      for (double& v : dlam) v = buf[at++];
      for (double& v : msr_sum) v = buf[at++];
      log.lm = buf[at++];
      log.reg = buf[at++];
      step_tokens = buf[at++];
      open_gates = buf[at++];
    }
    log.open = open_gates / (static_cast<double>(o.batch) * nh);
    tokens_done += step_tokens;
    for (size_t j = 0; j < P; ++j) grad[j] = grad_f[j];
    train::clip_grad_norm(grad, o.clip);
    opt.step(router.params.data(), grad.data(), P, log.lr);
    std::vector<char> active(2 * K, 0);
    for (int k = 0; k < K; ++k) active[2 * k] = active[2 * k + 1] = n_in_class[k] > 0;
    opt_mult.step(lambdas.data(), dlam.data(), lambdas.size(), lr_at(o, step, o.multiplier_lr), active.data());

    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    log.tok_per_s = tokens_done / std::max(el, 1e-9);
    log.eta_s = el / (step + 1) * (o.steps - step - 1);
    for (int k = 0; k < K; ++k) {
      if (n_in_class[k]) log.msr[classes[k]] = msr_sum[k];
      log.lambdas[classes[k]] = {lambdas[2 * k], lambdas[2 * k + 1]};
    }
    if (jl) {
      nlohmann::json j = {{"step", log.step}, {"lm", log.lm},   {"reg", log.reg},
                          {"tau", log.tau},   {"lr", log.lr},   {"tok_per_s", log.tok_per_s}, {"open", log.open},
                          {"msr", log.msr},   {"eta_s", log.eta_s}};
      for (auto& [cl, lv] : log.lambdas) j["lambda"][cl] = {lv.first, lv.second};
      jl->write(dump_json(j) + "\n");
      jl->stream().flush();  // a failed flush is reported by the next write or the close below
    }
    if (on_step && rank == 0) on_step(log);
  }
  if (jl) jl->close();
  return router;
}

void write_training_plots(const std::vector<StepLog>& logs, const std::string& prefix) {
  PlotSeries lm{"lm loss", {}, {}}, reg{"regularizer", {}, {}}, tau{"tau", {}, {}};
  std::map<std::string, PlotSeries> msr;
  PlotSeries open{"open gates", {}, {}};
  for (const StepLog& s : logs) {
    open.x.push_back(s.step);
    open.y.push_back(s.open);
    lm.x.push_back(s.step);
    lm.y.push_back(s.lm);
    reg.x.push_back(s.step);
    reg.y.push_back(s.reg);
    tau.x.push_back(s.step);
    tau.y.push_back(s.tau);
    for (auto& [c, v] : s.msr) {
      PlotSeries& p = msr[c];
      p.name = "Omega_MSR[" + c + "]";
      p.x.push_back(s.step);
      p.y.push_back(v);
    }
  }
  write_line_chart_svg(prefix + "_loss.svg", "Router training: loss", "step", "value", {lm, reg, tau});
  std::vector<PlotSeries> ms;
  for (auto& [c, p] : msr) ms.push_back(p);
  ms.push_back(open);  // share of gates still in play: saturation shows as this curve falling to 0
  write_line_chart_svg(prefix + "_sparsity.svg", "Router training: model sparsity per task class, open gates", "step",
                       "Omega_MSR", ms);
}

}  // namespace elastic
