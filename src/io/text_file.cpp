#include "elastic/text_file.h"

#include <fstream>
#include <iterator>
#include <stdexcept>

namespace elastic {

std::string read_text_file(const std::string& path, const std::string& what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open" + (what.empty() ? "" : " " + what));
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace elastic
