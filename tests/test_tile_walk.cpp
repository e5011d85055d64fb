// The fused attention kernels' tile walks (src/cuda/tile_walk.h), checked on the CPU: every query tile of every head
// pair, and every row pair (one head's two adjacent query tiles, the wgmma kernel's option bit 16), visits exactly the
// key tiles the CPU reference's block rules keep (Full: causal; Streaming: sink blocks and the local window; XAttn:
// the selected blocks), each once, in ascending steps of 128 keys, under both pairings.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "cuda/tile_walk.h"
#include "elastic/attention.h"

namespace walk = elastic::cuda::walk;

namespace {

struct Lists {  // XAttn lists in the kernels' layout: [Hq * nb] offsets and counts into one block array
  std::vector<int32_t> blocks, offsets, counts;
};

// Random selections as xattn_select makes them: ascending, block 0 and the diagonal always in.
Lists random_lists(int Hq, int nb, std::mt19937& rng) {
  Lists l;
  l.offsets.assign(size_t(Hq) * nb, 0);
  l.counts.assign(size_t(Hq) * nb, 0);
  std::bernoulli_distribution keep(0.4);
  for (int h = 0; h < Hq; ++h)
    for (int qb = 0; qb < nb; ++qb) {
      l.offsets[size_t(h) * nb + qb] = int32_t(l.blocks.size());
      for (int kb = 0; kb <= qb; ++kb)
        if (kb == 0 || kb == qb || keep(rng)) l.blocks.push_back(kb);
      l.counts[size_t(h) * nb + qb] = int32_t(l.blocks.size()) - l.offsets[size_t(h) * nb + qb];
    }
  return l;
}

// The CPU reference's rule for key tile t of query head h at query tile qt.
bool kept(int mode, int sink_blocks, int local_blocks, const Lists* xl, int h, int qt, int t, int block, int nb) {
  const int R = block / walk::kTile, qb = qt / R, kb = t / R;
  if (t > qt) return false;  // past every query row of the tile
  if (mode == elastic::kv_mode::kStreaming) return kb < sink_blocks || qb - kb < local_blocks;
  if (mode == elastic::kv_mode::kXAttn && xl) {
    const int32_t* b = xl->blocks.data() + xl->offsets[size_t(h) * nb + qb];
    return std::binary_search(b, b + xl->counts[size_t(h) * nb + qb], kb);
  }
  return true;
}

struct Walked {
  std::set<int> tiles[2];
  int steps = 0, masked_halves = 0;
};

// Walks one (head pair, query tile), or with row_pairs one (head h0, query tiles qt and qt + 1; the second empty past
// the last tile) as the wgmma kernel's option bit 16 does, and checks the step structure on the way.
Walked walk_pair(int mode, int sink_blocks, int local_blocks, const Lists* xl, int h0, int qt, int n_keys, int block,
                 bool adjacent, bool row_pairs = false) {
  auto list = [&](int h, int q) {
    return walk::tile_list(mode, sink_blocks, local_blocks, xl ? xl->blocks.data() : nullptr,
                           xl ? xl->offsets.data() : nullptr, xl ? xl->counts.data() : nullptr, h, q, n_keys, block);
  };
  const walk::TileList none{elastic::kv_mode::kFull, 0, 0, 0, 1, nullptr};
  const int last_qt = (n_keys - 1) / walk::kTile;
  walk::PairIter it{row_pairs ? walk::UnionIter{list(h0, qt), qt + 1 <= last_qt ? list(h0, qt + 1) : none}
                              : walk::UnionIter{list(h0, qt), list(h0 + 1, qt)},
                    adjacent};
  it.may_share = !row_pairs;
  Walked w;
  int first = 0, m4 = 0, prev_end = -1;
  while (it.next(first, m4)) {
    ++w.steps;
    EXPECT_GE(first, 0);
    if (!adjacent) EXPECT_EQ(first % 2, 0) << "even pairing starts steps on 128-key boundaries";
    EXPECT_NE(m4, 0) << "a step with no tile of either head";
    for (int half = 0; half < 2; ++half) {
      const int t = first + half;
      bool any = false;
      for (int hw = 0; hw < 2; ++hw)
        if (walk::head_valid(m4, hw) >> half & 1) {
          any = true;
          EXPECT_GT(t, prev_end) << "steps must ascend without revisiting a tile";
          EXPECT_TRUE(w.tiles[hw].insert(t).second) << "tile " << t << " visited twice";
        }
      if (!any) ++w.masked_halves;
    }
    prev_end = (walk::head_valid(m4, 0) | walk::head_valid(m4, 1)) & 2 ? first + 1 : first;
  }
  return w;
}

// Every (head pair, query tile) walk of a layer, then every (head, row pair) walk: each member visits exactly the
// tiles the CPU rule keeps for its own head and query tile.
void check_layer(int mode, int sink_blocks, int local_blocks, int block, int Hq, int pos0, int T, bool with_lists,
                 std::mt19937& rng) {
  const int n_keys = pos0 + T, nb = (n_keys + block - 1) / block, last_qt = (n_keys - 1) / walk::kTile;
  const Lists lists = random_lists(Hq, nb, rng);
  const Lists* xl = mode == elastic::kv_mode::kXAttn && with_lists ? &lists : nullptr;
  for (const bool row_pairs : {false, true})
    for (const bool adjacent : {false, true})
      for (int qt = pos0 / walk::kTile; qt <= last_qt; qt += row_pairs ? 2 : 1)
        for (int h0 = 0; h0 < Hq; h0 += row_pairs ? 1 : 2) {
          SCOPED_TRACE("mode " + std::to_string(mode) + " block " + std::to_string(block) + " qt " +
                       std::to_string(qt) + " h0 " + std::to_string(h0) + (adjacent ? " adjacent" : " even") +
                       (row_pairs ? " row pairs" : ""));
          const Walked w = walk_pair(mode, sink_blocks, local_blocks, xl, h0, qt, n_keys, block, adjacent, row_pairs);
          for (int hw = 0; hw < 2; ++hw) {
            const int h = row_pairs ? h0 : h0 + hw, q = row_pairs ? qt + hw : qt;
            std::set<int> want;
            for (int t = 0; q <= last_qt && t <= q; ++t)
              if (kept(mode, sink_blocks, local_blocks, xl, h, q, t, block, nb)) want.insert(t);
            EXPECT_EQ(w.tiles[hw], want) << "head " << h << " query tile " << q;
          }
        }
}

}  // namespace

