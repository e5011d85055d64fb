#pragma once
// The paper's representation analysis: does the router's input separate tasks, and does its task MLP sharpen that?
// Each prompt is prefilled with the router; per layer we keep each KV head's pooled keys (the router's input) and the
// task MLP's output on them. Per layer, the mean cosine similarity of two prompts' features (averaged over KV heads)
// is taken over pairs of the same task and over pairs of different tasks; the gap (within - between) is how well
// that layer's representation separates tasks. The same is reported on centred features, with the share of variance
// the task explains.
#include <functional>
#include <string>
#include <vector>

#include "elastic/model.h"
#include "elastic/router.h"

namespace elastic {

// One layer's features (pooled keys, or the task MLP's output on them) over a prompt set.
struct LayerSeparation {
  double within = 0, between = 0;  // mean cosine over same-task and over different-task pairs (mean over KV heads)
  // The same after subtracting the mean feature over all prompts: raw cosines are near 1 for any two prompts (the
  // features share a large common component), so the raw gap understates how far tasks lie apart.
  double within_centred = 0, between_centred = 0;
  double task_variance_share = 0;  // eta^2: between-task / total sum of squares around the mean, mean over KV heads
};

struct FeatureSeparation {
  int n_layers = 0, prompts = 0;
  std::vector<LayerSeparation> before, after;  // [L]: pooled keys (the router's input) and after the task MLP
};

// One entry per prompt: its ids and its task name. The model is prefilled once per prompt with `router` deciding
// (chunk tokens at a time; the model is not changed); at least two prompts of one task and two tasks are needed, else this throws.
FeatureSeparation router_feature_separation(const Model& m, const Router& router,
                                            const std::vector<std::vector<int32_t>>& prompts,
                                            const std::vector<std::string>& tasks, int chunk,
                                            const std::function<void(int done, int total)>& progress = {});

// Markdown table, one row per layer.
std::string feature_separation_table(const FeatureSeparation& s);

}  // namespace elastic
