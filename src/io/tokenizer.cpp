// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json.
//
// Pipeline (matching the HF `tokenizers` library for Qwen3 / Llama-3 / GPT-2 style files):
//   1. added tokens are split out by exact, longest-first string matching on the raw text;
//   2. every remaining segment is NFC-normalized (if the normalizer asks for it);
//   3. the pre-tokenizer (Split regexes via PCRE2, ByteLevel, Digits) cuts it into pieces;
//   4. each piece's bytes are mapped to byte-level symbols and merged by BPE rank.
#include "elastic/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <climits>
#include <filesystem>
#include <mutex>
#include <queue>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include <nlohmann/json.hpp>

#include "elastic/gguf.h"
#include "elastic/json_file.h"
#include "elastic/text_file.h"
#include "io/utf8.h"

namespace elastic {
namespace {

using nlohmann::json;

#include "nfc_table.inc"

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error("tokenizer: " + path + ": " + what);
}

// Ids index per-id tables (decoded bytes), so an id of 1e9 would allocate gigabytes: the largest vocabularies in
// use have about 256K tokens (Gemma 3: 262,144).
constexpr int64_t kMaxTokenId = (1 << 22) - 1;
// A Sequence of pre-tokenizers or normalizers is read recursively; real files nest one level.
constexpr int kMaxSequenceDepth = 16;
// Each regex split is compiled at load and run over every encoded text; real files have one to three.
constexpr size_t kMaxSplitSteps = 64;

// A JSON value for an error message, cut to a readable length (an entry may hold megabytes).
std::string brief(const json& j) {
  std::string s = j.dump();
  return s.size() > 120 ? s.substr(0, 120) + "..." : s;
}

// A token id field: an integer in [0, kMaxTokenId]; `what` names the entry.
int32_t token_id_of(const json& v, const std::string& path, const std::string& what) {
  if (!v.is_number_integer()) fail(path, what + " is not an integer id");
  // Unsigned JSON numbers above 2^63 would turn negative as int64: compare them as unsigned.
  if (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(kMaxTokenId)
                             : (v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxTokenId))
    fail(path, what + " has id " + v.dump() + ", outside 0.." + std::to_string(kMaxTokenId));
  return static_cast<int32_t>(v.get<int64_t>());
}

// ---------------------------------------------------------------- UTF-8 helpers

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// ---------------------------------------------------------------- NFC

constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

struct NfcData {
  std::unordered_map<uint32_t, uint8_t> ccc;
  std::unordered_map<uint32_t, std::pair<uint32_t, uint32_t>> decomp;  // cp -> (offset, len)
  std::unordered_map<uint64_t, uint32_t> comp;
  std::vector<uint64_t> sensitive;  // bitmap over code points that may change under NFC

  NfcData() : sensitive((0x110000 + 63) / 64, 0) {
    auto mark = [&](uint32_t cp) { sensitive[cp >> 6] |= 1ULL << (cp & 63); };
    for (const auto& e : kCccTable) {
      ccc[e[0]] = static_cast<uint8_t>(e[1]);
      mark(e[0]);
    }
    for (const auto& e : kDecompIndex) {
      decomp[e[0]] = {e[1], e[2]};
      mark(e[0]);
    }
    for (const auto& e : kCompTable) {
      comp[(uint64_t(e[0]) << 32) | e[1]] = e[2];
      mark(e[1]);  // a composable second character may merge with the preceding starter
    }
    for (uint32_t cp = kVBase; cp < kVBase + kVCount; ++cp) mark(cp);
    for (uint32_t cp = kTBase + 1; cp < kTBase + kTCount; ++cp) mark(cp);
  }
  bool is_sensitive(uint32_t cp) const { return (sensitive[cp >> 6] >> (cp & 63)) & 1; }
  uint8_t cc(uint32_t cp) const {
    if (!is_sensitive(cp)) return 0;
    auto it = ccc.find(cp);
    return it == ccc.end() ? 0 : it->second;
  }
  uint32_t compose(uint32_t a, uint32_t b) const {
    if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
      return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
    if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
        b < kTBase + kTCount)
      return a + (b - kTBase);
    auto it = comp.find((uint64_t(a) << 32) | b);
    return it == comp.end() ? 0 : it->second;
  }
  void decompose(uint32_t cp, std::vector<uint32_t>& out) const {
    if (cp >= kSBase && cp < kSBase + kSCount) {
      uint32_t s = cp - kSBase;
      out.push_back(kLBase + s / kNCount);
      out.push_back(kVBase + (s % kNCount) / kTCount);
      if (s % kTCount) out.push_back(kTBase + s % kTCount);
      return;
    }
    if (is_sensitive(cp)) {
      auto it = decomp.find(cp);
      if (it != decomp.end()) {
        for (uint32_t k = 0; k < it->second.second; ++k) out.push_back(kDecompData[it->second.first + k]);
        return;
      }
    }
    out.push_back(cp);
  }
};

