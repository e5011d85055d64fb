// GPU tests (label gpu, run on the GPU machine): fused hybrid attention forward, XAttention estimation and decode
// attention against the CPU reference (src/attention/attention.cpp) on fresh random bf16 inputs; outputs are
// poisoned with NaN before every launch.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <vector>

#include "elastic/attention.h"
#include "elastic/cuda.h"
#include "elastic/cuda_attention.h"
#include "elastic/cuda_gemm.h"
#include "attention_variants.h"  // dev/cuda: the prefill kernel's measurement variants
#include "contiguous_decode.h"  // dev/cuda: the contiguous-cache decode
#include "xattn_estimate_variants.h"  // dev/cuda: the estimator's earlier forms
#include "gpu_test_util.h"

using namespace elastic;

namespace {

using elastic::gpu_test::Dev;
using elastic::gpu_test::to_bf16;
using elastic::gpu_test::from_bf16;
using elastic::gpu_test::kNaNBf16;



using elastic::gpu_test::random_bf16;

struct Case {
  int T, pos0, Hq, Hkv, hd, block, sink, local;
  std::vector<HeadMode> modes;  // [Hkv]
  float q_sd = 1.f;
};

const char* kernel_name(cuda::AttnKernel k) {
  switch (k) {
    case cuda::AttnKernel::Wgmma: return "wgmma";
    case cuda::AttnKernel::WgmmaNoPingpong: return "wgmma-no-pingpong";
    case cuda::AttnKernel::WgmmaPersistent: return "wgmma-persistent";
    case cuda::AttnKernel::WgmmaOverlap: return "wgmma-overlap";
    case cuda::AttnKernel::WgmmaOverlapNoPingpong: return "wgmma-overlap-no-pingpong";
    case cuda::AttnKernel::Simple: return "simple";
    case cuda::AttnKernel::Auto: return "auto";
  }
  return "?";
}

// Draws one prefill case's inputs, computes the CPU reference once, then runs each kernel of `kernels` on the same
// inputs (outputs poisoned before every launch) and compares out and lse.
void run_prefill_case_with(const Case& c, std::initializer_list<cuda::AttnKernel> kernels, int opts = -1) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  SEEDED_RNG(rng);
  const int n_pos = c.pos0 + c.T, hd = c.hd, B = c.block, nb = (n_pos + B - 1) / B, group = c.Hq / c.Hkv;
  auto q = random_bf16(size_t(c.T) * c.Hq * hd, rng, c.q_sd);
  auto k = random_bf16(size_t(n_pos) * c.Hkv * hd, rng, 1.f);
  auto v = random_bf16(size_t(n_pos) * c.Hkv * hd, rng, 1.f);

  // CPU reference on the bf16-rounded values.
  std::vector<float> qf(q.size()), out_ref(q.size());
  for (size_t i = 0; i < q.size(); ++i) qf[i] = from_bf16(q[i]);
  std::vector<std::vector<float>> kh(c.Hkv), vh(c.Hkv);  // per KV head [n_pos, hd]
  std::vector<HeadKV> kv(c.Hkv);
  for (int h = 0; h < c.Hkv; ++h) {
    kh[h].resize(size_t(n_pos) * hd);
    vh[h].resize(size_t(n_pos) * hd);
    for (int j = 0; j < n_pos; ++j)
      for (int d = 0; d < hd; ++d) {
        kh[h][size_t(j) * hd + d] = from_bf16(k[(size_t(j) * c.Hkv + h) * hd + d]);
        vh[h][size_t(j) * hd + d] = from_bf16(v[(size_t(j) * c.Hkv + h) * hd + d]);
      }
    kv[h].k_cache = kh[h].data();
    kv[h].v_cache = vh[h].data();
    kv[h].k_new = kh[h].data() + size_t(c.pos0) * hd;
    kv[h].v_new = vh[h].data() + size_t(c.pos0) * hd;
    kv[h].new_stride = kv[h].hd = hd;
    kv[h].pos0 = c.pos0;
  }
  SparseSettings sp;
  sp.block = B;
  sp.sink = c.sink;
  sp.local = c.local;
  sp.xattn.block = B;
  AttentionArgs a;
  a.q = qf.data();
  a.kv = kv.data();
  a.out = out_ref.data();
  a.T = c.T, a.pos0 = c.pos0, a.n_heads = c.Hq, a.n_kv_heads = c.Hkv, a.head_dim = hd;
  a.modes = c.modes.data();
  a.sparse = &sp;
  attention_forward(a);

