// elastic_fuzz: the CI mutation fuzzer of every file parser (targets in fuzz_targets.cpp, mutations in mutator.h).
//
//   elastic_fuzz [--seconds S] [--iterations N] [--seed N] [--only npy,gguf,...] [--fixtures DIR]
//   elastic_fuzz --replay TARGET FILE      # runs one input (a saved failure) through one target
//
// Each target gets S / (number of targets) seconds (or N mutants, whichever ends first) and runs its parser on
// mutants of its seeds, each written to a file. An input passes when the parser accepts it or throws a
// std::runtime_error / std::invalid_argument whose message names the file. A failure is anything else: another
// exception type (std::bad_alloc from an absurd allocation, std::length_error / std::out_of_range from a library
// call, a non-std exception), an error that does not name the file (a bare library string), or one input taking
// longer than the stall limit. A crash kills the process: the input that crashed it stays in the work folder, whose
// path the signal handler prints. Failures are saved there too and the exit status is 1.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <functional>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <vector>

#include "fuzz_targets.h"
#include "mutator.h"

namespace fs = std::filesystem;
using namespace elastic::fuzz;

namespace {

// Where the signal handler says the crashing input is (a fixed buffer: nothing allocates in the handler).
char g_current[4096];

extern "C" void on_crash(int sig) {
  const char* head = "\nelastic_fuzz: crashed (signal) on the input in ";
  (void)!write(2, head, std::strlen(head));
  (void)!write(2, g_current, std::strlen(g_current));
  (void)!write(2, "\n", 1);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("elastic_fuzz: cannot write " + path);
}

// What one input did: "" when it passed, else why it is a failure.
std::string run_one(const Target& t, const std::string& path, bool* accepted) {
  *accepted = false;
  try {
    t.run(path);
    *accepted = true;
    return "";
  } catch (const std::bad_alloc& e) {
    return std::string("std::bad_alloc (an allocation no limit stopped): ") + e.what();
  } catch (const std::runtime_error& e) {
    return t.errors_name_file && std::string(e.what()).find(path) == std::string::npos
               ? std::string("error does not name the file: ") + e.what()
               : "";
  } catch (const std::invalid_argument& e) {
    return t.errors_name_file && std::string(e.what()).find(path) == std::string::npos
               ? std::string("error does not name the file: ") + e.what()
               : "";
  } catch (const std::exception& e) {
    return std::string("a library exception escaped (") + typeid(e).name() + "): " + e.what();
  } catch (...) {
    return "a non-std exception escaped";
  }
}

struct Options {
  double seconds = 30;
  long iterations = 1L << 40;
  uint64_t seed = 1;
  std::vector<std::string> only;
  std::string fixtures = ELASTIC_FIXTURE_DIR;
  double stall_s = 10;  // one input may take this long (a sanitizer build is ~5x slower than needed)
};

// Mutation-fuzzes one target; returns its number of failures.
int fuzz_target(const Target& t, const Options& o, double budget_s, const std::string& work) {
  using clock = std::chrono::steady_clock;
  Mutator m(o.seed * 0x9E3779B97F4A7C15ULL + std::hash<std::string>{}(t.name));
  const std::string input = (fs::path(work) / ("input." + t.name)).string();
  std::snprintf(g_current, sizeof g_current, "%s (target %s)", input.c_str(), t.name.c_str());
  const auto start = clock::now();
  long n = 0, accepted = 0, seeds_ok = 0;
  int failures = 0;
  double slowest = 0;
  for (; n < o.iterations; ++n) {
    const double elapsed = std::chrono::duration<double>(clock::now() - start).count();
    if (n >= static_cast<long>(t.seeds.size()) && elapsed >= budget_s) break;
    // The seeds first, unmutated: a seed the parser refuses means the target tests only early errors.
    const bool is_seed = n < static_cast<long>(t.seeds.size());
    const std::string bytes = is_seed ? t.seeds[n] : m.mutate(t.seeds, t.text);
    write_file(input, bytes);
    const auto t0 = clock::now();
    bool ok = false;
    std::string why = run_one(t, input, &ok);
    const double took = std::chrono::duration<double>(clock::now() - t0).count();
    slowest = std::max(slowest, took);
    if (why.empty() && took > o.stall_s) why = "took " + std::to_string(took) + " s (stall limit " +
                                               std::to_string(o.stall_s) + " s)";
    // Seeds come from our own writers and test fixtures: a refused seed means the target no longer reaches past
    // the first check of its parser, and the mutations of it test nothing.
    if (is_seed && !ok && why.empty()) why = "seed refused: the target's parser rejects a valid file";
    accepted += ok;
    seeds_ok += is_seed && ok;
    if (!why.empty()) {
      const std::string saved = (fs::path(work) / ("failure." + t.name + "." + std::to_string(n))).string();
      if (failures < 5) write_file(saved, bytes);
      std::fprintf(stderr, "FAIL %s input %ld: %s\n  input saved as %s (replay: elastic_fuzz --replay %s FILE)\n",
                   t.name.c_str(), n, why.substr(0, 600).c_str(), saved.c_str(), t.name.c_str());
      ++failures;
    }
  }
  const double elapsed = std::chrono::duration<double>(clock::now() - start).count();
  std::printf("%-12s %8ld inputs in %5.1f s, %7ld accepted, seeds %ld/%zu valid, slowest %.3f s, %d failures\n",
              t.name.c_str(), n, elapsed, accepted, seeds_ok, t.seeds.size(), slowest, failures);
  std::fflush(stdout);
  return failures;
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "elastic_fuzz: %s\nusage: elastic_fuzz [--seconds S] [--iterations N] [--seed N] "
                       "[--only a,b] [--fixtures DIR]\n       elastic_fuzz --replay TARGET FILE\n", why);
  std::exit(2);
}