const NfcData& nfc_data() {
  static const NfcData d;
  return d;
}

// NFC of a valid UTF-8 string.
std::string nfc(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  const NfcData& d = nfc_data();
  // Quick check: no sensitive code point (and no precomposed Hangul followed by T) => unchanged.
  bool needs = false;
  for (size_t i = 0; i < n;) {
    if (s[i] < 0x80) { ++i; continue; }
    uint32_t cp;
    size_t len = utf8_seq_len(s, i, n, &cp);
    if (len == 0) return std::string(text);  // caller guarantees validity; be safe
    if (d.is_sensitive(cp)) { needs = true; break; }
    i += len;
  }
  if (!needs) return std::string(text);

  std::vector<uint32_t> buf;
  buf.reserve(n);
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    size_t len = utf8_seq_len(s, i, n, &cp);
    if (len == 0) { cp = 0xFFFD; len = 1; }
    d.decompose(cp, buf);
    i += len;
  }
  // Canonical ordering: stable sort every run of non-starters by combining class.
  for (size_t i = 0; i < buf.size();) {
    if (d.cc(buf[i]) == 0) { ++i; continue; }
    size_t j = i;
    while (j < buf.size() && d.cc(buf[j]) != 0) ++j;
    if (j - i > 1)
      std::stable_sort(buf.begin() + i, buf.begin() + j,
                       [&](uint32_t a, uint32_t b) { return d.cc(a) < d.cc(b); });
    i = j;
  }
  // Canonical composition.
  std::vector<uint32_t> out;
  out.reserve(buf.size());
  long starter = -1;
  for (uint32_t c : buf) {
    uint8_t cc = d.cc(c);
    if (starter >= 0) {
      bool adjacent = static_cast<long>(out.size()) - 1 == starter;
      uint8_t last_cc = adjacent ? 0 : d.cc(out.back());
      if (adjacent || (last_cc != 0 && last_cc < cc)) {
        uint32_t composed = d.compose(out[starter], c);
        if (composed) {
          out[starter] = composed;
          continue;
        }
      }
    }
    if (cc == 0) starter = static_cast<long>(out.size());
    out.push_back(c);
  }
  std::string res;
  res.reserve(n + 8);
  for (uint32_t c : out) append_utf8(res, c);
  return res;
}

// ---------------------------------------------------------------- byte-level mapping

std::array<uint32_t, 256> bytes_to_unicode() {
  std::array<uint32_t, 256> m{};
  std::array<bool, 256> direct{};
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) m[b] = direct[b] ? static_cast<uint32_t>(b) : next++;
  return m;
}

// ---------------------------------------------------------------- pre-tokenizer

enum class Behavior { Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous };

struct SplitStep {
  pcre2_code* code = nullptr;
  Behavior behavior = Behavior::Isolated;
  bool invert = false;
};

const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

struct Range {
  size_t b, e;
};

struct AddedToken {
  std::string content;
  int32_t id;
};

}  // namespace

// ---------------------------------------------------------------- Impl

