#pragma once
// The streaming pattern's block rule in the one form host and device code share: the CPU pattern
// (src/attention/patterns/streaming.cpp), the CUDA backward's block walk (attention_bwd.cu) and the kernels' head
// metadata (make_kv_head_meta). The forward kernels' tile walks (src/cuda/tile_walk.h) enumerate the same blocks as
// ranges and are checked against this rule by tests/test_tile_walk.cpp.
#include <cstdint>

#if defined(__CUDACC__)
#define ELASTIC_RULE_HD __host__ __device__ __forceinline__
#else
#define ELASTIC_RULE_HD inline
#endif

namespace elastic {

struct StreamingBlocks {
  int sink_blocks = 0;   // leading key blocks always kept
  int local_blocks = 1;  // the window in blocks, the diagonal included (at least 1)
};

// Token counts rounded up to whole blocks, in 64 bits and clamped to INT32_MAX: a sink or window near INT_MAX then
// keeps every block instead of overflowing.
ELASTIC_RULE_HD StreamingBlocks streaming_blocks(int64_t sink, int64_t local, int block) {
  const int64_t B = block, s = ((sink > 0 ? sink : 0) + B - 1) / B, w = (local + B - 1) / B;
  StreamingBlocks r;
  r.sink_blocks = static_cast<int>(s < INT32_MAX ? s : INT32_MAX);
  r.local_blocks = static_cast<int>(w < 1 ? 1 : w < INT32_MAX ? w : INT32_MAX);
  return r;
}

// Does query block qb compute key block kb: causal, and in the sink or within the window.
ELASTIC_RULE_HD bool streaming_block_kept(int qb, int kb, StreamingBlocks s) {
  return kb <= qb && (kb < s.sink_blocks || qb - kb < s.local_blocks);
}

}  // namespace elastic