  // The same XAttention masks the CPU used (query rows before pos0 zero), as compact lists for the GPU.
  const bool xsel = c.pos0 % B == 0;
  std::vector<BlockMask> masks(c.Hq);
  std::vector<int32_t> blocks, offsets(size_t(c.Hq) * nb, 0), counts(size_t(c.Hq) * nb, 0);
  for (int h = 0; h < c.Hq; ++h) {
    if (c.modes[h / group] != HeadMode::XAttn || !xsel) continue;
    std::vector<float> qh(size_t(n_pos) * hd, 0.f);
    for (int t = 0; t < c.T; ++t)
      for (int d = 0; d < hd; ++d) qh[size_t(c.pos0 + t) * hd + d] = qf[(size_t(t) * c.Hq + h) * hd + d];
    masks[h] = xattn_select(qh.data(), kh[h / group].data(), n_pos, hd, sp.xattn);
    for (int qb = 0; qb < nb; ++qb) {
      offsets[size_t(h) * nb + qb] = static_cast<int32_t>(blocks.size());
      for (int kb = 0; kb <= qb; ++kb)
        if (masks[h].at(qb, kb)) blocks.push_back(kb);
      counts[size_t(h) * nb + qb] = static_cast<int32_t>(blocks.size()) - offsets[size_t(h) * nb + qb];
    }
  }
  auto keep = [&](int h, int qb, int kb) {
    switch (c.modes[h / group]) {
      case HeadMode::Full: return true;
      case HeadMode::Streaming: return streaming_keeps(qb, kb, sp);
      case HeadMode::XAttn: return !xsel || masks[h].at(qb, kb);
    }
    return true;
  };
  // CPU log-sum-exp (double) over the same keys.
  const double scale = 1.0 / std::sqrt(double(hd));
  std::vector<double> lse_ref(size_t(c.Hq) * c.T);
  for (int h = 0; h < c.Hq; ++h)
    for (int t = 0; t < c.T; ++t) {
      const int p = c.pos0 + t, qb = p / B;
      std::vector<double> s;
      for (int j = 0; j <= p; ++j) {
        if (!keep(h, qb, j / B)) continue;
        double d = 0;
        for (int e = 0; e < hd; ++e) d += double(qf[(size_t(t) * c.Hq + h) * hd + e]) * kh[h / group][size_t(j) * hd + e];
        s.push_back(d * scale);
      }
      const double mx = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double x : s) sum += std::exp(x - mx);
      lse_ref[size_t(h) * c.T + t] = mx + std::log(sum);
    }

  // GPU.
  std::vector<cuda::KVHeadMeta> meta(c.Hkv);
  for (int h = 0; h < c.Hkv; ++h) meta[h] = cuda::make_kv_head_meta(c.modes[h], c.sink, c.local, B);
  // Every device tensor sits between NaN rows (200 before, 200 after), as the model's scratch buffers hold stale
  // rows around the ones a call is given: a kernel that reads outside its rows turns its output NaN, and one that
  // writes outside rows [0, T) of out (e.g. a bulk store at a negative row) is caught below.
  const size_t slack_rows = 200;
  auto with_slack = [&](const std::vector<uint16_t>& x, int heads) {
    std::vector<uint16_t> y(slack_rows * heads * hd, kNaNBf16);
    y.insert(y.end(), x.begin(), x.end());
    y.resize(y.size() + slack_rows * heads * hd, kNaNBf16);
    return y;
  };
  const size_t q_slack = slack_rows * c.Hq * hd, kv_slack = slack_rows * c.Hkv * hd;
  Dev<uint16_t> dq(with_slack(q, c.Hq)), dk(with_slack(k, c.Hkv)), dv(with_slack(v, c.Hkv)),
      dout(q.size() + 2 * q_slack);
  Dev<float> dlse(size_t(c.Hq) * c.T);
  Dev<cuda::KVHeadMeta> dmeta(meta);
  Dev<int32_t> dblocks(blocks.empty() ? std::vector<int32_t>{0} : blocks), doff(offsets), dcnt(counts);
  cuda::HybridAttnParams p;
  p.q = dq.p + q_slack, p.k = dk.p + kv_slack, p.v = dv.p + kv_slack, p.out = dout.p + q_slack, p.lse = dlse.p;
  p.T = c.T, p.pos0 = c.pos0, p.n_heads = c.Hq, p.n_kv_heads = c.Hkv, p.head_dim = hd, p.block = B;
  p.meta = dmeta.p;
  if (xsel) p.xattn = {dblocks.p, doff.p, dcnt.p};
  // A kernel run twice must repeat itself exactly (out and lse).
  std::map<cuda::AttnKernel, std::pair<std::vector<uint16_t>, std::vector<float>>> earlier;
  for (const cuda::AttnKernel kernel : kernels) {
    const char* kname = kernel_name(kernel);
    dout.up(std::vector<uint16_t>(dout.n, kNaNBf16));
    dlse.up(std::vector<float>(dlse.n, NAN));
    p.kernel = kernel;
    p.opts = opts;
    cuda::hybrid_attention_fwd_any(p, nullptr);
    ELASTIC_CUDA_CHECK(cudaDeviceSynchronize());
    const auto all = dout.down();
    size_t written_outside = 0;
    for (size_t i = 0; i < all.size(); ++i)
      written_outside += (i < q_slack || i >= q_slack + q.size()) && all[i] != kNaNBf16;
    const std::vector<uint16_t> out(all.begin() + q_slack, all.begin() + q_slack + q.size());
    const auto lse = dlse.down();
    if (earlier.count(kernel)) {
      EXPECT_TRUE(out == earlier[kernel].first) << kname << ": a second run gave other outputs";
      EXPECT_TRUE(lse == earlier[kernel].second) << kname << ": a second run gave another lse";
    }
    earlier[kernel] = {out, lse};

    double err2 = 0, ref2 = 0, lse_err = 0;
    size_t bad = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      const double g = from_bf16(out[i]), r = out_ref[i];
      if (!std::isfinite(g)) ++bad;
      err2 += (g - r) * (g - r);
      ref2 += r * r;
    }
    for (size_t i = 0; i < lse.size(); ++i) {
      if (!std::isfinite(lse[i])) ++bad;
      lse_err = std::max(lse_err, std::abs(double(lse[i]) - lse_ref[i]));
    }
    EXPECT_EQ(bad, 0u) << kname << ": unwritten or non-finite outputs";
    EXPECT_EQ(written_outside, 0u) << kname << ": values written outside rows [0, T) of out";
    EXPECT_LT(std::sqrt(err2 / ref2), 1e-2) << kname << ": relative L2 error of out";
    EXPECT_LT(lse_err, 2e-2) << kname << ": max |lse - cpu lse|";
  }
}

// Every case through the simple kernel, and through the wgmma variants where the GQA group is even (fresh inputs
// per case, shared by its kernels so the CPU reference runs once).
void run_prefill_case(const Case& c) {
  using K = cuda::AttnKernel;
  if ((c.Hq / c.Hkv) % 2 == 0)
    run_prefill_case_with(c, {K::Simple, K::Wgmma, K::WgmmaNoPingpong, K::WgmmaOverlap, K::WgmmaOverlapNoPingpong,
                              K::WgmmaPersistent});
  else
    run_prefill_case_with(c, {K::Simple});
}

const auto F = HeadMode::Full, S = HeadMode::Streaming, X = HeadMode::XAttn;

}  // namespace

TEST(CudaHybridAttention, FullGqa4Hd128) { run_prefill_case({333, 0, 8, 2, 128, 64, 128, 256, {F, F}}); }
TEST(CudaHybridAttention, MixedRoutingHd128Block64) {
  run_prefill_case({700, 0, 16, 4, 128, 64, 64, 128, {F, S, X, S}, 2.f});
}
TEST(CudaHybridAttention, MixedRoutingHd64Group1Block128) {
  run_prefill_case({517, 0, 4, 4, 64, 128, 100, 200, {S, X, F, X}, 2.f});
}
TEST(CudaHybridAttention, FullGqa2Hd64Long) { run_prefill_case({1500, 0, 4, 2, 64, 64, 128, 256, {F, F}}); }
// 64 query tiles x 8 head pairs = 512 work items: the persistent kernel's CTAs each walk several items (the stage
// ring and the Q buffer carry over), with full, streaming and XAttn heads mixed.
// The persistent kernel runs three times in a row here: its work counter must be back at zero after each launch.
TEST(CudaHybridAttention, ManyItemsPerSm) {
  const Case c{4096, 0, 16, 8, 64, 64, 128, 512, {F, S, F, X, S, F, X, F}, 2.f};
  using K = cuda::AttnKernel;
  run_prefill_case_with(c, {K::Simple, K::Wgmma, K::WgmmaNoPingpong, K::WgmmaOverlap, K::WgmmaOverlapNoPingpong,
                            K::WgmmaPersistent, K::WgmmaPersistent, K::WgmmaPersistent});
}
// Odd item counts for the persistent kernel (3 query tiles x 3 head pairs = 9; with static items the last CTA takes
// one) and a single item (1 tile x 1 pair).
TEST(CudaHybridAttention, OddItemCount) { run_prefill_case({150, 0, 6, 3, 128, 64, 64, 128, {F, S, X}, 2.f}); }
TEST(CudaHybridAttention, OneItem) { run_prefill_case({64, 0, 2, 1, 64, 64, 0, 64, {F}}); }
TEST(CudaHybridAttention, AllStreamingNoSink) { run_prefill_case({450, 0, 8, 2, 64, 64, 0, 64, {S, S}}); }
TEST(CudaHybridAttention, ChunkedPrefillAligned) {
  run_prefill_case({300, 256, 8, 2, 128, 64, 64, 128, {X, S}, 2.f});
}
TEST(CudaHybridAttention, ChunkedPrefillBlock128Gqa2) {
  run_prefill_case({600, 128, 8, 4, 128, 128, 100, 300, {X, S, F, X}, 2.f});
}
// A last chunk shorter than one 64-row tile (the whole-model tests' 300 tokens in chunks of 128 end with 44 rows),
// group 4, hd 128, block 64, streaming sink 64 / local 128 as there.
TEST(CudaHybridAttention, ShortLastChunk) {
  run_prefill_case({44, 256, 8, 2, 128, 64, 64, 128, {S, F}, 2.f});
}
TEST(CudaHybridAttention, ChunkedPrefillUnaligned) {
  run_prefill_case({133, 300, 8, 2, 64, 64, 64, 128, {S, X}, 1.f});
}

