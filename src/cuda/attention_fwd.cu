// Fused block-sparse (hybrid) attention forward, one launch per layer for all heads: the engine's dispatch. Two
// kernels compute the same function (their code is attention_fwd_kernels.cuh): "Simple" (any GQA group) and "Wgmma"
// (Hopper-only, even GQA groups) in its intra-warpgroup overlap form, WgmmaOverlap; Auto picks WgmmaOverlap when it
// applies, and a backend's AttnKernelConfig (read once from ELASTIC_ATTN_KERNEL / ELASTIC_ATTN_OPTS when it is built)
// overrides that (no launch reads the environment). The wgmma template's other forms (no overlap, no pingpong,
// persistent) are measurement variants: the dev area runs them (dev/cuda/attention_variants.h), not the engine.
//
// Kernel "Simple" (FlashAttention-2 style, sm_80+ instructions, built for sm_90a):
//   CTA = 4 warps = 64 query rows of one query head (16 rows per warp), aligned to absolute positions so a tile
//   never straddles a sparse block. Key/value tiles of 64 rows go global -> shared with cp.async (16 B, XOR swizzle
//   of the 16-byte chunks so ldmatrix is conflict free); K and V are staggered (V_i loads while S_i = Q K_i^T is
//   computed, K_{i+1} loads while O += P V_i). mma.sync m16n8k16 bf16 with fp32 accumulators; Q fragments stay in
//   registers; online softmax in the log2 domain; P goes from the S accumulators straight into A fragments.
//   Which key tiles a CTA visits comes from the KV head's metadata (Full: all causal tiles; Streaming: sink tiles
//   then the local window; XAttn: the compact block list of its (query head, query block)). GQA reads K/V of KV head
//   h / group in place.
#include <string>

#include "cuda/attention_fwd_kernels.cuh"
#include "cuda/env_choice.h"

