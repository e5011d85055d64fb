// Tokenizer throughput: encodes a few MB of mixed text (reference cases, English-like prose,
// code-like text) with the Qwen3 tokenizer and reports bytes/s.
#include "elastic/tokenizer.h"

#include <benchmark/benchmark.h>

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

const std::string kShared = ELASTIC_SHARED_DIR;

const elastic::Tokenizer& tokenizer() {
  static const elastic::Tokenizer t = elastic::Tokenizer::from_file(kShared + "/qwen3-tokenizer/tokenizer.json");
  return t;
}

std::string build_corpus(size_t target_bytes) {
  std::vector<std::string> cases;
  std::ifstream f(kShared + "/qwen3-tokenizer-cases.jsonl");
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) cases.push_back(nlohmann::json::parse(line)["text"].get<std::string>());
  const std::vector<std::string> words = {
      "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
      "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
      "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there", "been",
      "language", "model", "tokenizer", "throughput", "attention", "gradient", "inference",
      "representation", "approximately", "unbelievable", "Wednesday", "2026", "3.14159", "café"};
  const std::vector<std::string> code = {
      "for (int i = 0; i < n; ++i) {\n", "    sum += a[i] * b[i];\n", "}\n",
      "def forward(self, x):\n", "        return self.proj(x) + residual\n",
      "std::vector<int32_t> ids = tok.encode(text);\n", "if (!ok) throw std::runtime_error(\"bad\");\n",
      "    x = torch.softmax(q @ k.T / math.sqrt(d), dim=-1)\n", "#include <memory>\n", "\n"};
  std::mt19937 rng(7);
  std::string s;
  s.reserve(target_bytes + 4096);
  while (s.size() < target_bytes) {
    switch (rng() % 4) {
      case 0:
        s += cases[rng() % cases.size()];
        s += '\n';
        break;
      case 1:
      case 2: {
        int n = 20 + rng() % 60;
        for (int k = 0; k < n; ++k) {
          std::string w = words[rng() % words.size()];
          if (k == 0) w[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(w[0])));
          s += w;
          s += (rng() % 12 == 0) ? ", " : " ";
        }
        s += ".\n\n";
        break;
      }
      default:
        for (int k = 0; k < 12; ++k) s += code[rng() % code.size()];
    }
  }
  return s;
}

void BM_TokenizerEncode(benchmark::State& state) {
  const auto& tok = tokenizer();
  static const std::string corpus = build_corpus(4 << 20);
  size_t n_tokens = 0;
  for (auto _ : state) {
    auto ids = tok.encode(corpus);
    n_tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(corpus.size()));
  state.counters["tokens"] = static_cast<double>(n_tokens);
}
BENCHMARK(BM_TokenizerEncode)->Unit(benchmark::kMillisecond)->MinTime(1.0);

void BM_TokenizerDecode(benchmark::State& state) {
  const auto& tok = tokenizer();
  static const std::string corpus = build_corpus(4 << 20);
  static const std::vector<int32_t> ids = tok.encode(corpus);
  for (auto _ : state) {
    std::string s = tok.decode(ids);
    benchmark::DoNotOptimize(s.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(corpus.size()));
}
BENCHMARK(BM_TokenizerDecode)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
