#include "train/router_step.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "elastic/sparse_pattern.h"
#include "elastic/train.h"
#include "router/router_mlp.h"
#include "train/attention_grad.h"
#include "train/grad_ops.h"

namespace elastic {

size_t cpu_train_bytes(const ModelConfig& c, int T) {
  const size_t D = c.hidden, F = c.intermediate, nq = size_t(c.n_heads) * c.head_dim,
               nk = size_t(c.n_kv_heads) * c.head_dim, L = c.n_layers;
  // Per token, in floats: the layer inputs x[0..L]; a layer's h, xmid, h2 and dh, dh2; q, qn, qr, of, os, o and dO,
  // dof, dos, dqr, dq; k, kn, kr, v and dkr, dv, dk; the two branches' log-sum-exps; g, u, a and da, dg, du.
  // SmolLM2-135M: 147 KiB per token; peak RSS measured 155 KiB per token more from 1,088 to 2,112 tokens (the rest:
  // the attention tiles' scratch and the data).
  const size_t floats = (L + 1) * D + 5 * D + 11 * nq + 7 * nk + 2 * size_t(c.n_heads) + 6 * F;
  return floats * sizeof(float) * size_t(std::max(T, 0));
}

std::string cpu_train_memory_error(const ModelConfig& c, int max_len, size_t available) {
  const size_t need = cpu_train_bytes(c, max_len), budget = available / 10 * 9, per_token = cpu_train_bytes(c, 1);
  if (available == 0 || need <= budget) return "";
  return "train-router: --max-len " + std::to_string(max_len) + " needs about " + std::to_string(need >> 20) +
         " MiB for a sequence's activations on the CPU (" + std::to_string(per_token >> 10) +
         " KiB per token for this model), more than 90% of the " + std::to_string(available >> 20) +
         " MiB available; at most about " + std::to_string(budget / per_token) +
         " tokens fit (or train with --device cuda)";
}

}  // namespace elastic

namespace elastic::train {

template <class Real>
Real StepResult<Real>::omega() const {
  Real s = 0;
  for (Real v : z) s += Real(1) - v;
  return z.empty() ? Real(0) : s / Real(z.size());
}

namespace {

const float* opt(const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); }

// One layer's activations, recomputed from the layer input in the backward.
template <class Real>
struct LayerActs {
  std::vector<Real> h, q, k, v, qn, kn, qr, kr, of, os, lf, ls, o, xmid, h2, g, u, a;
  std::vector<Real> pooled, logits, z, p_full, dsoft;  // router: [Hkv*hd], [Hkv*C], [Hkv], [Hkv], [Hkv*C]
  router::MlpActs<Real> mlp;
  std::vector<BlockMask> xmask;
};

}  // namespace

template <class Real>
struct RouterStep<Real>::Impl {
  const Model& m;
  RouterSpec spec;
  const Real* P;
  size_t layer_size;
  // Last forward's state.
  TrainSample sample;
  GateSettings gate;
  std::vector<std::vector<Real>> x;  // [L + 1][T * D] residual stream at each layer boundary
  std::vector<int> pool_pos;
  std::vector<Real> z_all, dsoft_all;  // router decisions of the forward, reused by the recompute
  int T = 0, n_ans = 0;

  Impl(const Model& model, const RouterSpec& s, const Real* params)
      : m(model), spec(s), P(params), layer_size(router::layer_param_count(s.head_dim, s.classes())) {}

