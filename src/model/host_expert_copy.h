// Host-placed routed experts copied into page-locked memory at load (expert offload, issue 11).
//
// The experts of `--n-cpu-moe` layers stay in host memory. Left in the model file's mapping they
// are pageable: a device reads them only through a bounce buffer (the CUDA backend's HostBounce,
// ~45 GB/s once the pages are in; the driver's own path ~6 GB/s on the H200 machine), and
// page-locking the mapping itself stalled there (> 90 s for one 35B-A3B model). Copied into
// anonymous memory and page-locked (18 GiB of 35B-A3B experts in 2-5 s there), they are DMA'd
// at PCIe rate (55 GB/s) for streamed prefill passes and for a decode pass's device share
// (Model::host_moe_experts).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/weights.h"

namespace qwen36 {

class HostExpertCopy {
 public:
  // Copies the routed experts of every layer i with host[i] (all cores) into page-locked memory
  // of `backend` and points their tensors at the copy; a layer's tensors keep their relative
  // layout (runs contiguous in the file stay contiguous). Null, tensors untouched, when the
  // backend refuses to page-lock the memory (with a warning).
  static std::unique_ptr<HostExpertCopy> make(Backend& backend, ModelWeights& w, const std::vector<bool>& host);
  ~HostExpertCopy();  // unpins, then frees
  HostExpertCopy(const HostExpertCopy&) = delete;
  HostExpertCopy& operator=(const HostExpertCopy&) = delete;

  size_t bytes() const;

 private:
  explicit HostExpertCopy(Backend& b) : backend_(b) {}
  struct Block {
    std::byte* p = nullptr;
    size_t bytes = 0;  // mapped (whole pages)
    bool pinned = false;
  };
  Backend& backend_;
  std::vector<Block> blocks_;  // one per host layer
};

}  // namespace qwen36
