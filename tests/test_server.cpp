// The server and its pieces: batched decode against per-sequence forward, chat templates against hand-written
// strings, and the real HTTP server on a loopback port (normal, chat, streaming, concurrent, disconnect, bad input).
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "elastic/batch_decode.h"
#include "elastic/chat_template.h"
#include "elastic/generate.h"
#include "elastic/server.h"
#include "elastic/tokenizer.h"
#include "st_writer.h"

using namespace elastic;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string fixture() { return std::string(ELASTIC_FIXTURE_DIR) + "/qwen3_tiny"; }
std::string qwen3_tok_dir() { return std::string(ELASTIC_SHARED_DIR) + "/qwen3-tokenizer"; }

double rel_err(const float* a, const float* b, size_t n) {
  double md = 0, mv = 0;
  for (size_t i = 0; i < n; ++i) {
    md = std::max(md, double(std::abs(a[i] - b[i])));
    mv = std::max(mv, double(std::abs(b[i])));
  }
  return md / mv;
}

RoutingTable small_sparse(const Model& m, std::vector<HeadMode> modes) {
  RoutingTable r = RoutingTable::all_full(m.config.n_layers, m.config.n_kv_heads);
  r.mode = std::move(modes);
  r.sparse.block = 64;
  r.sparse.sink = 64;
  r.sparse.local = 64;
  r.sparse.xattn.block = 64;
  return r;
}

}  // namespace

// ---------------------------------------------------------------- decode_batch

TEST(BatchDecode, MatchesPerSequenceForward) {
  Model m = Model::load(fixture());
  using H = HeadMode;
  const int V = m.config.vocab, cap = 170;
  // Different lengths and routings: streaming with a hybrid (ring) cache, full, mixed per head, XAttention.
  const std::vector<int> lens = {150, 30, 140, 3};
  const std::vector<RoutingTable> routes = {small_sparse(m, {H::Streaming, H::Streaming, H::Streaming, H::Streaming}),
                                            small_sparse(m, {H::Full, H::Full, H::Full, H::Full}),
                                            small_sparse(m, {H::Full, H::Streaming, H::Streaming, H::Full}),
                                            small_sparse(m, {H::XAttn, H::XAttn, H::Full, H::XAttn})};
  const size_t S = lens.size();
  std::vector<KVCache> ref(S), bat(S);
  std::vector<AttentionStats> ref_st(S), bat_st(S);
  std::vector<int32_t> next(S);
  std::mt19937 rng(5);
  for (size_t s = 0; s < S; ++s) {
    std::vector<int32_t> ids(lens[s]);
    for (auto& x : ids) x = static_cast<int32_t>(rng() % V);
    ref[s].init(m.config, cap, &routes[s]);
    bat[s].init(m.config, cap, &routes[s]);
    std::vector<float> lg;
    m.prefill(ids.data(), lens[s], 64, ref[s], lg, false, &ref_st[s], &routes[s]);
    m.prefill(ids.data(), lens[s], 64, bat[s], lg, false, &bat_st[s], &routes[s]);
    next[s] = static_cast<int32_t>(rng() % V);
  }
  EXPECT_GT(ref[0].ring_slots[0], 0);  // the streaming sequence really uses the sink + window cache
  EXPECT_LT(ref[0].bytes(), ref[1].bytes());
  EXPECT_EQ(ref[2].ring_slots[0], 0);
  EXPECT_GT(ref[2].ring_slots[1], 0);
  for (int step = 0; step < 6; ++step) {  // the ring of sequence 0 wraps during these steps
    std::vector<DecodeSlot> slots;
    for (size_t s = 0; s < S; ++s) slots.push_back({next[s], &bat[s], &routes[s], &bat_st[s]});
    std::vector<float> batched;
    decode_batch(m, slots, batched);
    ASSERT_EQ(batched.size(), S * V);
    for (size_t s = 0; s < S; ++s) {
      std::vector<float> one;
      m.forward(&next[s], 1, ref[s], one, false, &ref_st[s], nullptr, false, &routes[s]);
      EXPECT_LT(rel_err(batched.data() + s * V, one.data(), V), 1e-5) << "sequence " << s << " step " << step;
      EXPECT_EQ(bat[s].length, ref[s].length);
      EXPECT_DOUBLE_EQ(bat_st[s].pairs_done, ref_st[s].pairs_done);
      EXPECT_DOUBLE_EQ(bat_st[s].esr(), ref_st[s].esr());
      next[s] = static_cast<int32_t>(std::max_element(one.begin(), one.end()) - one.begin());
    }
  }
  // The model's own routing when a slot gives none.
  KVCache a, b;
  a.init(m.config, 8);
  b.init(m.config, 8);
  std::vector<float> l1, l2;
  m.forward(&next[0], 1, a, l1, false);
  decode_batch(m, {{next[0], &b, nullptr, nullptr}}, l2);
  EXPECT_LT(rel_err(l2.data(), l1.data(), V), 1e-5);
}

