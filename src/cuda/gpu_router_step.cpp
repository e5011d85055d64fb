// Router training step on the GPU: the CPU's RouterStep (src/train/router_step.cpp) on the bf16 backbone, with the
// same forward, the same gates and the same backward order. Activations are bf16 (as in inference), gradients fp32;
// a gradient is rounded to bf16 only where it enters a tensor-core GEMM or the attention backward.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/device_buffer.h"
#include "cuda/gpu_weights.h"
#include "elastic/gpu_model.h"
#include "elastic/cuda.h"
#include "elastic/cuda_attention_bwd.h"
#include "elastic/cuda_ops.h"
#include "elastic/cuda_train_ops.h"
#include "elastic/gpu_train.h"
#include "router/router_mlp.h"
#include "train/router_step.h"

namespace elastic::cuda {
namespace {

size_t bf16s(size_t n) { return n * 2; }
size_t f32s(size_t n) { return n * 4; }
constexpr int kHeadRows = 512;  // lm_head rows per chunk: [512, V] fp32 logits at a time

// Per-token bytes of one layer's recomputed activations and gradients (see the buffers below).
size_t layer_bytes_per_token(const ModelConfig& c) {
  const size_t D = c.hidden, Q = size_t(c.n_heads) * c.head_dim, K = size_t(c.n_kv_heads) * c.head_dim,
               F = c.intermediate, N = Q + 2 * K;
  const size_t acts = bf16s(D + N + Q + 2 * K + 3 * Q + 2 * D + 3 * F);  // xn qkv q k v of os o xmid h2 gu act
  const size_t lse = f32s(3 * size_t(c.n_heads));                        // lf ls lr
  const size_t grads = f32s(3 * D + F + 2 * Q + 3 * K);                   // dx dxmid dh da dO dq dk dv dkpool
  const size_t gbf = bf16s(2 * F + 2 * Q + N + std::max(D, Q));           // dgu dof dos dqkv dbf
  return acts + lse + grads + gbf;
}

}  // namespace

std::string GpuTrainPlan::describe(int max_T) const {
  std::ostringstream s;
  s << "gpu train plan (T <= " << max_T << "): weights " << gib(weights) << " | layer boundaries " << gib(boundaries)
    << " | one layer's activations + gradients " << gib(layer_acts) << " | lm_head chunk " << gib(head)
    << " | xattn lists " << gib(xattn) << " | total " << gib(total());
  return s.str();
}

GpuTrainPlan gpu_train_plan(const ModelConfig& c, int max_T, HeadMode sparse_mode) {
  GpuTrainPlan p;
  const size_t D = c.hidden, Hq = c.n_heads, V = c.vocab;
  p.boundaries = bf16s(size_t(c.n_layers + 1) * max_T * D);
  p.layer_acts = layer_bytes_per_token(c) * max_T + size_t(attention_bwd_workspace_floats(max_T, c.n_heads, c.head_dim)) * 4;
  p.head = size_t(kHeadRows) * (f32s(V) + bf16s(V) + bf16s(D) + f32s(D));
  if (sparse_mode == HeadMode::XAttn) {
    const int nb = (max_T + 63) / 64;
    p.xattn = (size_t(xattn_list_capacity(c.n_heads, nb)) + 2 * Hq * nb) * 4;
  }
  return p;
}

int gpu_train_max_tokens(const ModelConfig& c, size_t free_bytes, HeadMode sparse_mode) {
  int lo = 0, hi = 1 << 21;
  while (lo < hi) {  // largest T whose plan fits
    const int mid = (lo + hi + 1) / 2;
    if (gpu_train_plan(c, mid, sparse_mode).total() <= free_bytes) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

class GpuRouterTrainer {
 public:
  GpuRouterTrainer(GpuModel& g, int max_T, bool verbose) : m_(g.weights()), x_(g.exec()), max_T_(max_T) {
    const ModelConfig& c = m_.c;
    if (max_T <= 1) throw std::invalid_argument("gpu train: max_T must be at least 2");
    plan_ = gpu_train_plan(c, max_T, HeadMode::XAttn);
    const size_t need = plan_.total();  // before the model's weights (already resident) are added for the report
    plan_.weights = m_.bytes();
    size_t free_b = 0, total_b = 0;
    ELASTIC_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if (verbose) {
      std::fprintf(stderr, "%s\n", plan_.describe(max_T).c_str());
      std::fprintf(stderr, "gpu train: %s free; the longest sequence that fits is %d tokens\n", gib(free_b).c_str(),
                   gpu_train_max_tokens(c, free_b, HeadMode::XAttn));
    }
    if (need > free_b)
      throw std::runtime_error("gpu train: sequences of " + std::to_string(max_T) + " tokens need " + gib(need) +
                               " but " + gib(free_b) + " are free (lower --max-len)\n" + plan_.describe(max_T));
    const size_t T = max_T, D = c.hidden, Q = size_t(c.n_heads) * c.head_dim,
                 K = size_t(c.n_kv_heads) * c.head_dim, F = c.intermediate, N = Q + 2 * K, V = c.vocab;
    ids_.alloc(f32s(T));
    targets_.alloc(f32s(T));
    xb_.alloc(bf16s(size_t(c.n_layers + 1) * T * D));
    xn_.alloc(bf16s(T * D));
    qkv_.alloc(bf16s(T * N));
    q_.alloc(bf16s(T * Q));
    k_.alloc(bf16s(T * K));
    v_.alloc(bf16s(T * K));
    of_.alloc(bf16s(T * Q));
    os_.alloc(bf16s(T * Q));
    o_.alloc(bf16s(T * Q));
    xmid_.alloc(bf16s(T * D));
    h2_.alloc(bf16s(T * D));
    gu_.alloc(bf16s(T * 2 * F));
    act_.alloc(bf16s(T * F));
    lf_.alloc(f32s(T * c.n_heads));
    ls_.alloc(f32s(T * c.n_heads));
    lr_.alloc(f32s(T * c.n_heads));
    dx_.alloc(f32s(T * D));
    dxmid_.alloc(f32s(T * D));
    dh_.alloc(f32s(T * D));
    da_.alloc(f32s(T * F));
    dO_.alloc(f32s(T * Q));
    dq_.alloc(f32s(T * Q));
    dk_.alloc(f32s(T * K));
    dv_.alloc(f32s(T * K));
    dkpool_.alloc(f32s(T * K));
    dgu_.alloc(bf16s(T * 2 * F));
    dof_.alloc(bf16s(T * Q));
    dos_.alloc(bf16s(T * Q));
    dqkv_.alloc(bf16s(T * N));
    dbf_.alloc(bf16s(T * std::max(D, Q)));
    attn_ws_.alloc(size_t(attention_bwd_workspace_floats(max_T, c.n_heads, c.head_dim)) * 4);
    logits_.alloc(f32s(size_t(kHeadRows) * V));
    dlogits_.alloc(bf16s(size_t(kHeadRows) * V));
    hf_.alloc(bf16s(size_t(kHeadRows) * D));
    dhf_.alloc(f32s(size_t(kHeadRows) * D));
    loss_.alloc(4);
    row_loss_.alloc(f32s(kHeadRows));
    mix_ws_.alloc(f32s(size_t(mix_bwd_partials(c.n_kv_heads))));
    pool_sum_.alloc(f32s(K));
    z_dev_.alloc(f32s(c.n_kv_heads));
    dz_dev_.alloc(f32s(c.n_kv_heads));
    meta_full_.alloc(sizeof(KVHeadMeta) * c.n_kv_heads);
    meta_sparse_.alloc(sizeof(KVHeadMeta) * c.n_kv_heads);
    meta_routed_.alloc(sizeof(KVHeadMeta) * c.n_kv_heads);
  }

  train::StepResult<float> forward(const RouterSpec& spec, const float* P, const train::TrainSample& s,
                                   const train::GateSettings& g) {
    const ModelConfig& c = m_.c;
    const int T = static_cast<int>(s.ids.size()), L = c.n_layers, Hkv = c.n_kv_heads;
    if (spec.n_layers != L || spec.n_kv_heads != Hkv || spec.head_dim != c.head_dim)
      throw std::invalid_argument("router shape does not match the model");
    (void)router_config_name(spec.dense_mode, spec.sparse_mode);  // fa-ssa, fa-xa or xa-ssa, else a named error
    if (s.prompt_len < 1 || s.prompt_len >= T)
      throw std::invalid_argument("training sample needs a prompt and at least one answer token (prompt " +
                                  std::to_string(s.prompt_len) + " of " + std::to_string(T) + " tokens)");
    if (T > max_T_)
      throw std::invalid_argument("gpu train: a sample of " + std::to_string(T) + " tokens exceeds the plan's " +
                                  std::to_string(max_T_));
    for (int t = 0; t < T; ++t)
      if (s.ids[t] < 0 || s.ids[t] >= c.vocab)
        throw std::invalid_argument("training sample token id " + std::to_string(s.ids[t]) + " outside the vocabulary");
    spec_ = spec;
    P_ = P;
    layer_size_ = router::layer_param_count(spec.head_dim, spec.classes());
    sample_ = s;
    gate_ = g;
    T_ = T;
    n_ans_ = T - s.prompt_len;
    pool_pos_ = boundary_positions(s.prompt_len, spec.pool_first, spec.pool_last);
    z_all_.assign(size_t(L) * Hkv, 0.f);
    dsoft_all_.assign(z_all_.size() * spec.classes(), 0.f);
    p_full_.assign(z_all_.size(), 0.f);
    pooled_.assign(size_t(L) * Hkv * c.head_dim, 0.f);
    setup_sparse();
    cudaStream_t st = x_.stream;
    ELASTIC_CUDA_CHECK(cudaMemcpyAsync(ids_.ptr, s.ids.data(), f32s(T), cudaMemcpyHostToDevice, st));
    embed_rows_bf16(m_.embed.as<uint16_t>(), ids_.as<int32_t>(), xb(0), T, c.hidden, c.vocab, st);
    for (int l = 0; l < L; ++l) layer(l, /*decide=*/true, xb(l + 1));
    train::StepResult<float> r;
    r.z = z_all_;
    r.p_full = p_full_;
    r.n_answer = n_ans_;
    r.lm_loss = head(0.f, false) / n_ans_;
    return r;
  }

  void backward(float lm_weight, float omega_weight, float* dparams) {
    if (T_ == 0) throw std::logic_error("GpuRouterStep::backward without a forward");
    const ModelConfig& c = m_.c;
    const int T = T_, D = c.hidden, L = c.n_layers, Hq = c.n_heads, Hkv = c.n_kv_heads, hd = c.head_dim,
              F = c.intermediate, C = spec_.classes(), Q = Hq * hd, K = Hkv * hd, N = Q + 2 * K;
    cudaStream_t st = x_.stream;
    ELASTIC_CUDA_CHECK(cudaMemsetAsync(dx_.ptr, 0, f32s(size_t(T) * D), st));
    head(lm_weight / n_ans_, true);
    const float dz_omega = -omega_weight / float(size_t(L) * Hkv);
    std::vector<float> dz(Hkv), dlogits(size_t(Hkv) * C), dpooled(size_t(Hkv) * hd);
    std::vector<float> logits(size_t(Hkv) * C);
    router::MlpActs<float> acts;
    const int nb = static_cast<int>(pool_pos_.size());
    for (int l = L - 1; l >= 0; --l) {
      const GpuLayer& W = m_.layers[l];
      layer(l, /*decide=*/false, nullptr);
      // MLP: dx -> da -> d(gate, up) -> dh2 -> through the MLP norm into dxmid (+ the residual's dx).
      convert_f32_to_bf16(dx_.as<float>(), dbf_.as<uint16_t>(), int64_t(T) * D, st);
      x_.gemm->bf16_dx_f32(dbf_.as<uint16_t>(), W.w_down.as<uint16_t>(), da_.as<float>(), T, D, F, st);
      swiglu_bwd(gu_.as<uint16_t>(), da_.as<float>(), dgu_.as<uint16_t>(), T, F, st);
      x_.gemm->bf16_dx_f32(dgu_.as<uint16_t>(), W.w_gu.as<uint16_t>(), dh_.as<float>(), T, 2 * F, D, st);
      ELASTIC_CUDA_CHECK(cudaMemcpyAsync(dxmid_.ptr, dx_.ptr, f32s(size_t(T) * D), cudaMemcpyDeviceToDevice, st));
      rmsnorm_bwd(xmid_.as<uint16_t>(), W.mlp_norm.as<uint16_t>(), dh_.as<float>(), dxmid_.as<float>(), T, D,
                  c.rms_eps, st);
      // o_proj, then the gate's mixture: dz = sum dO . (O_full - O_sparse) per KV head.
      convert_f32_to_bf16(dxmid_.as<float>(), dbf_.as<uint16_t>(), int64_t(T) * D, st);
      x_.gemm->bf16_dx_f32(dbf_.as<uint16_t>(), W.wo.as<uint16_t>(), dO_.as<float>(), T, D, Q, st);
      ELASTIC_CUDA_CHECK(cudaMemsetAsync(dz_dev_.ptr, 0, f32s(Hkv), st));
      mix_bwd(dO_.as<float>(), of_.as<uint16_t>(), os_.as<uint16_t>(), z_dev_.as<float>(), dof_.as<uint16_t>(),
              dos_.as<uint16_t>(), dz_dev_.as<float>(), mix_ws_.as<float>(), T, Hq, Hkv, hd, st);
      ELASTIC_CUDA_CHECK(cudaMemsetAsync(dq_.ptr, 0, f32s(size_t(T) * Q), st));
      ELASTIC_CUDA_CHECK(cudaMemsetAsync(dk_.ptr, 0, f32s(size_t(T) * K), st));
      ELASTIC_CUDA_CHECK(cudaMemsetAsync(dv_.ptr, 0, f32s(size_t(T) * K), st));
      const float* z = z_all_.data() + size_t(l) * Hkv;
      if (gate_.hard) {
        // Each head's weight is 0 or 1: one routed backward over the branch each head took (the other is zero).
        convert_f32_to_bf16(dO_.as<float>(), dbf_.as<uint16_t>(), int64_t(T) * Q, st);
        attention_bwd(meta_routed_, o_, lr_, dbf_);
      } else {
        bool any_full = false, any_sparse = false;
        for (int h = 0; h < Hkv; ++h) any_full |= z[h] != 0.f, any_sparse |= z[h] != 1.f;
        if (any_full) attention_bwd(meta_full_, of_, lf_, dof_);
        if (any_sparse) attention_bwd(meta_sparse_, os_, ls_, dos_);
      }
      // Router, on the host: dz -> (straight-through) dlogits -> MLP -> pooled keys.
      ELASTIC_CUDA_CHECK(cudaMemcpyAsync(dz.data(), dz_dev_.ptr, f32s(Hkv), cudaMemcpyDeviceToHost, st));
      ELASTIC_CUDA_CHECK(cudaStreamSynchronize(st));
      const float* Pl = P_ + layer_size_ * l;
      const float* pooled = pooled_.data() + size_t(l) * Hkv * hd;
      router::mlp_fwd<float>(Pl, hd, C, pooled, Hkv, logits.data(), &acts);
      for (int h = 0; h < Hkv; ++h)
        for (int j = 0; j < C; ++j)
          dlogits[h * C + j] = (dz[h] + dz_omega) * dsoft_all_[(size_t(l) * Hkv + h) * C + j];
      std::fill(dpooled.begin(), dpooled.end(), 0.f);
      // Under the head-identity input the router reads no keys: dpooled stays zero, nothing reaches the backbone.
      router::mlp_bwd<float>(Pl, hd, C, pooled, Hkv, acts, dlogits.data(), dparams + layer_size_ * l,
                             spec_.input == RouterInput::Pooled ? dpooled.data() : nullptr);
      // The pooled keys' gradient lands on the boundary rows of k (after k_norm, before RoPE).
      ELASTIC_CUDA_CHECK(cudaMemsetAsync(dkpool_.ptr, 0, f32s(size_t(T) * K), st));
      for (float& x : dpooled) x /= float(nb);
      pool_rows_.assign(size_t(nb) * K, 0.f);
      for (int i = 0; i < nb; ++i) std::copy(dpooled.begin(), dpooled.end(), pool_rows_.begin() + size_t(i) * K);
      for (int i = 0; i < nb;) {
        int j = i + 1;
        while (j < nb && pool_pos_[j] == pool_pos_[j - 1] + 1) ++j;
        ELASTIC_CUDA_CHECK(cudaMemcpyAsync(dkpool_.as<float>() + size_t(pool_pos_[i]) * K,
                                           pool_rows_.data() + size_t(i) * K, f32s(size_t(j - i) * K),
                                           cudaMemcpyHostToDevice, st));
        i = j;
      }
      // RoPE, q/k norms, the fused q/k/v projection, the attention norm; dx = dxmid + that path.
      QkvPostBwdParams qb;
      fill_qkv_bwd(qb, W, T);
      qkv_post_bwd(qb, st);
      x_.gemm->bf16_dx_f32(dqkv_.as<uint16_t>(), W.w_qkv.as<uint16_t>(), dh_.as<float>(), T, N, D, st);
      ELASTIC_CUDA_CHECK(cudaMemcpyAsync(dx_.ptr, dxmid_.ptr, f32s(size_t(T) * D), cudaMemcpyDeviceToDevice, st));
      rmsnorm_bwd(xb(l), W.attn_norm.as<uint16_t>(), dh_.as<float>(), dx_.as<float>(), T, D, c.rms_eps, st);
      // pool_rows_ must outlive its asynchronous upload.
      ELASTIC_CUDA_CHECK(cudaStreamSynchronize(st));
    }
  }

 private:
  const GpuWeights& m_;  // the model's weights
  const GpuExec x_;       // its stream, GEMM and attention kernel
  int max_T_;
  GpuTrainPlan plan_;
  // Last forward.
  RouterSpec spec_;
  const float* P_ = nullptr;
  size_t layer_size_ = 0;
  train::TrainSample sample_;
  train::GateSettings gate_;
  int T_ = 0, n_ans_ = 0;
  std::vector<int> pool_pos_;
  std::vector<float> z_all_, dsoft_all_, p_full_, pooled_, pool_rows_;
  int xa_block_ = 0;
  SparseSettings sparse_set_{};
  bool sparse_ready_ = false;

  DeviceBuffer ids_, targets_, xb_;
  DeviceBuffer xn_, qkv_, q_, k_, v_, of_, os_, o_, xmid_, h2_, gu_, act_, lf_, ls_, lr_;
  DeviceBuffer dx_, dxmid_, dh_, da_, dO_, dq_, dk_, dv_, dkpool_, dgu_, dof_, dos_, dqkv_, dbf_, attn_ws_;
  DeviceBuffer logits_, dlogits_, hf_, dhf_, loss_, row_loss_, mix_ws_, pool_sum_, pq_, pk_, pv_, z_dev_, dz_dev_;
  DeviceBuffer meta_full_, meta_sparse_, meta_routed_, xa_blocks_, xa_offsets_, xa_counts_, xa_scratch_;

  uint16_t* xb(int l) { return xb_.as<uint16_t>() + size_t(l) * max_T_ * m_.c.hidden; }

  // Device metadata of the two branches, and XAttention list buffers for this spec's block size.
  void setup_sparse() {
    const ModelConfig& c = m_.c;
    const SparseSettings& s = spec_.sparse;
    validate_sparse(s, "gpu train");
    if (sparse_ready_ && s.block == sparse_set_.block && s.sink == sparse_set_.sink && s.local == sparse_set_.local &&
        s.xattn.stride == sparse_set_.xattn.stride && spec_.sparse_mode == sparse_mode_ &&
        spec_.dense_mode == dense_mode_)  // the stride sizes the estimator's scratch
      return;
    // meta_full_ holds the dense class's mode: full attention, or XAttention for XA-SSA.
    std::vector<KVHeadMeta> full(c.n_kv_heads, make_kv_head_meta(spec_.dense_mode, s.sink, s.local, s.block));
    std::vector<KVHeadMeta> sp(c.n_kv_heads, make_kv_head_meta(spec_.sparse_mode, s.sink, s.local, s.block));
    ELASTIC_CUDA_CHECK(cudaMemcpy(meta_full_.ptr, full.data(), meta_full_.bytes, cudaMemcpyHostToDevice));
    ELASTIC_CUDA_CHECK(cudaMemcpy(meta_sparse_.ptr, sp.data(), meta_sparse_.bytes, cudaMemcpyHostToDevice));
    if (has_xattn() && xa_block_ != s.block) {
      const int nb = (max_T_ + s.block - 1) / s.block;
      xa_blocks_.alloc(size_t(xattn_list_capacity(c.n_heads, nb)) * 4);
      xa_offsets_.alloc(size_t(c.n_heads) * nb * 4);
      xa_counts_.alloc(size_t(c.n_heads) * nb * 4);
      xa_block_ = s.block;
    }
    if (has_xattn()) {  // the model's estimator's scratch (one call per sequence: T = max_T_ at most, every KV head)
      const size_t scratch = xattn_estimate_scratch_bytes(x_.xattn_estimate, max_T_, max_T_, c.n_kv_heads,
                                                          c.n_heads / c.n_kv_heads, c.head_dim, s.xattn.stride, s.block);
      if (xa_scratch_.bytes < scratch) xa_scratch_.alloc(scratch);
    }
    sparse_set_ = s;
    sparse_mode_ = spec_.sparse_mode;
    dense_mode_ = spec_.dense_mode;
    sparse_ready_ = true;
  }
  HeadMode sparse_mode_ = HeadMode::Full, dense_mode_ = HeadMode::Full;
  // One branch runs XAttention (FA-XA: the sparse one; XA-SSA: the dense one): its selection lists are estimated.
  bool has_xattn() const { return spec_.sparse_mode == HeadMode::XAttn || spec_.dense_mode == HeadMode::XAttn; }

  XAttnBlockLists lists() const {
    XAttnBlockLists x;
    if (has_xattn()) {
      x.blocks = xa_blocks_.as<int32_t>();
      x.offsets = xa_offsets_.as<int32_t>();
      x.counts = xa_counts_.as<int32_t>();
    }
    return x;
  }

  void attention_fwd(const DeviceBuffer& meta, DeviceBuffer& out, DeviceBuffer& lse) {
    const ModelConfig& c = m_.c;
    HybridAttnParams ap;
    ap.q = q_.as<uint16_t>();
    ap.k = k_.as<uint16_t>();
    ap.v = v_.as<uint16_t>();
    ap.out = out.as<uint16_t>();
    ap.lse = lse.as<float>();
    ap.T = T_, ap.pos0 = 0, ap.n_heads = c.n_heads, ap.n_kv_heads = c.n_kv_heads, ap.head_dim = c.head_dim;
    ap.block = spec_.sparse.block;
    ap.meta = meta.as<KVHeadMeta>();
    ap.xattn = lists();
    apply_attention_config(x_.attention, ap);
    hybrid_attention_fwd(ap, x_.stream);
  }

  void attention_bwd(const DeviceBuffer& meta, const DeviceBuffer& out, const DeviceBuffer& lse,
                     const DeviceBuffer& dout) {
    const ModelConfig& c = m_.c;
    HybridAttnBwdParams bp;
    bp.q = q_.as<uint16_t>();
    bp.k = k_.as<uint16_t>();
    bp.v = v_.as<uint16_t>();
    bp.out = out.as<uint16_t>();
    bp.lse = lse.as<float>();
    bp.dout = dout.as<uint16_t>();
    bp.dq = dq_.as<float>();
    bp.dk = dk_.as<float>();
    bp.dv = dv_.as<float>();
    bp.workspace = attn_ws_.as<float>();
    bp.T = T_, bp.n_heads = c.n_heads, bp.n_kv_heads = c.n_kv_heads, bp.head_dim = c.head_dim;
    bp.block = spec_.sparse.block;
    bp.meta = meta.as<KVHeadMeta>();
    bp.xattn = lists();
    hybrid_attention_bwd(bp, x_.stream);
  }

  void fill_qkv_bwd(QkvPostBwdParams& qb, const GpuLayer& W, int T) {
    const ModelConfig& c = m_.c;
    qb.qkv = qkv_.as<uint16_t>();
    qb.bias = W.b_qkv.as<uint16_t>();
    qb.q_norm = W.q_norm.as<uint16_t>();
    qb.k_norm = W.k_norm.as<uint16_t>();
    qb.inv_freq = m_.inv_freq.as<float>();
    qb.eps = c.rms_eps;
    qb.T = T, qb.n_heads = c.n_heads, qb.n_kv_heads = c.n_kv_heads, qb.head_dim = c.head_dim;
    qb.dq_rot = dq_.as<float>();
    qb.dk_rot = dk_.as<float>();
    qb.dv = dv_.as<float>();
    qb.dk_pre_rope_add = dkpool_.as<float>();
    qb.dqkv = dqkv_.as<uint16_t>();
  }

  // Layer l from its saved input xb(l). decide: run the router and draw the gates (the forward); else reuse them
  // (the backward's recompute, which also needs both branches' outputs for the gates' gradient).
  void layer(int l, bool decide, uint16_t* xout) {
    const ModelConfig& c = m_.c;
    const GpuLayer& W = m_.layers[l];
    const int T = T_, D = c.hidden, Hq = c.n_heads, Hkv = c.n_kv_heads, hd = c.head_dim, F = c.intermediate,
              Q = Hq * hd, K = Hkv * hd, N = Q + 2 * K;
    cudaStream_t st = x_.stream;
    uint16_t* xin = xb(l);
    rmsnorm_bf16_stream(xin, W.attn_norm.as<uint16_t>(), xn_.as<uint16_t>(), T, D, c.rms_eps, st);
    // Bias left to qkv_post (the backward reads the projection before its bias).
    x_.gemm->bf16(xn_.as<uint16_t>(), W.w_qkv.as<uint16_t>(), qkv_.as<uint16_t>(), T, N, D, st);
    QkvPostParams qp;
    qp.qkv = qkv_.as<uint16_t>();
    qp.bias = W.b_qkv.as<uint16_t>();
    qp.q_norm = W.q_norm.as<uint16_t>();
    qp.k_norm = W.k_norm.as<uint16_t>();
    qp.inv_freq = m_.inv_freq.as<float>();
    qp.eps = c.rms_eps;
    qp.T = T, qp.pos0 = 0, qp.n_heads = Hq, qp.n_kv_heads = Hkv, qp.head_dim = hd;
    qp.q_out = q_.as<uint16_t>();
    qp.k_out = k_.as<uint16_t>();
    qp.v_out = v_.as<uint16_t>();
    qkv_post(qp, st);
    float* z = z_all_.data() + size_t(l) * Hkv;
    if (decide) {
      route(l, qp);
    }
    // Gate values on the device (the mixture) and the routed metadata (each head's taken branch).
    std::vector<KVHeadMeta> routed(Hkv);
    const SparseSettings& s = spec_.sparse;
    for (int h = 0; h < Hkv; ++h)
      routed[h] = make_kv_head_meta(z[h] == 1.f ? spec_.dense_mode : spec_.sparse_mode, s.sink, s.local, s.block);
    ELASTIC_CUDA_CHECK(cudaMemcpyAsync(z_dev_.ptr, z, f32s(Hkv), cudaMemcpyHostToDevice, st));
    ELASTIC_CUDA_CHECK(cudaMemcpyAsync(meta_routed_.ptr, routed.data(), meta_routed_.bytes, cudaMemcpyHostToDevice, st));
    if (has_xattn()) {
      XAttnEstimateParams ep;
      ep.q = q_.as<uint16_t>();
      ep.k = k_.as<uint16_t>();
      ep.T = T, ep.pos0 = 0, ep.n_heads = Hq, ep.n_kv_heads = Hkv, ep.head_dim = hd;
      ep.block = s.block, ep.stride = s.xattn.stride, ep.tau = s.xattn.tau;
      ep.meta = (spec_.dense_mode == HeadMode::XAttn ? meta_full_ : meta_sparse_).as<KVHeadMeta>();
      ep.blocks = xa_blocks_.as<int32_t>();
      ep.offsets = xa_offsets_.as<int32_t>();
      ep.counts = xa_counts_.as<int32_t>();
      ep.kernel = x_.xattn_estimate;  // the model's estimator
      ep.gemm = x_.gemm, ep.scratch = xa_scratch_.ptr, ep.scratch_bytes = xa_scratch_.bytes;
      xattn_estimate_cuda(ep, st);
    }
    if (decide && gate_.hard) {
      attention_fwd(meta_routed_, o_, lr_);  // hard gates: the output is exactly the taken branch's
    } else {
      attention_fwd(meta_full_, of_, lf_);
      attention_fwd(meta_sparse_, os_, ls_);
      mix_fwd(of_.as<uint16_t>(), os_.as<uint16_t>(), z_dev_.as<float>(), o_.as<uint16_t>(), T, Hq, Hkv, hd, st);
      if (gate_.hard)  // the routed log-sum-exp rows for the routed backward ([Hq, T]: one row per query head)
        for (int h = 0; h < Hq; ++h)
          ELASTIC_CUDA_CHECK(cudaMemcpyAsync(lr_.as<float>() + size_t(h) * T_,
                                             (z[h / (Hq / Hkv)] == 1.f ? lf_ : ls_).as<float>() + size_t(h) * T_,
                                             f32s(T_), cudaMemcpyDeviceToDevice, st));
    }
    ELASTIC_CUDA_CHECK(cudaMemcpyAsync(xmid_.ptr, xin, bf16s(size_t(T) * D), cudaMemcpyDeviceToDevice, st));
    x_.gemm->bf16(o_.as<uint16_t>(), W.wo.as<uint16_t>(), xmid_.as<uint16_t>(), T, D, Q, st, nullptr, 1.f);
    rmsnorm_bf16_stream(xmid_.as<uint16_t>(), W.mlp_norm.as<uint16_t>(), h2_.as<uint16_t>(), T, D, c.rms_eps, st);
    x_.gemm->bf16(h2_.as<uint16_t>(), W.w_gu.as<uint16_t>(), gu_.as<uint16_t>(), T, 2 * F, D, st);
    swiglu_bf16(gu_.as<uint16_t>(), act_.as<uint16_t>(), T, F, st);
    if (xout) {
      ELASTIC_CUDA_CHECK(cudaMemcpyAsync(xout, xmid_.ptr, bf16s(size_t(T) * D), cudaMemcpyDeviceToDevice, st));
      x_.gemm->bf16(act_.as<uint16_t>(), W.w_down.as<uint16_t>(), xout, T, D, F, st, nullptr, 1.f);
    }
  }

  // The router of layer l: boundary rows' keys after k_norm, before RoPE, mean-pooled; its MLP and gate on the host.
  void route(int l, const QkvPostParams& qp) {
    const ModelConfig& c = m_.c;
    const int Hkv = c.n_kv_heads, hd = c.head_dim, Q = c.n_heads * hd, K = Hkv * hd, N = Q + 2 * K,
              C = spec_.classes();
    cudaStream_t st = x_.stream;
    const int nb = static_cast<int>(pool_pos_.size());
    if (pq_.bytes < bf16s(size_t(nb) * Q)) {
      pq_.alloc(bf16s(size_t(nb) * Q));
      pk_.alloc(bf16s(size_t(nb) * K));
      pv_.alloc(bf16s(size_t(nb) * K));
    }
    ELASTIC_CUDA_CHECK(cudaMemsetAsync(pool_sum_.ptr, 0, pool_sum_.bytes, st));
    for (int i = 0; i < nb;) {  // two ascending runs of positions
      int j = i + 1;
      while (j < nb && pool_pos_[j] == pool_pos_[j - 1] + 1) ++j;
      QkvPostParams pp = qp;
      pp.qkv = qkv_.as<uint16_t>() + size_t(pool_pos_[i]) * N;
      pp.T = j - i;
      pp.pos0 = pool_pos_[i];
      pp.q_out = pq_.as<uint16_t>();
      pp.k_out = pk_.as<uint16_t>();
      pp.v_out = pv_.as<uint16_t>();
      pp.kv_rows_from_zero = true;
      pp.pool_sum = pool_sum_.as<float>();
      pp.pool_first_end = INT_MAX;  // every row of this call is a pool row
      pp.pool_last_begin = INT_MAX;
      qkv_post(pp, st);
      i = j;
    }
    float* pooled = pooled_.data() + size_t(l) * K;
    ELASTIC_CUDA_CHECK(cudaMemcpyAsync(pooled, pool_sum_.ptr, f32s(K), cudaMemcpyDeviceToHost, st));
    ELASTIC_CUDA_CHECK(cudaStreamSynchronize(st));
    for (int j = 0; j < K; ++j) pooled[j] /= float(nb);
    router::apply_router_input(spec_.input, Hkv, hd, pooled);
    std::vector<float> logits(size_t(Hkv) * C);
    router::mlp_fwd<float>(P_ + layer_size_ * l, hd, C, pooled, Hkv, logits.data(), nullptr);
    for (int h = 0; h < Hkv; ++h) {
      const size_t i = size_t(l) * Hkv + h;
      const float noise = gate_.noise ? float((*gate_.noise)[i]) : 0.f;
      z_all_[i] = router::gate<float>(logits.data() + h * C, C, noise, float(gate_.tau), gate_.hard,
                                      dsoft_all_.data() + i * C, &p_full_[i]);
    }
  }

  // Final norm, lm_head and cross-entropy over the answer rows, kHeadRows at a time. Returns the summed loss; with
  // grad, adds d(scale * loss)/dx into dx_.
  float head(float scale, bool grad) {
    const ModelConfig& c = m_.c;
    const int D = c.hidden, V = c.vocab, r0 = sample_.prompt_len - 1, n = n_ans_;
    cudaStream_t st = x_.stream;
    ELASTIC_CUDA_CHECK(cudaMemcpyAsync(targets_.ptr, sample_.ids.data() + r0 + 1, f32s(n), cudaMemcpyHostToDevice, st));
    ELASTIC_CUDA_CHECK(cudaMemsetAsync(loss_.ptr, 0, 4, st));
    const uint16_t* xL = xb(c.n_layers);
    for (int i0 = 0; i0 < n; i0 += kHeadRows) {
      const int rows = std::min(kHeadRows, n - i0);
      const uint16_t* x = xL + size_t(r0 + i0) * D;
      rmsnorm_bf16_stream(x, m_.final_norm.as<uint16_t>(), hf_.as<uint16_t>(), rows, D, c.rms_eps, st);
      x_.gemm->bf16_out_f32(hf_.as<uint16_t>(), m_.head_weight(), logits_.as<float>(), rows, V, D, st);
      cross_entropy_rows(logits_.as<float>(), rows, V, targets_.as<int32_t>() + i0, scale, row_loss_.as<float>(),
                         loss_.as<float>(), grad ? dlogits_.as<uint16_t>() : nullptr, st);
      if (grad) {
        x_.gemm->bf16_dx_f32(dlogits_.as<uint16_t>(), m_.head_weight(), dhf_.as<float>(), rows, V, D, st);
        rmsnorm_bwd(x, m_.final_norm.as<uint16_t>(), dhf_.as<float>(), dx_.as<float>() + size_t(r0 + i0) * D, rows,
                    D, c.rms_eps, st);
      }
    }
    float loss = 0;
    ELASTIC_CUDA_CHECK(cudaMemcpyAsync(&loss, loss_.ptr, 4, cudaMemcpyDeviceToHost, st));
    ELASTIC_CUDA_CHECK(cudaStreamSynchronize(st));
    return loss;
  }
};

namespace {

class GpuStepRunner : public train::StepRunner {
 public:
  GpuStepRunner(std::shared_ptr<GpuRouterTrainer> t, const RouterSpec& spec, const float* P)
      : t_(std::move(t)), spec_(spec), P_(P) {}
  train::StepResult<float> forward(const train::TrainSample& s, const train::GateSettings& g) override {
    return t_->forward(spec_, P_, s, g);
  }
  void backward(float lm_weight, float omega_weight, float* dparams) override {
    t_->backward(lm_weight, omega_weight, dparams);
  }

 private:
  std::shared_ptr<GpuRouterTrainer> t_;
  RouterSpec spec_;
  const float* P_;
};

}  // namespace

StepRunnerFactory gpu_step_runner_factory(GpuModel& g, int max_T, bool verbose) {
  auto t = std::make_shared<GpuRouterTrainer>(g, max_T, verbose);
  return [t](const RouterSpec& spec, const float* P) -> std::unique_ptr<train::StepRunner> {
    return std::make_unique<GpuStepRunner>(t, spec, P);
  };
}

}  // namespace elastic::cuda
