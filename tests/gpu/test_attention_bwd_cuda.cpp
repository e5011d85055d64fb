// GPU tests (label gpu, run on the GPU machine): backward of the fused hybrid attention against the CPU reference
// elastic::train::attn_bwd on fresh random bf16 inputs. The gradients are added into random fp32 bases, so the test
// checks base + grad (and that nothing else was written).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "elastic/attention.h"
#include "elastic/cuda.h"
#include "elastic/cuda_attention.h"
#include "elastic/cuda_attention_bwd.h"
#include "train/attention_grad.h"
#include "gpu_test_util.h"

using namespace elastic;

namespace {

using elastic::gpu_test::Dev;
using elastic::gpu_test::to_bf16;
using elastic::gpu_test::from_bf16;



// Random bf16 values and their float copies (what the CPU sees).
void random_bf16(size_t n, std::mt19937& rng, float sd, std::vector<uint16_t>& b, std::vector<float>& f) {
  std::normal_distribution<float> N(0.f, sd);
  b.resize(n);
  f.resize(n);
  for (size_t i = 0; i < n; ++i) b[i] = to_bf16(N(rng)), f[i] = from_bf16(b[i]);
}
std::vector<float> random_f32(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> N(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = N(rng);
  return v;
}

struct Case {
  int T, Hq, Hkv, hd, block, sink, local;
  std::vector<HeadMode> modes;  // [Hkv]
  float q_sd = 1.f;
  bool xattn_lists = true;  // false: XAttn heads get null lists (dense), as the CPU does with empty masks
};

// Relative L2 error of (got - base) against ref; counts non-finite values.
double rel_err(const std::vector<float>& got, const std::vector<float>& base, const std::vector<float>& ref,
               size_t& bad) {
  double e2 = 0, r2 = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) ++bad;
    const double d = (double(got[i]) - base[i]) - ref[i];
    e2 += d * d;
    r2 += double(ref[i]) * ref[i];
  }
  return std::sqrt(e2 / std::max(r2, 1e-30));
}

void run_bwd_case(const Case& c) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  SEEDED_RNG(rng);
  const int T = c.T, hd = c.hd, B = c.block, nb = (T + B - 1) / B, group = c.Hq / c.Hkv;
  const size_t nq = size_t(T) * c.Hq * hd, nkv = size_t(T) * c.Hkv * hd;
  std::vector<uint16_t> q, k, v, dout;
  std::vector<float> qf, kf, vf, doutf;
  random_bf16(nq, rng, c.q_sd, q, qf);
  random_bf16(nkv, rng, 1.f, k, kf);
  random_bf16(nkv, rng, 1.f, v, vf);
  random_bf16(nq, rng, 1.f, dout, doutf);

  SparseSettings sp;
  sp.block = B, sp.sink = c.sink, sp.local = c.local;
  sp.xattn.block = B;
  const bool any_x = std::count(c.modes.begin(), c.modes.end(), HeadMode::XAttn) > 0;
  std::vector<BlockMask> masks;
  if (any_x && c.xattn_lists) masks = train::xattn_masks<float>(qf.data(), kf.data(), T, c.Hq, c.Hkv, hd, c.modes.data(), sp);
  const train::BlockKeep keep(c.modes.data(), c.Hkv, sp, masks.empty() ? nullptr : &masks, group);

  // CPU forward (lse) and backward on the bf16-rounded forward output.
  std::vector<float> out(nq), lse(size_t(c.Hq) * T);
  train::attn_fwd<float>(qf.data(), kf.data(), vf.data(), T, c.Hq, c.Hkv, hd, keep, out.data(), lse.data());
  std::vector<uint16_t> out_b(nq);
  for (size_t i = 0; i < nq; ++i) out_b[i] = to_bf16(out[i]), out[i] = from_bf16(out_b[i]);
  std::vector<float> dq_ref(nq, 0.f), dk_ref(nkv, 0.f), dv_ref(nkv, 0.f);
  train::attn_bwd<float>(qf.data(), kf.data(), vf.data(), out.data(), lse.data(), doutf.data(), T, c.Hq, c.Hkv, hd,
                         keep, dq_ref.data(), dk_ref.data(), dv_ref.data());

  // The CPU masks as the compact ascending lists the forward takes.
  std::vector<int32_t> blocks, offsets(size_t(c.Hq) * nb, 0), counts(size_t(c.Hq) * nb, 0);
  for (int h = 0; h < c.Hq && !masks.empty(); ++h) {
    if (c.modes[h / group] != HeadMode::XAttn) continue;
    for (int qb = 0; qb < nb; ++qb) {
      offsets[size_t(h) * nb + qb] = static_cast<int32_t>(blocks.size());
      for (int kb = 0; kb <= qb; ++kb)
        if (masks[h].at(qb, kb)) blocks.push_back(kb);
      counts[size_t(h) * nb + qb] = static_cast<int32_t>(blocks.size()) - offsets[size_t(h) * nb + qb];
    }
  }

  std::vector<cuda::KVHeadMeta> meta(c.Hkv);
  for (int h = 0; h < c.Hkv; ++h) meta[h] = cuda::make_kv_head_meta(c.modes[h], c.sink, c.local, B);
  const auto dq_base = random_f32(nq, rng), dk_base = random_f32(nkv, rng), dv_base = random_f32(nkv, rng);
  Dev<uint16_t> d_q(q), d_k(k), d_v(v), d_out(out_b), d_dout(dout);
  Dev<float> d_lse(lse), d_dq(dq_base), d_dk(dk_base), d_dv(dv_base);
  Dev<float> d_ws(std::vector<float>(cuda::attention_bwd_workspace_floats(T, c.Hq, hd), NAN));
  Dev<cuda::KVHeadMeta> d_meta(meta);
  Dev<int32_t> d_blocks(blocks.empty() ? std::vector<int32_t>{0} : blocks), d_off(offsets), d_cnt(counts);
  cuda::HybridAttnBwdParams p;
  p.q = d_q.p, p.k = d_k.p, p.v = d_v.p, p.out = d_out.p, p.lse = d_lse.p, p.dout = d_dout.p;
  p.dq = d_dq.p, p.dk = d_dk.p, p.dv = d_dv.p, p.workspace = d_ws.p;
  p.T = T, p.n_heads = c.Hq, p.n_kv_heads = c.Hkv, p.head_dim = hd, p.block = B;
  p.meta = d_meta.p;
  if (!masks.empty()) p.xattn = {d_blocks.p, d_off.p, d_cnt.p};
  cuda::hybrid_attention_bwd(p, nullptr);
  ELASTIC_CUDA_CHECK(cudaDeviceSynchronize());

  size_t bad = 0;
  const double eq = rel_err(d_dq.down(), dq_base, dq_ref, bad);
  const double ek = rel_err(d_dk.down(), dk_base, dk_ref, bad);
  const double ev = rel_err(d_dv.down(), dv_base, dv_ref, bad);
  EXPECT_EQ(bad, 0u) << "non-finite gradients";
  EXPECT_LT(eq, 2e-2) << "relative L2 error of dq";
  EXPECT_LT(ek, 2e-2) << "relative L2 error of dk";
  EXPECT_LT(ev, 2e-2) << "relative L2 error of dv";
}

