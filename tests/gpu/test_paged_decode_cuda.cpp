// Paged decode kernel against the fp32 reference over the same plan (paged_decode.h), on fresh random inputs:
// batches of sequences with different lengths and routings (full, streaming, XAttention heads decoding densely),
// head_dim 64 and 128, groups of 3, 4, 8 and 16 query heads, pools whose unwritten rows are NaN, outputs NaN-filled
// before the launch, and the graph form (device unit count, grid over more units than the plan has).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>

#include "elastic/cuda_paged_decode.h"
#include "gpu_test_util.h"

using namespace elastic;
using namespace elastic::gpu_test;

namespace {

struct Case {
  int head_dim, n_heads, n_kv_heads, page_size, keys_per_unit;
  std::vector<int> lengths;
  std::vector<HeadMode> modes;  // per sequence, one mode for all its KV heads except KV head 0, which is full
};

void run_case(const Case& c, std::mt19937& rng) {
  const int hd = c.head_dim, Hq = c.n_heads, Hkv = c.n_kv_heads, P = c.page_size, n = int(c.lengths.size());
  PagePool pool(20000, P);
  std::vector<std::unique_ptr<SequencePages>> seqs;
  for (int b = 0; b < n; ++b) {
    RoutingTable r = RoutingTable::all_full(1, Hkv);
    for (int h = 1; h < Hkv; ++h) r.mode[h] = c.modes[b];
    r.sparse.block = 64, r.sparse.sink = 64, r.sparse.local = 512;
    seqs.push_back(std::make_unique<SequencePages>(pool, r));
    // Prefill in chunks, release what left the window: the decode step's layout after a long run.
    for (int p = 0; p < c.lengths[b]; p = std::min(c.lengths[b], p + 256)) {
      seqs[b]->grow(std::min(c.lengths[b], p + 256));
      if (std::min(c.lengths[b], p + 256) < c.lengths[b]) seqs[b]->release_unused();
    }
  }
  // Pool rows: NaN except the positions the heads hold, which get random values.
  std::vector<uint16_t> kp(size_t(pool.n_pages()) * P * hd, kNaNBf16), vp(kp.size(), kNaNBf16);
  std::normal_distribution<float> N(0.f, 1.f);
  std::vector<const HeadPages*> heads;
  for (int b = 0; b < n; ++b)
    for (int h = 0; h < Hkv; ++h) {
      const HeadPages& hp = seqs[b]->head(0, h);
      heads.push_back(&hp);
      for (int j = 0; j < hp.kept; ++j) {
        const size_t row = size_t(hp.pages[j / P]) * P + j % P;
        for (int e = 0; e < hd; ++e) kp[row * hd + e] = to_bf16(N(rng)), vp[row * hd + e] = to_bf16(N(rng));
      }
    }
  const PagedDecodePlan plan = plan_paged_decode(heads, Hkv, P, c.keys_per_unit);
  std::vector<uint16_t> q = random_bf16(size_t(n) * Hq * hd, rng, 1.f);
  // Reference on the bf16 values; NaN rows are never read by it (only kept positions are).
  std::vector<float> qf(q.size()), kf(kp.size()), vf(vp.size()), ref(q.size());
  for (size_t i = 0; i < q.size(); ++i) qf[i] = from_bf16(q[i]);
  for (size_t i = 0; i < kp.size(); ++i) kf[i] = from_bf16(kp[i]), vf[i] = from_bf16(vp[i]);
  paged_decode_reference(plan, qf.data(), kf.data(), vf.data(), Hq, hd, ref.data());

  Dev<uint16_t> dq(q), dk(kp), dv(vp), dout(q.size());
  Dev<int32_t> dtable(plan.page_table);
  Dev<PagedDecodeHead> dheads(plan.heads);
  const int n_units = int(plan.units.size()), max_units = n_units + 37;  // graph form: a grid with spare warps
  Dev<PagedDecodeUnit> dunits(max_units);
  dunits.up(plan.units);
  Dev<int32_t> dn(std::vector<int32_t>{n_units});
  Dev<float> ws(cuda::paged_decode_workspace_floats(max_units, Hq / Hkv, hd));
  cuda::PagedDecodeParams p;
  p.q = dq.p, p.out = dout.p, p.k_pool = dk.p, p.v_pool = dv.p, p.page_table = dtable.p, p.heads = dheads.p;
  p.units = dunits.p, p.n_units = n_units, p.workspace = ws.p;
  p.n_seqs = n, p.n_heads = Hq, p.n_kv_heads = Hkv, p.head_dim = hd, p.page_size = P;
  Stream s;
  cuda::paged_decode_attention(p, s.s);
  const std::vector<uint16_t> got = dout.down();
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float x = from_bf16(got[i]);
    ASSERT_TRUE(std::isfinite(x)) << "output " << i << " (sequence " << i / (size_t(Hq) * hd) << ")";
    worst = std::max(worst, std::abs(double(x) - ref[i]) / (0.02 + std::abs(ref[i])));
  }
  // bf16 output rounding (2^-9 relative) and bf16 probabilities in the PV product: within 2% + 0.02.
  EXPECT_LT(worst, 1.0) << "largest |got - ref| / (0.02 + |ref|)";
  dout.poison();
  p.n_units = 0, p.n_units_dev = dn.p, p.max_units = max_units;
  cuda::paged_decode_attention(p, s.s);
  EXPECT_EQ(dout.down(), got) << "device unit count with spare warps gives the host path's bits";