TEST(BatchDecode, BadSlotsThrowAndLeaveCachesAlone) {
  Model m = Model::load(fixture());
  KVCache a, full;
  a.init(m.config, 8);
  full.init(m.config, 1);
  std::vector<float> lg;
  int32_t t = 1;
  m.forward(&t, 1, full, lg, false);
  EXPECT_THROW(decode_batch(m, {{1, &a, nullptr, nullptr}, {1, &full, nullptr, nullptr}}, lg), std::runtime_error);
  EXPECT_EQ(a.length, 0);
  EXPECT_THROW(decode_batch(m, {{m.config.vocab, &a, nullptr, nullptr}}, lg), std::runtime_error);
  EXPECT_THROW(decode_batch(m, {{-1, &a, nullptr, nullptr}}, lg), std::runtime_error);
  EXPECT_THROW(decode_batch(m, {{1, &a, nullptr, nullptr}, {2, &a, nullptr, nullptr}}, lg), std::invalid_argument);
  EXPECT_THROW(decode_batch(m, {{1, nullptr, nullptr, nullptr}}, lg), std::invalid_argument);
  RoutingTable wrong = RoutingTable::all_full(1, 1);
  EXPECT_THROW(decode_batch(m, {{1, &a, &wrong, nullptr}}, lg), std::invalid_argument);
  // A ring cache built for streaming heads, decoded with full routing, would read overwritten keys.
  RoutingTable ssa = small_sparse(m, std::vector<HeadMode>(4, HeadMode::Streaming));
  KVCache ring;
  ring.init(m.config, 200, &ssa);
  const RoutingTable all_full = RoutingTable::all_full(m.config.n_layers, m.config.n_kv_heads);
  EXPECT_THROW(decode_batch(m, {{1, &ring, &all_full, nullptr}}, lg), std::runtime_error);
  EXPECT_EQ(a.length, 0);
  EXPECT_EQ(ring.length, 0);
  decode_batch(m, {}, lg);
  EXPECT_TRUE(lg.empty());
}

TEST(BatchDecode, KvBytesForMatchesKVCacheInit) {
  Model m = Model::load(fixture());
  using H = HeadMode;
  for (int cap : {1, 100, 128, 129, 500})
    for (auto modes : {std::vector<H>(4, H::Full), std::vector<H>(4, H::Streaming), std::vector<H>{H::Full, H::Streaming, H::XAttn, H::Streaming}}) {
      RoutingTable r = small_sparse(m, modes);
      KVCache c;
      c.init(m.config, cap, &r);
      EXPECT_EQ(kv_cache_bytes_for(m.config, cap, r), c.bytes()) << cap;
    }
}

// ---------------------------------------------------------------- chat templates

TEST(ChatTemplateFormat, Qwen3TemplateFromTokenizerConfig) {
  ChatTemplate t = ChatTemplate::from_model_dir(qwen3_tok_dir());
  ASSERT_EQ(t.family(), ChatFamily::Qwen3);
  EXPECT_EQ(t.eos_token(), "<|im_end|>");
  EXPECT_EQ(t.apply({{"system", "You are terse."}, {"user", "Hi"}}),
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t.apply({{"user", "Hi"}}, false), "<|im_start|>user\nHi<|im_end|>\n");
  // History: an earlier assistant turn loses its reasoning; a final one after the last user turn keeps a think block.
  EXPECT_EQ(t.apply({{"user", "A"}, {"assistant", "<think>\nhmm\n</think>\n\nB"}, {"user", "C"}, {"assistant", "D"}},
                    false),
            "<|im_start|>user\nA<|im_end|>\n<|im_start|>assistant\nB<|im_end|>\n<|im_start|>user\nC<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nD<|im_end|>\n");
  EXPECT_EQ(t.apply({{"user", "A"}, {"assistant", "<think>why</think>B"}}, false),
            "<|im_start|>user\nA<|im_end|>\n<|im_start|>assistant\n<think>\nwhy\n</think>\n\nB<|im_end|>\n");
}

