// Aggregation of per-sample eval results and the report files (Markdown, JSON, SVG charts, head maps).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>

#include "elastic/eval.h"
#include "elastic/heatmap_svg.h"
#include "elastic/output_file.h"
#include "elastic/plot_svg.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace elastic {

namespace {

std::string len_label(int L) { return L % 1024 == 0 ? std::to_string(L / 1024) + "k" : std::to_string(L); }

std::string f2(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", v);
  return b;
}
std::string f3(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f", v);
  return b;
}

// Method names become file names: keep [A-Za-z0-9._-], map '@' to "_at_", anything else to '_'.
std::string file_safe(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') o += c;
    else if (c == '@') o += "_at_";
    else o += '_';
  }
  return o;
}

}  // namespace

const CellSummary* EvalSummary::find(const std::string& method, const std::string& task, int length) const {
  for (const CellSummary& c : cells)
    if (c.method == method && c.task == task && c.length == length) return &c;
  return nullptr;
}

EvalSummary summarize(const std::vector<SampleResult>& results, const std::vector<std::string>& methods,
                      const std::vector<std::string>& tasks, const std::vector<int>& lengths) {
  EvalSummary s;
  s.methods = methods;
  s.tasks = tasks;
  s.lengths = lengths;
  std::map<std::string, std::vector<const SampleResult*>> by_cell;
  std::set<std::string> seen;  // a key is counted once even if a file holds it twice
  for (const SampleResult& r : results)
    if (seen.insert(r.key()).second)
      by_cell[r.method + "|" + r.task + "|" + std::to_string(r.length)].push_back(&r);
  for (const std::string& m : methods) {
    MethodSummary ms;
    ms.method = m;
    ms.flops = 0;
    double score_sum = 0;
    int cells = 0;
    std::vector<double> sparse;
    for (const std::string& t : tasks)
      for (int L : lengths) {
        auto it = by_cell.find(m + "|" + t + "|" + std::to_string(L));
        if (it == by_cell.end() || it->second.empty()) continue;
        CellSummary c;
        c.method = m;
        c.task = t;
        c.length = L;
        c.task_class = it->second.front()->task_class;
        c.metric = it->second.front()->metric;
        c.n = static_cast<int>(it->second.size());
        c.msr = c.esr = c.flops = c.score = 0;
        for (const SampleResult* r : it->second) {
          c.score += r->score;
          c.msr += r->msr;
          c.esr += r->esr;
          c.flops += r->flops;
          c.wall_s += r->wall_s;
          c.logprob += r->logprob;
          c.greedy_acc += r->greedy_acc;
          ms.msr += r->msr;
          ms.esr += r->esr;
          ms.flops += r->flops;
          ms.wall_s += r->wall_s;
          ++ms.n;
          if (!r->modes.empty()) {
            if (sparse.empty()) {
              sparse.assign(r->modes.size(), 0.0);
              ms.n_layers = r->n_layers;
              ms.n_kv_heads = r->n_kv_heads;
            }
            if (r->modes.size() == sparse.size())
              for (size_t h = 0; h < sparse.size(); ++h) sparse[h] += r->modes[h] != 'F';
          }
        }
        for (double* v : {&c.score, &c.msr, &c.esr, &c.flops, &c.wall_s, &c.logprob, &c.greedy_acc}) *v /= c.n;
        score_sum += c.score;
        ++cells;
        s.cells.push_back(c);
      }
    if (ms.n > 0) {
      ms.score = score_sum / cells;
      ms.msr /= ms.n;
      ms.esr /= ms.n;
      ms.flops /= ms.n;
      ms.wall_s /= ms.n;
      for (double& v : sparse) v /= ms.n;
      ms.sparse_fraction = std::move(sparse);
    }
    s.per_method.push_back(std::move(ms));
  }
  return s;
}

