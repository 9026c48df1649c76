// The DeltaNet causal depthwise conv + SiLU for prefill-sized runs. CPU twin:
// causal_conv1d_silu in backend/cpu/cpu_deltanet.cpp; decode (one token per run) keeps the
// per-channel kernel of cuda_deltanet.cu.
//
// The per-channel kernel walks a run's tokens in order, so a 4096-token prefill is 4096
// dependent load/store steps on only C threads (10240 for the 27B: 80 blocks). Here every
// (channel, 64-token chunk) is independent and works in place, or writes the [q | k | v]
// channel groups to their own tensors (causal_conv1d_silu_split: no copies of them after).
// A chunk's first outputs read the K-1 inputs before it, which the previous chunk may
// overwrite, so a first small kernel
// saves those "halos" (K-1 rows per chunk: ~1/20 of the data; the run's first chunk takes the
// slot's conv state) and writes the new state (the run's last K-1 inputs) once it has read
// the old one; the chunk kernel then reads x once and writes it once. (The earlier version
// copied all of x aside first: twice the memory traffic.)
#include <algorithm>
#include <cstdint>
#include <type_traits>

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

// Where channel c's outputs go: group g (the last whose first channel col0[g] ≤ c) of at most
// three, rows ld[g] floats apart. In place: one group, x itself.
struct ConvDst {
  float* ptr[3];
  int64_t col0[3];
  int64_t ld[3];
  int n;
};

// V channels a thread (1, or 4 as one float4 where every group's columns and rows allow); KT the
// window length where it is a compile-time constant (4: every Qwen3.5 / 3.6 checkpoint), 0
// where K is read at run time (up to kConvMaxK): the register arrays then take kConvMaxK.
template <int V, int KT>
__global__ void conv1d_chunk_kernel(const float* x, const float* __restrict__ halo,
                                    const float* __restrict__ w, const SeqRun* runs, int64_t C, int k_run, ConvDst dst) {
  using Vec = std::conditional_t<V == 4, float4, float>;
  constexpr int kMaxK = KT ? KT : kConvMaxK;
  const int K = KT ? KT : k_run;
  const int64_t c = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * V;
  const SeqRun r = runs[blockIdx.y];
  const int z = int(blockIdx.z), t0 = z * kTokensPerThread;
  if (c >= C || t0 >= r.count) return;
  const int S = K - 1;
  float* out = dst.ptr[0] + (c - dst.col0[0]);  // the group's (constant indices: no local copy of dst)
  int64_t ld = dst.ld[0];
#pragma unroll
  for (int i = 1; i < 3; ++i)
    if (i < dst.n && c >= dst.col0[i]) out = dst.ptr[i] + (c - dst.col0[i]), ld = dst.ld[i];
  out += int64_t(r.begin) * ld;
  const float* h = halo + (chunk_base(runs, int(blockIdx.y)) + z) * S * C + c;
  float wc[V][kMaxK], win[V][kMaxK];
#pragma unroll
  for (int e = 0; e < V; ++e)
#pragma unroll
    for (int j = 0; j < kMaxK; ++j) wc[e][j] = j < K ? w[(c + e) * K + j] : 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxK; ++j) {  // the window before token t0
    const Vec hv = j < S ? *reinterpret_cast<const Vec*>(h + j * C) : Vec{};
#pragma unroll
    for (int e = 0; e < V; ++e) win[e][j] = reinterpret_cast<const float*>(&hv)[e];
  }
  const int t1 = min(r.count, t0 + kTokensPerThread);
  const float* xc = x + int64_t(r.begin) * C + c;
  for (int tb = t0; tb < t1; tb += kLoadAhead) {
    Vec xv[kLoadAhead];  // this thread's own inputs: read before it overwrites them (in place)
#pragma unroll
    for (int u = 0; u < kLoadAhead; ++u)
      xv[u] = tb + u < t1 ? *reinterpret_cast<const Vec*>(xc + int64_t(tb + u) * C) : Vec{};
#pragma unroll
    for (int u = 0; u < kLoadAhead; ++u) {
      if (tb + u >= t1) break;
      Vec o;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float xt = reinterpret_cast<const float*>(&xv[u])[e];
        float acc = 0;  // summed in the CPU twin's order
#pragma unroll
        for (int j = 0; j < kMaxK - 1; ++j)
          if (j < S) acc += wc[e][j] * win[e][j];
        acc += wc[e][S] * xt;
#pragma unroll
        for (int j = 0; j < kMaxK - 1; ++j)
          if (j < S) win[e][j] = j + 1 < S ? win[e][j + 1] : xt;
        reinterpret_cast<float*>(&o)[e] = silu_f(acc);
      }
      *reinterpret_cast<Vec*>(out + int64_t(tb + u) * ld) = o;
    }
  }
}