  // Layer l from input xin; fills acts (and, in the forward, decides the gate).
  void layer(int l, const Real* xin, LayerActs<Real>& A, bool decide, Real* xout) {
    const ModelConfig& c = m.config;
    const LayerWeights& W = m.weights.layers[l];
    const int D = c.hidden, hd = c.head_dim, Hq = c.n_heads, Hkv = c.n_kv_heads, F = c.intermediate;
    const int C = spec.classes(), group = Hq / Hkv;
    const size_t nq = static_cast<size_t>(T) * Hq * hd, nk = static_cast<size_t>(T) * Hkv * hd;
    A.h.resize(static_cast<size_t>(T) * D);
    rmsnorm_fwd(xin, W.attn_norm.data(), A.h.data(), T, D, c.rms_eps);
    A.q.resize(nq);
    A.k.resize(nk);
    A.v.resize(nk);
    linear_fwd(A.h.data(), W.wq.f32().data(), opt(W.bq), A.q.data(), T, Hq * hd, D);
    linear_fwd(A.h.data(), W.wk.f32().data(), opt(W.bk), A.k.data(), T, Hkv * hd, D);
    linear_fwd(A.h.data(), W.wv.f32().data(), opt(W.bv), A.v.data(), T, Hkv * hd, D);
    A.qn = A.q;
    A.kn = A.k;
    if (c.qk_norm) {
      rmsnorm_fwd(A.q.data(), W.q_norm.data(), A.qn.data(), T * Hq, hd, c.rms_eps);
      rmsnorm_fwd(A.k.data(), W.k_norm.data(), A.kn.data(), T * Hkv, hd, c.rms_eps);
    }
    // Router: boundary-pooled keys after k_norm, before RoPE; weights shared across the layer's KV heads.
    A.pooled.resize(static_cast<size_t>(Hkv) * hd);
    router::pool_rows<Real>(A.kn.data(), pool_pos, A.pooled.size(), A.pooled.data());
    router::apply_router_input(spec.input, Hkv, hd, A.pooled.data());
    A.logits.resize(static_cast<size_t>(Hkv) * C);
    router::mlp_fwd<Real>(P + layer_size * l, hd, C, A.pooled.data(), Hkv, A.logits.data(), &A.mlp);
    A.z.resize(Hkv);
    A.p_full.resize(Hkv);
    A.dsoft.resize(static_cast<size_t>(Hkv) * C);
    for (int h = 0; h < Hkv; ++h) {
      const size_t i = static_cast<size_t>(l) * Hkv + h;
      if (decide) {
        const Real noise = gate.noise ? Real((*gate.noise)[i]) : Real(0);
        A.z[h] = router::gate<Real>(A.logits.data() + h * C, C, noise, Real(gate.tau), gate.hard,
                                    A.dsoft.data() + h * C, &A.p_full[h]);
        z_all[i] = A.z[h];
        std::copy_n(A.dsoft.data() + h * C, C, dsoft_all.data() + i * C);
      } else {
        A.z[h] = z_all[i];
        std::copy_n(dsoft_all.data() + i * C, C, A.dsoft.data() + h * C);
      }
    }
    A.qr = A.qn;
    A.kr = A.kn;
    rope_fwd(A.qr.data(), T, Hq, hd, 0, m.rope_inv_freq);
    rope_fwd(A.kr.data(), T, Hkv, hd, 0, m.rope_inv_freq);
    // The dense branch (class 1) and the sparse one: FA-SSA, FA-XA or XA-SSA. The XAttention branch's selection
    // comes from the queries and keys of every row, prompt and answer alike, as at prefill (docs/ROUTER.md).
    const std::vector<HeadMode> full(Hkv, spec.dense_mode), sparse(Hkv, spec.sparse_mode);
    if (spec.dense_mode == HeadMode::XAttn || spec.sparse_mode == HeadMode::XAttn)
      A.xmask = xattn_masks(A.qr.data(), A.kr.data(), T, Hq, Hkv, hd,
                            (spec.dense_mode == HeadMode::XAttn ? full : sparse).data(), spec.sparse);
    const BlockKeep kf(full.data(), Hkv, spec.sparse, &A.xmask, group);
    const BlockKeep ks(sparse.data(), Hkv, spec.sparse, &A.xmask, group);
    A.of.resize(nq);
    A.os.resize(nq);
    A.lf.resize(static_cast<size_t>(Hq) * T);
    A.ls.resize(A.lf.size());
    attn_fwd(A.qr.data(), A.kr.data(), A.v.data(), T, Hq, Hkv, hd, kf, A.of.data(), A.lf.data());
    attn_fwd(A.qr.data(), A.kr.data(), A.v.data(), T, Hq, Hkv, hd, ks, A.os.data(), A.ls.data());
    A.o.resize(nq);
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < Hq; ++h) {
        const Real zz = A.z[h / group];
        const size_t off = (static_cast<size_t>(t) * Hq + h) * hd;
        for (int d = 0; d < hd; ++d) A.o[off + d] = zz * A.of[off + d] + (Real(1) - zz) * A.os[off + d];
      }
    A.xmid.resize(static_cast<size_t>(T) * D);
    linear_fwd(A.o.data(), W.wo.f32().data(), nullptr, A.xmid.data(), T, D, Hq * hd);
    for (size_t i = 0; i < A.xmid.size(); ++i) A.xmid[i] += xin[i];
    A.h2.resize(A.xmid.size());
    rmsnorm_fwd(A.xmid.data(), W.mlp_norm.data(), A.h2.data(), T, D, c.rms_eps);
    A.g.resize(static_cast<size_t>(T) * F);
    A.u.resize(A.g.size());
    A.a.resize(A.g.size());
    linear_fwd(A.h2.data(), W.w_gate.f32().data(), nullptr, A.g.data(), T, F, D);
    linear_fwd(A.h2.data(), W.w_up.f32().data(), nullptr, A.u.data(), T, F, D);
    swiglu_fwd(A.g.data(), A.u.data(), A.a.data(), A.g.size());
    if (xout) {
      linear_fwd(A.a.data(), W.w_down.f32().data(), nullptr, xout, T, D, F);
      for (size_t i = 0; i < A.xmid.size(); ++i) xout[i] += A.xmid[i];
    }
  }

  // Answer rows r in [prompt_len - 1, T - 1): final norm and lm_head; returns the summed CE, fills dx (scaled).
  Real head(const Real* xL, Real scale, Real* dx) {
    const ModelConfig& c = m.config;
    const int D = c.hidden, V = c.vocab, r0 = sample.prompt_len - 1, n = n_ans;
    std::vector<Real> xs(xL + static_cast<size_t>(r0) * D, xL + static_cast<size_t>(r0 + n) * D);
    std::vector<Real> hf(xs.size()), lg(static_cast<size_t>(n) * V);
    rmsnorm_fwd(xs.data(), m.weights.final_norm.data(), hf.data(), n, D, c.rms_eps);
    linear_fwd(hf.data(), m.weights.head().f32().data(), nullptr, lg.data(), n, V, D);
    std::vector<Real> dlg(dx ? lg.size() : 0);
    Real sum = 0;
    for (int i = 0; i < n; ++i)
      sum += cross_entropy_row<Real>(lg.data() + static_cast<size_t>(i) * V, V, sample.ids[r0 + i + 1], scale,
                                     dx ? dlg.data() + static_cast<size_t>(i) * V : nullptr);
    if (dx) {
      std::vector<Real> dh(hf.size(), Real(0));
      linear_bwd(dlg.data(), m.weights.head().f32().data(), dh.data(), n, V, D);
      rmsnorm_bwd(xs.data(), m.weights.final_norm.data(), dh.data(), dx + static_cast<size_t>(r0) * D, n, D,
                  c.rms_eps);
    }
    return sum;
  }
};