TEST(CudaHybridAttention, RejectsBadShapes) {
  cuda::HybridAttnParams p;
  EXPECT_THROW(cuda::hybrid_attention_fwd(p, nullptr), std::invalid_argument);
  uint16_t dummy = 0;
  cuda::KVHeadMeta m;
  p.q = p.k = p.v = &dummy;
  p.out = &dummy;
  p.meta = &m;
  p.T = 8, p.n_heads = 4, p.n_kv_heads = 2, p.head_dim = 96;
  EXPECT_THROW(cuda::hybrid_attention_fwd(p, nullptr), std::invalid_argument);  // head_dim 96
  p.head_dim = 64, p.n_kv_heads = 3;
  EXPECT_THROW(cuda::hybrid_attention_fwd(p, nullptr), std::invalid_argument);  // 4 % 3
  p.n_kv_heads = 4, p.kernel = cuda::AttnKernel::Wgmma;
  EXPECT_THROW(cuda::hybrid_attention_fwd(p, nullptr), std::invalid_argument);  // group 1: no wgmma kernel
  EXPECT_THROW(cuda::make_kv_head_meta(HeadMode::Streaming, 64, 64, 32), std::invalid_argument);  // block 32
}

namespace {
// Sets an environment variable for one scope and restores the previous value (or its absence) on the way out,
// whatever leaves the scope.
struct EnvGuard {
  std::string name, saved;
  bool had;
  EnvGuard(const char* n, const char* value) : name(n) {
    const char* prev = std::getenv(n);
    had = prev != nullptr;
    if (had) saved = prev;
    ::setenv(n, value, 1);
  }
  ~EnvGuard() {
    if (had) ::setenv(name.c_str(), saved.c_str(), 1);
    else ::unsetenv(name.c_str());
  }
};

// With `var` set to `value` for the call, run() must throw std::invalid_argument whose message names `var`.
template <class F>
void expect_env_error(const char* var, const char* value, F&& run) {
  EnvGuard env(var, value);
  try {
    run();
    ADD_FAILURE() << "no error for " << var << "=" << value;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(var), std::string::npos) << e.what();
  }
}
}  // namespace

// The descriptions a model prints with its plan name what a configuration runs; the environment is read only by
// attention_config_from_env (host only, no GPU).
TEST(CudaHybridAttention, DescribesWhatAConfigurationRuns) {
  using K = cuda::AttnKernel;
  EXPECT_EQ(cuda::describe_attention({}, 8, 2), "overlap (adjacent pairs, bulk stores)");
  EXPECT_EQ(cuda::describe_attention({K::Wgmma, -1}, 8, 2), "wgmma (even pairs, direct stores)");
  EXPECT_EQ(cuda::describe_attention({K::WgmmaPersistent, 3}, 8, 2), "persistent (adjacent pairs, direct stores)");
  EXPECT_EQ(cuda::describe_attention({K::WgmmaPersistent, 5}, 8, 2),
            "persistent (adjacent pairs, direct stores, up to 2 static items per CTA)");
  EXPECT_EQ(cuda::describe_attention({K::Simple, -1}, 8, 2), "simple");
  EXPECT_EQ(cuda::describe_attention({K::Wgmma, -1}, 6, 2), "simple (odd query-head group)");
  // Row pairs (bit 16) let an odd group run the wgmma kernel, Auto included.
  EXPECT_EQ(cuda::describe_attention({K::Auto, 19}, 6, 2), "overlap (adjacent pairs, bulk stores, row pairs)");
  EXPECT_EQ(cuda::describe_attention({K::Simple, 19}, 6, 2), "simple");
  {
    EnvGuard k("ELASTIC_ATTN_KERNEL", ""), o("ELASTIC_ATTN_OPTS", "");
    const cuda::AttnKernelConfig c = cuda::attention_config_from_env();
    EXPECT_EQ(c.kernel, K::Auto);
    EXPECT_EQ(c.opts, -1);
  }
  {
    EnvGuard k("ELASTIC_ATTN_KERNEL", "simple"), o("ELASTIC_ATTN_OPTS", "5");
    const cuda::AttnKernelConfig c = cuda::attention_config_from_env();
    EXPECT_EQ(c.kernel, K::Simple);
    EXPECT_EQ(c.opts, 5);
  }
  // The engine names its own kernels only; the measurement variants are the dev area's.
  EXPECT_EQ(cuda::attention_kernel_by_name("overlap"), K::WgmmaOverlap);
  EXPECT_THROW(cuda::attention_kernel_by_name("nopingpong"), std::invalid_argument);
  EXPECT_THROW(cuda::attention_kernel_by_name("fastest"), std::invalid_argument);
  EXPECT_EQ(cuda::attention_variant_by_name("nopingpong"), K::WgmmaNoPingpong);
  EXPECT_FALSE(cuda::is_engine_kernel(K::WgmmaPersistent));
  expect_env_error("ELASTIC_ATTN_KERNEL", "persistent", [] { cuda::attention_config_from_env(); });
  {
    // A measurement variant through the engine's dispatch is refused by name, before any launch (the pointers are
    // never dereferenced: no GPU needed).
    cuda::HybridAttnParams v;
    uint16_t dummy[8];
    v.q = v.k = v.v = dummy, v.out = dummy;
    v.meta = reinterpret_cast<const cuda::KVHeadMeta*>(dummy);
    v.T = 64, v.n_heads = 8, v.n_kv_heads = 2, v.head_dim = 128, v.block = 64;
    v.kernel = K::WgmmaPersistent;
    try {
      cuda::hybrid_attention_fwd(v, nullptr);
      ADD_FAILURE() << "the engine ran a measurement variant";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("'persistent' kernel is a measurement variant"), std::string::npos)
          << e.what();
    }
  }
  // A configured wgmma kernel applies to even groups; an odd group runs Auto (Simple) instead.
  cuda::HybridAttnParams p;
  p.n_heads = 8, p.n_kv_heads = 2;
  cuda::apply_attention_config({K::Wgmma, 1}, p);
  EXPECT_EQ(p.kernel, K::Wgmma);
  EXPECT_EQ(p.opts, 1);
  p.n_heads = 6;
  cuda::apply_attention_config({K::Wgmma, 1}, p);
  EXPECT_EQ(p.kernel, K::Auto);
  cuda::apply_attention_config({K::Simple, -1}, p);
  EXPECT_EQ(p.kernel, K::Simple);
  cuda::apply_attention_config({K::WgmmaOverlap, 16 | 3}, p);  // row pairs: the odd group keeps the wgmma kernel
  EXPECT_EQ(p.kernel, K::WgmmaOverlap);
  EXPECT_EQ(p.opts, 19);
  {
    EnvGuard l("ELASTIC_DECODE_LOADS", ""), c("ELASTIC_DECODE_COMBINE", "");
    EnvGuard sp("ELASTIC_DECODE_SPLIT", "");
    EXPECT_EQ(cuda::describe_decode_auto(),
              "loads direct, merge parallel, split by grid (256, 128 or 64: >= 4 CTAs per SM)");
  }
  {
    EnvGuard l("ELASTIC_DECODE_LOADS", "staged"), c("ELASTIC_DECODE_COMBINE", "serial"), sp("ELASTIC_DECODE_SPLIT", "64");
    EXPECT_EQ(cuda::describe_decode_auto(), "loads staged, merge serial, split 64");
  }
  expect_env_error("ELASTIC_DECODE_SPLIT", "32", [] { cuda::describe_decode_auto(); });
  expect_env_error("ELASTIC_ATTN_KERNEL", "fastest", [] { cuda::attention_config_from_env(); });
  EnvGuard k("ELASTIC_ATTN_KERNEL", "overlap");
  expect_env_error("ELASTIC_ATTN_OPTS", "32", [] { cuda::attention_config_from_env(); });
}

