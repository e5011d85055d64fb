#pragma once
// One process per GPU for `--gpus N`: the launcher re-runs this same command line N times as child processes, with
// ELASTIC_RANK, ELASTIC_WORLD and ELASTIC_RENDEZVOUS (a fresh file path for the NCCL id) in their environment.
#include <string>

namespace elastic::cli {

struct RankEnv {
  int rank = -1;  // -1: not a launched rank (the launcher itself, or a plain run)
  int world = 1;
  std::string rendezvous;
};
// Reads the launched-rank environment; throws naming the variable when it is malformed.
RankEnv rank_env();

// Starts the N ranks (this executable, this argv), waits for all; when one fails the others are stopped. Returns 0
// when every rank exited 0, else throws naming the first rank that failed and how.
void launch_ranks(int world);

}  // namespace elastic::cli
