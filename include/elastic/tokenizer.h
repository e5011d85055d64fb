#pragma once
// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (Qwen3, Llama-3).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace elastic {

class Tokenizer {
 public:
  // Throws std::runtime_error naming the file and the problem on malformed input.
  static Tokenizer from_file(const std::string& tokenizer_json_path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Special/added tokens are split out first and map to their ids; no template is applied.
  std::vector<int32_t> encode(std::string_view text) const;
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
