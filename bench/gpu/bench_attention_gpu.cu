// GPU prefill attention benchmark (GPU machine): our fused kernel (Auto = wgmma kernel here) all-full vs all-streaming vs all-XAttention vs
// hybrid routings at Omega 0.5 / 0.7 / 0.9, Qwen3-4B attention shape (32 query / 8 KV heads, d = 128, causal,
// bf16), one launch per layer. Hybrid rows time a stack of 5 layers whose random routings have exactly
// round(Omega * 40) of their 40 KV heads on streaming attention, and report the time per layer.
// TFLOP/s are counted two ways: on the (query, key) pairs actually computed (64x64 tiles, diagonal tiles half) and
// on the dense causal count 4 * hd * Hq * T(T+1)/2. Then the decode kernel: one query token per head against
// all-full caches (T positions) and all-streaming ring caches (sink + window), time per layer and the K/V bytes it
// reads per second. Usage: bench_attention_gpu [--decode | --gemm | --kernels | --paired] [T ...] (default 8K..128K;
// --decode: the decode table only; --gemm: only the decode projections, cuBLASLt against the small-M kernel; --kernels: all-full / all-streaming rows of every wgmma variant, then the paired table;
// --paired: only the paired SA-cost table, all-full and all-streaming layers timed in alternation).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "elastic/attention.h"
#include "elastic/cuda.h"
#include "elastic/cuda_attention.h"
#include "attention_variants.h"  // dev/cuda: every kernel variant, the engine's and the measurement ones
#include "contiguous_decode.h"  // dev/cuda: the contiguous-cache decode
#include "xattn_estimate_variants.h"  // dev/cuda: the estimator's earlier forms
#include "elastic/cuda_gemm.h"
#include "elastic/cuda_paged_decode.h"
#include "elastic/kv_pages.h"
#include "elastic/streaming_rule.h"

using namespace elastic::cuda;
using elastic::HeadMode;
using elastic::StreamingBlocks;
using elastic::StreamingRange;
using elastic::streaming_range;
namespace kv_mode = elastic::kv_mode;

namespace {

__global__ void fill_random_bf16(uint16_t* x, size_t n, uint32_t seed, float sd) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
    uint32_t h2 = h * 0x27d4eb2du + 0x165667b1u;
    h2 ^= h2 >> 15;
    const float u1 = (h + 1.f) * 2.3283064e-10f, u2 = h2 * 2.3283064e-10f;
    const float g = sqrtf(-2.f * logf(u1)) * cosf(6.2831853f * u2) * sd;  // Box-Muller normal
    uint32_t b = __float_as_uint(g);
    b += 0x7fff + ((b >> 16) & 1);
    x[i] = static_cast<uint16_t>(b >> 16);
  }
}

struct Timer {
  cudaEvent_t a, b;
  Timer() {
    ELASTIC_CUDA_CHECK(cudaEventCreate(&a));
    ELASTIC_CUDA_CHECK(cudaEventCreate(&b));
  }
  ~Timer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  template <class F>
  double median_ms(F&& f, int reps, cudaStream_t stream = nullptr) {  // events on `stream`, where f launches
    f();  // warm-up
    ELASTIC_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<double> v;
    for (int r = 0; r < reps; ++r) {
      ELASTIC_CUDA_CHECK(cudaEventRecord(a, stream));
      f();
      ELASTIC_CUDA_CHECK(cudaEventRecord(b, stream));
      ELASTIC_CUDA_CHECK(cudaEventSynchronize(b));
      float ms = 0;
      ELASTIC_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
      v.push_back(ms);
    }
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }
};

// Computed (query, key) pairs of one query head, tile-exact like the kernel visits them (T multiple of 64).
double pairs_head(const KVHeadMeta& m, int T, int B, const std::vector<int32_t>* cnt, const std::vector<int32_t>* blocks,
                  const std::vector<int32_t>* off, int h, int nb) {
  const int n_qt = (T + 63) / 64, R = B / 64;
  double p = 0;
  for (int qt = 0; qt < n_qt; ++qt) {
    const int qb = qt / R;
    int tiles = qt + 1;
    if (m.mode == kv_mode::kStreaming) {  // the rule's ranges (streaming_rule.h) in tiles, as tile_walk.h counts them
      const StreamingRange br = streaming_range(qb, StreamingBlocks{m.sink_blocks, m.local_blocks});
      const int n1 = std::min(br.sink_end * R, qt + 1), s2 = br.window_start * R;
      tiles = n1 + std::max(0, qt + 1 - s2);
    } else if (m.mode == kv_mode::kXAttn && cnt) {
      const int c = (*cnt)[size_t(h) * nb + qb];
      tiles = c * R;
      if (c > 0) tiles -= std::max(0, (*blocks)[(*off)[size_t(h) * nb + qb] + c - 1] * R + R - 1 - qt);
    }
    p += (tiles - 1) * 4096.0 + 2080.0;  // the diagonal tile is half computed
  }
  return p;
}


