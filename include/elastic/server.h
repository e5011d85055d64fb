#pragma once
// OpenAI-compatible HTTP server (cpp-httplib): /v1/completions, /v1/chat/completions (SSE streaming), /v1/models,
// /tokenize, /detokenize, /health, /metrics. Each request is routed by its own prompt; its KV cache is the hybrid
// cache of that routing; decode steps of all running requests are batched (decode_batch).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "elastic/batch_backend.h"
#include "elastic/model.h"
#include "elastic/route_policy.h"
#include "elastic/sequence_backend.h"

namespace elastic {

// Bounds of the options below, checked when the server is built (and by `serve`'s flags).
constexpr size_t kServerMaxBodyBytes = size_t(1) << 30;
// httplib handles a request on a socket past FD_SETSIZE (1024) with select(), i.e. not at all: more connections
// than that could not be answered anyway.
constexpr int kServerMaxConnections = 1000;
constexpr double kServerMaxTimeoutSeconds = 3600;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                 // 0 = any free port (see Server::port)
  std::string model_name;          // "id" in /v1/models and responses; default: the model folder's name
  int max_slots = 4;               // requests decoding at once; more wait in a FIFO queue
  int max_queue = 64;              // requests waiting for a slot; one more is answered 429 with Retry-After
  // Prefill chunk (tokens): between two decode steps the engine runs at most one chunk's worth of a newcomer's
  // prefill, so running requests stall by that much at most. A multiple of the sparse block for XAttention heads.
  int prefill_chunk = 2048;
  size_t kv_budget_bytes = size_t(1) << 30;  // KV-cache bytes of all running requests together
  size_t max_body_bytes = size_t(1) << 20;   // larger request bodies get 413, chunked ones included
  // Open client connections (idle keep-alive, request arriving, being answered). At the cap a new connection closes
  // the one that has waited longest for its request; slow or silent clients never hold an HTTP worker.
  int max_connections = 512;
  double header_timeout_s = 10;  // a request's whole head (request line + headers) within this, else 408
  double body_timeout_s = 30;    // its whole body within this after the head, else 408
  // Chat: special-token text in message content (e.g. "<|im_start|>") becomes control tokens, as before; by
  // default it is tokenized as text, so a user cannot open a system turn.
  bool allow_special_in_content = false;
  int max_context = 0;             // prompt + max_tokens per request; 0 = the model's max_position_embeddings
  // How each request is routed: policy.router decides in prefill when set, else every request runs under
  // policy.table (every head full when the table is empty). `route`, when set, takes precedence: a routing of one
  // request from its prompt ids.
  RoutePolicy policy;
  std::function<RoutingTable(const std::vector<int32_t>& prompt)> route;
  int threads = 0;                 // OpenMP threads of the engine; 0 = the runtime default
  int http_threads = 0;            // HTTP workers for POST requests; 0 = max_slots + 16 (GETs have 2 of their own)
  std::string tokenizer_path;      // default: model_tokenizer_path(model_dir): a GGUF file itself, else tokenizer.json
  bool log_requests = false;       // one line per request to stderr
  // When set, requests run on this backend one at a time (single_slot_backend) instead of on the CPU model in
  // batches: max_slots must be 1 and max_context at most the backend's capacity. The model still supplies the config;
  // `policy` the routing. (`serve --device cuda` uses batch_backend, below: the GPU model's slots.)
  std::shared_ptr<SequenceBackend> backend;
  // When set (and `backend` is not), requests run on this batch backend's slots instead of the CPU model's own
  // (cpu_batch_backend); max_slots must not exceed its slots. The model still supplies the config; `policy` the routing.
  std::shared_ptr<BatchBackend> batch_backend;
};


class Server {
 public:
  // Loads the model, tokenizer.json (if any) and tokenizer_config.json's chat template. Throws naming the problem.
  Server(const std::string& model_dir, ServerOptions opts);
  // Serves an already loaded model (e.g. with --routing applied); tokenizer_path / model_dir as above.
  Server(Model model, const std::string& model_dir, ServerOptions opts);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port (port 0 = a free port) and returns the bound port. Throws when the address cannot be bound.
  int bind();
  void serve();  // blocks until stop(); binds first if bind() was not called
  void start();  // serve() on a background thread; returns once listening
  void stop();   // stops accepting, cancels running requests, joins the engine
  int port() const;
  const Model& model() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace elastic
