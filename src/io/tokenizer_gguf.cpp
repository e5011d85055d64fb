// Tokenizer::from_gguf: rebuilds the tokenizer.json that a GGUF "gpt2" (byte-level BPE) vocabulary came from and
// hands it to Tokenizer::from_json, so both paths share one BPE / pre-tokenizer implementation.
//
// GGUF keeps the vocab (tokenizer.ggml.tokens, index = id, byte-level strings as in tokenizer.json), the merges
// ("a b" strings, rank order), token types (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte) and
// only a *name* for the pre-tokenizer (tokenizer.ggml.pre); the name is mapped back to the HF pre-tokenizer (and
// normalizer) of the model family that llama.cpp's converter recognized.
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "elastic/gguf.h"
#include "elastic/tokenizer.h"

namespace elastic {
namespace {

using nlohmann::json;

// GPT-2's regex is the one ByteLevel(use_regex=true) applies itself.
json byte_level(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}
json split_then_byte_level(const char* regex) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}},
            byte_level(false)}}};
}

// Llama-3 (tiktoken cl100k-like): digits in runs of up to 3.
const char* kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// Qwen2 / Qwen3: the same with single digits.
const char* kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// (pre_tokenizer, normalizer) of tokenizer.json for a tokenizer.ggml.pre name; false when unknown.
bool pre_tokenizer_for(const std::string& pre, json& pt, json& norm) {
  norm = nullptr;
  if (pre == "default" || pre == "gpt2") {
    pt = byte_level(true);
  } else if (pre == "smollm" || pre == "starcoder" || pre == "refact") {
    // SmolLM / StarCoder: each digit alone, then GPT-2 byte-level splitting.
    pt = {{"type", "Sequence"},
          {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level(true)}}};
  } else if (pre == "llama-bpe" || pre == "llama3") {
    pt = split_then_byte_level(kLlama3Regex);
  } else if (pre == "qwen2") {
    pt = split_then_byte_level(kQwen2Regex);
    norm = {{"type", "NFC"}};
  } else {
    return false;
  }
  return true;
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const std::string& path) {
  const gguf::File f = gguf::File::open(path);
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (model != "gpt2")
    f.fail("tokenizer.ggml.model '" + model + "' is not supported (only \"gpt2\", byte-level BPE)");
  const std::string pre = f.find("tokenizer.ggml.pre") ? f.get_string("tokenizer.ggml.pre") : "default";
  json pt, norm;
  if (!pre_tokenizer_for(pre, pt, norm))
    f.fail("unknown tokenizer.ggml.pre '" + pre + "' (supported: default, gpt2, smollm, starcoder, refact, llama-bpe, "
           "qwen2)");

  const gguf::Value& tokens = f.get_array("tokenizer.ggml.tokens", gguf::ValueType::STRING);
  const gguf::Value& merges = f.get_array("tokenizer.ggml.merges", gguf::ValueType::STRING);
  const gguf::Value* types = f.find("tokenizer.ggml.token_type") ? &f.get_array("tokenizer.ggml.token_type",
                                                                                gguf::ValueType::I32)
                                                                  : nullptr;
  if (types && types->size() != tokens.size())
    f.fail("tokenizer.ggml.token_type has " + std::to_string(types->size()) + " entries for " +
           std::to_string(tokens.size()) + " tokens");

  json vocab = json::object(), added = json::array();
  for (size_t id = 0; id < tokens.strs.size(); ++id) {
    const std::string& t = tokens.strs[id];
    // A repeated string keeps its first id, as the HF vocab (a map) would.
    if (!vocab.contains(t)) vocab[t] = id;
    const int64_t ty = types ? types->ints[id] : 1;
    if (ty == 3 || ty == 4) added.push_back({{"id", id}, {"content", t}, {"special", ty == 3}});
  }
  json j = {{"model", {{"type", "BPE"}, {"vocab", std::move(vocab)}, {"merges", merges.strs}}},
            {"added_tokens", std::move(added)},
            {"normalizer", norm},
            {"pre_tokenizer", pt}};
  return from_json(j, path);
}

}  // namespace elastic
