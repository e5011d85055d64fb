#include "elastic/head_parallel.h"
#include "elastic/sparse_pattern.h"

#include <cmath>
#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace elastic {

double head_prefill_pairs(HeadMode m, int T, const SparseSettings& s, double xattn_keep) {
  const PatternPrefillCost c = pattern_prefill_cost(m, T, s);
  return std::isnan(c.pairs) ? xattn_keep * c.pairs_full : c.pairs;  // an estimator's pattern: the expected share
}

double HeadPlan::imbalance() const {
  if (load.empty()) return 1.0;
  const double mean = std::accumulate(load.begin(), load.end(), 0.0) / load.size();
  return mean > 0 ? *std::max_element(load.begin(), load.end()) / mean : 1.0;
}

std::vector<uint8_t> HeadPlan::mask(int layer, int rank) const {
  std::vector<uint8_t> m(n_kv_heads);
  for (int h = 0; h < n_kv_heads; ++h) m[h] = owner[size_t(layer) * n_kv_heads + h] == rank;
  return m;
}

HeadPlan plan_head_parallel(const RoutingTable& r, int T, int world, double xattn_keep) {
  if (world <= 0) throw std::invalid_argument("head-parallel plan: world must be positive");
  if (T <= 0) throw std::invalid_argument("head-parallel plan: T must be positive");
  if (r.mode.size() != size_t(r.n_layers) * r.n_kv_heads)
    throw std::invalid_argument("head-parallel plan: routing table has " + std::to_string(r.mode.size()) +
                                " modes for " + std::to_string(r.n_layers) + " x " + std::to_string(r.n_kv_heads));
  HeadPlan p;
  p.world = world;
  p.n_layers = r.n_layers;
  p.n_kv_heads = r.n_kv_heads;
  p.owner.assign(r.mode.size(), 0);
  p.load.assign(world, 0.0);
  std::vector<double> cost(n_sparse_patterns());
  for (size_t m = 0; m < cost.size(); ++m) cost[m] = head_prefill_pairs(static_cast<HeadMode>(m), T, r.sparse, xattn_keep);
  std::vector<int> order(r.n_kv_heads);
  for (int l = 0; l < r.n_layers; ++l) {
    std::iota(order.begin(), order.end(), 0);
    auto c = [&](int h) { return cost.at(static_cast<size_t>(r.at(l, h))); };
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return c(a) > c(b); });
    for (int h : order) {
      const int to = int(std::min_element(p.load.begin(), p.load.end()) - p.load.begin());
      p.owner[size_t(l) * r.n_kv_heads + h] = to;
      p.load[to] += c(h);
    }
  }
  return p;
}

void attention_forward_head_parallel(AttentionArgs a, const HeadPlan& plan, int layer, Communicator& comm) {
  if (comm.size() != plan.world)
    throw std::invalid_argument("head-parallel attention: plan for " + std::to_string(plan.world) + " ranks, " +
                                std::to_string(comm.size()) + " in the communicator");
  if (a.n_kv_heads != plan.n_kv_heads || layer < 0 || layer >= plan.n_layers)
    throw std::invalid_argument("head-parallel attention: layer or head count does not match the plan");
  const std::vector<uint8_t> mine = plan.mask(layer, comm.rank());
  const size_t n = size_t(a.T) * a.n_heads * a.head_dim;
  std::fill(a.out, a.out + n, 0.f);
  a.kv_heads = mine.data();
  attention_forward(a);
  comm.all_reduce_sum(a.out, n);
}

}  // namespace elastic
