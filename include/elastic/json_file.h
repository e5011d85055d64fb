#pragma once
// Reads a whole JSON file; errors name the file and say what kind of file it was meant to be.
#include <string>

#include <nlohmann/json.hpp>

namespace elastic {

// Throws std::runtime_error "<path>: cannot open <what>" or "<path>: malformed JSON: ...".
nlohmann::json read_json_file(const std::string& path, const std::string& what);

}  // namespace elastic
