#pragma once
// A numeric table from a CSV file, for plotting measured results (`elastic plot`): a header row of column names,
// then one row per x value. The first column is x; every other column is one series. An empty cell is a missing
// value (NaN); any other cell must be a number. Throws std::runtime_error naming the file, the line and the column
// on malformed input (no header, fewer than two columns, a row with the wrong number of cells, a non-numeric cell,
// no data rows).
#include <string>
#include <vector>

namespace elastic {

struct CsvTable {
  std::vector<std::string> columns;       // [n_cols] header names
  std::vector<std::vector<double>> rows;  // [n_rows][n_cols]
};

CsvTable parse_numeric_csv(const std::string& text, const std::string& what);
CsvTable read_numeric_csv(const std::string& path);

}  // namespace elastic
