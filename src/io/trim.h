#pragma once
// Whitespace (or any given characters) cut from both ends of a string: Jinja's |trim, Python's str.strip().
#include <string>

namespace elastic {

inline std::string trim(const std::string& s, const char* ws = " \t\n\r\f\v") {
  const size_t a = s.find_first_not_of(ws);
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(ws) - a + 1);
}

}  // namespace elastic
