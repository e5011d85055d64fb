// HTTP side of the server: endpoint handlers on cpp-httplib, streaming (SSE), disconnect detection, lifecycle.
#include <httplib.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <random>

#include "elastic/server.h"
#include "server/server_internal.h"

namespace fs = std::filesystem;

namespace elastic {

using namespace server;

namespace {
// httplib 0.11 listens with a backlog of 5: a burst of clients connecting at once overflows it and their
// connects stall in SYN retries. Access to the listening socket lets bind() raise the backlog.
struct HttpServer : httplib::Server {
  socket_t listening_socket() const { return svr_sock_; }
};
}  // namespace

struct Server::Impl {
  ServerOptions opts;
  Model model;
  std::unique_ptr<Tokenizer> tok;
  ChatTemplate tmpl;
  std::string name;
  int ctx = 0;
  Metrics metrics;
  std::unique_ptr<Scheduler> sched;
  HttpServer http;
  int bound_port = -1;
  std::thread th;
  std::atomic<uint64_t> next_id{1};
  long started_at = std::time(nullptr);

  Impl(Model m, const std::string& dir, ServerOptions o);
  void routes();
  const Tokenizer& need_tok(const std::string& param) const;
  void generate(const httplib::Request& req, httplib::Response& res, bool chat);
};

namespace {

void send_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(dump(j), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.status, error_json(e)); }

// Runs a handler; ApiError -> its status, anything else -> 500 with the message.
template <class F>
void guarded(httplib::Response& res, F&& f) {
  try {
    f();
  } catch (const ApiError& e) {
    send_error(res, e);
  } catch (const std::exception& e) {
    send_error(res, ApiError(500, e.what(), "", "internal_error", "server_error"));
  }
}

std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

}  // namespace

Server::Impl::Impl(Model m, const std::string& dir, ServerOptions o) : opts(std::move(o)), model(std::move(m)) {
  const fs::path d(dir);
  name = !opts.model_name.empty() ? opts.model_name : d.filename().empty() ? d.parent_path().filename().string()
                                                                            : d.filename().string();
  std::string tp = opts.tokenizer_path;
  if (tp.empty() && fs::exists(d / "tokenizer.json")) tp = (d / "tokenizer.json").string();
  if (!tp.empty()) tok = std::make_unique<Tokenizer>(Tokenizer::from_file(tp));
  tmpl = ChatTemplate::from_model_dir(dir);
  ctx = opts.max_context > 0 ? opts.max_context : model.config.max_positions;
  if (ctx < 2) throw std::runtime_error("server: the context must hold at least 2 tokens, got " + std::to_string(ctx));
  if (opts.max_body_bytes < 64) throw std::runtime_error("server: max body bytes must be >= 64");
  std::vector<int32_t> eos = model.config.eos_ids;
  // Chat models end a turn with tokenizer_config's eos_token (e.g. <|im_end|>), which config.json may not list.
  if (tok && !tmpl.eos_token().empty())
    if (int32_t id = tok->token_id(tmpl.eos_token()); id >= 0 && id < model.config.vocab &&
                                                       std::find(eos.begin(), eos.end(), id) == eos.end())
      eos.push_back(id);
  if (opts.backend) {
    if (opts.max_slots != 1)
      throw std::runtime_error("server: the " + opts.backend->name() +
                               " backend runs one request at a time: max slots must be 1, got " +
                               std::to_string(opts.max_slots));
    if (ctx > opts.backend->capacity())
      throw std::runtime_error("server: the context of " + std::to_string(ctx) + " tokens exceeds the " +
                               opts.backend->name() + " backend's capacity of " +
                               std::to_string(opts.backend->capacity()));
  }
  SchedulerOptions so;
  so.backend = opts.backend;
  so.max_slots = opts.max_slots;
  so.kv_budget_bytes = opts.kv_budget_bytes;
  so.threads = opts.threads;
  so.log = opts.log_requests;
  sched = std::make_unique<Scheduler>(model, tok.get(), eos, so, metrics);
  routes();
}

