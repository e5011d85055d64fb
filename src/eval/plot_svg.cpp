#include "elastic/plot_svg.h"

#include "elastic/heatmap_svg.h"
#include "elastic/output_file.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace elastic {

namespace {

constexpr double kW = 720, kH = 470, kL = 70, kR = 190, kT = 50, kB = 90;  // canvas and margins (px)

const char* palette(size_t i) {
  static const char* c[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                            "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  return c[i % 10];
}


std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

// An axis tick: whole numbers from 1000 up in a readable form, 16K / 1M for multiples of 1024 (context lengths),
// 60,000 with separators otherwise (token rates); anything else as num() does.
std::string tick_label(double v) {
  if (std::abs(v) < 1000 || std::abs(v) >= 1e15 || v != std::floor(v)) return num(v);
  const long long n = static_cast<long long>(v);
  std::string out = n < 0 ? "-" : "";
  if (n % 1048576 == 0 || n % 1024 == 0) {
    out += std::to_string(std::llabs(n) / (n % 1048576 == 0 ? 1048576 : 1024));
    out += n % 1048576 == 0 ? 'M' : 'K';
    return out;
  }
  const std::string digits = std::to_string(std::llabs(n));
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// ~5 round tick values covering [lo, hi].
std::vector<double> ticks(double lo, double hi) {
  if (!(hi > lo)) hi = lo + 1;
  const double raw = (hi - lo) / 5;
  const double mag = std::pow(10, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= raw) { step = m * mag; break; }
  // The ticks by count, not by adding step until past hi: where step is below the doubles' resolution at lo (values
  // near 1e17 that differ by 16, `plot --y-fit`), v += step never advanced and the loop grew the list without end.
  const double first = std::ceil(lo / step - 1e-9) * step;
  const double n = std::floor((hi - first) / step + 1e-9) + 1;
  if (!(n >= 1 && n <= 1000) || first + step == first) return {lo, hi};
  std::vector<double> t;
  for (int i = 0; i < static_cast<int>(n); ++i) {
    const double v = first + i * step;
    t.push_back(std::abs(v) < step * 1e-9 ? 0 : v);
  }
  return t;
}

struct Range {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    if (std::isfinite(v)) { lo = std::min(lo, v); hi = std::max(hi, v); }
  }
  void fix(double pad_frac) {
    if (!std::isfinite(lo)) { lo = 0; hi = 1; }
    // Values near +-1e308 span more than a double holds: every coordinate would come out NaN.
    if (!std::isfinite(hi - lo) || !std::isfinite((hi - lo) * (1 + 2 * pad_frac)))
      throw std::runtime_error("chart: the values span " + num(lo) + " to " + num(hi) +
                               ", more than a double holds for the axis");
    if (hi - lo < 1e-12) { lo -= 0.5; hi += 0.5; }
    const double p = (hi - lo) * pad_frac;
    lo -= p;
    hi += p;
  }
};

struct Canvas {
  std::ostringstream o;
  Range xr, yr;
  bool log2_x = false;
  double px(double x) const {
    const double a = log2_x ? std::log2(xr.lo) : xr.lo, b = log2_x ? std::log2(xr.hi) : xr.hi;
    const double v = log2_x ? std::log2(x) : x;
    return kL + (v - a) / (b - a) * (kW - kL - kR);
  }
  double py(double y) const { return kH - kB - (y - yr.lo) / (yr.hi - yr.lo) * (kH - kT - kB); }
  std::string title;
  size_t legend_chars = 0;  // the longest legend label: the canvas widens so it is not cut off
  void begin(const std::string& t) { title = t; }  // the header goes out in save(), once the width is known
  void axes(const std::string& xl, const std::string& yl, const std::vector<std::pair<double, std::string>>& xt) {
    o << "<rect x=\"" << kL << "\" y=\"" << kT << "\" width=\"" << kW - kL - kR << "\" height=\"" << kH - kT - kB
      << "\" fill=\"none\" stroke=\"#333\"/>\n";
    for (double t : ticks(yr.lo, yr.hi)) {
      if (t < yr.lo - 1e-12 || t > yr.hi + 1e-12) continue;
      o << "<line x1=\"" << kL << "\" x2=\"" << kW - kR << "\" y1=\"" << py(t) << "\" y2=\"" << py(t)
        << "\" stroke=\"#ddd\"/><text x=\"" << kL - 6 << "\" y=\"" << py(t) + 4 << "\" text-anchor=\"end\">" << tick_label(t)
        << "</text>\n";
    }
    for (const auto& [x, label] : xt)
      o << "<text x=\"" << x << "\" y=\"" << kH - kB + 18 << "\" text-anchor=\"middle\">" << xml_escape(label) << "</text>\n";
    o << "<text x=\"" << (kW - kR + kL) / 2 << "\" y=\"" << kH - 14 << "\" text-anchor=\"middle\">" << xml_escape(xl)
      << "</text>\n<text transform=\"translate(18," << (kH - kB + kT) / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
      << xml_escape(yl) << "</text>\n";
  }
  void legend(const std::vector<std::string>& names) {
    for (size_t i = 0; i < names.size(); ++i) {
      const double y = kT + 10 + i * 18.0;
      o << "<rect class=\"legend\" x=\"" << kW - kR + 14 << "\" y=\"" << y - 9 << "\" width=\"12\" height=\"12\" fill=\""
        << palette(i) << "\"/><text x=\"" << kW - kR + 32 << "\" y=\"" << y + 1 << "\">" << xml_escape(names[i]) << "</text>\n";
      legend_chars = std::max(legend_chars, names[i].size());
    }
  }
  void save(const std::string& path) {
    // About 7 px per character at font size 12; the plot area keeps its size, only the right margin grows.
    const double w = std::max(kW, kW - kR + 32 + 7.0 * static_cast<double>(legend_chars) + 12);
    std::ostringstream head;
    head << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w << "\" height=\"" << kH << "\" viewBox=\"0 0 "
         << w << " " << kH << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
         << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
         << "<text class=\"title\" x=\"" << (kW - kR + kL) / 2 << "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">"
         << xml_escape(title) << "</text>\n";
    write_text_file(path, head.str() + o.str() + "</svg>\n", "SVG plot");
  }
};

}  // namespace

void write_line_chart_svg(const std::string& path, const std::string& title, const std::string& x_label,
                          const std::string& y_label, const std::vector<PlotSeries>& series, bool log2_x,
                          bool y_from_zero) {
  Canvas c;
  c.log2_x = log2_x;
  std::vector<double> xs;
  for (const PlotSeries& s : series) {
    if (s.x.size() != s.y.size()) throw std::runtime_error(path + ": series '" + s.name + "' has x/y of different sizes");
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (log2_x && !(s.x[i] > 0)) throw std::runtime_error(path + ": log2 x axis needs positive x values");
      c.xr.add(s.x[i]);
      c.yr.add(s.y[i]);
      xs.push_back(s.x[i]);
    }
  }
  if (!std::isfinite(c.xr.lo)) { c.xr.lo = 1; c.xr.hi = 2; }
  if (c.xr.hi - c.xr.lo < 1e-12) { c.xr.lo *= 0.5; c.xr.hi *= 2; if (!log2_x && c.xr.hi == 0) c.xr.hi = 1; }
  if (y_from_zero) c.yr.add(0);
  c.yr.fix(y_from_zero ? 0.05 : 0.1);
  std::sort(xs.begin(), xs.end());
  xs.erase(std::unique(xs.begin(), xs.end()), xs.end());
  std::vector<std::pair<double, std::string>> xt;
  for (double x : xs) xt.push_back({c.px(x), tick_label(x)});
  c.begin(title);
  c.axes(x_label, y_label, xt);
  std::vector<std::string> names;
  for (size_t si = 0; si < series.size(); ++si) {
    const PlotSeries& s = series[si];
    names.push_back(s.name);
    std::vector<size_t> idx;
    for (size_t i = 0; i < s.x.size(); ++i)
      if (std::isfinite(s.x[i]) && std::isfinite(s.y[i])) idx.push_back(i);
    std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return s.x[a] < s.x[b]; });
    c.o << "<polyline class=\"series\" fill=\"none\" stroke-width=\"2\" stroke=\"" << palette(si) << "\" points=\"";
    for (size_t i : idx) c.o << c.px(s.x[i]) << "," << c.py(s.y[i]) << " ";
    c.o << "\"><title>" << xml_escape(s.name) << "</title></polyline>\n";
    for (size_t i : idx)
      c.o << "<circle class=\"point\" r=\"3.5\" fill=\"" << palette(si) << "\" cx=\"" << c.px(s.x[i]) << "\" cy=\""
          << c.py(s.y[i]) << "\"><title>" << xml_escape(s.name) << ": " << num(s.x[i]) << ", " << num(s.y[i])
          << "</title></circle>\n";
  }
  c.legend(names);
  c.save(path);
}