// Option bit 2: the persistent kernel with two static items per CTA, then the default dynamic one on the same case
// (which finds its work counter still at zero, or skips items and leaves NaN rows).
TEST(CudaHybridAttention, PersistentStaticItemsThenDynamic) {
  const Case c{1000, 0, 16, 8, 64, 64, 128, 256, {F, S, F, X, S, F, X, F}, 2.f};
  using K = cuda::AttnKernel;
  run_prefill_case_with(c, {K::WgmmaPersistent}, 5);
  run_prefill_case_with(c, {K::WgmmaPersistent});
}

// Option bit 8: XAttention heads on the pipelined path (both heads of a pair every step of their union, masked),
// through each wgmma form, on the cases that mix XAttention lists with full and streaming heads.
TEST(CudaHybridAttention, XAttnHeadsPipelined) {
  using K = cuda::AttnKernel;
  for (const Case& c : {Case{700, 0, 16, 4, 128, 64, 64, 128, {F, S, X, S}, 2.f},
                        Case{600, 128, 8, 4, 128, 128, 100, 300, {X, S, F, X}, 2.f},
                        Case{1000, 0, 16, 8, 64, 64, 128, 256, {F, S, F, X, S, F, X, F}, 2.f}}) {
    run_prefill_case_with(c, {K::Wgmma, K::WgmmaNoPingpong}, 8 | 1);
    run_prefill_case_with(c, {K::WgmmaOverlap, K::WgmmaOverlapNoPingpong, K::WgmmaPersistent}, 8 | 2 | 1);
  }
}

// Option bit 16 (row pairs): a CTA's consumers take one head's two adjacent 64-row query tiles and walk the union of
// their lists, in every wgmma form, with and without adjacent pairing and bulk stores, on mixed routings: an odd
// number of query tiles (the last pair alone), a chunk starting at an odd query tile (pos0 64), block 128 (one
// selection per row pair) and 64, and an odd GQA group (3: SmolLM2's), which only row pairs let the wgmma kernel run.
TEST(CudaHybridAttention, RowPairs) {
  using K = cuda::AttnKernel;
  for (const Case& c : {Case{700, 0, 16, 4, 128, 64, 64, 128, {F, S, X, S}, 2.f},
                        Case{600, 128, 8, 4, 128, 128, 100, 300, {X, S, F, X}, 2.f},
                        Case{500, 64, 8, 2, 128, 64, 64, 128, {X, F}, 2.f},
                        Case{900, 0, 8, 2, 64, 128, 128, 256, {S, X}, 2.f},
                        Case{1000, 0, 16, 8, 64, 64, 128, 256, {F, S, F, X, S, F, X, F}, 2.f}}) {
    run_prefill_case_with(c, {K::WgmmaOverlap, K::Wgmma, K::WgmmaNoPingpong}, 16 | 1);
    run_prefill_case_with(c, {K::WgmmaOverlap, K::WgmmaOverlapNoPingpong, K::WgmmaPersistent}, 16 | 2 | 1);
    run_prefill_case_with(c, {K::WgmmaOverlap}, 16 | 2);  // even pairing
  }
  // A chunk starting mid-tile (pos0 300: the first pair's first tile stores directly, the second in bulk; XAttention
  // heads without lists there, dense), a one-tile chunk (its pair has no second tile), static items.
  for (const Case& c : {Case{133, 300, 8, 2, 64, 64, 64, 128, {S, X}, 2.f},
                        Case{44, 256, 8, 2, 128, 64, 64, 128, {S, F}, 2.f}}) {
    run_prefill_case_with(c, {K::WgmmaOverlap, K::Wgmma}, 16 | 2 | 1);
    run_prefill_case_with(c, {K::WgmmaPersistent}, 16 | 4 | 1);
  }
  const Case odd{777, 0, 6, 2, 64, 64, 64, 128, {X, S}, 2.f};
  run_prefill_case_with(odd, {K::Auto, K::WgmmaOverlap, K::Wgmma, K::WgmmaNoPingpong}, 16 | 2 | 1);
  run_prefill_case_with(odd, {K::WgmmaPersistent}, 16 | 4 | 1);
}

// A launch reads no environment: an unknown ELASTIC_ATTN_KERNEL changes nothing there (attention_config_from_env,
// above, is where it is an error); bad options are refused by name before any launch (no GPU needed).
TEST(CudaHybridAttention, LaunchesReadNoEnvironment) {
  cuda::HybridAttnParams p;
  EnvGuard env("ELASTIC_ATTN_KERNEL", "fastest");
  EXPECT_THROW(cuda::hybrid_attention_fwd(p, nullptr), std::invalid_argument);  // the null pointers, not the variable
  try {
    cuda::hybrid_attention_fwd(p, nullptr);
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).find("ELASTIC_ATTN_KERNEL"), std::string::npos) << e.what();
  }
  p.opts = 32;
  try {
    cuda::hybrid_attention_fwd(p, nullptr);
    ADD_FAILURE() << "opts 32 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("opts"), std::string::npos) << e.what();
  }
}

