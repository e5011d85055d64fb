#pragma once
// Which 64-key tiles a 64-row query tile of the fused attention forward visits, per routing mode, and how the
// wgmma kernel walks two query heads' lists together in steps of 128 keys. Host and device code: the CUDA kernels
// (attention_fwd.cu) walk these, and tests/test_tile_walk.cpp checks every walk on the CPU against the block rules
// of the CPU reference (src/attention/attention.cpp).
#include <climits>
#include <cstdint>

#include "elastic/kv_head_mode.h"
#include "elastic/streaming_rule.h"

#if defined(__CUDACC__)
#define ELASTIC_HD __host__ __device__ __forceinline__
#else
#define ELASTIC_HD inline
#endif

namespace elastic::cuda::walk {

constexpr int kTile = 64;  // keys (and query rows) per tile

// Ascending key tiles of one (query head, query tile). mode 0 Full: [0, n); 1 Streaming: [0, n1) then
// [s2, s2 + n - n1); 2 XAttn: the tiles of the blocks in xl (R tiles per block), cut at the query tile.
struct TileList {
  int mode, n, n1, s2, R;
  const int32_t* xl;
  ELASTIC_HD int at(int i) const {
    if (mode == kv_mode::kXAttn) return xl[i / R] * R + i % R;
    if (mode == kv_mode::kStreaming) return i < n1 ? i : s2 + (i - n1);
    return i;
  }
};

// Tile list of query head h at absolute query tile qt. mode / sink_blocks / local_blocks as in KVHeadMeta; an XAttn
// head with no lists (blocks == nullptr) attends densely. counts / offsets are [Hq * nb], nb = ceil(n_keys / block).
ELASTIC_HD TileList tile_list(int mode, int sink_blocks, int local_blocks, const int32_t* blocks,
                              const int32_t* offsets, const int32_t* counts, int h, int qt, int n_keys, int block) {
  const int R = block / kTile, qb = qt / R;
  TileList tl{0, qt + 1, 0, 0, R, nullptr};
  if (mode == kv_mode::kStreaming) {
    // The rule's two block ranges (streaming_rule.h) in tiles, cut at this query tile: the sink's tiles up to qt, then
    // the window's from its first block to qt.
    const StreamingRange br = streaming_range(qb, StreamingBlocks{sink_blocks, local_blocks});
    const int sink_tiles = br.sink_end * R, n1 = sink_tiles < qt + 1 ? sink_tiles : qt + 1;
    const int s2 = br.window_start * R;
    tl = TileList{1, n1 + (qt + 1 - s2 > 0 ? qt + 1 - s2 : 0), n1, s2, R, nullptr};
  } else if (mode == kv_mode::kXAttn && blocks != nullptr) {
    const int nb = (n_keys + block - 1) / block;
    const int cnt = counts[h * nb + qb];
    const int32_t* xl = blocks + offsets[h * nb + qb];
    int n = cnt * R;
    if (cnt > 0) {
      const int past = xl[cnt - 1] * R + R - 1 - qt;  // tiles of the diagonal block past this query tile
      n -= past > 0 ? past : 0;
    }
    tl = TileList{2, n, 0, 0, R, xl};
  }
  return tl;
}

// Ascending union of two tile lists; mask bit w says the tile belongs to head w.
struct UnionIter {
  TileList a, b;
  int ia = 0, ib = 0;
  ELASTIC_HD bool next(int& tile, int& mask) {
    const int ta = ia < a.n ? a.at(ia) : INT_MAX, tb = ib < b.n ? b.at(ib) : INT_MAX;
    tile = ta < tb ? ta : tb;
    if (tile == INT_MAX) return false;
    mask = (ta == tile ? 1 : 0) | (tb == tile ? 2 : 0);
    ia += ta == tile;
    ib += tb == tile;
    return true;
  }
};

// Steps of 128 keys over the union: `first` is the 64-key tile a step starts at, m4 bit (half * 2 + w) says half
// `half` (keys first*64 + half*64 ...) is in head w's list; a half in neither list is loaded but masked.
// Pairing: even (adjacent = false) pairs tiles 2k and 2k + 1, so steps start on 128-key boundaries; adjacent
// (adjacent = true) pairs t with t + 1 whenever t + 1 comes next in the union, whatever t's parity, so a run of an
// even number of tiles (a 2048-key streaming window, the sink) has no masked half wherever it starts.
struct PairIter {
  UnionIter un;
  bool adjacent = false;
  bool pending = false;
  int ptile = 0, pmask = 0;
  // Whether a Full / Streaming (or dense XAttn) first list may stand for both (next_shared): true for two query
  // heads of one query tile, whose lists those modes make identical; false for one head's two query tiles (the
  // wgmma kernel's row pairs), whose lists differ.
  bool may_share = true;
  ELASTIC_HD bool next(int& first, int& m4) {
    if (may_share && un.a.mode != kv_mode::kXAttn) return next_shared(first, m4);
    int t, m;
    if (pending) {
      t = ptile, m = pmask, pending = false;
    } else if (!un.next(t, m)) {
      return false;
    }
    if (!adjacent && (t & 1)) {  // an odd tile whose even partner is not in the union: it is the second half
      first = t - 1;
      m4 = m << 2;
      return true;
    }
    first = t;
    m4 = m;
    if (un.next(ptile, pmask)) {
      if (ptile == t + 1)
        m4 |= pmask << 2;
      else
        pending = true;
    }
    return true;
  }

  // Full and Streaming lists do not depend on the query head (nor does a dense XAttn one), so both heads of the pair
  // walk one list: the same steps as the union walk without merging two lists (fewer instructions per step).
  ELASTIC_HD bool next_shared(int& first, int& m4) {
    const TileList& l = un.a;
    if (un.ia >= l.n) return false;
    const int t = l.at(un.ia++);
    if (!adjacent && (t & 1)) {  // an odd tile whose even partner is not in the list: the second half
      first = t - 1;
      m4 = 3 << 2;
      return true;
    }
    first = t;
    m4 = 3;
    if (un.ia < l.n && l.at(un.ia) == t + 1) {
      m4 |= 3 << 2;
      ++un.ia;
    }
    return true;
  }
};

// Bits of m4 for head w: bit 0 first half, bit 1 second half.
ELASTIC_HD int head_valid(int m4, int w) { return ((m4 >> w) & 1) | (((m4 >> (2 + w)) & 1) << 1); }

}  // namespace elastic::cuda::walk