const Tokenizer& Server::Impl::need_tok(const std::string& param) const {
  if (!tok)
    throw ApiError(400, "the model folder has no tokenizer.json: send 'prompt' as a list of token ids", param,
                   "no_tokenizer");
  return *tok;
}

void Server::Impl::generate(const httplib::Request& req, httplib::Response& res, bool chat) {
  const json body = parse_json_body(req.body);
  GenSpec spec = chat ? parse_chat_request(body) : parse_completion_request(body);
  if (!spec.model.empty() && spec.model != name)
    throw ApiError(404, "the model '" + spec.model + "' does not exist (this server serves '" + name + "')", "model",
                   "model_not_found");
  std::vector<int32_t> prompt;
  if (chat) {
    std::string text;
    try {
      text = tmpl.apply(spec.messages, true);
    } catch (const ChatTemplateError& e) {
      throw ApiError(400, e.what(), "messages", "chat_template_unavailable");
    }
    prompt = need_tok("messages").encode(text);
  } else if (spec.prompt_is_ids) {
    prompt = spec.prompt_ids;
    for (int32_t id : prompt)
      if (id >= model.config.vocab)
        throw ApiError(400, "token id " + std::to_string(id) + " in 'prompt' is outside the vocabulary [0, " +
                                std::to_string(model.config.vocab) + ")", "prompt", "invalid_value");
  } else {
    prompt = need_tok("prompt").encode(spec.prompt_text);
  }
  if (prompt.empty()) throw ApiError(400, "the prompt is empty", chat ? "messages" : "prompt", "invalid_value");
  const int n = static_cast<int>(prompt.size());
  if (n >= ctx)
    throw ApiError(400, "the prompt has " + std::to_string(n) + " tokens; this server's context is " +
                            std::to_string(ctx) + " tokens (prompt + max_tokens)",
                   chat ? "messages" : "prompt", "context_length_exceeded");
  const int max_tokens = spec.max_tokens < 0 ? ctx - n : spec.max_tokens;
  if (n + max_tokens > ctx)
    throw ApiError(400, "prompt (" + std::to_string(n) + " tokens) + max_tokens (" + std::to_string(max_tokens) +
                            ") exceeds this server's context of " + std::to_string(ctx) + " tokens",
                   "max_tokens", "context_length_exceeded");

  auto job = std::make_shared<Job>();
  const ModelConfig& c = model.config;
  if (opts.route) {
    try {
      job->routing = opts.route(prompt);
    } catch (const std::exception& e) {
      throw ApiError(500, std::string("router failed: ") + e.what(), "", "router_error", "server_error");
    }
  } else if (model.router) {
    job->use_router = true;  // decided layer by layer in prefill; reserve the all-full size until then
    job->routing = RoutingTable::all_full(c.n_layers, c.n_kv_heads);
  } else {
    job->routing = model.routing;
  }
  if (job->routing.n_layers != c.n_layers || job->routing.n_kv_heads != c.n_kv_heads ||
      job->routing.mode.size() != static_cast<size_t>(c.n_layers) * c.n_kv_heads)
    throw ApiError(500, "router returned a " + std::to_string(job->routing.n_layers) + " x " +
                            std::to_string(job->routing.n_kv_heads) + " routing for a model with " +
                            std::to_string(c.n_layers) + " layers x " + std::to_string(c.n_kv_heads) + " KV heads",
                   "", "router_error", "server_error");
  job->prompt = std::move(prompt);
  job->max_tokens = max_tokens;
  job->sampler = spec.sampler;
  if (!spec.seed_given) job->sampler.seed = std::random_device{}();
  job->stop = spec.stop;
  job->stop_at_eos = !spec.ignore_eos;
  job->capacity = n + max_tokens;
  job->kv_bytes = kv_cache_bytes_for(c, job->capacity, job->routing);
  sched->submit(job);

  const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++);
  const long created = std::time(nullptr);
  const std::string model_name = name;
  // Both modes answer through a content provider: while the request waits or runs, the provider polls the
  // connection and a client that went away cancels its request (its slot and KV memory are freed).
  auto on_release = [job](bool success) {
    if (!success) job->cancelled = true;
  };
  if (!spec.stream) {
    res.set_chunked_content_provider(
        "application/json",
        [job, id, created, model_name, chat](size_t, httplib::DataSink& sink) {
          std::string text;
          for (;;) {
            Job::Taken t = job->take(std::chrono::milliseconds(50));
            text += t.text;
            if (t.done) break;
            if (!sink.is_writable()) {
              job->cancelled = true;
              return false;
            }
          }
          std::string out;
          {
            std::lock_guard g(job->mu);
            out = job->error.empty()
                      ? dump(completion_json(id, created, model_name, chat, text, job->finish_reason, job->summary))
                      : dump(error_json(job->error, "server_error", "", "generation_failed"));
          }
          if (!sink.write(out.data(), out.size())) return false;
          sink.done();
          return true;
        },
        on_release);
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, id, created, model_name, chat](size_t, httplib::DataSink& sink) {
        auto write = [&](const std::string& s) {
          if (sink.write(s.data(), s.size())) return true;
          job->cancelled = true;
          return false;
        };
        if (chat && !write(sse(chunk_json(id, created, model_name, true, "", true, nullptr, nullptr)))) return false;
        for (;;) {
          Job::Taken t = job->take(std::chrono::milliseconds(50));
          if (!t.text.empty() && !write(sse(chunk_json(id, created, model_name, chat, t.text, false, nullptr, nullptr))))
            return false;
          if (t.done) break;
          if (!sink.is_writable()) {
            job->cancelled = true;
            return false;
          }
        }
        std::string fin, err;
        JobSummary s;
        {
          std::lock_guard g(job->mu);
          fin = job->finish_reason;
          err = job->error;
          s = job->summary;
        }
        if (!err.empty()) {
          if (!write(sse(error_json(err, "server_error", "", "generation_failed")))) return false;
        } else if (!write(sse(chunk_json(id, created, model_name, chat, "", false, &fin, &s)))) {
          return false;
        }
        if (!write("data: [DONE]\n\n")) return false;
        sink.done();
        return true;
      },
      on_release);
}