// Decode projections (issue 21): the Qwen3-4B shapes a decode step multiplies (q/k/v, o, gate/up, down, the
// logits), M = 1, 2, 4 and 8 rows, through cuBLASLt and through the small-M kernel (Gemm::set_small_m_rows; M 8 is
// past it, so both columns run cuBLASLt there). As in a decode step: each call reads its W from HBM (the calls cycle
// through copies of W that together exceed three times the L2 cache) and the calls run as a CUDA graph (ten calls a
// replay; no host launch cost). Per shape and M the two are timed in three interleaved rounds, each the median of 15
// replays. GB/s counts W's bytes (X and Y are a few KiB); "of copy" is that over the device-to-device copy rate
// measured here, which counts a read and a write per byte.
void gemm_table(Timer& timer) {
  const double copy = copy_bandwidth_gbs();
  cudaDeviceProp prop{};
  ELASTIC_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  struct Proj {
    const char* name;
    int N, K;
    bool f32, accumulate;
  };
  const Proj projs[] = {{"q/k/v", 6144, 2560, false, false}, {"o", 2560, 4096, false, true},
                        {"gate/up", 19456, 2560, false, false}, {"down", 2560, 9728, false, true},
                        {"logits", 151936, 2560, true, false}};
  std::printf("\ncopy (device to device, read + write): %.0f GB/s; L2 %d MiB\n\n| projection | N x K | M | cuBLASLt us | "
              "GB/s | of copy | small-M us | GB/s | of copy | small-M / cuBLASLt |\n|---|---|---|---|---|---|---|---|---|---|\n",
              copy, prop.l2CacheSize >> 20);
  cudaStream_t st;
  ELASTIC_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  elastic::cuda::Gemm lt, sm;
  sm.set_small_m_rows(4);
  constexpr int kCalls = 10;
  for (const Proj& p : projs) {
    const size_t wn = size_t(p.N) * p.K;
    const int copies = int(std::max<size_t>(1, (size_t(3) * prop.l2CacheSize + wn * 2 - 1) / (wn * 2)));
    uint16_t *w, *x, *y;
    ELASTIC_CUDA_CHECK(cudaMalloc(&w, wn * 2 * copies));
    ELASTIC_CUDA_CHECK(cudaMalloc(&x, size_t(8) * p.K * 2));
    ELASTIC_CUDA_CHECK(cudaMalloc(&y, size_t(8) * p.N * 4));
    fill_random_bf16<<<1024, 256>>>(w, wn * copies, 5u, 0.02f);
    fill_random_bf16<<<1024, 256>>>(x, size_t(8) * p.K, 6u, 1.f);
    ELASTIC_CUDA_CHECK(cudaGetLastError());
    for (const int M : {1, 2, 4, 8}) {
      auto call = [&](elastic::cuda::Gemm& g, int c) {
        const uint16_t* wc = w + size_t(c % copies) * wn;
        if (p.f32) g.bf16_out_f32(x, wc, reinterpret_cast<float*>(y), M, p.N, p.K, st);
        else g.bf16(x, wc, y, M, p.N, p.K, st, nullptr, p.accumulate ? 1.f : 0.f);
      };
      auto graph = [&](elastic::cuda::Gemm& g) {
        call(g, 0);  // plans made outside the capture
        ELASTIC_CUDA_CHECK(cudaStreamSynchronize(st));
        cudaGraph_t gr;
        cudaGraphExec_t ex;
        ELASTIC_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int c = 0; c < kCalls; ++c) call(g, c);
        ELASTIC_CUDA_CHECK(cudaStreamEndCapture(st, &gr));
        ELASTIC_CUDA_CHECK(cudaGraphInstantiate(&ex, gr, 0));
        ELASTIC_CUDA_CHECK(cudaGraphDestroy(gr));
        return ex;
      };
      cudaGraphExec_t g_lt = graph(lt), g_sm = graph(sm);
      auto replay_ms = [&](cudaGraphExec_t ex) {
        return timer.median_ms([&] { ELASTIC_CUDA_CHECK(cudaGraphLaunch(ex, st)); }, 15, st) / kCalls;
      };
      double t_lt = 0, t_sm = 0;
      for (int round = 0; round < 3; ++round) {  // interleaved: clock drift lands on both
        t_lt += replay_ms(g_lt);
        t_sm += replay_ms(g_sm);
      }
      t_lt /= 3, t_sm /= 3;
      ELASTIC_CUDA_CHECK(cudaGraphExecDestroy(g_lt));
      ELASTIC_CUDA_CHECK(cudaGraphExecDestroy(g_sm));
      const double gb = wn * 2 * 1e-9;
      std::printf("| %s | %d x %d | %d | %.2f | %.0f | %.0f%% | %.2f | %.0f | %.0f%% | %.3f |\n", p.name, p.N, p.K, M,
                  t_lt * 1e3, gb / (t_lt * 1e-3), 100 * gb / (t_lt * 1e-3) / copy, t_sm * 1e3, gb / (t_sm * 1e-3),
                  100 * gb / (t_sm * 1e-3) / copy, t_sm / t_lt);
      std::fflush(stdout);
    }
    for (void* b : {static_cast<void*>(w), static_cast<void*>(x), static_cast<void*>(y)}) ELASTIC_CUDA_CHECK(cudaFree(b));
  }
  ELASTIC_CUDA_CHECK(cudaStreamDestroy(st));
}

// Decode attention for one layer of the Qwen3-4B shape: every KV head full (a T-slot cache) or every KV head streaming
// (sink + ring slots, the ring wrapped as after T positions). Reports microseconds per layer and K/V GB/s read.
void decode_table(const std::vector<int>& lengths, Timer& timer) {
  const int Hq = 32, Hkv = 8, hd = 128, B = 64, sink = 128, local = 2048;
  std::printf("\n| T | decode heads | kept positions / head | us/layer | K+V read GB/s |\n|---|---|---|---|---|\n");
  for (const int T : lengths) {
    const size_t per_head = size_t(T) * hd;
    uint16_t *kc, *vc, *q, *out;
    ELASTIC_CUDA_CHECK(cudaMalloc(&kc, per_head * Hkv * 2));
    ELASTIC_CUDA_CHECK(cudaMalloc(&vc, per_head * Hkv * 2));
    ELASTIC_CUDA_CHECK(cudaMalloc(&q, size_t(Hq) * hd * 2));
    ELASTIC_CUDA_CHECK(cudaMalloc(&out, size_t(Hq) * hd * 2));
    fill_random_bf16<<<1024, 256>>>(kc, per_head * Hkv, 4u, 1.f);
    fill_random_bf16<<<1024, 256>>>(vc, per_head * Hkv, 5u, 1.f);
    fill_random_bf16<<<64, 256>>>(q, size_t(Hq) * hd, 6u, 1.f);
    float* ws;
    ELASTIC_CUDA_CHECK(cudaMalloc(&ws, decode_workspace_floats(Hq, hd, T) * 4));
    for (const HeadMode mode : {HeadMode::Full, HeadMode::Streaming}) {
      const KVHeadMeta m = make_kv_head_meta(mode, sink, local, B);
      std::vector<DecodeKVHead> hh(Hkv);
      for (int h = 0; h < Hkv; ++h) {
        hh[h].k = kc + per_head * h, hh[h].v = vc + per_head * h;
        hh[h].mode = m.mode, hh[h].sink_blocks = m.sink_blocks, hh[h].local_blocks = m.local_blocks;
        if (mode == HeadMode::Streaming && (m.sink_blocks + m.local_blocks) * B < T)
          hh[h].sink_slots = m.sink_blocks * B, hh[h].ring_slots = m.local_blocks * B;
      }
      // Positions the last token attends to, by the CPU reference's rule (streaming_keeps per key block).
      elastic::SparseSettings sp;
      sp.block = B, sp.sink = sink, sp.local = local;
      const int qb = (T - 1) / B;
      int kept = 0;
      for (int kb = 0; kb <= qb; ++kb)
        if (mode == HeadMode::Full || elastic::streaming_keeps(qb, kb, sp)) kept += std::min(B, T - kb * B);
      validate_decode_heads(hh.data(), Hkv, B);
      DecodeKVHead* dh;
      ELASTIC_CUDA_CHECK(cudaMalloc(&dh, Hkv * sizeof(DecodeKVHead)));
      ELASTIC_CUDA_CHECK(cudaMemcpy(dh, hh.data(), Hkv * sizeof(DecodeKVHead), cudaMemcpyHostToDevice));
      DecodeParams p;
      p.q = q, p.out = out, p.heads = dh, p.n_pos = T, p.n_heads = Hq, p.n_kv_heads = Hkv, p.head_dim = hd;
      p.block = B, p.workspace = ws;
      const int max_kept = decode_max_kept(hh.data(), Hkv, B, T);
      struct Form {
        DecodeLoads loads;
        DecodeCombine combine;
        int split;     // 0: Auto (from the grid)
        bool bounded;  // max_kept set: the grid covers the kept positions only
      };
      // The default first (Auto split over the kept positions), then each split by hand, the other merge, the
      // staged loads, and the grid over all T positions at split 256 (the default before the kept bound).
      for (const Form f : {Form{DecodeLoads::Auto, DecodeCombine::Auto, 0, true},
                           Form{DecodeLoads::Direct, DecodeCombine::Parallel, 256, true},
                           Form{DecodeLoads::Direct, DecodeCombine::Parallel, 128, true},
                           Form{DecodeLoads::Direct, DecodeCombine::Parallel, 64, true},
                           Form{DecodeLoads::Direct, DecodeCombine::Serial, 0, true},
                           Form{DecodeLoads::Staged, DecodeCombine::Parallel, 0, true},
                           Form{DecodeLoads::Direct, DecodeCombine::Parallel, 256, false}}) {
        p.combine = f.combine;
        p.loads = f.loads;
        p.split = f.split;
        p.max_kept = f.bounded ? max_kept : 0;
        const double ms = timer.median_ms([&] { decode_attention(p, nullptr); }, 50);
        const double bytes = 2.0 * kept * hd * 2 * Hkv;
        const char* loads = f.loads == DecodeLoads::Auto ? "auto" : f.loads == DecodeLoads::Direct ? "direct" : "staged";
        const char* merge = f.combine == DecodeCombine::Auto ? "auto" : f.combine == DecodeCombine::Serial ? "serial" : "parallel";
        std::printf("| %d | %s, %s loads, %s merge, split %s%d, grid over %s | %d | %.1f | %.0f |\n", T,
                    mode == HeadMode::Streaming ? "all streaming" : "all full", loads, merge, f.split ? "" : "auto: ", decode_split(p),
                    f.bounded ? "kept positions" : "all T", kept, ms * 1e3, bytes / (ms * 1e-3) * 1e-9);
        std::fflush(stdout);
      }
      ELASTIC_CUDA_CHECK(cudaFree(dh));
    }
    ELASTIC_CUDA_CHECK(cudaFree(kc));
    ELASTIC_CUDA_CHECK(cudaFree(vc));
    ELASTIC_CUDA_CHECK(cudaFree(q));
    ELASTIC_CUDA_CHECK(cudaFree(out));
    ELASTIC_CUDA_CHECK(cudaFree(ws));
  }
}