void write_bar_chart_svg(const std::string& path, const std::string& title, const std::string& y_label,
                         const std::vector<std::string>& groups, const std::vector<std::string>& series,
                         const std::vector<std::vector<double>>& values) {
  if (values.size() != series.size()) throw std::runtime_error(path + ": one value row per series expected");
  for (const auto& row : values)
    if (row.size() != groups.size()) throw std::runtime_error(path + ": one value per group expected");
  Canvas c;
  c.xr.lo = 0;
  c.xr.hi = std::max<double>(1, groups.size());
  c.yr.add(0);
  for (const auto& row : values)
    for (double v : row) c.yr.add(v);
  c.yr.fix(0.0);
  c.yr.hi += (c.yr.hi - c.yr.lo) * 0.05;
  std::vector<std::pair<double, std::string>> xt;
  for (size_t g = 0; g < groups.size(); ++g) xt.push_back({c.px(g + 0.5), groups[g]});
  c.begin(title);
  c.axes("", y_label, {});
  // Group labels rotated so long task names fit.
  for (const auto& [x, label] : xt)
    c.o << "<text transform=\"translate(" << x << "," << kH - kB + 12 << ") rotate(30)\" font-size=\"10\">"
        << xml_escape(label) << "</text>\n";
  const double gw = (kW - kL - kR) / std::max<double>(1, groups.size());
  const double bw = gw * 0.8 / std::max<size_t>(1, series.size());
  for (size_t s = 0; s < series.size(); ++s)
    for (size_t g = 0; g < groups.size(); ++g) {
      const double v = values[s][g];
      if (!std::isfinite(v)) continue;
      const double x = kL + g * gw + gw * 0.1 + s * bw, y0 = c.py(0), y1 = c.py(v);
      c.o << "<rect class=\"bar\" x=\"" << x << "\" y=\"" << std::min(y0, y1) << "\" width=\"" << bw * 0.95
          << "\" height=\"" << std::abs(y0 - y1) << "\" fill=\"" << palette(s) << "\"><title>" << xml_escape(series[s]) << " / "
          << xml_escape(groups[g]) << ": " << num(v) << "</title></rect>\n";
    }
  c.legend(series);
  c.save(path);
}

