#pragma once
// A causal depthwise conv channel's window, shared by the DeltaNet conv kernels
// (cuda_deltanet.cu) and the fused decode / verify / commit kernels (cuda_deltanet_fused.cu),
// so that every one of them convolves with the same float operations in the same order.
// Included by .cu only (file-local definitions).

#include "backend/cuda/cuda_ops.cuh"

namespace qwen36::cuda {
namespace {

constexpr int kMaxConvK = 8;

// A channel's conv window (its last K − 1 inputs) and weights in registers; step() takes the
// next input and returns conv + SiLU — every conv kernel's arithmetic, in one order.
struct ConvWindow {
  float hist[kMaxConvK], wc[kMaxConvK];
  int K;
  __device__ __forceinline__ ConvWindow(const float* __restrict__ st, const float* __restrict__ w, int k) : K(k) {
#pragma unroll
    for (int i = 0; i < kMaxConvK; ++i) {
      hist[i] = i < K - 1 ? st[i] : 0.0f;
      wc[i] = i < K ? w[i] : 0.0f;
    }
  }
  __device__ __forceinline__ float step(float xin) {
    const int S = K - 1;
    float acc = 0;
#pragma unroll
    for (int j = 0; j < kMaxConvK; ++j)
      if (j < K) acc += wc[j] * (j < S ? hist[j] : xin);
#pragma unroll
    for (int j = 0; j < kMaxConvK; ++j)
      if (j < S) hist[j] = j + 1 < S ? hist[j + 1] : xin;
    return silu_f(acc);
  }
  __device__ __forceinline__ void store(float* __restrict__ st) const {
#pragma unroll
    for (int i = 0; i < kMaxConvK; ++i)
      if (i < K - 1) st[i] = hist[i];
  }
};

}  // namespace
}  // namespace qwen36::cuda
