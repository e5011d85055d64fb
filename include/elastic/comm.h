#pragma once
// Collective communication for data-parallel router training: every rank holds the same router and multipliers,
// runs its share of each batch, and the ranks sum their gradients (and loss / sparsity sums) before the identical
// optimizer step. Implementations: in-process thread groups (src/dist/thread_comm.cpp: tests, and several ranks in
// one process), and NCCL across processes, one per GPU (src/cuda/nccl_comm.cpp, loaded at run time).
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace elastic {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In-place sum over all ranks of n host floats; every rank gets the same result, in the same rank order.
  virtual void all_reduce_sum(float* data, size_t n) = 0;
  virtual std::string name() const = 0;
};

// `size` ranks inside one process (one thread each): group[r] is rank r's communicator. all_reduce_sum blocks until
// every rank has called it, then sums in rank order (deterministic).
std::vector<std::unique_ptr<Communicator>> make_thread_group(int size);

}  // namespace elastic
