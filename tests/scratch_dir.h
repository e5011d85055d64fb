// Where tests write files: one directory per test process under the system temp directory, emptied on first use and
// removed when the process exits, so test files never pile up in /tmp (ctest runs each test in its own process, so
// parallel tests never share one).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace elastic::test {

inline const std::filesystem::path& scratch_dir() {
  struct Dir {
    std::filesystem::path path;
    Dir() : path(std::filesystem::temp_directory_path() / ("elastic_test_" + std::to_string(::getpid()))) {
      std::filesystem::remove_all(path);
      std::filesystem::create_directories(path);
    }
    ~Dir() {
      std::error_code ec;  // best effort at exit: never throw from a static destructor
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir d;
  return d.path;
}

// A path inside scratch_dir() (nothing is created).
inline std::string scratch_path(const std::string& name) { return (scratch_dir() / name).string(); }

}  // namespace elastic::test