// GPU estimation vs xattn_select: block masses and selected masks, then attention with the GPU lists.
// One estimator run against xattn_select, head by head: KV head 0 routed to XAttention, the others Full (scored only
// when `all_scored`, given no lists either way). Checks the lists' form (ascending, block 0 and the diagonal kept),
// the selections against the CPU's (at most 0.5% of blocks differ: summation order), and the block masses (finite,
// summing to the query block's folded rows).
void estimate_and_compare(cuda::XAttnEstimateKernel kernel, int Hq, int Hkv, int B, int S, int hd, int T, int pos0,
                          bool all_scored, cuda::Gemm& gemm, std::mt19937& rng) {
  const int G = Hq / Hkv, n_pos = pos0 + T, nb = (n_pos + B - 1) / B;
  auto q = random_bf16(size_t(T) * Hq * hd, rng, 2.f);
  auto k = random_bf16(size_t(n_pos) * Hkv * hd, rng, 1.f);
  std::vector<cuda::KVHeadMeta> meta(Hkv, cuda::make_kv_head_meta(HeadMode::Full, 0, 0, B));
  meta[0] = cuda::make_kv_head_meta(HeadMode::XAttn, 0, 0, B);
  Dev<uint16_t> dq(q), dk(k);
  Dev<cuda::KVHeadMeta> dmeta(meta);
  Dev<int32_t> dblocks(cuda::xattn_list_capacity(Hq, nb)), doff(size_t(Hq) * nb), dcnt(size_t(Hq) * nb);
  Dev<float> dbs(std::vector<float>(size_t(Hq) * nb * nb, NAN));
  cuda::XAttnEstimateParams e;
  e.q = dq.p, e.k = dk.p, e.T = T, e.pos0 = pos0, e.n_heads = Hq, e.n_kv_heads = Hkv, e.head_dim = hd;
  e.block = B, e.stride = S, e.tau = 0.9f, e.meta = dmeta.p;
  e.blocks = dblocks.p, e.offsets = doff.p, e.counts = dcnt.p, e.block_scores = dbs.p;
  e.kernel = kernel;
  const int xa_heads[] = {0};
  std::unique_ptr<Dev<uint8_t>> scratch;
  const bool gemm_form = kernel == cuda::XAttnEstimateKernel::Gemm;
  if (gemm_form || kernel == cuda::XAttnEstimateKernel::Fused) {
    const int scored = all_scored ? Hkv : 1;
    e.scratch_bytes = cuda::xattn_estimate_scratch_bytes(kernel, T, n_pos, scored, G, hd, S, B);
    scratch = std::make_unique<Dev<uint8_t>>(e.scratch_bytes);
    e.gemm = &gemm, e.scratch = scratch->p;
    if (!all_scored) e.xa_kv_heads = xa_heads, e.n_xa_kv_heads = 1;
  }
  if (gemm_form || kernel == cuda::XAttnEstimateKernel::Fused) cuda::xattn_estimate_cuda(e, nullptr);  // the engine's
  else cuda::xattn_estimate_variant(e, nullptr);                                                        // the dev area's
  ELASTIC_CUDA_CHECK(cudaDeviceSynchronize());
  const auto blocks = dblocks.down(), off = doff.down(), cnt = dcnt.down();
  const auto bs = dbs.down();
  XAttnParams xp;
  xp.block = B, xp.stride = S;
  long mism = 0, total = 0;
  double bs_err = 0;
  for (int h = 0; h < Hq; ++h) {
    std::vector<float> qh(size_t(n_pos) * hd, 0.f), kh(size_t(n_pos) * hd);
    for (int t = 0; t < T; ++t)
      for (int d = 0; d < hd; ++d) qh[size_t(pos0 + t) * hd + d] = from_bf16(q[(size_t(t) * Hq + h) * hd + d]);
    for (int j = 0; j < n_pos; ++j)
      for (int d = 0; d < hd; ++d) kh[size_t(j) * hd + d] = from_bf16(k[(size_t(j) * Hkv + h / G) * hd + d]);
    const BlockMask ref = h / G == 0 ? xattn_select(qh.data(), kh.data(), n_pos, hd, xp, pos0) : BlockMask{};
    for (int qb = pos0 / B; qb < nb; ++qb) {
      const size_t r = size_t(h) * nb + qb;
      ASSERT_EQ(off[r], int64_t(h) * nb * (nb + 1) / 2 + int64_t(qb) * (qb + 1) / 2);
      if (h / G != 0) {  // a Full-routed KV head gets no lists
        EXPECT_EQ(cnt[r], 0);
        continue;
      }
      std::vector<uint8_t> got(qb + 1, 0);
      ASSERT_GE(cnt[r], 1);
      for (int i = 0; i < cnt[r]; ++i) {
        const int kb = blocks[off[r] + i];
        ASSERT_TRUE(kb >= 0 && kb <= qb);
        if (i > 0) ASSERT_GT(kb, blocks[off[r] + i - 1]);  // ascending
        got[kb] = 1;
      }
      EXPECT_EQ(blocks[off[r] + cnt[r] - 1], qb);
      EXPECT_EQ(blocks[off[r]], 0);
      for (int kb = 0; kb <= qb; ++kb) {
        mism += got[kb] != ref.at(qb, kb);
        ++total;
        EXPECT_TRUE(std::isfinite(bs[r * nb + kb]));
      }
      // Each folded row's probabilities sum to 1, so a query block's masses sum to its folded rows.
      double sum = 0;
      for (int kb = 0; kb <= qb; ++kb) sum += bs[r * nb + kb];
      const int rb = B / S, rows = std::min((n_pos + S - 1) / S, (qb + 1) * rb) - qb * rb;
      bs_err = std::max(bs_err, std::abs(sum - rows));
    }
  }
  EXPECT_LE(mism, std::max<long>(2, total / 200)) << "hd " << hd << " pos0 " << pos0 << ": " << mism << " of "
                                                  << total << " blocks differ from xattn_select";
  EXPECT_LT(bs_err, 1e-3);
  // The kept-block total GpuModel reports (xattn_add_kept_blocks) is the XAttention heads' counts summed, added to
  // what the total held.
  int64_t want = 1000;
  for (int h = 0; h < G; ++h)
    for (int qb = pos0 / B; qb < nb; ++qb) want += cnt[size_t(h) * nb + qb];
  Dev<unsigned long long> dtotal(std::vector<unsigned long long>{1000});
  cuda::xattn_add_kept_blocks(dcnt.p, Hq, Hkv, nb, pos0 / B, nb, dmeta.p, dtotal.p, nullptr);
  EXPECT_EQ(int64_t(dtotal.down()[0]), want);
}

const char* estimate_name(cuda::XAttnEstimateKernel k) {
  switch (k) {
    case cuda::XAttnEstimateKernel::Simple: return "simple";
    case cuda::XAttnEstimateKernel::TensorCore: return "tensor-core";
    case cuda::XAttnEstimateKernel::TensorCoreTwoPass: return "tensor-core two-pass";
    case cuda::XAttnEstimateKernel::Gemm: return "cuBLASLt";
    case cuda::XAttnEstimateKernel::Fused: return "fused wgmma";
    case cuda::XAttnEstimateKernel::Auto: return "auto";
  }
  return "?";
}

// GPU estimation vs xattn_select: block masses and selected masks.
TEST(CudaXAttnEstimate, MatchesCpuSelection) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  SEEDED_RNG(rng);
  // Every form; shapes with G * B/S = 8 and 16 reshaped rows per KV head (the tensor-core kernel's one row tile)
  // and 32 (two row tiles: Qwen3-4B's 4 query heads per KV head at block 128, and 8 at block 64).
  struct XCase { int Hq, Hkv, B; };
  // The tensor-core kernel also in its two-pass form (forced here; Auto takes it past ~128K tokens), the cuBLASLt
  // form (Auto's where a Gemm and scratch are given) and the fused wgmma form, the product forms scoring the listed
  // XAttention head alone at pos0 0 and every KV head (the Full one scored, given no lists) at pos0 256. T is not a
  // multiple of the stride (1000, 872): the last folded row is partial.
  cuda::Gemm gemm;
  for (const auto kernel : {cuda::XAttnEstimateKernel::Simple, cuda::XAttnEstimateKernel::TensorCore,
                            cuda::XAttnEstimateKernel::TensorCoreTwoPass, cuda::XAttnEstimateKernel::Gemm,
                            cuda::XAttnEstimateKernel::Fused})
    for (const XCase xc : {XCase{4, 2, 64}, XCase{8, 2, 64}, XCase{4, 2, 128}, XCase{8, 2, 128}, XCase{16, 2, 64}})
      for (const int hd : {64, 128})
        for (const int pos0 : {0, 256}) {
          SCOPED_TRACE(std::string(estimate_name(kernel)) + " Hq " + std::to_string(xc.Hq) + " B " +
                       std::to_string(xc.B));
          estimate_and_compare(kernel, xc.Hq, xc.Hkv, xc.B, 16, hd, 1000 - pos0 / 2, pos0, pos0 != 0, gemm, rng);
        }
}