TEST(ChatTemplateFormat, ChatMLWithDefaultSystem) {
  const std::string qwen25 =
      "{%- for message in messages %}{%- if loop.first and messages[0]['role'] != 'system' %}"
      "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
      "{%- endif %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
      "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
  ChatTemplate t = ChatTemplate::from_string(qwen25);
  ASSERT_EQ(t.family(), ChatFamily::ChatML);
  EXPECT_EQ(t.apply({{"user", "Hi"}}),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t.apply({{"system", "S"}, {"user", "Hi"}, {"assistant", "<think>x</think>Yo"}}, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            "<think>x</think>Yo<|im_end|>\n");
  ChatTemplate plain = ChatTemplate::from_string("{% for m in messages %}<|im_start|>{{m.role}}...{% endfor %}");
  EXPECT_EQ(plain.apply({{"user", "Hi"}}), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateFormat, Llama3) {
  const std::string l30 =
      "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
      "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 "
      "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
  ChatTemplate t = ChatTemplate::from_string(l30, "<|begin_of_text|>");
  ASSERT_EQ(t.family(), ChatFamily::Llama3);
  EXPECT_EQ(t.apply({{"system", "Be brief. "}, {"user", " Hi\n"}}),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  const std::string l31 = l30 + "{{- \"Cutting Knowledge Date: December 2023\\n\" }}";
  ChatTemplate t31 = ChatTemplate::from_string(l31, "<|begin_of_text|>");
  EXPECT_EQ(t31.apply({{"user", "Hi"}}),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
            "Today Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(t31.apply({{"system", "S"}, {"user", "Hi"}, {"assistant", "Yo"}}, false),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
            "Today Date: 26 Jul 2024\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nYo<|eot_id|>");
}

TEST(ChatTemplateFormat, ErrorsAreClear) {
  ChatTemplate none;
  try {
    none.apply({{"user", "Hi"}});
    FAIL();
  } catch (const ChatTemplateError& e) {
    EXPECT_NE(std::string(e.what()).find("no chat template"), std::string::npos) << e.what();
  }
  ChatTemplate unk = ChatTemplate::from_string("{% for m in messages %}[{{m.role}}] {{m.content}}{% endfor %}");
  EXPECT_EQ(unk.family(), ChatFamily::Unknown);
  try {
    unk.apply({{"user", "Hi"}});
    FAIL();
  } catch (const ChatTemplateError& e) {
    EXPECT_NE(std::string(e.what()).find("not one this server can render"), std::string::npos) << e.what();
  }
  ChatTemplate q = ChatTemplate::from_model_dir(qwen3_tok_dir());
  EXPECT_THROW(q.apply({}), ChatTemplateError);
  EXPECT_THROW(q.apply({{"tool", "x"}}), ChatTemplateError);

  const std::string d = elastic::testing::temp_dir("chat_tmpl");
  EXPECT_EQ(ChatTemplate::from_model_dir(d).family(), ChatFamily::None);  // no tokenizer_config.json
  std::ofstream(d + "/tokenizer_config.json") << "{\"eos_token\": \"x\"}";
  EXPECT_EQ(ChatTemplate::from_model_dir(d).family(), ChatFamily::None);  // no chat_template key
  std::ofstream(d + "/tokenizer_config.json") << "{\"chat_template\": 5}";
  EXPECT_THROW(ChatTemplate::from_model_dir(d), std::runtime_error);
  std::ofstream(d + "/tokenizer_config.json") << "{\"chat_template\": ";
  try {
    ChatTemplate::from_model_dir(d);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json"), std::string::npos) << e.what();
  }
  std::ofstream(d + "/tokenizer_config.json")
      << R"({"chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": "<|im_start|>"}]})";
  EXPECT_EQ(ChatTemplate::from_model_dir(d).family(), ChatFamily::ChatML);
  fs::remove_all(d);
}

// ---------------------------------------------------------------- the HTTP server

namespace {

// A random-weight Qwen3 with the full Qwen3 vocabulary (so the real tokenizer fits), tiny everywhere else.
std::string write_tiny_qwen3(const std::string& tag, bool with_chat_template) {
  using namespace elastic::testing;
  const std::string d = temp_dir(tag);
  write_tiny_qwen3_full_vocab(d, 11, 0.5f);
  fs::create_symlink(qwen3_tok_dir() + "/tokenizer.json", d + "/tokenizer.json");
  if (with_chat_template) fs::copy_file(qwen3_tok_dir() + "/tokenizer_config.json", d + "/tokenizer_config.json");
  return d;
}

// A client of a test server on this machine, with a read timeout patient enough for a slow CI machine.
httplib::Client client_of(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  return c;
}

json post_json(httplib::Client& c, const std::string& path, const json& body, int* status = nullptr) {
  auto r = c.Post(path.c_str(), body.dump(), "application/json");
  if (!r) {
    ADD_FAILURE() << "no response for " << path << ": " << httplib::to_string(r.error());
    return json();
  }
  if (status) *status = r->status;
  return json::parse(r->body);
}

// Reads /metrics and returns the value of one sample line (name with its labels), -1 when absent.
double metric(httplib::Client& c, const std::string& sample) {
  auto r = c.Get("/metrics");
  if (!r || r->status != 200) return -1;
  std::istringstream in(r->body);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(sample + " ", 0) == 0) return std::stod(line.substr(sample.size() + 1));
  return -1;
}

struct Sse {
  int status = 0;
  std::vector<json> events;
  bool done = false;  // saw data: [DONE]
  std::string text;   // concatenated deltas
};

// Streams a request and parses its SSE events; stop_after > 0 aborts the connection after that many events.
Sse stream(httplib::Client& c, const std::string& path, const json& body, int stop_after = 0) {
  Sse out;
  std::string buf;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.response_handler = [&](const httplib::Response& r) {
    out.status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    buf.append(d, n);
    for (size_t e; (e = buf.find("\n\n")) != std::string::npos;) {
      std::string ev = buf.substr(0, e);
      buf.erase(0, e + 2);
      if (ev.rfind("data: ", 0) != 0) continue;
      ev = ev.substr(6);
      if (ev == "[DONE]") {
        out.done = true;
        continue;
      }
      json j = json::parse(ev);
      if (j.contains("choices") && !j["choices"].empty()) {
        const json& ch = j["choices"][0];
        if (ch.contains("text")) out.text += ch["text"].get<std::string>();
        if (ch.contains("delta") && ch["delta"].contains("content")) out.text += ch["delta"]["content"].get<std::string>();
      }
      out.events.push_back(std::move(j));
      if (stop_after > 0 && static_cast<int>(out.events.size()) >= stop_after) return false;
    }
    return true;
  };
  c.send(req);
  return out;
}

void expect_error_object(const json& j, const std::string& what) {
  ASSERT_TRUE(j.contains("error")) << what << ": " << j.dump();
  const json& e = j["error"];
  for (const char* k : {"message", "type", "param", "code"}) EXPECT_TRUE(e.contains(k)) << what << ": no " << k;
  EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty()) << what;
  EXPECT_TRUE(e["type"].is_string()) << what;
}

constexpr int kCtx = 256;

class ServerHttp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(write_tiny_qwen3("server_http", true));
    ServerOptions o;
    o.port = 0;
    o.max_slots = 4;
    o.max_context = kCtx;
    o.max_body_bytes = 64 * 1024;
    o.threads = 1;
    srv_ = new Server(*dir_, o);
    srv_->start();
    tok_ = new Tokenizer(Tokenizer::from_file(*dir_ + "/tokenizer.json"));
  }
  static void TearDownTestSuite() {
    delete srv_;
    delete tok_;
    if (dir_) fs::remove_all(*dir_);  // set-up may have thrown before the folder existed
    delete dir_;
    srv_ = nullptr;
    tok_ = nullptr;
    dir_ = nullptr;
  }
  httplib::Client client() const { return client_of(srv_->port()); }
  // What the engine alone produces for this prompt with greedy sampling (EOS text not included).
  // Invalid UTF-8 (a token may end mid-character) is replaced as the server's JSON writer does.
  static std::string reference(const std::vector<int32_t>& prompt, int n) {
    std::vector<int32_t> out = generate(srv_->model(), prompt, n, 0, SamplerParams{}, true, nullptr);
    if (!out.empty() && out.back() == 151645) out.pop_back();
    return json::parse(json(tok_->decode(out)).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
  }
  static std::string* dir_;
  static Server* srv_;
  static Tokenizer* tok_;
};
std::string* ServerHttp::dir_ = nullptr;
Server* ServerHttp::srv_ = nullptr;
Tokenizer* ServerHttp::tok_ = nullptr;

}  // namespace

