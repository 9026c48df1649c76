// CUDA Backend::argmax_rows (semantics: backend/backend.h; reference cpu::argmax_rows): each
// row's largest logit's id, the lowest on ties, left in device memory for the next op
// (Backend::embed_ids: a greedy drafting chain, Model::mtp_draft_greedy).
//
// Two launches, both recordable (no host work): a grid of kSplits × R blocks each keeps the
// best (value, id) of its slice of a row, then a warp per row merges the slices in order. One
// row of the 248,320-word vocabulary is 1 MB: one block alone would stream it at a single SM's
// rate (~10 µs); 32 slices take it at a good share of HBM speed, and the merge is a warp's
// shuffle over 32 pairs.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_ops.cuh"

namespace qwen36::cuda {
namespace {

constexpr int kSplits = 32;   // slices per row (one per merge lane)
constexpr int kThreads = 256;

// (v, i) beats (bv, bi): larger, or equal with a lower id; NaN never beats, and a number
// always beats NaN (the initial pair is (NaN, INT32_MAX): an empty slice loses to anything).
__device__ __forceinline__ bool beats(float v, int32_t i, float bv, int32_t bi) {
  if (isnan(v)) return false;
  return isnan(bv) || v > bv || (v == bv && i < bi);
}

__device__ __forceinline__ void warp_best(float& v, int32_t& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (beats(ov, oi, v, i)) v = ov, i = oi;
  }
}

__global__ void argmax_slice_kernel(const float* logits, int64_t V, int64_t slice, float* part_v, int32_t* part_i) {
  const int64_t row = blockIdx.y, b = int64_t(blockIdx.x) * slice, e = min(V, b + slice);
  const float* l = logits + row * V;
  float v = __int_as_float(0x7fffffff);
  int32_t i = INT32_MAX;
  // kU loads in flight a thread before their compares (one at a time, the 1 MB row of a greedy
  // step took ~7 µs at 32 blocks); the order of the compares does not matter: beats is a total
  // order with ties to the lower id.
  constexpr int kU = 8;
  for (int64_t j0 = b + threadIdx.x; j0 < e; j0 += int64_t(kU) * blockDim.x) {
    float x[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t j = j0 + int64_t(u) * blockDim.x;
      x[u] = j < e ? l[j] : __int_as_float(0x7fffffff);  // NaN: beats nothing
    }
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (beats(x[u], int32_t(j0 + int64_t(u) * blockDim.x), v, i)) v = x[u], i = int32_t(j0 + int64_t(u) * blockDim.x);
  }
  warp_best(v, i);
  __shared__ float sv[kThreads / 32];
  __shared__ int32_t si[kThreads / 32];
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) sv[w] = v, si[w] = i;
  __syncthreads();
  if (w != 0) return;
  v = lane < kThreads / 32 ? sv[lane] : __int_as_float(0x7fffffff);
  i = lane < kThreads / 32 ? si[lane] : INT32_MAX;
  warp_best(v, i);
  if (lane == 0) part_v[row * kSplits + blockIdx.x] = v, part_i[row * kSplits + blockIdx.x] = i;
}

__global__ void argmax_merge_kernel(const float* part_v, const int32_t* part_i, int32_t* ids) {
  const int64_t row = blockIdx.x;
  float v = part_v[row * kSplits + threadIdx.x];
  int32_t i = part_i[row * kSplits + threadIdx.x];
  warp_best(v, i);
  if (threadIdx.x == 0) ids[row] = i == INT32_MAX ? 0 : i;  // all NaN: 0, as the reference
}

}  // namespace

void argmax_rows(Ctx& c, const Tensor& logits, Tensor& ids) {
  const int64_t R = logits.rows(), V = logits.cols();
  QWEN36_CHECK(logits.dtype == DType::F32 && ids.dtype == DType::I32 && ids.numel() == R,
               "argmax_rows: logits {} → ids {}", logits.shape_str(), ids.shape_str());
  QWEN36_CHECK(V >= 1 && V <= INT32_MAX, "argmax_rows: {} columns", V);
  if (R == 0) return;
  Temp<float> part_v(c, size_t(R) * kSplits);
  Temp<int32_t> part_i(c, size_t(R) * kSplits);
  const int64_t slice = (V + kSplits - 1) / kSplits;
  argmax_slice_kernel<<<dim3(kSplits, unsigned(R)), kThreads, 0, c.stream>>>(logits.as<float>(), V, slice,
                                                                             part_v.get(), part_i.get());
  CUDA_LAUNCH_CHECK();
  argmax_merge_kernel<<<unsigned(R), kSplits, 0, c.stream>>>(part_v.get(), part_i.get(), ids.as<int32_t>());
  CUDA_LAUNCH_CHECK();
}

}  // namespace qwen36::cuda
