// The registered patterns; a pattern's index here is its HeadMode value, so the first three keep the values routing
// files and the GPU kernels use (Full 0, Streaming 1, XAttn 2). New patterns go at the end.
#include <stdexcept>
#include <string>
#include <vector>

#include "elastic/kv_head_mode.h"
#include "elastic/sparse_pattern.h"

namespace elastic {

extern const SparsePattern kFullPattern, kStreamingPattern, kXAttnPattern, kStridedPattern;

namespace {
const SparsePattern* const kPatterns[] = {&kFullPattern, &kStreamingPattern, &kXAttnPattern, &kStridedPattern};
// The CUDA kernels' mode values (KVHeadMeta::mode) are these patterns' positions here.
static_assert(static_cast<int>(HeadMode::Full) == kv_mode::kFull && static_cast<int>(HeadMode::Streaming) == kv_mode::kStreaming &&
              static_cast<int>(HeadMode::XAttn) == kv_mode::kXAttn, "kv_head_mode.h must match HeadMode");
}  // namespace

int n_sparse_patterns() { return static_cast<int>(std::size(kPatterns)); }

std::vector<std::string> sparse_pattern_names() {
  std::vector<std::string> names;
  for (const SparsePattern* p : kPatterns) names.emplace_back(p->name);
  return names;
}

void check_estimator_chunk(const HeadMode* modes, size_t n, int chunk, int block, const std::string& who) {
  if (chunk <= 0 || block <= 0 || chunk % block == 0) return;
  for (size_t i = 0; i < n; ++i)
    if (sparse_pattern(modes[i]).select)
      throw std::invalid_argument(who + head_mode_name(modes[i]) + " heads need a prefill chunk that is a multiple of " +
                                  "the block (" + std::to_string(chunk) + " vs " + std::to_string(block) + ")");
}

const SparsePattern& sparse_pattern(HeadMode m) {
  const int i = static_cast<int>(m);
  if (i >= n_sparse_patterns())
    throw std::invalid_argument("no sparse pattern is registered at mode " + std::to_string(i));
  return *kPatterns[i];
}

HeadMode pattern_by_name(const std::string& name) {
  std::string known;
  for (int i = 0; i < n_sparse_patterns(); ++i) {
    const SparsePattern& p = *kPatterns[i];
    if (name == p.name) return static_cast<HeadMode>(i);
    for (const char* a : p.aliases)
      if (a && name == a) return static_cast<HeadMode>(i);
    known += (known.empty() ? "" : ", ") + std::string(p.name);
  }
  throw std::runtime_error("unknown head mode '" + name + "' (expected " + known + ")");
}

}  // namespace elastic
