// The numeric CSV reader behind `elastic plot`: values, missing cells, and an error naming the line and column for
// each kind of malformed input.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <stdexcept>

#include "elastic/csv_table.h"
#include "scratch_dir.h"

using namespace elastic;

namespace {
std::string error_of(const std::string& text) {
  try {
    parse_numeric_csv(text, "t.csv");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(CsvTable, ReadsNumbersAndMissingCells) {
  const CsvTable t = parse_numeric_csv("# measured\nT, ours ,cudnn\n8192,630.4,590.1\n\n16384,,652.2\n", "t.csv");
  ASSERT_EQ(t.columns, (std::vector<std::string>{"T", "ours", "cudnn"}));
  ASSERT_EQ(t.rows.size(), 2u);
  EXPECT_DOUBLE_EQ(t.rows[0][1], 630.4);
  EXPECT_DOUBLE_EQ(t.rows[1][0], 16384);
  EXPECT_TRUE(std::isnan(t.rows[1][1]));
  EXPECT_DOUBLE_EQ(t.rows[1][2], 652.2);
  // A trailing comma is an empty last cell, not a dropped one.
  EXPECT_TRUE(std::isnan(parse_numeric_csv("x,a\n1,\n", "t.csv").rows[0][1]));
}

TEST(CsvTable, ErrorsNameLineAndColumn) {
  EXPECT_NE(error_of("T,ours\n8192,fast\n").find("t.csv:2: column 'ours': 'fast' is not a number"), std::string::npos);
  EXPECT_NE(error_of("T,ours\n8192,1,2\n").find("t.csv:2: expected 2 cells"), std::string::npos);
  EXPECT_NE(error_of("T\n1\n").find("t.csv:1: the header needs an x column"), std::string::npos);
  EXPECT_NE(error_of("T,\n1,2\n").find("header column 2 has no name"), std::string::npos);
  EXPECT_NE(error_of(",a\n").find("header column 1 has no name"), std::string::npos);
  EXPECT_NE(error_of("T,a\n,2\n").find("t.csv:2: the x cell is empty"), std::string::npos);
  EXPECT_NE(error_of("T,a\n").find("no data rows"), std::string::npos);
  EXPECT_NE(error_of("").find("no header row"), std::string::npos);
  EXPECT_NE(error_of("T,a\n1,2x\n").find("'2x' is not a number"), std::string::npos);
}

TEST(CsvTable, ReadsFilesAndNamesMissingOnes) {
  const std::string p = test::scratch_path("t.csv");
  std::ofstream(p) << "T,a,b\n1,2,3\n";
  EXPECT_EQ(read_numeric_csv(p).rows.size(), 1u);
  try {
    read_numeric_csv(test::scratch_path("absent.csv"));
    ADD_FAILURE() << "no error for a missing file";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("absent.csv: cannot open"), std::string::npos);
  }
}
