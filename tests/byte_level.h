#pragma once
// Test helper: GPT-2's byte-to-unicode map as UTF-8 strings, the vocabulary strings of a byte-level BPE (what the
// hand-made tokenizer.json files of the tokenizer tests and the fuzz seeds list for bytes 0..255).
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace elastic::testing {

inline std::vector<std::string> byte_level_chars() {
  std::vector<std::string> out(256);
  auto utf8 = [](uint32_t cp) {
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
  };
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    out[b] = utf8(direct ? static_cast<uint32_t>(b) : next++);
  }
  return out;
}

// {byte string: id} for the 256 byte tokens, ids 0..255: the base of a hand-made byte-level BPE vocabulary.
inline nlohmann::json byte_level_vocab() {
  const std::vector<std::string> chars = byte_level_chars();
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[chars[b]] = b;
  return vocab;
}

}  // namespace elastic::testing
