// Backend::compact_rows on the device: a tree commit's row moves (the accepted path's saved
// DeltaNet inputs and K/V rows to the front of their slots) in one launch per kCompactTensors
// tensors, where the default's row-by-row copies were ~1,700 cudaMemcpyAsync calls a 27B commit
// (bench/RESULTS.md, session 50). CPU twin: the Backend default (backend/tree_ops.cpp).
//
// A thread owns one 4-byte column of one tensor and moves it down the rows in batches of
// kBatch: every source row from[j] ≥ j is still unwritten when it is read (rows written earlier
// are < j), so a batch's loads all go before its stores and are in flight together.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_ops.cuh"
#include "backend/tree_ops.h"

namespace qwen36::cuda {

namespace {

constexpr int kCompactTensors = 32;  // tensors per launch (their table is a kernel parameter)
constexpr int kCompactRows = 64;     // rows a commit moves at most (SpecCommit::path's bits)
constexpr int kBatch = 8;

struct CompactArgs {
  uint32_t* base[kCompactTensors];
  int64_t words[kCompactTensors];  // 4-byte words per row
  int32_t from[kCompactRows];
  int n;
};

__global__ void compact_rows_kernel(const CompactArgs a) {
  uint32_t* const p = a.base[blockIdx.y];
  const int64_t w = a.words[blockIdx.y];
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < w; c += int64_t(gridDim.x) * blockDim.x) {
    for (int j0 = 0; j0 < a.n; j0 += kBatch) {
      uint32_t v[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        if (j0 + b < a.n && a.from[j0 + b] != j0 + b) v[b] = p[a.from[j0 + b] * w + c];
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        if (j0 + b < a.n && a.from[j0 + b] != j0 + b) p[(j0 + b) * w + c] = v[b];
    }
  }
}

}  // namespace

bool compact_rows(Ctx& c, std::span<Tensor> ts, std::span<const int32_t> from) {
  tree_ops::check_compaction(ts, from);
  if (from.size() > size_t(kCompactRows)) return false;
  for (const Tensor& t : ts)
    if ((t.nbytes() / size_t(t.dim(0))) % 4 != 0 || reinterpret_cast<uintptr_t>(t.data) % 4 != 0) return false;
  if (std::all_of(from.begin(), from.end(), [j = 0](int32_t f) mutable { return f == j++; })) return true;
  CompactArgs a{};
  a.n = int(from.size());
  std::copy(from.begin(), from.end(), a.from);
  for (size_t t0 = 0; t0 < ts.size(); t0 += kCompactTensors) {
    const int nt = int(std::min(ts.size() - t0, size_t(kCompactTensors)));
    int64_t widest = 0;
    for (int i = 0; i < nt; ++i) {
      const Tensor& t = ts[t0 + size_t(i)];
      a.base[i] = t.as<uint32_t>();
      a.words[i] = int64_t(t.nbytes() / size_t(t.dim(0))) / 4;
      widest = std::max(widest, a.words[i]);
    }
    const int blocks = int(std::clamp<int64_t>((widest + 255) / 256, 1, 64));
    compact_rows_kernel<<<dim3(unsigned(blocks), unsigned(nt)), 256, 0, c.stream>>>(a);
    CUDA_LAUNCH_CHECK();
  }
  return true;
}

}  // namespace qwen36::cuda
