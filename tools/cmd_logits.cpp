// elastic logits: float32 logits [T, vocab] of a token-id prompt, under any routing.
#include <memory>

#include "cli_common.h"
#include "elastic/generate.h"
#include "elastic/npy.h"
#ifdef ELASTIC_HAVE_CUDA
#include "elastic/gpu_model.h"
#endif

namespace elastic::cli {

void add_logits_command(CLI::App& app, Commands& cmds) {
  struct Opts {
    std::string model, ids, out, routing, mode, router, device = "cpu";
    int threads = 0, chunk = kDefaultPrefillChunk;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("logits", "Write float32 logits [T, vocab] for int32 token ids");
  add_model_option(sub, o->model);
  sub->add_option("--ids", o->ids, "1-D int32 .npy of token ids")->required();
  sub->add_option("-o,--output", o->out, "Output .npy")->required();
  add_threads_option(sub, o->threads);
  add_routing_options(sub, o->routing, o->mode, o->router, o->chunk);
  // cuda: the bf16 GPU backend's logits (widened to fp32), to compare with transformers' bf16 outputs.
  sub->add_option("--device", o->device, "cpu, or cuda (bf16 GPU backend)")->check(CLI::IsMember({"cpu", "cuda"}));
  cmds.push_back({sub, [o] {
    resolve_model(o->model, "logits");
    set_threads(o->threads);
    std::vector<int32_t> ids = read_npy_ids(o->ids);
    if (ids.empty()) throw std::runtime_error(o->ids + ": no token ids");
    Model m = Model::load(o->model);
    const RoutePolicy policy = route_policy(m.config, o->routing, o->mode, o->router);
    const int T = static_cast<int>(ids.size());
    check_within_context(m.config, T, o->ids + ": a prompt of " + std::to_string(T) + " ids");
    std::vector<float> logits;
    if (o->device == "cuda") {
#ifdef ELASTIC_HAVE_CUDA
      cuda::GpuOptions go;
      go.max_ctx = T;
      go.chunk = o->chunk;
      auto g = cuda::GpuModel::upload(m, go);
      std::fprintf(stderr, "%s\n", g->plan().describe().c_str());
      g->prefill(ids.data(), T, policy.fixed_table(), policy.prompt_router(), &logits, true);
      // The same figures the CPU prints, from the routing the prompt got (XAttention heads: NaN, input-dependent).
      print_metrics(g->routing(), routed_prefill_stats(g->routing(), T), T);
#else
      no_cuda_backend("logits");
#endif
    } else {
      KVCache cache;
      const PromptRouter* r = init_sequence_cache(m.config, T, policy.fixed_table(), policy.prompt_router(), cache);
      AttentionStats st;
      m.prefill(ids.data(), T, o->chunk, cache, logits, true, &st, r);
      print_metrics(cache.routing, st, T);
    }
    write_npy_f32(o->out, logits.data(), {static_cast<int64_t>(T), m.config.vocab});
  }});
}

}  // namespace elastic::cli
