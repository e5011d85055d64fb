// OpenAI request validation (types and ranges of every field we read) and response objects.
#include <cmath>

#include "server/server_internal.h"

namespace elastic::server {

json error_json(const std::string& message, const std::string& type, const std::string& param,
                const std::string& code) {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}
json error_json(const ApiError& e) { return error_json(e.what(), e.type, e.param, e.code); }

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json parse_json_body(const std::string& body) {
  // The parser callback tracks the nesting depth (request bodies never need more than a few levels; deeper input is
  // refused before it is built) and the last object key, so a number that overflows a double (`1e400`) is reported
  // against its field.
  std::string last_key;
  const json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (depth > kMaxJsonDepth)
      throw ApiError(400, "request body nests deeper than " + std::to_string(kMaxJsonDepth) + " levels", "",
                     "invalid_json");
    if (ev == json::parse_event_t::key && parsed.is_string()) last_key = parsed.get<std::string>();
    return true;
  };
  json j;
  try {
    j = json::parse(body, cb);
  } catch (const json::parse_error& e) {
    throw ApiError(400, std::string("request body is not valid JSON: ") + e.what(), "", "invalid_json");
  } catch (const json::out_of_range& e) {  // a number outside the double range
    const std::string field = last_key.empty() ? "" : "'" + last_key + "': ";
    throw ApiError(400, field + "number out of range (not a finite double): " + e.what(), last_key, "invalid_value");
  } catch (const json::exception& e) {
    throw ApiError(400, std::string("request body is not valid JSON: ") + e.what(), "", "invalid_json");
  }
  if (!j.is_object()) throw ApiError(400, "request body must be a JSON object", "", "invalid_json");
  return j;
}

namespace {

const char* type_name(const json& v) { return v.type_name(); }

[[noreturn]] void bad_type(const std::string& field, const char* want, const json& v) {
  throw ApiError(400, "'" + field + "' must be " + want + ", got " + type_name(v), field, "invalid_type");
}

const json* get(const json& b, const char* key) {
  auto it = b.find(key);
  return it == b.end() || it->is_null() ? nullptr : &*it;
}

double number(const json& b, const char* key, double def, double lo, double hi) {
  const json* v = get(b, key);
  if (!v) return def;
  if (!v->is_number()) bad_type(key, "a number", *v);
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    throw ApiError(400, "'" + std::string(key) + "' must be in [" + json(lo).dump() + ", " + json(hi).dump() +
                            "], got " + v->dump(), key, "invalid_value");
  return x;
}

// Integer fields compare exactly in their own type: a double cannot tell INT64_MAX from INT64_MAX + 1.
long long integer(const json& b, const char* key, long long def, long long lo, long long hi) {
  const json* v = get(b, key);
  if (!v) return def;
  auto out_of_range = [&]() {
    return ApiError(400, "'" + std::string(key) + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                             "], got " + v->dump(), key, "invalid_value");
  };
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (hi < 0 || u > static_cast<uint64_t>(hi) || static_cast<long long>(u) < lo) throw out_of_range();
    return static_cast<long long>(u);
  }
  if (v->is_number_integer()) {
    const long long x = v->get<long long>();
    if (x < lo || x > hi) throw out_of_range();
    return x;
  }
  // 5.0 is accepted as 5; 5.5 is not.
  if (!v->is_number_float()) bad_type(key, "an integer", *v);
  const double x = v->get<double>();
  if (!std::isfinite(x) || x != std::floor(x)) bad_type(key, "an integer", *v);
  // 2^63 is the first double past INT64_MAX; below it the conversion is exact.
  if (x < -9.2233720368547758e18 || x >= 9.2233720368547758e18) throw out_of_range();
  const long long i = static_cast<long long>(x);
  if (i < lo || i > hi) throw out_of_range();
  return i;
}

bool boolean(const json& b, const char* key, bool def) {
  const json* v = get(b, key);
  if (!v) return def;
  if (!v->is_boolean()) bad_type(key, "a boolean", *v);
  return v->get<bool>();
}

