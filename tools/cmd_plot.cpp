// `elastic plot`: a line chart (SVG) from a CSV of measured results, e.g. the tables in docs/results or
// `elastic bench -o csv` reshaped to one column per series.
#include <cstdio>
#include <memory>

#include "cli_common.h"
#include "elastic/csv_table.h"
#include "elastic/plot_svg.h"

namespace elastic::cli {

void add_plot_command(CLI::App& app, Commands& cmds) {
  struct Opts {
    std::string csv, out, title, x_label, y_label;
    bool log2_x = false, y_fit = false;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("plot", "Line chart (SVG) from a CSV: first column x, one column per series");
  sub->add_option("csv", o->csv, "CSV file: a header row, then numbers (an empty cell is a missing value)")
      ->required();
  sub->add_option("-o,--output", o->out, "SVG file to write")->required();
  sub->add_option("--title", o->title, "Chart title (default: the CSV's file name)");
  sub->add_option("--x-label", o->x_label, "x axis label (default: the first column's name)");
  sub->add_option("--y-label", o->y_label, "y axis label")->required();
  sub->add_flag("--log2-x", o->log2_x, "x axis in log2 scale (context lengths 8K, 16K, ...)");
  sub->add_flag("--y-fit", o->y_fit, "y axis spans the data instead of starting at 0 (ratios near 1)");
  cmds.push_back({sub, [o] {
    const CsvTable t = read_numeric_csv(o->csv);
    std::vector<PlotSeries> series;
    for (size_t c = 1; c < t.columns.size(); ++c) {
      PlotSeries s{t.columns[c], {}, {}};
      for (const auto& row : t.rows) s.x.push_back(row[0]), s.y.push_back(row[c]);
      series.push_back(std::move(s));
    }
    if (o->log2_x)
      for (const auto& row : t.rows)
        if (!(row[0] > 0)) throw std::runtime_error(o->csv + ": --log2-x needs x > 0 in every row");
    write_line_chart_svg(o->out, o->title.empty() ? o->csv : o->title, o->x_label.empty() ? t.columns[0] : o->x_label,
                         o->y_label, series, o->log2_x, !o->y_fit);
    std::fprintf(stderr, "plot: %zu series x %zu points -> %s\n", series.size(), t.rows.size(), o->out.c_str());
  }});
}

}  // namespace elastic::cli
