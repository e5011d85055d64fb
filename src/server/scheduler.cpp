// The batching scheduler: one engine thread owns a BatchBackend (batch_backend.h). Requests wait in a FIFO queue
// until a slot and, where the backend allocates per sequence, their KV bytes fit; each admitted request is prefilled
// alone (its own routing and memory), then the decode steps of all running requests run together. The CPU model's
// backend batches them (decode_batch), the GPU model's too (GpuModel::decode_batch); a SequenceBackend is one slot.
#include <omp.h>

#include <algorithm>
#include <cstdio>

#include "elastic/kv_pages.h"
#include "server/server_internal.h"

namespace elastic::server {

using clock_t_ = std::chrono::steady_clock;

static double secs(clock_t_::duration d) { return std::chrono::duration<double>(d).count(); }

Job::Taken Job::take(std::chrono::milliseconds wait) {
  std::unique_lock lk(mu);
  if (pending.empty() && !done) cv.wait_for(lk, wait, [&] { return !pending.empty() || done; });
  Taken t;
  t.text.swap(pending);
  t.done = done;
  return t;
}

bool Job::wait_prefilled(std::chrono::milliseconds wait) {
  std::unique_lock lk(mu);
  return cv.wait_for(lk, wait, [&] { return prefilled || done; });
}

struct Scheduler::Active {
  std::shared_ptr<Job> job;
  int slot = -1;         // the backend slot it holds; -1 before admission's prefill and after release
  Sampler sampler;
  int produced = 0;      // sampled tokens (EOS included)
  std::vector<int32_t> ids;  // the sampled ids, kept when the request asked for them (Job::return_ids)
  int32_t next = -1;     // sampled, not yet in the sequence
  std::string text;      // generated text so far (bytes)
  size_t sent = 0;       // bytes of `text` already handed to the HTTP side
  bool finished = false;
  size_t kv_if_full = 0;  // its share of Metrics::kv_bytes_if_full
  clock_t_::time_point t_admit, t_first, t_last;  // t_last: its latest token
  explicit Active(std::shared_ptr<Job> j) : job(std::move(j)), sampler(job->sampler) {}
};

Scheduler::Scheduler(const Model& m, const Tokenizer* tok, std::vector<int32_t> eos, SchedulerOptions o, Metrics& met)
    : m_(m), tok_(tok), eos_(std::move(eos)), o_(o), met_(met) {
  if (o_.max_slots < 1) throw std::invalid_argument("server: max slots must be >= 1");
  if (o_.max_queue < 0) throw std::invalid_argument("server: max queue must be >= 0");
  if (o_.backend && o_.max_slots != 1) throw std::invalid_argument("server: a sequence backend has exactly one slot");
  if (o_.backend) be_ = single_slot_backend(o_.backend);
  else if (o_.batch_backend) be_ = o_.batch_backend;
  else be_ = cpu_batch_backend(m_, o_.max_slots, o_.prefill_chunk);
  if (be_->slots() < o_.max_slots)
    throw std::invalid_argument("server: " + std::to_string(o_.max_slots) + " slots asked of a backend with " +
                                std::to_string(be_->slots()));
  for (int s = be_->slots() - 1; s >= 0; --s) free_slots_.push_back(s);
  {
    std::lock_guard g(met_.mu);
    met_.kv_budget = o_.kv_budget_bytes;
    met_.max_slots = o_.max_slots;
  }
  th_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::stop() {
  {
    std::lock_guard g(mu_);
    if (stopping_ && !th_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (th_.joinable()) th_.join();
  // Nothing runs any more: fail what is left so no HTTP thread waits forever.
  std::deque<std::shared_ptr<Job>> left;
  {
    std::lock_guard g(mu_);
    left.swap(waiting_);
  }
  for (auto& a : active_) left.push_back(a->job);
  for (auto& a : prefilling_) left.push_back(a->job);
  active_.clear();
  prefilling_.clear();
  for (auto& j : left) {
    std::lock_guard g(j->mu);
    if (!j->done) {
      j->done = true;
      j->error = "server is shutting down";
      j->error_status = 503;
      j->error_code = "unavailable";
    }
    j->cv.notify_all();
  }
}

void Scheduler::submit(const std::shared_ptr<Job>& job) {
  job->kv_bytes = be_->kv_bytes_for(static_cast<int>(job->prompt.size()), job->capacity, job->routing);
  // A backend that holds its memory up front is limited by the context (checked by the HTTP side), not the budget.
  if (be_->budgets_kv() && job->kv_bytes > o_.kv_budget_bytes)
    throw ApiError(400,
                   "this request needs " + std::to_string(job->kv_bytes) + " bytes of KV cache (prompt + max_tokens = " +
                       std::to_string(job->capacity) + " positions), more than the server's whole KV budget of " +
                       std::to_string(o_.kv_budget_bytes) + " bytes; lower max_tokens or shorten the prompt",
                   "max_tokens", "kv_budget_exceeded");
  job->submitted = clock_t_::now();
  {
    std::lock_guard g(mu_);
    if (stopping_) throw ApiError(503, "server is shutting down", "", "unavailable", "server_error");
    if (static_cast<int>(waiting_.size()) >= o_.max_queue)
      throw ApiError(429,
                     "server busy: " + std::to_string(waiting_.size()) + " requests are already waiting for a slot " +
                         "(the queue holds " + std::to_string(o_.max_queue) + "); retry later",
                     "", "queue_full", "server_error");
    waiting_.push_back(job);
    publish_gauges_locked();
  }
  cv_.notify_all();
}

void Scheduler::publish_held() {
  size_t held = 0;
  auto add = [&](const auto& list) {
    for (const auto& a : list)
      if (!a->finished && a->slot >= 0) held += be_->kv_bytes(a->slot);
  };
  add(active_);
  add(prefilling_);
  std::lock_guard g(met_.mu);
  met_.kv_bytes_held = held;
}

void Scheduler::publish_gauges_locked() {
  std::lock_guard g(met_.mu);
  met_.kv_bytes_in_use = kv_in_use_;
  met_.running = running_;
  met_.waiting = static_cast<int>(waiting_.size());
}

static void publish(Job& j, const std::string& delta) {
  if (delta.empty()) return;
  std::lock_guard g(j.mu);
  j.pending += delta;
  j.cv.notify_all();
}

bool Scheduler::step_text(Active& a, int32_t id) {
  if (!tok_) return false;
  const size_t before = a.text.size();
  a.text += tok_->token_text(id);
  const Job& j = *a.job;
  if (!j.stop.empty()) {
    size_t longest = 0;
    for (auto& s : j.stop) longest = std::max(longest, s.size());
    const size_t from = before >= longest ? before - longest + 1 : 0;  // a match must end in the new bytes
    size_t hit = std::string::npos;
    for (auto& s : j.stop) hit = std::min(hit, a.text.find(s, from));
    if (hit != std::string::npos) {
      a.text.resize(std::max(hit, a.sent));
      return true;
    }
  }
  // Hold back a tail that may be the start of a stop string, and an incomplete UTF-8 sequence.
  size_t safe = a.text.size();
  for (auto& s : j.stop)
    for (size_t k = std::min(s.size() - 1, a.text.size()); k > 0; --k)
      if (a.text.compare(a.text.size() - k, k, s, 0, k) == 0) {
        safe = std::min(safe, a.text.size() - k);
        break;
      }
  if (safe > a.sent) {
    size_t i = safe - 1;
    while (i > a.sent && i + 4 > safe && (static_cast<unsigned char>(a.text[i]) & 0xC0) == 0x80) --i;
    const unsigned char lead = static_cast<unsigned char>(a.text[i]);
    const size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    if (i + need > safe) safe = i;
  }
  if (safe > a.sent) {
    publish(*a.job, a.text.substr(a.sent, safe - a.sent));
    a.sent = safe;
  }
  return false;
}

// Engine failures by cause: memory that could not be had is the server's temporary state (503, retry later);
// anything else is a server fault (500). Client mistakes never get here: the HTTP side validated the request.
void Scheduler::fail(Active& a, std::exception_ptr ep) {
  try {
    std::rethrow_exception(ep);
  } catch (const std::bad_alloc&) {
    finish(a, "error", "out of memory while running the request", 503, "out_of_memory");
  } catch (const OutOfPages& e) {  // a page pool ran out (admission reserves each request's peak: a server bug)
    finish(a, "error", std::string("out of KV pages while running the request: ") + e.what(), 503, "out_of_memory");
  } catch (const std::exception& e) {
    finish(a, "error", e.what());
  } catch (...) {
    finish(a, "error", "unknown engine failure");
  }
}

void Scheduler::finish(Active& a, const std::string& reason, const std::string& error, int status,
                       const std::string& code) {
  if (a.finished) return;
  a.finished = true;
  Job& j = *a.job;
  const auto now = clock_t_::now();
  JobSummary s;
  s.prompt_tokens = static_cast<int>(j.prompt.size());
  s.completion_tokens = a.produced;
  s.with_ids = j.return_ids;
  s.token_ids = std::move(a.ids);
  s.omega_msr = j.routing.msr();
  if (a.slot >= 0) {
    try {  // figures are a report: failing to make them must not keep the slot or the reservation
      const AttentionStats st = be_->figures(a.slot);
      s.omega_esr = st.esr();
      s.attention_flops_ratio = st.flops_ratio();
      s.kv_cache_bytes = be_->kv_bytes(a.slot);
      s.kv_cache_bytes_if_full = be_->kv_bytes_all_full(a.slot);
    } catch (...) {
    }
  }
  s.queue_s = secs(a.t_admit - j.submitted);
  s.prefill_s = a.t_first > a.t_admit ? secs(a.t_first - a.t_admit) : 0;
  s.decode_s = a.t_first > a.t_admit ? secs(now - a.t_first) : 0;
  const bool cancelled = reason == "cancelled";
  // Counters and the slot / KV reservation are released before the client can see the end, so a client that
  // has its answer also sees it in /metrics and its slot free.
  if (a.slot >= 0) {
    try {
      be_->release(a.slot);
    } catch (...) {  // the slot is free either way: the next prefill into it starts a new sequence
    }
    free_slots_.push_back(a.slot);
    a.slot = -1;
  }
  {
    std::lock_guard g(met_.mu);
    if (cancelled) ++met_.requests_cancelled;
    else if (!error.empty()) ++met_.requests_error;
    else ++met_.requests_ok;
    met_.prompt_tokens += s.prompt_tokens;
    met_.generated_tokens += s.completion_tokens;
    met_.msr_sum += s.omega_msr;
    met_.esr_sum += s.omega_esr;
    ++met_.msr_count;
    met_.kv_bytes_if_full -= a.kv_if_full;
    a.kv_if_full = 0;
  }
  {
    std::lock_guard g(mu_);
    kv_in_use_ -= j.kv_bytes;
    --running_;
    publish_gauges_locked();
  }
  if (o_.log)
    std::fprintf(stderr, "request: %s | prompt %d | completion %d | queue %.3f s | prefill %.3f s | decode %.3f s | "
                 "Omega_MSR %.3f | Omega_ESR %.3f | kv %.2f MiB%s%s\n",
                 reason.c_str(), s.prompt_tokens, s.completion_tokens, s.queue_s, s.prefill_s, s.decode_s, s.omega_msr,
                 s.omega_esr, s.kv_cache_bytes / 1048576.0, error.empty() ? "" : " | error: ", error.c_str());
  {
    std::lock_guard g(j.mu);
    if (!cancelled && error.empty() && a.sent < a.text.size()) j.pending += a.text.substr(a.sent);
    j.summary = s;
    j.finish_reason = reason;
    j.error = error;
    if (!error.empty()) {
      j.error_status = status;
      j.error_code = code;
    }
    j.done = true;
    j.cv.notify_all();
  }
}

void Scheduler::loop() {
  if (o_.threads > 0) omp_set_num_threads(o_.threads);  // per-thread setting: the engine thread runs the model
  const int V = m_.config.vocab;
  std::vector<float> logits;
  // Handles one sampled id; returns true when the request is finished.
  auto on_token = [&](Active& a, int32_t id) {
    ++a.produced;
    if (a.job->return_ids) a.ids.push_back(id);
    const Job& j = *a.job;
    {
      const auto now = clock_t_::now();
      std::lock_guard g(met_.mu);
      if (a.produced == 1) met_.ttft.observe(secs(now - j.submitted));
      else met_.itl.observe(secs(now - a.t_last));
      a.t_last = now;
    }
    if (j.stop_at_eos && std::find(eos_.begin(), eos_.end(), id) != eos_.end()) {
      finish(a, "stop");
      return;
    }
    if (step_text(a, id)) {
      finish(a, "stop");
      return;
    }
    const bool full = be_->length(a.slot) >= be_->capacity(a.slot);
    if (a.produced >= j.max_tokens || full) {
      finish(a, "length");
      return;
    }
    a.next = id;
  };

  for (;;) {
    std::vector<std::unique_ptr<Active>> admitted;
    std::vector<std::shared_ptr<Job>> dropped;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !active_.empty() || !prefilling_.empty() || !waiting_.empty(); });
      if (stopping_) return;
      // Clients that left while waiting free their place in the queue.
      for (auto it = waiting_.begin(); it != waiting_.end();)
        if ((*it)->cancelled) {
          dropped.push_back(*it);
          it = waiting_.erase(it);
        } else {
          ++it;
        }
      while (!waiting_.empty() && running_ < o_.max_slots &&
             (!be_->budgets_kv() || kv_in_use_ + waiting_.front()->kv_bytes <= o_.kv_budget_bytes)) {
        admitted.push_back(std::make_unique<Active>(waiting_.front()));
        kv_in_use_ += waiting_.front()->kv_bytes;
        ++running_;
        waiting_.pop_front();
      }
      publish_gauges_locked();
    }
    for (auto& j : dropped) {
      {
        std::lock_guard g(met_.mu);
        ++met_.requests_cancelled;
      }
      std::lock_guard g(j->mu);
      j->done = true;
      j->finish_reason = "cancelled";
      j->cv.notify_all();
    }
    // Newcomers take a slot and start their prefill, each with its own routing and memory.
    for (auto& up : admitted) {
      Active& a = *up;
      Job& j = *a.job;
      a.t_admit = clock_t_::now();
      if (secs(a.t_admit - j.submitted) > 0.005) {
        std::lock_guard g(met_.mu);
        ++met_.requests_waited;
      }
      {
        std::lock_guard g(j.mu);
        j.started = true;
      }
      if (j.cancelled) {
        finish(a, "cancelled");
        continue;
      }
      try {
        a.slot = free_slots_.back();
        free_slots_.pop_back();
        be_->prefill_start(a.slot, j.prompt, j.capacity, j.router ? nullptr : &j.routing, j.router);
        prefilling_.push_back(std::move(up));
      } catch (...) {
        fail(a, std::current_exception());
      }
    }
    // Clients that left during their prefill free their slots.
    for (auto& a : prefilling_)
      if (!a->finished && a->job->cancelled) finish(*a, "cancelled");
    std::erase_if(prefilling_, [](const std::unique_ptr<Active>& a) { return a->finished; });
    // Prefill work between two decode steps: at most n_layers steps (on the CPU one chunk through one layer each, so
    // a prompt of one chunk or less completes in one turn and a longer one advances by one chunk's worth), oldest
    // first. The running requests' next token waits for that much prefill at most, however long the prompt.
    for (int budget = m_.config.n_layers; budget > 0 && !prefilling_.empty(); --budget) {
      Active& a = *prefilling_.front();
      Job& j = *a.job;
      bool done = false;
      if (j.cancelled) {
        finish(a, "cancelled");
      } else {
        try {
          const auto s0 = clock_t_::now();
          RoutingTable used;
          const bool last = be_->prefill_step(a.slot, logits, used);
          const double busy = secs(clock_t_::now() - s0);
          {
            std::lock_guard g(met_.mu);
            met_.prefill_s += busy;
          }
          if (last) {
            j.routing = used;
            // The reservation becomes what the sequence can hold under the routing it ran (a router's request reserved
            // all full until now).
            if (const size_t kb = be_->kv_bytes_for(static_cast<int>(j.prompt.size()), j.capacity, used)) {
              std::lock_guard g(mu_);
              kv_in_use_ = kv_in_use_ - j.kv_bytes + kb;
              j.kv_bytes = kb;
              publish_gauges_locked();
            }
            {
              a.kv_if_full = be_->kv_bytes_all_full(a.slot);
              std::lock_guard g(met_.mu);
              met_.kv_bytes_if_full += a.kv_if_full;
            }
            a.t_first = clock_t_::now();
            on_token(a, a.sampler.sample(logits.data(), V));
            {
              std::lock_guard g(j.mu);
              j.prefilled = true;
              j.cv.notify_all();
            }
            done = true;
          }
        } catch (...) {
          fail(a, std::current_exception());
        }
      }
      if (a.finished || done) {
        std::unique_ptr<Active> up = std::move(prefilling_.front());
        prefilling_.pop_front();
        if (!up->finished) active_.push_back(std::move(up));
      }
    }
    // Clients that disconnected free their slots before the step.
    for (auto& a : active_)
      if (!a->finished && a->job->cancelled) finish(*a, "cancelled");
    std::erase_if(active_, [](const std::unique_ptr<Active>& a) { return a->finished; });
    publish_held();
    if (active_.empty()) continue;

    // One decode step for every running request, batched where the backend batches.
    const auto t0 = clock_t_::now();
    try {
      std::vector<int> slots;
      std::vector<int32_t> ids;
      for (auto& a : active_) slots.push_back(a->slot), ids.push_back(a->next);
      be_->decode(slots, ids, logits);
    } catch (...) {
      for (auto& a : active_) fail(*a, std::current_exception());
      active_.clear();
      continue;
    }
    {
      std::lock_guard g(met_.mu);
      met_.decode_s += secs(clock_t_::now() - t0);
      met_.decode_tokens += active_.size();
      ++met_.decode_steps;
    }
    for (size_t b = 0; b < active_.size(); ++b)
      on_token(*active_[b], active_[b]->sampler.sample(logits.data() + b * static_cast<size_t>(V), V));
    std::erase_if(active_, [](const std::unique_ptr<Active>& a) { return a->finished; });
    publish_held();
  }
}

}  // namespace elastic::server
