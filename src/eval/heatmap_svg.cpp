#include "elastic/heatmap_svg.h"

#include "elastic/output_file.h"
#include "io/utf8.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace elastic {

namespace {


// Viridis-like scale: t in [0, 1] -> "#rrggbb".
std::string color(double t) {
  static const double stops[][3] = {{68, 1, 84},    {72, 40, 120},  {62, 74, 137},  {49, 104, 142}, {38, 130, 142},
                                    {31, 158, 137}, {53, 183, 121}, {110, 206, 88}, {181, 222, 43}, {253, 231, 37}};
  constexpr int n = 10;
  t = std::clamp(t, 0.0, 1.0);
  const double x = t * (n - 1);
  const int i = std::min(static_cast<int>(x), n - 2);
  const double f = x - i;
  char buf[8];
  int rgb[3];
  for (int c = 0; c < 3; ++c) rgb[c] = static_cast<int>(std::lround(stops[i][c] + f * (stops[i + 1][c] - stops[i][c])));
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", rgb[0], rgb[1], rgb[2]);
  return buf;
}

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

int label_step(int n) { return n <= 32 ? 1 : (n + 31) / 32; }

}  // namespace

// Also makes the text well-formed XML: control characters other than tab and newlines, and bytes that are not UTF-8
// (a --title from the shell can hold both), become U+FFFD; an SVG holding them does not open.
std::string xml_escape(const std::string& s) {
  static const char kReplacement[] = "\xEF\xBF\xBD";
  std::string o;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      uint32_t cp = 0;
      const size_t n = utf8_seq_len(reinterpret_cast<const unsigned char*>(s.data()), i, s.size(), &cp);
      if (n) o.append(s, i, n), i += n;
      else o += kReplacement, ++i;
      continue;
    }
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&apos;"; break;
      default: o += c < 0x20 && c != '\t' && c != '\n' && c != '\r' ? std::string(kReplacement) : std::string(1, char(c));
    }
    ++i;
  }
  return o;
}

void write_heatmap_svg(const std::string& path, const std::vector<double>& values, int rows, int cols,
                       const std::string& title, const std::string& row_label, const std::string& col_label) {
  if (rows <= 0 || cols <= 0) throw std::runtime_error(path + ": heat map needs positive rows and cols");
  if (values.size() != static_cast<size_t>(rows) * cols)
    throw std::runtime_error(path + ": heat map has " + std::to_string(values.size()) + " values, expected " +
                             std::to_string(rows) + " x " + std::to_string(cols));
  double lo = INFINITY, hi = -INFINITY;
  for (double v : values)
    if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (!std::isfinite(lo)) lo = hi = 0;
  const double span = hi > lo ? hi - lo : 1.0;

  const double cw = std::clamp(720.0 / cols, 6.0, 40.0), ch = std::clamp(540.0 / rows, 6.0, 30.0);
  const double left = 70, top = 50, gw = cw * cols, gh = ch * rows;
  const double bar_x = left + gw + 30, bar_w = 16;
  const double width = bar_x + bar_w + 80, height = top + gh + 60;
  const int rs = label_step(rows), cs = label_step(cols);

  std::ostringstream o;
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height << "\" viewBox=\"0 0 "
    << width << " " << height << "\" font-family=\"sans-serif\" font-size=\"10\">\n";
  o << "<defs><linearGradient id=\"cbar\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">";
  for (int i = 0; i <= 10; ++i) o << "<stop offset=\"" << i / 10.0 << "\" stop-color=\"" << color(i / 10.0) << "\"/>";
  o << "</linearGradient></defs>\n";
  o << "<rect x=\"0\" y=\"0\" width=\"" << width << "\" height=\"" << height << "\" fill=\"white\"/>\n";
  o << "<text x=\"" << width / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"14\">" << xml_escape(title)
    << "</text>\n";
  o << "<g shape-rendering=\"crispEdges\">\n";
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const double v = values[static_cast<size_t>(r) * cols + c];
      const std::string fill = std::isfinite(v) ? color((v - lo) / span) : std::string("#bbbbbb");
      o << "<rect class=\"cell\" x=\"" << left + c * cw << "\" y=\"" << top + r * ch << "\" width=\"" << cw
        << "\" height=\"" << ch << "\" fill=\"" << fill << "\"><title>" << xml_escape(row_label) << " " << r << ", "
        << xml_escape(col_label) << " " << c << ": " << fmt(v) << "</title></rect>\n";
    }
  o << "</g>\n";
  for (int r = 0; r < rows; r += rs)
    o << "<text x=\"" << left - 4 << "\" y=\"" << top + (r + 0.5) * ch + 3 << "\" text-anchor=\"end\">" << r << "</text>\n";
  for (int c = 0; c < cols; c += cs)
    o << "<text x=\"" << left + (c + 0.5) * cw << "\" y=\"" << top + gh + 12 << "\" text-anchor=\"middle\">" << c
      << "</text>\n";
  o << "<text x=\"" << left + gw / 2 << "\" y=\"" << top + gh + 30 << "\" text-anchor=\"middle\" font-size=\"12\">"
    << xml_escape(col_label) << "</text>\n";
  o << "<text x=\"18\" y=\"" << top + gh / 2 << "\" text-anchor=\"middle\" font-size=\"12\" transform=\"rotate(-90 18 "
    << top + gh / 2 << ")\">" << xml_escape(row_label) << "</text>\n";
  o << "<rect class=\"colorbar\" x=\"" << bar_x << "\" y=\"" << top << "\" width=\"" << bar_w << "\" height=\"" << gh
    << "\" fill=\"url(#cbar)\" stroke=\"#444\" stroke-width=\"0.5\"/>\n";
  o << "<text x=\"" << bar_x + bar_w + 4 << "\" y=\"" << top + 8 << "\">" << fmt(hi) << "</text>\n";
  o << "<text x=\"" << bar_x + bar_w + 4 << "\" y=\"" << top + gh << "\">" << fmt(lo) << "</text>\n";
  o << "</svg>\n";

  write_text_file(path, o.str(), "heat map SVG");
}

}  // namespace elastic
