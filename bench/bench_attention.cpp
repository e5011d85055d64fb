// CPU prefill attention: full vs streaming vs XAttention vs hybrid routing, one layer, same inputs in one run.
// Prints a Markdown table with time per call and the ratio against full attention measured here.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "elastic/attention.h"
#include "elastic/xattn.h"

using namespace elastic;

int main(int argc, char** argv) {
  const int T = argc > 1 ? std::atoi(argv[1]) : 4096;
  const int Hq = 8, Hkv = 4, hd = 64, reps = argc > 2 ? std::atoi(argv[2]) : 3;
  std::mt19937 rng(1);
  std::normal_distribution<float> N(0.f, 1.f);
  std::vector<float> q(size_t(T) * Hq * hd), k(size_t(T) * Hkv * hd), v(k.size()), out(q.size());
  for (auto* x : {&q, &k, &v})
    for (auto& e : *x) e = N(rng);
  std::vector<HeadKV> kv(Hkv);
  for (int h = 0; h < Hkv; ++h) {
    kv[h].k_cache = kv[h].k_new = k.data() + size_t(h) * T * hd;
    kv[h].v_cache = kv[h].v_new = v.data() + size_t(h) * T * hd;
    kv[h].new_stride = kv[h].hd = hd;
  }
  SparseSettings sp;
  sp.local = 1024;
  struct Row { std::string name; std::vector<HeadMode> modes; };
  const auto F = HeadMode::Full, S = HeadMode::Streaming, X = HeadMode::XAttn;
  std::vector<Row> rows{{"full", {F, F, F, F}},          {"ssa", {S, S, S, S}},
                        {"xattn", {X, X, X, X}},         {"hybrid-ssa omega 0.5", {F, S, F, S}},
                        {"hybrid-ssa omega 0.75", {F, S, S, S}}, {"hybrid-xa omega 0.5", {F, X, F, X}}};
  std::printf("CPU attention prefill, T=%d, Hq=%d, Hkv=%d, hd=%d, block %d, sink %d, local %d, tau %.2f, %d threads\n\n",
              T, Hq, Hkv, hd, sp.block, sp.sink, sp.local, sp.xattn.tau, omp_get_max_threads());
  std::printf("| routing | ms (mean of %d) | min ms | attention FLOPs vs full | speed vs full |\n|---|---|---|---|---|\n", reps);
  double full_ms = 0;
  for (auto& r : rows) {
    std::vector<double> ms;
    AttentionStats st;
    for (int i = 0; i < reps; ++i) {
      AttentionArgs a;
      a.q = q.data();
      a.kv = kv.data();
      a.out = out.data();
      a.T = T;
      a.n_heads = Hq;
      a.n_kv_heads = Hkv;
      a.head_dim = hd;
      a.modes = r.modes.data();
      a.sparse = &sp;
      AttentionStats s1;
      a.stats = &s1;
      auto t0 = std::chrono::steady_clock::now();
      attention_forward(a);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      st = s1;
    }
    double mean = 0;
    for (double m : ms) mean += m / ms.size();
    if (r.name == "full") full_ms = mean;
    std::printf("| %s | %.1f | %.1f | %.3f | %.2fx |\n", r.name.c_str(), mean, *std::min_element(ms.begin(), ms.end()),
                st.flops_ratio(), full_ms / mean);
  }
  // The XAttention estimate alone (xattn_select, one query head against its KV head, the first layout above), the
  // part of the xattn row that full attention does not have.
  XAttnParams xp = sp.xattn;
  xp.block = sp.block;
  std::vector<float> qh(size_t(T) * hd);
  for (int t = 0; t < T; ++t) std::copy_n(q.data() + (size_t(t) * Hq) * hd, hd, qh.data() + size_t(t) * hd);
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    const BlockMask m = xattn_select(qh.data(), k.data(), T, hd, xp);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (m.n_blocks == 0) return 1;
  }
  std::printf("\nXAttention estimate alone (xattn_select, one head): min %.1f ms of %d\n",
              *std::min_element(ms.begin(), ms.end()), reps);
  return 0;
}
