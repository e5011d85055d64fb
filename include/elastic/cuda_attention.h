#pragma once
// CUDA hybrid (per-KV-head routed) attention for Hopper: fused block-sparse prefill forward and XAttention block
// estimation (decode: cuda_paged_decode.h). bf16 tensors, fp32 math. All pointers are device
// pointers; every launch is asynchronous on the given stream and checked.
//
// Semantics match the CPU reference (src/attention/attention.cpp): a query head h reads KV head h / (Hq / Hkv);
// sparse modes keep whole key blocks of `block` tokens and apply causality token by token inside them; scale is
// 1/sqrt(hd); lse is the natural log of the softmax denominator over the computed keys.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "elastic/attention.h"
#include "elastic/kv_head_mode.h"

namespace elastic::cuda {

// Device-side routing of one KV head of a layer (array of Hkv, in device memory).
struct KVHeadMeta {
  int32_t mode = kv_mode::kFull;  // kv_mode::kFull / kStreaming / kXAttn (the values of elastic::HeadMode)
  int32_t sink_blocks = 0;   // streaming: ceil(sink / block)
  int32_t local_blocks = 1;  // streaming: max(1, ceil(local / block)), diagonal block included
  int32_t pad = 0;
};

// XAttention block lists: for query head h and absolute query block qb (0 <= qb < nb, nb = ceil((pos0+T)/block)),
// the selected key blocks are blocks[offsets[h*nb+qb] .. + counts[h*nb+qb]), ascending, each <= qb, the last one
// == qb (xattn_select always keeps the diagonal). Only read for heads whose KV head is in XAttn mode; an XAttn
// head with null lists attends densely (what the CPU does for decode and unaligned chunks).
struct XAttnBlockLists {
  const int32_t* blocks = nullptr;
  const int32_t* offsets = nullptr;  // [Hq * nb]
  const int32_t* counts = nullptr;   // [Hq * nb]
};

// Simple: mma.sync m16n8k16 + cp.async, any group. Wgmma ("v4"): TMA + mbarrier pipeline + wgmma, warp-specialized,
// with pingpong scheduling of its two consumer warpgroups; needs an even number of query heads per KV head, unless
// opts has row pairs (bit 16: a CTA's consumers take one head's two query tiles instead of two heads' one).
// WgmmaOverlap: Wgmma plus the softmax of S_{i+1} overlapping P_i V_i inside each consumer warpgroup, adjacent tile
// pairs and a bulk-store epilogue; on the H200 1.02-1.13x Wgmma's speed on full layers from 8K to 128K tokens (one
// row of ten 2% slower) and 1.10-1.14x on all-streaming ones (docs/CUDA_ATTENTION.md, "Against the targets").
// Auto: WgmmaOverlap when the group is even or opts asks for row pairs, else Simple. A backend chooses once, when it is built, through an
// AttnKernelConfig (below); a launch reads no environment.
// WgmmaNoPingpong: Wgmma without the pingpong (kept to measure it).
// WgmmaPersistent: WgmmaOverlap with one CTA per SM taking (query tile, head pair) items from a device counter, with
// direct stores (its launches on one device must not run concurrently on two streams); slower than
// WgmmaOverlap (6-24% on the H200), kept to measure it.
// WgmmaOverlapNoPingpong: WgmmaOverlap without the turn-taking (each warpgroup's softmax already overlaps its own
// P V), kept to measure which of the two overlaps pays (the turn-taking still does:
// 0.3-6% slower without it on full layers, 5-7% on streaming ones).
enum class AttnKernel : int {
  Auto = 0,
  Simple = 1,
  Wgmma = 2,
  WgmmaNoPingpong = 3,
  WgmmaPersistent = 4,
  WgmmaOverlap = 5,
  WgmmaOverlapNoPingpong = 6
};

struct HybridAttnParams {
  const uint16_t* q = nullptr;  // [T, Hq, hd] bf16, positions [pos0, pos0 + T), RoPE applied
  const uint16_t* k = nullptr;  // [pos0 + T, Hkv, hd] bf16, positions [0, pos0 + T)
  const uint16_t* v = nullptr;  // [pos0 + T, Hkv, hd] bf16
  uint16_t* out = nullptr;      // [T, Hq, hd] bf16
  float* lse = nullptr;         // [Hq, T] fp32 natural log-sum-exp of scaled scores (optional, may be null)
  int T = 0, pos0 = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;  // head_dim 64 or 128
  int block = 64;                      // sparse block size, 64 or 128
  const KVHeadMeta* meta = nullptr;    // [Hkv] device array
  XAttnBlockLists xattn;
  AttnKernel kernel = AttnKernel::Auto;
  int opts = -1;  // wgmma kernels' option bits (1 adjacent pairs, 2 bulk stores, 4 two static items per persistent
                  // CTA, 8 XAttention heads on the pipelined path, 16 row pairs), 0..31; -1: the kernel's defaults
                  // (Wgmma and NoPingpong 0, the overlap and persistent ones 3)
};

// One launch for all heads of a layer with an engine kernel (is_engine_kernel). Throws std::invalid_argument on bad
// shapes (naming the field) and for a measurement variant (naming it).
void hybrid_attention_fwd(const HybridAttnParams& p, cudaStream_t stream);

// The prefill attention kernel a backend runs, chosen once when it is built (GpuOptions::attention) and logged with
// its allocation plan, so a captured graph or a saved bench table runs and names what was configured.
struct AttnKernelConfig {
  AttnKernel kernel = AttnKernel::Auto;  // odd GQA groups run Simple unless opts asks for row pairs
  int opts = -1;                         // HybridAttnParams::opts
};
// The kernels the engine runs (hybrid_attention_fwd): Auto, Simple, WgmmaOverlap. The others are measurement
// variants that the dev area launches (dev/cuda/attention_variants.h); hybrid_attention_fwd refuses them by name.
bool is_engine_kernel(AttnKernel k);
const char* attention_kernel_name(AttnKernel k);  // "auto", "simple", "wgmma", "overlap", "overlap-nopingpong", ...
// What ELASTIC_ATTN_KERNEL (auto, simple, overlap) and ELASTIC_ATTN_OPTS (0..31) name, read now: unset means Auto
// and the defaults. Throws std::invalid_argument naming the variable and the accepted values on a bad one.
AttnKernelConfig attention_config_from_env();
// An engine kernel by the names above (bench --attn-kernel); throws std::invalid_argument naming the value.
AttnKernel attention_kernel_by_name(const std::string& name);
// Any kernel or variant by name (auto, simple, wgmma, overlap, overlap-nopingpong, persistent, nopingpong): for the
// dev area's benches and tests.
AttnKernel attention_variant_by_name(const std::string& name);
// Sets p.kernel and p.opts to what c runs for p's GQA shape (p.n_heads, p.n_kv_heads set).
void apply_attention_config(const AttnKernelConfig& c, HybridAttnParams& p);
// What c runs for this GQA shape, e.g. "overlap (adjacent pairs, bulk stores)", or "simple (odd query-head group)".
std::string describe_attention(const AttnKernelConfig& c, int n_heads, int n_kv_heads);

// Host helper: device metadata values for one KV head (sink / local in tokens, rounded up to blocks).
// Throws for a mode the kernels do not implement.
KVHeadMeta make_kv_head_meta(HeadMode mode, int sink, int local, int block);

// XAttention estimation on the GPU (antidiagonal scoring, same pipeline as elastic::xattn_select), for the query
// blocks of this chunk. Requires pos0 % block == 0. Writes triangular lists: offsets[h*nb+qb] = h*nb*(nb+1)/2 +
// qb*(qb+1)/2 (so `blocks` needs Hq*nb*(nb+1)/2 ints), counts for qb >= pos0/block (earlier rows get count 0).
// Only query heads whose KV head mode is XAttn are estimated (others get count 0). Optionally returns the block
// scores (probability mass per block, [Hq, nb, nb] fp32, rows < pos0/block untouched) for testing.
// The engine's form (Auto or Gemm): the folded query and key rows of the routed KV heads are packed into scratch,
// scored by cuBLASLt as one strided-batched product per 256 folded query rows (fp32 out; only the key rows those rows
// can see), then one kernel per row group does the softmax, the block masses and the selection; about 1/S of QK^T's
// work at the tensor-core rate (xattn_estimate_gemm.cu). It needs `gemm` and a `scratch` of xattn_gemm_scratch_bytes.
// Fused is the candidate to replace it, chosen by GpuOptions::xattn_estimate (not yet run on a GPU): the scores on
// wgmma straight from q and k, per-(row, key block) log-sum-exps instead of scores, a sort-free selection
// (xattn_estimate_fused.cu); a `scratch` of xattn_fused_scratch_bytes, no gemm; head_dim 64/128, stride 8/16.
// Simple (fp32), TensorCore (mma.sync, one or two passes) and TensorCoreTwoPass are the earlier forms, kept as
// measurement variants in the dev area (dev/cuda/xattn_estimate_variants.h); xattn_estimate_cuda refuses them.
enum class XAttnEstimateKernel { Auto, TensorCore, Simple, TensorCoreTwoPass, Gemm, Fused };
class Gemm;
struct XAttnEstimateParams {
  const uint16_t* q = nullptr;  // [T, Hq, hd] bf16
  const uint16_t* k = nullptr;  // [pos0 + T, Hkv, hd] bf16
  int T = 0, pos0 = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int block = 64, stride = 16;
  float tau = 0.9f;
  const KVHeadMeta* meta = nullptr;  // [Hkv] device array (only XAttn-routed KV heads are estimated)
  int32_t* blocks = nullptr;         // [Hq * nb*(nb+1)/2]
  int32_t* offsets = nullptr;        // [Hq * nb]
  int32_t* counts = nullptr;         // [Hq * nb]
  float* block_scores = nullptr;     // optional [Hq, nb, nb]
  XAttnEstimateKernel kernel = XAttnEstimateKernel::Auto;
  // The Gemm form: the product's handle, a device scratch of at least xattn_gemm_scratch_bytes(...) bytes, and the
  // KV heads routed to XAttention as a host array (null: every KV head; heads listed but not routed to XAttention in
  // `meta` are scored but get no lists). Listing only the routed heads is what keeps the work to them.
  Gemm* gemm = nullptr;
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  const int* xa_kv_heads = nullptr;
  int n_xa_kv_heads = 0;
};
void xattn_estimate_cuda(const XAttnEstimateParams& p, cudaStream_t stream);
// Scratch the Gemm form needs for a chunk of T queries ending at n_pos positions (the longest chunk and context a
// caller runs bound every call), with n_kv_heads KV heads scored (at most all), for this GQA shape and stride.
size_t xattn_gemm_scratch_bytes(int T, int n_pos, int n_kv_heads, int n_heads_per_kv, int head_dim, int stride);
// The same for the Fused form, which also depends on the block (one log-sum-exp per folded row and key block).
size_t xattn_fused_scratch_bytes(int T, int n_pos, int n_kv_heads, int n_heads_per_kv, int head_dim, int stride,
                                 int block);
// The scratch of the engine form `form` (Auto and Gemm: the Gemm form's; Fused); 0 for the dev-area forms.
size_t xattn_estimate_scratch_bytes(XAttnEstimateKernel form, int T, int n_pos, int n_kv_heads, int n_heads_per_kv,
                                    int head_dim, int stride, int block);
inline int64_t xattn_list_capacity(int n_heads, int nb) { return int64_t(n_heads) * nb * (nb + 1) / 2; }
// Adds to *total (device) the key blocks kept for query blocks [qb_begin, qb_end) by every query head whose KV head
// `meta` routes to XAttention, from the counts an estimator wrote: the measured XAttention density, summed over the
// calls of a prefill (GpuPrefillStats::xattn_kept_blocks; bench's attention-FLOPs column). No host synchronization.
void xattn_add_kept_blocks(const int32_t* counts, int n_heads, int n_kv_heads, int nb, int qb_begin, int qb_end,
                           const KVHeadMeta* meta, unsigned long long* total, cudaStream_t stream);

}  // namespace elastic::cuda
