// Ranks as threads of one process: a shared buffer per collective, summed in rank order behind a generation-counted
// barrier, so a result never depends on thread timing.
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "elastic/comm.h"

namespace elastic {
namespace {

struct Group {
  int size = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<const float*> in;  // [size] each rank's input for the current collective
  std::vector<float> sum;
  size_t n = 0;
  int arrived = 0, left = 0;
  long generation = 0;
};

class ThreadComm : public Communicator {
 public:
  ThreadComm(std::shared_ptr<Group> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->size; }
  std::string name() const override { return "threads"; }

  void all_reduce_sum(float* data, size_t n) override {
    Group& g = *g_;
    std::unique_lock<std::mutex> lk(g.mu);
    // Wait until the previous collective has been read by every rank.
    g.cv.wait(lk, [&] { return g.left == 0; });
    if (g.arrived == 0) g.n = n;
    else if (g.n != n) throw std::invalid_argument("all_reduce_sum: ranks passed different sizes");
    g.in[rank_] = data;
    const long gen = g.generation;
    if (++g.arrived == g.size) {
      g.sum.assign(n, 0.f);
      for (int r = 0; r < g.size; ++r)  // rank order: the same result on every run
        for (size_t i = 0; i < n; ++i) g.sum[i] += g.in[r][i];
      g.arrived = 0;
      g.left = g.size;
      ++g.generation;
      g.cv.notify_all();
    } else {
      g.cv.wait(lk, [&] { return g.generation != gen; });
    }
    std::copy(g.sum.begin(), g.sum.begin() + n, data);
    if (--g.left == 0) g.cv.notify_all();
  }

 private:
  std::shared_ptr<Group> g_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_thread_group(int size) {
  if (size <= 0) throw std::invalid_argument("thread group: size must be positive");
  auto g = std::make_shared<Group>();
  g->size = size;
  g->in.assign(size, nullptr);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<ThreadComm>(g, r));
  return out;
}

}  // namespace elastic