TEST(TileWalk, FullVisitsEveryCausalTile) {
  std::mt19937 rng(1);
  for (const int block : {64, 128}) check_layer(0, 0, 1, block, 4, 0, 700, false, rng);
  check_layer(0, 0, 1, 64, 4, 300, 133, false, rng);  // unaligned chunk
}

TEST(TileWalk, StreamingVisitsSinkAndWindow) {
  std::mt19937 rng(2);
  struct S { int sink, local, block; };
  // The last two: a sink or a window past every position (streaming_blocks clamps to INT32_MAX): every causal tile.
  for (const S s : {S{1, 2, 64}, S{2, 32, 64}, S{0, 3, 64}, S{1, 2, 128}, S{1, 16, 128}, S{3, 1, 64},
                    S{INT32_MAX, 1, 128}, S{0, INT32_MAX, 64}})
    for (const int pos0 : {0, 128, 300}) check_layer(1, s.sink, s.local, s.block, 4, pos0, 2500, false, rng);
}

TEST(TileWalk, XAttnVisitsItsHeadsSelectedBlocks) {
  std::mt19937 rng(3);
  for (const int block : {64, 128})
    for (const int pos0 : {0, 256}) {
      check_layer(2, 0, 1, block, 8, pos0, 1500, true, rng);
      check_layer(2, 0, 1, block, 8, pos0, 700, false, rng);  // no lists: dense
    }
}

// The point of adjacent pairing: a 2048-key window (32 blocks of 64) after a 128-key sink is walked in whole
// 128-key steps wherever it starts, where even pairing masks a 64-key half at each end of half the query tiles.
TEST(TileWalk, AdjacentPairingLeavesNoMaskedHalfInAStreamingWindow) {
  const int block = 64, sink_blocks = 2, local_blocks = 32, T = 16384;
  int masked_even = 0, masked_adjacent = 0;
  for (int qt = 40; qt < T / walk::kTile; ++qt) {
    masked_even += walk_pair(1, sink_blocks, local_blocks, nullptr, 0, qt, T, block, false).masked_halves;
    masked_adjacent += walk_pair(1, sink_blocks, local_blocks, nullptr, 0, qt, T, block, true).masked_halves;
  }
  EXPECT_EQ(masked_adjacent, 0);
  EXPECT_GT(masked_even, 0);
}

// paired_walk_steps (the XAttention cost figure bench --density prints, attention.h) counts the steps the kernel's
// adjacent PairIter takes over two query heads' XAttn lists: hand cases, then random lists of 64-key blocks.
TEST(TileWalk, PairedWalkStepsCountsTheKernelsSteps) {
  using elastic::paired_walk_steps;
  EXPECT_EQ(paired_walk_steps({}, {}), 0);
  EXPECT_EQ(paired_walk_steps({0, 1, 2, 3}, {0, 1, 2, 3}), 2);  // shared, whole pairs
  EXPECT_EQ(paired_walk_steps({0, 2, 4}, {}), 3);               // every step half masked
  EXPECT_EQ(paired_walk_steps({0, 2}, {1, 3}), 2);              // disjoint heads, one union of whole pairs
  EXPECT_EQ(paired_walk_steps({1, 2}, {}), 1);                  // adjacent pairing: any parity
  EXPECT_EQ(paired_walk_steps({0, 1, 5}, {2}), 3);
  std::mt19937 rng(11);
  const int nb = 40, Hq = 2;
  const Lists l = random_lists(Hq, nb, rng);
  for (int qb = 0; qb < nb; ++qb) {
    std::vector<int> a, b;
    for (int h = 0; h < Hq; ++h)
      for (int i = 0; i < l.counts[size_t(h) * nb + qb]; ++i)
        (h ? b : a).push_back(l.blocks[l.offsets[size_t(h) * nb + qb] + i]);
    auto list = [&](int h) {
      return walk::tile_list(elastic::kv_mode::kXAttn, 0, 0, l.blocks.data(), l.offsets.data(), l.counts.data(), h, qb,
                             nb * 64, 64);
    };
    walk::PairIter it{walk::UnionIter{list(0), list(1)}, true};
    int steps = 0, first = 0, m4 = 0;
    while (it.next(first, m4)) ++steps;
    EXPECT_EQ(paired_walk_steps(a, b), steps) << "query block " << qb;
  }
}