// The fields both endpoints share.
void parse_common(const json& b, GenSpec& s) {
  if (const json* v = get(b, "model"); v && !v->is_string()) bad_type("model", "a string", *v);
  if (const json* v = get(b, "model")) s.model = v->get<std::string>();
  s.stream = boolean(b, "stream", false);
  if (const json* so = get(b, "stream_options")) {
    if (!so->is_object()) bad_type("stream_options", "an object", *so);
    s.include_usage = boolean(*so, "include_usage", false);
  }
  // max_completion_tokens is the newer chat name for the same limit.
  const char* mt = get(b, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  s.max_tokens = static_cast<int>(integer(b, mt, -1, 1, kMaxTokensLimit));
  s.sampler.temperature = static_cast<float>(number(b, "temperature", 1.0, 0.0, 2.0));
  s.sampler.top_p = static_cast<float>(number(b, "top_p", 1.0, 0.0, 1.0));
  if (get(b, "top_p") && s.sampler.top_p <= 0.f) throw ApiError(400, "'top_p' must be > 0", "top_p", "invalid_value");
  s.sampler.top_k = static_cast<int>(integer(b, "top_k", 0, -1, 1 << 30));
  if (s.sampler.top_k < 0) s.sampler.top_k = 0;  // -1 = off (vLLM's convention)
  if (get(b, "seed")) {
    s.sampler.seed = static_cast<uint64_t>(integer(b, "seed", 0, INT64_MIN, INT64_MAX));
    s.seed_given = true;
  }
  const long long n = integer(b, "n", 1, 1, 1 << 20);
  if (n != 1) throw ApiError(400, "only n = 1 is supported", "n", "unsupported_value");
  s.ignore_eos = boolean(b, "ignore_eos", false);
  s.return_token_ids = boolean(b, "return_token_ids", false);
  if (const json* st = get(b, "stop")) {
    if (st->is_string()) {
      s.stop.push_back(st->get<std::string>());
    } else if (st->is_array()) {
      if (st->size() > 16) throw ApiError(400, "'stop' may hold at most 16 strings", "stop", "invalid_value");
      for (const json& e : *st) {
        if (!e.is_string()) bad_type("stop", "a string or a list of strings", *st);
        s.stop.push_back(e.get<std::string>());
      }
    } else {
      bad_type("stop", "a string or a list of strings", *st);
    }
    for (auto& x : s.stop)
      if (x.empty()) throw ApiError(400, "'stop' strings must not be empty", "stop", "invalid_value");
  }
}

}  // namespace

GenSpec parse_completion_request(const json& b) {
  GenSpec s;
  const json* p = get(b, "prompt");
  if (!p) throw ApiError(400, "missing required field 'prompt'", "prompt", "missing_field");
  if (p->is_string()) {
    s.prompt_text = p->get<std::string>();
  } else if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
    s.prompt_text = (*p)[0].get<std::string>();  // a batch of one prompt
  } else if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
    s.prompt_is_ids = true;
    for (const json& e : *p) {
      if (!e.is_number_integer()) bad_type("prompt", "a string or a list of token ids (integers)", *p);
      const long long id = e.get<long long>();
      if (id < 0 || id > INT32_MAX) throw ApiError(400, "token id " + e.dump() + " in 'prompt' is out of range", "prompt", "invalid_value");
      s.prompt_ids.push_back(static_cast<int32_t>(id));
    }
  } else if (p->is_array() && p->size() > 1) {
    throw ApiError(400, "batches of several prompts are not supported: send one prompt per request", "prompt",
                   "unsupported_value");
  } else {
    bad_type("prompt", "a string or a list of token ids", *p);
  }
  parse_common(b, s);
  if (s.max_tokens < 0) s.max_tokens = 16;  // OpenAI's default for completions
  return s;
}

