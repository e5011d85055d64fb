#pragma once
// CUDA backward of the routed block-sparse hybrid attention (hybrid_attention_fwd), for router training.
// Semantics are those of the CPU reference elastic::train::attn_bwd: scale 1/sqrt(hd), causal token by token inside
// the kept key blocks, query head h reads KV head h / (Hq / Hkv), dK / dV of a KV head sum over its query heads.
// Training layout only: positions [0, T) (pos0 = 0). All pointers are device pointers; launches are asynchronous on
// the given stream and checked.
#include <cuda_runtime.h>

#include <cstdint>

#include "elastic/cuda_attention.h"

namespace elastic::cuda {

struct HybridAttnBwdParams {
  const uint16_t* q = nullptr;    // [T, Hq, hd] bf16 (RoPE applied), positions [0, T) (training: pos0 = 0 always)
  const uint16_t* k = nullptr;    // [T, Hkv, hd] bf16
  const uint16_t* v = nullptr;    // [T, Hkv, hd] bf16
  const uint16_t* out = nullptr;  // [T, Hq, hd] bf16, the forward output of this branch
  const float* lse = nullptr;     // [Hq, T] fp32 natural log-sum-exp from hybrid_attention_fwd
  const uint16_t* dout = nullptr; // [T, Hq, hd] bf16 gradient of the output
  float* dq = nullptr;            // [T, Hq, hd] fp32, ADDED into (caller zeroes); 8-byte aligned
  float* dk = nullptr;            // [T, Hkv, hd] fp32, ADDED into
  float* dv = nullptr;            // [T, Hkv, hd] fp32, ADDED into
  float* workspace = nullptr;     // attention_bwd_workspace_floats(...) floats, 16-byte aligned
  int T = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;  // head_dim 64 or 128
  int block = 64;                       // sparse block 64 or 128
  const KVHeadMeta* meta = nullptr;     // [Hkv] device: per KV head Full / Streaming / XAttn
  XAttnBlockLists xattn;                // same lists the forward used (pos0 = 0 layout)
};

// Workspace: delta = rowsum(dout * out) and lse (log2 domain) per query head, each padded to whole 64-row tiles.
int64_t attention_bwd_workspace_floats(int T, int n_heads, int head_dim);

// Adds dQ, dK, dV. Throws std::invalid_argument on bad shapes (naming the field).
void hybrid_attention_bwd(const HybridAttnBwdParams& p, cudaStream_t stream);

}  // namespace elastic::cuda
