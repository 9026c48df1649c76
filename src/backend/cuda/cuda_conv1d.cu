// The DeltaNet causal depthwise conv + SiLU for prefill-sized runs. CPU twin:
// causal_conv1d_silu in backend/cpu/cpu_deltanet.cpp; decode (one token per run) keeps the
// per-channel kernel of cuda_deltanet.cu.
//
// The per-channel kernel walks a run's tokens in order, so a 4096-token prefill is 4096
// dependent load/store steps on only C threads (10240 for the 27B: 80 blocks). Here every
// (channel, 64-token chunk) is independent and works in place. A chunk's first outputs read
// the K-1 inputs before it, which the previous chunk overwrites, so a first small kernel
// saves those "halos" (K-1 rows per chunk: ~1/20 of the data; the run's first chunk takes the
// slot's conv state) and writes the new state (the run's last K-1 inputs) once it has read
// the old one; the chunk kernel then reads x once and writes it once. (The earlier version
// copied all of x aside first: twice the memory traffic.)
#include <algorithm>

#include "backend/cuda/cuda_ops.cuh"

namespace qwen36::cuda {

namespace {

constexpr int kConvMaxK = 8;
constexpr int kTokensPerThread = 64;  // one chunk
constexpr int kLoadAhead = 8;         // token rows loaded before they are used (independent loads in flight)

// Input p of run r's channel c (p < 0: the state's last inputs, state[S + p]).
__device__ __forceinline__ float conv_input(const float* x, const float* st, const SeqRun& r, int64_t C, int64_t c,
                                            int S, int p) {
  return p >= 0 ? x[int64_t(r.begin + p) * C + c] : st[S + p];
}

// The halo table's first row of run `ri` (its chunks are numbered after the earlier runs').
__device__ __forceinline__ int64_t chunk_base(const SeqRun* runs, int ri) {
  int64_t base = 0;
  for (int i = 0; i < ri; ++i) base += (runs[i].count + kTokensPerThread - 1) / kTokensPerThread;
  return base;
}

// halo[(chunk, j), c] = input 64z − S + j of the chunk's run (j < S); the run's first chunk's
// thread also rewrites the state: ← the run's last S inputs (older state entries where the run
// is shorter than S), read before anything is written.
__global__ void conv1d_halo_kernel(const float* __restrict__ x, float* __restrict__ halo, float* __restrict__ state,
                                   const SeqRun* runs, int64_t C, int K) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const SeqRun r = runs[blockIdx.y];
  const int z = int(blockIdx.z), t0 = z * kTokensPerThread;
  if (c >= C || t0 >= r.count) return;
  const int S = K - 1;
  float* st = state + (int64_t(r.slot) * C + c) * S;
  float* h = halo + (chunk_base(runs, int(blockIdx.y)) + z) * S * C + c;
  float hv[kConvMaxK], next[kConvMaxK];
#pragma unroll
  for (int j = 0; j < kConvMaxK; ++j)
    if (j < S) hv[j] = conv_input(x, st, r, C, c, S, t0 - S + j);
  if (z == 0) {
#pragma unroll
    for (int i = 0; i < kConvMaxK; ++i)
      if (i < S) next[i] = conv_input(x, st, r, C, c, S, r.count - S + i);
#pragma unroll
    for (int i = 0; i < kConvMaxK; ++i)
      if (i < S) st[i] = next[i];
  }
#pragma unroll
  for (int j = 0; j < kConvMaxK; ++j)
    if (j < S) h[j * C] = hv[j];
}

__global__ void conv1d_chunk_kernel(float* __restrict__ x, const float* __restrict__ halo, const float* __restrict__ w,
                                    const SeqRun* runs, int64_t C, int K) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const SeqRun r = runs[blockIdx.y];
  const int z = int(blockIdx.z), t0 = z * kTokensPerThread;
  if (c >= C || t0 >= r.count) return;
  const int S = K - 1;
  const float* h = halo + (chunk_base(runs, int(blockIdx.y)) + z) * S * C + c;
  float wc[kConvMaxK], win[kConvMaxK];
#pragma unroll
  for (int j = 0; j < kConvMaxK; ++j) {
    wc[j] = j < K ? w[c * K + j] : 0.0f;
    win[j] = j < S ? h[j * C] : 0.0f;  // the window before token t0
  }
  const int t1 = min(r.count, t0 + kTokensPerThread);
  float* xc = x + int64_t(r.begin) * C + c;
  for (int tb = t0; tb < t1; tb += kLoadAhead) {
    float xv[kLoadAhead];  // this thread's own inputs: read before it overwrites them
#pragma unroll
    for (int u = 0; u < kLoadAhead; ++u) xv[u] = tb + u < t1 ? xc[int64_t(tb + u) * C] : 0.0f;
#pragma unroll
    for (int u = 0; u < kLoadAhead; ++u) {
      if (tb + u >= t1) break;
      const float xt = xv[u];
      float acc = 0;  // summed in the CPU twin's order
#pragma unroll
      for (int j = 0; j < kConvMaxK - 1; ++j)
        if (j < S) acc += wc[j] * win[j];
      acc += wc[S] * xt;
#pragma unroll
      for (int j = 0; j < kConvMaxK - 1; ++j)
        if (j < S) win[j] = j + 1 < S ? win[j + 1] : xt;
      xc[int64_t(tb + u) * C] = silu_f(acc);
    }
  }
}

}  // namespace

bool conv1d_silu_prefill(Ctx& c, Tensor& x, const Tensor& w, Tensor& conv_state, std::span<const SeqRun> runs) {
  const int64_t C = x.cols(), K = w.cols(), T = x.rows();
  int32_t longest = 0;
  int64_t chunks = 0;
  for (const SeqRun& r : runs) {
    longest = std::max(longest, r.count);
    chunks += (r.count + kTokensPerThread - 1) / kTokensPerThread;
  }
  // decode-sized runs, or no window (K = 1, no state): the per-channel kernel
  if (longest < 8 || K < 2 || K > kConvMaxK || T == 0) return false;
  Temp<float> halo(c, size_t(chunks * (K - 1) * C));
  Temp<SeqRun> tmp(c, 0);
  const SeqRun* dr = dev_runs(c, runs, tmp);
  if (!dr) return true;  // recording could not upload the runs: marked failed, nothing runs
  const unsigned cb = unsigned(blocks_for(C, 128));
  const dim3 grid(cb, unsigned(runs.size()), unsigned((longest + kTokensPerThread - 1) / kTokensPerThread));
  conv1d_halo_kernel<<<grid, 128, 0, c.stream>>>(x.as<const float>(), halo.get(), conv_state.as<float>(), dr, C,
                                                  int(K));
  CUDA_LAUNCH_CHECK();
  conv1d_chunk_kernel<<<grid, 128, 0, c.stream>>>(x.as<float>(), halo.get(), w.as<const float>(), dr, C, int(K));
  CUDA_LAUNCH_CHECK();
  return true;
}

}  // namespace qwen36::cuda
