#pragma once
// NCCL across processes, one per GPU (data-parallel router training, `elastic train-router --gpus N`). The NCCL
// library (libnccl.so.2) is loaded at run time, so builds and single-GPU runs do not depend on it.
#include <memory>
#include <string>

#include "elastic/comm.h"

namespace elastic::cuda {

// Rank `rank` of `size`, on the current CUDA device (the caller selects GPU `rank`). Rendezvous through `id_file`:
// rank 0 writes NCCL's unique id there (atomically), the others wait up to timeout_s for it. Throws
// std::runtime_error naming what failed (library not found, timeout, an NCCL error string).
std::unique_ptr<Communicator> nccl_communicator(int rank, int size, const std::string& id_file, double timeout_s = 120);

}  // namespace elastic::cuda