TEST_F(ServerHttp, HealthModelsTokenize) {
  auto c = client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  json mj = json::parse(m->body);
  EXPECT_EQ(mj["object"], "list");
  EXPECT_EQ(mj["data"][0]["id"], fs::path(*dir_).filename().string());
  EXPECT_EQ(mj["data"][0]["max_model_len"], kCtx);
  int st = 0;
  json t = post_json(c, "/tokenize", {{"prompt", "Hello world"}}, &st);
  EXPECT_EQ(st, 200);
  EXPECT_EQ(t["tokens"].get<std::vector<int32_t>>(), tok_->encode("Hello world"));
  json d = post_json(c, "/detokenize", {{"tokens", t["tokens"]}}, &st);
  EXPECT_EQ(st, 200);
  EXPECT_EQ(d["prompt"], "Hello world");
  json tc = post_json(c, "/tokenize", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}}, &st);
  EXPECT_EQ(st, 200);
  EXPECT_EQ(tc["tokens"].get<std::vector<int32_t>>(),
            tok_->encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));
  auto mt = c.Get("/metrics");
  ASSERT_TRUE(mt);
  for (const char* name : {"elastic_requests_total{status=\"ok\"}", "elastic_prompt_tokens_total",
                           "elastic_generation_tokens_total", "elastic_prefill_tokens_per_second",
                           "elastic_decode_tokens_per_second", "elastic_omega_msr_mean", "elastic_kv_cache_bytes"})
    EXPECT_NE(mt->body.find(name), std::string::npos) << name;
}

TEST_F(ServerHttp, CompletionMatchesEngine) {
  auto c = client();
  int st = 0;
  json r = post_json(c, "/v1/completions", {{"prompt", "The capital of France is"}, {"max_tokens", 10}, {"temperature", 0}},
                     &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["choices"][0]["text"], reference(tok_->encode("The capital of France is"), 10));
  EXPECT_TRUE(r["choices"][0]["finish_reason"] == "length" || r["choices"][0]["finish_reason"] == "stop");
  EXPECT_EQ(r["usage"]["prompt_tokens"], tok_->encode("The capital of France is").size());
  EXPECT_LE(r["usage"]["completion_tokens"].get<int>(), 10);
  const json& e = r["elastic"];
  for (const char* k : {"omega_msr", "omega_esr", "kv_cache_bytes", "attention_flops_ratio"})
    EXPECT_TRUE(e.contains(k)) << k;
  EXPECT_EQ(e["omega_msr"], 0.0);  // the model's own routing: all full
  const int n = r["usage"]["prompt_tokens"];
  EXPECT_EQ(e["kv_cache_bytes"].get<size_t>(), kv_cache_bytes_for(srv_->model().config, n + 10, srv_->model().routing));
  // Token-id prompts, and stop strings cut the text before the stop.
  std::vector<int32_t> ids = tok_->encode("Once upon a time");
  json r2 = post_json(c, "/v1/completions", {{"prompt", ids}, {"max_tokens", 12}, {"temperature", 0}}, &st);
  ASSERT_EQ(st, 200);
  const std::string full = r2["choices"][0]["text"];
  EXPECT_EQ(full, reference(ids, 12));
  // Stop at a whole character from the second half (not U+FFFD, which stands for bytes the server replaced).
  size_t p = full.size() / 2;
  while (p < full.size() && ((static_cast<unsigned char>(full[p]) & 0xC0) == 0x80 || full.compare(p, 3, "\xEF\xBF\xBD") == 0))
    p += (static_cast<unsigned char>(full[p]) & 0xC0) == 0x80 ? 1 : 3;
  ASSERT_LT(p, full.size()) << "no usable stop character in: " << full;
  {
    size_t len = 1;
    while (p + len < full.size() && (static_cast<unsigned char>(full[p + len]) & 0xC0) == 0x80) ++len;
    const std::string stop = full.substr(p, len);
    json r3 = post_json(c, "/v1/completions", {{"prompt", ids}, {"max_tokens", 12}, {"temperature", 0}, {"stop", {stop}}},
                        &st);
    ASSERT_EQ(st, 200);
    EXPECT_EQ(r3["choices"][0]["text"], full.substr(0, full.find(stop)));
    EXPECT_EQ(r3["choices"][0]["finish_reason"], "stop");
  }
  // Seeded sampling is reproducible.
  json s1 = post_json(c, "/v1/completions", {{"prompt", ids}, {"max_tokens", 8}, {"temperature", 0.9}, {"top_p", 0.9},
                                             {"top_k", 50}, {"seed", 7}}, &st);
  json s2 = post_json(c, "/v1/completions", {{"prompt", ids}, {"max_tokens", 8}, {"temperature", 0.9}, {"top_p", 0.9},
                                             {"top_k", 50}, {"seed", 7}}, &st);
  EXPECT_EQ(s1["choices"][0]["text"], s2["choices"][0]["text"]);
}