// The halo kernel, then the chunk kernel writing to dst (false: decode-sized runs or a window
// this file does not take; the caller runs the per-channel kernel).
bool conv1d_prefill(Ctx& c, const Tensor& x, const Tensor& w, Tensor& conv_state, std::span<const SeqRun> runs,
                    const ConvDst& dst) {
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
  const unsigned zs = unsigned((longest + kTokensPerThread - 1) / kTokensPerThread);
  const dim3 grid(unsigned(blocks_for(C, 128)), unsigned(runs.size()), zs);
  conv1d_halo_kernel<<<grid, 128, 0, c.stream>>>(x.as<const float>(), halo.get(), conv_state.as<float>(), dr, C,
                                                  int(K));
  CUDA_LAUNCH_CHECK();
  // 4 channels a thread where the layout allows (the 27B's 4096 × 10240 in place: 110 µs against
  // 137 for one a thread).
  bool vec = C % 4 == 0 && reinterpret_cast<uintptr_t>(x.data) % 16 == 0;
  for (int i = 0; i < dst.n; ++i)
    vec = vec && dst.col0[i] % 4 == 0 && dst.ld[i] % 4 == 0 && reinterpret_cast<uintptr_t>(dst.ptr[i]) % 16 == 0;
  const dim3 grid4(unsigned(blocks_for(C / 4, 128)), unsigned(runs.size()), zs);
  auto launch = [&](auto kernel, dim3 g) {
    kernel<<<g, 128, 0, c.stream>>>(x.as<const float>(), halo.get(), w.as<const float>(), dr, C, int(K), dst);
  };
  if (K == 4)
    vec ? launch(conv1d_chunk_kernel<4, 4>, grid4) : launch(conv1d_chunk_kernel<1, 4>, grid);
  else
    vec ? launch(conv1d_chunk_kernel<4, 0>, grid4) : launch(conv1d_chunk_kernel<1, 0>, grid);
  CUDA_LAUNCH_CHECK();
  return true;
}

}  // namespace

bool conv1d_silu_prefill(Ctx& c, Tensor& x, const Tensor& w, Tensor& conv_state, std::span<const SeqRun> runs) {
  const ConvDst in_place{{x.as<float>()}, {0}, {x.cols()}, 1};
  return conv1d_prefill(c, x, w, conv_state, runs, in_place);
}

bool conv1d_silu_prefill_split(Ctx& c, const Tensor& x, const Tensor& w, Tensor& conv_state,
                               std::span<const SeqRun> runs, Tensor& q, Tensor& k, Tensor& v) {
  const int64_t T = x.rows();
  const int64_t nq = q.numel() / std::max<int64_t>(T, 1), nk = k.numel() / std::max<int64_t>(T, 1);
  const ConvDst split{{q.as<float>(), k.as<float>(), v.as<float>()}, {0, nq, nq + nk}, {nq, nk, x.cols() - nq - nk}, 3};
  return conv1d_prefill(c, x, w, conv_state, runs, split);
}

}  // namespace qwen36::cuda
