// Page pool, per-head page lists and the paged decode plan (kv_pages.h, paged_decode.h), against the streaming
// rule and a dense fp64 attention over the positions each head keeps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <set>

#include "elastic/kv_pages.h"
#include "elastic/paged_decode.h"

using namespace elastic;

namespace {

RoutingTable routing(int L, int H, const std::vector<HeadMode>& modes, int B = 64, int sink = 128, int local = 256) {
  RoutingTable r = RoutingTable::all_full(L, H);
  r.mode = modes;
  r.sparse.block = B, r.sparse.sink = sink, r.sparse.local = local;
  return r;
}

// The toy strided pattern (src/attention/patterns/strided.cpp): its rule is written out below, independently.
const HeadMode kStrided = parse_head_mode("strided");

// Positions the query at position p attends, by the streaming rule (all of [0, p] for full and XAttention heads,
// blocks kb % 4 == 0 and the diagonal for the strided toy).
std::vector<int> kept_positions(HeadMode m, const SparseSettings& s, int p) {
  std::vector<int> out;
  const int qb = p / s.block;
  for (int j = 0; j <= p; ++j) {
    const int kb = j / s.block;
    const bool kept = m == HeadMode::Streaming ? streaming_keeps(qb, kb, s)
                      : m == kStrided          ? kb == qb || kb % 4 == 0
                                               : true;
    if (kept) out.push_back(j);
  }
  return out;
}

}  // namespace

TEST(PagePool, AllocatesReleasesAndRefusesClearly) {
  PagePool pool(3, 64);
  EXPECT_EQ(pool.free_pages(), 3);
  std::set<int32_t> got{pool.allocate(), pool.allocate(), pool.allocate()};
  EXPECT_EQ(got, (std::set<int32_t>{0, 1, 2}));
  try {
    pool.allocate();
    FAIL() << "a fourth page from a pool of 3";
  } catch (const OutOfPages& e) {
    EXPECT_NE(std::string(e.what()).find("out of pages (all 3 pages of 64 positions in use)"), std::string::npos);
  }
  pool.release(1);
  EXPECT_EQ(pool.allocate(), 1);  // LIFO: the page just released comes back first
  pool.release(2);
  EXPECT_THROW(pool.release(2), std::logic_error);   // double free
  EXPECT_THROW(pool.release(7), std::logic_error);   // not a page of this pool
  EXPECT_THROW(pool.release(-1), std::logic_error);
  EXPECT_THROW(PagePool(0, 64), std::invalid_argument);
  EXPECT_THROW(PagePool(4, 24), std::invalid_argument);  // not a multiple of the kernel's 16-key tile
  EXPECT_THROW(PagePool(4, 8192), std::invalid_argument);
}