json EvalSummary::to_json() const {
  json j;
  j["methods"] = methods;
  j["tasks"] = tasks;
  j["lengths"] = lengths;
  j["cells"] = json::array();
  for (const CellSummary& c : cells) {
    json e = {{"method", c.method}, {"task", c.task}, {"split", task_split(c.task)}, {"class", c.task_class},
              {"metric", c.metric},
              {"length", c.length}, {"n", c.n},       {"score", c.score},      {"msr", c.msr},
              {"esr", c.esr},       {"flops", c.flops}, {"wall_s", c.wall_s}};
    if (c.metric == "likelihood") {
      e["logprob"] = c.logprob;
      e["greedy_acc"] = c.greedy_acc;
    }
    j["cells"].push_back(e);
  }
  j["per_method"] = json::array();
  for (const MethodSummary& m : per_method)
    j["per_method"].push_back({{"method", m.method}, {"n", m.n}, {"score", m.score}, {"msr", m.msr}, {"esr", m.esr},
                               {"flops", m.flops}, {"wall_s", m.wall_s}, {"n_layers", m.n_layers},
                               {"n_kv_heads", m.n_kv_heads}, {"sparse_fraction", m.sparse_fraction}});
  return j;
}

namespace {

// A table with a row per task x length and a column per method. lead gives a row's first cells ("| a | b |"); cell
// gives a method's text for an existing cell, or nothing (shown "-"); a row without any text is left out.
std::string method_table(const EvalSummary& s, const std::string& head, int lead_cols, const char* align,
                         const std::function<std::string(const std::string&, int)>& lead,
                         const std::function<std::optional<std::string>(const CellSummary&)>& cell) {
  std::string o = head;
  for (const auto& m : s.methods) o += " " + m + " |";
  o += "\n|";
  for (int i = 0; i < lead_cols; ++i) o += "---|";
  for (size_t i = 0; i < s.methods.size(); ++i) o += std::string(align) + "|";
  o += "\n";
  for (const auto& t : s.tasks)
    for (int L : s.lengths) {
      bool any = false;
      std::string row = lead(t, L);
      for (const auto& m : s.methods) {
        const CellSummary* c = s.find(m, t, L);
        const std::optional<std::string> text = c ? cell(*c) : std::nullopt;
        any = any || text;
        row += " " + text.value_or("-") + " |";
      }
      if (any) o += row + "\n";
    }
  return o;
}

std::string task_length_lead(const std::string& t, int L) { return "| " + t + " | " + len_label(L) + " |"; }

}  // namespace

std::string markdown_report(const EvalSummary& s) {
  std::string o = "# Elastic long-context evaluation (RULER-style)\n\n";
  o += "Scores are 0-100: string_match_all / string_match_part x 100 (RULER), and for likelihood tasks "
       "100 x exp(mean reference log-prob). Each cell is the mean over samples.\n\n";
  o += "## Score per task x length\n\nsplit: `train` = a task of the router's built-in training mix, `held-out` = "
       "one it never trained on (tasks.h).\n\n";
  o += method_table(
      s, "| task | split | length |", 3, "---:",
      [](const std::string& t, int L) { return "| " + t + " | " + task_split(t) + " | " + len_label(L) + " |"; },
      [](const CellSummary& c) -> std::optional<std::string> { return f2(c.score); });
  // Averages over every task, then over each split alone.
  for (const char* split : {"all", "train", "held-out"})
    for (int L : s.lengths) {
      std::string row = std::string("| **average** | ") + split + " | " + len_label(L) + " |";
      bool any = false;
      for (const auto& m : s.methods) {
        double sum = 0;
        int n = 0;
        for (const auto& t : s.tasks)
          if (std::string(split) == "all" || std::string(split) == task_split(t))
            if (const CellSummary* c = s.find(m, t, L)) { sum += c->score; ++n; }
        any = any || n;
        row += " " + (n ? "**" + f2(sum / n) + "**" : std::string("-")) + " |";
      }
      if (any || std::string(split) == "all") o += row + "\n";
    }
  o += "\n## Per method (means over all samples)\n\n"
       "| method | score | Omega_MSR | Omega_ESR | attention FLOPs vs full | wall s / sample | samples |\n"
       "|---|---:|---:|---:|---:|---:|---:|\n";
  for (const MethodSummary& m : s.per_method)
    o += "| " + m.method + " | " + f2(m.score) + " | " + f3(m.msr) + " | " + f3(m.esr) + " | " + f3(m.flops) + " | " +
         f3(m.wall_s) + " | " + std::to_string(m.n) + " |\n";
  // Likelihood tasks: the score is a geometric-mean probability; log-prob and greedy accuracy read better.
  bool any_lik = false;
  for (const CellSummary& c : s.cells) any_lik = any_lik || c.metric == "likelihood";
  if (any_lik) {
    o += "\n## Likelihood tasks (mean reference log-prob / greedy-token accuracy)\n\n";
    o += method_table(s, "| task | length |", 2, "---", task_length_lead,
                      [](const CellSummary& c) -> std::optional<std::string> {
                        if (c.metric != "likelihood") return std::nullopt;
                        return f3(c.logprob) + " / " + f3(c.greedy_acc);
                      });
  }
  o += "\n## Sparsity per task x length (Omega_MSR / Omega_ESR / FLOPs vs full / wall s)\n\n";
  o += method_table(s, "| task | length |", 2, "---", task_length_lead,
                    [](const CellSummary& c) -> std::optional<std::string> {
                      return f2(c.msr) + " / " + f2(c.esr) + " / " + f2(c.flops) + " / " + f2(c.wall_s);
                    });
  return o;
}

