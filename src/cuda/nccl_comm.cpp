// Communicator over NCCL, the library opened with dlopen (only the types come from nccl.h at build time). Host data
// is staged through one device buffer per communicator; the all-reduce runs on its own stream.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "cuda/device_buffer.h"
#include "elastic/cuda.h"
#include "elastic/nccl_comm.h"

namespace elastic::cuda {
namespace {

struct NcclApi {
  void* lib = nullptr;
  ncclResult_t (*get_unique_id)(ncclUniqueId*) = nullptr;
  ncclResult_t (*comm_init_rank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*comm_destroy)(ncclComm_t) = nullptr;
  const char* (*error_string)(ncclResult_t) = nullptr;
};

const NcclApi& nccl() {
  static NcclApi api = [] {
    NcclApi a;
    for (const char* name : {"libnccl.so.2", "libnccl.so"})
      if ((a.lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    if (!a.lib)
      throw std::runtime_error(std::string("NCCL: cannot load libnccl.so.2 (install NCCL or add its folder to "
                                           "LD_LIBRARY_PATH): ") + dlerror());
    auto sym = [&](const char* s) {
      void* p = dlsym(a.lib, s);
      if (!p) throw std::runtime_error(std::string("NCCL: symbol ") + s + " missing from libnccl");
      return p;
    };
    a.get_unique_id = reinterpret_cast<decltype(a.get_unique_id)>(sym("ncclGetUniqueId"));
    a.comm_init_rank = reinterpret_cast<decltype(a.comm_init_rank)>(sym("ncclCommInitRank"));
    a.all_reduce = reinterpret_cast<decltype(a.all_reduce)>(sym("ncclAllReduce"));
    a.comm_destroy = reinterpret_cast<decltype(a.comm_destroy)>(sym("ncclCommDestroy"));
    a.error_string = reinterpret_cast<decltype(a.error_string)>(sym("ncclGetErrorString"));
    return a;
  }();
  return api;
}

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string("NCCL: ") + what + ": " + nccl().error_string(r));
}

class NcclComm : public Communicator {
 public:
  NcclComm(int rank, int size, const std::string& id_file, double timeout_s) : rank_(rank), size_(size) {
    if (size <= 0 || rank < 0 || rank >= size)
      throw std::invalid_argument("NCCL: rank " + std::to_string(rank) + " of " + std::to_string(size));
    const NcclApi& api = nccl();
    ncclUniqueId id;
    if (rank == 0) {
      check(api.get_unique_id(&id), "ncclGetUniqueId");
      const std::string tmp = id_file + ".tmp";
      {
        std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
        f.write(id.internal, sizeof id.internal);
        if (!f) throw std::runtime_error("NCCL: cannot write the rendezvous file " + tmp);
      }
      if (std::rename(tmp.c_str(), id_file.c_str()) != 0)
        throw std::runtime_error("NCCL: cannot publish the rendezvous file " + id_file);
    } else {
      const auto t0 = std::chrono::steady_clock::now();
      for (;;) {
        std::ifstream f(id_file, std::ios::binary);
        if (f && f.read(id.internal, sizeof id.internal)) break;
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s)
          throw std::runtime_error("NCCL: rank " + std::to_string(rank) + " waited " + std::to_string(timeout_s) +
                                   " s for rank 0's id in " + id_file);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    check(api.comm_init_rank(&comm_, size, id, rank), "ncclCommInitRank");
    ELASTIC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~NcclComm() override {
    if (comm_) nccl().comm_destroy(comm_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }

  void all_reduce_sum(float* data, size_t n) override {
    if (n == 0) return;
    if (buf_.bytes < n * 4) buf_.alloc(n * 4);
    ELASTIC_CUDA_CHECK(cudaMemcpyAsync(buf_.ptr, data, n * 4, cudaMemcpyHostToDevice, stream_));
    // NCCL's ring sums in a fixed order for a fixed communicator, so every rank gets the same bits.
    check(nccl().all_reduce(buf_.ptr, buf_.ptr, n, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
    ELASTIC_CUDA_CHECK(cudaMemcpyAsync(data, buf_.ptr, n * 4, cudaMemcpyDeviceToHost, stream_));
    ELASTIC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  int rank_, size_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  DeviceBuffer buf_;
};

}  // namespace

std::unique_ptr<Communicator> nccl_communicator(int rank, int size, const std::string& id_file, double timeout_s) {
  return std::make_unique<NcclComm>(rank, size, id_file, timeout_s);
}

}  // namespace elastic::cuda
