// Router-training speed on the GPU: one training sequence (forward with the router, backward to the router's
// parameters) of T tokens on a random-weight model of a named shape, per length. Prints a Markdown table: tokens/s
// of training, ms per sequence (mean and spread over repeats), the device memory peak, and what a 300-step run at
// batch 4 would take. Random weights are fine for speed: the kernels do the same work on any values.
//
//   bench_train_gpu [shape=qwen3-4b] [lengths=8192,32768,65536] [reps=3] [mode=ssa|xattn] [layers=0 (all)]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "elastic/cuda.h"
#include "elastic/gpu_model.h"
#include "elastic/gpu_train.h"
#include "elastic/model_shapes.h"
#include "train/router_step.h"

using namespace elastic;

namespace {

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) {
    int n = std::stoi(x);
    if (!x.empty() && (x.back() == 'k' || x.back() == 'K')) n *= 1024;
    v.push_back(n);
  }
  return v;
}

double peak_used_gib(size_t base_free) {
  size_t f = 0, t = 0;
  ELASTIC_CUDA_CHECK(cudaMemGetInfo(&f, &t));
  return double(base_free - f) / double(1ull << 30);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string shape = argc > 1 ? argv[1] : "qwen3-4b";
    const std::vector<int> lengths = parse_list(argc > 2 ? argv[2] : "8192,32768,65536");
    const int reps = argc > 3 ? std::max(1, std::atoi(argv[3])) : 3;
    const std::string mode = argc > 4 ? argv[4] : "ssa";
    const int layers = argc > 5 ? std::atoi(argv[5]) : 0;
    ModelConfig c = named_shape(shape);
    if (layers > 0) c.n_layers = layers;
    size_t free0 = 0, total = 0;
    ELASTIC_CUDA_CHECK(cudaMemGetInfo(&free0, &total));
    cuda::GpuOptions o;
    o.max_ctx = 64;
    o.graphs = false;
    auto g = cuda::GpuModel::random(c, o, 1);
    const int max_T = *std::max_element(lengths.begin(), lengths.end());
    std::fprintf(stderr, "bench_train_gpu: %s, %d layers, random bf16 weights, sparse branch %s\n", shape.c_str(),
                 c.n_layers, mode.c_str());
    auto factory = cuda::gpu_step_runner_factory(*g, max_T, true);
    const double static_gib = peak_used_gib(free0);

    RouterSpec spec;
    spec.n_layers = c.n_layers;
    spec.n_kv_heads = c.n_kv_heads;
    spec.head_dim = c.head_dim;
    spec.sparse_mode = mode == "xattn" ? HeadMode::XAttn : HeadMode::Streaming;
    spec.sparse.block = 128;
    spec.sparse.sink = 128;
    spec.sparse.local = 2048;
    spec.sparse.xattn.block = 128;
    Router r = Router::init(spec, 7);
    auto run = factory(spec, r.params.data());
    std::vector<float> grad(r.params.size());
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<double> u(1e-6, 1 - 1e-6);
    std::vector<double> noise(size_t(c.n_layers) * c.n_kv_heads);

    std::printf("| shape | layers | T | sparse | Omega (sample) | ms / sequence | train tok/s | fwd ms | bwd ms | "
                "device memory | 300 steps x batch 4 |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int T : lengths) {
      train::TrainSample s;
      s.ids.resize(T);
      for (auto& x : s.ids) x = int32_t(rng() % c.vocab);
      s.prompt_len = T - 64;  // a 64-token answer, as in QA-style training data
      std::vector<double> ms, fms, bms;
      double omega = 0;
      for (int i = 0; i <= reps; ++i) {  // i == 0 warms up (cuBLASLt plans, first-touch allocations)
        for (double& z : noise) z = std::log(u(rng)) - std::log1p(-u(rng));
        train::GateSettings gs;
        gs.tau = 1.0;
        gs.noise = &noise;
        ELASTIC_CUDA_CHECK(cudaDeviceSynchronize());
        const auto t0 = std::chrono::steady_clock::now();
        const auto res = run->forward(s, gs);
        ELASTIC_CUDA_CHECK(cudaDeviceSynchronize());
        const auto t1 = std::chrono::steady_clock::now();
        run->backward(1.f, 0.1f, grad.data());
        ELASTIC_CUDA_CHECK(cudaDeviceSynchronize());
        const auto t2 = std::chrono::steady_clock::now();
        if (i == 0) continue;
        omega = res.omega();
        fms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        bms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
        ms.push_back(fms.back() + bms.back());
      }
      double mean = 0, sd = 0, fm = 0, bm = 0;
      for (size_t i = 0; i < ms.size(); ++i) mean += ms[i] / ms.size(), fm += fms[i] / ms.size(), bm += bms[i] / ms.size();
      for (double x : ms) sd += (x - mean) * (x - mean);
      sd = ms.size() > 1 ? std::sqrt(sd / (ms.size() - 1)) : 0;
      const double run_h = mean * 300 * 4 / 1000.0 / 3600.0;
      std::printf("| %s | %d | %d | %s | %.2f | %.0f ± %.0f | %.0f | %.0f | %.0f | %.1f GiB | %.2f h |\n",
                  shape.c_str(), c.n_layers, T, mode.c_str(), omega, mean, sd, T / (mean / 1000.0), fm, bm,
                  static_gib, run_h);
      std::fflush(stdout);
    }
    std::fprintf(stderr, "device memory: %.1f GiB held by the model and the trainer's buffers (plan sized for T = %d) "
                 "of %.1f GiB\n", static_gib, max_T, total / double(1ull << 30));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_train_gpu: %s\n", e.what());
    return 1;
  }
}
