// elastic logits: float32 logits [T, vocab] of a token-id prompt, under any routing.
#include <memory>

#include "cli_common.h"
#include "elastic/generate.h"
#include "elastic/npy.h"

namespace elastic::cli {

void add_logits_command(CLI::App& app, Commands& cmds) {
  struct Opts { std::string model, ids, out, routing, mode, router; int threads = 0, chunk = kDefaultPrefillChunk; };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("logits", "Write float32 logits [T, vocab] for int32 token ids");
  add_model_option(sub, o->model);
  sub->add_option("--ids", o->ids, "1-D int32 .npy of token ids")->required();
  sub->add_option("-o,--output", o->out, "Output .npy")->required();
  add_threads_option(sub, o->threads);
  add_routing_options(sub, o->routing, o->mode, o->router, o->chunk);
  cmds.push_back({sub, [o] {
    resolve_model(o->model, "logits");
    set_threads(o->threads);
    std::vector<int32_t> ids = read_npy_ids(o->ids);
    if (ids.empty()) throw std::runtime_error(o->ids + ": no token ids");
    Model m = Model::load(o->model);
    apply_routing(m, o->routing, o->mode, o->router);
    KVCache cache;
    cache.init(m.config, static_cast<int>(ids.size()));
    std::vector<float> logits;
    AttentionStats st;
    m.prefill(ids.data(), static_cast<int>(ids.size()), o->chunk, cache, logits, true, &st);
    print_metrics(cache.routing.n_layers ? cache.routing : m.routing, st);
    write_npy_f32(o->out, logits.data(), {static_cast<int64_t>(ids.size()), m.config.vocab});
  }});
}

}  // namespace elastic::cli
