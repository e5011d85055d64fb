#pragma once
// The paper's representation analysis: does the router's input separate tasks, and does its task MLP sharpen that?
// Each prompt is prefilled with the router; per layer we keep each KV head's pooled keys (the router's input) and the
// task MLP's output on them. Per layer, the mean cosine similarity of two prompts' features (averaged over KV heads)
// is taken over pairs of the same task and over pairs of different tasks; the gap (within - between) is how well
// that layer's representation separates tasks.
#include <functional>
#include <string>
#include <vector>

#include "elastic/model.h"
#include "elastic/router.h"

namespace elastic {

struct FeatureSeparation {
  int n_layers = 0, prompts = 0;
  // [L]: mean cosine over same-task pairs and over different-task pairs, before (pooled keys) and after the task MLP.
  std::vector<double> within_before, between_before, within_after, between_after;
};

// One entry per prompt: its ids and its task name. The model is prefilled once per prompt with `router` deciding
// (chunk tokens at a time; m's own router is put back afterwards); at least two prompts of one task and two tasks are needed, else this throws.
FeatureSeparation router_feature_separation(Model& m, const Router& router,
                                            const std::vector<std::vector<int32_t>>& prompts,
                                            const std::vector<std::string>& tasks, int chunk,
                                            const std::function<void(int done, int total)>& progress = {});

// Markdown table, one row per layer.
std::string feature_separation_table(const FeatureSeparation& s);

}  // namespace elastic
