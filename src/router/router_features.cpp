#include "elastic/router_features.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>

#include "router/router_mlp.h"

namespace elastic {

namespace {

// Forwards every decision to the router and keeps each layer's pooled keys [Hkv * hd] of the current prompt.
struct RecordingRouter : PromptRouter {
  const Router& r;
  mutable std::vector<std::vector<float>> pooled;  // [L][Hkv * hd]
  explicit RecordingRouter(const Router& router) : r(router), pooled(router.spec.n_layers) {}
  int pool_first() const override { return r.pool_first(); }
  int pool_last() const override { return r.pool_last(); }
  const SparseSettings& sparse() const override { return r.sparse(); }
  std::vector<HeadMode> modes() const override { return r.modes(); }
  void decide(int layer, const float* p, HeadMode* modes) const override {
    pooled[layer].assign(p, p + static_cast<size_t>(r.spec.n_kv_heads) * r.spec.head_dim);
    r.decide(layer, p, modes);
  }
};

// Mean over KV heads of the cosine similarity of rows h of a and b ([H, d] each).
double head_cosine(const std::vector<float>& a, const std::vector<float>& b, int H, int d) {
  double sum = 0;
  for (int h = 0; h < H; ++h) {
    double ab = 0, aa = 0, bb = 0;
    for (int j = 0; j < d; ++j) {
      const double x = a[static_cast<size_t>(h) * d + j], y = b[static_cast<size_t>(h) * d + j];
      ab += x * y, aa += x * x, bb += y * y;
    }
    sum += ab / std::max(std::sqrt(aa * bb), 1e-30);
  }
  return sum / H;
}

// Layer l's separation statistics over all prompts' features x[prompt][layer] ([H, d] each).
LayerSeparation layer_separation(const std::vector<std::vector<std::vector<float>>>& x, int l,
                                 const std::vector<std::string>& tasks, int H, int d) {
  const size_t n = x.size(), D = static_cast<size_t>(H) * d;
  // Centring removes what every prompt shares (a large common component makes raw cosines all ~1).
  // Summed in double and divided once, so features equal across prompts centre to exactly 0 (a learned-static
  // router's task-MLP output is the same for every prompt).
  std::vector<double> mean(D, 0.0);
  for (size_t i = 0; i < n; ++i)
    for (size_t k = 0; k < D; ++k) mean[k] += x[i][l][k];
  for (double& m : mean) m /= static_cast<double>(n);
  std::vector<std::vector<float>> c(n, std::vector<float>(D));
  for (size_t i = 0; i < n; ++i)
    for (size_t k = 0; k < D; ++k) c[i][k] = static_cast<float>(x[i][l][k] - mean[k]);
  LayerSeparation s;
  int nw = 0, nb = 0;
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j < n; ++j) {
      const double raw = head_cosine(x[i][l], x[j][l], H, d), cen = head_cosine(c[i], c[j], H, d);
      if (tasks[i] == tasks[j]) s.within += raw, s.within_centred += cen, ++nw;
      else s.between += raw, s.between_centred += cen, ++nb;
    }
  s.within /= nw, s.between /= nb, s.within_centred /= nw, s.between_centred /= nb;
  // Share of the features' variance that the task explains (eta^2 = between-task / total sum of squares, per KV head,
  // averaged over heads): 1 when each task's prompts coincide, about (tasks - 1) / (prompts - 1) for unrelated ones.
  std::map<std::string, std::vector<size_t>> groups;
  for (size_t i = 0; i < n; ++i) groups[tasks[i]].push_back(i);
  for (int h = 0; h < H; ++h) {
    double total = 0, between = 0, raw = 0;
    for (size_t i = 0; i < n; ++i)
      for (int j = 0; j < d; ++j) {
        const size_t k = static_cast<size_t>(h) * d + j;
        total += double(c[i][k]) * c[i][k];
        raw += double(x[i][l][k]) * x[i][l][k];
      }
    // Features that do not vary (beyond rounding) have no variance to explain: the share is undefined.
    if (!(total > 1e-12 * raw)) {
      s.task_variance_share = NAN;
      s.within_centred = s.between_centred = NAN;
      break;
    }
    for (const auto& [t, members] : groups)
      for (int j = 0; j < d; ++j) {
        double m = 0;
        for (size_t i : members) m += c[i][static_cast<size_t>(h) * d + j];
        m /= static_cast<double>(members.size());
        between += static_cast<double>(members.size()) * m * m;
      }
    s.task_variance_share += between / total / H;  // total > 0: checked above
  }
  return s;
}

}  // namespace

FeatureSeparation router_feature_separation(const Model& m, const Router& router,
                                            const std::vector<std::vector<int32_t>>& prompts,
                                            const std::vector<std::string>& tasks, int chunk,
                                            const std::function<void(int done, int total)>& progress) {
  if (prompts.size() != tasks.size()) throw std::invalid_argument("router features: one task name per prompt");
  const int L = router.spec.n_layers, H = router.spec.n_kv_heads, d = router.spec.head_dim, C = router.spec.classes();
  const size_t n = prompts.size();
  // [prompt][layer] features before and after the task MLP.
  std::vector<std::vector<std::vector<float>>> before(n), after(n);
  auto rec = std::make_shared<RecordingRouter>(router);
  for (size_t i = 0; i < n; ++i) {
    KVCache cache;
    cache.init_deferred(m.config, static_cast<int>(prompts[i].size()));
    std::vector<float> logits;
    m.prefill(prompts[i].data(), static_cast<int>(prompts[i].size()), chunk, cache, logits, false, nullptr, rec.get());
    before[i] = rec->pooled;
    after[i].resize(L);
    for (int l = 0; l < L; ++l) {
      // The task MLP's output is the activation `t` of the router MLP's forward.
      router::MlpActs<float> acts;
      std::vector<float> lg(static_cast<size_t>(H) * C), x = before[i][l];
      router::apply_router_input(router.spec.input, H, d, x.data());
      router::mlp_fwd<float>(router.layer(l), d, C, x.data(), H, lg.data(), &acts);
      after[i][l] = acts.t;
    }
    if (progress) progress(static_cast<int>(i + 1), static_cast<int>(n));
  }
  FeatureSeparation s;
  s.n_layers = L;
  s.prompts = static_cast<int>(n);
  int nw = 0, nb = 0;
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j < n; ++j) (tasks[i] == tasks[j] ? nw : nb) += 1;
  if (nw == 0 || nb == 0)
    throw std::invalid_argument("router features: needs two prompts of one task and prompts of two tasks");
  s.before.resize(L), s.after.resize(L);
  for (int l = 0; l < L; ++l) {
    s.before[l] = layer_separation(before, l, tasks, H, d);
    s.after[l] = layer_separation(after, l, tasks, H, d);
  }
  return s;
}

std::string feature_separation_table(const FeatureSeparation& s) {
  std::string o =
      "| layer | before: within | between | gap | centred gap | task variance | after task MLP: within | between | gap "
      "| centred gap | task variance |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  char buf[320];
  for (int l = 0; l < s.n_layers; ++l) {
    const LayerSeparation &b = s.before[l], &a = s.after[l];
    std::snprintf(buf, sizeof buf, "| %d | %.4f | %.4f | %.4f | %.4f | %.3f | %.4f | %.4f | %.4f | %.4f | %.3f |\n", l,
                  b.within, b.between, b.within - b.between, b.within_centred - b.between_centred,
                  b.task_variance_share, a.within, a.between, a.within - a.between,
                  a.within_centred - a.between_centred, a.task_variance_share);
    o += buf;
  }
  return o;
}

}  // namespace elastic
