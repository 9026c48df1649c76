#include "backend/cuda/host_bounce.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include <omp.h>

#include "core/error.h"

namespace qwen36::cuda {

namespace {
// 4 chunks of 16 MiB: one filling, up to three queued, 64 MiB page-locked in all. A chunk takes
// ~0.3 ms to copy out at PCIe Gen5 rates, long enough that the per-chunk event and the
// cores' fork-join are small against it (measured there: 20-22 GB/s with a thread per 2 MiB).
constexpr size_t kChunk = size_t(16) << 20;
constexpr int kSlots = 4;
// Each core copies pieces of at least this size (smaller ones cost more in hand-off than copy).
constexpr size_t kPiece = size_t(1) << 20;

void check(cudaError_t e) { QWEN36_CHECK(e == cudaSuccess, "host upload: {}", cudaGetErrorString(e)); }
}  // namespace

HostBounce::~HostBounce() {
  for (Slot& s : slots_) {
    if (s.done) {
      cudaEventSynchronize(s.done);
      cudaEventDestroy(s.done);
    }
    if (s.host) cudaFreeHost(s.host);
  }
  cudaGetLastError();
}

bool HostBounce::ready() {
  if (!slots_.empty()) return true;
  if (failed_) return false;
  std::vector<Slot> s(kSlots);
  bool ok = true;
  for (Slot& x : s) {
    ok = ok && cudaHostAlloc(&x.host, kChunk, cudaHostAllocDefault) == cudaSuccess;
    ok = ok && cudaEventCreateWithFlags(&x.done, cudaEventDisableTiming) == cudaSuccess;
  }
  if (!ok) {
    cudaGetLastError();
    for (Slot& x : s) {
      if (x.host) cudaFreeHost(x.host);
      if (x.done) cudaEventDestroy(x.done);
    }
    std::fprintf(stderr, "qwen36: no page-locked staging for host uploads (%d × %zu MiB refused); copying from "
                         "pageable memory (slower)\n", kSlots, kChunk >> 20);
    failed_ = true;
    return false;
  }
  slots_ = std::move(s);
  return true;
}

bool HostBounce::upload(const void* src, void* dst, size_t bytes, cudaStream_t stream) {
  if (!ready()) return false;
  const auto* s = static_cast<const std::byte*>(src);
  auto* d = static_cast<std::byte*>(dst);
  for (size_t off = 0; off < bytes; off += kChunk) {
    const size_t n = std::min(kChunk, bytes - off);
    Slot& slot = slots_[next_];
    next_ = (next_ + 1) % slots_.size();
    check(cudaEventSynchronize(slot.done));  // its last chunk has left
    auto* h = static_cast<std::byte*>(slot.host);
    const int64_t pieces = int64_t((n + kPiece - 1) / kPiece);
#pragma omp parallel for schedule(static) num_threads(int(std::min<int64_t>(pieces, omp_get_max_threads())))
    for (int64_t p = 0; p < pieces; ++p) {
      const size_t o = size_t(p) * kPiece;
      std::memcpy(h + o, s + off + o, std::min(kPiece, n - o));
    }
    check(cudaMemcpyAsync(d + off, h, n, cudaMemcpyHostToDevice, stream));
    check(cudaEventRecord(slot.done, stream));
  }
  return true;
}

}  // namespace qwen36::cuda
