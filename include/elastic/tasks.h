#pragma once
// RULER-style long-context task generators (re-implemented from the RULER paper's task definitions) plus "robust"
// likelihood tasks. Every sample's prompt has exactly the asked number of tokens. With a tokenizer the prompt is
// text (instruction, haystack, needles, question, answer prefix) tokenized piece by piece so needle spans are exact;
// without one (random-id mode, e.g. the 512-vocab fixtures) every piece is a token-id sequence: haystacks are random
// ids drawn from the seed (as in probe.cpp) and words map to fixed pseudo-token ids, and scoring compares ids.
// The router trainer reuses these generators for training data (input/output texts, ids, evidence spans).
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "elastic/tokenizer.h"

namespace elastic {

enum class TaskMetric { MatchAll, MatchPart, Likelihood };  // RULER string_match_all / _part; robust tasks
const char* task_metric_name(TaskMetric m);

// Chat-template hook: wraps the user's prompt text into the model's chat format (the answer prefix is appended after
// it, as the start of the assistant turn). Empty = no template. It must place the user text verbatim exactly once.
using ChatFormat = std::function<std::string(const std::string& user_text)>;

struct TaskSpec {
  std::string name;           // one of ruler_task_names()
  std::string haystack_file;  // essay-style haystack text; empty = built-in deterministic English filler
  std::string code_corpus;    // code_continue: a source file or a folder (files sorted by path); empty = built-in
                              // generator of C-like code (deterministic on every machine)
  ChatFormat chat;            // text mode only
  int32_t vocab = 0;          // random-id mode: ids are drawn in [0, vocab); required when tok == nullptr
  // Held-out templates: the needle tasks, QA and sum_recap ask the same facts in other words (instruction, needle or
  // event sentence, question, answer prefix), so a router that learned the training phrasing, which sits in the
  // boundary tokens it pools, is tested on wording it never saw. The answers and scoring are unchanged; the other
  // tasks have no template to vary and ignore it.
  bool paraphrase = false;
};

struct TaskSample {
  std::string task;        // e.g. "niah_single_1"
  std::string task_class;  // "retrieval" | "multi_hop" | "aggregation" | "qa" | "summarization" | "continuation" | "code"
  TaskMetric metric = TaskMetric::MatchAll;
  int max_new_tokens = 0;  // generation budget (RULER's per-task tokens_to_generate); 0 for likelihood tasks
  std::string input;       // prompt text (decode of prompt_ids); empty in random-id mode
  std::string output;      // reference output text: answers joined by ", " or the reference continuation
  std::vector<int32_t> prompt_ids;                // exactly target_tokens
  std::vector<std::string> answers;               // references for string matching (text mode)
  std::vector<std::vector<int32_t>> answer_ids;   // the same references as ids (random-id mode scores these)
  std::vector<int32_t> reference_ids;             // likelihood tasks: the continuation to score
  std::vector<std::pair<int, int>> evidence;      // [begin, end) token spans in prompt_ids holding the answer facts
};

// All task names in suite order: niah_single_1..3, niah_single_words, niah_multikey_1..3, niah_multivalue,
// niah_multiquery, vt, cwe, fwe, qa_1, qa_2, sum_recap, recap_last, continue_text, code_continue. recap_last (repeat
// the text's last sentence) is a robust task kept out of the training mix, so the held-out split has one.
const std::vector<std::string>& ruler_task_names();
bool is_task_name(const std::string& name);
// The router's built-in training mix draws only these tasks (builtin_train_mix); every other task is held out. Eval
// reports mark each task with its split ("train" or "held-out"), so a score on a task the router trained on is never
// read as generalization.
const std::vector<std::string>& training_task_names();
const char* task_split(const std::string& name);

// Deterministic in (spec, target_tokens, seed). Throws std::runtime_error naming the task when the name is unknown,
// target_tokens is too small for the task's fixed parts, a corpus file cannot be read, or vocab is missing.
TaskSample make_sample(const TaskSpec& spec, const Tokenizer* tok, int target_tokens, uint64_t seed);

}  // namespace elastic
