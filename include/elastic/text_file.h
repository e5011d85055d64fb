#pragma once
// Reading files we did not write: every reader goes through here so that a missing file, a directory, a device or
// a file too large to hold fails the same way, naming the path and what the file was meant to be ("config file",
// "tokenizer file", ...), instead of a bare library string ("basic_filebuf::underflow") or an unbounded read (a FIFO
// or /dev/zero read "whole" never ends).
#include <cstddef>
#include <cstdint>
#include <string>

namespace elastic {

// Default cap on a file read whole into memory: 1 GiB, far above any config, tokenizer (~10 MB), data or prompt
// file we read, far below what would exhaust memory by accident.
inline constexpr uint64_t kMaxTextFileBytes = 1ULL << 30;
// Cap on an input that is turned whole into structures many times its size (a text to tokenize, a CSV to plot, a JSON
// file: kMaxJsonFileBytes): 64 MiB. Tokenizing holds about 25 bytes per input byte (16 MB of text: 406 MB resident), so at the 1 GiB cap those
// commands ran out of memory; a larger input is refused, naming the limit, and can be split.
inline constexpr uint64_t kMaxParsedInputBytes = 64ULL << 20;

// A file opened for reading. Throws std::runtime_error "<path>: cannot open [<what>]: <reason>" when it cannot be
// opened and "<path>: is a directory, not a <what>" for a directory. Devices, pipes and FIFOs open (size unknown);
// regular files know their size, so a reader can check a declared length against it before allocating.
class InputFile {
 public:
  InputFile(const std::string& path, const std::string& what);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  const std::string& path() const { return path_; }
  bool regular() const { return regular_; }
  uint64_t size() const { return size_; }  // regular files; 0 otherwise
  uint64_t offset() const { return pos_; }  // bytes read so far
  // Up to n bytes (fewer only at the end of the file); throws "<path>: cannot read <what>: <reason>".
  size_t read_some(void* dst, size_t n);
  // Exactly n bytes, or throws "<path>: truncated <what>: ... while reading <field>".
  void read_exact(void* dst, size_t n, const std::string& field);
  // What remains, at most max_bytes (else throws "<path>: <what> is larger than the limit of N bytes").
  std::string read_rest(uint64_t max_bytes);

 private:
  std::string path_, what_;
  int fd_ = -1;
  bool regular_ = false;
  uint64_t size_ = 0, pos_ = 0;
};

// The whole file (at most max_bytes), with InputFile's errors.
std::string read_text_file(const std::string& path, const std::string& what = "",
                           uint64_t max_bytes = kMaxTextFileBytes);

}  // namespace elastic
