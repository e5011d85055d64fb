#pragma once
// Files we write, with every failure an error: the open, each write and the final flush + close are checked, so a
// full disk (or /dev/full) throws "<path>: cannot write <what>: No space left on device" instead of a silent
// truncated file and a "wrote ..." line. Every writer in the library and the CLI goes through here.
#include <cstddef>
#include <fstream>
#include <string>
#include <string_view>

namespace elastic {

class OutputFile {
 public:
  // Opens (truncating) `path`; `what` names the kind of file in errors ("routing file", "SVG plot", ...).
  OutputFile(const std::string& path, const std::string& what);
  ~OutputFile();  // closes without throwing; a file not close()d is one whose writer already failed
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, size_t bytes);
  void write(std::string_view text) { write(text.data(), text.size()); }
  // Streams into the file; checked at the next write() or close().
  std::ostream& stream() { return f_; }
  // Flushes and closes; throws naming the path and the system's reason when any write failed.
  void close();

 private:
  [[noreturn]] void fail() const;
  std::string path_, what_;
  std::ofstream f_;
};

// The whole file in one call (checked as above).
void write_text_file(const std::string& path, std::string_view text, const std::string& what);

}  // namespace elastic
