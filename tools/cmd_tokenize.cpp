// elastic tokenize: print the token ids of a text.
#include <iostream>
#include <memory>

#include "cli_common.h"
#include "elastic/text_file.h"
#include "elastic/tokenizer.h"

namespace elastic::cli {

void add_tokenize_command(CLI::App& app, Commands& cmds) {
  struct Opts { std::string tokenizer, file, text; };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("tokenize", "Print the token ids of a text as a JSON array");
  sub->add_option("--tokenizer", o->tokenizer, "Path to tokenizer.json")->required();
  sub->add_option("--file", o->file, "Read the text from this file");
  sub->add_option("text", o->text, "Text to tokenize");
  cmds.push_back({sub, [o, sub] {
    const bool has_text = sub->count("text") > 0, has_file = !o->file.empty();
    if (has_text == has_file) throw std::runtime_error("tokenize: give exactly one of --file F or TEXT");
    Tokenizer t = Tokenizer::from_file(o->tokenizer);
    std::string text = o->file.empty() ? o->text : read_text_file(o->file, "text to tokenize", kMaxParsedInputBytes);
    std::cout << ids_json(t.encode(text)) << "\n";
  }});
}

}  // namespace elastic::cli