GenSpec parse_chat_request(const json& b) {
  GenSpec s;
  s.chat = true;
  const json* ms = get(b, "messages");
  if (!ms) throw ApiError(400, "missing required field 'messages'", "messages", "missing_field");
  if (!ms->is_array()) bad_type("messages", "a list of message objects", *ms);
  if (ms->empty()) throw ApiError(400, "'messages' must not be empty", "messages", "invalid_value");
  for (size_t i = 0; i < ms->size(); ++i) {
    const json& m = (*ms)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) bad_type(at, "an object", m);
    const json* role = get(m, "role");
    if (!role) throw ApiError(400, "missing required field '" + at + ".role'", at + ".role", "missing_field");
    if (!role->is_string()) bad_type(at + ".role", "a string", *role);
    const json* content = get(m, "content");
    if (!content) throw ApiError(400, "missing required field '" + at + ".content'", at + ".content", "missing_field");
    ChatMessage cm{role->get<std::string>(), ""};
    if (cm.role != "system" && cm.role != "user" && cm.role != "assistant" && cm.role != "developer")
      throw ApiError(400, "'" + at + ".role' must be system, user or assistant, got '" + cm.role + "'", at + ".role",
                     "invalid_value");
    if (cm.role == "developer") cm.role = "system";  // OpenAI's newer name for the system role
    if (content->is_string()) {
      cm.content = content->get<std::string>();
    } else if (content->is_array()) {  // [{"type":"text","text":"..."}]: text parts are joined
      for (const json& part : *content) {
        // Every test reads a field only after checking its type: json::value() on a "type" that is not a string
        // throws a library type_error, which the server would answer as 500.
        const json* type = part.is_object() ? get(part, "type") : nullptr;
        const json* text = part.is_object() ? get(part, "text") : nullptr;
        if (!type || !type->is_string() || *type != "text" || !text || !text->is_string())
          throw ApiError(400, "'" + at + ".content' parts must be {\"type\": \"text\", \"text\": string}",
                         at + ".content", "invalid_type");
        cm.content += text->get<std::string>();
      }
    } else {
      bad_type(at + ".content", "a string or a list of text parts", *content);
    }
    s.messages.push_back(std::move(cm));
  }
  parse_common(b, s);
  return s;
}

json usage_json(const JobSummary& s) {
  return {{"prompt_tokens", s.prompt_tokens},
          {"completion_tokens", s.completion_tokens},
          {"total_tokens", s.prompt_tokens + s.completion_tokens}};
}

json elastic_json(const JobSummary& s) {
  json j = {{"omega_msr", s.omega_msr},
          {"omega_esr", s.omega_esr},
          {"kv_cache_bytes", s.kv_cache_bytes},
          {"kv_cache_bytes_if_full", s.kv_cache_bytes_if_full},
          {"attention_flops_ratio", s.attention_flops_ratio},
          {"queue_seconds", s.queue_s},
          {"prefill_seconds", s.prefill_s},
          {"decode_seconds", s.decode_s}};
  if (s.with_ids) j["token_ids"] = s.token_ids;
  return j;
}

json completion_json(const std::string& id, long created, const std::string& model, bool chat, const std::string& text,
                     const std::string& finish_reason, const JobSummary& s) {
  json choice = {{"index", 0}, {"finish_reason", finish_reason}, {"logprobs", nullptr}};
  if (chat) choice["message"] = {{"role", "assistant"}, {"content", text}};
  else choice["text"] = text;
  return {{"id", id},
          {"object", chat ? "chat.completion" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({choice})},
          {"usage", usage_json(s)},
          {"elastic", elastic_json(s)}};
}

json chunk_json(const std::string& id, long created, const std::string& model, bool chat, const std::string& delta,
                bool role_only, const std::string* finish_reason, const JobSummary* s) {
  json choice = {{"index", 0}, {"finish_reason", finish_reason ? json(*finish_reason) : json(nullptr)},
                 {"logprobs", nullptr}};
  if (chat) {
    json d = json::object();
    if (role_only) d["role"] = "assistant";
    else if (!finish_reason) d["content"] = delta;
    choice["delta"] = d;
  } else {
    choice["text"] = delta;
  }
  json j = {{"id", id},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created},
            {"model", model},
            {"choices", json::array({choice})}};
  if (s) {
    j["usage"] = usage_json(*s);
    j["elastic"] = elastic_json(*s);
  }
  return j;
}

}  // namespace elastic::server
