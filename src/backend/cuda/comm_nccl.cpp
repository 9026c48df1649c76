// NCCL communicator: one ncclComm_t per rank; the all-reduce is queued on the rank's backend
// stream, so it orders with the model's kernels without host synchronisation and is
// recorded into a decode-step graph like any kernel. NCCL's ring/tree all-reduce gives every
// rank the same result (each element is reduced once and then broadcast), which keeps the
// replicated residual stream identical on every rank.
#include "backend/cuda/comm_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace qwen36 {

namespace {

void nccl_check(ncclResult_t r, const char* what, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess) return;
  const char* last = ncclGetLastError(comm);
  fail("NCCL {}: {}{}{}", what, ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
}

// NCCL reads its environment once, at its first call: set the defaults before that.
void nccl_environment() {
  const char* v = std::getenv("NCCL_NVLS_ENABLE");
  if (!v) {
    setenv("NCCL_NVLS_ENABLE", "0", 0);
  } else if (std::strcmp(v, "0") != 0) {
    spdlog::warn("NCCL_NVLS_ENABLE={} (NVLink multicast on); the H200 machines this was tested on need 0", v);
  }
}

class NcclComm final : public Comm {
 public:
  NcclComm(const ncclUniqueId& id, int rank, int size) : rank_(rank), size_(size) {
    ncclComm_t c = nullptr;
    nccl_check(ncclCommInitRank(&c, size, id, rank), "ncclCommInitRank");
    comm_.store(c);
  }
  ~NcclComm() override {
    if (ncclComm_t c = comm_.exchange(nullptr)) ncclCommDestroy(c);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(Backend& b, Tensor& x) override {
    ncclComm_t c = comm_.load();
    QWEN36_CHECK(c != nullptr, "tensor parallel: the NCCL communicator was aborted (another rank failed)");
    QWEN36_CHECK(x.dtype == DType::F32, "all_reduce_sum: {} is not f32", x.shape_str());
    auto stream = static_cast<cudaStream_t>(b.native_stream());
    QWEN36_CHECK(stream != nullptr, "all_reduce_sum: the {} backend has no CUDA stream", b.name());
    nccl_check(ncclAllReduce(x.data, x.data, size_t(x.numel()), ncclFloat32, ncclSum, c, stream), "ncclAllReduce", c);
  }

  // Ends every operation of this rank in flight (its peers see the failure in theirs).
  void abort() override {
    if (ncclComm_t c = comm_.exchange(nullptr)) ncclCommAbort(c);
  }

 private:
  std::atomic<ncclComm_t> comm_{nullptr};
  int rank_, size_;
};

}  // namespace

std::string nccl_unique_id() {
  nccl_environment();
  ncclUniqueId id;
  nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  return std::string(id.internal, sizeof(id.internal));
}

std::unique_ptr<Comm> make_nccl_comm(const std::string& unique_id, int rank, int size) {
  nccl_environment();
  ncclUniqueId id;
  QWEN36_CHECK(unique_id.size() == sizeof(id.internal), "NCCL unique id of {} bytes, expected {}", unique_id.size(),
               sizeof(id.internal));
  QWEN36_CHECK(size >= 1 && rank >= 0 && rank < size, "NCCL rank {} of {}", rank, size);
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  return std::make_unique<NcclComm>(id, rank, size);
}

}  // namespace qwen36
