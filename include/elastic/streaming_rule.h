#pragma once
// The streaming pattern's block rule in the one form host and device code share, as two ranges of key blocks per query
// block (streaming_range) and as a predicate over them (streaming_block_kept): the CPU pattern
// (src/attention/patterns/streaming.cpp), the CUDA backward's block walk (attention_bwd.cu), the forward kernels' tile
// walks (src/cuda/tile_walk.h, which read the ranges; tests/test_tile_walk.cpp checks them against the rule written
// out) and the kernels' head metadata (make_kv_head_meta).
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

// The key blocks query block qb computes: [0, sink_end) then [window_start, qb], ascending and disjoint
// (sink_end <= window_start <= qb + 1): the sink, cut at the diagonal, and the window, past the sink (empty when the
// sink reaches the diagonal: a sink near INT_MAX then gives no block past qb + 1, and tile counts stay in range).
struct StreamingRange {
  int sink_end = 0;
  int window_start = 0;
};

ELASTIC_RULE_HD StreamingRange streaming_range(int qb, StreamingBlocks s) {
  StreamingRange r;
  r.sink_end = s.sink_blocks < qb + 1 ? s.sink_blocks : qb + 1;
  const int64_t w0 = int64_t{qb} - s.local_blocks + 1;  // 64 bits: a window near INT_MAX
  r.window_start = w0 > s.sink_blocks ? static_cast<int>(w0) : s.sink_blocks;
  if (r.window_start > qb + 1) r.window_start = qb + 1;
  return r;
}

// Does query block qb compute key block kb: causal, and in the sink or within the window.
ELASTIC_RULE_HD bool streaming_block_kept(int qb, int kb, StreamingBlocks s) {
  const StreamingRange r = streaming_range(qb, s);
  return kb <= qb && (kb < r.sink_end || kb >= r.window_start);
}

}  // namespace elastic
