#pragma once
// Shared pieces of the task generators (src/eval/tasks_*.cpp): text/id encoding, prompt assembly to an exact token
// count, needle insertion, word pools. Internal to the eval library.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "elastic/haystack.h"
#include "elastic/tasks.h"

namespace elastic::task_detail {

// Text -> ids. With a tokenizer: its encoding. Random-id mode: a fixed pseudo-tokenization (runs of letters/digits
// are one token each, any other non-space byte is a token; whitespace is dropped) hashed into [0, vocab), so the same
// word always maps to the same id and answers appear in prompts as contiguous id sequences.
struct Enc {
  const Tokenizer* tok = nullptr;
  int32_t vocab = 0;
  bool text() const { return tok != nullptr; }
  std::vector<int32_t> ids(const std::string& s) const;
};
std::vector<int32_t> pseudo_ids(const std::string& s, int32_t vocab);

// A prompt under construction: head (instruction), context (exactly `budget` tokens, filled by the task), tail
// (question) and the answer prefix. The chat hook wraps head + context + tail.
struct Frame {
  std::vector<int32_t> head, tail;  // encoded: chat prefix + head text; tail text + chat suffix + answer prefix
  int budget = 0;                   // tokens left for the context
};
// Throws "<task>: <target> tokens is too short (fixed parts take N, the task needs at least M more)" when the
// context budget is below min_context.
Frame make_frame(const TaskSpec& spec, const Enc& enc, int target, const std::string& head, const std::string& tail,
                 const std::string& answer_prefix, int min_context, bool use_chat = true);

// The context being built: ids and evidence spans relative to the context start.
struct Context {
  std::vector<int32_t> ids;
  std::vector<std::pair<int, int>> evidence;
};

// Haystack ids of exactly n tokens: essay (file or built-in filler) or noise; random ids in random-id mode.
std::vector<int32_t> essay_ids(const TaskSpec& spec, const Enc& enc, int n, uint64_t seed);
std::vector<int32_t> noise_ids(const Enc& enc, int n, uint64_t seed);
std::vector<int32_t> random_ids(SplitMix64& r, int n, int32_t vocab);

// Inserts needles into hay at fractional depths (sorted ascending; needles keep their order), snapping each to a
// sentence end in text mode so needles do not split words. Result: hay.size() + sum(needle sizes) tokens.
Context insert_needles(const std::vector<int32_t>& hay, const std::vector<std::vector<int32_t>>& needles,
                       std::vector<double> depths, const Enc& enc);

// Pads a context to exactly `budget` tokens with newline tokens (text) / a fixed id (random-id mode).
void pad_to(Context& c, int budget, const Enc& enc);

// A new sample of `spec`: its class, metric and generation budget (0 for likelihood tasks); the generator then fills
// the prompt (finish) and the answers.
TaskSample start_sample(const TaskSpec& spec, const std::string& task_class, TaskMetric metric, int max_new_tokens);

// Final assembly: head + context + tail; fills prompt_ids, input, evidence (shifted by the head). Checks the length.
void finish(TaskSample& s, const Frame& f, const Context& c, const Enc& enc, int target);
void set_answers(TaskSample& s, const std::vector<std::string>& answers, const Enc& enc);

// Word pools.
std::string key_word(SplitMix64& r);          // "adjective-noun", e.g. "brave-lantern"
std::string number7(SplitMix64& r);           // 7-digit number
std::string uuid(SplitMix64& r);              // 8-4-4-4-12 lowercase hex
std::string pseudo_word(SplitMix64& r, int min_syl, int max_syl);  // pronounceable lowercase word
std::string capitalized(std::string s);
const std::vector<std::string>& common_nouns();

// Per-sample seed from the run seed, the task name and the length, so every task/length gets its own stream.
uint64_t mix_seed(uint64_t seed, const std::string& task, int target);

}  // namespace elastic::task_detail

namespace elastic::task_detail {
// Task families (one file each). `name` is the task name, already validated by make_sample.
TaskSample make_niah(const TaskSpec& spec, const Enc& enc, int target, uint64_t seed);
TaskSample make_variable_tracking(const TaskSpec& spec, const Enc& enc, int target, uint64_t seed);
TaskSample make_common_words(const TaskSpec& spec, const Enc& enc, int target, uint64_t seed);
TaskSample make_frequent_words(const TaskSpec& spec, const Enc& enc, int target, uint64_t seed);
TaskSample make_qa(const TaskSpec& spec, const Enc& enc, int target, uint64_t seed);
TaskSample make_robust(const TaskSpec& spec, const Enc& enc, int target, uint64_t seed);
// "a", "a and b", "a, b, and c"
std::string join_and(const std::vector<std::string>& v);
}  // namespace elastic::task_detail
