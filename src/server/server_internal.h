#pragma once
// Pieces of the server shared by its .cpp files (not a public header): request validation and response objects
// (openai_json.cpp), the batching scheduler (scheduler.cpp), Prometheus counters (metrics.cpp).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "elastic/batch_backend.h"
#include "elastic/chat_template.h"
#include "elastic/generate.h"
#include "elastic/model.h"
#include "elastic/server.h"
#include "elastic/tokenizer.h"

namespace elastic::server {

using nlohmann::json;

// An error answered with an OpenAI-style {"error": {"message", "type", "param", "code"}}.
struct ApiError : std::runtime_error {
  int status;
  std::string type, param, code;
  ApiError(int status, std::string message, std::string param = "", std::string code = "",
           std::string type = "invalid_request_error")
      : std::runtime_error(std::move(message)), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}
};
json error_json(const std::string& message, const std::string& type, const std::string& param,
                const std::string& code);
json error_json(const ApiError& e);

// ---- openai_json.cpp: one generation request as parsed from the body (types checked, values range-checked).
struct GenSpec {
  bool chat = false, stream = false, include_usage = false;
  std::string model;
  std::string prompt_text;             // completions with a string prompt
  std::vector<int32_t> prompt_ids;     // completions with a token-id prompt
  bool prompt_is_ids = false;
  std::vector<ChatMessage> messages;   // chat
  int max_tokens = -1;                 // -1 = default (completions 16, chat: the rest of the context)
  SamplerParams sampler;
  bool seed_given = false;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  bool return_token_ids = false;       // "return_token_ids": the generated ids in the response's "elastic" object
};
constexpr int kMaxTokensLimit = 1 << 20;  // larger values are rejected outright
constexpr int kMaxJsonDepth = 64;         // request bodies nested deeper are refused (they never need more than 4)
// Throw ApiError(400) naming the field.
GenSpec parse_completion_request(const json& body);
GenSpec parse_chat_request(const json& body);
// 400 on malformed JSON, a non-object, nesting deeper than kMaxJsonDepth, or a number outside the double range
// (`1e400`, named by its field).
json parse_json_body(const std::string& body);

// ---- metrics.cpp
// A Prometheus histogram: cumulative counts at fixed upper bounds (seconds), their sum and count.
struct Histogram {
  std::vector<double> bounds;    // ascending upper bounds; +Inf is implied
  std::vector<uint64_t> counts;  // per bound, not cumulative (rendered cumulative)
  double sum = 0;
  uint64_t count = 0;
  explicit Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size(), 0) {}
  void observe(double v);
  void render(std::string& out, const char* name, const char* help) const;
};

struct Metrics {
  std::mutex mu;
  // Latencies, per request: submission to the first token (queue and prefill included), and between consecutive
  // tokens of one request (a step of the batch it decodes in).
  Histogram ttft{{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}};
  Histogram itl{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}};
  uint64_t requests_ok = 0, requests_error = 0, requests_cancelled = 0, requests_waited = 0;
  uint64_t http_4xx = 0, http_5xx = 0;
  // The connection layer (http_routes.cpp): connections open now, closed at the cap, closed for a late head or body.
  int connections_open = 0;
  uint64_t connections_shed = 0, connections_timed_out = 0;
  uint64_t prompt_tokens = 0, generated_tokens = 0;
  uint64_t decode_tokens = 0, decode_steps = 0;  // rows / calls of decode_batch (batching shows as rows > steps)
  double prefill_s = 0, decode_s = 0;
  double msr_sum = 0, esr_sum = 0;
  uint64_t msr_count = 0;
  // Gauges (set by the scheduler).
  size_t kv_bytes_in_use = 0, kv_budget = 0;
  size_t kv_bytes_if_full = 0;  // what the running requests would hold were every head full (routing saves the rest)
  size_t kv_bytes_held = 0;     // what the running requests hold now (the GPU's pages in use; grows as they decode)
  int running = 0, waiting = 0, max_slots = 0;
  std::string render();  // Prometheus text exposition
};

// ---- scheduler.cpp (admission counts BatchBackend::kv_bytes_for)

// What a finished (or running) request reports in its "elastic" and "usage" fields.
struct JobSummary {
  int prompt_tokens = 0, completion_tokens = 0;
  double omega_msr = 0, omega_esr = 0, attention_flops_ratio = 1;
  size_t kv_cache_bytes = 0;
  size_t kv_cache_bytes_if_full = 0;  // the same sequence with every head full
  double queue_s = 0, prefill_s = 0, decode_s = 0;
  bool with_ids = false;               // the request asked for its token ids
  std::vector<int32_t> token_ids;      // the sampled ids in order (EOS included), when asked
};

