// Process launcher for data-parallel ranks: fork + execv of /proc/self/exe with the original argv
// (/proc/self/cmdline), one child per rank, each in its own environment.
#include "rank_launcher.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <vector>

namespace elastic::cli {
namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (!*v || *end || x < 0 || x > 1024) throw std::runtime_error(std::string(name) + "='" + v + "' is not a rank number");
  return static_cast<int>(x);
}

std::vector<std::string> own_argv() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(f)), {});
  std::vector<std::string> out;
  for (size_t i = 0; i < all.size();) {
    const size_t z = all.find('\0', i);
    out.push_back(all.substr(i, z - i));
    if (z == std::string::npos) break;
    i = z + 1;
  }
  if (out.empty()) throw std::runtime_error("--gpus: cannot read this process's command line");
  return out;
}

}  // namespace

RankEnv rank_env() {
  RankEnv e;
  e.rank = env_int("ELASTIC_RANK", -1);
  e.world = env_int("ELASTIC_WORLD", 1);
  if (const char* r = std::getenv("ELASTIC_RENDEZVOUS")) e.rendezvous = r;
  if (e.rank >= 0 && (e.rank >= e.world || e.rendezvous.empty()))
    throw std::runtime_error("ELASTIC_RANK " + std::to_string(e.rank) + " needs ELASTIC_WORLD > rank and ELASTIC_RENDEZVOUS");
  return e;
}

void launch_ranks(int world) {
  const std::vector<std::string> args = own_argv();
  char tmpl[] = "/tmp/elastic-ranks-XXXXXX";
  if (!mkdtemp(tmpl)) throw std::runtime_error("--gpus: cannot make a rendezvous folder in /tmp");
  const std::string dir = tmpl, rendezvous = dir + "/nccl_id";
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("--gpus: fork failed for rank " + std::to_string(r));
    if (pid == 0) {
      setenv("ELASTIC_RANK", std::to_string(r).c_str(), 1);
      setenv("ELASTIC_WORLD", std::to_string(world).c_str(), 1);
      setenv("ELASTIC_RENDEZVOUS", rendezvous.c_str(), 1);
      std::vector<char*> av;
      for (const std::string& a : args) av.push_back(const_cast<char*>(a.c_str()));
      av.push_back(nullptr);
      execv("/proc/self/exe", av.data());
      std::perror("--gpus: execv");
      _exit(127);
    }
    pids.push_back(pid);
  }
  std::string failure;
  for (size_t left = pids.size(); left > 0; --left) {
    int status = 0;
    const pid_t done = wait(&status);
    if (done < 0) break;
    int rank = 0;
    while (rank < world && pids[rank] != done) ++rank;
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && failure.empty()) {
      failure = "rank " + std::to_string(rank) +
                (WIFEXITED(status) ? " exited with " + std::to_string(WEXITSTATUS(status))
                                   : " was killed by signal " + std::to_string(WTERMSIG(status)));
      for (pid_t p : pids)  // a rank gone: the others would wait for it forever in their collectives
        if (p != done) kill(p, SIGTERM);
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (!failure.empty()) throw std::runtime_error("--gpus " + std::to_string(world) + ": " + failure);
}

}  // namespace elastic::cli
