#pragma once
// Haystack text for long-context prompts (retrieval-head probing, RULER-style tasks): a local text file or a
// built-in deterministic English filler, plus the portable RNG both use so prompts are the same on every platform.
#include <cstdint>
#include <string>
#include <vector>

#include "elastic/tokenizer.h"

namespace elastic {

// splitmix64: portable, deterministic across standard libraries (unlike std::uniform_int_distribution).
struct SplitMix64 {
  uint64_t s;
  explicit SplitMix64(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return next() % n; }  // n > 0
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  template <class T>
  const T& pick(const std::vector<T>& v) { return v[below(v.size())]; }
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }
};

// `sentences` sentences of the built-in filler ("The old farmer walked past the stone tower ..."), drawn from r.
std::string filler_text(SplitMix64& r, int sentences);

// RULER's "noise" haystack sentence block (repeated).
const std::string& noise_text();

// Whole contents of a haystack file; throws "<path>: cannot open haystack file" / "... is empty".
std::string read_haystack_file(const std::string& path);

// Exactly n haystack token ids: the file's text from a line drawn from `seed` on (wrapping around, repeated when short)
// when `file` is non-empty, else the built-in filler drawn from `seed`. Throws naming the file when it cannot be read or yields no tokens.
std::vector<int32_t> haystack_token_ids(const Tokenizer& tok, const std::string& file, int n, uint64_t seed);

// Exactly n ids of the noise haystack.
std::vector<int32_t> noise_token_ids(const Tokenizer& tok, int n);

}  // namespace elastic
