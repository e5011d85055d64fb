// elastic serve: the OpenAI-compatible HTTP server (see docs/SERVER.md).
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "cli_common.h"
#include "elastic/model_shapes.h"
#include "elastic/sparse_pattern.h"
#include "elastic/router.h"
#include "elastic/server.h"
#ifdef ELASTIC_HAVE_CUDA
#include "elastic/gpu_model.h"
#endif

namespace elastic::cli {

void add_serve_command(CLI::App& app, Commands& cmds) {
  struct Opts {
    std::string model, host = "127.0.0.1", tok, routing, mode, name, router, device = "cpu", shape;
    int port = 8080, ctx = 0, threads = 0, parallel = 4;
    double kv_mib = 1024, body_mib = 1;
    int max_conns = ServerOptions{}.max_connections;
    double header_s = ServerOptions{}.header_timeout_s, body_s = ServerOptions{}.body_timeout_s;
    bool quiet = false, special_in_content = false;
    int max_queue = ServerOptions{}.max_queue;
    int chunk = ServerOptions{}.prefill_chunk;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("serve", "OpenAI-compatible HTTP server with per-request routing");
  add_model_option(sub, o->model);
  sub->add_option("--shape", o->shape,
                  "cuda only, instead of -m: random bf16 weights of a named shape (throughput runs: prompts are token "
                  "ids, no tokenizer)")
      ->check(CLI::IsMember(named_shape_names()));
  sub->add_option("--host", o->host, "Address to listen on");
  sub->add_option("--port", o->port, "Port (0 = any free port)")->check(CLI::Range(0, 65535));
  sub->add_option("-c,--ctx-size", o->ctx, "Max prompt + max_tokens per request (default: the model's)")
      ->check(CLI::Range(0, kMaxTokens));
  add_threads_option(sub, o->threads);
  sub->add_option("--parallel", o->parallel, "Requests decoded together (slots)")->check(CLI::Range(1, 1024));
  sub->add_option("--max-queue", o->max_queue, "Requests waiting for a slot; one more gets 429 with Retry-After")
      ->check(CLI::Range(0, 1 << 20));
  sub->add_option("--chunk", o->chunk,
                  "Prefill chunk in tokens: running requests wait for at most one chunk of a newcomer's prefill")
      ->check(CLI::Range(1, 1 << 20));
  // Lower bounds the server can honour (they were clamped without a word: 1e-9 MiB became a 1-byte budget).
  sub->add_option("--kv-budget-mib", o->kv_mib, "KV-cache memory of all running requests, MiB (at least 1)")
      ->check(in_range(1, 1 << 24));
  sub->add_option("--max-body-mib", o->body_mib, "Largest request body (chunked ones included), MiB (at least 1/1024)")
      ->check(in_range(1.0 / 1024, double(kServerMaxBodyBytes >> 20)));
  sub->add_option("--max-connections", o->max_conns,
                  "Open client connections; at the cap the one waiting longest for its request is closed")
      ->check(CLI::Range(1, kServerMaxConnections));
  sub->add_option("--header-timeout", o->header_s, "Seconds for a request's whole head to arrive (else 408)")
      ->check(positive_up_to(kServerMaxTimeoutSeconds));
  sub->add_option("--body-timeout", o->body_s, "Seconds for a request's whole body to arrive after its head (else 408)")
      ->check(positive_up_to(kServerMaxTimeoutSeconds));
  sub->add_flag("--allow-special-in-content", o->special_in_content,
                "Chat: special-token text in message content becomes control tokens (default: plain text)");
  sub->add_option("--tokenizer", o->tok, "tokenizer.json (default: the model folder's)");
  sub->add_option("--name", o->name, "Model id in the API (default: the model folder's name)");
  sub->add_option("--routing", o->routing, "Routing JSON: mode per layer per KV head plus sparse settings");
  sub->add_option("--mode", o->mode, "Route every head to one mode")->check(CLI::IsMember(sparse_pattern_names()));
  sub->add_option("--router", o->router,
                  "Trained router (safetensors): routes each request from its own prompt at prefill");
  sub->add_flag("-q,--quiet", o->quiet, "No per-request lines on stderr");
  sub->add_option("--device", o->device,
                  "cpu (the fp32 model) or cuda (the bf16 GPU model); either decodes its --parallel requests together")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  auto* budget_opt = sub->get_option("--kv-budget-mib");
  cmds.push_back({sub, [o, budget_opt] {
    const bool gpu = o->device == "cuda";
    if (!o->shape.empty() && (!gpu || !o->model.empty()))
      throw std::runtime_error("serve: --shape (random weights) needs --device cuda and no -m");
    if (o->shape.empty()) resolve_model(o->model, "serve");
#ifndef ELASTIC_HAVE_CUDA
    if (gpu) no_cuda_backend("serve");
#else
    if (gpu && o->parallel > cuda::kMaxGpuSlots)  // before loading anything
      throw std::runtime_error("serve: --parallel " + std::to_string(o->parallel) + " is more than the GPU model's " +
                               std::to_string(cuda::kMaxGpuSlots) + " slots");
#endif
    Model m;
    if (o->shape.empty()) m = Model::load(o->model);
    else m.config = named_shape(o->shape);  // the weights are made on the device
    if (!o->router.empty() && (!o->routing.empty() || !o->mode.empty()))
      throw std::runtime_error("serve: give --router or --routing/--mode, not both");
    ServerOptions so;
    so.policy = route_policy(m.config, o->routing, o->mode, o->router);
    so.host = o->host;
    so.port = o->port;
    so.model_name = o->name;
    so.max_slots = o->parallel;
    so.max_queue = o->max_queue;
    so.prefill_chunk = o->chunk;
    try {
      so.policy.check_chunk(o->chunk);
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error("--chunk " + std::to_string(o->chunk) + ": " + e.what());
    }
    so.kv_budget_bytes = static_cast<size_t>(o->kv_mib * 1048576.0);  // at least 1 MiB and 1 KiB: the flags' ranges
    so.max_body_bytes = static_cast<size_t>(o->body_mib * 1048576.0);
    so.max_connections = o->max_conns;
    so.header_timeout_s = o->header_s;
    so.body_timeout_s = o->body_s;
    so.allow_special_in_content = o->special_in_content;
    so.max_context = o->ctx;
    so.threads = o->threads;
    so.tokenizer_path = o->tok;
    so.log_requests = !o->quiet;
#ifdef ELASTIC_HAVE_CUDA
    std::unique_ptr<cuda::GpuModel> g;  // outlives the server: serve() returns only when it stops
    if (gpu) {
      cuda::GpuOptions go;
      go.max_ctx = o->ctx > 0 ? o->ctx : m.config.max_positions;
      go.slots = o->parallel;
      go.chunk = o->chunk;
      go.batch_invariant = true;  // a request answers what it would alone, at any --parallel (docs/SERVER.md)
      // The page pool is the KV budget: --kv-budget-mib when given, else every slot's heads full at -c.
      if (budget_opt->count()) go.kv_pool_bytes = so.kv_budget_bytes;
      g = o->shape.empty() ? cuda::GpuModel::upload(m, go) : cuda::GpuModel::random(m.config, go, 1);
      std::fprintf(stderr, "%s\n", g->plan().describe().c_str());
      so.batch_backend = cuda::gpu_batch_backend(*g);
      so.kv_budget_bytes = g->kv_pool_bytes();
      so.max_context = go.max_ctx;
    }
#endif
    const std::string routing_desc = so.policy.router ? "per-request router " + o->router : so.policy.describe();
    Server srv(std::move(m), o->shape.empty() ? o->model : "random-" + o->shape, so);
    const int port = srv.bind();
    std::fprintf(stderr, "elastic serve: listening on http://%s:%d (%s, %d slots, KV budget %.0f MiB, %s)\n",
                 o->host.c_str(), port, gpu ? "cuda" : "cpu", o->parallel, so.kv_budget_bytes / 1048576.0,
                 routing_desc.c_str());
    srv.serve();
  }});
}

}  // namespace elastic::cli