// A cap on the address space (not under AddressSanitizer, which reserves terabytes of shadow): an absurd
// allocation then throws std::bad_alloc, a failure the run reports, instead of swapping the machine.
void cap_memory() {
#if !defined(__SANITIZE_ADDRESS__)
  const rlim_t cap = 6ULL << 30;
  rlimit r{cap, cap};
  setrlimit(RLIMIT_AS, &r);
#endif
}

}  // namespace

int main(int argc, char** argv) {
  setenv("OMP_NUM_THREADS", "1", 0);  // before the first parallel region; the parsers' loops need no threads
  Options o;
  std::string replay_target, replay_file;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    try {
      if (a == "--seconds") o.seconds = std::stod(next());
      else if (a == "--iterations") o.iterations = std::stol(next());
      else if (a == "--seed") o.seed = std::stoull(next());
      else if (a == "--fixtures") o.fixtures = next();
      else if (a == "--stall") o.stall_s = std::stod(next());
      else if (a == "--only") {
        std::string list = next(), item;
        for (std::stringstream ss(list); std::getline(ss, item, ',');) o.only.push_back(item);
      } else if (a == "--replay") {
        replay_target = next();
        replay_file = next();
      } else {
        usage(("unknown argument " + a).c_str());
      }
    } catch (const std::logic_error&) {
      usage(("bad value for " + a).c_str());
    }
  }
  cap_memory();
  const std::string work = (fs::temp_directory_path() / ("elastic_fuzz_" + std::to_string(getpid()))).string();
  fs::create_directories(work);
  std::vector<Target> targets = make_targets(o.fixtures, (fs::path(work) / "seeds").string());
  for (int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL}) std::signal(sig, on_crash);

  if (!replay_target.empty()) {
    for (const Target& t : targets)
      if (t.name == replay_target) {
        std::snprintf(g_current, sizeof g_current, "%s (replay)", replay_file.c_str());
        bool ok = false;
        const std::string why = run_one(t, replay_file, &ok);
        std::printf("%s: %s\n", replay_file.c_str(), why.empty() ? (ok ? "accepted" : "refused cleanly") : why.c_str());
        fs::remove_all(work);
        return why.empty() ? 0 : 1;
      }
    usage(("no target " + replay_target).c_str());
  }

  std::vector<const Target*> chosen;
  for (const Target& t : targets)
    if (o.only.empty() || std::find(o.only.begin(), o.only.end(), t.name) != o.only.end()) chosen.push_back(&t);
  if (chosen.empty()) usage("--only names no target");
  std::printf("elastic_fuzz: %zu targets, %.0f s, seed %llu, work folder %s\n", chosen.size(), o.seconds,
              static_cast<unsigned long long>(o.seed), work.c_str());
  int failures = 0;
  for (const Target* t : chosen) failures += fuzz_target(*t, o, o.seconds / chosen.size(), work);
  if (failures) {
    std::printf("elastic_fuzz: %d failures; inputs kept in %s\n", failures, work.c_str());
    return 1;
  }
  fs::remove_all(work);
  std::printf("elastic_fuzz: no failures\n");
  return 0;
}
