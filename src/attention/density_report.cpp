#include "elastic/density_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "elastic/sparse_pattern.h"

namespace elastic {

int HeadDensity::heads() const {
  return static_cast<int>(std::count_if(kept.begin(), kept.end(), [](double x) { return std::isfinite(x); }));
}

double HeadDensity::mean() const {
  double s = 0;
  int n = 0;
  for (double x : kept)
    if (std::isfinite(x)) s += x, ++n;
  return n ? s / n : NAN;
}

HeadDensity selected_head_density(const AttentionStats& st, const RoutingTable& r) {
  const size_t n = static_cast<size_t>(r.n_layers) * r.n_kv_heads;
  if (st.layer_blocks_causal.size() != n || st.layer_blocks_skipped.size() != n)
    throw std::invalid_argument("head density: the prefill's per-layer block counts are missing (set "
                                "AttentionStats::per_layer before the run) or are not " +
                                std::to_string(r.n_layers) + " x " + std::to_string(r.n_kv_heads));
  HeadDensity d;
  d.n_layers = r.n_layers;
  d.n_kv_heads = r.n_kv_heads;
  d.kept.assign(n, NAN);
  for (size_t i = 0; i < n; ++i)
    if (sparse_pattern(r.mode[i]).select && st.layer_blocks_causal[i] > 0)
      d.kept[i] = 1.0 - st.layer_blocks_skipped[i] / st.layer_blocks_causal[i];
  if (st.xattn_kept_tiles > 0) d.paired_walk_cost = st.xattn_paired_tiles / st.xattn_kept_tiles;
  if (st.xattn_rowpair_kept > 0) d.rowpair_walk_cost = st.xattn_rowpair_tiles / st.xattn_rowpair_kept;
  return d;
}

std::string head_density_markdown(const HeadDensity& d) {
  std::vector<double> v;
  for (double x : d.kept)
    if (std::isfinite(x)) v.push_back(x);
  if (v.empty()) return "No head selects blocks under this routing.\n";
  std::sort(v.begin(), v.end());
  auto q = [&](double p) { return v[static_cast<size_t>(std::lround(p * (v.size() - 1)))]; };
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%d heads select blocks: kept share mean %.3f, min %.3f, 10%% %.3f, median %.3f, 90%% %.3f, max "
                "%.3f.\n\n",
                d.heads(), d.mean(), v.front(), q(0.1), q(0.5), q(0.9), v.back());
  std::string o = buf;
  if (std::isfinite(d.paired_walk_cost)) {
    std::snprintf(buf, sizeof buf,
                  "The GPU kernel's paired walk (two query heads of a KV head together, adjacent 64-key tiles over "
                  "the union of their selections) would compute %.2f tiles per tile these selections keep",
                  d.paired_walk_cost);
    o += buf;
    if (std::isfinite(d.rowpair_walk_cost)) {
      std::snprintf(buf, sizeof buf,
                    "; one query head's two adjacent 64-row query tiles walked together instead (row pairs), %.2f",
                    d.rowpair_walk_cost);
      o += buf;
    }
    o += ".\n\n";
  }
  o += "| layer | mean |";
  for (int h = 0; h < d.n_kv_heads; ++h) o += " head " + std::to_string(h) + " |";
  o += "\n|---:|---:|";
  for (int h = 0; h < d.n_kv_heads; ++h) o += "---:|";
  o += "\n";
  for (int l = 0; l < d.n_layers; ++l) {
    double s = 0;
    int n = 0;
    std::string cells;
    for (int h = 0; h < d.n_kv_heads; ++h) {
      const double x = d.kept[static_cast<size_t>(l) * d.n_kv_heads + h];
      if (std::isfinite(x)) s += x, ++n, std::snprintf(buf, sizeof buf, " %.3f |", x);
      else std::snprintf(buf, sizeof buf, " - |");
      cells += buf;
    }
    if (n) std::snprintf(buf, sizeof buf, "| %d | %.3f |", l, s / n);
    else std::snprintf(buf, sizeof buf, "| %d | - |", l);
    o += buf + cells + "\n";
  }
  return o;
}

}  // namespace elastic
