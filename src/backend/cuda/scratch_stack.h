#pragma once
// defines: ScratchStack — where the CUDA backend's op temporaries (cuda_ops.cuh's Temp) come
// from. Plain C++ (no CUDA calls: the backend hands it the buffer), so its bookkeeping is
// tested on any machine.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace qwen36::cuda {

// Op temporaries (Temp) up to its capacity come from one device buffer taken when the backend
// starts, handed out as a stack: inside a recorded decode step a stream-ordered allocation is a
// graph node of its own between two kernels, and the programmatic (PDL) edge that lets the
// second start while the first drains cannot cross it. Reuse is safe by stream order: memory
// released by one op is next written by a later kernel on the same stream, after its
// griddep_wait (launch_pdl's rule). Larger requests, and any past the capacity, fall back to
// cudaMallocAsync.
class ScratchStack {
 public:
  static constexpr size_t kBytes = size_t(64) << 20;
  // The buffer's first kCounters ints are arrival counters that start zero (the backend clears
  // them once) and that every kernel counting in them leaves zero (cuda_quant_mma.cu's GEMM):
  // such a kernel needs no clearing launch before it.
  static constexpr int kCounters = 16384;
  // cap ≥ the counters' bytes (the backend sizes it so).
  void init(void* base, size_t cap) {
    base_ = static_cast<uint8_t*>(base), cap_ = cap;
    top_ = kCounters * sizeof(int);
    if (top_ > cap_) base_ = nullptr;  // unusable: every request falls back
  }
  void* base() const { return base_; }
  int* counters() const { return reinterpret_cast<int*>(base_); }
  // Null when the request does not fit (the caller allocates it itself).
  void* take(size_t bytes) {
    const size_t n = (bytes + 255) / 256 * 256;
    if (!base_ || n > cap_ - top_) return nullptr;
    live_.push_back({top_, false});
    top_ += n;
    return base_ + live_.back().offset;
  }
  // Frees p (from take); the stack shrinks past every freed entry at its top, so releases in
  // any order are fine (a Temp destroyed early keeps its bytes until those above it go).
  bool give(void* p) {
    const auto* b = static_cast<uint8_t*>(p);
    if (!base_ || b < base_ || b >= base_ + cap_) return false;
    for (auto it = live_.rbegin(); it != live_.rend(); ++it)
      if (base_ + it->offset == b) {
        it->freed = true;
        break;
      }
    while (!live_.empty() && live_.back().freed) top_ = live_.back().offset, live_.pop_back();
    return true;
  }

 private:
  struct Entry {
    size_t offset;
    bool freed;
  };
  uint8_t* base_ = nullptr;
  size_t cap_ = 0, top_ = 0;
  std::vector<Entry> live_;
};

}  // namespace qwen36::cuda