namespace elastic::cuda {
namespace {

void bad(const std::string& what) { throw std::invalid_argument("hybrid_attention_fwd: " + what); }

// Whether a GQA shape has an even number of query heads per KV head, as the wgmma kernels need without row pairs.
bool pairs_group(int n_heads, int n_kv_heads) {
  return n_kv_heads > 0 && n_heads % n_kv_heads == 0 && (n_heads / n_kv_heads) % 2 == 0;
}

}  // namespace

KVHeadMeta make_kv_head_meta(HeadMode mode, int sink, int local, int block) {
  // The registry says which patterns the kernels implement (their modes are kv_head_mode.h's values).
  if (!sparse_pattern(mode).on_cuda)
    throw std::invalid_argument(std::string("the CUDA backend does not implement the '") + sparse_pattern(mode).name +
                                "' pattern (it runs on the CPU reference: --device cpu)");
  if (block != 64 && block != 128) throw std::invalid_argument("make_kv_head_meta: block must be 64 or 128");
  if (sink < 0 || local < 0) throw std::invalid_argument("make_kv_head_meta: sink and local must be >= 0");
  KVHeadMeta m;
  m.mode = static_cast<int32_t>(mode);
  const StreamingBlocks b = streaming_blocks(sink, local, block);
  m.sink_blocks = b.sink_blocks;
  m.local_blocks = b.local_blocks;
  return m;
}

// ELASTIC_ATTN_KERNEL's names, also the names describe_attention logs.
constexpr Choice<AttnKernel> kKernelNames[] = {{"auto", AttnKernel::Auto},
                                               {"simple", AttnKernel::Simple},
                                               {"wgmma", AttnKernel::Wgmma},
                                               {"overlap", AttnKernel::WgmmaOverlap},
                                               {"overlap-nopingpong", AttnKernel::WgmmaOverlapNoPingpong},
                                               {"persistent", AttnKernel::WgmmaPersistent},
                                               {"nopingpong", AttnKernel::WgmmaNoPingpong}};
// What Auto runs where the group is even (an odd group always runs Simple).
constexpr AttnKernel kAutoEvenGroup = AttnKernel::WgmmaOverlap;

// The engine's names: what ELASTIC_ATTN_KERNEL and attention_kernel_by_name accept.
constexpr Choice<AttnKernel> kEngineKernelNames[] = {
    {"auto", AttnKernel::Auto}, {"simple", AttnKernel::Simple}, {"overlap", AttnKernel::WgmmaOverlap}};

bool is_engine_kernel(AttnKernel k) {
  return k == AttnKernel::Auto || k == AttnKernel::Simple || k == AttnKernel::WgmmaOverlap;
}

const char* attention_kernel_name(AttnKernel k) { return choice_name(kKernelNames, k); }

AttnKernelConfig attention_config_from_env() {
  AttnKernelConfig c;
  c.kernel = env_choice("ELASTIC_ATTN_KERNEL", kEngineKernelNames, AttnKernel::Auto);
  const char* e = std::getenv("ELASTIC_ATTN_OPTS");
  if (e && *e) {
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    if (*end != '\0' || v < 0 || v > kOptsAll)
      throw std::invalid_argument(std::string("ELASTIC_ATTN_OPTS must be 0..31 (1 adjacent pairs, 2 bulk stores, 4 two "
                                              "static items per persistent CTA, 8 XAttention heads pipelined, 16 row "
                                              "pairs), got '") +
                                  e + "'");
    c.opts = static_cast<int>(v);
  }
  return c;
}

AttnKernel attention_kernel_by_name(const std::string& name) {
  return choice_by_name("attention kernel", name.c_str(), kEngineKernelNames);
}

AttnKernel attention_variant_by_name(const std::string& name) {
  return choice_by_name("attention kernel variant", name.c_str(), kKernelNames);
}

void apply_attention_config(const AttnKernelConfig& c, HybridAttnParams& p) {
  // A wgmma kernel needs pairs of query heads unless it runs row pairs: an odd group otherwise keeps Auto, which then
  // runs Simple.
  p.kernel = c.kernel == AttnKernel::Simple || pairs_group(p.n_heads, p.n_kv_heads) || row_pairs_asked(c.opts)
                 ? c.kernel
                 : AttnKernel::Auto;
  p.opts = c.opts;
}

std::string describe_attention(const AttnKernelConfig& c, int n_heads, int n_kv_heads) {
  if (!pairs_group(n_heads, n_kv_heads) && !row_pairs_asked(c.opts)) return "simple (odd query-head group)";
  const AttnKernel k = c.kernel == AttnKernel::Auto ? kAutoEvenGroup : c.kernel;
  const char* name = choice_name(kKernelNames, k);
  if (k == AttnKernel::Simple) return name;
  const bool persistent = k == AttnKernel::WgmmaPersistent;
  const int opts = c.opts >= 0 ? c.opts
                               : default_wgmma_opts(persistent || k == AttnKernel::WgmmaOverlap ||
                                                    k == AttnKernel::WgmmaOverlapNoPingpong);
  return std::string(name) + " (" + ((opts & kOptAdjacentPairs) ? "adjacent" : "even") + " pairs, " +
         ((opts & kOptBulkStore) && !persistent ? "bulk" : "direct") + " stores" +
         (persistent && (opts & kOptStaticItems) ? ", up to 2 static items per CTA" : "") +
         ((opts & kOptXAttnPipelined) ? ", XAttention pipelined" : "") +
         ((opts & kOptRowPairs) ? ", row pairs" : "") + ")";
}

void hybrid_attention_fwd(const HybridAttnParams& p_in, cudaStream_t stream) {
  HybridAttnParams p = p_in;
  if (p.opts < -1 || p.opts > kOptsAll)
    bad("opts must be -1 (defaults) or 0..31 (got " + std::to_string(p.opts) + ")");
  if (!p.q || !p.k || !p.v || !p.out || !p.meta) bad("null q, k, v, out or meta");
  if (p.T <= 0) bad("T must be > 0 (got " + std::to_string(p.T) + ")");
  if (p.pos0 < 0) bad("pos0 must be >= 0");
  if (p.n_heads <= 0 || p.n_kv_heads <= 0 || p.n_heads % p.n_kv_heads)
    bad("n_heads must be a positive multiple of n_kv_heads");
  if (p.block != 64 && p.block != 128) bad("block must be 64 or 128 (got " + std::to_string(p.block) + ")");
  if (p.xattn.blocks && (!p.xattn.offsets || !p.xattn.counts)) bad("xattn lists need offsets and counts");
  if (p.head_dim != 64 && p.head_dim != 128) bad("head_dim must be 64 or 128 (got " + std::to_string(p.head_dim) + ")");
  const bool even_group = pairs_group(p.n_heads, p.n_kv_heads);
  if (p.kernel != AttnKernel::Auto && p.kernel != AttnKernel::Simple && !even_group && !row_pairs_asked(p.opts))
    bad("the wgmma kernels need an even number of query heads per KV head (or row pairs: opts bit 16)");
  if (p.kernel == AttnKernel::Auto && (even_group || row_pairs_asked(p.opts))) p.kernel = kAutoEvenGroup;
  if (!is_engine_kernel(p.kernel))
    bad(std::string("the '") + choice_name(kKernelNames, p.kernel) +
        "' kernel is a measurement variant: the dev area runs it (dev/cuda/attention_variants.h, bench_attention_gpu)");
  if (p.kernel == AttnKernel::WgmmaOverlap)
    p.head_dim == 64 ? launch_wgmma<64, true, false, true>(p, stream) : launch_wgmma<128, true, false, true>(p, stream);
  else
    p.head_dim == 64 ? launch_simple<64>(p, stream) : launch_simple<128>(p, stream);
}

}  // namespace elastic::cuda