// Decode position by position (prefill in chunks first): after each grow(), every head holds exactly the positions
// its next query attends, in pages of block order that are all full but the last; the streaming head's pages stay
// bounded (a ring), the full head's grow by one page per page_size positions; all pages go back at the end.
TEST(SequencePages, HeadsHoldExactlyWhatTheirRoutingKeeps) {
  for (const int P : {16, 32, 64}) {
    SCOPED_TRACE("page size " + std::to_string(P));
    const RoutingTable r = routing(2, 2, {HeadMode::Full, HeadMode::Streaming, kStrided, HeadMode::XAttn});
    const int prompt = 300, n_pos = 1500, chunk = 128;
    const int64_t need = pages_for(r, P, prompt, chunk, n_pos);
    PagePool pool(need, P);  // exactly what admission would reserve: the run must never run out
    int64_t most = 0;
    {
      SequencePages seq(pool, r);
      auto check = [&](int c0) {  // after grow(): the positions the query at c0 (the chunk's first) attends
        for (int l = 0; l < 2; ++l)
          for (int h = 0; h < 2; ++h) {
            const HeadPages& hp = seq.head(l, h);
            std::vector<int> want = kept_positions(hp.mode, r.sparse, c0);
            for (int j = c0 + 1; j < seq.length(); ++j) want.push_back(j);  // the chunk's own later positions
            ASSERT_EQ(hp.kept, int(want.size())) << "layer " << l << " head " << h << " at " << seq.length();
            ASSERT_EQ(int64_t(hp.pages.size()), (hp.kept + P - 1) / P);
            ASSERT_TRUE(std::is_sorted(hp.page_block.begin(), hp.page_block.end()));
            for (const int j : want) ASSERT_NO_THROW(seq.row(l, h, j)) << "position " << j;
          }
        most = std::max(most, seq.pages_held());
        EXPECT_EQ(pool.used_pages(), seq.pages_held());
      };
      for (int c0 = 0; c0 < prompt; c0 += chunk) {
        seq.grow(std::min(prompt, c0 + chunk));
        check(c0);
        seq.release_unused();
      }
      for (int p = prompt; p < n_pos; ++p) {
        seq.grow(p + 1);
        check(p);
        seq.release_unused();
      }
      // The streaming head's window: sink 2 blocks + window 4 blocks of 64.
      EXPECT_LE(int64_t(seq.head(0, 1).pages.size()), (2 + 4) * 64 / P);
      EXPECT_EQ(int64_t(seq.head(0, 0).pages.size()), (n_pos + P - 1) / P);
      EXPECT_THROW(seq.row(0, 1, 200), std::out_of_range);  // left the window long ago
      EXPECT_THROW(seq.row(0, 0, n_pos), std::out_of_range);
    }
    EXPECT_EQ(most, need) << "pages_for is the schedule's peak";
    EXPECT_EQ(pool.free_pages(), pool.n_pages()) << "a finished sequence returns every page";
  }
}

TEST(SequencePages, OutOfPagesIsAllOrNothing) {
  const RoutingTable r = routing(1, 2, {HeadMode::Full, HeadMode::Full});
  PagePool pool(5, 64);
  SequencePages seq(pool, r);
  seq.grow(100);  // 2 pages per head
  EXPECT_EQ(pool.used_pages(), 4);
  EXPECT_THROW(seq.grow(200), OutOfPages);  // needs 2 more per head, one is free
  EXPECT_EQ(seq.length(), 100);
  EXPECT_EQ(pool.used_pages(), 4);
  EXPECT_EQ(seq.head(0, 0).kept, 100);
  seq.grow(128);  // within the held pages: no page needed
  EXPECT_EQ(pool.used_pages(), 4);
  seq.release_all();
  EXPECT_EQ(pool.used_pages(), 0);
  EXPECT_THROW(SequencePages(pool, routing(1, 2, {HeadMode::Full, HeadMode::Full}, 48)), std::invalid_argument);
  seq.grow(10);
  EXPECT_THROW(seq.grow(5), std::invalid_argument);  // positions are appended, never taken back by grow
}

// The GPU model's schedule (one layer's prefill after another, each in block-sized grows, then decode steps that
// release at block starts and grow every layer by one): its peak pool use is pages_for_layer_major, which is not
// pages_for's token-major count: above it where earlier layers sit at their final size while a later one peaks, below
// it where later layers are still empty.
TEST(SequencePages, LayerMajorPeakIsPagesForLayerMajor) {
  bool above = false;
  for (const int B : {64, 128})
    for (const int prompt : {60, 448, 700})
      for (const int more : {0, 300}) {
      SCOPED_TRACE("block " + std::to_string(B) + ", prompt " + std::to_string(prompt) + " + " + std::to_string(more));
      RoutingTable r = routing(3, 2, {HeadMode::Full, HeadMode::Full, HeadMode::Streaming, kStrided,
                                      HeadMode::Streaming, HeadMode::Streaming}, B, B, 2 * B);
      const int n_pos = prompt + more, P = 64;
      PagePool pool(100000, P);
      int64_t most = 0;
      {
        std::vector<std::unique_ptr<SequencePages>> layers;
        for (int l = 0; l < 3; ++l) {
          RoutingTable lr = RoutingTable::all_full(1, 2);
          lr.mode = {r.at(l, 0), r.at(l, 1)};
          lr.sparse = r.sparse;
          layers.push_back(std::make_unique<SequencePages>(pool, lr));
          for (int c0 = 0; c0 < prompt; c0 += B) {
            layers[l]->grow(std::min(prompt, c0 + B));
            most = std::max(most, pool.used_pages());
            layers[l]->release_unused();
          }
        }
        for (int n = prompt; n < n_pos; ++n)
          for (auto& sq : layers) {
            if (n % B == 0) sq->release_unused();
            sq->grow(n + 1);
            most = std::max(most, pool.used_pages());
          }
      }
      EXPECT_EQ(most, pages_for_layer_major(r, P, prompt, B, n_pos));
      above |= pages_for_layer_major(r, P, prompt, B, n_pos) > pages_for(r, P, prompt, B, n_pos);
      }
  EXPECT_TRUE(above) << "some case where the layer-major peak exceeds pages_for";
}