  auto check = [&](const std::vector<float>& want, const char* what) {
    const std::vector<uint16_t> out = dout.down();
    double w = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      const float x = from_bf16(out[i]);
      ASSERT_TRUE(std::isfinite(x)) << what << ": output " << i;
      w = std::max(w, std::abs(double(x) - want[i]) / (0.02 + std::abs(want[i])));
    }
    EXPECT_LT(w, 1.0) << what << ": largest |got - ref| / (0.02 + |ref|)";
  };

  // Units cut for a larger capacity than the heads keep now (the GPU model's graph replays one cut while kept
  // grows): every head keeps up to 37 positions fewer, the kernel reads only those.
  PagedDecodePlan fewer = plan;
  for (PagedDecodeHead& h : fewer.heads) h.kept = std::max(1, h.kept - 37);
  std::vector<float> ref_fewer(q.size());
  paged_decode_reference(fewer, qf.data(), kf.data(), vf.data(), Hq, hd, ref_fewer.data());
  dheads.up(fewer.heads);
  dout.poison();
  p.n_units = n_units, p.n_units_dev = nullptr;
  cuda::paged_decode_attention(p, s.s);
  check(ref_fewer, "units past kept");

  // The device planner: each sequence a slice of Hkv heads (as each layer is in the GPU model), units cut on the
  // device from kept alone must equal plan_paged_decode's for that sequence with paged_keys_per_unit's cut.
  const int target = 24;  // small, so that sequences get several units per head
  std::vector<PagedDecodeHead> heads_in(plan.heads);
  for (PagedDecodeHead& h : heads_in) h.unit_begin = h.unit_end = -7;  // the planner must set them
  Dev<PagedDecodeHead> dslices(heads_in);
  int slice_units = 0;
  for (int b = 0; b < n; ++b) {
    int64_t total = 0;
    for (int h = 0; h < Hkv; ++h) total += plan.heads[size_t(b) * Hkv + h].kept;
    slice_units = std::max(slice_units, paged_max_units(total, Hkv, target));
  }
  Dev<PagedDecodeUnit> dsu(size_t(n) * slice_units);
  Dev<int32_t> dsn(n);
  Dev<float> ws2(cuda::paged_decode_workspace_floats(slice_units, Hq / Hkv, hd));
  cuda::paged_decode_plan_device(dslices.p, dsu.p, dsn.p, n, Hkv, slice_units, target, s.s);
  const std::vector<PagedDecodeHead> dev_heads = dslices.down();
  const std::vector<PagedDecodeUnit> dev_units = dsu.down();
  const std::vector<int32_t> dev_n = dsn.down();
  for (int b = 0; b < n; ++b) {
    std::vector<const HeadPages*> one(heads.begin() + size_t(b) * Hkv, heads.begin() + size_t(b + 1) * Hkv);
    int64_t total = 0;
    for (const HeadPages* h : one) total += h->kept;
    const PagedDecodePlan host = plan_paged_decode(one, Hkv, P, paged_keys_per_unit(total, target));
    ASSERT_EQ(dev_n[b], int(host.units.size())) << "sequence " << b;
    for (size_t u = 0; u < host.units.size(); ++u) {
      const PagedDecodeUnit& d = dev_units[size_t(b) * slice_units + u];
      EXPECT_TRUE(d.head == host.units[u].head && d.key_begin == host.units[u].key_begin &&
                  d.key_end == host.units[u].key_end)
          << "sequence " << b << " unit " << u << ": device (" << d.head << ", " << d.key_begin << ", " << d.key_end
          << ")";
    }
    for (int h = 0; h < Hkv; ++h) {
      EXPECT_EQ(dev_heads[size_t(b) * Hkv + h].unit_begin, host.heads[h].unit_begin) << "sequence " << b << " head " << h;
      EXPECT_EQ(dev_heads[size_t(b) * Hkv + h].unit_end, host.heads[h].unit_end) << "sequence " << b << " head " << h;
    }
  }
  // The kernel over the planner's slices, one sequence per launch, graph form: the batch reference.
  dout.poison();
  for (int b = 0; b < n; ++b) {
    cuda::PagedDecodeParams pb = p;
    pb.q = dq.p + size_t(b) * Hq * hd, pb.out = dout.p + size_t(b) * Hq * hd;
    pb.heads = dslices.p + size_t(b) * Hkv;
    pb.units = dsu.p + size_t(b) * slice_units;
    pb.n_units = 0, pb.n_units_dev = dsn.p + b, pb.max_units = slice_units;
    pb.workspace = ws2.p;
    pb.n_seqs = 1;
    cuda::paged_decode_attention(pb, s.s);
  }
  check(ref, "device planner");
}

}  // namespace