struct Tokenizer::Impl {
  std::string path;
  std::unordered_map<std::string, int32_t> vocab;     // byte-level token string -> id
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (a<<32|b) -> (rank, merged)
  std::vector<std::string> id_bytes;                  // decoded bytes per id
  std::vector<AddedToken> added;                      // sorted by length, longest first
  std::array<std::vector<int>, 256> added_by_first;   // first byte -> indices into added
  std::unordered_map<std::string, int32_t> added_ids;
  std::array<int32_t, 256> byte_id{};                 // raw byte -> id of its byte-level symbol
  std::array<uint32_t, 256> b2u{};
  std::vector<SplitStep> splits;
  bool use_nfc = false;
  bool add_prefix_space = false;
  bool ignore_merges = false;
  int32_t unk_id = -1;
  int32_t n_vocab = 0;

  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  ~Impl() {
    for (auto& s : splits) pcre2_code_free(s.code);
  }

  void add_split(const std::string& pattern, bool literal, Behavior beh, bool invert) {
    if (splits.size() >= kMaxSplitSteps)
      fail(path, "pre_tokenizer has more than " + std::to_string(kMaxSplitSteps) + " splitting steps");
    int err = 0;
    PCRE2_SIZE off = 0;
    uint32_t flags = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     flags, &err, &off, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      fail(path, "cannot compile pre-tokenizer regex '" + pattern.substr(0, 200) + "' at offset " +
                     std::to_string(off) + ": " + reinterpret_cast<char*>(msg));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
    splits.push_back({code, beh, invert});
  }

  void parse_pre_tokenizer(const json& pt, int depth = 0) {
    if (pt.is_null()) return;
    if (!pt.is_object()) fail(path, "pre_tokenizer must be an object or null");
    std::string type = pt.value("type", std::string());
    if (type == "Sequence") {
      if (depth >= kMaxSequenceDepth)
        fail(path, "pre_tokenizer Sequences nested deeper than " + std::to_string(kMaxSequenceDepth) + " levels");
      auto it = pt.find("pretokenizers");
      if (it == pt.end() || !it->is_array()) fail(path, "Sequence pre_tokenizer without 'pretokenizers' array");
      for (const auto& p : *it) parse_pre_tokenizer(p, depth + 1);
    } else if (type == "Split") {
      auto pat = pt.find("pattern");
      if (pat == pt.end() || !pat->is_object()) fail(path, "Split pre_tokenizer without 'pattern'");
      std::string pattern;
      bool literal = false;
      if (pat->contains("Regex") && (*pat)["Regex"].is_string()) {
        pattern = (*pat)["Regex"].get<std::string>();
      } else if (pat->contains("String") && (*pat)["String"].is_string()) {
        pattern = (*pat)["String"].get<std::string>();
        literal = true;
      } else {
        fail(path, "Split pattern must have a 'Regex' or 'String' string");
      }
      std::string b = pt.value("behavior", std::string("Isolated"));
      Behavior beh;
      if (b == "Isolated") beh = Behavior::Isolated;
      else if (b == "Removed") beh = Behavior::Removed;
      else if (b == "MergedWithPrevious") beh = Behavior::MergedWithPrevious;
      else if (b == "MergedWithNext") beh = Behavior::MergedWithNext;
      else if (b == "Contiguous") beh = Behavior::Contiguous;
      else fail(path, "unsupported Split behavior '" + b + "'");
      add_split(pattern, literal, beh, pt.value("invert", false));
    } else if (type == "ByteLevel") {
      if (pt.value("add_prefix_space", false)) add_prefix_space = true;
      if (pt.value("use_regex", true)) add_split(kGpt2Pattern, false, Behavior::Isolated, false);
    } else if (type == "Digits") {
      add_split(pt.value("individual_digits", false) ? "\\p{N}" : "\\p{N}+", false,
                Behavior::Isolated, false);
    } else {
      fail(path, "unsupported pre_tokenizer type '" + type + "'");
    }
  }

