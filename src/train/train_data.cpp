// Router training data: JSONL samples (text or ids) and the built-in task mix, fitted to the training length.
#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string_view>

#include <nlohmann/json.hpp>

#include "elastic/json_file.h"
#include "elastic/tasks.h"
#include "elastic/text_file.h"
#include "elastic/train.h"

namespace elastic {

std::map<std::string, double> default_targets() {
  return {{"qa", 0.7},   {"retrieval", 0.7},     {"multi_hop", 0.7},    {"aggregation", 0.7},
          {"code", 1.0}, {"summarization", 1.0}, {"continuation", 1.0}, {"icl", 1.0}};
}

namespace {

// Token ids in [0, vocab) (vocab <= 0: any int32 id). get<int32_t> would wrap 4294967301 to 5, and an id past the
// vocabulary would only fail inside training, steps later.
std::vector<int32_t> ids_field(const nlohmann::json& j, const char* key, int64_t vocab) {
  if (!j[key].is_array()) throw std::runtime_error(std::string("'") + key + "' is not an array of token ids");
  const int64_t end = vocab > 0 ? vocab : int64_t{INT32_MAX} + 1;
  std::vector<int32_t> v;
  v.reserve(j[key].size());
  for (auto& x : j[key]) {
    if (!x.is_number_integer()) throw std::runtime_error(std::string("'") + key + "' holds a non-integer");
    const bool in_range = x.is_number_unsigned() ? x.get<uint64_t>() < static_cast<uint64_t>(end)
                                                 : x.get<int64_t>() >= 0 && x.get<int64_t>() < end;
    if (!in_range)
      throw std::runtime_error(std::string("'") + key + "' holds token id " + x.dump() + " at index " +
                               std::to_string(v.size()) + ", outside " +
                               (vocab > 0 ? "the vocabulary (0.." + std::to_string(vocab - 1) + ")"
                                          : std::string("0..2^31-1")));
    v.push_back(static_cast<int32_t>(x.get<int64_t>()));
  }
  return v;
}

// Lines longer than this are not training samples (a 1M-token sample is ~8 MB of ids as JSON).
constexpr uint64_t kMaxLineBytes = 64ULL << 20;

}  // namespace

std::vector<TrainExample> load_train_jsonl(const std::string& path, const Tokenizer* tok,
                                           const std::map<std::string, double>& targets,
                                           const std::map<std::string, std::string>& task_classes, DataReport* report,
                                           int32_t vocab) {
  // Without the model's vocabulary the tokenizer's bounds the ids: a model's is at least as large, so no id the
  // tokenizer gives is refused, and an id past the tokenizer is not text the model was trained on.
  if (vocab <= 0 && tok) vocab = tok->vocab_size();
  // Read whole through the checked reader: a directory or a device is an error naming the path, not an empty file.
  const std::string text = read_text_file(path, "training data");
  DataReport local;
  DataReport& rep = report ? *report : local;
  std::vector<TrainExample> out;
  int n = 0;
  for (size_t at = 0; at < text.size();) {
    const size_t nl = std::min(text.find('\n', at), text.size());
    const std::string_view line(text.data() + at, nl - at);
    at = nl + 1;
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ++rep.lines;
    try {
      if (line.size() > kMaxLineBytes)
        throw std::runtime_error("line of " + std::to_string(line.size()) + " bytes, more than the limit of " +
                                 std::to_string(kMaxLineBytes));
      nlohmann::json j;
      try {
        check_json_depth(line, "sample");
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a number like 1e400
        throw std::runtime_error(std::string("malformed JSON: ") + e.what());
      }
      if (!j.is_object()) throw std::runtime_error("not a JSON object");
      if (!j.contains("task") || !j["task"].is_string()) throw std::runtime_error("missing string field 'task'");
      TrainExample e;
      const std::string task = j["task"].get<std::string>();
      if (targets.count(task)) e.task_class = task;
      else if (auto it = task_classes.find(task); it != task_classes.end() && targets.count(it->second))
        e.task_class = it->second;
      else throw std::runtime_error("task '" + task + "' is not a task class with a target (nor mapped to one)");
      if (j.contains("input_ids") || j.contains("output_ids")) {
        if (!j.contains("input_ids") || !j.contains("output_ids"))
          throw std::runtime_error("needs both 'input_ids' and 'output_ids'");
        e.input_ids = ids_field(j, "input_ids", vocab);
        e.output_ids = ids_field(j, "output_ids", vocab);
      } else {
        if (!j.contains("input") || !j["input"].is_string() || !j.contains("output") || !j["output"].is_string())
          throw std::runtime_error("needs string fields 'input' and 'output' (or 'input_ids' and 'output_ids')");
        if (!tok) throw std::runtime_error("text sample but the model has no tokenizer (give ids instead)");
        e.input_ids = tok->encode(j["input"].get<std::string>());
        e.output_ids = tok->encode(j["output"].get<std::string>());
      }
      if (e.input_ids.empty() || e.output_ids.empty()) throw std::runtime_error("empty input or output");
      out.push_back(std::move(e));
      ++rep.used;
    } catch (const std::exception& ex) {
      rep.problems.push_back(path + ":" + std::to_string(n) + ": " + ex.what());
    }
  }
  if (out.empty())
    throw std::runtime_error(path + ": no usable training sample in " + std::to_string(rep.lines) + " lines" +
                             (rep.problems.empty() ? "" : " (first problem: " + rep.problems.front() + ")"));
  return out;
}

std::vector<TrainExample> builtin_train_mix(const Tokenizer* tok, int32_t vocab, int n_samples,
                                            const std::vector<int>& lengths, uint64_t seed,
                                            const std::string& haystack_file, const ChatFormat& chat) {
  if (lengths.empty()) throw std::invalid_argument("built-in mix: no prompt length given");
  const std::vector<std::string>& tasks = training_task_names();  // the training split (tasks.h)
  std::vector<TrainExample> out;
  for (int i = 0; i < n_samples; ++i) {
    TaskSpec spec;
    spec.name = tasks[i % tasks.size()];
    spec.haystack_file = haystack_file;
    spec.vocab = vocab;
    spec.chat = chat;
    const int tokens = lengths[(static_cast<size_t>(i) / tasks.size()) % lengths.size()];
    TaskSample s = make_sample(spec, tok, tokens, seed * 1000003 + i);
    TrainExample e;
    e.task_class = s.task_class;
    e.input_ids = s.prompt_ids;
    if (!s.reference_ids.empty()) e.output_ids = s.reference_ids;
    else if (tok) e.output_ids = tok->encode(s.output);
    else if (!s.answer_ids.empty()) {
      for (size_t a = 0; a < s.answer_ids.size(); ++a) e.output_ids.insert(e.output_ids.end(), s.answer_ids[a].begin(),
                                                                           s.answer_ids[a].end());
    }
    if (e.output_ids.empty()) continue;
    out.push_back(std::move(e));
  }
  return out;
}

void fit_to_length(TrainExample& e, int max_len) {
  if (max_len < 4) throw std::invalid_argument("max length must be at least 4 tokens");
  if (static_cast<int>(e.output_ids.size()) > max_len / 2) e.output_ids.resize(max_len / 2);
  const int room = max_len - static_cast<int>(e.output_ids.size());
  const int n = static_cast<int>(e.input_ids.size());
  if (n <= room) return;
  const int head = room / 2, tail = room - head;
  std::vector<int32_t> in(e.input_ids.begin(), e.input_ids.begin() + head);
  in.insert(in.end(), e.input_ids.end() - tail, e.input_ids.end());
  e.input_ids.swap(in);
}

}  // namespace elastic