// One request in flight, shared by its HTTP thread (reads text) and the engine thread (writes text).
struct Job {
  // Inputs, fixed before submit.
  std::vector<int32_t> prompt;
  int max_tokens = 16;
  SamplerParams sampler;
  std::vector<std::string> stop;
  bool stop_at_eos = true;
  bool return_ids = false;       // put the sampled ids in the summary (GenSpec::return_token_ids)
  RoutingTable routing;          // the table the cache is built for; set by the engine when a router decides
  const PromptRouter* router = nullptr;  // decides at prefill (routing unknown until then); the server's policy owns it
  int capacity = 0;              // KV positions: prompt + max_tokens
  size_t kv_bytes = 0;           // reserved against the budget: all-full bytes when a router decides, until prefill
  std::chrono::steady_clock::time_point submitted{};

  std::atomic<bool> cancelled{false};  // set by the HTTP side when the client went away

  // Outputs, under mu.
  std::mutex mu;
  std::condition_variable cv;
  std::string pending;  // text produced and not yet taken
  bool done = false;
  bool started = false;  // admitted (has a slot)
  bool prefilled = false;     // the prompt is prefilled and the first token sampled (or the request ended)
  std::string finish_reason;  // "stop" | "length"
  std::string error;          // engine-side failure (message)
  int error_status = 500;     // its HTTP status: 503 when out of memory or shutting down, else 500
  std::string error_code;     // its OpenAI error code
  JobSummary summary;

  struct Taken {
    std::string text;
    bool done = false;
  };
  // Waits up to `wait` for new text or completion and takes what there is.
  Taken take(std::chrono::milliseconds wait);
  // Waits up to `wait` until the request is prefilled or ended; true when it is.
  bool wait_prefilled(std::chrono::milliseconds wait);
};

struct SchedulerOptions {
  std::shared_ptr<SequenceBackend> backend;  // one sequence at a time on it (max_slots 1), instead of the CPU model's
                                             // slots (cpu_batch_backend)
  std::shared_ptr<BatchBackend> batch_backend;  // or these slots (max_slots at most its slots): the GPU model's
                                                // (cuda::gpu_batch_backend) or a test's
  int max_slots = 4;
  int max_queue = 64;  // waiting requests; submit() refuses one more with 429
  size_t kv_budget_bytes = size_t(1) << 30;
  int threads = 0;
  int prefill_chunk = kDefaultPrefillChunk;
  bool log = false;
};

class Scheduler {
 public:
  // tok may be null (then text deltas and stop strings are empty / unused; ids still count).
  Scheduler(const Model& m, const Tokenizer* tok, std::vector<int32_t> eos_ids, SchedulerOptions o, Metrics& met);
  ~Scheduler();
  // Queues the job (ApiError 400 when it could never fit in the KV budget; 429 when max_queue requests already wait;
  // 503 after stop()).
  void submit(const std::shared_ptr<Job>& job);
  void stop();  // cancels everything, joins the engine thread

 private:
  struct Active;
  void loop();
  void publish_gauges_locked();
  void publish_held();  // engine thread: the running requests' KV bytes now (BatchBackend::kv_bytes)
  // An error carries its HTTP status and code (ended with reason "error").
  void finish(Active& a, const std::string& reason, const std::string& error = "", int status = 500,
              const std::string& code = "generation_failed");
  void fail(Active& a, std::exception_ptr e);  // finish with the status the exception maps to
  bool step_text(Active& a, int32_t id);  // appends a token's text; true when a stop string ended the request

  const Model& m_;
  std::shared_ptr<BatchBackend> be_;  // the engine's slots: the CPU model's, options' batch backend, or one slot on
                                      // options' SequenceBackend
  std::vector<int> free_slots_;       // engine thread only
  const Tokenizer* tok_;
  std::vector<int32_t> eos_;
  SchedulerOptions o_;
  Metrics& met_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> waiting_;
  std::deque<std::unique_ptr<Active>> prefilling_;  // engine thread only: admitted, prefill under way (FIFO)
  std::vector<std::unique_ptr<Active>> active_;     // engine thread only: decoding
  size_t kv_in_use_ = 0;  // under mu_
  int running_ = 0;       // under mu_
  bool stopping_ = false;
  std::thread th_;
};

}  // namespace elastic::server

namespace elastic::server {
// ---- openai_json.cpp: response objects.
json usage_json(const JobSummary& s);
json elastic_json(const JobSummary& s);
// Full (non-streaming) response; `text` is the whole completion.
json completion_json(const std::string& id, long created, const std::string& model, bool chat, const std::string& text,
                     const std::string& finish_reason, const JobSummary& s);
// One SSE chunk: text delta (chat: delta.content; `role_only` sends the opening {"role":"assistant"}), or the final
// chunk with finish_reason (and usage + elastic).
json chunk_json(const std::string& id, long created, const std::string& model, bool chat, const std::string& delta,
                bool role_only, const std::string* finish_reason, const JobSummary* s);
// JSON text with invalid UTF-8 replaced (a token can split a character), never throwing.
std::string dump(const json& j);
}  // namespace elastic::server
