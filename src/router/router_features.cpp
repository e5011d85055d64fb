#include "elastic/router_features.h"

#include <cmath>
#include <cstdio>
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

}  // namespace

FeatureSeparation router_feature_separation(Model& m, const Router& router,
                                            const std::vector<std::vector<int32_t>>& prompts,
                                            const std::vector<std::string>& tasks, int chunk,
                                            const std::function<void(int done, int total)>& progress) {
  if (prompts.size() != tasks.size()) throw std::invalid_argument("router features: one task name per prompt");
  const int L = router.spec.n_layers, H = router.spec.n_kv_heads, d = router.spec.head_dim, C = router.spec.classes();
  const size_t n = prompts.size();
  // [prompt][layer] features before and after the task MLP.
  std::vector<std::vector<std::vector<float>>> before(n), after(n);
  auto rec = std::make_shared<RecordingRouter>(router);
  // The recorder routes through the caller's model; its own router is put back afterwards, also on errors.
  struct Restore {
    Model& m;
    std::shared_ptr<const PromptRouter> saved;
    ~Restore() { m.router = saved; }
  } restore{m, m.router};
  m.router = rec;
  for (size_t i = 0; i < n; ++i) {
    KVCache cache;
    cache.init_deferred(m.config, static_cast<int>(prompts[i].size()));
    std::vector<float> logits;
    m.prefill(prompts[i].data(), static_cast<int>(prompts[i].size()), chunk, cache, logits, false);
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
  for (auto* v : {&s.within_before, &s.between_before, &s.within_after, &s.between_after}) v->assign(L, 0.0);
  for (int l = 0; l < L; ++l) {
    double wb = 0, bb = 0, wa = 0, ba = 0;
    int nw = 0, nb = 0;
    for (size_t i = 0; i < n; ++i)
      for (size_t j = i + 1; j < n; ++j) {
        const double cb = head_cosine(before[i][l], before[j][l], H, d), ca = head_cosine(after[i][l], after[j][l], H, d);
        if (tasks[i] == tasks[j]) wb += cb, wa += ca, ++nw;
        else bb += cb, ba += ca, ++nb;
      }
    if (nw == 0 || nb == 0)
      throw std::invalid_argument("router features: needs two prompts of one task and prompts of two tasks");
    s.within_before[l] = wb / nw, s.between_before[l] = bb / nb;
    s.within_after[l] = wa / nw, s.between_after[l] = ba / nb;
  }
  return s;
}

std::string feature_separation_table(const FeatureSeparation& s) {
  std::string o = "| layer | before: within | before: between | before: gap | after task MLP: within | between | gap |\n"
                  "|---:|---:|---:|---:|---:|---:|---:|\n";
  char buf[256];
  for (int l = 0; l < s.n_layers; ++l) {
    std::snprintf(buf, sizeof buf, "| %d | %.4f | %.4f | %.4f | %.4f | %.4f | %.4f |\n", l, s.within_before[l],
                  s.between_before[l], s.within_before[l] - s.between_before[l], s.within_after[l],
                  s.between_after[l], s.within_after[l] - s.between_after[l]);
    o += buf;
  }
  return o;
}

}  // namespace elastic
