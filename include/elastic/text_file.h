#pragma once
// Reads a whole file into a string; the error names the file and, when given, what kind of file it was meant to be.
#include <string>

namespace elastic {

// Throws std::runtime_error "<path>: cannot open" (or "<path>: cannot open <what>").
std::string read_text_file(const std::string& path, const std::string& what = "");

}  // namespace elastic
