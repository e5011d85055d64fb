#pragma once
// JSON from files we did not write; errors name the file and say what kind of file it was meant to be.
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "elastic/text_file.h"

namespace elastic {

// nlohmann::json parses, copies, dumps and destroys nested values recursively, so 100,000 nested '[' overflow the
// stack. Real files nest a handful of levels (tokenizer.json about 6); every JSON text we read is checked first.
inline constexpr int kMaxJsonDepth = 128;
// JSON files are parsed into a tree of 10-25x their size (an array of empty arrays: 22x), and a tree that does not
// fit ends the process (std::bad_alloc inside nlohmann's noexcept destructor: a 510 MB file under the former 512 MiB
// cap did). So JSON takes the cap of every input parsed whole into larger structures (kMaxParsedInputBytes, 64 MiB),
// above any tokenizer.json (10-40 MB); every other JSON file we read is kilobytes.
inline constexpr uint64_t kMaxJsonFileBytes = kMaxParsedInputBytes;

// Throws std::runtime_error "<source>: JSON nested deeper than <max_depth> levels (at byte N)". A scan of the
// brackets outside strings; it does not validate anything else (the parser does).
void check_json_depth(std::string_view text, const std::string& source, int max_depth = kMaxJsonDepth);

// check_json_depth, then the parse; a syntax error throws "<source>: malformed JSON: ...".
nlohmann::json parse_json_text(std::string_view text, const std::string& source);

// Throws std::runtime_error "<path>: cannot open <what>", "<path>: is a directory, ...", "<path>: malformed JSON: ..."
// or the depth / size limit errors above.
nlohmann::json read_json_file(const std::string& path, const std::string& what);

// JSON text of a value we built, some of whose strings came from outside as bytes (paths, flag values): bytes that are
// not UTF-8 become U+FFFD instead of the library's type_error 316, which had stopped runs at their end (a bench's
// -o json, a router's save after training). indent -1: one line.
std::string dump_json(const nlohmann::json& j, int indent = -1);

}  // namespace elastic