TEST_F(ServerHttp, ChatCompletion) {
  auto c = client();
  int st = 0;
  json msgs = {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi there"}}};
  json r = post_json(c, "/v1/chat/completions", {{"messages", msgs}, {"max_tokens", 8}, {"temperature", 0}}, &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  const auto prompt =
      tok_->encode("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(r["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(r["choices"][0]["message"]["content"], reference(prompt, 8));
  EXPECT_TRUE(r.contains("elastic"));
}

TEST_F(ServerHttp, StreamingEqualsNonStreaming) {
  auto c = client();
  json body = {{"prompt", "Streaming test prompt"}, {"max_tokens", 12}, {"temperature", 0}};
  int st = 0;
  json whole = post_json(c, "/v1/completions", body, &st);
  ASSERT_EQ(st, 200);
  body["stream"] = true;
  Sse s = stream(c, "/v1/completions", body);
  EXPECT_EQ(s.status, 200);
  EXPECT_TRUE(s.done);
  ASSERT_GE(s.events.size(), 1u);
  EXPECT_EQ(s.text, whole["choices"][0]["text"]);
  const json& last = s.events.back();
  EXPECT_EQ(last["choices"][0]["finish_reason"], whole["choices"][0]["finish_reason"]);
  EXPECT_TRUE(last.contains("elastic"));
  EXPECT_EQ(last["usage"], whole["usage"]);

  json chat = {{"messages", {{{"role", "user"}, {"content", "Stream please"}}}}, {"max_tokens", 6}, {"temperature", 0},
               {"stream", true}};
  Sse cs = stream(c, "/v1/chat/completions", chat);
  EXPECT_TRUE(cs.done);
  ASSERT_GE(cs.events.size(), 2u);
  EXPECT_EQ(cs.events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(cs.events[0]["choices"][0]["delta"]["role"], "assistant");
  chat["stream"] = false;
  json cw = post_json(c, "/v1/chat/completions", chat, &st);
  EXPECT_EQ(cs.text, cw["choices"][0]["message"]["content"]);
}

TEST_F(ServerHttp, SixteenConcurrentClientsMatchSequential) {
  const int N = 16;
  std::vector<json> bodies;
  for (int i = 0; i < N; ++i)
    bodies.push_back({{"prompt", "Request number " + std::to_string(i) + " says"},
                      {"max_tokens", 6 + i % 5},
                      {"temperature", 0},
                      {"ignore_eos", true}});
  std::vector<std::string> seq(N), par(N);
  auto c = client();
  for (int i = 0; i < N; ++i) seq[i] = post_json(c, "/v1/completions", bodies[i])["choices"][0]["text"];
  const double steps0 = metric(c, "elastic_decode_steps_total"), rows0 = metric(c, "elastic_decode_batch_rows_total");
  std::vector<std::thread> th;
  std::atomic<int> ok{0};
  for (int i = 0; i < N; ++i)
    th.emplace_back([&, i] {
      httplib::Client ci = client_of(srv_->port());
      auto r = ci.Post("/v1/completions", bodies[i].dump(), "application/json");
      if (r && r->status == 200) {
        par[i] = json::parse(r->body)["choices"][0]["text"];
        ++ok;
      } else {
        ADD_FAILURE() << "client " << i << ": " << (r ? std::to_string(r->status) + " " + r->body : httplib::to_string(r.error()));
      }
    });
  for (auto& t : th) t.join();
  EXPECT_EQ(ok, N);
  for (int i = 0; i < N; ++i) EXPECT_EQ(par[i], seq[i]) << "client " << i;
  // Decode steps were shared: more sequence rows than steps.
  const double steps = metric(c, "elastic_decode_steps_total") - steps0;
  const double rows = metric(c, "elastic_decode_batch_rows_total") - rows0;
  EXPECT_GT(rows, steps * 1.5) << rows << " rows in " << steps << " steps";
  EXPECT_EQ(metric(c, "elastic_requests_running"), 0);
  EXPECT_EQ(metric(c, "elastic_kv_cache_bytes"), 0);
}

TEST_F(ServerHttp, DisconnectFreesTheSlot) {
  auto c = client();
  const double cancelled0 = metric(c, "elastic_requests_total{status=\"cancelled\"}");
  json body = {{"prompt", "A long story"}, {"max_tokens", kCtx - 8}, {"temperature", 0}, {"ignore_eos", true},
               {"stream", true}};
  Sse s = stream(c, "/v1/completions", body, 2);  // leaves after two events
  EXPECT_EQ(s.status, 200);
  EXPECT_FALSE(s.done);
  // A non-streaming client that gives up (read timeout) also cancels its request.
  {
    httplib::Client impatient("127.0.0.1", srv_->port());
    impatient.set_read_timeout(0, 20000);
    json b2 = body;
    b2["stream"] = false;
    auto r = impatient.Post("/v1/completions", b2.dump(), "application/json");
    EXPECT_FALSE(r);
  }
  double cancelled = 0, running = 1;
  for (int i = 0; i < 500; ++i) {
    cancelled = metric(c, "elastic_requests_total{status=\"cancelled\"}");
    running = metric(c, "elastic_requests_running");
    if (cancelled >= cancelled0 + 2 && running == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(cancelled, cancelled0 + 2);
  EXPECT_EQ(running, 0);
  EXPECT_EQ(metric(c, "elastic_kv_cache_bytes"), 0);
  int st = 0;
  json r = post_json(c, "/v1/completions", {{"prompt", "Still there?"}, {"max_tokens", 3}}, &st);
  EXPECT_EQ(st, 200) << r.dump();
}

TEST_F(ServerHttp, BadRequestsGet4xxAndServerKeepsServing) {
  auto c = client();
  struct Case {
    std::string path, body;
    int status;
    std::string what;
  };
  std::vector<int32_t> too_long(kCtx + 5, 9);
  const std::vector<Case> cases = {
      {"/v1/completions", "{not json", 400, "malformed JSON"},
      {"/v1/completions", "[1, 2]", 400, "JSON that is not an object"},
      {"/v1/completions", "{}", 400, "missing prompt"},
      {"/v1/completions", R"({"prompt": 5})", 400, "prompt of the wrong type"},
      {"/v1/completions", R"({"prompt": [1.5, 2]})", 400, "prompt ids that are not integers"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": "ten"})", 400, "max_tokens of the wrong type"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 1000000000000})", 400, "absurd max_tokens"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 1000})", 400, "max_tokens past the context"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": -3})", 400, "negative max_tokens"},
      {"/v1/completions", R"({"prompt": "x", "temperature": "hot"})", 400, "temperature of the wrong type"},
      {"/v1/completions", R"({"prompt": "x", "top_p": 7})", 400, "top_p out of range"},
      {"/v1/completions", R"({"prompt": "x", "stream": "yes"})", 400, "stream of the wrong type"},
      {"/v1/completions", R"({"prompt": "x", "stop": [1]})", 400, "stop of the wrong type"},
      {"/v1/completions", R"({"prompt": "x", "n": 3})", 400, "n > 1"},
      {"/v1/completions", R"({"prompt": "x", "model": "gpt-9"})", 404, "unknown model"},
      {"/v1/completions", R"({"prompt": [999999]})", 400, "token id outside the vocabulary"},
      {"/v1/completions", json({{"prompt", too_long}}).dump(), 400, "prompt longer than the context"},
      {"/v1/completions", R"({"prompt": ""})", 400, "empty prompt"},
      {"/v1/chat/completions", R"({"messages": "hi"})", 400, "messages of the wrong type"},
      {"/v1/chat/completions", R"({"messages": []})", 400, "no messages"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user"}]})", 400, "message without content"},
      {"/v1/chat/completions", R"({"messages": [{"role": "wizard", "content": "x"}]})", 400, "unknown role"},
      {"/v1/chat/completions", R"({"prompt": "x"})", 400, "chat without messages"},
      {"/detokenize", R"({"tokens": [-1]})", 400, "negative token id"},
      {"/tokenize", R"({"prompt": 3})", 400, "tokenize prompt of the wrong type"},
      {"/v1/completions", "{\"prompt\": \"" + std::string(70 * 1024, 'a') + "\"}", 413, "oversized body"},
      {"/v1/nothing", "{}", 404, "unknown endpoint"},
  };
  for (const Case& k : cases) {
    auto r = c.Post(k.path.c_str(), k.body, "application/json");
    ASSERT_TRUE(r) << k.what << ": no response (" << httplib::to_string(r.error()) << ")";
    EXPECT_EQ(r->status, k.status) << k.what << ": " << r->body;
    json j = json::parse(r->body, nullptr, false);
    expect_error_object(j, k.what);
    auto h = c.Get("/health");
    ASSERT_TRUE(h) << "server stopped answering after: " << k.what;
    EXPECT_EQ(h->status, 200);
  }
  EXPECT_GE(metric(c, "elastic_http_errors_total{class=\"4xx\"}"), double(cases.size()));
  // A second server on the same port is refused (no SO_REUSEPORT sharing).
  ServerOptions o;
  o.port = srv_->port();
  Server twin(*dir_, o);
  EXPECT_THROW(twin.bind(), std::runtime_error);
  int st = 0;
  json ok = post_json(c, "/v1/completions", {{"prompt", "fine"}, {"max_tokens", 2}}, &st);
  EXPECT_EQ(st, 200) << ok.dump();
}

// A second server: no chat template, a per-request router, and a KV budget that holds one request at a time.
TEST(ServerLimits, RouterBudgetAndNoChatTemplate) {
  const std::string dir = write_tiny_qwen3("server_limits", false);
  ServerOptions o;
  o.port = 0;
  o.max_slots = 4;
  o.max_context = 512;
  o.threads = 1;
  // Routes by content: long prompts (> 150 tokens) get streaming heads (sink 64 + window 64).
  o.route = [](const std::vector<int32_t>& p) {
    RoutingTable r = RoutingTable::all_full(2, 1);
    r.sparse.sink = 64;
    r.sparse.local = 64;
    if (p.size() > 150) r.mode.assign(2, HeadMode::Streaming);
    return r;
  };
  Model probe_model = Model::load(dir);
  const ModelConfig cfg = probe_model.config;
  const RoutingTable full = RoutingTable::all_full(2, 1);
  o.kv_budget_bytes = kv_cache_bytes_for(cfg, 300, full);  // one 300-position full request
  Server srv(std::move(probe_model), dir, o);
  srv.start();
  httplib::Client c = client_of(srv.port());
  int st = 0;
  json chat = post_json(c, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}}, &st);
  EXPECT_EQ(st, 400);
  expect_error_object(chat, "no chat template");
  EXPECT_NE(chat["error"]["message"].get<std::string>().find("no chat template"), std::string::npos);

  // Too big for the whole budget: rejected at once.
  json big = post_json(c, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 400}}, &st);
  EXPECT_EQ(st, 400);
  EXPECT_EQ(big["error"]["code"], "kv_budget_exceeded");
  // As long a request routed sparse (long prompt) fits: its hybrid cache is sink + window per head.
  std::vector<int32_t> long_prompt(200, 100);
  json sparse = post_json(c, "/v1/completions", {{"prompt", long_prompt}, {"max_tokens", 200}, {"temperature", 0}}, &st);
  ASSERT_EQ(st, 200) << sparse.dump();
  EXPECT_EQ(sparse["elastic"]["omega_msr"], 1.0);
  RoutingTable ssa = RoutingTable::uniform(2, 1, HeadMode::Streaming);
  ssa.sparse.sink = 64;
  ssa.sparse.local = 64;
  EXPECT_EQ(sparse["elastic"]["kv_cache_bytes"].get<size_t>(), kv_cache_bytes_for(cfg, 400, ssa));
  EXPECT_LT(sparse["elastic"]["kv_cache_bytes"].get<size_t>(), kv_cache_bytes_for(cfg, 400, full));
  EXPECT_LT(sparse["elastic"]["attention_flops_ratio"].get<double>(), 1.0);

  // Three requests that each need most of the budget: they run one after another, all served.
  const double waited0 = metric(c, "elastic_requests_waited_total");
  std::vector<std::thread> th;
  std::atomic<int> ok{0};
  for (int i = 0; i < 3; ++i)
    th.emplace_back([&, i] {
      httplib::Client ci = client_of(srv.port());
      json b = {{"prompt", "queue " + std::to_string(i)}, {"max_tokens", 290}, {"ignore_eos", true}, {"temperature", 0}};
      auto r = ci.Post("/v1/completions", b.dump(), "application/json");
      if (r && r->status == 200) ++ok;
    });
  for (auto& t : th) t.join();
  EXPECT_EQ(ok, 3);
  EXPECT_GE(metric(c, "elastic_requests_waited_total") - waited0, 1);
  EXPECT_DOUBLE_EQ(metric(c, "elastic_omega_msr_mean"), 1.0 / 4);  // 1 sparse of 4 finished requests
  srv.stop();
  fs::remove_all(dir);
}