  void parse_normalizer(const json& n, int depth = 0) {
    if (n.is_null()) return;
    if (!n.is_object()) fail(path, "normalizer must be an object or null");
    std::string type = n.value("type", std::string());
    if (type == "NFC") {
      use_nfc = true;
    } else if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
      if (depth >= kMaxSequenceDepth)
        fail(path, "normalizer Sequences nested deeper than " + std::to_string(kMaxSequenceDepth) + " levels");
      for (const auto& x : n["normalizers"]) parse_normalizer(x, depth + 1);
    } else {
      fail(path, "unsupported normalizer type '" + type + "'");
    }
  }

  // ---- encoding

  void bpe(const unsigned char* p, size_t n, std::vector<int32_t>& out) const {
    if (n == 0) return;
    if (n == 1) {
      int32_t id = byte_id[p[0]];
      if (id >= 0) out.push_back(id);
      else if (unk_id >= 0) out.push_back(unk_id);
      return;
    }
    std::string key;
    const bool cacheable = n <= 64;
    if (cacheable) {
      key.assign(reinterpret_cast<const char*>(p), n);
      std::lock_guard<std::mutex> lk(cache_mu);
      auto it = cache.find(key);
      if (it != cache.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> res;
    if (ignore_merges) {
      std::string bl;
      for (size_t i = 0; i < n; ++i) append_utf8(bl, b2u[p[i]]);
      auto it = vocab.find(bl);
      if (it != vocab.end()) res.push_back(it->second);
    }
    if (res.empty()) {
      std::vector<int32_t> syms;
      syms.reserve(n);
      for (size_t i = 0; i < n; ++i) {
        int32_t id = byte_id[p[i]];
        if (id >= 0) syms.push_back(id);
        else if (unk_id >= 0) syms.push_back(unk_id);
      }
      if (syms.size() <= 24) merge_linear(syms);
      else merge_heap(syms);
      res = std::move(syms);
    }
    out.insert(out.end(), res.begin(), res.end());
    if (cacheable) {
      std::lock_guard<std::mutex> lk(cache_mu);
      if (cache.size() > 200000) cache.clear();
      cache.emplace(std::move(key), std::move(res));
    }
  }

  const std::pair<int32_t, int32_t>* find_merge(int32_t a, int32_t b) const {
    auto it = merges.find((uint64_t(uint32_t(a)) << 32) | uint32_t(b));
    return it == merges.end() ? nullptr : &it->second;
  }

  void merge_linear(std::vector<int32_t>& syms) const {
    while (syms.size() > 1) {
      int32_t best_rank = INT32_MAX, best_id = -1;
      size_t best_i = 0;
      for (size_t i = 0; i + 1 < syms.size(); ++i) {
        const auto* m = find_merge(syms[i], syms[i + 1]);
        if (m && m->first < best_rank) {
          best_rank = m->first;
          best_id = m->second;
          best_i = i;
        }
      }
      if (best_id < 0) break;
      syms[best_i] = best_id;
      syms.erase(syms.begin() + best_i + 1);
    }
  }

  void merge_heap(std::vector<int32_t>& syms) const {
    const int n = static_cast<int>(syms.size());
    std::vector<int> prev(n), next(n);
    std::vector<char> alive(n, 1);
    for (int i = 0; i < n; ++i) {
      prev[i] = i - 1;
      next[i] = i + 1 < n ? i + 1 : -1;
    }
    struct E {
      int32_t rank;
      int pos;
      int32_t left, right, merged;
      bool operator>(const E& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<E, std::vector<E>, std::greater<E>> heap;
    auto push = [&](int i) {
      if (i < 0 || next[i] < 0) return;
      const auto* m = find_merge(syms[i], syms[next[i]]);
      if (m) heap.push({m->first, i, syms[i], syms[next[i]], m->second});
    };
    for (int i = 0; i + 1 < n; ++i) push(i);
    while (!heap.empty()) {
      E e = heap.top();
      heap.pop();
      int i = e.pos;
      if (!alive[i] || next[i] < 0 || syms[i] != e.left || syms[next[i]] != e.right) continue;
      int j = next[i];
      syms[i] = e.merged;
      alive[j] = 0;
      next[i] = next[j];
      if (next[j] >= 0) prev[next[j]] = i;
      push(prev[i]);
      push(i);
    }
    std::vector<int32_t> out;
    for (int i = 0; i >= 0 && i < n; i = next[i]) out.push_back(syms[i]);
    syms = std::move(out);
  }

  // Apply split step `k` to the ranges of `text`.
  void split_ranges(const std::string& text, const SplitStep& step, std::vector<Range>& ranges,
                    pcre2_match_data* md, pcre2_match_context* mctx) const {
    std::vector<Range> out;
    out.reserve(ranges.size() * 2);
    const auto* subj = reinterpret_cast<PCRE2_SPTR>(text.data());
    std::vector<std::pair<Range, bool>> parts;
    for (const Range& r : ranges) {
      parts.clear();
      size_t pos = r.b, last = r.b;
      while (pos < r.e) {
        // Subject is limited to the piece so lookarounds do not see beyond it (as in HF).
        int rc = pcre2_match(step.code, subj + r.b, r.e - r.b, pos - r.b, PCRE2_NO_UTF_CHECK, md, mctx);
        if (rc < 0) break;  // no match (or matching error: keep the rest as one gap)
        PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        size_t ms = r.b + ov[0], me = r.b + ov[1];
        if (me == ms) {  // empty match: step over one character
          pos = ms + 1;
          while (pos < r.e && (text[pos] & 0xC0) == 0x80) ++pos;
          continue;
        }
        if (ms > last) parts.push_back({{last, ms}, false});
        parts.push_back({{ms, me}, true});
        last = pos = me;
      }
      if (r.e > last) parts.push_back({{last, r.e}, false});
      if (step.invert)
        for (auto& p : parts) p.second = !p.second;
      switch (step.behavior) {
        case Behavior::Isolated:
          for (auto& p : parts) out.push_back(p.first);
          break;
        case Behavior::Removed:
          for (auto& p : parts)
            if (!p.second) out.push_back(p.first);
          break;
        case Behavior::MergedWithPrevious: {
          bool prev_gap = false;
          for (auto& p : parts) {
            if (p.second && !out.empty() && prev_gap) out.back().e = p.first.e;
            else out.push_back(p.first);
            prev_gap = !p.second;
          }
          break;
        }
        case Behavior::MergedWithNext: {
          bool prev_match = false;
          for (auto& p : parts) {
            if (!p.second && prev_match) out.back().e = p.first.e;
            else out.push_back(p.first);
            prev_match = p.second;
          }
          break;
        }
        case Behavior::Contiguous: {
          bool prev_match = false;
          for (auto& p : parts) {
            if (p.second && prev_match) out.back().e = p.first.e;
            else out.push_back(p.first);
            prev_match = p.second;
          }
          break;
        }
      }
    }
    ranges = std::move(out);
  }

  // Encode a valid-UTF-8 segment containing no added tokens.
  void encode_valid(std::string_view seg, std::vector<int32_t>& out, pcre2_match_data* md,
                    pcre2_match_context* mctx) const {
    std::string text = use_nfc ? nfc(seg) : std::string(seg);
    if (add_prefix_space && !text.empty() && text[0] != ' ') text.insert(text.begin(), ' ');
    std::vector<Range> ranges{{0, text.size()}};
    for (const auto& step : splits) split_ranges(text, step, ranges, md, mctx);
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    for (const Range& r : ranges) bpe(p + r.b, r.e - r.b, out);
  }

  // Encode a segment (no added tokens): valid UTF-8 runs go through the pipeline,
  // stray invalid bytes become single byte-level tokens.
  void encode_segment(std::string_view seg, std::vector<int32_t>& out, pcre2_match_data* md,
                      pcre2_match_context* mctx) const {
    const auto* s = reinterpret_cast<const unsigned char*>(seg.data());
    const size_t n = seg.size();
    size_t run = 0, i = 0;
    while (i < n) {
      if (s[i] < 0x80) { ++i; continue; }
      uint32_t cp;
      size_t len = utf8_seq_len(s, i, n, &cp);
      if (len) { i += len; continue; }
      if (i > run) encode_valid(seg.substr(run, i - run), out, md, mctx);
      bpe(s + i, 1, out);
      run = ++i;
    }
    if (n > run) encode_valid(seg.substr(run), out, md, mctx);
  }
};

// ---------------------------------------------------------------- public API

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::string text;
  bool gguf = false;
  try {
    InputFile f(path, "tokenizer file");
    // A GGUF model file carries its tokenizer: `--tokenizer model.gguf` works like a tokenizer.json.
    char magic[4] = {};
    const size_t got = f.read_some(magic, 4);
    gguf = got == 4 && std::string_view(magic, 4) == "GGUF";
    if (!gguf) {
      text.assign(magic, got);
      text += f.read_rest(kMaxJsonFileBytes - got);
      check_json_depth(text, path);
    }
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string("tokenizer: ") + e.what());
  }
  if (gguf) return from_gguf(path);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(path, std::string("invalid JSON: ") + e.what());
  }
  return from_json(j, path);
}