// The fused wgmma form where the short cases above do not reach: several 256-key tiles and two groups of 1,024 folded
// rows (17,000 positions), T a multiple of the stride, stride 8 (block / stride 8 and 16), a chunk after a prefix;
// the cuBLASLt form on the same shapes as the anchor.
TEST(CudaXAttnEstimate, FusedMatchesCpuSelectionLongAndStride8) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  SEEDED_RNG(rng);
  cuda::Gemm gemm;
  struct LCase { int Hq, Hkv, B, S, hd, T, pos0; };
  for (const auto kernel : {cuda::XAttnEstimateKernel::Fused, cuda::XAttnEstimateKernel::Gemm})
    for (const LCase c : {LCase{4, 1, 64, 16, 128, 17000, 0}, LCase{8, 2, 64, 16, 128, 4096, 4096},
                          LCase{6, 2, 64, 8, 64, 3000, 1024}, LCase{4, 2, 128, 8, 128, 2500, 512}}) {
      SCOPED_TRACE(std::string(estimate_name(kernel)) + " T " + std::to_string(c.T) + " pos0 " +
                   std::to_string(c.pos0) + " B " + std::to_string(c.B) + " S " + std::to_string(c.S));
      estimate_and_compare(kernel, c.Hq, c.Hkv, c.B, c.S, c.hd, c.T, c.pos0, c.pos0 != 0, gemm, rng);
    }
}

// Estimator parameters whose pointers are host dummies: for checks that refuse before anything launches.
struct HostOnlyEstimate {
  uint16_t d = 0;
  int32_t i = 0;
  cuda::KVHeadMeta m;
  cuda::XAttnEstimateParams e;
  HostOnlyEstimate() { e.q = e.k = &d, e.meta = &m, e.blocks = e.offsets = e.counts = &i; }
  HostOnlyEstimate(const HostOnlyEstimate&) = delete;
  HostOnlyEstimate& operator=(const HostOnlyEstimate&) = delete;
};

TEST(CudaXAttnEstimate, TensorCoreRejectsTooManyRowsPerKvHead) {
  SKIP_WITHOUT_GPU();
  HostOnlyEstimate h;
  cuda::XAttnEstimateParams& e = h.e;
  e.T = 256, e.n_heads = 8, e.n_kv_heads = 1, e.head_dim = 64, e.block = 128;  // 8 heads x 8 rows = 64 > 32
  e.kernel = cuda::XAttnEstimateKernel::TensorCore;
  EXPECT_THROW(cuda::xattn_estimate_variant(e, nullptr), std::invalid_argument);
  e.kernel = cuda::XAttnEstimateKernel::TensorCoreTwoPass;
  EXPECT_THROW(cuda::xattn_estimate_variant(e, nullptr), std::invalid_argument);
}

// The engine runs its own forms only: a variant named to xattn_estimate_cuda is refused by name, and the Gemm and
// Fused forms named to the dev area's entry point too (no GPU needed: both refuse before launching).
TEST(CudaXAttnEstimate, EngineAndDevAreaRefuseEachOthersForms) {
  HostOnlyEstimate h;
  cuda::XAttnEstimateParams& e = h.e;
  e.T = 256, e.n_heads = 8, e.n_kv_heads = 2, e.head_dim = 64, e.block = 64;
  for (const auto k : {cuda::XAttnEstimateKernel::Simple, cuda::XAttnEstimateKernel::TensorCore,
                       cuda::XAttnEstimateKernel::TensorCoreTwoPass}) {
    e.kernel = k;
    try {
      cuda::xattn_estimate_cuda(e, nullptr);
      ADD_FAILURE() << "the engine ran a variant";
    } catch (const std::invalid_argument& ex) {
      EXPECT_NE(std::string(ex.what()).find("xattn_estimate_variant"), std::string::npos) << ex.what();
    }
  }
  for (const auto k : {cuda::XAttnEstimateKernel::Gemm, cuda::XAttnEstimateKernel::Fused}) {
    e.kernel = k;
    try {
      cuda::xattn_estimate_variant(e, nullptr);
      ADD_FAILURE() << "the dev area ran an engine form";
    } catch (const std::invalid_argument& ex) {
      EXPECT_NE(std::string(ex.what()).find("engine's"), std::string::npos) << ex.what();
    }
  }
}

// The Fused form's own limits, refused by name before anything runs (no GPU needed): head_dim, stride, a missing
// scratch and too little of it.
TEST(CudaXAttnEstimate, FusedFormRejectsBadArguments) {
  HostOnlyEstimate h;
  cuda::XAttnEstimateParams& e = h.e;
  e.T = 256, e.n_heads = 8, e.n_kv_heads = 2, e.head_dim = 64, e.block = 64;
  e.kernel = cuda::XAttnEstimateKernel::Fused;
  auto expect_refusal = [&](const char* what, const char* says) {
    try {
      cuda::xattn_estimate_cuda(e, nullptr);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const std::invalid_argument& ex) {
      const std::string m = ex.what();
      EXPECT_NE(m.find("Fused"), std::string::npos) << m;
      EXPECT_NE(m.find(says), std::string::npos) << what << ": " << m;
    }
  };
  e.head_dim = 96;
  expect_refusal("head_dim 96", "head_dim");
  e.head_dim = 64, e.stride = 4;
  expect_refusal("stride 4", "stride");
  e.stride = 8, e.block = 128;  // 16 folded rows per block: allowed; the missing scratch is what is refused
  expect_refusal("no scratch", "scratch");
  e.scratch = &h.d, e.scratch_bytes = 1;
  expect_refusal("one byte of scratch", "needs");
}

