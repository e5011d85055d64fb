// GPU tests (label gpu): decode attention with the position read from device memory (DecodeParams::n_pos_dev),
// as CUDA-graph replay needs it. At the same split the device-n_pos path must give bit-identical outputs to the
// host-n_pos path: live splits run the same kernel code on the same inputs, and the extra splits of the
// max_pos-sized grid only write empty partials (max -inf) that the merge skips without changing its max or its
// summation order. (Auto picks the split from the grid, which differs between the two paths, so every form here
// names its split.) A small
// double CPU reference guards against both paths being wrong together. Outputs are poisoned with NaN before every
// launch and every replay.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "elastic/cuda.h"
#include "elastic/cuda_attention.h"
#include "contiguous_decode.h"  // dev/cuda: the contiguous-cache decode
#include "gpu_test_util.h"

namespace {

using elastic::cuda::DecodeKVHead;
using elastic::cuda::DecodeParams;

uint16_t f2bf(float f) {  // round to nearest even (inputs here are finite)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float bf2f(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <class T>
struct DevBuf {  // device buffer freed on scope exit
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) { ELASTIC_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T))); }
  explicit DevBuf(const std::vector<T>& h) : DevBuf(h.size()) {
    ELASTIC_CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  std::vector<T> down() const {
    std::vector<T> h(n);
    ELASTIC_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

using elastic::gpu_test::random_bf16;

struct Config {
  int Hq, Hkv, hd, B, max_pos;
  int sink_blocks, local_blocks;  // streaming heads: cache = sink_blocks*B sink slots + local_blocks*B ring slots
  std::vector<int> modes;         // [Hkv]: 0 Full, 1 Streaming, 2 XAttn (dense in decode)
};

// Random caches for every KV head: full / XAttn heads hold max_pos slots, streaming heads sink slots + a ring. All
// slots hold random values: both GPU paths read the same bytes, and the CPU reference reads them through the same
// slot mapping, so the contents need not be a real history.
struct Caches {
  std::vector<DecodeKVHead> heads;            // host copy, device pointers inside
  std::vector<std::vector<uint16_t>> k, v;    // [Hkv][slots * hd]
  std::vector<std::unique_ptr<DevBuf<uint16_t>>> bufs;
};

Caches make_caches(const Config& c, std::mt19937& rng) {
  Caches cs;
  cs.heads.resize(c.Hkv);
  cs.k.resize(c.Hkv);
  cs.v.resize(c.Hkv);
  for (int h = 0; h < c.Hkv; ++h) {
    DecodeKVHead& x = cs.heads[h];
    x.mode = c.modes[h];
    if (x.mode == elastic::kv_mode::kStreaming) {
      x.sink_blocks = c.sink_blocks, x.local_blocks = c.local_blocks;
      x.sink_slots = c.sink_blocks * c.B, x.ring_slots = c.local_blocks * c.B;
    }
    const int slots = x.ring_slots ? x.sink_slots + x.ring_slots : c.max_pos;
    cs.k[h] = random_bf16(size_t(slots) * c.hd, rng, 1.f);
    cs.v[h] = random_bf16(size_t(slots) * c.hd, rng, 1.f);
    cs.bufs.emplace_back(new DevBuf<uint16_t>(cs.k[h]));
    x.k = cs.bufs.back()->p;
    cs.bufs.emplace_back(new DevBuf<uint16_t>(cs.v[h]));
    x.v = cs.bufs.back()->p;
  }
  return cs;
}

// Double softmax attention over the positions each head keeps at n_pos (streaming: sink blocks and the last
// local_blocks blocks up to the query block, read through sink slots then the ring).
std::vector<double> cpu_decode(const Config& c, const Caches& cs, const std::vector<uint16_t>& q, int n_pos) {
  const int G = c.Hq / c.Hkv, hd = c.hd, qb = (n_pos - 1) / c.B;
  std::vector<double> out(size_t(c.Hq) * hd, 0.0);
  for (int h = 0; h < c.Hq; ++h) {
    const DecodeKVHead& x = cs.heads[h / G];
    std::vector<int> slots;
    for (int j = 0; j < n_pos; ++j) {
      const int kb = j / c.B;
      if (x.mode == elastic::kv_mode::kStreaming && !(kb < x.sink_blocks || qb - kb < x.local_blocks)) continue;
      slots.push_back(x.ring_slots == 0 || j < x.sink_slots ? j : x.sink_slots + (j - x.sink_slots) % x.ring_slots);
    }
    std::vector<double> s(slots.size());
    double mx = -INFINITY;
    for (size_t i = 0; i < slots.size(); ++i) {
      double d = 0;
      for (int e = 0; e < hd; ++e)
        d += double(bf2f(q[size_t(h) * hd + e])) * bf2f(cs.k[h / G][size_t(slots[i]) * hd + e]);
      s[i] = d / std::sqrt(double(hd));
      mx = std::max(mx, s[i]);
    }
    double sum = 0;
    for (double& e : s) sum += (e = std::exp(e - mx));
    for (size_t i = 0; i < slots.size(); ++i)
      for (int e = 0; e < hd; ++e)
        out[size_t(h) * hd + e] += s[i] / sum * bf2f(cs.v[h / G][size_t(slots[i]) * hd + e]);
  }
  return out;
}

double rel_l2(const std::vector<uint16_t>& got, const std::vector<double>& ref) {
  double e2 = 0, r2 = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = bf2f(got[i]);
    e2 += (g - ref[i]) * (g - ref[i]);
    r2 += ref[i] * ref[i];
  }
  return std::sqrt(e2 / r2);
}

size_t count_non_finite(const std::vector<uint16_t>& v) {
  size_t n = 0;
  for (uint16_t b : v) n += !std::isfinite(bf2f(b));
  return n;
}

void poison(DevBuf<uint16_t>& out, cudaStream_t s) {  // 0xffff is a bf16 NaN
  ELASTIC_CUDA_CHECK(cudaMemsetAsync(out.p, 0xff, out.n * sizeof(uint16_t), s));
}

// Host-n_pos path result for n_pos (the reference the device path must match bit for bit).
std::vector<uint16_t> run_host_path(DecodeParams p, int n_pos, DevBuf<uint16_t>& out, cudaStream_t s) {
  p.n_pos = n_pos;
  p.n_pos_dev = nullptr;
  p.max_pos = 0;
  p.out = out.p;
  poison(out, s);
  elastic::cuda::decode_attention(p, s);
  ELASTIC_CUDA_CHECK(cudaStreamSynchronize(s));
  return out.down();
}

void run_config_with(const Config& c, elastic::cuda::DecodeCombine combine, elastic::cuda::DecodeLoads loads,
                     int split, bool bounded = false) {
  if (elastic::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  SEEDED_RNG(rng);
  const Caches cs = make_caches(c, rng);
  elastic::cuda::validate_decode_heads(cs.heads.data(), c.Hkv, c.B);
  const auto q = random_bf16(size_t(c.Hq) * c.hd, rng, 1.f);
  DevBuf<DecodeKVHead> dheads(cs.heads);
  DevBuf<uint16_t> dq(q), out_host(q.size()), out_dev(q.size());
  // One workspace sized for max_pos serves both paths (the host path needs at most as much).
  DevBuf<float> ws(elastic::cuda::decode_workspace_floats(c.Hq, c.hd, c.max_pos));
  DevBuf<int32_t> dpos(1);
  int32_t* hpos = nullptr;  // pinned: read by the graph's memcpy node at replay time
  ELASTIC_CUDA_CHECK(cudaMallocHost(&hpos, sizeof(int32_t)));
  cudaStream_t s = nullptr;
  ELASTIC_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  DecodeParams base;
  base.q = dq.p, base.heads = dheads.p, base.n_heads = c.Hq, base.n_kv_heads = c.Hkv, base.head_dim = c.hd;
  base.block = c.B, base.workspace = ws.p, base.combine = combine, base.loads = loads, base.split = split;
  // Bounded: both grids cover at most what the heads keep (the device path's max_pos grid shrinks the most).
  if (bounded) base.max_kept = elastic::cuda::decode_max_kept(cs.heads.data(), c.Hkv, c.B, c.max_pos);
  DecodeParams pd = base;  // device-n_pos path
  pd.out = out_dev.p, pd.n_pos_dev = dpos.p, pd.max_pos = c.max_pos;
  pd.n_pos = -7;  // ignored when n_pos_dev is set

  const std::vector<int> n_pos_list = {1, 63, 64, 65, 300, 1000, c.max_pos};
  std::vector<std::vector<uint16_t>> host_out(n_pos_list.size());

  // 1. Plain launches: device path vs host path, bit for bit, and both vs the CPU.
  for (size_t t = 0; t < n_pos_list.size(); ++t) {
    const int n_pos = n_pos_list[t];
    host_out[t] = run_host_path(base, n_pos, out_host, s);
    *hpos = n_pos;
    ELASTIC_CUDA_CHECK(cudaMemcpyAsync(dpos.p, hpos, sizeof(int32_t), cudaMemcpyHostToDevice, s));
    poison(out_dev, s);
    elastic::cuda::decode_attention(pd, s);
    ELASTIC_CUDA_CHECK(cudaStreamSynchronize(s));
    const auto got = out_dev.down();
    EXPECT_EQ(count_non_finite(host_out[t]), 0u) << "host path, n_pos " << n_pos;
    EXPECT_EQ(count_non_finite(got), 0u) << "device path, n_pos " << n_pos;
    EXPECT_TRUE(got == host_out[t]) << "device path differs from host path at n_pos " << n_pos;
    EXPECT_LT(rel_l2(host_out[t], cpu_decode(c, cs, q, n_pos)), 1e-2) << "vs CPU, n_pos " << n_pos;
  }

  // A device n_pos outside [1, max_pos] gives NaN everywhere (no reads past the caches).
  for (const int badpos : {0, c.max_pos + 1}) {
    *hpos = badpos;
    ELASTIC_CUDA_CHECK(cudaMemcpyAsync(dpos.p, hpos, sizeof(int32_t), cudaMemcpyHostToDevice, s));
    elastic::cuda::decode_attention(pd, s);
    ELASTIC_CUDA_CHECK(cudaStreamSynchronize(s));
    EXPECT_EQ(count_non_finite(out_dev.down()), q.size()) << "device n_pos " << badpos;
  }

  // 2. Graphs. A: the launch alone, n_pos updated by a copy outside the graph. B: the copy from pinned host memory
  // captured inside the graph, so a replay picks up whatever *hpos holds then. The order goes up and down, so a
  // replay after a larger n_pos must ignore that run's stale partials.
  const std::vector<size_t> order = {5, 0, 3, 6, 1, 4, 2, 5};
  for (const bool copy_inside : {false, true}) {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ELASTIC_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    if (copy_inside) ELASTIC_CUDA_CHECK(cudaMemcpyAsync(dpos.p, hpos, sizeof(int32_t), cudaMemcpyHostToDevice, s));
    elastic::cuda::decode_attention(pd, s);
    ELASTIC_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    ELASTIC_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (const size_t t : order) {
      const int n_pos = n_pos_list[t];
      *hpos = n_pos;  // the previous replay was synchronized: nothing reads hpos now
      if (!copy_inside)
        ELASTIC_CUDA_CHECK(cudaMemcpyAsync(dpos.p, hpos, sizeof(int32_t), cudaMemcpyHostToDevice, s));
      poison(out_dev, s);
      ELASTIC_CUDA_CHECK(cudaGraphLaunch(exec, s));
      ELASTIC_CUDA_CHECK(cudaStreamSynchronize(s));
      EXPECT_TRUE(out_dev.down() == host_out[t])
          << "graph replay (copy " << (copy_inside ? "inside" : "outside") << ") differs at n_pos " << n_pos;
    }
    ELASTIC_CUDA_CHECK(cudaGraphExecDestroy(exec));
    ELASTIC_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  ELASTIC_CUDA_CHECK(cudaStreamDestroy(s));
  ELASTIC_CUDA_CHECK(cudaFreeHost(hpos));
}

// Direct loads with the serial merge at split 256, staged loads with the parallel merge at 128, direct / parallel
// at 64, and direct / parallel at 64 over the kept bound (DecodeParams::max_kept): each must be bit-identical
// between its host path, device path and replays.
void run_config(const Config& c) {
  using elastic::cuda::DecodeCombine, elastic::cuda::DecodeLoads;
  {
    SCOPED_TRACE("direct loads, serial merge, split 256");
    run_config_with(c, DecodeCombine::Serial, DecodeLoads::Direct, 256);
  }
  {
    SCOPED_TRACE("staged loads, parallel merge, split 128");
    run_config_with(c, DecodeCombine::Parallel, DecodeLoads::Staged, 128);
  }
  {
    SCOPED_TRACE("direct loads, parallel merge, split 64");
    run_config_with(c, DecodeCombine::Parallel, DecodeLoads::Direct, 64);
  }
  {
    SCOPED_TRACE("direct loads, parallel merge, split 64, grid over the kept bound");
    run_config_with(c, DecodeCombine::Parallel, DecodeLoads::Direct, 64, true);
  }
}

}  // namespace

// Full, streaming (sink 64, ring 128) and XAttn (dense in decode) KV heads mixed; GQA group 2.
TEST(CudaDecodeGraph, MixedHeadsHd128Block64) {
  run_config({16, 8, 128, 64, 2048, 1, 2, {0, 1, 2, 1, 0, 1, 1, 0}});
}

// The head_dim 64 kernel, block 128, group 1 (sink 128, ring 128).
TEST(CudaDecodeGraph, MixedHeadsHd64Block128Group1) { run_config({4, 4, 64, 128, 2048, 1, 1, {1, 0, 1, 2}}); }

// Every head streaming (sink 64 + ring 128): the kept bound is 192 positions, so the bounded form's grids cover 3
// splits of 64 whatever max_pos, while n_pos runs to 2048 through the ring.
TEST(CudaDecodeGraph, AllStreamingBoundedGrid) { run_config({8, 4, 128, 64, 2048, 1, 2, {1, 1, 1, 1}}); }

TEST(CudaDecodeGraph, RejectsMissingMaxPos) {
  // Validation happens before any launch, so this runs without a GPU (the pointers are never dereferenced).
  uint16_t d = 0;
  float w = 0;
  int32_t pos = 5;
  DecodeKVHead h;
  DecodeParams p;
  p.q = &d, p.out = &d, p.heads = &h, p.workspace = &w;
  p.n_heads = 2, p.n_kv_heads = 1, p.head_dim = 64, p.block = 64;
  p.n_pos_dev = &pos;
  for (const int mp : {0, -3}) {
    p.max_pos = mp;
    try {
      elastic::cuda::decode_attention(p, nullptr);
      ADD_FAILURE() << "max_pos " << mp << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("max_pos"), std::string::npos) << e.what();
    }
  }
  p.n_pos_dev = nullptr, p.max_pos = 0, p.n_pos = 0;  // host path still requires n_pos > 0
  EXPECT_THROW(elastic::cuda::decode_attention(p, nullptr), std::invalid_argument);
}
