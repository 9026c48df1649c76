#pragma once
// defines (file-local to each .cu that includes it: cuda_deltanet_fused.cu's decode, verify and
// commit kernels, cuda_deltanet.cu's tree delta rule): one token through a 32-column slice of a
// head's DeltaNet state held by 128 threads (thread (cg = tid % 8, rg = tid / 8): columns
// 4cg .. 4cg + 3 of the slice, rows rg + 16i), the fused decode kernels' arithmetic in one order.
// Included by .cu only.

#include <type_traits>

#include "backend/cuda/cuda_ops.cuh"
#include "backend/cuda/cuda_state_ref.cuh"

namespace qwen36::cuda {
namespace {

// Calls f(std::integral_constant<int, DK>{}) for a key head dim dk of the DeltaNet kernels'
// instantiations (16, 32, 64, 128); false, nothing called, for another.
template <typename F>
bool with_key_dim(int64_t dk, F&& f) {
  switch (dk) {
    case 16: f(std::integral_constant<int, 16>{}); return true;
    case 32: f(std::integral_constant<int, 32>{}); return true;
    case 64: f(std::integral_constant<int, 64>{}); return true;
    case 128: f(std::integral_constant<int, 128>{}); return true;
    default: return false;
  }
}

constexpr int kDecThreads = 128;  // a slice's threads: 8 column groups (4 columns each) × 16 row groups
constexpr int kDecCols = 32;      // state columns per slice

// Σ over a slice's 16 row groups (its kDecThreads threads) of each thread's 4 column partials
// (in place: every thread gets the sums of its own columns). red: the slice's [4 warps][32
// columns] of shared memory.
__device__ __forceinline__ void sum_row_groups(float (&x)[4], float (*red)[kDecCols]) {
  const int lane = int(threadIdx.x) & 31, warp = (int(threadIdx.x) >> 5) & 3, cg = lane & 7;
#pragma unroll
  for (int c = 0; c < 4; ++c) {  // lanes 8 apart hold the same columns
    x[c] += __shfl_xor_sync(0xffffffffu, x[c], 8);
    x[c] += __shfl_xor_sync(0xffffffffu, x[c], 16);
  }
  if (lane < 8)
#pragma unroll
    for (int c = 0; c < 4; ++c) red[warp][4 * cg + c] = x[c];
  __syncthreads();
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int j = 4 * cg + c;
    x[c] = (red[0][j] + red[1][j]) + (red[2][j] + red[3][j]);
  }
}

// One token through a state slice held as the fused kernels hold it (s[k]: row rg + 16k, the
// thread's 4 columns): S ← e^g S; u = Sᵀk̂; δ = β(v − u); S += k̂ δᵀ; o = Sᵀq̂ (kOut), u and o
// summed over the slice's row groups in red[0], red[1]. kf(i), qf(i): k̂ and q̂ of row i. round:
// the state rounded as a bf16 state stores it (runs of several tokens, as the next decode step
// would load it; model/state.h). Every fused kernel's arithmetic, in one order.
template <int R, bool kOut, typename KF, typename QF>
__device__ __forceinline__ void slice_token(float4 (&s)[R], int rg, KF kf, QF qf, float4 vj, float decay, float bt,
                                            float (*red)[kDecThreads / 32][kDecCols], const StateRef& st, bool round,
                                            float (&o)[4]) {
  float u[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // u = Sᵀk̂ after the decay
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const float kk = kf(rg + 16 * k);
    s[k].x *= decay, s[k].y *= decay, s[k].z *= decay, s[k].w *= decay;
    u[0] += s[k].x * kk, u[1] += s[k].y * kk, u[2] += s[k].z * kk, u[3] += s[k].w * kk;
  }
  sum_row_groups(u, red[0]);
  const float d0 = (vj.x - u[0]) * bt, d1 = (vj.y - u[1]) * bt, d2 = (vj.z - u[2]) * bt, d3 = (vj.w - u[3]) * bt;
  o[0] = o[1] = o[2] = o[3] = 0.0f;  // o = Sᵀq̂ after the update
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const float kk = kf(rg + 16 * k), q = qf(rg + 16 * k);
    s[k].x += kk * d0, s[k].y += kk * d1, s[k].z += kk * d2, s[k].w += kk * d3;
    if constexpr (kOut) o[0] += s[k].x * q, o[1] += s[k].y * q, o[2] += s[k].z * q, o[3] += s[k].w * q;
    if (round) s[k].x = st.stored(s[k].x), s[k].y = st.stored(s[k].y), s[k].z = st.stored(s[k].z), s[k].w = st.stored(s[k].w);
  }
  if constexpr (kOut) sum_row_groups(o, red[1]);
}

}  // namespace
}  // namespace qwen36::cuda