void write_report(const EvalSummary& s, const std::string& out_dir) {
  fs::create_directories(out_dir);
  const fs::path d(out_dir);
  write_text_file((d / "results.md").string(), markdown_report(s), "eval report");
  write_text_file((d / "summary.json").string(),
                  s.to_json().dump(1, ' ', false, json::error_handler_t::replace) + "\n", "eval summary");
  // Score vs length per method: averaged over tasks, and one chart per task.
  auto series_for = [&](const std::vector<std::string>& tasks) {
    std::vector<PlotSeries> out;
    for (const auto& m : s.methods) {
      PlotSeries ps;
      ps.name = m;
      for (int L : s.lengths) {
        double sum = 0;
        int n = 0;
        for (const auto& t : tasks)
          if (const CellSummary* c = s.find(m, t, L)) { sum += c->score; ++n; }
        if (n) {
          ps.x.push_back(L);
          ps.y.push_back(sum / n);
        }
      }
      out.push_back(std::move(ps));
    }
    return out;
  };
  write_line_chart_svg((d / "score_vs_length.svg").string(), "Score vs length (mean over tasks)", "prompt tokens",
                       "score", series_for(s.tasks), true);
  for (const auto& t : s.tasks)
    write_line_chart_svg((d / ("score_vs_length_" + file_safe(t) + ".svg")).string(), "Score vs length: " + t,
                         "prompt tokens", "score", series_for({t}), true);
  // Sparsity per task per method (means over lengths).
  for (const bool esr : {false, true}) {
    std::vector<std::vector<double>> v;
    for (const auto& m : s.methods) {
      std::vector<double> row;
      for (const auto& t : s.tasks) {
        double sum = 0;
        int n = 0;
        for (int L : s.lengths)
          if (const CellSummary* c = s.find(m, t, L)) { sum += esr ? c->esr : c->msr; ++n; }
        row.push_back(n ? sum / n : std::nan(""));
      }
      v.push_back(row);
    }
    write_bar_chart_svg((d / (esr ? "esr_per_task.svg" : "msr_per_task.svg")).string(),
                        esr ? "Omega_ESR per task" : "Omega_MSR per task", esr ? "Omega_ESR" : "Omega_MSR", s.tasks,
                        s.methods, v);
  }
  // Score vs attention FLOPs: one point per method.
  std::vector<ScatterPoint> pts;
  for (const MethodSummary& m : s.per_method)
    if (m.n > 0) pts.push_back({m.method, m.flops, m.score});
  write_scatter_svg((d / "pareto.svg").string(), "Score vs attention FLOPs (Pareto front dashed)",
                    "attention FLOPs vs full", "score", pts);
  // Head maps: fraction of samples where each (layer, KV head) was routed sparse.
  for (const MethodSummary& m : s.per_method)
    if (m.n > 0 && m.n_layers > 0 && m.sparse_fraction.size() == static_cast<size_t>(m.n_layers) * m.n_kv_heads)
      write_heatmap_svg((d / ("headmap_" + file_safe(m.method) + ".svg")).string(), m.sparse_fraction, m.n_layers,
                        m.n_kv_heads, "Sparse-routed fraction per head: " + m.method, "layer", "KV head");
}

}  // namespace elastic