// The cuBLASLt form's arguments, refused before anything runs (no GPU needed): no Gemm or scratch, a KV head listed
// twice or out of range, too little scratch for the chunk.
TEST(CudaXAttnEstimate, GemmFormRejectsBadArguments) {
  HostOnlyEstimate h;
  cuda::XAttnEstimateParams& e = h.e;
  e.T = 256, e.n_heads = 8, e.n_kv_heads = 2, e.head_dim = 64, e.block = 64;
  e.kernel = cuda::XAttnEstimateKernel::Gemm;
  auto expect_refusal = [&](const char* what) {
    try {
      cuda::xattn_estimate_cuda(e, nullptr);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const std::invalid_argument& ex) {
      EXPECT_NE(std::string(ex.what()).find("Gemm form"), std::string::npos) << ex.what();
    }
  };
  expect_refusal("no gemm or scratch");
  const int repeated[] = {1, 1}, outside[] = {2};
  e.xa_kv_heads = repeated, e.n_xa_kv_heads = 2;
  expect_refusal("a repeated KV head");
  e.xa_kv_heads = outside, e.n_xa_kv_heads = 1;
  expect_refusal("a KV head out of range");
  EXPECT_EQ(cuda::xattn_gemm_scratch_bytes(0, 256, 2, 4, 64, 16), 0u);
  EXPECT_EQ(cuda::xattn_gemm_scratch_bytes(512, 256, 2, 4, 64, 16), 0u);  // a chunk longer than the sequence
  EXPECT_GT(cuda::xattn_gemm_scratch_bytes(256, 256, 2, 4, 64, 16), 0u);
  // Scratch grows with the context and the chunk, not shrinks.
  auto bytes = [](int T, int n_pos) { return cuda::xattn_gemm_scratch_bytes(T, n_pos, 2, 4, 64, 16); };
  EXPECT_LT(bytes(256, 4096), bytes(256, 8192));
  EXPECT_LT(bytes(4096, 8192), bytes(8192, 8192));
}

TEST(CudaXAttnEstimate, RejectsUnalignedChunk) {
  HostOnlyEstimate h;
  cuda::XAttnEstimateParams& e = h.e;
  e.T = 10, e.pos0 = 30, e.n_heads = 2, e.n_kv_heads = 1, e.head_dim = 64;
  EXPECT_THROW(cuda::xattn_estimate_cuda(e, nullptr), std::invalid_argument);
}

// Decode with per-head caches: full heads hold every position, streaming heads sink slots + a ring.
TEST(CudaDecodeAttention, RingCacheMatchesCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  SEEDED_RNG(rng);
  struct DCase { int n_pos, Hq, Hkv, hd, B, sink, local; std::vector<HeadMode> modes; };
  for (const DCase& c : {DCase{1000, 8, 2, 128, 64, 64, 128, {F, S}}, DCase{777, 4, 4, 64, 128, 100, 300, {S, X, F, S}},
                         DCase{5000, 32, 8, 128, 64, 128, 2048, {S, S, F, S, X, S, S, F}},
                         DCase{3000, 16, 1, 64, 64, 64, 256, {S}},                 // group 16
                         DCase{2500, 16, 2, 128, 128, 128, 512, {F, S}}}) {        // group 8
    const int hd = c.hd, p = c.n_pos - 1;
    SparseSettings sp;
    sp.block = c.B, sp.sink = c.sink, sp.local = c.local;
    auto q = random_bf16(size_t(c.Hq) * hd, rng, 1.f);
    std::vector<cuda::DecodeKVHead> heads(c.Hkv);
    std::vector<std::vector<uint16_t>> kc(c.Hkv), vc(c.Hkv);
    std::vector<std::vector<float>> kcf(c.Hkv), vcf(c.Hkv), knew(c.Hkv), vnew(c.Hkv);
    std::vector<HeadKV> kv(c.Hkv);
    for (int h = 0; h < c.Hkv; ++h) {
      const auto m = cuda::make_kv_head_meta(c.modes[h], c.sink, c.local, c.B);
      HeadKV& x = kv[h];
      if (c.modes[h] == S) x.sink_slots = m.sink_blocks * c.B, x.ring_slots = m.local_blocks * c.B;
      const int slots = x.ring_slots ? x.sink_slots + x.ring_slots : c.n_pos;
      kc[h].assign(size_t(slots) * hd, kNaNBf16);  // never-written slots would poison the result
      vc[h].assign(size_t(slots) * hd, kNaNBf16);
      for (int j = 0; j < c.n_pos; ++j) {  // write positions in order: the ring keeps the latest ones
        auto kr = random_bf16(hd, rng, 1.f), vr = random_bf16(hd, rng, 1.f);
        std::copy(kr.begin(), kr.end(), kc[h].begin() + size_t(x.slot(j)) * hd);
        std::copy(vr.begin(), vr.end(), vc[h].begin() + size_t(x.slot(j)) * hd);
      }
      kcf[h].resize(kc[h].size());
      vcf[h].resize(vc[h].size());
      for (size_t i = 0; i < kc[h].size(); ++i) kcf[h][i] = from_bf16(kc[h][i]), vcf[h][i] = from_bf16(vc[h][i]);
      knew[h].assign(kcf[h].begin() + size_t(x.slot(p)) * hd, kcf[h].begin() + size_t(x.slot(p) + 1) * hd);
      vnew[h].assign(vcf[h].begin() + size_t(x.slot(p)) * hd, vcf[h].begin() + size_t(x.slot(p) + 1) * hd);
      x.k_cache = kcf[h].data(), x.v_cache = vcf[h].data(), x.k_new = knew[h].data(), x.v_new = vnew[h].data();
      x.new_stride = x.hd = hd, x.pos0 = p;
      heads[h].sink_slots = x.sink_slots, heads[h].ring_slots = x.ring_slots;
      heads[h].mode = m.mode, heads[h].sink_blocks = m.sink_blocks, heads[h].local_blocks = m.local_blocks;
    }
    std::vector<float> qf(q.size()), out_ref(q.size());
    for (size_t i = 0; i < q.size(); ++i) qf[i] = from_bf16(q[i]);
    AttentionArgs a;
    a.q = qf.data(), a.kv = kv.data(), a.out = out_ref.data();
    a.T = 1, a.pos0 = p, a.n_heads = c.Hq, a.n_kv_heads = c.Hkv, a.head_dim = hd;
    a.modes = c.modes.data(), a.sparse = &sp, a.prefill = false;
    attention_forward(a);

    std::vector<std::unique_ptr<Dev<uint16_t>>> bufs;
    for (int h = 0; h < c.Hkv; ++h) {
      bufs.emplace_back(new Dev<uint16_t>(kc[h]));
      heads[h].k = bufs.back()->p;
      bufs.emplace_back(new Dev<uint16_t>(vc[h]));
      heads[h].v = bufs.back()->p;
    }
    cuda::validate_decode_heads(heads.data(), c.Hkv, c.B);
    Dev<cuda::DecodeKVHead> dheads(heads);
    Dev<uint16_t> dq(q), dout(std::vector<uint16_t>(q.size(), kNaNBf16));
    Dev<float> ws(cuda::decode_workspace_floats(c.Hq, hd, c.n_pos));
    cuda::DecodeParams dp;
    dp.q = dq.p, dp.out = dout.p, dp.heads = dheads.p, dp.n_pos = c.n_pos, dp.n_heads = c.Hq;
    dp.n_kv_heads = c.Hkv, dp.head_dim = hd, dp.block = c.B, dp.workspace = ws.p;
    // The grid over all n_pos positions, or over the kept bound (a streaming-only layer's sink and window).
    const int max_kept = cuda::decode_max_kept(heads.data(), c.Hkv, c.B, c.n_pos);
    for (const int bound : {0, max_kept})
    for (const int split : {0, 256, 128, 64})
    for (const auto loads : {cuda::DecodeLoads::Direct, cuda::DecodeLoads::Staged})
    for (const auto combine : {cuda::DecodeCombine::Serial, cuda::DecodeCombine::Parallel}) {
      dp.combine = combine;
      dp.loads = loads;
      dp.split = split;
      dp.max_kept = bound;
      const std::string cname = std::string(loads == cuda::DecodeLoads::Direct ? "direct loads, " : "staged loads, ") +
                                (combine == cuda::DecodeCombine::Serial ? "serial merge" : "parallel merge") +
                                ", split " + std::to_string(split) + " (runs " + std::to_string(cuda::decode_split(dp)) +
                                "), max_kept " + std::to_string(bound);
      dout.up(std::vector<uint16_t>(q.size(), kNaNBf16));
      cuda::decode_attention(dp, nullptr);
      ELASTIC_CUDA_CHECK(cudaDeviceSynchronize());
      const auto out = dout.down();
      double err2 = 0, ref2 = 0;
      size_t bad = 0;
      for (size_t i = 0; i < out.size(); ++i) {
        const double g = from_bf16(out[i]), r = out_ref[i];
        bad += !std::isfinite(g);
        err2 += (g - r) * (g - r);
        ref2 += r * r;
      }
      EXPECT_EQ(bad, 0u) << cname;
      EXPECT_LT(std::sqrt(err2 / ref2), 1e-2) << cname << ", n_pos " << c.n_pos;
    }
  }
}

