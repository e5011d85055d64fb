#include "elastic/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include "byte_level.h"
#include "scratch_dir.h"

namespace {

using elastic::Tokenizer;
using nlohmann::json;
namespace fs = std::filesystem;

const std::string kShared = ELASTIC_SHARED_DIR;
const std::string kQwenJson = kShared + "/qwen3-tokenizer/tokenizer.json";
const std::string kCases = kShared + "/qwen3-tokenizer-cases.jsonl";

const Tokenizer& qwen() {
  static const Tokenizer t = Tokenizer::from_file(kQwenJson);
  return t;
}

fs::path temp_dir() {
  const fs::path d = elastic::test::scratch_dir() / "tok";
  fs::create_directories(d);
  return d;
}

void write_file(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

using elastic::testing::byte_level_vocab;

TEST(TokenizerTest, Qwen3CasesMatchReference) {
  const Tokenizer& t = qwen();
  std::ifstream f(kCases);
  ASSERT_TRUE(f) << kCases;
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    json c = json::parse(line);
    std::string text = c["text"].get<std::string>();
    std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(t.encode(text), want) << "text: " << text;
    // decode() returns the NFC form of the text; the only non-NFC case in the file is a
    // decomposed e + U+0301, which composes to U+00E9.
    std::string nfc_text = text;
    for (size_t p; (p = nfc_text.find("e\xCC\x81")) != std::string::npos;) nfc_text.replace(p, 3, "\xC3\xA9");
    EXPECT_EQ(t.decode(want), nfc_text) << "text: " << text;
    ++n;
  }
  EXPECT_GT(n, 10);
}

TEST(TokenizerTest, Qwen3Basics) {
  const Tokenizer& t = qwen();
  EXPECT_EQ(t.vocab_size(), 151669);
  EXPECT_EQ(t.token_id("<|im_start|>"), 151644);
  EXPECT_EQ(t.token_id("Hello"), 9707);
  EXPECT_EQ(t.token_id("definitely-not-a-token-xyz"), -1);
  EXPECT_EQ(t.token_text(151645), "<|im_end|>");
  EXPECT_EQ(t.token_text(220), " ");
}

TEST(TokenizerTest, RoundTripRandomUtf8) {
  const Tokenizer& t = qwen();
  std::mt19937 rng(1234);
  const std::vector<std::string> atoms = {
      "a", "b", "the", " ", "  ", "\n", "\t", "\r\n", "7", "42", "1234567", "é", "ü", "ß", "ж", "Ω",
      "中", "文", "😀", "👨\u200d👩", "—", "'s", "'LL", "{", "}", "()", ";", "<|im_start|>",
      "<|endoftext|>", "\u00a0", "\u200b", "٣", "日本", "x=1", "//", "#", "café", "naïve"};
  for (int iter = 0; iter < 300; ++iter) {
    std::string s;
    int len = rng() % 40;
    for (int k = 0; k < len; ++k) {
      if (rng() % 10 == 0) {  // random code point
        uint32_t cp = rng() % 0x2FFFF;
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
        if (cp == 0) cp = 'y';
        if (cp < 0x80) s += char(cp);
        else if (cp < 0x800) { s += char(0xC0 | (cp >> 6)); s += char(0x80 | (cp & 0x3F)); }
        else if (cp < 0x10000) {
          s += char(0xE0 | (cp >> 12)); s += char(0x80 | ((cp >> 6) & 0x3F)); s += char(0x80 | (cp & 0x3F));
        } else {
          s += char(0xF0 | (cp >> 18)); s += char(0x80 | ((cp >> 12) & 0x3F));
          s += char(0x80 | ((cp >> 6) & 0x3F)); s += char(0x80 | (cp & 0x3F));
        }
      } else {
        s += atoms[rng() % atoms.size()];
      }
    }
    // NFC may legitimately change random text; compare against the encoding of the decode.
    auto ids = t.encode(s);
    std::string back = t.decode(ids);
    EXPECT_EQ(t.encode(back), ids);
  }
  // Text already in NFC must round-trip exactly.
  const std::string nfc_text = "Grüße aus Köln — 東京 😀 <|im_end|>\n\tint main() { return 0; }  ";
  EXPECT_EQ(t.decode(t.encode(nfc_text)), nfc_text);
  // Invalid UTF-8 bytes survive as byte tokens.
  const std::string bad = std::string("ab\xff\xfe") + "cd\xc3";
  EXPECT_EQ(t.decode(t.encode(bad)), bad);
}

TEST(TokenizerTest, NfcComposes) {
  const Tokenizer& t = qwen();
  EXPECT_EQ(t.encode("e\xCC\x81"), t.encode("\xC3\xA9"));                     // e + U+0301 -> é
  EXPECT_EQ(t.encode("a\xCC\xA3\xCC\x82"), t.encode("a\xCC\x82\xCC\xA3"));  // canonical ordering
  EXPECT_EQ(t.encode("\xE1\x84\x80\xE1\x85\xA1"), t.encode("\xEA\xB0\x80"));  // Hangul L+V -> 가
}

TEST(TokenizerTest, Llama3PatternSplitsDigitsInThrees) {
  json vocab = byte_level_vocab();
  vocab["12"] = 256;
  vocab["123"] = 257;
  vocab["45"] = 258;
  vocab["456"] = 259;
  vocab["Ġ1"] = 260;
  json j;
  j["version"] = "1.0";
  j["added_tokens"] = json::array({{{"id", 261}, {"content", "<|begin_of_text|>"}, {"special", true}}});
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"},
                     {"pattern",
                      {{"Regex",
                        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                        "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
                     {"behavior", "Isolated"},
                     {"invert", false}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                     {"use_regex", false}}})}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"},
                {"ignore_merges", true},
                {"vocab", vocab},
                {"merges", json::array({"1 2", "12 3", "4 5", "45 6", "Ġ 1"})}};
  fs::path p = temp_dir() / "llama3_tiny.json";
  write_file(p, j.dump());
  Tokenizer t = Tokenizer::from_file(p.string());
  EXPECT_EQ(t.vocab_size(), 262);

  auto pieces = [&](const std::string& s) {
    std::vector<std::string> out;
    for (int32_t id : t.encode(s)) out.push_back(t.token_text(id));
    return out;
  };
  EXPECT_EQ(pieces("1234567"), (std::vector<std::string>{"123", "456", "7"}));
  EXPECT_EQ(pieces("12345"), (std::vector<std::string>{"123", "45"}));
  EXPECT_EQ(pieces("<|begin_of_text|>x 123"),
            (std::vector<std::string>{"<|begin_of_text|>", "x", " ", "123"}));
  EXPECT_EQ(t.encode("123456"), (std::vector<int32_t>{257, 259}));
  EXPECT_EQ(t.decode(t.encode("a 1234567 b\n")), "a 1234567 b\n");
}