// A fork: a sequence that decoded past a block boundary (a streaming head's window moved) is copied into fresh
// pages; both then hold the same blocks and kept counts, every kept position maps to a page of its own sequence,
// and both grow on identically. A pool too small for the copy refuses it and keeps nothing of it.
TEST(SequencePages, CopyLayoutFromIsAForkOfTheSource) {
  const RoutingTable r = routing(1, 3, {HeadMode::Full, HeadMode::Streaming, kStrided});
  PagePool pool(200, 64);
  SequencePages a(pool, r);
  for (int c0 = 0; c0 < 300; c0 += 64) {
    a.grow(std::min(300, c0 + 64));
    a.release_unused();
  }
  for (int p = 300; p < 700; ++p) {  // decode steps, releasing at block starts as the GPU model does
    if (p % 64 == 0) a.release_unused();
    a.grow(p + 1);
  }
  const int64_t used = pool.used_pages();
  SequencePages b(pool, r);
  std::vector<int32_t> from, to;
  b.copy_layout_from(a, from, to);
  EXPECT_EQ(pool.used_pages(), 2 * used);
  EXPECT_EQ(int64_t(from.size()), a.pages_held());
  EXPECT_EQ(b.length(), a.length());
  std::set<int32_t> own(to.begin(), to.end()), theirs(from.begin(), from.end());
  for (int32_t p : own) EXPECT_FALSE(theirs.count(p)) << "page " << p << " in both sequences";
  for (int h = 0; h < 3; ++h) {
    EXPECT_EQ(b.head(0, h).kept, a.head(0, h).kept);
    EXPECT_EQ(b.head(0, h).page_block, a.head(0, h).page_block);
    for (const int j : kept_positions(a.head(0, h).mode, r.sparse, 699)) {
      const int64_t ra = a.row(0, h, j), rb = b.row(0, h, j);
      EXPECT_EQ(ra % 64, rb % 64);
      EXPECT_TRUE(own.count(int32_t(rb / 64))) << "position " << j;
    }
  }
  for (int p = 700; p < 800; ++p) {
    if (p % 64 == 0) a.release_unused(), b.release_unused();
    a.grow(p + 1);
    b.grow(p + 1);
  }
  for (int h = 0; h < 3; ++h) EXPECT_EQ(b.head(0, h).page_block, a.head(0, h).page_block);
  EXPECT_THROW(b.copy_layout_from(a, from, to), std::invalid_argument) << "only into an empty sequence";

  PagePool small(used + used / 2, 64);  // room for the source, not for a copy of it
  SequencePages c(small, r), d(small, r);
  for (int p = 0; p < 700; p += 64) c.grow(std::min(700, p + 64)), c.release_unused();
  const int64_t held = small.used_pages();
  EXPECT_THROW(d.copy_layout_from(c, from, to), OutOfPages);
  EXPECT_EQ(small.used_pages(), held);
  EXPECT_EQ(d.length(), 0);
  EXPECT_TRUE(from.empty() && to.empty());
}

