#pragma once
// How a run decides each sequence's routing: one fixed table (all heads full unless given), or a prompt router that
// decides per sequence, layer by layer, at its prefill. The policy belongs to the run (generate, logits, an eval
// method, the server); the routing a sequence runs under is decided at its prefill and lives with that sequence's KV
// state (KVCache::routing on the CPU, the GPU model's per-sequence pages), so a decode step, an extend and the figures
// all read it from there. Nothing else holds routing state: the model is weights and shapes only.
#include <memory>
#include <string>

#include "elastic/model.h"

namespace elastic {

struct RoutePolicy {
  RoutingTable table;                          // the routing of every sequence when there is no router
  std::shared_ptr<const PromptRouter> router;  // when set: decides each prompt's routing at its prefill

  // Every head full (the default of every tool).
  static RoutePolicy all_full(const ModelConfig& c);
  static RoutePolicy fixed(RoutingTable t);
  static RoutePolicy routed(std::shared_ptr<const PromptRouter> r);

  // The table a prefill runs under, or nullptr when the router decides or the table is empty (every backend then
  // runs all full): the form the backends take.
  const RoutingTable* fixed_table() const { return router || table.n_layers == 0 ? nullptr : &table; }
  const PromptRouter* prompt_router() const { return router.get(); }
  // "router" or "fixed routing, Omega_MSR 0.700" (logs and the server's banner).
  std::string describe() const;
  // Throws std::invalid_argument when a head this policy may route to a pattern with an estimator (XAttention)
  // would prefill in chunks of `chunk` tokens that are not whole blocks: the estimator selects blocks for chunks that
  // start on a block, so both backends refuse such a prefill (model.cpp, gpu_model.cpp). A server checks at start-up,
  // where a request would otherwise fail mid-prefill with a 500.
  void check_chunk(int chunk) const;
};

}  // namespace elastic
