#pragma once
// Self-contained SVG heat map (head scores, routing head maps).
#include <string>
#include <vector>

namespace elastic {

// Escapes & < > " ' for SVG/XML text and attribute values (shared by every SVG writer).
std::string xml_escape(const std::string& s);

// values: row-major [rows, cols]. Cells are <rect class="cell"> colored on a viridis-like scale from min to max
// (non-finite values are gray); axis labels every row/col (every k-th when many); a title; a color bar with the
// min/max values. Throws std::runtime_error on a shape mismatch or when the file cannot be written.
void write_heatmap_svg(const std::string& path, const std::vector<double>& values, int rows, int cols,
                       const std::string& title, const std::string& row_label, const std::string& col_label);

}  // namespace elastic