// The model's own PromptRouter (Model::router) routes each request at prefill when no route function is given.
namespace {
struct AllStreamingRouter : PromptRouter {
  SparseSettings s;
  AllStreamingRouter() {
    s.sink = 64;
    s.local = 64;
  }
  int pool_first() const override { return 4; }
  int pool_last() const override { return 4; }
  const SparseSettings& sparse() const override { return s; }
  void decide(int, const float*, HeadMode* modes) const override { modes[0] = HeadMode::Streaming; }
  // What it decides for the tiny model (2 layers, 1 KV head): every head streaming, with its sparse settings.
  static RoutingTable table() {
    RoutingTable r = RoutingTable::uniform(2, 1, HeadMode::Streaming);
    r.sparse = AllStreamingRouter().s;
    return r;
  }
};
}  // namespace

TEST(ServerLimits, ModelRouterDecidesAtPrefill) {
  const std::string dir = write_tiny_qwen3("server_router", false);
  Model m = Model::load(dir);
  m.router = std::make_shared<AllStreamingRouter>();
  const ModelConfig cfg = m.config;
  ServerOptions o;
  o.port = 0;
  o.max_context = 512;
  o.threads = 1;
  Server srv(std::move(m), dir, o);
  srv.start();
  httplib::Client c = client_of(srv.port());
  int st = 0;
  std::vector<int32_t> prompt(150, 42);
  json r = post_json(c, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 100}, {"temperature", 0}}, &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["elastic"]["omega_msr"], 1.0);
  const RoutingTable ssa = AllStreamingRouter::table();
  EXPECT_EQ(r["elastic"]["kv_cache_bytes"].get<size_t>(), kv_cache_bytes_for(cfg, 250, ssa));
  EXPECT_EQ(metric(c, "elastic_kv_cache_bytes"), 0);
  srv.stop();
  fs::remove_all(dir);
}