void expect_throw_with_path(const std::string& path, const std::string& needle) {
  try {
    Tokenizer::from_file(path);
    FAIL() << "expected an exception for " << path;
  } catch (const std::runtime_error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

TEST(TokenizerTest, MalformedFilesThrowWithPath) {
  fs::path d = temp_dir();
  expect_throw_with_path((d / "does_not_exist.json").string(), "cannot open");

  write_file(d / "invalid.json", "{\"model\": {\"type\": \"BPE\", ");
  expect_throw_with_path((d / "invalid.json").string(), "invalid JSON");

  write_file(d / "wordpiece.json", R"({"model": {"type": "WordPiece", "vocab": {"a": 0}}})");
  expect_throw_with_path((d / "wordpiece.json").string(), "WordPiece");

  write_file(d / "nomodel.json", R"({"version": "1.0"})");
  expect_throw_with_path((d / "nomodel.json").string(), "model");

  write_file(d / "badmerge.json", R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": [42]}})");
  expect_throw_with_path((d / "badmerge.json").string(), "merges");

  write_file(d / "badregex.json",
             R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                 "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}})");
  expect_throw_with_path((d / "badregex.json").string(), "regex");
}

// Hostile files (issue 25): each of these crashed the process or allocated without bound before the limits.

// A tokenizer.json whose pre_tokenizer is `depth` Sequences nested in each other around one ByteLevel.
json nested_sequences(int depth, const char* kind) {
  const bool pre = std::string(kind) == "pre_tokenizer";
  json inner = pre ? json{{"type", "ByteLevel"}, {"use_regex", false}} : json{{"type", "NFC"}};
  for (int k = 0; k < depth; ++k)
    inner = {{"type", "Sequence"}, {pre ? "pretokenizers" : "normalizers", json::array({inner})}};
  json j = {{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", json::array()}}}};
  j[kind] = inner;
  return j;
}

TEST(TokenizerTest, DeeplyNestedSequencesAreRefusedByName) {
  fs::path d = temp_dir();
  for (const char* kind : {"pre_tokenizer", "normalizer"}) {
    // 16 levels load; 17 are refused naming the limit (the JSON itself stays under the parser's depth limit).
    EXPECT_NO_THROW(Tokenizer::from_json(nested_sequences(16, kind), "t.json")) << kind;
    const fs::path p = d / (std::string(kind) + "_deep.json");
    write_file(p, nested_sequences(40, kind).dump());
    expect_throw_with_path(p.string(), "nested deeper than 16 levels");
  }
}

TEST(TokenizerTest, DeeplyNestedJsonIsRefusedBeforeParsing) {
  // nlohmann's parser recurses per level: 100,000 nested '[' overflowed the stack (SIGSEGV).
  fs::path p = temp_dir() / "deep_json.json";
  write_file(p, "{\"model\": " + std::string(100000, '[') + std::string(100000, ']') + "}");
  expect_throw_with_path(p.string(), "nested deeper than 128 levels");
}

TEST(TokenizerTest, HugeTokenIdsAreRefusedNamingTheId) {
  fs::path d = temp_dir();
  // An id of 1e9 sized a per-id table of a billion strings (bad_alloc, not an error naming the file).
  write_file(d / "huge_vocab_id.json", R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1000000000}, "merges": []}})");
  expect_throw_with_path((d / "huge_vocab_id.json").string(), "vocab entry 'b' has id 1000000000");
  // 2^32 + 5 was read as 5 by get<int32_t>.
  write_file(d / "wrapped_added_id.json",
             R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                 "added_tokens": [{"id": 4294967301, "content": "<x>"}]})");
  expect_throw_with_path((d / "wrapped_added_id.json").string(), "4294967301");
  write_file(d / "negative_added_id.json",
             R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                 "added_tokens": [{"id": -3, "content": "<x>"}]})");
  expect_throw_with_path((d / "negative_added_id.json").string(), "-3");
  // The largest id allowed still loads (4M-entry tables, as large as any real vocabulary's 16 times over).
  EXPECT_EQ(Tokenizer::from_json(json::parse(R"({"model": {"type": "BPE", "vocab": {"a": 4194303}, "merges": []}})"),
                                 "t.json")
                .vocab_size(),
            4194304);
}

TEST(TokenizerTest, DirectoryIsNamedAsOne) {
  // An ifstream opens a directory and then threw "basic_filebuf::underflow", naming no path.
  const fs::path d = temp_dir() / "a_directory.json";
  fs::create_directories(d);
  expect_throw_with_path(d.string(), "is a directory");
}

}  // namespace
