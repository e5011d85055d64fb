// elastic route static: the DuoAttention-style baseline routing from probe scores.
#include <algorithm>
#include <cstdio>
#include <memory>

#include "cli_common.h"
#include "elastic/probe.h"

namespace elastic::cli {

void add_route_command(CLI::App& app, Commands& cmds) {
  struct Opts { std::string scores, out = "routing.json", mode = "ssa"; double sparsity = 0.7; SparseSettings sparse; };
  auto o = std::make_shared<Opts>();
  auto* rt = app.add_subcommand("route", "Build routing files");
  rt->require_subcommand(1);
  auto* sub = rt->add_subcommand("static", "DuoAttention-style baseline: keep the top-scoring heads full");
  sub->add_option("--scores", o->scores, "heads.json from elastic probe")->required();
  sub->add_option("--sparsity", o->sparsity, "Target Omega_MSR in [0, 1]")->check(in_range(0, 1));
  sub->add_option("--sparse-mode", o->mode, "Mode of the sparse heads")->check(CLI::IsMember({"ssa", "xattn"}));
  add_sparse_options(sub, o->sparse);
  sub->add_option("-o,--output", o->out, "Routing JSON");
  cmds.push_back({sub, [o] {
    HeadScores hs = load_head_scores(o->scores);
    RoutingTable r = static_routing(hs, o->sparsity, parse_head_mode(o->mode));
    o->sparse.xattn.block = o->sparse.block;
    validate_sparse(o->sparse, "route static");
    r.sparse = o->sparse;
    save_routing(r, o->out);
    std::fprintf(stderr, "wrote %s: %d of %d KV heads full, Omega_MSR %.3f\n", o->out.c_str(),
                 static_cast<int>(std::count(r.mode.begin(), r.mode.end(), HeadMode::Full)),
                 static_cast<int>(r.mode.size()), r.msr());
  }});
}

}  // namespace elastic::cli