// Paged decode (Qwen3-4B attention shape, page 64): a batch of sequences, each with its lengths and routing laid
// out by SequencePages as after a long decode; one launch of paged_decode_attention per layer. Batches 1, 8 and 32 at
// each length, then 8 and 32 of mixed lengths; "of copy" is the roofline figure (K/V bytes over the measured copy rate). Batch 1 rows also
// time decode_attention (the contiguous per-head cache kernel) on the same lengths for comparison. K/V bytes read
// per second against the measured copy rate.
void paged_table(const std::vector<int>& lengths, Timer& timer) {
  const int Hq = 32, Hkv = 8, hd = 128, P = 64;
  const double copy = copy_bandwidth_gbs();
  const int target_units = paged_target_units();  // the partial kernel's resident warps, as the GPU model plans
  std::printf("\ncopy (device to device, read + write): %.0f GB/s\n\n| batch | lengths | routing | units x keys |"
              " us/layer | K+V read GB/s | of copy |\n|---|---|---|---|---|---|---|\n", copy);
  struct Form {
    std::vector<int> lens;
    const char* routing;  // full, ssa, hybrid (70% of KV heads streaming, per sequence)
  };
  std::vector<Form> forms;
  for (const int T : lengths)
    for (const char* r : {"full", "hybrid 0.7", "ssa"}) forms.push_back({{T}, r});
  // The batched grid of issue 21: batch 8 and 32 at each length, every sequence the same length.
  for (const int batch : {8, 32})
    for (const int T : lengths)
      for (const char* r : {"full", "hybrid 0.7", "ssa"}) forms.push_back({std::vector<int>(batch, T), r});
  std::mt19937 rng(11);
  for (const int batch : {8, 32})
    for (const char* r : {"full", "hybrid 0.7", "ssa"}) {
      std::vector<int> lens(batch);
      for (auto& x : lens) x = 1024 << (rng() % 8);  // 1K .. 128K
      forms.push_back({lens, r});
    }
  for (const Form& f : forms) {
    const int n = int(f.lens.size());
    int64_t total = 0;
    for (const int T : f.lens) total += (int64_t(T) + P - 1) / P * Hkv;
    elastic::PagePool pool(total + Hkv * n, P);
    std::vector<std::unique_ptr<elastic::SequencePages>> seqs;
    std::vector<const elastic::HeadPages*> heads;
    for (int b = 0; b < n; ++b) {
      elastic::RoutingTable r = elastic::RoutingTable::all_full(1, Hkv);
      const std::string rt = f.routing;
      for (int h = 0; h < Hkv; ++h)
        if (rt == "ssa" || (rt == "hybrid 0.7" && (h + b) % 10 < 7)) r.mode[h] = elastic::HeadMode::Streaming;
      r.sparse.block = 64, r.sparse.sink = 128, r.sparse.local = 2048;
      seqs.push_back(std::make_unique<elastic::SequencePages>(pool, r));
      seqs.back()->grow(f.lens[b] - 1);
      seqs.back()->release_unused();
      seqs.back()->grow(f.lens[b]);
      for (int h = 0; h < Hkv; ++h) heads.push_back(&seqs.back()->head(0, h));
    }
    int64_t kept = 0;
    for (const auto* h : heads) kept += h->kept;
    const elastic::PagedDecodePlan plan =
        elastic::plan_paged_decode(heads, Hkv, P, elastic::paged_keys_per_unit(kept, target_units));
    const size_t rows = size_t(pool.n_pages()) * P;
    uint16_t *kp, *vp, *q, *out;
    ELASTIC_CUDA_CHECK(cudaMalloc(&kp, rows * hd * 2));
    ELASTIC_CUDA_CHECK(cudaMalloc(&vp, rows * hd * 2));
    ELASTIC_CUDA_CHECK(cudaMalloc(&q, size_t(n) * Hq * hd * 2));
    ELASTIC_CUDA_CHECK(cudaMalloc(&out, size_t(n) * Hq * hd * 2));
    fill_random_bf16<<<1024, 256>>>(kp, rows * hd, 4u, 1.f);
    fill_random_bf16<<<1024, 256>>>(vp, rows * hd, 5u, 1.f);
    fill_random_bf16<<<64, 256>>>(q, size_t(n) * Hq * hd, 6u, 1.f);
    int32_t* table;
    elastic::PagedDecodeHead* dh;
    elastic::PagedDecodeUnit* du;
    float* ws;
    ELASTIC_CUDA_CHECK(cudaMalloc(&table, plan.page_table.size() * 4));
    ELASTIC_CUDA_CHECK(cudaMalloc(&dh, plan.heads.size() * sizeof(elastic::PagedDecodeHead)));
    ELASTIC_CUDA_CHECK(cudaMalloc(&du, plan.units.size() * sizeof(elastic::PagedDecodeUnit)));
    ELASTIC_CUDA_CHECK(cudaMalloc(&ws, paged_decode_workspace_floats(int(plan.units.size()), Hq / Hkv, hd) * 4));
    ELASTIC_CUDA_CHECK(cudaMemcpy(table, plan.page_table.data(), plan.page_table.size() * 4, cudaMemcpyHostToDevice));
    ELASTIC_CUDA_CHECK(cudaMemcpy(dh, plan.heads.data(), plan.heads.size() * sizeof(elastic::PagedDecodeHead),
                                  cudaMemcpyHostToDevice));
    ELASTIC_CUDA_CHECK(cudaMemcpy(du, plan.units.data(), plan.units.size() * sizeof(elastic::PagedDecodeUnit),
                                  cudaMemcpyHostToDevice));
    PagedDecodeParams p;
    p.q = q, p.out = out, p.k_pool = kp, p.v_pool = vp, p.page_table = table, p.heads = dh, p.units = du;
    p.n_units = int(plan.units.size()), p.workspace = ws;
    p.n_seqs = n, p.n_heads = Hq, p.n_kv_heads = Hkv, p.head_dim = hd, p.page_size = P;
    const double ms = timer.median_ms([&] { paged_decode_attention(p, nullptr); }, 50);
    const double bytes = 2.0 * kept * hd * 2;
    const bool same = std::all_of(f.lens.begin(), f.lens.end(), [&](int x) { return x == f.lens[0]; });
    std::string lens = same ? std::to_string(f.lens[0]) : "mixed 1K-128K (" + std::to_string(kept / Hkv / n) + " kept avg)";
    std::printf("| %d | %s | %s | %zu x %d | %.1f | %.0f | %.2f |\n", n, lens.c_str(), f.routing, plan.units.size(),
                plan.keys_per_unit, ms * 1e3, bytes / (ms * 1e-3) * 1e-9, bytes / (ms * 1e-3) * 1e-9 / copy);
    std::fflush(stdout);
    for (void* x : std::initializer_list<void*>{kp, vp, q, out, table, dh, du, ws}) ELASTIC_CUDA_CHECK(cudaFree(x));
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> lengths;
  bool decode_only = false, kernels_only = false, paired_only = false, paged_only = false, gemm_only = false,
       estimate_only = false;
  // XAttention forward on random block lists that keep this share of each query block's causal key blocks: the
  // speed at the density real attention gives (bench --density on SmolLM2, 8K: mean 0.17 at block 64; 2K: 0.38),
  // where random Q/K make the estimator keep ~0.89.
  std::vector<double> xa_densities = {0.17, 0.38};
  int block = 64;  // --block 128: the prefill tables at block 128 (where a row pair's two query tiles share a selection)
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--decode") decode_only = true;
    else if (a == "--paged") paged_only = true, decode_only = true;
    else if (a == "--gemm") gemm_only = true;  // only the decode projections table
    else if (a == "--kernels") kernels_only = true;  // only the all-full / all-streaming rows of each kernel
    else if (a == "--paired") paired_only = true;     // only the paired SA-cost table
    else if (a == "--xa-estimate") estimate_only = true;  // only the full row and the XAttention estimators, chunked
    else if (a == "--block" && i + 1 < argc) {
      block = std::atoi(argv[++i]);
      if (block != 64 && block != 128) {
        std::fprintf(stderr, "bench_attention_gpu: --block takes 64 or 128, got '%s'\n", argv[i]);
        return 2;
      }
    }
    else if (a == "--xa-density" && i + 1 < argc) {  // comma list in (0, 1]
      xa_densities.clear();
      std::stringstream ss(argv[++i]);
      for (std::string x; std::getline(ss, x, ',');) {
        char* end = nullptr;
        const double d = std::strtod(x.c_str(), &end);
        if (x.empty() || *end || !(d > 0 && d <= 1)) {
          std::fprintf(stderr, "bench_attention_gpu: --xa-density takes densities in (0, 1], got '%s'\n", x.c_str());
          return 2;
        }
        xa_densities.push_back(d);
      }
    }
    else if (a.empty() || a.find_first_not_of("0123456789") != std::string::npos || std::atoi(a.c_str()) <= 0) {
      std::fprintf(stderr, "bench_attention_gpu: bad argument '%s' (usage: [--decode | --paged | --gemm | --kernels | --paired | --xa-estimate] "
                           "[--xa-density D,...] [--block 64|128] [T ...])\n",
                   a.c_str());
      return 2;
    } else lengths.push_back(std::atoi(a.c_str()));
  }
  if (lengths.empty()) lengths = {8192, 16384, 32768, 65536, 131072};
  if (gemm_only) {
    Timer timer;
    gemm_table(timer);
    return 0;
  }
  if (decode_only) {
    Timer timer;
    if (!paged_only) decode_table(lengths, timer);
    paged_table(lengths, timer);
    return 0;
  }
  const int Hq = 32, Hkv = 8, hd = 128, B = block, sink = 128, local = 2048, L = 5;
  constexpr int kRowPairsOpts = 16 | 2 | 1;  // the wgmma kernel's row pairs over the overlap kernel's defaults
  const int xattn_max_T = 131072;      // XAttn rows up to 128K (past it the estimator runs two passes, slowly)
  const int simple_est_max_T = 32768;  // the fp32 CUDA-core estimator is slow beyond this
  cudaDeviceProp prop{};
  ELASTIC_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("GPU %s, %d SMs. Qwen3-4B attention: Hq=%d Hkv=%d hd=%d causal bf16, block %d, sink %d, local %d, "
              "xattn stride 16 tau 0.9, hybrid = %d-layer stack with streaming sparse heads\n\n",
              prop.name, prop.multiProcessorCount, Hq, Hkv, hd, B, sink, local, L);
  if (!paired_only)
    std::printf("| T | routing | Omega | ms/layer | computed/dense pairs | TFLOP/s (computed) | TFLOP/s (dense causal) | "
                "time vs our full (a variant's ssa row: vs that variant's full) | cost share / pair share |\n"
                "|---|---|---|---|---|---|---|---|---|\n");
  std::mt19937 rng(42);
  Timer timer;
  std::vector<std::string> paired;  // rows of the paired SA-cost table, printed after the main one
  Gemm est_gemm;  // the XAttention estimator's cuBLASLt scores
  for (const int T : lengths) {
    const size_t nq = size_t(T) * Hq * hd, nk = size_t(T) * Hkv * hd;
    uint16_t *q, *k, *v, *out;
    float* lse;
    ELASTIC_CUDA_CHECK(cudaMalloc(&q, nq * 2));
    ELASTIC_CUDA_CHECK(cudaMalloc(&k, nk * 2));
    ELASTIC_CUDA_CHECK(cudaMalloc(&v, nk * 2));
    ELASTIC_CUDA_CHECK(cudaMalloc(&out, nq * 2));
    ELASTIC_CUDA_CHECK(cudaMalloc(&lse, size_t(Hq) * T * 4));
    fill_random_bf16<<<1024, 256>>>(q, nq, 1u, 1.f);
    fill_random_bf16<<<1024, 256>>>(k, nk, 2u, 1.f);
    fill_random_bf16<<<1024, 256>>>(v, nk, 3u, 1.f);
    ELASTIC_CUDA_CHECK(cudaGetLastError());
    auto free_io = [&] {
      for (void* b : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(out),
                      static_cast<void*>(lse)})
        ELASTIC_CUDA_CHECK(cudaFree(b));
    };
    const double dense_pairs = double(Hq) * T * (T + 1.0) / 2.0;
    const double flop_per_pair = 4.0 * hd;
    const int nb = (T + B - 1) / B;

    // Per-layer metadata sets, on the device.
    auto upload_meta = [&](const std::vector<KVHeadMeta>& m) {
      KVHeadMeta* d;
      ELASTIC_CUDA_CHECK(cudaMalloc(&d, m.size() * sizeof(KVHeadMeta)));
      ELASTIC_CUDA_CHECK(cudaMemcpy(d, m.data(), m.size() * sizeof(KVHeadMeta), cudaMemcpyHostToDevice));
      return d;
    };
    const KVHeadMeta mf = make_kv_head_meta(HeadMode::Full, sink, local, B),
                     ms = make_kv_head_meta(HeadMode::Streaming, sink, local, B),
                     mx = make_kv_head_meta(HeadMode::XAttn, sink, local, B);
    auto base = [&](const KVHeadMeta* meta) {
      HybridAttnParams p;
      p.q = q, p.k = k, p.v = v, p.out = out, p.lse = lse;
      p.T = T, p.n_heads = Hq, p.n_kv_heads = Hkv, p.head_dim = hd, p.block = B, p.meta = meta;
      return p;
    };
    const int reps = T >= 65536 ? 3 : 5;
    double t_full = 0, pairs_full = 0;
    // Time and pair shares against all-full; `base_ms` is the all-full time of the same kernel (default: Auto's).
    auto row = [&](const char* name, double omega, double ms_layer, double pairs, double base_ms = 0.0) {
      const double base = base_ms > 0 ? base_ms : t_full;
      const double share_t = base > 0 ? ms_layer / base : 1.0, share_p = pairs_full > 0 ? pairs / pairs_full : 1.0;
      std::printf("| %d | %s | %.2f | %.3f | %.4f | %.1f | %.1f | %.3f | %.3f |\n", T, name, omega, ms_layer,
                  pairs / dense_pairs, pairs * flop_per_pair / ms_layer * 1e-9, dense_pairs * flop_per_pair / ms_layer * 1e-9,
                  share_t, share_t / share_p);
      std::fflush(stdout);
    };
    // One layer with every KV head routed alike (hm), through kernel k: ms per layer; and its computed pairs.
    auto uniform_ms = [&](const KVHeadMeta& hm, AttnKernel k, int opts = -1) {
      KVHeadMeta* d = upload_meta(std::vector<KVHeadMeta>(Hkv, hm));
      auto p = base(d);
      p.kernel = k;
      p.opts = opts;
      const double t = timer.median_ms([&] { hybrid_attention_fwd_any(p, nullptr); }, reps);
      ELASTIC_CUDA_CHECK(cudaFree(d));
      return t;
    };
    auto uniform_pairs = [&](const KVHeadMeta& hm) {
      double pr = 0;
      for (int h = 0; h < Hq; ++h) pr += pairs_head(hm, T, B, nullptr, nullptr, nullptr, h, nb);
      return pr;
    };
    // The SA cost target, measured paired: an all-full and an all-streaming layer through the same kernel, timed in
    // alternation (the order flips every round), so clock and power drift over the run land on both alike. The rows
    // above time each routing once, minutes apart at 128K, and the same kernel's full time moved by up to 10%
    // between two of them (H200, 16K: docs/results/gpu_2026-12-03e/static_items_kernels.md). Per round:
    // (t_ssa / t_full) / pair share; the median and the range. Two shares: the (query, key) pairs of 64 x 64 tiles
    // with diagonal tiles half, and the mask blocks of the routing's block size that the CPU reference's
    // streaming rule keeps (a diagonal block counts whole: the kernel computes it, masked inside).
    elastic::SparseSettings sp;
    sp.block = B, sp.sink = sink, sp.local = local;
    double blocks_full = 0, blocks_ssa = 0;
    for (int qb = 0; qb < nb; ++qb)
      for (int kb = 0; kb <= qb; ++kb) blocks_full += 1, blocks_ssa += elastic::streaming_keeps(qb, kb, sp);
    const double block_share = blocks_ssa / blocks_full;
    auto paired_rows = [&](double full_pairs, double ssa_pairs) {
      for (const AttnKernel k : {AttnKernel::Auto, AttnKernel::Wgmma}) {
        KVHeadMeta* df = upload_meta(std::vector<KVHeadMeta>(Hkv, mf));
        KVHeadMeta* ds = upload_meta(std::vector<KVHeadMeta>(Hkv, ms));
        HybridAttnParams pf = base(df), ps = base(ds);
        pf.kernel = ps.kernel = k;
        const int rounds = T >= 65536 ? 9 : 21;
        std::vector<double> ratio, tf, ts;
        for (int r = 0; r < rounds; ++r) {
          double a = 0, b = 0;
          if (r % 2 == 0) {
            a = timer.median_ms([&] { hybrid_attention_fwd_any(pf, nullptr); }, 3);
            b = timer.median_ms([&] { hybrid_attention_fwd_any(ps, nullptr); }, 3);
          } else {
            b = timer.median_ms([&] { hybrid_attention_fwd_any(ps, nullptr); }, 3);
            a = timer.median_ms([&] { hybrid_attention_fwd_any(pf, nullptr); }, 3);
          }
          tf.push_back(a), ts.push_back(b), ratio.push_back(b / a / (ssa_pairs / full_pairs));
        }
        for (auto* v : {&ratio, &tf, &ts}) std::sort(v->begin(), v->end());
        char line[256];
        const double pair_share = ssa_pairs / full_pairs, med = ratio[rounds / 2];
        std::snprintf(line, sizeof line, "| %d | %s | %d | %.3f | %.3f | %.4f | %.3f | %.3f | %.3f | %.4f | %.3f |", T,
                      k == AttnKernel::Auto ? "Auto" : "wgmma v4", rounds, tf[rounds / 2], ts[rounds / 2], pair_share,
                      med, ratio.front(), ratio.back(), block_share, med * pair_share / block_share);
        paired.emplace_back(line);
        ELASTIC_CUDA_CHECK(cudaFree(df));
        ELASTIC_CUDA_CHECK(cudaFree(ds));
      }
    };
    if (paired_only) {
      paired_rows(uniform_pairs(mf), uniform_pairs(ms));
      free_io();
      continue;
    }
    t_full = uniform_ms(mf, AttnKernel::Auto);
    pairs_full = uniform_pairs(mf);
    row("full", 0.0, t_full, pairs_full);
    if (estimate_only) {  // the estimators as GpuModel calls them: every KV head XAttention, chunks of 16384 queries
      KVHeadMeta* d = upload_meta(std::vector<KVHeadMeta>(Hkv, mx));
      const int64_t cap = xattn_list_capacity(Hq, nb);
      const int chunk = 16384;
      // Per form: its block lists and counts (empty when the form failed), its name.
      struct FormRun { XAttnEstimateKernel form; const char* name; std::vector<int32_t> blocks, counts; };
      std::vector<FormRun> runs{{XAttnEstimateKernel::Auto, "mma.sync tiles", {}, {}},
                                {XAttnEstimateKernel::Gemm, "cuBLASLt scores", {}, {}},
                                {XAttnEstimateKernel::Fused, "fused wgmma, candidate", {}, {}}};
      for (FormRun& run : runs) {
        const XAttnEstimateKernel form = run.form;
        int32_t *blocks, *off, *cnt;
        void* scratch = nullptr;
        ELASTIC_CUDA_CHECK(cudaMalloc(&blocks, cap * 4));
        ELASTIC_CUDA_CHECK(cudaMalloc(&off, size_t(Hq) * nb * 4));
        ELASTIC_CUDA_CHECK(cudaMalloc(&cnt, size_t(Hq) * nb * 4));
        XAttnEstimateParams e;
        e.k = k, e.n_heads = Hq, e.n_kv_heads = Hkv, e.head_dim = hd, e.block = B, e.stride = 16, e.tau = 0.9f;
        e.meta = d, e.blocks = blocks, e.offsets = off, e.counts = cnt, e.kernel = form;
        if (form == XAttnEstimateKernel::Gemm || form == XAttnEstimateKernel::Fused) {
          e.scratch_bytes = xattn_estimate_scratch_bytes(form, std::min(chunk, T), T, Hkv, Hq / Hkv, hd, 16, B);
          ELASTIC_CUDA_CHECK(cudaMalloc(&scratch, e.scratch_bytes));
          e.gemm = &est_gemm, e.scratch = scratch;
        }
        auto all_chunks = [&] {
          for (int t0 = 0; t0 < T; t0 += chunk) {
            XAttnEstimateParams c = e;
            c.q = q + size_t(t0) * Hq * hd, c.T = std::min(chunk, T - t0), c.pos0 = t0;
            if (form == XAttnEstimateKernel::Gemm || form == XAttnEstimateKernel::Fused) xattn_estimate_cuda(c, nullptr);
            else xattn_estimate_variant(c, nullptr);  // the dev area's
          }
        };
        const std::string label = std::string("xattn estimate, chunks of 16384 (GPU, ") + run.name + ")";
        try {  // a form that refuses the shape (or fails) costs its row, not the table
          const double t = timer.median_ms(all_chunks, reps);
          row(label.c_str(), 1.0, t, 0.0);
          run.blocks.resize(cap), run.counts.resize(size_t(Hq) * nb);
          ELASTIC_CUDA_CHECK(cudaMemcpy(run.blocks.data(), blocks, cap * 4, cudaMemcpyDeviceToHost));
          ELASTIC_CUDA_CHECK(cudaMemcpy(run.counts.data(), cnt, run.counts.size() * 4, cudaMemcpyDeviceToHost));
        } catch (const std::exception& ex) {
          std::printf("| %d | %s: failed: %s | | | | | | | |\n", T, label.c_str(), ex.what());
        }
        for (void* b : {static_cast<void*>(blocks), static_cast<void*>(off), static_cast<void*>(cnt), scratch})
          if (b) ELASTIC_CUDA_CHECK(cudaFree(b));
      }
      // Where each form's selections differ from the engine's (cuBLASLt): summation order only (the same bf16
      // products, fp32 sums; the fused form's masses from per-block log-sum-exps and fixed-point totals).
      const FormRun& anchor = runs[1];
      for (const FormRun& other : {runs[0], runs[2]}) {
        if (anchor.counts.empty() || other.counts.empty()) continue;
        int64_t differ = 0, kept = 0;
        for (int h = 0; h < Hq; ++h)
          for (int qb = 0; qb < nb; ++qb) {
            const size_t r = size_t(h) * nb + qb, o = size_t(h) * nb * (nb + 1) / 2 + size_t(qb) * (qb + 1) / 2;
            std::vector<uint8_t> a(qb + 1, 0), b(qb + 1, 0);
            for (int i = 0; i < anchor.counts[r]; ++i) a[anchor.blocks[o + i]] = 1;
            for (int i = 0; i < other.counts[r]; ++i) b[other.blocks[o + i]] = 1;
            for (int kb = 0; kb <= qb; ++kb) differ += a[kb] != b[kb], kept += a[kb];
          }
        std::printf("| %d | (%s against cuBLASLt: block selections differ in %lld of %lld kept blocks) | | | | | | | |\n",
                    T, other.name, static_cast<long long>(differ), static_cast<long long>(kept));
      }
      ELASTIC_CUDA_CHECK(cudaFree(d));
      free_io();
      continue;
    }
    const double pairs_ssa = uniform_pairs(ms);
    // The other kernels on the same input, for comparison (the persistent one also on all-streaming layers).
    // Each variant's all-streaming row is costed against the same variant's all-full time (last column).
    const double t_v4 = uniform_ms(mf, AttnKernel::Wgmma), t_ov = uniform_ms(mf, AttnKernel::WgmmaOverlap),
                 t_on = uniform_ms(mf, AttnKernel::WgmmaOverlapNoPingpong),
                 t_pe = uniform_ms(mf, AttnKernel::WgmmaPersistent);
    row("full (wgmma v4: pingpong)", 0.0, t_v4, pairs_full);
    row("full (wgmma, no pingpong)", 0.0, uniform_ms(mf, AttnKernel::WgmmaNoPingpong), pairs_full);
    row("full (wgmma, overlap)", 0.0, t_ov, pairs_full);
    // Row pairs (option bit 16 over the overlap kernel's defaults 1 | 2): a CTA per (head, two query tiles).
    const double t_ov_rp = uniform_ms(mf, AttnKernel::WgmmaOverlap, kRowPairsOpts);
    row("full (wgmma, overlap, row pairs: opts 19)", 0.0, t_ov_rp, pairs_full);
    row("full (wgmma, overlap, no pingpong)", 0.0, t_on, pairs_full);
    row("full (wgmma, persistent)", 0.0, t_pe, pairs_full);
    row("ssa (wgmma v4: pingpong)", 1.0, uniform_ms(ms, AttnKernel::Wgmma), pairs_ssa, t_v4);
    row("ssa (wgmma, overlap)", 1.0, uniform_ms(ms, AttnKernel::WgmmaOverlap), pairs_ssa, t_ov);
    row("ssa (wgmma, overlap, row pairs: opts 19)", 1.0, uniform_ms(ms, AttnKernel::WgmmaOverlap, kRowPairsOpts),
        pairs_ssa, t_ov_rp);
    row("ssa (wgmma, overlap, no pingpong)", 1.0, uniform_ms(ms, AttnKernel::WgmmaOverlapNoPingpong), pairs_ssa, t_on);
    row("ssa (wgmma, persistent)", 1.0, uniform_ms(ms, AttnKernel::WgmmaPersistent), pairs_ssa, t_pe);
    if (!kernels_only) row("full (simple kernel)", 0.0, uniform_ms(mf, AttnKernel::Simple), pairs_full);
    row("ssa", 1.0, uniform_ms(ms, AttnKernel::Auto), pairs_ssa);
    paired_rows(pairs_full, pairs_ssa);
    if (kernels_only) {
      free_io();
      continue;
    }
    if (T <= xattn_max_T) {  // all XAttention: estimation on the GPU, then the sparse forward
      KVHeadMeta* d = upload_meta(std::vector<KVHeadMeta>(Hkv, mx));
      const int64_t cap = xattn_list_capacity(Hq, nb);
      int32_t *blocks, *off, *cnt;
      ELASTIC_CUDA_CHECK(cudaMalloc(&blocks, cap * 4));
      ELASTIC_CUDA_CHECK(cudaMalloc(&off, size_t(Hq) * nb * 4));
      ELASTIC_CUDA_CHECK(cudaMalloc(&cnt, size_t(Hq) * nb * 4));
      XAttnEstimateParams e;
      e.q = q, e.k = k, e.T = T, e.n_heads = Hq, e.n_kv_heads = Hkv, e.head_dim = hd, e.block = B, e.stride = 16;
      e.tau = 0.9f, e.meta = d, e.blocks = blocks, e.offsets = off, e.counts = cnt;
      if (T <= simple_est_max_T) {  // the fp32 CUDA-core estimator, for comparison
        XAttnEstimateParams es = e;
        es.kernel = XAttnEstimateKernel::Simple;
        row("xattn estimate (GPU, fp32 CUDA cores)", 1.0,
            timer.median_ms([&] { xattn_estimate_variant(es, nullptr); }, reps), 0.0);
      }
      XAttnEstimateParams em = e;  // the mma.sync kernel (the dev area's Auto), for comparison
      const double t_mma = timer.median_ms([&] { xattn_estimate_variant(em, nullptr); }, reps);
      // The engine's estimator: scores through cuBLASLt (what GpuModel runs; every KV head scored here).
      void* scratch = nullptr;
      e.scratch_bytes = xattn_gemm_scratch_bytes(T, T, Hkv, Hq / Hkv, hd, 16);
      ELASTIC_CUDA_CHECK(cudaMalloc(&scratch, e.scratch_bytes));
      e.gemm = &est_gemm, e.scratch = scratch, e.kernel = XAttnEstimateKernel::Gemm;
      const double t_est = timer.median_ms([&] { xattn_estimate_cuda(e, nullptr); }, reps);
      ELASTIC_CUDA_CHECK(cudaFree(scratch));
      auto p = base(d);
      p.xattn = {blocks, off, cnt};
      const double t = timer.median_ms([&] { hybrid_attention_fwd_any(p, nullptr); }, reps);
      std::vector<int32_t> hc(size_t(Hq) * nb), ho(hc.size()), hb(cap);
      ELASTIC_CUDA_CHECK(cudaMemcpy(hc.data(), cnt, hc.size() * 4, cudaMemcpyDeviceToHost));
      ELASTIC_CUDA_CHECK(cudaMemcpy(ho.data(), off, ho.size() * 4, cudaMemcpyDeviceToHost));
      ELASTIC_CUDA_CHECK(cudaMemcpy(hb.data(), blocks, hb.size() * 4, cudaMemcpyDeviceToHost));
      double pr = 0;
      for (int h = 0; h < Hq; ++h) pr += pairs_head(mx, T, B, &hc, &hb, &ho, h, nb);
      row("xattn (forward only)", 1.0, t, pr);
      {
        auto pp = p;
        pp.opts = 8 | 2 | 1;  // XAttention heads pipelined (option bit 8) over the overlap kernel's defaults
        row("xattn (forward only), pipelined (opts 11)", 1.0,
            timer.median_ms([&] { hybrid_attention_fwd_any(pp, nullptr); }, reps), pr);
        pp.opts = kRowPairsOpts;
        row("xattn (forward only), row pairs (opts 19)", 1.0,
            timer.median_ms([&] { hybrid_attention_fwd_any(pp, nullptr); }, reps), pr);
      }
      row("xattn estimate (GPU, mma.sync tiles)", 1.0, t_mma, 0.0);
      row("xattn estimate (GPU, cuBLASLt scores)", 1.0, t_est, 0.0);
      row("xattn estimate + forward", 1.0, t_est + t, pr);
      // The same forward on random lists at set densities: per (head, query block), block 0 and the diagonal, and each
      // block between with the probability that makes the expected kept share the density (uniform over heads; real
      // heads spread around it, docs/PERFORMANCE.md).
      // Then the same densities with lists that match the kernel's walk: the two query heads of a pair share one list
      // and blocks are kept two at a time (128-key steps), so no step loads keys that neither head keeps. The gap
      // between the two rows is what per-head lists cost the paired 128-key walk (tile_walk.h's PairIter, which walks
      // the union of the pair's lists and masks the halves one head lacks).
      for (const bool matched : {false, true})
      for (const double dens : xa_densities) {
        std::vector<int32_t> rc(size_t(Hq) * nb), ro(rc.size()), rb(cap);
        std::mt19937_64 lr(7);
        for (int h = 0; h < Hq; ++h)
          for (int qb = 0; qb < nb; ++qb) {
            const size_t r = size_t(h) * nb + qb;
            ro[r] = static_cast<int32_t>(int64_t(h) * nb * (nb + 1) / 2 + int64_t(qb) * (qb + 1) / 2);
            if (matched && (h & 1)) {  // the pair's first head's list
              const size_t r0 = r - nb;
              std::copy_n(rb.begin() + ro[r0], rc[r0], rb.begin() + ro[r]);
              rc[r] = rc[r0];
              continue;
            }
            const double keep_mid = qb > 1 ? std::clamp((dens * (qb + 1) - 2) / (qb - 1), 0.0, 1.0) : 0.0;
            std::bernoulli_distribution coin(keep_mid);
            int c = 0;
            bool keep_group = false;
            for (int kb = 0; kb <= qb; ++kb) {
              if (!matched || kb % 2 == 0) keep_group = coin(lr);  // matched: one draw per 128-key group
              const bool forced = kb == 0 || kb == qb || (matched && (kb / 2 == 0 || kb / 2 == qb / 2));
              if (forced || keep_group) rb[ro[r] + c++] = kb;
            }
            rc[r] = c;
          }
        ELASTIC_CUDA_CHECK(cudaMemcpy(cnt, rc.data(), rc.size() * 4, cudaMemcpyHostToDevice));
        ELASTIC_CUDA_CHECK(cudaMemcpy(off, ro.data(), ro.size() * 4, cudaMemcpyHostToDevice));
        ELASTIC_CUDA_CHECK(cudaMemcpy(blocks, rb.data(), rb.size() * 4, cudaMemcpyHostToDevice));
        const double td = timer.median_ms([&] { hybrid_attention_fwd_any(p, nullptr); }, reps);
        double pd = 0;
        for (int h = 0; h < Hq; ++h) pd += pairs_head(mx, T, B, &rc, &rb, &ro, h, nb);
        // What the paired walk computes per kept tile for these lists (attention.h's paired_walk_steps; 1 when matched
        // at block 64), the figure bench --density gives for real selections.
        double kept_tiles = 0, walked_tiles = 0;
        const int R = B / 64;
        for (int h = 0; h + 1 < Hq; h += 2)
          for (int qb = 0; qb < nb; ++qb) {
            std::vector<int> tl[2];
            for (int i = 0; i < 2; ++i) {
              const size_t r = size_t(h + i) * nb + qb;
              for (int j = 0; j < rc[r]; ++j)
                for (int t = 0; t < R; ++t) tl[i].push_back(rb[ro[r] + j] * R + t);
            }
            kept_tiles += double(tl[0].size() + tl[1].size());
            walked_tiles += 4.0 * elastic::paired_walk_steps(tl[0], tl[1]);
          }
        char name[160];
        std::snprintf(name, sizeof name, "xattn forward, random lists at density %.2f%s (walk: %.2f tiles per kept)", dens,
                      matched ? ", shared by head pairs, 128-key groups" : "", walked_tiles / kept_tiles);
        row(name, 1.0, td, pd);
        // The same lists with XAttention heads on the pipelined path (option bit 8 over the overlap kernel's defaults
        // 1 | 2): every step of the pair's union for both heads, masked, with pingpong and overlap.
        auto pp = p;
        pp.opts = 8 | 2 | 1;
        const double tp = timer.median_ms([&] { hybrid_attention_fwd_any(pp, nullptr); }, reps);
        std::snprintf(name, sizeof name, "xattn forward, random lists at density %.2f%s, pipelined (opts 11)", dens,
                      matched ? ", shared by head pairs, 128-key groups" : "");
        row(name, 1.0, tp, pd);
        // Row pairs: a head's two 64-row query tiles walk the union of their lists (one list at block 128).
        pp.opts = kRowPairsOpts;
        const double tr = timer.median_ms([&] { hybrid_attention_fwd_any(pp, nullptr); }, reps);
        std::snprintf(name, sizeof name, "xattn forward, random lists at density %.2f%s, row pairs (opts 19)", dens,
                      matched ? ", shared by head pairs, 128-key groups" : "");
        row(name, 1.0, tr, pd);
      }
      ELASTIC_CUDA_CHECK(cudaFree(blocks));
      ELASTIC_CUDA_CHECK(cudaFree(off));
      ELASTIC_CUDA_CHECK(cudaFree(cnt));
      ELASTIC_CUDA_CHECK(cudaFree(d));
    }
    for (const double omega : {0.5, 0.7, 0.9}) {  // hybrid: L layers, exactly round(omega * L * Hkv) streaming heads
      std::vector<int> idx(L * Hkv);
      for (int i = 0; i < L * Hkv; ++i) idx[i] = i;
      std::shuffle(idx.begin(), idx.end(), rng);
      std::vector<KVHeadMeta> all(L * Hkv, mf);
      const int n_sparse = static_cast<int>(std::lround(omega * L * Hkv));
      for (int i = 0; i < n_sparse; ++i) all[idx[i]] = ms;
      std::vector<KVHeadMeta*> dm(L);
      double pr = 0;
      for (int l = 0; l < L; ++l) {
        std::vector<KVHeadMeta> m(all.begin() + l * Hkv, all.begin() + (l + 1) * Hkv);
        dm[l] = upload_meta(m);
        for (int h = 0; h < Hq; ++h) pr += pairs_head(m[h / (Hq / Hkv)], T, B, nullptr, nullptr, nullptr, h, nb);
      }
      const double t = timer.median_ms([&] {
        for (int l = 0; l < L; ++l) hybrid_attention_fwd_any(base(dm[l]), nullptr);
      }, reps);
      char name[64];
      std::snprintf(name, sizeof name, "hybrid-ssa (%d/%d heads)", n_sparse, L * Hkv);
      row(name, double(n_sparse) / (L * Hkv), t / L, pr / L);
      for (auto* d : dm) ELASTIC_CUDA_CHECK(cudaFree(d));
    }
    free_io();
  }
  if (estimate_only) return 0;
  std::printf("\nSA cost, paired: all-full and all-streaming layers timed in alternation, per round (t_ssa / t_full) /"
              " share (target < 1.15)\n\n| T | kernel | rounds | full ms (median) | ssa ms (median) | pair share |"
              " cost / pair share: median | min | max | block share | cost / block share: median |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const std::string& l : paired) std::printf("%s\n", l.c_str());
  if (kernels_only || paired_only) return 0;
  decode_table(lengths, timer);
  return 0;
}
