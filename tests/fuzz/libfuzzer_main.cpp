// libFuzzer entry for one fuzz target (ELASTIC_FUZZ_TARGET), built with -DELASTIC_LIBFUZZER=ON and clang:
//   build-fuzz/elastic_libfuzz_npy -max_total_time=600 corpus_dir/
// The target's seeds are written into the corpus directory given first (libFuzzer reads it). Each input is written
// to a file (the parsers read paths) and run as in elastic_fuzz; an escape it would count as a failure aborts here,
// which libFuzzer reports with the input.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>
#include <stdexcept>
#include <string>

#include "fuzz_targets.h"

namespace {

const elastic::fuzz::Target* g_target = nullptr;
std::string g_input;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  namespace fs = std::filesystem;
  const std::string work = (fs::temp_directory_path() / ("elastic_libfuzz_" + std::to_string(getpid()))).string();
  static const auto targets = elastic::fuzz::make_targets(ELASTIC_FIXTURE_DIR, work + "/seeds");
  for (const auto& t : targets)
    if (t.name == ELASTIC_FUZZ_TARGET) g_target = &t;
  if (!g_target) std::abort();
  g_input = work + "/input";
  // Seeds go into the first corpus directory on the command line, if any.
  for (int i = 1; i < *argc; ++i) {
    const std::string a = (*argv)[i];
    if (!a.empty() && a[0] != '-' && fs::is_directory(a)) {
      for (size_t k = 0; k < g_target->seeds.size(); ++k)
        std::ofstream(a + "/seed" + std::to_string(k), std::ios::binary) << g_target->seeds[k];
      break;
    }
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::ofstream(g_input, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), size);
  try {
    g_target->run(g_input);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "std::bad_alloc escaped\n");
    std::abort();
  } catch (const std::runtime_error& e) {
    if (g_target->errors_name_file && std::string(e.what()).find(g_input) == std::string::npos) {
      std::fprintf(stderr, "error does not name the file: %s\n", e.what());
      std::abort();
    }
  } catch (const std::invalid_argument& e) {
    if (g_target->errors_name_file && std::string(e.what()).find(g_input) == std::string::npos) {
      std::fprintf(stderr, "error does not name the file: %s\n", e.what());
      std::abort();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "a library exception escaped: %s\n", e.what());
    std::abort();
  }
  return 0;
}
