#pragma once
// Retrieval-head probing (DuoAttention-style retrieval score): needle-in-a-haystack prompts are run through the
// model and, per (layer, KV head), the attention mass that the final query position puts on the needle's tokens
// is averaged over the KV head's query heads and over prompts. High-scoring heads are kept FULL by static_routing.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "elastic/attention.h"
#include "elastic/model.h"
#include "elastic/tasks.h"
#include "elastic/tokenizer.h"

namespace elastic {

struct ProbeOptions {
  std::string haystack_file;  // empty = built-in deterministic English filler
  int context = 1024;         // total prompt length in tokens (haystack + needle + question)
  int n_depths = 10;          // needle depths d = i / (n_depths - 1); a single depth probes d = 0.5
  int n_needles_per_depth = 1;
  uint64_t seed = 0;
  // Task mode (the probe the static baseline deserves): prompts are the eval's own samples of this task (one of
  // ruler_task_names() with evidence spans, e.g. niah_single_2), wrapped by `chat` as eval wraps them, and the
  // "needle" is the sample's evidence tokens. `prompts` of them, seeds seed + i; n_depths / n_needles_per_depth are
  // unused (the generator places the needle). Empty = the classic magic-number needle at n_depths depths.
  std::string task;
  int prompts = 50;
  ChatFormat chat;
};

struct HeadScores {
  int n_layers = 0, n_kv_heads = 0;
  std::vector<double> score;  // [L*Hkv]: mean attention mass from the final query position to the needle tokens,
                              // averaged over the KV head's query heads and over prompts
  int prompts = 0;
  double at(int layer, int kv_head) const { return score[static_cast<size_t>(layer) * n_kv_heads + kv_head]; }
};

// What a backend gives the probe for one prompt ids[0, T): per layer, [Hq * T] attention weights of the last
// position's query heads over every position, under all-full routing (dense attention is what is measured).
using LastRowAttention = std::function<std::vector<std::vector<float>>(const std::vector<int32_t>& ids)>;

// The CPU model's: Model::forward over the prompt, each prompt's cache built all full (dense attention is measured).
LastRowAttention cpu_last_row_attention(const Model& m);

// Throws std::runtime_error on bad options. tok == nullptr: haystack, needle (8 ids) and question (8 ids) are random
// token ids in [0, vocab) drawn from the seed. The prompts and the scoring are the same on every backend; only
// `attention` (cpu_last_row_attention, or the GPU model's last_row_attention) differs.
HeadScores probe_retrieval_heads(const ModelConfig& c, const Tokenizer* tok, const ProbeOptions& o,
                                 const LastRowAttention& attention,
                                 const std::function<void(int done, int total)>& progress = {});
// The CPU model: probe_retrieval_heads(m.config, ..., cpu_last_row_attention(m), ...).
HeadScores probe_retrieval_heads(const Model& m, const Tokenizer* tok, const ProbeOptions& o,
                                 const std::function<void(int done, int total)>& progress = {});

// JSON: {"n_layers":L,"n_kv_heads":H,"prompts":N,"scores":[[...H values...], ... L rows]}
void save_head_scores(const HeadScores& s, const std::string& path);
// Throws naming the file on malformed JSON, missing fields, wrong types or shapes, non-finite values.
HeadScores load_head_scores(const std::string& path);
// Same, and also checks the shape against a model's (n_layers, n_kv_heads).
HeadScores load_head_scores(const std::string& path, int n_layers, int n_kv_heads);

// Keeps the top floor((1 - sparsity) * L * H) heads by score FULL, routes the rest to sparse_mode. Ties are broken
// by the lower (layer, head) index. sparsity must be in [0, 1]. The floor has a 1e-9 tolerance so that e.g.
// (1 - 0.9) * 10 = 0.99999... keeps 1 head.
RoutingTable static_routing(const HeadScores& s, double sparsity, HeadMode sparse_mode);

}  // namespace elastic