namespace {
// Server options for a backend-served test server: one slot, the CPU model behind the SequenceBackend interface with
// `context` positions (prefill chunks of 64), any free port.
ServerOptions backend_options(std::shared_ptr<const Model> m, int context) {
  ServerOptions o;
  o.port = 0;
  o.max_context = context;
  o.threads = 1;
  o.max_slots = 1;
  o.backend = cpu_sequence_backend(std::move(m), context, 64);
  return o;
}
}  // namespace

// A SequenceBackend (what `serve --device cuda` uses) serves requests one at a time: here the CPU model behind that
// interface, so CI runs the backend path; the answers equal the batched CPU path's (greedy), a router still decides
// per request, and the limits of the backend are checked when the server starts.
TEST(ServerBackend, CpuBackendAnswersLikeTheBatchedPath) {
  const std::string dir = write_tiny_qwen3("server_backend", false);
  Model m = Model::load(dir);
  const Tokenizer tok = Tokenizer::from_file(dir + "/tokenizer.json");
  auto shared = std::make_shared<const Model>(m);
  Server srv(std::move(m), dir, backend_options(shared, 256));
  srv.start();
  httplib::Client c = client_of(srv.port());
  const std::vector<int32_t> ids = tok.encode("Once upon a time");
  std::vector<int32_t> want = generate(*shared, ids, 12, 0, SamplerParams{}, true, nullptr);
  int st = 0;
  json r = post_json(c, "/v1/completions", {{"prompt", ids}, {"max_tokens", 12}, {"temperature", 0}}, &st);
  ASSERT_EQ(st, 200) << r.dump();
  if (!want.empty() && want.back() == 151645) want.pop_back();
  EXPECT_EQ(r["usage"]["completion_tokens"].get<int>(), static_cast<int>(want.size()) + (want.size() < 12 ? 1 : 0));
  EXPECT_EQ(r["choices"][0]["text"].get<std::string>(),
            json::parse(json(tok.decode(want)).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>());
  EXPECT_EQ(r["elastic"]["omega_msr"], 0.0);
  EXPECT_EQ(r["elastic"]["kv_cache_bytes"].get<size_t>(), kv_cache_bytes_for(shared->config, 256, shared->routing));
  // Streaming gives the same text, in deltas.
  const Sse sse = stream(c, "/v1/completions",
                         {{"prompt", ids}, {"max_tokens", 12}, {"temperature", 0}, {"stream", true}});
  EXPECT_EQ(sse.status, 200);
  EXPECT_TRUE(sse.done);
  EXPECT_EQ(sse.text, r["choices"][0]["text"].get<std::string>());
  // Two requests at once: the second waits for the one slot, both answer.
  std::thread t([&] {
    httplib::Client c2 = client_of(srv.port());
    int st2 = 0;
    json r2 = post_json(c2, "/v1/completions", {{"prompt", ids}, {"max_tokens", 12}, {"temperature", 0}}, &st2);
    EXPECT_EQ(st2, 200);
    EXPECT_EQ(r2["choices"][0]["text"], r["choices"][0]["text"]);
  });
  json r3 = post_json(c, "/v1/completions", {{"prompt", ids}, {"max_tokens", 12}, {"temperature", 0}}, &st);
  EXPECT_EQ(st, 200);
  EXPECT_EQ(r3["choices"][0]["text"], r["choices"][0]["text"]);
  t.join();
  srv.stop();
  fs::remove_all(dir);
}

TEST(ServerBackend, RouterDecidesOnTheBackendAndLimitsAreChecked) {
  const std::string dir = write_tiny_qwen3("server_backend_router", false);
  Model m = Model::load(dir);
  m.router = std::make_shared<AllStreamingRouter>();
  auto shared = std::make_shared<const Model>(m);
  const ServerOptions o = backend_options(shared, 512);
  {
    ServerOptions bad = o;
    bad.max_slots = 4;
    try {
      Server s(m, dir, bad);
      ADD_FAILURE() << "no error for 4 slots on a backend";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("one request at a time"), std::string::npos) << e.what();
    }
    bad.max_slots = 1;
    bad.max_context = 1024;  // past the backend's 512 positions
    try {
      Server s(m, dir, bad);
      ADD_FAILURE() << "no error for a context past the backend's capacity";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("capacity of 512"), std::string::npos) << e.what();
    }
  }
  Server srv(std::move(m), dir, o);
  srv.start();
  httplib::Client c = client_of(srv.port());
  int st = 0;
  std::vector<int32_t> prompt(150, 42);
  json r = post_json(c, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 20}, {"temperature", 0}}, &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["elastic"]["omega_msr"], 1.0);  // the router's decision, made inside the backend's prefill
  const RoutingTable ssa = AllStreamingRouter::table();
  EXPECT_EQ(r["elastic"]["kv_cache_bytes"].get<size_t>(), kv_cache_bytes_for(shared->config, 512, ssa));
  // A request longer than the context is refused by the HTTP side, as without a backend.
  json big = post_json(c, "/v1/completions", {{"prompt", std::vector<int32_t>(500, 42)}, {"max_tokens", 20}}, &st);
  EXPECT_EQ(st, 400) << big.dump();
  srv.stop();
  fs::remove_all(dir);
}

TEST(SequenceBackendCpu, RejectsMisuse) {
  const std::string dir = write_tiny_qwen3("backend_misuse", false);
  auto m = std::make_shared<const Model>(Model::load(dir));
  auto be = cpu_sequence_backend(m, 32, 16);
  std::vector<float> logits;
  RoutingTable used;
  EXPECT_THROW(be->decode(1, logits), std::logic_error);                              // before any prefill
  EXPECT_THROW(be->prefill(std::vector<int32_t>(40, 1), nullptr, nullptr, logits, used), std::invalid_argument);
  AllStreamingRouter foreign;
  EXPECT_THROW(be->prefill({1, 2, 3}, nullptr, &foreign, logits, used), std::invalid_argument);  // not the model's
  be->prefill(std::vector<int32_t>(31, 1), nullptr, nullptr, logits, used);
  EXPECT_EQ(logits.size(), static_cast<size_t>(m->config.vocab));
  be->decode(2, logits);                                                               // position 31: the last slot
  EXPECT_THROW(be->decode(3, logits), std::invalid_argument);                          // past the capacity
  EXPECT_THROW(cpu_sequence_backend(m, 0, 16), std::invalid_argument);
  fs::remove_all(dir);
}
