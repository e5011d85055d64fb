#pragma once
// One fuzz target per parser of files we did not write: its seed inputs (the fixture files in tests/fixtures and
// generated ones) and how to run the parser on one input file. Shared by the CI mutation fuzzer (fuzz_main.cpp) and
// the optional libFuzzer entry (libfuzzer_main.cpp).
#include <functional>
#include <string>
#include <vector>

namespace elastic::fuzz {

struct Target {
  std::string name;  // "npy", "safetensors", ...
  bool text = false;  // a text format: the mutator also replaces numbers and inserts syntax and nesting
  // Every error must name the input file: a message without it is a bare library string ("stoll",
  // "vector::_M_default_append", "[json.exception...]") that escaped unwrapped.
  bool errors_name_file = true;
  std::vector<std::string> seeds;
  // Parses the file at `path` (and uses what it read, so lazily checked data is reached); throws on bad input.
  std::function<void(const std::string& path)> run;
};

// All targets; `fixtures` is tests/fixtures, `scratch` a folder for the targets' own helper files.
std::vector<Target> make_targets(const std::string& fixtures, const std::string& scratch);

}  // namespace elastic::fuzz