void Server::Impl::routes() {
  const int pool = opts.http_threads > 0 ? opts.http_threads : opts.max_slots + 16;
  http.new_task_queue = [pool] { return new httplib::ThreadPool(pool); };
  http.set_payload_max_length(opts.max_body_bytes);
  // httplib's default sets SO_REUSEPORT, which lets a second server bind the same port and take half the
  // connections; SO_REUSEADDR alone keeps restarts quick and makes a taken port an error.
  http.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  http.set_keep_alive_timeout(5);
  http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
    {
      // Counted here, before the response is written (the logger runs after), so clients see it in /metrics.
      std::lock_guard g(metrics.mu);
      if (res.status >= 500) ++metrics.http_5xx;
      else ++metrics.http_4xx;
    }
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // a handler's own error object
    std::string msg = "HTTP " + std::to_string(res.status);
    std::string code = "http_error";
    if (res.status == 404) msg = "no such endpoint: " + req.method + " " + req.path, code = "not_found";
    if (res.status == 413)
      msg = "request body exceeds " + std::to_string(opts.max_body_bytes) + " bytes", code = "payload_too_large";
    if (res.status == 400) msg = "malformed HTTP request", code = "bad_request";
    res.set_content(dump(error_json(msg, res.status >= 500 ? "server_error" : "invalid_request_error", "", code)),
                    "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "unknown error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {
    }
    send_error(res, ApiError(500, msg, "", "internal_error", "server_error"));
  });
  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    // Generation requests that were accepted get their line from the scheduler when they finish.
    const bool generation = req.path == "/v1/completions" || req.path == "/v1/chat/completions";
    if (opts.log_requests && !(generation && res.status == 200))
      std::fprintf(stderr, "http: %s %s %d (%s:%d)\n", req.method.c_str(), req.path.c_str(), res.status,
                   req.remote_addr.c_str(), req.remote_port);
  });

  http.Get("/health", [](const httplib::Request&, httplib::Response& res) { send_json(res, 200, {{"status", "ok"}}); });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200,
              {{"object", "list"},
               {"data", json::array({{{"id", name},
                                      {"object", "model"},
                                      {"created", started_at},
                                      {"owned_by", "elastic"},
                                      {"max_model_len", ctx}}})}});
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.render(), "text/plain; version=0.0.4");
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { generate(req, res, false); });
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { generate(req, res, true); });
  });
  http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] {
      const json b = parse_json_body(req.body);
      std::vector<int32_t> ids;
      if (b.contains("messages")) {
        GenSpec s = parse_chat_request(b);
        const auto ag = b.find("add_generation_prompt");
        if (ag != b.end() && !ag->is_boolean())
          throw ApiError(400, "'add_generation_prompt' must be a boolean", "add_generation_prompt", "invalid_type");
        const bool add_gen = ag == b.end() || ag->get<bool>();
        try {
          ids = need_tok("messages").encode(tmpl.apply(s.messages, add_gen));
        } catch (const ChatTemplateError& e) {
          throw ApiError(400, e.what(), "messages", "chat_template_unavailable");
        }
      } else {
        auto it = b.find("prompt");
        if (it == b.end()) throw ApiError(400, "missing required field 'prompt' (or 'messages')", "prompt", "missing_field");
        if (!it->is_string())
          throw ApiError(400, std::string("'prompt' must be a string, got ") + it->type_name(), "prompt", "invalid_type");
        ids = need_tok("prompt").encode(it->get<std::string>());
      }
      send_json(res, 200, {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", ctx}});
    });
  });
  http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] {
      const json b = parse_json_body(req.body);
      auto it = b.find("tokens");
      if (it == b.end()) throw ApiError(400, "missing required field 'tokens'", "tokens", "missing_field");
      if (!it->is_array()) throw ApiError(400, "'tokens' must be a list of token ids", "tokens", "invalid_type");
      std::vector<int32_t> ids;
      for (const json& e : *it) {
        if (!e.is_number_integer()) throw ApiError(400, "'tokens' must be a list of integers", "tokens", "invalid_type");
        const long long v = e.get<long long>();
        if (v < 0 || v >= model.config.vocab)
          throw ApiError(400, "token id " + e.dump() + " is outside the vocabulary [0, " +
                                  std::to_string(model.config.vocab) + ")", "tokens", "invalid_value");
        ids.push_back(static_cast<int32_t>(v));
      }
      send_json(res, 200, {{"prompt", need_tok("tokens").decode(ids)}});
    });
  });
}

