// RoutePolicy: the run's rule for routing each sequence (include/elastic/route_policy.h).
#include "elastic/route_policy.h"

#include <cstdio>
#include <stdexcept>
#include <string>

#include "elastic/sparse_pattern.h"

namespace elastic {

RoutePolicy RoutePolicy::all_full(const ModelConfig& c) { return fixed(RoutingTable::all_full(c.n_layers, c.n_kv_heads)); }

RoutePolicy RoutePolicy::fixed(RoutingTable t) {
  RoutePolicy p;
  p.table = std::move(t);
  return p;
}

RoutePolicy RoutePolicy::routed(std::shared_ptr<const PromptRouter> r) {
  if (!r) throw std::invalid_argument("RoutePolicy::routed: null router");
  RoutePolicy p;
  p.router = std::move(r);
  return p;
}

std::string RoutePolicy::describe() const {
  if (router) return "router";
  char b[64];
  std::snprintf(b, sizeof b, "fixed routing, Omega_MSR %.3f", table.msr());
  return b;
}

void RoutePolicy::check_chunk(int chunk) const {
  const std::vector<HeadMode> ms = router ? router->modes() : table.mode;
  const int block = router ? router->sparse().block : table.sparse.block;
  if (chunk <= 0 || block <= 0 || chunk % block == 0) return;
  for (HeadMode m : ms)
    if (sparse_pattern(m).select)
      throw std::invalid_argument(std::string(head_mode_name(m)) + " heads need a prefill chunk that is a multiple of "
                                  "the block (" + std::to_string(chunk) + " vs " + std::to_string(block) + ")");
}

}  // namespace elastic