template <class Real>
RouterStep<Real>::RouterStep(const Model& m, const RouterSpec& spec, const Real* params)
    : impl_(new Impl(m, spec, params)) {
  const ModelConfig& c = m.config;
  if (spec.n_layers != c.n_layers || spec.n_kv_heads != c.n_kv_heads || spec.head_dim != c.head_dim)
    throw std::invalid_argument("router shape does not match the model");
  (void)router_config_name(spec.dense_mode, spec.sparse_mode);  // throws for a pair that is not a configuration
  // The backward reads each weight transposed through sgemm, which wants fp32 rows.
  if (!m.weights.all_f32())
    throw std::invalid_argument("router training reads fp32 weights: widen the model's block-format matrices first "
                                "(ModelWeights::widen)");
}

template <class Real>
RouterStep<Real>::~RouterStep() { delete impl_; }

template <class Real>
StepResult<Real> RouterStep<Real>::forward(const TrainSample& s, const GateSettings& g) {
  Impl& I = *impl_;
  const ModelConfig& c = I.m.config;
  const int T = static_cast<int>(s.ids.size()), D = c.hidden, L = c.n_layers, Hkv = c.n_kv_heads;
  if (s.prompt_len < 1 || s.prompt_len >= T)
    throw std::invalid_argument("training sample needs a prompt and at least one answer token (prompt " +
                                std::to_string(s.prompt_len) + " of " + std::to_string(T) + " tokens)");
  for (int t = 0; t < T; ++t)
    if (s.ids[t] < 0 || s.ids[t] >= c.vocab)
      throw std::invalid_argument("training sample token id " + std::to_string(s.ids[t]) + " outside the vocabulary");
  I.sample = s;
  I.gate = g;
  I.T = T;
  I.n_ans = T - s.prompt_len;
  I.pool_pos = boundary_positions(s.prompt_len, I.spec.pool_first, I.spec.pool_last);
  I.z_all.assign(static_cast<size_t>(L) * Hkv, Real(0));
  I.dsoft_all.assign(I.z_all.size() * I.spec.classes(), Real(0));
  I.x.assign(L + 1, std::vector<Real>(static_cast<size_t>(T) * D));
  for (int t = 0; t < T; ++t)
    for (int d = 0; d < D; ++d)
      I.x[0][static_cast<size_t>(t) * D + d] = Real(I.m.weights.embed.f32()[static_cast<size_t>(s.ids[t]) * D + d]);
  StepResult<Real> r;
  r.p_full.resize(I.z_all.size());
  LayerActs<Real> A;
  for (int l = 0; l < L; ++l) {
    I.layer(l, I.x[l].data(), A, true, I.x[l + 1].data());
    std::copy(A.p_full.begin(), A.p_full.end(), r.p_full.begin() + static_cast<size_t>(l) * Hkv);
  }
  r.z = I.z_all;
  r.n_answer = I.n_ans;
  r.lm_loss = I.head(I.x[L].data(), Real(0), nullptr) / I.n_ans;
  return r;
}

