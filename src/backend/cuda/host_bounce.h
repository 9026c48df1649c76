// Uploads from pageable host memory through page-locked buffers that every core fills.
//
// cudaMemcpyAsync from pageable memory makes the driver copy through its own staging buffer,
// one thread at a time: on the H200 machine's 16-core host that ran at ~6 GB/s, against
// 55 GB/s from page-locked memory. Page-locking the source is not always possible (registering
// a freshly written model file's expert ranges did not finish in 90 s there), so a streamed
// expert upload copies its bytes into a small ring of page-locked chunks with all cores
// (~35 GB/s there) while the DMA engine drains the previous chunk.
#pragma once

#include <cstddef>
#include <vector>

#include <cuda_runtime.h>

namespace qwen36::cuda {

class HostBounce {
 public:
  HostBounce() = default;
  HostBounce(const HostBounce&) = delete;
  HostBounce& operator=(const HostBounce&) = delete;
  ~HostBounce();

  // Queues dst[0, bytes) = src[0, bytes) on `stream` and returns once src has been read (the
  // stream may still be copying out of the ring). False, nothing queued, when the ring cannot
  // be allocated: the caller copies directly. A CUDA error raises qwen36::Error.
  bool upload(const void* src, void* dst, size_t bytes, cudaStream_t stream);

  // Uploads smaller than this go directly: the ring's set-up and cross-thread copy do not pay.
  static constexpr size_t kMinBytes = size_t(1) << 20;

 private:
  struct Slot {
    void* host = nullptr;
    cudaEvent_t done = nullptr;  // the stream has finished copying out of `host`
  };
  bool ready();
  std::vector<Slot> slots_;
  size_t next_ = 0;
  bool failed_ = false;  // allocation refused once: never retried
};

}  // namespace qwen36::cuda
