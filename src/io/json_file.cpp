#include "elastic/json_file.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace elastic {

nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open " + what);
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::parse_error& e) {
    throw std::runtime_error(path + ": malformed JSON: " + e.what());
  }
}

}  // namespace elastic
