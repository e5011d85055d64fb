// The fuzz targets: for each parser, seeds made by our own writers (so a mutant starts from a valid file and gets
// past the magic and the first length) plus the fixture files, and a run that parses and then touches what it read.
#include "fuzz_targets.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "elastic/attention.h"
#include "elastic/chat_template.h"
#include "elastic/config.h"
#include "elastic/csv_table.h"
#include "elastic/gguf.h"
#include "elastic/gguf_writer.h"
#include "elastic/npy.h"
#include "elastic/router.h"
#include "elastic/safetensors.h"
#include "elastic/tokenizer.h"
#include "elastic/train.h"
#include "../byte_level.h"
#include "../gguf_model_writer.h"
#include "server/server_internal.h"

namespace elastic::fuzz {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Writes with `write` to a scratch file and returns the bytes (seeds come from the real writers).
template <class F>
std::string made_by(const std::string& scratch, const std::string& name, F&& write) {
  const std::string p = (fs::path(scratch) / name).string();
  write(p);
  return slurp(p);
}

// Fixture files under `fixtures` whose name ends with `suffix`, at most `max_bytes` each.
std::vector<std::string> fixture_seeds(const std::string& fixtures, const std::string& suffix, size_t max_bytes) {
  std::vector<std::string> paths;
  for (const auto& e : fs::recursive_directory_iterator(fixtures)) {
    const std::string p = e.path().string();
    if (e.is_regular_file() && p.size() >= suffix.size() && p.compare(p.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        e.file_size() <= max_bytes)
      paths.push_back(p);
  }
  std::sort(paths.begin(), paths.end());  // directory order differs between machines; seeds must not
  std::vector<std::string> out;
  for (const auto& p : paths) out.push_back(slurp(p));
  return out;
}

// ------------------------------------------------------------------------------------------- tokenizer.json

using elastic::testing::byte_level_vocab;

// A small tokenizer.json with every part the loader reads: byte-level vocab, merges (both forms), added tokens,
// an NFC normalizer Sequence and a pre-tokenizer Sequence of Split, Digits and ByteLevel.
json tiny_tokenizer() {
  json vocab = byte_level_vocab();
  vocab["he"] = 256;
  vocab["ll"] = 257;
  vocab["hell"] = 258;
  vocab["Ġw"] = 259;
  json j;
  j["version"] = "1.0";
  j["added_tokens"] = json::array({{{"id", 300}, {"content", "<|im_start|>"}, {"special", true}},
                                   {{"id", 301}, {"content", "<|im_end|>"}, {"special", true}}});
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFC"}}})}};
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"},
                     {"pattern", {{"Regex", "(?i:'s|'t)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+|\\s+"}}},
                     {"behavior", "Isolated"},
                     {"invert", false}},
                    {{"type", "Digits"}, {"individual_digits", true}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  j["model"] = {{"type", "BPE"},
                {"unk_token", nullptr},
                {"vocab", vocab},
                {"merges", json::array({"h e", "l l", json::array({"he", "ll"}), "Ġ w"})}};
  return j;
}

void use_tokenizer(const Tokenizer& t) {
  const std::string texts[] = {"hello world 123", "<|im_start|>user\ne\xCC\x81 caf\xC3\xA9<|im_end|>", "\xff\xfe bad",
                               std::string(300, 'l')};
  for (const std::string& s : texts) {
    const auto ids = t.encode(s);
    t.decode(ids);
    for (int32_t id : ids) t.token_text(id);
    t.encode(s, Tokenizer::Special::AsText);
  }
}

Target tokenizer_target(const std::string& scratch) {
  Target t{"tokenizer", true, true, {}, {}};
  t.seeds.push_back(tiny_tokenizer().dump(1));
  json plain = tiny_tokenizer();
  plain["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}};
  plain["normalizer"] = nullptr;
  plain["model"]["ignore_merges"] = true;
  t.seeds.push_back(plain.dump());
  (void)scratch;
  t.run = [](const std::string& path) { use_tokenizer(Tokenizer::from_file(path)); };
  return t;
}

// ------------------------------------------------------------------------------------------- binary formats

Target npy_target(const std::string& fixtures, const std::string& scratch) {
  Target t{"npy", false, true, fixture_seeds(fixtures, ".npy", 64 << 10), {}};
  t.seeds.push_back(made_by(scratch, "ids.npy", [](const std::string& p) { write_npy_i32(p, {1, 2, 3, 500}); }));
  const std::vector<float> x = {1.f, -2.f, 3.5f, 0.f, 7.f, 8.f};
  t.seeds.push_back(made_by(scratch, "f.npy", [&](const std::string& p) { write_npy_f32(p, x.data(), {2, 3}); }));
  t.seeds.push_back(made_by(scratch, "s.npy", [&](const std::string& p) { write_npy_f32(p, x.data(), {}); }));
  // Every input goes through both readers (an ids file is not a float file and the other way round): it is
  // accepted when one of them takes it, refused with the id reader's error when neither does.
  t.run = [](const std::string& path) {
    std::string ids_error;
    try {
      read_npy_ids(path);
    } catch (const std::runtime_error& e) {
      ids_error = e.what();
    }
    std::vector<int64_t> shape;
    try {
      read_npy_f32(path, &shape);
    } catch (const std::runtime_error&) {
      if (!ids_error.empty()) throw std::runtime_error(ids_error);
    }
  };
  return t;
}

Target safetensors_target(const std::string& fixtures, const std::string& scratch) {
  Target t{"safetensors", false, true, fixture_seeds(fixtures, "-of-00007.safetensors", 100 << 10), {}};
  t.seeds.resize(std::min<size_t>(t.seeds.size(), 2));
  t.seeds.push_back(made_by(scratch, "a.safetensors", [](const std::string& p) {
    write_safetensors_f32(p, {{"w", {2, 3}, {1, 2, 3, 4, 5, 6}}, {"b", {3}, {7, 8, 9}}, {"s", {}, {1}}},
                          {{"format", "pt"}, {"note", "seed"}});
  }));
  // Hand-made F16 / BF16 header (our writer writes F32 only).
  const std::string h = R"({"h":{"dtype":"F16","shape":[2,2],"data_offsets":[0,8]},)"
                        R"("g":{"dtype":"BF16","shape":[4],"data_offsets":[8,16]},"__metadata__":{"k":"v"}})";
  std::string b(8, '\0');
  const uint64_t hl = h.size();
  std::memcpy(b.data(), &hl, 8);
  t.seeds.push_back(b + h + std::string("\x00\x3c\x00\xbc\x00\x7c\xff\x7f\x80\x3f\x00\x40\x80\x7f\xc0\xff", 16));
  t.run = [](const std::string& path) {
    const SafeTensors st = SafeTensors::open(path);
    for (const auto& [name, v] : st.tensors()) to_f32(v);
  };
  return t;
}

// GGUF files from our writer: every metadata type, float and quantized tensors, and a second file with a
// tokenizer (read back through Tokenizer::from_gguf).
std::vector<std::string> gguf_seeds(const std::string& fixtures, const std::string& scratch) {
  using namespace gguf;
  std::vector<std::string> out;
  std::vector<float> x(256);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) * 0.25f - 2.f;
  out.push_back(made_by(scratch, "a.gguf", [&](const std::string& p) {
    Writer w;
    w.set_str("general.architecture", "llama");
    w.set_u32("llama.block_count", 2);
    w.set_u64("u64", 1ULL << 40);
    w.set_i32("i32", -5);
    w.set_f32("f32", 0.5f);
    w.set_bool("flag", true);
    w.set_str_array("strs", {"a", "bc", ""});
    w.set_i32_array("ints", {1, -2, 3});
    w.set_f32_array("floats", {1.5f, 2.5f});
    w.add_tensor("f32", {8, 2}, GgmlType::F32, x.data());
    w.add_tensor("f16", {4}, GgmlType::F16, x.data());
    w.add_tensor("bf16", {4}, GgmlType::BF16, x.data());
    w.add_tensor("q8", {32, 2}, GgmlType::Q8_0, x.data());
    w.add_tensor("q4", {64}, GgmlType::Q4_0, x.data());
    w.add_tensor("q41", {32}, GgmlType::Q4_1, x.data());
    const std::string q4k = slurp(fixtures + "/gguf/q4_k.bin"), q6k = slurp(fixtures + "/gguf/q6_k.bin");
    w.add_raw("q4k", {256, static_cast<int64_t>(q4k.size() / 144)}, 12, std::vector<uint8_t>(q4k.begin(), q4k.end()));
    w.add_raw("q6k", {256, static_cast<int64_t>(q6k.size() / 210)}, 14, std::vector<uint8_t>(q6k.begin(), q6k.end()));
    w.write(p);
  }));
  // A whole tiny model (the llama fixture in Q8_0 blocks), for Model::load_gguf's metadata and tensor checks.
  out.push_back(made_by(scratch, "model.gguf", [&](const std::string& p) {
    elastic::testing::GgufOpts o;
    o.mat = GgmlType::Q8_0;
    write_model_gguf(Model::load(fixtures + "/llama_tiny"), p, o);
  }));
  out.push_back(made_by(scratch, "tok.gguf", [&](const std::string& p) {
    Writer w;
    const json tok = tiny_tokenizer();
    std::vector<std::string> tokens(302);
    std::vector<int32_t> types(302, 1);
    for (auto& [s, id] : tok["model"]["vocab"].items()) tokens[id.get<int>()] = s;
    for (int id = 260; id < 300; ++id) tokens[id] = "<unused" + std::to_string(id) + ">", types[id] = 5;
    tokens[300] = "<|im_start|>", tokens[301] = "<|im_end|>", types[300] = types[301] = 3;
    w.set_str("tokenizer.ggml.model", "gpt2");
    w.set_str("tokenizer.ggml.pre", "qwen2");
    w.set_str_array("tokenizer.ggml.tokens", tokens);
    w.set_str_array("tokenizer.ggml.merges", {"h e", "l l", "he ll", "Ġ w"});
    w.set_i32_array("tokenizer.ggml.token_type", types);
    w.set_u32("tokenizer.ggml.eos_token_id", 301);
    w.add_tensor("t", {4}, GgmlType::F32, x.data());
    w.write(p);
  }));
  return out;
}

Target gguf_target(const std::string& fixtures, const std::string& scratch) {
  Target t{"gguf", false, true, gguf_seeds(fixtures, scratch), {}};
  t.run = [](const std::string& path) {
    const gguf::File f = gguf::File::open(path);
    for (const gguf::TensorInfo& ti : f.tensors()) f.dequantize(ti);
    for (const auto& [key, v] : f.metadata()) {
      if (v.type == gguf::ValueType::STRING) f.get_string(key);
      else if (v.type == gguf::ValueType::ARRAY) f.get_array(key, v.elem);
      else if (v.is_integer() && v.type != gguf::ValueType::BOOL) f.get_int(key);
      else if (v.is_float()) f.get_float(key);
    }
    if (f.find("tokenizer.ggml.model")) use_tokenizer(Tokenizer::from_gguf(path));
    // A model file: its config from the metadata and every layer's tensors (sizes the loader allocates for).
    if (f.find("general.architecture") && f.find_tensor("token_embd.weight")) Model::load_gguf(path);
  };
  return t;
}

// ------------------------------------------------------------------------------------------- JSON and text files

Target config_target(const std::string& fixtures) {
  Target t{"config", true, true, fixture_seeds(fixtures, "/config.json", 64 << 10), {}};
  t.run = [](const std::string& path) { load_config(path); };
  return t;
}

ModelConfig router_model() {
  ModelConfig c;
  c.arch = Arch::Llama;
  c.hidden = 32, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 8, c.intermediate = 64, c.vocab = 302;
  return c;
}

Target router_target(const std::string& scratch) {
  Target t{"router", false, true, {}, {}};
  RouterSpec spec;
  const ModelConfig c = router_model();
  spec.n_layers = c.n_layers, spec.n_kv_heads = c.n_kv_heads, spec.head_dim = c.head_dim;
  spec.base_model = model_fingerprint(c);
  spec.targets = default_targets();
  t.seeds.push_back(made_by(scratch, "r.safetensors", [&](const std::string& p) { Router::init(spec, 1).save(p); }));
  spec.sigmoid = true;
  spec.sparse_mode = HeadMode::XAttn;
  t.seeds.push_back(made_by(scratch, "r2.safetensors", [&](const std::string& p) { Router::init(spec, 2).save(p); }));
  t.run = [](const std::string& path) { Router::load(path, router_model()); };
  return t;
}

Target train_data_target(const std::string& scratch) {
  Target t{"train_data", true, true, {}, {}};
  t.seeds.push_back(
      "{\"task\": \"qa\", \"input_ids\": [1, 2, 3, 4], \"output_ids\": [5, 6]}\n"
      "{\"task\": \"retrieval\", \"input\": \"hello world\", \"output\": \"hell\"}\n"
      "\n"
      "{\"task\": \"niah\", \"input_ids\": [7], \"output_ids\": [301]}\r\n");
  // The tokenizer for the text samples, a helper file of the target.
  const std::string tok_path = (fs::path(scratch) / "train_tokenizer.json").string();
  std::ofstream(tok_path) << tiny_tokenizer().dump();
  auto tok = std::make_shared<Tokenizer>(Tokenizer::from_file(tok_path));
  t.run = [tok](const std::string& path) {
    DataReport rep;
    load_train_jsonl(path, tok.get(), default_targets(), {{"niah", "retrieval"}}, &rep);
  };
  return t;
}

Target routing_target(const std::string& scratch) {
  Target t{"routing", true, true, {}, {}};
  RoutingTable r = RoutingTable::uniform(2, 2, HeadMode::Streaming);
  r.mode[1] = HeadMode::Full;
  r.mode[2] = HeadMode::XAttn;
  t.seeds.push_back(made_by(scratch, "routing.json", [&](const std::string& p) { save_routing(r, p); }));
  t.run = [](const std::string& path) { load_routing(path, 2, 2); };
  return t;
}

Target csv_target() {
  Target t{"csv", true, true, {}, {}};
  t.seeds.push_back("# comment\nx, a, b\n1, 2.5, 3\n2, , 4e3\n3, -1, nan\n");
  t.run = [](const std::string& path) { read_numeric_csv(path); };
  return t;
}


// HTTP request bodies (the server's hostile input): the JSON reader, both endpoints' request parsers on every body
// (a client may send anything to either), then what a chat request becomes before it is queued: its prompt ids
// through a Qwen3 chat template and a tokenizer. A refusal must be an ApiError with status 400 (the server answers
// anything else as 500); a parsed request must render, or be refused by the template with its own error.
Target openai_request_target(const std::string& scratch) {
  Target t{"openai_request", true, false, {}, {}};
  t.seeds = {
      R"({"model": "m", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],)"
      R"( "max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 3, "stop": ["\n", "END"],)"
      R"( "stream": true, "stream_options": {"include_usage": true}})",
      R"({"messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},)"
      R"( {"role": "assistant", "content": "<|im_start|>x"}, {"role": "user", "content": "\u00e9"}],)"
      R"( "max_completion_tokens": 4, "ignore_eos": true, "return_token_ids": false, "n": 1})",
      R"({"prompt": "hello world", "max_tokens": 8, "stop": "x", "temperature": 0})",
      R"({"prompt": [1, 2, 300, 301], "seed": -5, "top_k": -1})",
      R"({"prompt": ["one prompt"], "model": "m", "stream": false})",
  };
  const std::string tok_path = (fs::path(scratch) / "request_tokenizer.json").string();
  std::ofstream(tok_path) << tiny_tokenizer().dump();
  auto tok = std::make_shared<Tokenizer>(Tokenizer::from_file(tok_path));
  auto tmpl = std::make_shared<ChatTemplate>(ChatTemplate::from_string(
      "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n'}}{% endfor %}"
      "{% if add_generation_prompt %}{{'<|im_start|>assistant\n<think>\n\n</think>\n\n'}}{% endif %}"));
  t.run = [tok, tmpl](const std::string& path) {
    auto refused_right = [](const server::ApiError& e) {
      if (e.status != 400)
        throw std::logic_error("a request refused with status " + std::to_string(e.status) + ": " + e.what());
    };
    nlohmann::json body;
    try {
      body = server::parse_json_body(slurp(path));
    } catch (const server::ApiError& e) {
      refused_right(e);
      return;
    }
    bool completion_ok = true;
    try {
      server::parse_completion_request(body);
    } catch (const server::ApiError& e) {
      refused_right(e);
      completion_ok = false;
    }
    server::GenSpec chat;
    try {
      chat = server::parse_chat_request(body);
    } catch (const server::ApiError& e) {
      refused_right(e);
      if (!completion_ok) throw;  // refused by both: counted as not accepted (a right refusal, not a failure)
      return;
    }
    for (bool special : {false, true}) tmpl->encode(*tok, chat.messages, true, special);
  };
  return t;
}
}  // namespace

std::vector<Target> make_targets(const std::string& fixtures, const std::string& scratch) {
  fs::create_directories(scratch);
  std::vector<Target> out;
  out.push_back(npy_target(fixtures, scratch));
  out.push_back(safetensors_target(fixtures, scratch));
  out.push_back(gguf_target(fixtures, scratch));
  out.push_back(tokenizer_target(scratch));
  out.push_back(config_target(fixtures));
  out.push_back(router_target(scratch));
  out.push_back(train_data_target(scratch));
  out.push_back(routing_target(scratch));
  out.push_back(csv_target());
  out.push_back(openai_request_target(scratch));
  return out;
}

}  // namespace elastic::fuzz