Tokenizer Tokenizer::from_json(const json& j, const std::string& path) {
  if (!j.is_object()) fail(path, "top level must be a JSON object");

  auto impl = std::make_unique<Impl>();
  Impl& t = *impl;
  t.path = path;
  t.b2u = bytes_to_unicode();
  try {
    auto mit = j.find("model");
    if (mit == j.end() || !mit->is_object()) fail(path, "missing \"model\" object");
    const json& model = *mit;
    std::string type = model.value("type", std::string("BPE"));
    if (type != "BPE") fail(path, "model type '" + type + "' is not supported (only BPE)");
    auto vit = model.find("vocab");
    if (vit == model.end() || !vit->is_object()) fail(path, "model has no \"vocab\" object");
    int32_t max_id = -1;
    t.vocab.reserve(vit->size() * 2);
    for (auto it = vit->begin(); it != vit->end(); ++it) {
      const int32_t id = token_id_of(it.value(), path, "vocab entry '" + it.key().substr(0, 64) + "'");
      t.vocab[it.key()] = id;
      max_id = std::max(max_id, id);
    }
    t.ignore_merges = model.value("ignore_merges", false);
    if (auto u = model.find("unk_token"); u != model.end() && u->is_string()) {
      auto it = t.vocab.find(u->get<std::string>());
      if (it != t.vocab.end()) t.unk_id = it->second;
    }
    auto mg = model.find("merges");
    if (mg == model.end() || !mg->is_array()) fail(path, "model has no \"merges\" array");
    t.merges.reserve(mg->size() * 2);
    int32_t rank = 0;
    for (const auto& m : *mg) {
      std::string a, b;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          fail(path, "bad merges entry #" + std::to_string(rank) + ": '" + s + "'");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        a = m[0].get<std::string>();
        b = m[1].get<std::string>();
      } else {
        fail(path, "bad merges entry #" + std::to_string(rank) + ": " + brief(m));
      }
      auto ia = t.vocab.find(a), ib = t.vocab.find(b), im = t.vocab.find(a + b);
      if (ia == t.vocab.end() || ib == t.vocab.end() || im == t.vocab.end())
        fail(path, "bad merges entry #" + std::to_string(rank) + " ('" + a + "' '" + b +
                       "'): token not in vocab");
      uint64_t key = (uint64_t(uint32_t(ia->second)) << 32) | uint32_t(ib->second);
      t.merges.emplace(key, std::make_pair(rank, im->second));  // first occurrence wins
      ++rank;
    }
    if (auto at = j.find("added_tokens"); at != j.end() && at->is_array()) {
      for (const auto& a : *at) {
        if (!a.is_object() || !a.contains("content") || !a.contains("id") || !a["content"].is_string() ||
            !a["id"].is_number_integer())
          fail(path, "bad added_tokens entry: " + brief(a));
        AddedToken tok{a["content"].get<std::string>(), token_id_of(a["id"], path, "added token " + brief(a))};
        if (tok.content.empty()) continue;
        max_id = std::max(max_id, tok.id);
        t.added_ids[tok.content] = tok.id;
        t.added.push_back(std::move(tok));
      }
    }
    std::stable_sort(t.added.begin(), t.added.end(),
                     [](const AddedToken& x, const AddedToken& y) { return x.content.size() > y.content.size(); });
    for (size_t i = 0; i < t.added.size(); ++i)
      t.added_by_first[static_cast<unsigned char>(t.added[i].content[0])].push_back(static_cast<int>(i));
    if (auto n = j.find("normalizer"); n != j.end()) t.parse_normalizer(*n);
    if (auto p = j.find("pre_tokenizer"); p != j.end()) t.parse_pre_tokenizer(*p);

    t.n_vocab = max_id + 1;
    // Decoded bytes of each id.
    std::unordered_map<uint32_t, unsigned char> u2b;
    for (int b = 0; b < 256; ++b) u2b[t.b2u[b]] = static_cast<unsigned char>(b);
    t.id_bytes.assign(t.n_vocab, std::string());
    for (const auto& [tok, id] : t.vocab) {
      std::string bytes;
      const auto* s = reinterpret_cast<const unsigned char*>(tok.data());
      for (size_t i = 0; i < tok.size();) {
        uint32_t cp;
        size_t len = utf8_seq_len(s, i, tok.size(), &cp);
        if (len == 0) { bytes += tok[i]; ++i; continue; }
        auto it = u2b.find(cp);
        if (it != u2b.end()) bytes += static_cast<char>(it->second);
        else bytes.append(tok, i, len);
        i += len;
      }
      t.id_bytes[id] = std::move(bytes);
    }
    for (const auto& a : t.added) t.id_bytes[a.id] = a.content;
    for (int b = 0; b < 256; ++b) {
      std::string s;
      append_utf8(s, t.b2u[b]);
      auto it = t.vocab.find(s);
      t.byte_id[b] = it == t.vocab.end() ? -1 : it->second;
    }
  } catch (const json::exception& e) {
    fail(path, std::string("unexpected JSON structure: ") + e.what());
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, Special special) const {
  const Impl& t = *impl_;
  std::vector<int32_t> out;
  if (text.empty()) return out;
  out.reserve(text.size() / 3 + 4);

  pcre2_match_data* md = nullptr;
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* jstack = nullptr;
  if (!t.splits.empty()) {
    md = pcre2_match_data_create(16, nullptr);
    mctx = pcre2_match_context_create(nullptr);
    jstack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (mctx && jstack) pcre2_jit_stack_assign(mctx, nullptr, jstack);
  }
  struct Cleanup {
    pcre2_match_data* md;
    pcre2_match_context* mctx;
    pcre2_jit_stack* js;
    ~Cleanup() {
      if (md) pcre2_match_data_free(md);
      if (mctx) pcre2_match_context_free(mctx);
      if (js) pcre2_jit_stack_free(js);
    }
  } cleanup{md, mctx, jstack};

  size_t seg = 0, i = 0;
  const size_t n = text.size();
  if (t.added.empty() || special == Special::AsText) {
    t.encode_segment(text, out, md, mctx);
    return out;
  }
  while (i < n) {
    const auto& cands = t.added_by_first[static_cast<unsigned char>(text[i])];
    const AddedToken* hit = nullptr;
    for (int c : cands) {
      const auto& a = t.added[c];
      if (text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    }
    if (!hit) { ++i; continue; }
    if (i > seg) t.encode_segment(text.substr(seg, i - seg), out, md, mctx);
    out.push_back(hit->id);
    i += hit->content.size();
    seg = i;
  }
  if (n > seg) t.encode_segment(text.substr(seg), out, md, mctx);
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids)
    if (id >= 0 && id < impl_->n_vocab) out += impl_->id_bytes[id];
  return out;
}

std::string Tokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= impl_->n_vocab) return std::string();
  return impl_->id_bytes[id];
}

int32_t Tokenizer::vocab_size() const { return impl_->n_vocab; }

int32_t Tokenizer::token_id(std::string_view token) const {
  std::string key(token);
  if (auto it = impl_->added_ids.find(key); it != impl_->added_ids.end()) return it->second;
  if (auto it = impl_->vocab.find(key); it != impl_->vocab.end()) return it->second;
  return -1;
}

std::string model_tokenizer_path(const std::string& model, const std::string& override_path) {
  namespace fs = std::filesystem;
  if (!override_path.empty()) return override_path;
  std::error_code ec;
  // A GGUF file has a tokenizer only when its metadata holds one (a file converted without it serves token ids).
  // Opening it reads the header through mmap, once at start-up; a broken file throws, naming it.
  if (fs::is_regular_file(model, ec) && fs::path(model).extension() == ".gguf")
    return gguf::File::open(model).find("tokenizer.ggml.model") ? model : std::string();
  const fs::path p = fs::path(model) / "tokenizer.json";
  return fs::exists(p, ec) ? p.string() : std::string();
}

}  // namespace elastic
