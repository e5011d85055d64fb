// Prometheus text exposition of the server's counters and gauges.
#include <cstdio>

#include "server/server_internal.h"

namespace elastic::server {

namespace {

void metric(std::string& out, const char* name, const char* type, const char* help, double value,
            const char* labels = "") {
  char buf[512];
  std::snprintf(buf, sizeof buf, "# HELP %s %s\n# TYPE %s %s\n%s%s %.17g\n", name, help, name, type, name, labels,
                value);
  out += buf;
}

}  // namespace

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds.size() && v > bounds[i]) ++i;
  if (i < counts.size()) ++counts[i];
  sum += v;
  ++count;
}

void Histogram::render(std::string& out, const char* name, const char* help) const {
  char buf[256];
  std::snprintf(buf, sizeof buf, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
  out += buf;
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds.size(); ++i) {
    cum += counts[i];
    std::snprintf(buf, sizeof buf, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], (unsigned long long)cum);
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.17g\n%s_count %llu\n", name,
                (unsigned long long)count, name, sum, name, (unsigned long long)count);
  out += buf;
}

std::string Metrics::render() {
  std::lock_guard g(mu);
  std::string o;
  char buf[256];
  o += "# HELP elastic_requests_total Finished generation requests by outcome.\n# TYPE elastic_requests_total counter\n";
  std::snprintf(buf, sizeof buf,
                "elastic_requests_total{status=\"ok\"} %llu\nelastic_requests_total{status=\"error\"} %llu\n"
                "elastic_requests_total{status=\"cancelled\"} %llu\n",
                (unsigned long long)requests_ok, (unsigned long long)requests_error,
                (unsigned long long)requests_cancelled);
  o += buf;
  o += "# HELP elastic_http_errors_total HTTP responses with an error status.\n# TYPE elastic_http_errors_total counter\n";
  std::snprintf(buf, sizeof buf, "elastic_http_errors_total{class=\"4xx\"} %llu\nelastic_http_errors_total{class=\"5xx\"} %llu\n",
                (unsigned long long)http_4xx, (unsigned long long)http_5xx);
  o += buf;
  metric(o, "elastic_requests_waited_total", "counter", "Requests that waited in the queue for a slot or KV memory.",
         double(requests_waited));
  metric(o, "elastic_prompt_tokens_total", "counter", "Prompt tokens prefilled.", double(prompt_tokens));
  metric(o, "elastic_generation_tokens_total", "counter", "Tokens generated.", double(generated_tokens));
  metric(o, "elastic_decode_steps_total", "counter", "Batched decode steps.", double(decode_steps));
  metric(o, "elastic_decode_batch_rows_total", "counter", "Sequence rows over all batched decode steps.",
         double(decode_tokens));
  metric(o, "elastic_prefill_tokens_per_second", "gauge", "Prompt tokens per second of prefill time (cumulative).",
         prefill_s > 0 ? prompt_tokens / prefill_s : 0.0);
  metric(o, "elastic_decode_tokens_per_second", "gauge",
         "Decoded tokens per second of batched decode time, all requests together (cumulative).",
         decode_s > 0 ? decode_tokens / decode_s : 0.0);
  metric(o, "elastic_omega_msr_mean", "gauge", "Mean Omega_MSR (fraction of sparse KV heads) over requests that held a slot.",
         msr_count ? msr_sum / msr_count : 0.0);
  metric(o, "elastic_omega_esr_mean", "gauge", "Mean Omega_ESR (skipped key blocks) over requests that held a slot.",
         msr_count ? esr_sum / msr_count : 0.0);
  metric(o, "elastic_kv_cache_bytes", "gauge", "KV-cache bytes reserved by running requests.", double(kv_bytes_in_use));
  metric(o, "elastic_kv_cache_budget_bytes", "gauge", "KV-cache byte budget.", double(kv_budget));
  metric(o, "elastic_kv_cache_bytes_held", "gauge",
         "KV-cache bytes the running requests hold now (on the GPU: pages in use, growing as they decode).",
         double(kv_bytes_held));
  metric(o, "elastic_kv_cache_bytes_unheld", "gauge",
         "Budget bytes no running request holds now (on the GPU: the page pool's free pages).",
         kv_budget > kv_bytes_held ? double(kv_budget - kv_bytes_held) : 0.0);
  metric(o, "elastic_kv_cache_bytes_if_full", "gauge",
         "KV-cache bytes the running requests would hold were every head full.", double(kv_bytes_if_full));
  metric(o, "elastic_kv_cache_bytes_saved", "gauge",
         "KV-cache bytes the running requests' routings save against every head full.",
         kv_bytes_if_full > kv_bytes_in_use ? double(kv_bytes_if_full - kv_bytes_in_use) : 0.0);
  metric(o, "elastic_requests_running", "gauge", "Requests holding a slot.", double(running));
  metric(o, "elastic_requests_waiting", "gauge", "Requests waiting for a slot or KV memory.", double(waiting));
  metric(o, "elastic_slots", "gauge", "Slots (requests decoded together at most).", double(max_slots));
  metric(o, "elastic_http_connections", "gauge", "Open client connections (idle, arriving or being answered).",
         double(connections_open));
  metric(o, "elastic_http_connections_shed_total", "counter",
         "Connections closed at the connection cap (the one waiting longest for its request).",
         double(connections_shed));
  metric(o, "elastic_http_connections_timed_out_total", "counter",
         "Connections closed with 408: a request head or body that did not arrive in time.",
         double(connections_timed_out));
  ttft.render(o, "elastic_time_to_first_token_seconds",
              "Per request: from submission to its first token (queue and prefill included).");
  itl.render(o, "elastic_inter_token_latency_seconds", "Per request: between two consecutive tokens.");
  return o;
}

}  // namespace elastic::server
