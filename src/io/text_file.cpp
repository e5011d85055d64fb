#include "elastic/text_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace elastic {
namespace {

std::string with_what(const std::string& what) { return what.empty() ? "" : " " + what; }

}  // namespace

InputFile::InputFile(const std::string& path, const std::string& what) : path_(path), what_(what) {
  // POSIX I/O, not std::ifstream: an ifstream opens a directory and then throws "basic_filebuf::underflow" from
  // the first read, and it cannot tell a regular file (whose size we can check) from a device.
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw std::runtime_error(path + ": cannot open" + with_what(what) + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int e = errno;
    ::close(fd_);
    throw std::runtime_error(path + ": cannot stat" + with_what(what) + ": " + std::strerror(e));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd_);
    throw std::runtime_error(path + ": is a directory, not a" + (what.empty() ? " file" : with_what(what)));
  }
  regular_ = S_ISREG(st.st_mode);
  size_ = regular_ ? static_cast<uint64_t>(st.st_size) : 0;
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

size_t InputFile::read_some(void* dst, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd_, static_cast<char*>(dst) + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw std::runtime_error(path_ + ": cannot read" + with_what(what_) + ": " + std::strerror(errno));
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  pos_ += got;
  return got;
}

void InputFile::read_exact(void* dst, size_t n, const std::string& field) {
  const uint64_t at = pos_;
  const size_t got = read_some(dst, n);
  if (got != n)
    throw std::runtime_error(path_ + ": truncated" + with_what(what_) + ": need " + std::to_string(n) +
                             " bytes at offset " + std::to_string(at) + " while reading " + field + ", the file ends " +
                             std::to_string(got) + " bytes later");
}

std::string InputFile::read_rest(uint64_t max_bytes) {
  auto too_large = [&] {
    return std::runtime_error(path_ + ":" + with_what(what_.empty() ? "file" : what_) +
                              " is larger than the limit of " + std::to_string(max_bytes) + " bytes");
  };
  std::string out;
  if (regular_) {
    // The size is known: refuse before reading, and read it in one allocation.
    const uint64_t left = size_ > pos_ ? size_ - pos_ : 0;
    if (left > max_bytes) throw too_large();
    out.resize(static_cast<size_t>(left));
    out.resize(read_some(out.data(), out.size()));  // a file that shrank meanwhile gives what is there
    return out;
  }
  // A device or pipe: read in chunks up to the limit (one byte past it tells "exactly max" from "more").
  constexpr size_t kChunk = 1 << 20;
  for (;;) {
    const size_t old = out.size();
    const uint64_t room = max_bytes + 1 - old;
    out.resize(old + static_cast<size_t>(std::min<uint64_t>(kChunk, room)));
    const size_t got = read_some(out.data() + old, out.size() - old);
    out.resize(old + got);
    if (out.size() > max_bytes) throw too_large();
    if (got == 0) return out;
  }
}

std::string read_text_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  InputFile f(path, what);
  return f.read_rest(max_bytes);
}

}  // namespace elastic
