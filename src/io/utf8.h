#pragma once
// UTF-8 decoding shared by the tokenizer and the SVG writers' escaping.
#include <cstddef>
#include <cstdint>

namespace elastic {

// Length of a valid UTF-8 sequence starting at s[i], or 0 if invalid.
inline size_t utf8_seq_len(const unsigned char* s, size_t i, size_t n, uint32_t* cp_out) {
  unsigned char c = s[i];
  if (c < 0x80) {
    *cp_out = c;
    return 1;
  }
  size_t len;
  uint32_t cp, min;
  if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; min = 0x80; }
  else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; min = 0x800; }
  else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; min = 0x10000; }
  else return 0;
  if (i + len > n) return 0;
  for (size_t k = 1; k < len; ++k) {
    if ((s[i + k] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (s[i + k] & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  *cp_out = cp;
  return len;
}

}  // namespace elastic
