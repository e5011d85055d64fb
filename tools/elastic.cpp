// The one `elastic` command line. Each subcommand lives in tools/cmd_<name>.cpp; this file only dispatches.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>

#include "cli_common.h"

using namespace elastic::cli;

namespace {

// "route static": the subcommand's names from the top, for error lines.
std::string command_name(const CLI::App* app) {
  std::string name = app->get_name();
  for (const CLI::App* p = app->get_parent(); p && p->get_parent(); p = p->get_parent()) name = p->get_name() + " " + name;
  return name;
}

// What a command printed (ids, tables, JSON) counts as output too: a full disk or closed pipe behind stdout is an
// error, not a silent truncation and exit 0.
void check_stdout() {
  errno = 0;
  std::cout.flush();
  const bool ok = static_cast<bool>(std::cout) && std::fflush(stdout) == 0 && !std::ferror(stdout);
  if (!ok)
    throw std::runtime_error(std::string("cannot write standard output") + (errno ? ": " + std::string(std::strerror(errno)) : ""));
}

}  // namespace

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
  const Command* running = nullptr;
  // Everything a command throws ends here, named after the command, so no library's bare message ("stoll",
  // "vector::_M_range_check") reaches the user without saying what failed.
  try {
    for (const Command& c : cmds)
      if (c.app->parsed()) running = &c, c.run();
    check_stdout();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: elastic %s: %s\n", running ? command_name(running->app).c_str() : "", e.what());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "error: elastic %s: unknown exception\n", running ? command_name(running->app).c_str() : "");
    return 1;
  }
  return 0;
}