std::vector<size_t> pareto_front(const std::vector<ScatterPoint>& p) {
  std::vector<size_t> out;
  for (size_t i = 0; i < p.size(); ++i) {
    if (!std::isfinite(p[i].x) || !std::isfinite(p[i].y)) continue;
    bool dominated = false;
    for (size_t j = 0; j < p.size() && !dominated; ++j)
      dominated = j != i && std::isfinite(p[j].x) && std::isfinite(p[j].y) && p[j].x <= p[i].x && p[j].y >= p[i].y &&
                  (p[j].x < p[i].x || p[j].y > p[i].y);
    if (!dominated) out.push_back(i);
  }
  std::sort(out.begin(), out.end(), [&](size_t a, size_t b) { return p[a].x < p[b].x || (p[a].x == p[b].x && a < b); });
  return out;
}

void write_scatter_svg(const std::string& path, const std::string& title, const std::string& x_label,
                       const std::string& y_label, const std::vector<ScatterPoint>& points) {
  Canvas c;
  for (const ScatterPoint& p : points) {
    c.xr.add(p.x);
    c.yr.add(p.y);
  }
  c.xr.add(0);
  c.xr.fix(0.05);
  c.yr.add(0);
  c.yr.fix(0.05);
  std::vector<std::pair<double, std::string>> xt;
  for (double t : ticks(c.xr.lo, c.xr.hi))
    if (t >= c.xr.lo && t <= c.xr.hi) xt.push_back({c.px(t), tick_label(t)});
  c.begin(title);
  c.axes(x_label, y_label, xt);
  const std::vector<size_t> front = pareto_front(points);
  c.o << "<polyline class=\"pareto\" fill=\"none\" stroke=\"#999\" stroke-dasharray=\"4 3\" points=\"";
  for (size_t i : front) c.o << c.px(points[i].x) << "," << c.py(points[i].y) << " ";
  c.o << "\"/>\n";
  std::vector<std::string> names;
  for (size_t i = 0; i < points.size(); ++i) {
    const ScatterPoint& p = points[i];
    names.push_back(p.label);
    if (!std::isfinite(p.x) || !std::isfinite(p.y)) continue;
    c.o << "<circle class=\"point\" r=\"5\" fill=\"" << palette(i) << "\" cx=\"" << c.px(p.x) << "\" cy=\"" << c.py(p.y)
        << "\"><title>" << xml_escape(p.label) << ": " << num(p.x) << ", " << num(p.y) << "</title></circle>\n";
  }
  c.legend(names);
  c.save(path);
}

}  // namespace elastic
