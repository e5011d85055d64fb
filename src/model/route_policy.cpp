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
  check_estimator_chunk(ms.data(), ms.size(), chunk, router ? router->sparse().block : table.sparse.block);
}

}  // namespace elastic
