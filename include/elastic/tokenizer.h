#pragma once
// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (Qwen3, Llama-3) or a GGUF file's
// tokenizer.ggml.* metadata (model "gpt2").
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace elastic {

// The tokenizer a model comes with, one rule for every command and the server: `override_path` when given, else the
// model itself when it is a GGUF file whose metadata carries a tokenizer, else the model folder's tokenizer.json
// when there is one; "" when there is none.
std::string model_tokenizer_path(const std::string& model, const std::string& override_path = "");

class Tokenizer {
 public:
  // Throws std::runtime_error naming the file and the problem on malformed input.
  // A file that starts with the GGUF magic is read with from_gguf.
  static Tokenizer from_file(const std::string& tokenizer_json_path);
  // The same from an already parsed tokenizer.json; `source` names it in errors.
  static Tokenizer from_json(const nlohmann::json& tokenizer_json, const std::string& source);
  // From a GGUF file's tokenizer.ggml.{model,pre,tokens,merges,token_type} (tokenizer_gguf.cpp): control and
  // user-defined tokens become added tokens; the pre-tokenizer name maps to its regexes (smollm, llama-bpe,
  // qwen2, gpt2, ...); an unknown name or a non-BPE model throws.
  static Tokenizer from_gguf(const std::string& gguf_path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // How added/special tokens written in the text are read. Parse: "<|im_start|>" in the text becomes its control
  // id (what a chat template's own markers need). AsText: the same characters are tokenized as ordinary text, as
  // llama-server and vLLM do for user content by default, so a user cannot open a system turn by typing a marker.
  enum class Special { Parse, AsText };
  // Special/added tokens are split out first (Special::Parse) and map to their ids; no template is applied.
  std::vector<int32_t> encode(std::string_view text, Special special = Special::Parse) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string token_text(int32_t id) const;  // decoded bytes of a single id
  int32_t vocab_size() const;                // max id + 1 over vocab and added tokens
  int32_t token_id(std::string_view token) const;  // -1 if unknown (added tokens included)

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace elastic
