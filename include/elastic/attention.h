#pragma once
// Attention entry point shared by every head mode. Each (layer, KV head) carries its own mode; a query head follows
// its KV head. Sparse modes work at block granularity: a query block computes only its selected key blocks, and
// causality is applied token by token inside them.
#include <cstdint>
#include <string>
#include <vector>

#include "elastic/xattn.h"

namespace elastic {

// A KV head's sparse pattern: the index of its pattern in src/attention/patterns/registry.cpp (sparse_pattern.h). The
// three the GPU kernels implement are named; others (the CPU-only toy "strided") have only their registry index.
enum class HeadMode : uint8_t { Full = 0, Streaming = 1, XAttn = 2 };
const char* head_mode_name(HeadMode m);           // the pattern's name
HeadMode parse_head_mode(const std::string& s);  // a registered pattern's name or alias; throws listing them otherwise

// Largest sink or local window accepted (16M tokens): beyond any context we run, and small enough that block
// rounding and sink + window sums stay far from int overflow.
constexpr int kMaxSparseWindow = 1 << 24;

struct SparseSettings {
  int block = 64;     // block size for every sparse mode (64 or 128)
  int sink = 128;     // streaming: leading tokens always kept (rounded up to whole blocks)
  int local = 2048;   // streaming: local window in tokens (rounded up to whole blocks, diagonal included)
  XAttnParams xattn;  // xattn.block is kept equal to `block`
};

// Per-(layer, KV head) routing table; mode[l * n_kv_heads + h].
struct RoutingTable {
  int n_layers = 0;
  int n_kv_heads = 0;
  std::vector<HeadMode> mode;
  SparseSettings sparse;
  static RoutingTable uniform(int n_layers, int n_kv_heads, HeadMode m);
  static RoutingTable all_full(int n_layers, int n_kv_heads) { return uniform(n_layers, n_kv_heads, HeadMode::Full); }
  HeadMode at(int layer, int kv_head) const { return mode[static_cast<size_t>(layer) * n_kv_heads + kv_head]; }
  double msr() const;  // Omega_MSR: fraction of KV heads routed to a sparse mode
};

// JSON routing file: {"block_size":64,"sink":128,"local":2048,"xattn":{"stride":16,"tau":0.9},
//                     "layers":[["full","ssa",...], ...]}  (one list of KV-head modes per layer)
// Throws naming the file and the problem (layer/head counts, unknown mode, bad sizes, a field out of its range).
RoutingTable load_routing(const std::string& path, int n_layers, int n_kv_heads);
void save_routing(const RoutingTable& r, const std::string& path);  // throws when any write fails (a full disk)
// block 64 or 128, 0 <= sink <= kMaxSparseWindow, 1 <= local <= kMaxSparseWindow, stride | block, tau in (0, 1];
// throws "<source>: <field> ..." otherwise.
void validate_sparse(const SparseSettings& s, const std::string& source);

// Work counters accumulated over calls: computed (query, key) pairs vs the dense causal count, and per-head
// causal key blocks skipped (for Omega_ESR).
struct AttentionStats {
  double pairs_done = 0, pairs_full = 0;
  double seconds = 0;  // wall time spent in attention_forward (selection included)
  std::vector<double> blocks_skipped, blocks_causal;  // per KV head of the last layer, weighted by rows done
  // Set by the caller before a run: every layer's counts too, in layer_blocks_* [n_layers * Hkv] (layer-major).
  // What XAttention keeps on real prompts, per (layer, head): `bench --density`.
  bool per_layer = false;
  std::vector<double> layer_blocks_skipped, layer_blocks_causal;
  // Heads with a block selection (XAttention), per 64-row query tile in 64-key tiles (each list cut at its query tile,
  // as the GPU kernel walks): the tiles their selections keep, and the tiles the GPU's paired kernel computes for
  // them (paired_walk_steps over each pair of adjacent query heads of a KV head, two tiles a step for each head of
  // the pair). Their ratio is the paired walk's cost per kept tile. Counted where block skips are
  // (AttentionArgs::track_esr: the last layer, or every layer with per_layer).
  double xattn_kept_tiles = 0, xattn_paired_tiles = 0;
  // The same for the kernel's row pairs (option bit 16): one query head's two adjacent 64-row query tiles together,
  // paired from the call's first tile, over the union of their lists (at block 128 both lie in one selection).
  double xattn_rowpair_kept = 0, xattn_rowpair_tiles = 0;
  double flops_ratio() const { return pairs_full > 0 ? pairs_done / pairs_full : 1.0; }
  double esr() const;  // Omega_ESR: mean over heads of skipped / causal key blocks
  // Adds one layer's run (its own stats, with blocks tracked) into these: pairs and time always, the layer's block
  // counts into layer_blocks_* when per_layer, and into blocks_* when it is the last layer (the ESR's layer).
  void add_layer(int layer, int n_layers, const AttentionStats& one);
};

// Steps of the GPU wgmma kernel's walk for two query heads run together (src/cuda/tile_walk.h, PairIter with
// adjacent pairing): over the ascending union of the heads' 64-key tile lists, a step takes a tile and the next
// tile when that one comes next in the union, else the tile alone (its other half loaded and masked). Each step
// computes two tiles for each head, whichever of them the head keeps. a and b ascending, without repeats.
int paired_walk_steps(const std::vector<int>& a, const std::vector<int>& b);

// The prefill of T tokens under a routing without running it: attention pairs done vs full and the last layer's
// skipped blocks, as attention_forward would count them. Exact for full and streaming heads; XAttention heads
// depend on the input, so with any of them the figures are NaN.
AttentionStats routed_prefill_stats(const RoutingTable& r, int T);
// KV positions a routing keeps in a sequence of n_pos positions: what its last query (position n_pos - 1) attended,
// summed over every (layer, KV head): n_pos for full and XAttention heads (they decode densely), the positions of the
// sink and window blocks (streaming_keeps) for streaming ones. Memory that holds only what attention reads holds this
// many (the GPU model's pages after a decode step, SequencePages::kept); the KV figure both devices print (x head_dim
// x 2 for K and V x bytes per element).
int64_t kept_kv_positions(const RoutingTable& r, int n_pos);
// The same over what every head full would keep (n_pos per head): the KV figure as a share of all-full (0 when empty).
double kept_kv_share(const RoutingTable& r, int n_pos);

// One KV head's keys and values as attention sees them: positions before pos0 come from the cache, whose slots are
// either one per position (ring_slots == 0) or `sink_slots` fixed slots then a ring of `ring_slots` (a streaming
// head stores only sink + window); positions from pos0 on come from this call's fresh rows.
struct HeadKV {
  const float* k_cache = nullptr;  // [slots, hd]
  const float* v_cache = nullptr;
  int sink_slots = 0, ring_slots = 0;
  const float* k_new = nullptr;  // row t = position pos0 + t, `new_stride` floats apart
  const float* v_new = nullptr;
  int new_stride = 0, pos0 = 0, hd = 0;
  int slot(int j) const { return ring_slots == 0 || j < sink_slots ? j : sink_slots + (j - sink_slots) % ring_slots; }
  const float* k(int j) const {
    return j >= pos0 ? k_new + static_cast<size_t>(j - pos0) * new_stride : k_cache + static_cast<size_t>(slot(j)) * hd;
  }
  const float* v(int j) const {
    return j >= pos0 ? v_new + static_cast<size_t>(j - pos0) * new_stride : v_cache + static_cast<size_t>(slot(j)) * hd;
  }
};

// One layer's attention for T new query positions [pos0, pos0 + T).
struct AttentionArgs {
  const float* q = nullptr;      // [T, Hq, hd], RoPE applied
  const HeadKV* kv = nullptr;    // [Hkv]: keys (RoPE applied) and values of positions [0, pos0 + T)
  float* out = nullptr;             // [T, Hq, hd]
  int T = 0, pos0 = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  const HeadMode* modes = nullptr;  // [Hkv] routing of this layer
  const SparseSettings* sparse = nullptr;
  AttentionStats* stats = nullptr;  // optional
  bool track_esr = false;           // record per-head block skips into stats
  float* last_row_probs = nullptr;  // optional [Hq, pos0 + T]: softmax weights of the last query row (probing)
  bool prefill = true;              // false for decode steps: XAttention heads then attend densely
  // Optional [Hkv]: compute only the KV heads (and their query heads) with a nonzero entry; the other heads' output
  // rows are left untouched (head-parallel prefill: each rank computes its own heads).
  const uint8_t* kv_heads = nullptr;
};

// Causal softmax attention with fp32 accumulation; dispatches per KV head on its mode.
// XAttention selects blocks in prefill calls that start on a block boundary (chunked prefill with chunks that are
// multiples of the block size gives the unchunked result); in decode its heads attend to every cached key (the
// method is a prefill method).
void attention_forward(const AttentionArgs& a);

// Which key blocks a streaming head keeps for query block qb (kb <= qb): the streaming pattern's rule
// (src/attention/patterns/streaming.cpp).
bool streaming_keeps(int qb, int kb, const SparseSettings& s);

// Whether a head of mode m computes key block kb for query block qb (kb <= qb): its pattern's block rule
// (sparse_pattern.h). sel: the head's selection from its pattern's estimator (nullptr or empty: none, as in decode).
bool block_kept(HeadMode m, const BlockMask* sel, int qb, int kb, const SparseSettings& s);

}  // namespace elastic
