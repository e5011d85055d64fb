#pragma once
// Small self-contained SVG charts (eval reports, `elastic bench --plot`, `elastic plot`): line chart, grouped bar chart,
// scatter with Pareto front.
// Every chart has a title, labelled axes with ticks and a legend; each data element carries a class
// ("series", "point", "bar", "pareto") so tests and scripts can find them. Non-finite values are skipped.
// Throws std::runtime_error on inconsistent shapes or when the file cannot be written.
#include <string>
#include <vector>

namespace elastic {

struct PlotSeries {
  std::string name;
  std::vector<double> x, y;  // same size
};
// log2_x: x axis in log2 scale (lengths 4k, 8k, 16k ... evenly spaced). y_from_zero: the y axis starts at 0 (else
// it spans the data, for ratios near 1).
void write_line_chart_svg(const std::string& path, const std::string& title, const std::string& x_label,
                          const std::string& y_label, const std::vector<PlotSeries>& series, bool log2_x = false,
                          bool y_from_zero = true);

// values[s][g]: series s (legend) in group g (x axis).
void write_bar_chart_svg(const std::string& path, const std::string& title, const std::string& y_label,
                         const std::vector<std::string>& groups, const std::vector<std::string>& series,
                         const std::vector<std::vector<double>>& values);

struct ScatterPoint {
  std::string label;
  double x = 0, y = 0;
};
// Draws the Pareto front (lower x and higher y are better) as a line through the non-dominated points.
void write_scatter_svg(const std::string& path, const std::string& title, const std::string& x_label,
                       const std::string& y_label, const std::vector<ScatterPoint>& points);
// Indices of the non-dominated points (no other point has x <= and y >= with one strict), sorted by x.
std::vector<size_t> pareto_front(const std::vector<ScatterPoint>& points);

}  // namespace elastic
