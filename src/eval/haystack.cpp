#include "elastic/haystack.h"

#include <stdexcept>
#include <vector>

#include "elastic/text_file.h"

namespace elastic {

namespace {

const std::vector<std::string>& subjects() {
  static const std::vector<std::string> v = {
      "The old farmer", "A young painter", "The village council", "My neighbor", "The quiet student", "A traveling merchant",
      "The city library", "Our small team", "The river guide", "A retired teacher", "The morning train", "The baker"};
  return v;
}
const std::vector<std::string>& verbs() {
  static const std::vector<std::string> v = {"walked past", "wrote about", "carefully repaired", "often visited",
                                             "quietly admired", "described", "painted", "remembered", "planned around",
                                             "talked about", "photographed", "measured"};
  return v;
}
const std::vector<std::string>& objects() {
  static const std::vector<std::string> v = {
      "the wooden bridge", "a field of barley", "the stone tower", "the harbor at dawn", "a narrow mountain road",
      "the market square", "an abandoned mill", "the northern forest", "a row of apple trees", "the lighthouse",
      "the winter garden", "a broken clock"};
  return v;
}
const std::vector<std::string>& tails() {
  static const std::vector<std::string> v = {
      "before the rain started", "during the long summer", "while the bells were ringing", "after the harvest",
      "on a cold afternoon", "with great patience", "for the third time that year", "as the sun went down",
      "without saying a word", "in the early spring"};
  return v;
}

// Repeats `ids` until n are collected, then cuts to exactly n.
std::vector<int32_t> repeat_to(const std::vector<int32_t>& ids, int n) {
  std::vector<int32_t> out;
  out.reserve(n);
  while (static_cast<int>(out.size()) < n) out.insert(out.end(), ids.begin(), ids.end());
  out.resize(n);
  return out;
}

}  // namespace

std::string filler_text(SplitMix64& r, int sentences) {
  std::string s;
  for (int i = 0; i < sentences; ++i) {
    if (!s.empty()) s += ' ';
    s += r.pick(subjects()) + " " + r.pick(verbs()) + " " + r.pick(objects()) + " " + r.pick(tails()) + ".";
    if (r.below(6) == 0) s += "\n";
  }
  return s;
}

const std::string& noise_text() {
  static const std::string s = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ";
  return s;
}

std::string read_haystack_file(const std::string& path) {
  std::string text = read_text_file(path, "haystack file");
  if (text.empty()) throw std::runtime_error(path + ": haystack file is empty");
  return text;
}

std::vector<int32_t> haystack_token_ids(const Tokenizer& tok, const std::string& file, int n, uint64_t seed) {
  if (n <= 0) return {};
  if (!file.empty()) {
    const std::string text = read_haystack_file(file);
    // Each sample reads the file from its own (seeded) line on, wrapping around at the end. A fixed prefix gave every
    // prompt of a length the same text, so the router's input (the pooled first and last tokens) hardly varied
    // within a task. Tokenizing ~16 bytes per token is generous for English text.
    const size_t cap = static_cast<size_t>(n) * 16 + 1024;
    SplitMix64 r(seed);
    // Starts: every line start, each equally likely; a text of fewer than two lines starts after any space instead.
    std::vector<size_t> starts{0};
    for (size_t i = 0; i + 1 < text.size(); ++i)
      if (text[i] == '\n') starts.push_back(i + 1);
    if (starts.size() < 2)
      for (size_t i = 0; i + 1 < text.size(); ++i)
        if (text[i] == ' ') starts.push_back(i + 1);
    size_t start = starts[r.below(starts.size())];
    const std::string wrap = text.back() == '\n' ? "" : "\n";  // the end never runs into the start mid-line
    std::string chunk;
    while (chunk.size() < cap) {
      chunk += text.substr(start, cap - chunk.size());
      if (chunk.size() < cap) chunk += wrap;
      start = 0;
    }
    std::vector<int32_t> ids = tok.encode(chunk);
    if (ids.empty()) throw std::runtime_error(file + ": haystack file yields no tokens");
    return repeat_to(ids, n);
  }
  SplitMix64 r(seed);
  std::vector<int32_t> out;
  while (static_cast<int>(out.size()) < n) {
    std::vector<int32_t> ids = tok.encode((out.empty() ? "" : " ") + filler_text(r, 32));
    out.insert(out.end(), ids.begin(), ids.end());
  }
  out.resize(n);
  return out;
}

std::vector<int32_t> noise_token_ids(const Tokenizer& tok, int n) {
  if (n <= 0) return {};
  return repeat_to(tok.encode(noise_text()), n);
}

}  // namespace elastic