const auto F = HeadMode::Full, S = HeadMode::Streaming, X = HeadMode::XAttn;

}  // namespace

TEST(CudaHybridAttentionBwd, FullGqa4Hd128) { run_bwd_case({1000, 8, 2, 128, 64, 128, 256, {F, F}}); }
TEST(CudaHybridAttentionBwd, MixedRoutingHd128Block64) {
  run_bwd_case({777, 16, 4, 128, 64, 64, 128, {F, S, X, S}, 2.f});
}
TEST(CudaHybridAttentionBwd, MixedRoutingHd64Group1Block128) {
  run_bwd_case({517, 4, 4, 64, 128, 100, 200, {S, X, F, X}, 2.f});
}
TEST(CudaHybridAttentionBwd, Group3Hd64) { run_bwd_case({450, 6, 2, 64, 64, 64, 128, {X, S}, 2.f}); }
TEST(CudaHybridAttentionBwd, Group3Hd64Block128NoSink) { run_bwd_case({611, 6, 2, 64, 128, 0, 128, {S, F}}); }
TEST(CudaHybridAttentionBwd, XAttnWithoutListsIsDense) {
  run_bwd_case({300, 4, 2, 128, 64, 64, 128, {X, F}, 1.f, false});
}

TEST(CudaHybridAttentionBwd, RejectsBadShapes) {
  cuda::HybridAttnBwdParams p;
  EXPECT_THROW(cuda::hybrid_attention_bwd(p, nullptr), std::invalid_argument);  // null pointers
  alignas(16) uint16_t h16[8] = {};
  alignas(16) float f32[8] = {};
  cuda::KVHeadMeta m;
  p.q = p.k = p.v = p.out = p.dout = h16;
  p.lse = f32;
  p.dq = p.dk = p.dv = p.workspace = f32;
  p.meta = &m;
  p.T = 8, p.n_heads = 4, p.n_kv_heads = 2, p.head_dim = 96;
  EXPECT_THROW(cuda::hybrid_attention_bwd(p, nullptr), std::invalid_argument);  // head_dim 96
  p.head_dim = 64, p.n_kv_heads = 3;
  EXPECT_THROW(cuda::hybrid_attention_bwd(p, nullptr), std::invalid_argument);  // 4 % 3
  p.n_kv_heads = 2, p.block = 32;
  EXPECT_THROW(cuda::hybrid_attention_bwd(p, nullptr), std::invalid_argument);  // block 32
  p.block = 64, p.T = 0;
  EXPECT_THROW(cuda::hybrid_attention_bwd(p, nullptr), std::invalid_argument);  // T 0
  p.T = 8, p.xattn.blocks = reinterpret_cast<const int32_t*>(f32);
  EXPECT_THROW(cuda::hybrid_attention_bwd(p, nullptr), std::invalid_argument);  // lists without offsets / counts
  try {
    p.xattn.blocks = nullptr, p.head_dim = 80;
    cuda::hybrid_attention_bwd(p, nullptr);
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim"), std::string::npos) << e.what();
  }
}