// decode_max_kept: n_pos when any head is full or XAttention, else the streaming heads' sink + window blocks.
TEST(CudaDecodeAttention, MaxKeptBoundsEachMode) {
  std::vector<cuda::DecodeKVHead> hh(2);
  hh[0].mode = hh[1].mode = elastic::kv_mode::kStreaming;
  hh[0].sink_blocks = 2, hh[0].local_blocks = 32;  // 34 blocks of 64
  hh[1].sink_blocks = 1, hh[1].local_blocks = 8;
  EXPECT_EQ(cuda::decode_max_kept(hh.data(), 2, 64, 100000), 34 * 64);
  EXPECT_EQ(cuda::decode_max_kept(hh.data(), 2, 64, 1000), 1000);  // never above n_pos
  hh[1].mode = elastic::kv_mode::kXAttn;
  EXPECT_EQ(cuda::decode_max_kept(hh.data(), 2, 64, 100000), 100000);
  hh[1].mode = elastic::kv_mode::kFull;
  EXPECT_EQ(cuda::decode_max_kept(hh.data(), 2, 128, 5000), 5000);
}

// A max_kept whose grid misses some of a head's positions: the output is NaN, not a sum over fewer positions.
TEST(CudaDecodeAttention, TooSmallMaxKeptGivesNaN) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  SEEDED_RNG(rng);
  const int Hq = 4, Hkv = 2, hd = 64, B = 64, n_pos = 2000;
  std::vector<uint16_t> kc = random_bf16(size_t(n_pos) * hd * Hkv, rng, 1.f), vc = random_bf16(kc.size(), rng, 1.f);
  Dev<uint16_t> dk(kc), dv(vc), dq(random_bf16(size_t(Hq) * hd, rng, 1.f)), dout(size_t(Hq) * hd);
  std::vector<cuda::DecodeKVHead> heads(Hkv);
  for (int h = 0; h < Hkv; ++h) heads[h].k = dk.p + size_t(h) * n_pos * hd, heads[h].v = dv.p + size_t(h) * n_pos * hd;
  Dev<cuda::DecodeKVHead> dheads(heads);  // both full: 2000 positions each
  Dev<float> ws(cuda::decode_workspace_floats(Hq, hd, n_pos));
  cuda::DecodeParams dp;
  dp.q = dq.p, dp.out = dout.p, dp.heads = dheads.p, dp.n_pos = n_pos, dp.n_heads = Hq, dp.n_kv_heads = Hkv;
  dp.head_dim = hd, dp.block = B, dp.workspace = ws.p;
  // The grid covers whole splits, so a bound rounded up to the split may still reach every position: then the
  // output is finite, and equal to the unbounded one.
  dp.split = 64, dp.max_kept = 0;
  cuda::decode_attention(dp, nullptr);
  ELASTIC_CUDA_CHECK(cudaDeviceSynchronize());
  const auto ref = dout.down();
  for (const int split : {64, 256})
    for (const int bound : {n_pos - 100, n_pos - 1, 1000, 1, n_pos}) {
      dp.split = split, dp.max_kept = bound;
      dout.poison();
      cuda::decode_attention(dp, nullptr);
      ELASTIC_CUDA_CHECK(cudaDeviceSynchronize());
      const bool covered = (bound + split - 1) / split * split >= n_pos;
      const auto out = dout.down();
      for (size_t i = 0; i < out.size(); ++i) {
        const float o = from_bf16(out[i]);
        if (covered)
          ASSERT_NEAR(o, from_bf16(ref[i]), 2e-2 * std::max(1.f, std::abs(o))) << "split " << split << ", max_kept " << bound;
        else
          ASSERT_TRUE(std::isnan(o)) << "split " << split << ", max_kept " << bound;
      }
    }
}

TEST(CudaDecodeAttention, RejectsTooSmallRing) {
  uint16_t d = 0;
  cuda::DecodeKVHead h;
  h.k = h.v = &d;
  h.mode = elastic::kv_mode::kStreaming, h.sink_blocks = 1, h.local_blocks = 2, h.sink_slots = 64, h.ring_slots = 64;  // needs 128
  EXPECT_THROW(cuda::validate_decode_heads(&h, 1, 64), std::invalid_argument);
  h.ring_slots = 128;
  EXPECT_NO_THROW(cuda::validate_decode_heads(&h, 1, 64));
}

// An unknown ELASTIC_DECODE_COMBINE, ELASTIC_DECODE_LOADS or ELASTIC_DECODE_SPLIT is an error naming the variable,
// raised before any launch (no GPU needed); so are out-of-range combine, loads and split fields.
TEST(CudaDecodeAttention, UnknownMergeOrLoadsInEnvironmentIsAnError) {
  uint16_t d = 0;
  float w = 0;
  cuda::DecodeKVHead h;
  cuda::DecodeParams p;
  p.q = p.out = &d, p.heads = &h, p.workspace = &w;
  p.n_pos = 10, p.n_heads = 4, p.n_kv_heads = 2, p.head_dim = 128, p.block = 64;
  expect_env_error("ELASTIC_DECODE_COMBINE", "tree", [&] { cuda::decode_attention(p, nullptr); });
  expect_env_error("ELASTIC_DECODE_LOADS", "fast", [&] { cuda::decode_attention(p, nullptr); });
  expect_env_error("ELASTIC_DECODE_SPLIT", "100", [&] { cuda::decode_attention(p, nullptr); });
  p.split = 100;
  EXPECT_THROW(cuda::decode_attention(p, nullptr), std::invalid_argument);
  p.split = 0;
  p.max_kept = -1;
  EXPECT_THROW(cuda::decode_attention(p, nullptr), std::invalid_argument);
  p.max_kept = 0;
  p.combine = static_cast<cuda::DecodeCombine>(7);
  EXPECT_THROW(cuda::decode_attention(p, nullptr), std::invalid_argument);
  p.combine = cuda::DecodeCombine::Auto;
  p.loads = static_cast<cuda::DecodeLoads>(9);
  EXPECT_THROW(cuda::decode_attention(p, nullptr), std::invalid_argument);
}
