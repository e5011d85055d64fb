// The one `elastic` command line. Each subcommand lives in tools/cmd_<name>.cpp; this file only dispatches.
#include <cstdio>
#include <exception>

#include "cli_common.h"

using namespace elastic::cli;

int main(int argc, char** argv) {
  CLI::App app{"elastic: long-context LLM inference with Elastic Attention"};
  app.require_subcommand(1);
  Commands cmds;
  add_tokenize_command(app, cmds);
  add_logits_command(app, cmds);
  add_generate_command(app, cmds);
  add_probe_command(app, cmds);
  add_route_command(app, cmds);
  add_train_router_command(app, cmds);
  add_eval_command(app, cmds);
  add_serve_command(app, cmds);
  add_bench_command(app, cmds);
  add_plot_command(app, cmds);
  CLI11_PARSE(app, argc, argv);
  try {
    for (const Command& c : cmds)
      if (c.app->parsed()) c.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
