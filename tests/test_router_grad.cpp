// Gradient checks of router training, in float64 against central finite differences: every op of the backward
// path, then the whole router gradient through a tiny frozen model. Tolerances: ops 1e-6 relative + 1e-6 absolute;
// the whole router 2e-5 relative + 1e-9 absolute (tight enough to see the small path through the router inputs).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "elastic/model.h"
#include "elastic/router.h"
#include "router/router_mlp.h"
#include "train/adamw.h"
#include "train/attention_grad.h"
#include "train/grad_ops.h"
#include "train/router_step.h"

using namespace elastic;
using namespace elastic::train;

namespace {

std::vector<double> randn(size_t n, std::mt19937_64& rng, double scale = 1.0) {
  std::normal_distribution<double> N(0.0, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = N(rng);
  return v;
}
std::vector<float> randf(size_t n, std::mt19937_64& rng, double scale = 1.0) {
  std::normal_distribution<float> N(0.f, static_cast<float>(scale));
  std::vector<float> v(n);
  for (auto& x : v) x = N(rng);
  return v;
}

// Checks analytic d f / d x (given) against central differences of the scalar f at every (or `every`-th) entry.
void expect_grad(std::vector<double>& x, const std::vector<double>& analytic, const std::function<double()>& f,
                 const char* what, size_t every = 1, double h = 1e-6, double rel = 1e-6, double abs = 1e-6) {
  ASSERT_EQ(x.size(), analytic.size());
  for (size_t i = 0; i < x.size(); i += every) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double fp = f();
    x[i] = x0 - h;
    const double fm = f();
    x[i] = x0;
    const double fd = (fp - fm) / (2 * h);
    EXPECT_NEAR(analytic[i], fd, rel * std::abs(fd) + abs) << what << " at " << i;
  }
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

TEST(RouterGrad, RmsNorm) {
  std::mt19937_64 rng(1);
  const int rows = 3, n = 8;
  auto x = randn(rows * n, rng);
  auto w = randf(n, rng);
  auto dy = randn(rows * n, rng);
  std::vector<double> y(x.size()), dx(x.size(), 0.0);
  rmsnorm_bwd<double>(x.data(), w.data(), dy.data(), dx.data(), rows, n, 1e-6f);
  expect_grad(x, dx, [&] { rmsnorm_fwd<double>(x.data(), w.data(), y.data(), rows, n, 1e-6f); return dot(y, dy); },
              "rmsnorm");
}

TEST(RouterGrad, RopeSwigluLinearCrossEntropy) {
  std::mt19937_64 rng(2);
  const int T = 5, H = 2, hd = 8;
  std::vector<float> inv = {1.f, 0.3f, 0.05f, 0.001f};
  auto x = randn(T * H * hd, rng), dy = randn(x.size(), rng);
  std::vector<double> dx = dy;
  rope_bwd<double>(dx.data(), T, H, hd, 3, inv);
  expect_grad(x, dx, [&] { auto y = x; rope_fwd<double>(y.data(), T, H, hd, 3, inv); return dot(y, dy); }, "rope");

  auto g = randn(20, rng), u = randn(20, rng), da = randn(20, rng);
  std::vector<double> dg(20, 0.0), du(20, 0.0), a(20);
  swiglu_bwd<double>(g.data(), u.data(), da.data(), dg.data(), du.data(), 20);
  auto fa = [&] { swiglu_fwd<double>(g.data(), u.data(), a.data(), 20); return dot(a, da); };
  expect_grad(g, dg, fa, "swiglu gate");
  expect_grad(u, du, fa, "swiglu up");

  const int N = 6, K = 7;
  auto W = randf(N * K, rng);
  auto xi = randn(T * K, rng), dyl = randn(T * N, rng);
  std::vector<double> dxi(xi.size(), 0.0), yl(T * N);
  linear_bwd<double>(dyl.data(), W.data(), dxi.data(), T, N, K);
  expect_grad(xi, dxi, [&] { linear_fwd<double>(xi.data(), W.data(), nullptr, yl.data(), T, N, K); return dot(yl, dyl); },
              "linear");

  auto lg = randn(11, rng);
  std::vector<double> dlg(11);
  cross_entropy_row<double>(lg.data(), 11, 4, 0.7, dlg.data());
  expect_grad(lg, dlg, [&] { return 0.7 * cross_entropy_row<double>(lg.data(), 11, 4, 1.0, nullptr); }, "cross entropy");
}

TEST(RouterGrad, AttentionEveryMode) {
  std::mt19937_64 rng(3);
  const int T = 37, Hq = 4, Hkv = 2, hd = 8;
  SparseSettings sp;
  sp.block = 8;
  sp.sink = 8;
  sp.local = 8;
  for (HeadMode mode : {HeadMode::Full, HeadMode::Streaming, HeadMode::XAttn}) {
    auto q = randn(T * Hq * hd, rng), k = randn(T * Hkv * hd, rng), v = randn(T * Hkv * hd, rng);
    auto dout = randn(q.size(), rng);
    std::vector<HeadMode> modes(Hkv, mode);
    modes[1] = HeadMode::Full;  // mixed routing within the layer
    sp.xattn.stride = 4;
    auto xm = xattn_masks<double>(q.data(), k.data(), T, Hq, Hkv, hd, modes.data(), sp);  // fixed selection
    BlockKeep keep(modes.data(), Hkv, sp, &xm, Hq / Hkv);
    std::vector<double> out(q.size()), lse(Hq * T), dq(q.size(), 0.0), dk(k.size(), 0.0), dv(v.size(), 0.0);
    attn_fwd<double>(q.data(), k.data(), v.data(), T, Hq, Hkv, hd, keep, out.data(), lse.data());
    attn_bwd<double>(q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), T, Hq, Hkv, hd, keep,
                     dq.data(), dk.data(), dv.data());
    auto f = [&] {
      std::vector<double> o(q.size()), l(Hq * T);
      attn_fwd<double>(q.data(), k.data(), v.data(), T, Hq, Hkv, hd, keep, o.data(), l.data());
      return dot(o, dout);
    };
    expect_grad(q, dq, f, "attention dq", 7);
    expect_grad(k, dk, f, "attention dk", 5);
    expect_grad(v, dv, f, "attention dv", 5);
  }
}

TEST(RouterGrad, RouterMlpAndGate) {
  std::mt19937_64 rng(4);
  const int d = 8, n = 3;
  for (int C : {2, 1}) {
    auto P = randn(router::layer_param_count(d, C), rng, 0.4);
    auto x = randn(n * d, rng), dl = randn(n * C, rng);
    router::MlpActs<double> acts;
    std::vector<double> lg(n * C), dP(P.size(), 0.0), dx(x.size(), 0.0);
    router::mlp_fwd<double>(P.data(), d, C, x.data(), n, lg.data(), &acts);
    router::mlp_bwd<double>(P.data(), d, C, x.data(), n, acts, dl.data(), dP.data(), dx.data());
    auto f = [&] {
      std::vector<double> o(n * C);
      router::mlp_fwd<double>(P.data(), d, C, x.data(), n, o.data(), nullptr);
      return dot(o, dl);
    };
    expect_grad(P, dP, f, "router params", 13);
    expect_grad(x, dx, f, "router input");
    // Soft gate derivative.
    std::vector<double> l2 = randn(C, rng), ds(C);
    router::gate<double>(l2.data(), C, 0.3, 1.3, false, ds.data());
    expect_grad(l2, ds, [&] { return router::gate<double>(l2.data(), C, 0.3, 1.3, false, nullptr); }, "gate");
  }
}

namespace {

// A gate saturated towards FULL still passes a (tiny, positive) gradient in float, the same as float64's.
TEST(RouterGrad, SaturatedGateGradientInFloat) {
  for (float margin : {20.f, 40.f, 80.f}) {
    float lf[2] = {0.f, margin}, df[2];
    double ld[2] = {0.0, margin}, dd[2];
    router::gate<float>(lf, 2, 0.f, 1.f, true, df, nullptr);
    router::gate<double>(ld, 2, 0.0, 1.0, true, dd, nullptr);
    EXPECT_GT(df[1], 0.f) << "margin " << margin;
    EXPECT_NEAR(df[1] / dd[1], 1.0, 1e-5) << "margin " << margin;
  }
}

// Masked AdamW: elements sitting out a step keep their value and their moments.
TEST(RouterGrad, AdamWSkipsInactiveElements) {
  AdamW a;
  a.maximize = true;
  float p[2] = {0.f, 0.f};
  const double g[2] = {1.0, 1.0};
  const char both[2] = {1, 1}, first[2] = {1, 0};
  a.step(p, g, 2, 0.1, both);
  const float p1 = p[1];
  for (int i = 0; i < 5; ++i) a.step(p, g, 2, 0.1, first);
  EXPECT_EQ(p[1], p1);
  EXPECT_GT(p[0], p1);
  EXPECT_EQ(a.t[0], 6);
  EXPECT_EQ(a.t[1], 1);
}

// The whole router gradient through a fixture model: soft gates (the hard gate is a step function), fixed noise.
void whole_router_check(const std::string& fixture, HeadMode sparse_mode, bool sigmoid,
                        HeadMode dense_mode = HeadMode::Full, RouterInput input = RouterInput::Pooled) {
  Model m = Model::load(std::string(ELASTIC_FIXTURE_DIR) + "/" + fixture);
  RouterSpec spec;
  spec.n_layers = m.config.n_layers;
  spec.n_kv_heads = m.config.n_kv_heads;
  spec.head_dim = m.config.head_dim;
  spec.pool_first = 10;
  spec.pool_last = 10;
  spec.sigmoid = sigmoid;
  spec.dense_mode = dense_mode;
  spec.sparse_mode = sparse_mode;
  spec.input = input;
  spec.sparse.block = 16;
  spec.sparse.sink = 16;
  spec.sparse.local = 16;
  spec.sparse.xattn.block = 16;
  spec.sparse.xattn.stride = 4;
  Router r = Router::init(spec, 7);
  // Larger than default weights make the gates depend strongly on their inputs, so the gradient path through the
  // next layers' router inputs is well above finite-difference noise.
  std::vector<double> P(r.params.begin(), r.params.end());
  for (double& p : P) p *= 3.0;
  TrainSample s;
  std::mt19937_64 rng(11);
  for (int t = 0; t < 70; ++t) s.ids.push_back(static_cast<int32_t>(rng() % m.config.vocab));
  s.prompt_len = 60;
  std::vector<double> noise = randn(static_cast<size_t>(spec.n_layers) * spec.n_kv_heads, rng, 0.5);
  GateSettings g;
  g.tau = 1.3;
  g.hard = false;
  g.noise = &noise;
  const double w_lm = 1.0, w_omega = 0.37;
  RouterStep<double> step(m, spec, P.data());
  step.forward(s, g);
  std::vector<double> dP(P.size(), 0.0);
  step.backward(w_lm, w_omega, dP.data());
  auto f = [&] {
    RouterStep<double> st(m, spec, P.data());
    auto res = st.forward(s, g);
    return w_lm * res.lm_loss + w_omega * res.omega();
  };
  double norm = 0;
  for (double v : dP) norm += v * v;
  EXPECT_GT(norm, 0.0);
  expect_grad(P, dP, f, "whole router gradient", P.size() / 120 + 1, 1e-5, 2e-5, 1e-9);
}

}  // namespace

TEST(RouterGrad, WholeRouterQwen3Streaming) { whole_router_check("qwen3_tiny", HeadMode::Streaming, false); }
TEST(RouterGrad, WholeRouterLlamaXAttnSigmoid) { whole_router_check("llama_tiny", HeadMode::XAttn, true); }
// XA-SSA: XAttention is the dense class.
TEST(RouterGrad, WholeRouterLlamaXaSsa) {
  whole_router_check("llama_tiny", HeadMode::Streaming, false, HeadMode::XAttn);
}

// The learned-static control: the router reads a fixed input per head, and its parameters' gradient is still exact
// (the backward sends nothing into the keys it no longer reads).
TEST(RouterGrad, WholeRouterHeadIdentityInput) {
  whole_router_check("qwen3_tiny", HeadMode::Streaming, false, HeadMode::Full, RouterInput::HeadIdentity);
}

// The training forward with every gate forced FULL (or every gate sparse) is the inference model under that routing.
TEST(RouterGrad, TrainingForwardMatchesInference) {
  Model m = Model::load(std::string(ELASTIC_FIXTURE_DIR) + "/qwen3_tiny");
  RouterSpec spec;
  spec.n_layers = m.config.n_layers;
  spec.n_kv_heads = m.config.n_kv_heads;
  spec.head_dim = m.config.head_dim;
  spec.sparse.block = 16;
  spec.sparse.sink = 16;
  spec.sparse.local = 32;
  spec.sparse.xattn.block = 16;
  spec.sparse.xattn.stride = 4;
  TrainSample s;
  for (int t = 0; t < 100; ++t) s.ids.push_back((t * 37 + 5) % m.config.vocab);
  s.prompt_len = 80;
  // FA-SSA and XA-SSA: a forced-dense XA-SSA gate is the inference model with every head XAttention, its selection
  // made over prompt and answer rows alike, as a prefill of the whole sequence makes it.
  for (const HeadMode dense : {HeadMode::Full, HeadMode::XAttn}) {
  spec.dense_mode = dense;
  Router r = Router::init(spec, 1);
  for (double force : {50.0, -50.0}) {
    std::vector<double> noise(spec.n_layers * spec.n_kv_heads, force);
    GateSettings g;
    g.noise = &noise;
    RouterStep<float> step(m, spec, r.params.data());
    auto res = step.forward(s, g);
    RoutingTable rt = RoutingTable::uniform(spec.n_layers, spec.n_kv_heads, force > 0 ? dense : HeadMode::Streaming);
    rt.sparse = spec.sparse;
    KVCache cache;
    cache.init(m.config, static_cast<int>(s.ids.size()));
    cache.routing = rt;  // every position kept, attention masked by rt (as the trainer's forward)
    std::vector<float> logits;
    m.forward(s.ids.data(), static_cast<int>(s.ids.size()), cache, logits, true, nullptr, nullptr, true);
    double ce = 0;
    for (int t = s.prompt_len - 1; t + 1 < static_cast<int>(s.ids.size()); ++t)
      ce += cross_entropy_row<float>(logits.data() + static_cast<size_t>(t) * m.config.vocab, m.config.vocab,
                                     s.ids[t + 1], 1.f, nullptr);
    ce /= res.n_answer;
    EXPECT_NEAR(res.lm_loss, ce, 1e-4 * std::abs(ce)) << "force " << force << " dense " << head_mode_name(dense);
    EXPECT_NEAR(res.omega(), force > 0 ? 0.0 : 1.0, 1e-12);
  }
  }
}
