#include "elastic/json_file.h"

#include <stdexcept>

#include "elastic/text_file.h"

namespace elastic {

nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  const std::string text = read_text_file(path, what);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw std::runtime_error(path + ": malformed JSON: " + e.what());
  }
}

}  // namespace elastic