// The plan's units tile each head's kept list exactly once, and the reference over pages equals dense attention
// over the positions each head keeps, for a batch of sequences with different lengths and routings.
TEST(PagedDecode, PlanAndReferenceMatchDenseAttentionOverKeptPositions) {
  const int Hkv = 2, G = 3, Hq = Hkv * G, hd = 64, P = 32;
  PagePool pool(4096, P);
  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> kpool(size_t(pool.n_pages()) * P * hd), vpool(kpool.size());
  const std::vector<RoutingTable> rs = {routing(1, Hkv, {HeadMode::Full, HeadMode::Streaming}),
                                        routing(1, Hkv, {HeadMode::Streaming, HeadMode::Streaming}),
                                        routing(1, Hkv, {HeadMode::Full, HeadMode::Full})};
  const std::vector<int> lengths = {700, 1234, 17};
  // K/V of (sequence, head, position): random, kept here to build the dense reference.
  std::vector<std::vector<std::vector<float>>> K(3), V(3);
  std::vector<std::unique_ptr<SequencePages>> seqs;
  for (int b = 0; b < 3; ++b) {
    seqs.push_back(std::make_unique<SequencePages>(pool, rs[b]));
    K[b].assign(Hkv, {}), V[b].assign(Hkv, {});
    for (int p = 0; p < lengths[b]; ++p) {
      seqs[b]->grow(p + 1);
      for (int h = 0; h < Hkv; ++h) {
        const int64_t row = seqs[b]->row(0, h, p);
        for (int e = 0; e < hd; ++e) {
          const float k = nd(rng), v = nd(rng);
          K[b][h].push_back(k), V[b][h].push_back(v);
          kpool[size_t(row) * hd + e] = k, vpool[size_t(row) * hd + e] = v;
        }
      }
      if (p + 1 < lengths[b]) seqs[b]->release_unused();
    }
  }
  std::vector<const HeadPages*> heads;
  for (int b = 0; b < 3; ++b)
    for (int h = 0; h < Hkv; ++h) heads.push_back(&seqs[b]->head(0, h));
  const PagedDecodePlan plan = plan_paged_decode(heads, Hkv, P, 64);
  for (size_t i = 0; i < plan.heads.size(); ++i) {
    const PagedDecodeHead& h = plan.heads[i];
    int next = 0;
    for (int u = h.unit_begin; u < h.unit_end; ++u) {
      EXPECT_EQ(plan.units[u].head, int(i));
      EXPECT_EQ(plan.units[u].key_begin, next);
      EXPECT_EQ(plan.units[u].key_begin % kPagedTile, 0);
      next = plan.units[u].key_end;
    }
    EXPECT_EQ(next, h.kept);
  }
  std::vector<float> q(size_t(3) * Hq * hd), out(q.size(), NAN);
  for (auto& x : q) x = nd(rng);
  paged_decode_reference(plan, q.data(), kpool.data(), vpool.data(), Hq, hd, out.data());
  const float scale = 1.f / std::sqrt(float(hd));
  for (int b = 0; b < 3; ++b)
    for (int hq = 0; hq < Hq; ++hq) {
      const int h = hq / G;
      const std::vector<int> pos = kept_positions(rs[b].mode[h], rs[b].sparse, lengths[b] - 1);
      std::vector<double> s;
      double mx = -INFINITY, l = 0;
      for (const int j : pos) {
        double d = 0;
        for (int e = 0; e < hd; ++e) d += double(q[(size_t(b) * Hq + hq) * hd + e]) * K[b][h][size_t(j) * hd + e];
        s.push_back(d * scale);
        mx = std::max(mx, s.back());
      }
      std::vector<double> o(hd, 0.0);
      for (size_t i = 0; i < pos.size(); ++i) {
        const double w = std::exp(s[i] - mx);
        l += w;
        for (int e = 0; e < hd; ++e) o[e] += w * V[b][h][size_t(pos[i]) * hd + e];
      }
      for (int e = 0; e < hd; ++e)
        ASSERT_NEAR(out[(size_t(b) * Hq + hq) * hd + e], o[e] / l, 1e-5) << "seq " << b << " head " << hq;
    }
  EXPECT_THROW(plan_paged_decode(heads, Hkv, P, 24), std::invalid_argument);
  EXPECT_THROW(plan_paged_decode(heads, 4, P, 64), std::invalid_argument);
  EXPECT_EQ(paged_keys_per_unit(1 << 20, 2112), 512);
  EXPECT_EQ(paged_keys_per_unit(100, 2112), 64);
  EXPECT_EQ(paged_keys_per_unit(int64_t(1) << 40, 1), 4096);
}

