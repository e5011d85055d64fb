#include "elastic/output_file.h"

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace elastic {

OutputFile::OutputFile(const std::string& path, const std::string& what) : path_(path), what_(what) {
  errno = 0;
  f_.open(path, std::ios::binary | std::ios::trunc);
  if (!f_) fail();
}

OutputFile::~OutputFile() {
  if (f_.is_open()) f_.close();
}

void OutputFile::fail() const {
  // errno is the best reason the C++ streams leave us; 0 means the library set no errno (say nothing then).
  const int e = errno;
  throw std::runtime_error(path_ + ": cannot write " + what_ + (e ? std::string(": ") + std::strerror(e) : ""));
}

void OutputFile::write(const void* data, size_t bytes) {
  errno = 0;
  f_.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (!f_) fail();
}

void OutputFile::close() {
  errno = 0;
  f_.flush();
  if (!f_) fail();
  f_.close();
  if (f_.fail()) fail();
}

void write_text_file(const std::string& path, std::string_view text, const std::string& what) {
  OutputFile f(path, what);
  f.write(text);
  f.close();
}

}  // namespace elastic