template <class Real>
void RouterStep<Real>::backward(Real lm_weight, Real omega_weight, Real* dparams) {
  Impl& I = *impl_;
  if (I.x.empty()) throw std::logic_error("RouterStep::backward without a forward");
  const ModelConfig& c = I.m.config;
  const int T = I.T, D = c.hidden, L = c.n_layers, hd = c.head_dim, Hq = c.n_heads, Hkv = c.n_kv_heads,
            F = c.intermediate, C = I.spec.classes(), group = Hq / Hkv;
  const size_t nq = static_cast<size_t>(T) * Hq * hd, nk = static_cast<size_t>(T) * Hkv * hd;
  std::vector<Real> dx(static_cast<size_t>(T) * D, Real(0));
  I.head(I.x[L].data(), lm_weight / I.n_ans, dx.data());
  // Omega = mean over all heads of (1 - z): each z gets -omega_weight / (L * Hkv).
  const Real dz_omega = -omega_weight / Real(static_cast<size_t>(L) * Hkv);
  LayerActs<Real> A;
  std::vector<Real> da, dg, du, dh2, dxmid, dO, dof, dos, dqr, dkr, dv, dq, dk, dh;
  const std::vector<HeadMode> full(Hkv, I.spec.dense_mode), sparse(Hkv, I.spec.sparse_mode);
  for (int l = L - 1; l >= 0; --l) {
    const LayerWeights& W = I.m.weights.layers[l];
    I.layer(l, I.x[l].data(), A, false, nullptr);
    // MLP
    da.assign(static_cast<size_t>(T) * F, Real(0));
    linear_bwd(dx.data(), W.w_down.f32().data(), da.data(), T, D, F);
    dg.assign(da.size(), Real(0));
    du.assign(da.size(), Real(0));
    swiglu_bwd(A.g.data(), A.u.data(), da.data(), dg.data(), du.data(), da.size());
    dh2.assign(static_cast<size_t>(T) * D, Real(0));
    linear_bwd(dg.data(), W.w_gate.f32().data(), dh2.data(), T, F, D);
    linear_bwd(du.data(), W.w_up.f32().data(), dh2.data(), T, F, D);
    dxmid = dx;
    rmsnorm_bwd(A.xmid.data(), W.mlp_norm.data(), dh2.data(), dxmid.data(), T, D, c.rms_eps);
    // o_proj and the gate's mixture
    dO.assign(nq, Real(0));
    linear_bwd(dxmid.data(), W.wo.f32().data(), dO.data(), T, D, Hq * hd);
    std::vector<Real> dz(Hkv, dz_omega);
    dof.resize(nq);
    dos.resize(nq);
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < Hq; ++h) {
        const int kvh = h / group;
        const Real zz = A.z[kvh];
        const size_t off = (static_cast<size_t>(t) * Hq + h) * hd;
        Real acc = 0;
        for (int d = 0; d < hd; ++d) {
          acc += dO[off + d] * (A.of[off + d] - A.os[off + d]);
          dof[off + d] = zz * dO[off + d];
          dos[off + d] = (Real(1) - zz) * dO[off + d];
        }
        dz[kvh] += acc;
      }
    dqr.assign(nq, Real(0));
    dkr.assign(nk, Real(0));
    dv.assign(nk, Real(0));
    BlockKeep kf(full.data(), Hkv, I.spec.sparse, &A.xmask, group);
    BlockKeep ks(sparse.data(), Hkv, I.spec.sparse, &A.xmask, group);
    // A branch whose weight is zero for a head (hard routing) contributes nothing there: skip that head's backward,
    // and the branch's whole call when no head needs it.
    bool any_full = false, any_sparse = false;
    for (int h = 0; h < Hkv; ++h) {
      kf.backward[h] = A.z[h] != Real(0);
      ks.backward[h] = A.z[h] != Real(1);
      any_full |= kf.backward[h];
      any_sparse |= ks.backward[h];
    }
    if (any_full)
      attn_bwd(A.qr.data(), A.kr.data(), A.v.data(), A.of.data(), A.lf.data(), dof.data(), T, Hq, Hkv, hd, kf,
               dqr.data(), dkr.data(), dv.data());
    if (any_sparse)
      attn_bwd(A.qr.data(), A.kr.data(), A.v.data(), A.os.data(), A.ls.data(), dos.data(), T, Hq, Hkv, hd, ks,
               dqr.data(), dkr.data(), dv.data());
    rope_bwd(dqr.data(), T, Hq, hd, 0, I.m.rope_inv_freq);
    rope_bwd(dkr.data(), T, Hkv, hd, 0, I.m.rope_inv_freq);
    // Router: d z -> (straight-through) d logits -> MLP -> pooled keys -> the boundary rows of k after k_norm.
    std::vector<Real> dlogits(static_cast<size_t>(Hkv) * C), dpooled(static_cast<size_t>(Hkv) * hd, Real(0));
    for (int h = 0; h < Hkv; ++h)
      for (int j = 0; j < C; ++j) dlogits[h * C + j] = dz[h] * A.dsoft[h * C + j];
    // Under the head-identity input the router reads no keys: nothing flows back into the backbone's activations.
    const bool reads_keys = I.spec.input == RouterInput::Pooled;
    router::mlp_bwd<Real>(I.P + I.layer_size * l, hd, C, A.pooled.data(), Hkv, A.mlp, dlogits.data(),
                          dparams + I.layer_size * l, reads_keys ? dpooled.data() : nullptr);
    const Real inv_nb = Real(1) / Real(I.pool_pos.size());
    for (int p : I.pool_pos)
      for (size_t j = 0; j < dpooled.size(); ++j) dkr[static_cast<size_t>(p) * Hkv * hd + j] += dpooled[j] * inv_nb;
    // q/k norms, projections, attention norm
    if (c.qk_norm) {
      dq.assign(nq, Real(0));
      dk.assign(nk, Real(0));
      rmsnorm_bwd(A.q.data(), W.q_norm.data(), dqr.data(), dq.data(), T * Hq, hd, c.rms_eps);
      rmsnorm_bwd(A.k.data(), W.k_norm.data(), dkr.data(), dk.data(), T * Hkv, hd, c.rms_eps);
    } else {
      dq.swap(dqr);
      dk.swap(dkr);
    }
    dh.assign(static_cast<size_t>(T) * D, Real(0));
    linear_bwd(dq.data(), W.wq.f32().data(), dh.data(), T, Hq * hd, D);
    linear_bwd(dk.data(), W.wk.f32().data(), dh.data(), T, Hkv * hd, D);
    linear_bwd(dv.data(), W.wv.f32().data(), dh.data(), T, Hkv * hd, D);
    dx = dxmid;
    rmsnorm_bwd(I.x[l].data(), W.attn_norm.data(), dh.data(), dx.data(), T, D, c.rms_eps);
  }
}

template struct StepResult<float>;
template struct StepResult<double>;
template class RouterStep<float>;
template class RouterStep<double>;

}  // namespace elastic::train