TEST(PagedDecodeCuda, MatchesReferenceOnMixedBatches) {
  SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  const std::vector<Case> cases = {
      {128, 32, 8, 64, 64, {1, 17, 700, 3000}, {HeadMode::Full, HeadMode::Streaming, HeadMode::Streaming, HeadMode::XAttn}},
      {128, 32, 8, 16, 48, {5000, 63, 64, 65}, {HeadMode::Streaming, HeadMode::Full, HeadMode::Streaming, HeadMode::Full}},
      {64, 9, 3, 32, 128, {2049, 1}, {HeadMode::Streaming, HeadMode::Full}},
      {128, 16, 1, 64, 256, {4100}, {HeadMode::Full}},
      {128, 64, 8, 64, 64, {1000, 2000}, {HeadMode::Streaming, HeadMode::Full}},  // 8 query heads per KV head
      {64, 32, 2, 64, 512, {3333, 129, 10}, {HeadMode::Full, HeadMode::Streaming, HeadMode::Full}}};  // 16 per KV head
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    run_case(cases[i], rng);
  }
}

TEST(PagedDecodeCuda, BadShapesNameTheField) {
  SKIP_WITHOUT_GPU();
  cuda::PagedDecodeParams p;
  EXPECT_THROW(cuda::paged_decode_attention(p, nullptr), std::invalid_argument);  // null pointers
  Dev<float> any(64);
  p.out = any.p;
  p.q = p.k_pool = p.v_pool = any.p;
  p.page_table = reinterpret_cast<const int32_t*>(any.p);
  p.heads = reinterpret_cast<const PagedDecodeHead*>(any.p);
  p.units = reinterpret_cast<const PagedDecodeUnit*>(any.p);
  p.workspace = any.p;
  p.n_seqs = 1, p.n_heads = 32, p.n_kv_heads = 8, p.head_dim = 96, p.page_size = 64;
  try {
    cuda::paged_decode_attention(p, nullptr);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim must be 64 or 128 (got 96)"), std::string::npos);
  }
  p.head_dim = 128, p.page_size = 40;
  EXPECT_THROW(cuda::paged_decode_attention(p, nullptr), std::invalid_argument);
  p.page_size = 64, p.n_heads = 34;
  EXPECT_THROW(cuda::paged_decode_attention(p, nullptr), std::invalid_argument);
  p.n_heads = 32 * 8, p.n_kv_heads = 8;  // 32 per KV head
  EXPECT_THROW(cuda::paged_decode_attention(p, nullptr), std::invalid_argument);
}