// paged_max_units bounds the units of every total up to the capacity it was given, not only of the capacity itself:
// the GPU model sizes its unit buffers once at max_ctx and cuts units each step from the kept counts (a bound taken
// at the capacity alone was exceeded at 32K of a 128K model, whose outputs then came out NaN).
TEST(PagedDecodePlan, MaxUnitsBoundsEveryTotalUpToTheCapacity) {
  std::mt19937 rng(5);
  for (const int target : {1, 24, 2112, 2640}) {
    for (const int heads : {1, 3, 8}) {
      for (const int64_t cap : {int64_t(64), int64_t(1000), int64_t(8) * 130080, int64_t(8) << 20}) {
        const int bound = paged_max_units(cap, heads, target);
        for (int trial = 0; trial < 300; ++trial) {
          const int64_t total = 1 + int64_t(rng() % uint64_t(cap));
          const int kpu = paged_keys_per_unit(total, target);
          // Any split of `total` over the heads cuts at most total / kpu + heads units; and a random split.
          ASSERT_LE(total / kpu + heads, bound) << "target " << target << " heads " << heads << " total " << total;
          std::vector<int64_t> kept(heads, 0);
          for (int64_t k = 0, left = total; k < heads; ++k) {
            kept[k] = k + 1 == heads ? left : int64_t(rng() % uint64_t(left + 1));
            left -= kept[k];
          }
          int64_t units = 0;
          for (const int64_t k : kept) units += (k + kpu - 1) / kpu;
          ASSERT_LE(units, bound) << "target " << target << " heads " << heads << " capacity " << cap << " total "
                                  << total << " keys per unit " << kpu;
        }
      }
    }
  }
  EXPECT_EQ(paged_max_units(int64_t(8) * 130080, 8, 2112), 2112 + 8);
}

// The KV figure both devices print (kept_kv_positions) is what paged memory holds: the pages' kept counts after a
// sequence grows to n positions the way the GPU model's decode steps grow it (returning what left the window when a
// new block starts, then growing), i.e. what the query at n - 1 attended.
TEST(KvFigures, KeptPositionsEqualThePagesHeld) {
  RoutingTable r = RoutingTable::all_full(3, 4);
  for (size_t i = 0; i < r.mode.size(); ++i)
    r.mode[i] = i % 3 == 0 ? HeadMode::Full : i % 3 == 1 ? HeadMode::Streaming : HeadMode::XAttn;
  r.sparse.block = 64, r.sparse.sink = 100, r.sparse.local = 300;
  for (const int n : {1, 63, 64, 65, 200, 447, 448, 449, 1000, 3001}) {
    PagePool pool(4096, 64);
    SequencePages seq(pool, r);
    for (int c0 = 0; c0 < n; c0 += r.sparse.block) {
      seq.release_unused();
      seq.grow(std::min(n, c0 + r.sparse.block));
    }
    int64_t held = 0;
    for (int l = 0; l < r.n_layers; ++l)
      for (int h = 0; h < r.n_kv_heads; ++h) held += seq.head(l, h).kept;
    EXPECT_EQ(kept_kv_positions(r, n), held) << "n " << n;
  }
  EXPECT_EQ(kept_kv_positions(RoutingTable::all_full(2, 2), 10), 40);
  EXPECT_EQ(kept_kv_positions(r, 0), 0);
}