Server::Server(const std::string& model_dir, ServerOptions opts)
    : Server(Model::load(model_dir), model_dir, std::move(opts)) {}

Server::Server(Model model, const std::string& model_dir, ServerOptions opts)
    : impl_(std::make_unique<Impl>(std::move(model), model_dir, std::move(opts))) {}

Server::~Server() { stop(); }

int Server::bind() {
  if (impl_->bound_port > 0) return impl_->bound_port;
  const ServerOptions& o = impl_->opts;
  int p = -1;
  if (o.port == 0) p = impl_->http.bind_to_any_port(o.host);
  else if (impl_->http.bind_to_port(o.host, o.port)) p = o.port;
  if (p <= 0) throw std::runtime_error("server: cannot listen on " + o.host + ":" + std::to_string(o.port));
  ::listen(impl_->http.listening_socket(), SOMAXCONN);  // same socket, longer accept queue
  return impl_->bound_port = p;
}

void Server::serve() {
  bind();
  impl_->http.listen_after_bind();
}

void Server::start() {
  bind();
  impl_->th = std::thread([this] { impl_->http.listen_after_bind(); });
  for (int i = 0; !impl_->http.is_running(); ++i) {
    if (i == 5000) throw std::runtime_error("server: did not start listening within 5 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void Server::stop() {
  if (!impl_) return;
  impl_->sched->stop();  // fails waiting / running requests so no HTTP worker stays blocked on one
  impl_->http.stop();
  if (impl_->th.joinable()) impl_->th.join();
}

int Server::port() const { return impl_->bound_port; }
const Model& Server::model() const { return impl_->model; }

}  // namespace elastic
