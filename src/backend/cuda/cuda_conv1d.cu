// The DeltaNet causal depthwise conv + SiLU for prefill-sized runs. CPU twin:
// causal_conv1d_silu in backend/cpu/cpu_deltanet.cpp; decode (one token per run) keeps the
// per-channel kernel of cuda_deltanet.cu.
//
// The per-channel kernel walks a run's tokens in order, so a 4096-token prefill is 4096
// dependent load/store steps on only C threads (10240 for the 27B: 80 blocks). Here every
// (channel, 64-token chunk) is independent: the op works in place, so the inputs are first
// copied aside; a token's window reads its K-1 predecessors from that copy or, before the
// run's first token, from the slot's conv state. The state is rewritten afterwards by a
// second kernel (the first still reads the old one).
#include <algorithm>

#include "backend/cuda/cuda_ops.cuh"

namespace qwen36::cuda {

namespace {

constexpr int kConvMaxK = 8;
constexpr int kTokensPerThread = 64;

// Input p of run r's channel c (p < 0: the state's last inputs, state[S + p]).
__device__ __forceinline__ float conv_input(const float* xin, const float* st, const SeqRun& r, int64_t C,
                                            int64_t c, int S, int p) {
  return p >= 0 ? xin[int64_t(r.begin + p) * C + c] : st[S + p];
}

__global__ void conv1d_chunk_kernel(float* __restrict__ x, const float* __restrict__ xin, const float* __restrict__ w,
                                    const float* __restrict__ state, const SeqRun* runs, int64_t C, int K) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const SeqRun r = runs[blockIdx.y];
  const int t0 = blockIdx.z * kTokensPerThread;
  if (c >= C || t0 >= r.count) return;
  const int S = K - 1;
  const float* st = state + (int64_t(r.slot) * C + c) * S;
  float wc[kConvMaxK], win[kConvMaxK];
#pragma unroll
  for (int j = 0; j < kConvMaxK; ++j) {
    wc[j] = j < K ? w[c * K + j] : 0.0f;
    win[j] = j < S ? conv_input(xin, st, r, C, c, S, t0 - S + j) : 0.0f;  // window before token t0
  }
  const int t1 = min(r.count, t0 + kTokensPerThread);
  for (int t = t0; t < t1; ++t) {
    const float xt = xin[int64_t(r.begin + t) * C + c];
    float acc = 0;  // summed in the CPU twin's order
#pragma unroll
    for (int j = 0; j < kConvMaxK - 1; ++j)
      if (j < S) acc += wc[j] * win[j];
    acc += wc[S] * xt;
#pragma unroll
    for (int j = 0; j < kConvMaxK - 1; ++j)
      if (j < S) win[j] = j + 1 < S ? win[j + 1] : xt;
    x[int64_t(r.begin + t) * C + c] = silu_f(acc);
  }
}

// state ← the run's last S inputs (older state entries where the run is shorter than S).
__global__ void conv1d_state_kernel(const float* __restrict__ xin, float* __restrict__ state, const SeqRun* runs,
                                    int64_t C, int K) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const SeqRun r = runs[blockIdx.y];
  const int S = K - 1;
  float* st = state + (int64_t(r.slot) * C + c) * S;
  float next[kConvMaxK];
#pragma unroll
  for (int i = 0; i < kConvMaxK; ++i)
    if (i < S) next[i] = conv_input(xin, st, r, C, c, S, r.count - S + i);
#pragma unroll
  for (int i = 0; i < kConvMaxK; ++i)
    if (i < S) st[i] = next[i];
}

}  // namespace

bool conv1d_silu_prefill(Ctx& c, Tensor& x, const Tensor& w, Tensor& conv_state, std::span<const SeqRun> runs) {
  const int64_t C = x.cols(), K = w.cols(), T = x.rows();
  int32_t longest = 0;
  for (const SeqRun& r : runs) longest = std::max(longest, r.count);
  if (longest < 8 || K < 1 || K > kConvMaxK || T == 0) return false;  // decode-sized: the per-channel kernel
  Temp<float> xin(c, size_t(T * C));
  CUDA_CHECK(cudaMemcpyAsync(xin.get(), x.data, size_t(T * C) * sizeof(float), cudaMemcpyDeviceToDevice, c.stream));
  Temp<SeqRun> tmp(c, 0);
  const SeqRun* dr = dev_runs(c, runs, tmp);
  if (!dr) return true;  // recording could not upload the runs: marked failed, nothing runs
  const unsigned cb = unsigned(blocks_for(C, 128));
  const dim3 grid(cb, unsigned(runs.size()), unsigned((longest + kTokensPerThread - 1) / kTokensPerThread));
  conv1d_chunk_kernel<<<grid, 128, 0, c.stream>>>(x.as<float>(), xin.get(), w.as<const float>(),
                                                   conv_state.as<const float>(), dr, C, int(K));
  CUDA_LAUNCH_CHECK();
  conv1d_state_kernel<<<dim3(cb, unsigned(runs.size())), 128, 0, c.stream>>>(xin.get(), conv_state.as<float>(), dr, C,
                                                                              int(K));
  CUDA_LAUNCH_CHECK();
  return true;
}

}  // namespace qwen36::cuda
