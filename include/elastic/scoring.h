#pragma once
// RULER scoring and reference-likelihood scoring.
// RULER (scripts/eval/synthetic/constants.py): per sample, with pred and refs lower-cased,
//   string_match_all  = (number of refs r with r in pred) / len(refs)    (recall of the references)
//   string_match_part = max over refs of [r in pred]                     (any reference found)
// and a task's score is the mean over samples x 100, rounded to 2 decimals. Predictions are post-processed as
// RULER's evaluate.py does: control characters [\x00-\x1f] become '\n', then surrounding whitespace is stripped.
#include <cstdint>
#include <string>
#include <vector>

#include "elastic/sequence_backend.h"
#include "elastic/model.h"

namespace elastic {

std::string ruler_postprocess(const std::string& pred);

// Per-sample scores in [0, 1] (pred is post-processed first). An empty reference list throws.
double string_match_all(const std::string& pred, const std::vector<std::string>& refs);
double string_match_part(const std::string& pred, const std::vector<std::string>& refs);
// Corpus scores as RULER reports them: mean over samples x 100, rounded to 2 decimals. Sizes must match and be > 0.
double ruler_string_match_all(const std::vector<std::string>& preds, const std::vector<std::vector<std::string>>& refs);
double ruler_string_match_part(const std::vector<std::string>& preds, const std::vector<std::vector<std::string>>& refs);

// Random-id mode: the same metrics with "r in pred" meaning r is a contiguous subsequence of the generated ids.
double ids_match_all(const std::vector<int32_t>& pred, const std::vector<std::vector<int32_t>>& refs);
double ids_match_part(const std::vector<int32_t>& pred, const std::vector<std::vector<int32_t>>& refs);

struct LikelihoodScore {
  double mean_logprob = 0;  // mean over reference tokens of log p(ref_t | prompt, ref_<t) (natural log)
  double greedy_acc = 0;    // fraction of reference tokens that are the argmax of their predicted distribution
  int tokens = 0;
  double score() const;     // 100 * exp(mean_logprob): geometric-mean token probability, in [0, 100]
};

// logits: [n, V] row t predicts ref[t]. Log-softmax in double precision.
LikelihoodScore likelihood_from_logits(const float* logits, int V, const std::vector<int32_t>& ref);

// The likelihood of `ref` after `prompt` on a backend: prefill of the prompt under `routing` (or `router`'s decision),
// then ref[0..n-2] appended by SequenceBackend::extend, so every reference token gets its predicted distribution.
// `used` receives the routing. Throws on an empty prompt or reference.
LikelihoodScore backend_likelihood(SequenceBackend& be, const std::vector<int32_t>& prompt,
                                   const std::vector<int32_t>& ref, const RoutingTable* routing,
                                   const PromptRouter* router, int V, RoutingTable& used);
// Prefills prompt (last logits), then prefills ref[0..n-2] with all_logits, so every reference token gets its
// predicted distribution; the cache is built for `routing` (hybrid when it has streaming heads). routing == nullptr:
// `router` routes the prompt during its prefill. routed_out (optional) receives the routing used.
// stats (optional) receives the prompt prefill's attention work (not the reference rows'). backend_likelihood on the
// CPU backend. Throws when prompt + ref exceeds the model context.
LikelihoodScore reference_likelihood(const Model& m, const std::vector<int32_t>& prompt,
                                     const std::vector<int32_t>& ref, const RoutingTable* routing,
                                     const PromptRouter* router = nullptr, AttentionStats* stats = nullptr, int prefill_chunk = 16384,
                                     RoutingTable* routed_out = nullptr);

}  // namespace elastic
