#pragma once
// Sparse attention patterns as data. Each pattern lives in one file under src/attention/patterns/ and is listed once in
// registry.cpp; its position there is its HeadMode value (what routing tables, router files and the GPU's KVHeadMeta
// carry). A pattern gives its names, its block rule (the lowering every consumer reads: the CPU reference attention,
// the training masks, the prefill cost, the ESR count, the KV pages and cache slots it holds), its parameters' JSON
// fields (routing files and router metadata) and, where it has one, an estimator that makes a per-input block
// selection at prefill.
//
// Contract of a block rule, checked for every registered pattern by tests/test_sparse_pattern.cpp:
//   - causal: only kb <= qb is ever asked; the diagonal block (kb == qb) is always kept, so every query row has a key;
//   - monotone in decode: a key block not kept for query block qb is not kept for any later one, so a head's memory can
//     release it for good (SequencePages, the GPU page lists);
//   - the positions kept at a block's last position never fall from one block to the next, so the most a sequence
//     holds is at its last step or the end of the block before (pages_for).
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "elastic/attention.h"

namespace elastic {

struct SparsePattern {
  const char* name;                 // in routing files, --mode and logs
  const char* aliases[3] = {};      // other accepted spellings (unused slots nullptr)
  char letter;                      // one-letter routing maps (eval tables)
  // The block rule: does query block qb compute key block kb (kb <= qb)? `sel` is this query head's selection from
  // `select`, or nullptr where none was made (decode steps, unaligned chunks): then the rule without input.
  bool (*keeps)(int qb, int kb, const SparseSettings& s, const BlockMask* sel);
  // Estimator (nullptr: the rule needs no input). q [n_pos, hd] (rows before q_begin, this chunk's first position,
  // unread) and k [n_pos, hd] of one query head; a selection per query head, so such heads' GQA groups split into
  // single heads. Rows of query blocks before q_begin may be left unselected.
  BlockMask (*select)(const float* q, const float* k, int n_pos, int hd, const SparseSettings& s,
                      int q_begin) = nullptr;
  // A head of this pattern can hold its keys in a fixed ring of `sink` + `ring` slots whatever the length (streaming);
  // false: one slot per position.
  bool (*bounded_slots)(const SparseSettings& s, int64_t& sink, int64_t& ring) = nullptr;
  bool on_cuda = false;  // the CUDA kernels implement it (KVHeadMeta::mode); the CUDA backend refuses other patterns
  // Its parameters in the JSON of routing files and router metadata (sparse_settings_from_json / _to_json): reads its
  // own fields of `j` into s, each its default when absent unless `required` (errors name `src` and the field), and
  // writes them back. nullptr: the pattern has no parameters of its own.
  void (*read_params)(const nlohmann::json& j, SparseSettings& s, const std::string& src, bool required) = nullptr;
  void (*write_params)(const SparseSettings& s, nlohmann::json& j) = nullptr;
};

// The pattern of a mode; throws std::invalid_argument for a value no pattern is registered at.
const SparsePattern& sparse_pattern(HeadMode m);
// The mode whose pattern has this name or alias; throws std::runtime_error listing the known names.
HeadMode pattern_by_name(const std::string& name);
int n_sparse_patterns();
// A pattern with an estimator (XAttention) selects blocks for prefill chunks that start on a block boundary: throws
// std::invalid_argument "<who><pattern> heads need a prefill chunk that is a multiple of the block (C vs B)" when one
// of the n modes has an estimator and `chunk` is not a multiple of `block`. The CPU prefill asks before running
// (who "prefill: "), RoutePolicy::check_chunk before the first prompt (a server's start-up).
void check_estimator_chunk(const HeadMode* modes, size_t n, int chunk, int block, const std::string& who = "");
std::vector<std::string> sparse_pattern_names();  // registry order (the CLI's --mode choices)

// ---- Parameters as JSON (one home: routing files and router metadata) ----------------------------------------------

// {"block_size": 64, <each pattern's fields>}: block_size (default 64) and every registered pattern's read_params,
// then validate_sparse. `required`: a missing field is an error (router files, which always write every field)
// rather than its default (routing files written by hand). Errors name `src` and the field.
SparseSettings sparse_settings_from_json(const nlohmann::json& j, const std::string& src, bool required = false);
nlohmann::json sparse_settings_to_json(const SparseSettings& s);
// An integer field of such JSON, range-checked before it becomes an int (nlohmann's get<int> of 1e12, or of a float,
// silently wraps): its value, `def` when absent and not `required`. `name` is how errors spell it ('xattn.stride').
int sparse_int_field(const nlohmann::json& j, const char* key, int def, const std::string& src, const std::string& name,
                     bool required);

// ---- Figures every consumer takes from the block rule --------------------------------------------------------------

// Attention (query, key) pairs of one head of mode m over a T-token prefill, and its skipped share of the causal key
// blocks (the ESR numerator; a partial last block counts by its rows). NaN for a pattern with an estimator: its work
// depends on the input.
struct PatternPrefillCost {
  double pairs = 0, pairs_full = 0, blocks_skipped = 0, blocks_causal = 0;
};
PatternPrefillCost pattern_prefill_cost(HeadMode m, int T, const SparseSettings& s);
// Positions one head of mode m keeps for the query at position n_pos - 1: what decode reads and what page lists hold.
int64_t pattern_kept_positions(HeadMode m, int n_pos, const SparseSettings& s);
// Whether a head of mode m holds key block kb once the sequence reaches query block qb (kb <= qb), in decode.
inline bool pattern_holds(HeadMode m, int qb, int kb, const SparseSettings& s) {
  return sparse_pattern(m).keeps(qb, kb, s, nullptr);
}
// Cache slots for a head of mode m with room for `capacity` positions: a sink + ring where the pattern is bounded and
// that is smaller than capacity, else capacity (sink and ring out 0). KVCache and the server's memory estimate share it.
int64_t pattern_cache_slots(HeadMode m, const SparseSettings& s, int64_t capacity, int64_t* sink = nullptr,
                            int64_t* ring = nullptr);

}  // namespace elastic
