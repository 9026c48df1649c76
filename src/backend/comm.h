#pragma once
// defines: Comm (the collectives tensor parallelism needs), make_host_comms (N ranks that are
//          threads of one process, for the CPU backend and tests)
//
// A tensor-parallel rank holds a shard of every layer; after each row-parallel projection its
// output is a partial sum that all_reduce_sum completes (model/qwen36.cpp, Model::reduce).
// The NCCL implementation for GPUs is backend/cuda/comm_nccl.h.

#include <memory>
#include <vector>

#include "backend/backend.h"

namespace qwen36 {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // x ← Σ over ranks of x. x is f32 in `b`'s memory, the same shape on every rank. Afterwards
  // every rank holds the bit-identical sum (the replicated residual stream, and with it the
  // MoE router's choices, must not drift apart between ranks). A device implementation queues
  // the reduction on b's stream, so that it can be recorded in a decode-step graph.
  virtual void all_reduce_sum(Backend& b, Tensor& x) = 0;
  // Called when this rank fails: collectives blocked on it (and later ones) fail instead of
  // waiting for a rank that will not come. The group cannot be used afterwards.
  virtual void abort() {}
};

// `n` communicators sharing one host buffer, to be used by n threads (one per rank). The sum
// is taken in rank order 0..n-1 by every rank, hence bit-identical everywhere and
// reproducible run to run. Data moves through the host (copy_to_host / copy_from_host), so
// this suits the CPU backend; GPUs use NCCL.
std::vector<std::unique_ptr<Comm>> make_host_comms(int n);

}  // namespace qwen36
