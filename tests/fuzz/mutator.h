#pragma once
// A small deterministic mutation engine for the parser fuzzer (tests/fuzz/fuzz_main.cpp). CI has no libFuzzer
// (clang is not among the packages scripts/setup.sh installs), so this does what matters for file formats by hand:
// byte flips, random and "interesting" bytes and integers (0, -1, 2^31, 2^63, ...) at any or aligned offsets,
// insertions, deletions, duplications, truncation, splices with another seed, and for text formats numbers replaced
// by hostile ones (-5, 1e400, 4294967301, 18446744073709551615), values swapped for another type and runs of
// nesting ('[' x 100,000). Everything comes from one seeded generator, so a run is reproducible from its seed.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace elastic::fuzz {

using Bytes = std::string;

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  // One mutant of `seeds[pick]`: 1 to 4 stacked mutations (text-aware ones when `text`).
  Bytes mutate(const std::vector<Bytes>& seeds, bool text) {
    Bytes b = seeds[below(seeds.size())];
    const int n = 1 + static_cast<int>(below(4));
    for (int k = 0; k < n; ++k) mutate_once(b, seeds, text);
    return b;
  }

  uint64_t below(uint64_t n) { return n ? rng_() % n : 0; }

 private:
  void mutate_once(Bytes& b, const std::vector<Bytes>& seeds, bool text) {
    switch (below(text ? 14 : 10)) {
      case 0: flip_bit(b); break;
      case 1: set_byte(b); break;
      case 2: insert_random(b); break;
      case 3: erase_range(b); break;
      case 4: duplicate_range(b); break;
      case 5: truncate(b); break;
      case 6: splice(b, seeds); break;
      case 7: overwrite_int(b, /*aligned=*/true); break;
      case 8: overwrite_int(b, /*aligned=*/false); break;
      case 9: set_byte(b, static_cast<char>(below(2) ? 0xff : 0x00)); break;
      case 10: replace_number(b); break;
      case 11: insert_token(b); break;
      case 12: insert_nesting(b); break;
      case 13: swap_value_type(b); break;
    }
  }

  size_t pos(const Bytes& b) { return below(b.size() + 1); }
  size_t len(size_t max) { return below(2) ? 1 + below(8) : 1 + below(max ? max : 1); }

  void flip_bit(Bytes& b) {
    if (!b.empty()) b[below(b.size())] ^= static_cast<char>(1u << below(8));
  }
  void set_byte(Bytes& b) { set_byte(b, static_cast<char>(below(256))); }
  void set_byte(Bytes& b, char c) {
    if (!b.empty()) b[below(b.size())] = c;
  }
  void insert_random(Bytes& b) {
    Bytes r(len(64), '\0');
    for (char& c : r) c = static_cast<char>(below(256));
    b.insert(pos(b), r);
  }
  void erase_range(Bytes& b) {
    if (b.empty()) return;
    const size_t at = below(b.size());
    b.erase(at, len(b.size() - at));
  }
  void duplicate_range(Bytes& b) {
    if (b.empty() || b.size() > (1 << 22)) return;
    const size_t at = below(b.size());
    const Bytes piece = b.substr(at, len(std::min<size_t>(b.size() - at, 4096)));
    b.insert(pos(b), piece);
  }
  void truncate(Bytes& b) { b.resize(below(b.size() + 1)); }
  void splice(Bytes& b, const std::vector<Bytes>& seeds) {
    const Bytes& o = seeds[below(seeds.size())];
    const size_t cut = pos(b), from = below(o.size() + 1);
    b = b.substr(0, cut) + o.substr(from);
  }
  // A little-endian 1/2/4/8-byte integer from the boundary values every size check must survive.
  void overwrite_int(Bytes& b, bool aligned) {
    static const uint64_t kValues[] = {0,           1,           2,           0x7f,        0x80,
                                       0xff,        0x7fff,      0x8000,      0xffff,      0x7fffffff,
                                       0x80000000u, 0xffffffffu, 1ULL << 32,  1ULL << 40,  (1ULL << 62),
                                       (1ULL << 63) - 1, 1ULL << 63, ~0ULL,   ~0ULL - 7,   100000000};
    const size_t width = size_t{1} << below(4);
    if (b.size() < width) return;
    size_t at = below(b.size() - width + 1);
    if (aligned) at -= at % width;
    uint64_t v = kValues[below(sizeof kValues / sizeof kValues[0])];
    if (below(4) == 0) v += below(3) - 1;  // off by one either way
    std::memcpy(b.data() + at, &v, width);  // little-endian host
  }
  // Text: a decimal number (a run of digits, with its sign) replaced by a hostile one.
  void replace_number(Bytes& b) {
    static const char* kNumbers[] = {"-5",         "-1",   "0",    "1e400",      "-1e400", "4294967301",
                                     "2147483648", "999999999", "1000000000", "18446744073709551615",
                                     "9223372036854775808", "1.5", "-0", "65536", "3e38", "1e-400", "NaN"};
    std::vector<size_t> starts;
    for (size_t i = 0; i < b.size(); ++i)
      if (b[i] >= '0' && b[i] <= '9' && (i == 0 || b[i - 1] < '0' || b[i - 1] > '9')) starts.push_back(i);
    if (starts.empty()) return;
    size_t s = starts[below(starts.size())], e = s;
    while (e < b.size() && b[e] >= '0' && b[e] <= '9') ++e;
    if (s > 0 && b[s - 1] == '-') --s;
    b.replace(s, e - s, kNumbers[below(sizeof kNumbers / sizeof kNumbers[0])]);
  }
  // Text: a syntax token or value of the formats we parse.
  void insert_token(Bytes& b) {
    static const char* kTokens[] = {"[", "]", "{", "}", "\"", "\\", ",", ":", "null", "true", "[]", "{}",
                                    "\"\"", "'", "(", ")", "\n", "\\u0000", "\\ud800", "\xff", "\xc3", "-",
                                    "\"Sequence\"", "\"type\"", "{\"type\":\"Sequence\",\"pretokenizers\":[",
                                    "\"shape\"", "'shape': (", "True", "False", "\"__metadata__\""};
    b.insert(pos(b), kTokens[below(sizeof kTokens / sizeof kTokens[0])]);
  }
  // Text: a quoted string or a number replaced by a value of another type, so a field that a parser reads without
  // checking its type gets the wrong one (a content part's "type": 5 once reached a library type_error this way).
  void swap_value_type(Bytes& b) {
    static const char* kValues[] = {"5", "-1", "1.5", "\"s\"", "\"\"", "true", "null", "[]", "{}", "[1]",
                                    "[\"a\"]", "{\"a\":1}"};
    std::vector<std::pair<size_t, size_t>> spans;  // [begin, end) of each string (quotes included) and number
    for (size_t i = 0; i < b.size();) {
      if (b[i] == '"') {
        size_t e = i + 1;
        while (e < b.size() && b[e] != '"') e += b[e] == '\\' ? 2 : 1;
        if (e >= b.size()) break;
        spans.emplace_back(i, e + 1);
        i = e + 1;
      } else if ((b[i] >= '0' && b[i] <= '9') || b[i] == '-') {
        size_t e = i + 1;
        while (e < b.size() && ((b[e] >= '0' && b[e] <= '9') || b[e] == '.' || b[e] == 'e' || b[e] == 'E')) ++e;
        spans.emplace_back(i, e);
        i = e;
      } else {
        ++i;
      }
    }
    if (spans.empty()) return;
    const auto [s, e] = spans[below(spans.size())];
    b.replace(s, e - s, kValues[below(sizeof kValues / sizeof kValues[0])]);
  }
  // Text: a run of '[' or '{' (up to 100,000: deeper than any recursive parser's stack).
  void insert_nesting(Bytes& b) {
    static const size_t kDepths[] = {8, 100, 129, 1000, 100000};
    const size_t depth = kDepths[below(5)];
    b.insert(pos(b), Bytes(depth, below(2) ? '[' : '{'));
  }

  std::mt19937_64 rng_;
};

}  // namespace elastic::fuzz
