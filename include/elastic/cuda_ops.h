#pragma once
// CUDA elementwise and row kernels of the decoder (everything but the projections and attention): embedding,
// the fused q/k/v post-processing (bias, per-head RMSNorm, RoPE, cache write, boundary pooling), SwiGLU, residual
// add, per-head KV cache writes for decode, greedy argmax and a seeded random fill for speed runs.
// bf16 tensors travel as uint16_t device pointers; math is fp32. Every launch is asynchronous on `stream` and checked.
// Each kernel has a CPU reference in tests/gpu/test_ops_cuda.cpp.
#include <cuda_runtime.h>

#include <cstdint>

namespace elastic::cuda {

// out[t, :] = table[ids[t], :]; table [V, D], ids [T] (device), out [T, D]. Ids outside [0, V) write zeros.
void embed_rows_bf16(const uint16_t* table, const int32_t* ids, uint16_t* out, int T, int D, int V, cudaStream_t stream);

// y[rows, n] = w * x * rsqrt(mean(x^2) + eps); x may equal y. With `residual` (may be null): first
// residual += x (in place, bf16), then the norm is taken of the updated residual and written to y (x unused):
// the fused "add then norm" of a decoder layer.
void rmsnorm_bf16_stream(const uint16_t* x, const uint16_t* w, uint16_t* y, int rows, int n, float eps,
                         cudaStream_t stream);
void add_rmsnorm_bf16(uint16_t* residual, const uint16_t* x, const uint16_t* w, uint16_t* y, int rows, int n,
                      float eps, cudaStream_t stream);

// The fused q/k/v projection output, turned into attention inputs. For each token t (absolute position
// pos = pos0 + t, pos0 read from pos0_dev when it is not null, for CUDA-graph replay):
//   q = qkv[t, 0 : Hq*hd] (+ bias), k = qkv[t, Hq*hd : (Hq+Hkv)*hd] (+ bias), v = the rest (+ bias);
//   q, k per head: RMSNorm with q_norm / k_norm (when not null; eps), then RoPE (rotate-half, the Hugging Face
//   convention: pairs (i, i + hd/2), angle pos * inv_freq[i]);
//   q_out[t, h, :] = q;  k_out[pos, kvh, :] = k;  v_out[pos, kvh, :] = v   (k_out/v_out rows of Hkv*hd)
//   pool_sum (when not null, [Hkv, hd] fp32, accumulated with atomics): += k after k_norm, before RoPE, for
//   positions pos < pool_first_end or pos >= pool_last_begin (the router's boundary pool; the caller counts them).
struct QkvPostParams {
  const uint16_t* qkv = nullptr;       // [T, (Hq + 2 Hkv) * hd]
  const uint16_t* bias = nullptr;      // [(Hq + 2 Hkv) * hd] or null
  const uint16_t* q_norm = nullptr;    // [hd] or null
  const uint16_t* k_norm = nullptr;    // [hd] or null
  const float* inv_freq = nullptr;     // [hd / 2] device
  float eps = 1e-6f;
  int T = 0, pos0 = 0;
  const int32_t* pos0_dev = nullptr;   // overrides pos0 when set
  const int32_t* pos_dev = nullptr;    // [T] each row's own position (a decode step over a batch of sequences);
                                       // overrides pos0 and pos0_dev when set
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;  // head_dim even, <= 256
  uint16_t* q_out = nullptr;           // [T, Hq, hd]
  uint16_t* k_out = nullptr;           // [>= pos0 + T, Hkv, hd]
  uint16_t* v_out = nullptr;           // [>= pos0 + T, Hkv, hd]
  bool kv_rows_from_zero = false;      // write k_out/v_out at row t instead of row pos (decode: a one-token buffer)
  float* pool_sum = nullptr;           // [Hkv, hd] or null
  int pool_first_end = 0, pool_last_begin = 0;
};
void qkv_post(const QkvPostParams& p, cudaStream_t stream);

// gate_up [T, 2F] (gate in columns [0, F), up in [F, 2F)) -> out [T, F] = silu(gate) * up.
void swiglu_bf16(const uint16_t* gate_up, uint16_t* out, int T, int F, cudaStream_t stream);

// y[i] += x[i], n elements.
void add_inplace_bf16(uint16_t* y, const uint16_t* x, int64_t n, cudaStream_t stream);

// out[r] = argmax over logits[r, 0:V] (fp32), lowest index on ties. rows x V.
void argmax_rows_f32(const float* logits, int rows, int V, int32_t* out, cudaStream_t stream);

// x[i] = bf16(scale * u_i), u_i uniform in [-1, 1) from a counter hash of (seed, i): random weights for
// speed runs without a host copy. n elements.
void fill_uniform_bf16(uint16_t* x, int64_t n, uint64_t seed, float scale, cudaStream_t stream);
// x[i] = bf16(value).
void fill_const_bf16(uint16_t* x, int64_t n, float value, cudaStream_t stream);

// Host helpers: fp32 <-> bf16 (round to nearest even), for uploads and tests.
uint16_t f32_to_bf16(float f);
float bf16_to_f32(uint16_t b);

}  // namespace elastic::cuda
