// Streaming attention (SSA): the sink blocks (the first `sink` tokens, rounded up to blocks) and a local window of
// `local` tokens rounded up to blocks, diagonal included. Its keys fit a fixed sink + ring of slots.
#include <algorithm>

#include <nlohmann/json.hpp>

#include "elastic/sparse_pattern.h"
#include "elastic/streaming_rule.h"

namespace elastic {

bool streaming_keeps(int qb, int kb, const SparseSettings& s) {
  // Settings built in code skip validate_sparse; streaming_blocks rounds in 64 bits and clamps (a window larger than
  // the sequence then keeps everything, as it should).
  return streaming_block_kept(qb, kb, streaming_blocks(s.sink, s.local, s.block));
}

extern const SparsePattern kStreamingPattern;
const SparsePattern kStreamingPattern{
    .name = "ssa",
    .aliases = {"streaming"},
    .letter = 'S',
    .keeps = [](int qb, int kb, const SparseSettings& s, const BlockMask*) { return streaming_keeps(qb, kb, s); },
    .bounded_slots =
        [](const SparseSettings& s, int64_t& sink, int64_t& ring) {
          const int64_t B = s.block;
          sink = (std::max<int64_t>(s.sink, 0) + B - 1) / B * B;
          ring = std::max<int64_t>(1, (int64_t{s.local} + B - 1) / B) * B;
          return true;
        },
    .on_cuda = true,
    .read_params =
        [](const nlohmann::json& j, SparseSettings& s, const std::string& src, bool required) {
          s.sink = sparse_int_field(j, "sink", 128, src, "sink", required);
          s.local = sparse_int_field(j, "local", 2048, src, "local", required);
        },
    .write_params =
        [](const SparseSettings& s, nlohmann::json& j) {
          j["sink"] = s.sink;
          j["local"] = s.local;
        },
};

}  // namespace elastic
