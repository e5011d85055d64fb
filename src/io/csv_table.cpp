#include "elastic/csv_table.h"

#include "elastic/text_file.h"
#include "io/trim.h"

#include <cmath>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

namespace elastic {
namespace {

constexpr const char* kBlank = " \t\r";  // around cells; \r of CRLF files

std::vector<std::string> cells(const std::string& line) {
  std::vector<std::string> out;
  std::string cell;
  std::stringstream ss(line);
  while (std::getline(ss, cell, ',')) out.push_back(trim(cell, kBlank));
  if (!line.empty() && line.back() == ',') out.push_back("");  // getline drops a trailing empty cell
  return out;
}

}  // namespace

CsvTable parse_numeric_csv(const std::string& text, const std::string& what) {
  CsvTable t;
  std::stringstream in(text);
  std::string line;
  int line_no = 0;
  auto fail = [&](const std::string& msg) {
    throw std::runtime_error(what + ":" + std::to_string(line_no) + ": " + msg);
  };
  while (std::getline(in, line)) {
    ++line_no;
    const std::string bare = trim(line, kBlank);
    if (bare.empty() || bare[0] == '#') continue;  // blank lines and comments
    std::vector<std::string> c = cells(line);
    if (t.columns.empty()) {
      if (c.size() < 2) fail("the header needs an x column and at least one series column");
      for (size_t i = 0; i < c.size(); ++i)
        if (c[i].empty()) fail("header column " + std::to_string(i + 1) + " has no name");
      t.columns = c;
      continue;
    }
    if (c.size() != t.columns.size())
      fail("expected " + std::to_string(t.columns.size()) + " cells (as the header), got " + std::to_string(c.size()));
    std::vector<double> row(c.size(), NAN);
    for (size_t i = 0; i < c.size(); ++i) {
      if (c[i].empty()) {
        if (i == 0) fail("the x cell is empty");
        continue;
      }
      char* end = nullptr;
      row[i] = std::strtod(c[i].c_str(), &end);
      if (end == c[i].c_str() || *end != '\0')
        fail("column '" + t.columns[i] + "': '" + c[i] + "' is not a number");
    }
    t.rows.push_back(std::move(row));
  }
  if (t.columns.empty()) throw std::runtime_error(what + ": no header row");
  if (t.rows.empty()) throw std::runtime_error(what + ": no data rows");
  return t;
}

CsvTable read_numeric_csv(const std::string& path) {
  return parse_numeric_csv(read_text_file(path, "CSV table", kMaxParsedInputBytes), path);
}

}  // namespace elastic
