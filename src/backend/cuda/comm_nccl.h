#pragma once
// defines: nccl_unique_id, make_nccl_comm (the NCCL communicator of a tensor-parallel rank)
//
// Host-only header (no CUDA or NCCL headers). Built only when CMake found NCCL
// (QWEN36_HAVE_NCCL). NCCL_NVLS_ENABLE is set to 0 before NCCL first reads its environment
// unless the user set it: the GPU machines this runs on require NVLink multicast off.

#include <memory>
#include <string>

#include "backend/comm.h"

namespace qwen36 {

// A fresh NCCL unique id (NCCL_UNIQUE_ID_BYTES bytes) for one group: made by rank 0 and
// given to every rank (threads of this process, or other processes: docs/multi-gpu.md).
std::string nccl_unique_id();

// Rank `rank` of `size` joining the group `unique_id`; blocks until every rank has joined.
// Call on the rank's thread with its CUDA device current (its backend made). all_reduce_sum
// is ncclAllReduce in place on the backend's stream (capturable in a CUDA graph).
std::unique_ptr<Comm> make_nccl_comm(const std::string& unique_id, int rank, int size);

}  // namespace qwen36
