#include "elastic/json_file.h"

#include <stdexcept>

#include "elastic/text_file.h"

namespace elastic {

void check_json_depth(std::string_view text, const std::string& source, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;  // the escaped character cannot end the string
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        throw std::runtime_error(source + ": JSON nested deeper than " + std::to_string(max_depth) +
                                 " levels (at byte " + std::to_string(i) + ")");
    } else if (c == ']' || c == '}') {
      --depth;  // unbalanced closers are the parser's to report
    }
  }
}

nlohmann::json parse_json_text(std::string_view text, const std::string& source) {
  check_json_depth(text, source);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a number like 1e400
    throw std::runtime_error(source + ": malformed JSON: " + e.what());
  }
}

nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  return parse_json_text(read_text_file(path, what, kMaxJsonFileBytes), path);
}

std::string dump_json(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace elastic
