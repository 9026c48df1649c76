// Gated DeltaNet on the GPU: causal depthwise conv + SiLU with carried state, the gates, the
// gated delta rule, their read-only forms (speculative verify) and the fused decode step.
// CPU twins: backend/cpu/cpu_deltanet.cpp, cpu_deltanet_readonly.cpp; Backend::deltanet_decode.
//
// The delta rule has two forms. Runs of at least kAutoChunkedMin tokens (Auto) or of any
// length (Chunked) take the chunked WY/UT form of cuda_delta_chunked.cu (head dims 64/64 and
// 128/128, when the device has the shared memory); every other run (decode, short runs,
// Recurrent mode, other head dims) runs token by token here: one block per (run, value
// head); thread j owns column j of the state S[dk, dv] in registers, so each token's update
// needs no reduction across threads
// (S ← e^g S; u_j = Σ_i S_ij k_i; δ_j = β(v_j − u_j); S_ij += k_i δ_j; o_j = Σ_i S_ij q_i).
// Both kernels take the whole run table and skip the other form's runs, so a mixed batch
// needs no per-form upload. q̂, k̂ are L2-normalised by a separate parallel kernel first.
// The read-only forms run the same per-channel conv and recurrent kernels without their
// state write-back.
//
// Fused decode (one token per run): a decode step moves ~3 MB of recurrent state per layer
// (27B) and does little arithmetic, so what costs is launches and too few blocks. Two
// kernels: (1) per token, conv + SiLU of every channel in place, q̂/k̂ L2-normalised by key
// head; (2) per (token, value head, 32-column slice of the state): gates, the state slice in
// registers (16-byte loads; a thread owns 4 columns × dk/16 rows, u = Sᵀk̂ and o = Sᵀq̂ reduced
// across the block), the update, and the gated RMSNorm of the head, which spans the slices:
// the last of a head's blocks to finish (counter per head) normalises all dv columns. (2) is
// launched programmatically dependent: it loads its state slice while (1) finishes.
#include <algorithm>
#include <climits>
#include <cmath>
#include <initializer_list>

#include "backend/cuda/cuda_ops.cuh"
#include "backend/cuda/cuda_state_ref.cuh"

namespace qwen36::cuda {

// cuda_delta_chunked.cu
bool delta_rule_chunked_supported(int64_t dk, int64_t dv);
void delta_rule_chunked(Ctx& c, const float* qn, const float* kn, const float* v, const float* g, const float* beta,
                        StateRef state, float* out, std::span<const SeqRun> runs, const SeqRun* dev_runs,
                        int min_count, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv);

namespace {

constexpr int kMaxConvK = 8;
// Auto mode: the chunked form from this run length on. One chunk of work costs about as much
// as a few dozen serial recurrent steps; 64 (one full chunk) is a conservative start, to be
// tuned from the crossover sweep printed by the CudaDeltaNet timing test.
constexpr int kAutoChunkedMin = 64;

// One thread per (run, channel): the run's tokens in order, window in registers. Read-only
// (speculative verify): the state is not written back.
__global__ void conv1d_silu_kernel(float* x, const float* w, float* state, const SeqRun* runs, int64_t C, int K,
                                   bool write_state) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const SeqRun r = runs[blockIdx.y];
  const int S = K - 1;
  float* st = state + (int64_t(r.slot) * C + c) * S;
  float hist[kMaxConvK + 1], wc[kMaxConvK];
#pragma unroll
  for (int i = 0; i < kMaxConvK; ++i) {
    hist[i] = i < S ? st[i] : 0.0f;
    wc[i] = i < K ? w[c * K + i] : 0.0f;
  }
  for (int t = 0; t < r.count; ++t) {
    float* xp = x + int64_t(r.begin + t) * C + c;
    const float xin = *xp;
    float acc = 0;
#pragma unroll
    for (int j = 0; j < kMaxConvK; ++j)
      if (j < K) acc += wc[j] * (j < S ? hist[j] : xin);
#pragma unroll
    for (int j = 0; j < kMaxConvK; ++j)
      if (j < S) hist[j] = j + 1 < S ? hist[j + 1] : xin;
    *xp = silu_f(acc);
  }
  if (!write_state) return;
#pragma unroll
  for (int i = 0; i < kMaxConvK; ++i)
    if (i < S) st[i] = hist[i];
}

// a, b: rows of G ≥ Hv values (Backend::deltanet_gates), g, beta: rows of Hv.
__global__ void gates_kernel(const float* a, const float* b, const float* a_neg_exp, const float* dt_bias, float* g,
                             float* beta, int64_t Hv, int64_t G, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t h = i % Hv, j = i / Hv * G + h;
    const float x = a[j] + dt_bias[h];
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    g[i] = a_neg_exp[h] * sp;
    beta[i] = sigmoid_f(b[j]);
  }
}

// One warp per (row, key head): q̂ = q / ‖q‖ · scale, k̂ = k / ‖k‖ (‖·‖ with +1e-6 inside).
__global__ void l2norm_qk_kernel(const float* q, const float* k, float* qn, float* kn, int64_t rows, int dk,
                                 float scale) {
  const int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const float* qr = q + r * dk;
  const float* kr = k + r * dk;
  float sq = 0, sk = 0;
  for (int i = lane; i < dk; i += 32) {
    sq += qr[i] * qr[i];
    sk += kr[i] * kr[i];
  }
  sq = warp_sum(sq);
  sk = warp_sum(sk);
  const float iq = 1.0f / sqrtf(sq + 1e-6f), ik = 1.0f / sqrtf(sk + 1e-6f);
  for (int i = lane; i < dk; i += 32) {
    qn[r * dk + i] = (qr[i] * iq * 1.0f) * scale;
    kn[r * dk + i] = kr[i] * ik * 1.0f;
  }
}

// Recurrent gated delta rule. grid (runs, Hv), block = dv rounded up to a warp multiple.
// !write_state: read-only (speculative verify), the state is left as it was.
template <int DK>
__global__ void delta_rule_kernel(const float* __restrict__ qn, const float* __restrict__ kn,
                                  const float* __restrict__ v, const float* __restrict__ g,
                                  const float* __restrict__ beta, StateRef state, const SeqRun* runs,
                                  float* __restrict__ out, int Hk, int Hv, int dv, int min_chunked,
                                  bool write_state) {
  const SeqRun r = runs[blockIdx.x];
  if (r.count >= min_chunked) return;  // the chunked kernels' run
  const int h = blockIdx.y, kh = h / (Hv / Hk), j = threadIdx.x;
  const bool active = j < dv;
  __shared__ float ks[2][DK], qs[2][DK], gb[2][2];
  const int64_t S = (int64_t(r.slot) * Hv + h) * DK * dv;  // the head's state, in elements
  float s[DK];
#pragma unroll
  for (int i = 0; i < DK; ++i) s[i] = active ? state.load(S + int64_t(i) * dv + j) : 0.0f;

  auto stage = [&](int t, int buf) {
    const int64_t row = r.begin + t;
    for (int i = threadIdx.x; i < DK; i += blockDim.x) {
      ks[buf][i] = kn[(row * Hk + kh) * DK + i];
      qs[buf][i] = qn[(row * Hk + kh) * DK + i];
    }
    if (threadIdx.x == 0) {
      gb[buf][0] = expf(g[row * Hv + h]);
      gb[buf][1] = beta[row * Hv + h];
    }
  };
  if (r.count > 0) stage(0, 0);
  __syncthreads();
  for (int t = 0; t < r.count; ++t) {
    const int buf = t & 1;
    if (t + 1 < r.count) stage(t + 1, buf ^ 1);
    const int64_t row = r.begin + t;
    const float vj = active ? v[(row * Hv + h) * dv + j] : 0.0f;
    const float decay = gb[buf][0], bt = gb[buf][1];
    float u = 0;
#pragma unroll
    for (int i = 0; i < DK; ++i) {
      s[i] *= decay;
      u += s[i] * ks[buf][i];
    }
    const float delta = (vj - u) * bt;
    float o = 0;
#pragma unroll
    for (int i = 0; i < DK; ++i) {
      s[i] += ks[buf][i] * delta;
      o += s[i] * qs[buf][i];
    }
    if (active) out[(row * Hv + h) * dv + j] = o;
    if (state.bf16)  // stored after every token, as a decode step stores it (model/state.h)
#pragma unroll
      for (int i = 0; i < DK; ++i) s[i] = state.stored(s[i]);
    __syncthreads();
  }
  if (active && write_state) {
#pragma unroll
    for (int i = 0; i < DK; ++i) state.store(S + int64_t(i) * dv + j, s[i]);
  }
}

// ---- fused decode step ----
constexpr int kDecPrepThreads = 256;  // prep kernel: a key head's q and k channels (2·dk ≤ 256), or 256 v channels
constexpr int kDecThreads = 128;      // state kernel: 8 column groups (4 columns each) × 16 row groups
constexpr int kDecCols = 32;          // state columns per block

// Conv + SiLU of one channel of a one-token run; the channel's window (K−1 inputs) advances.
// The per-channel kernel's arithmetic, in its order.
__device__ __forceinline__ float conv_one(float xin, const float* __restrict__ wc, float* __restrict__ st, int K) {
  const int S = K - 1;
  float hist[kMaxConvK], acc = 0;
#pragma unroll
  for (int j = 0; j < kMaxConvK; ++j) hist[j] = j < S ? st[j] : 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxConvK; ++j)
    if (j < K) acc += wc[j] * (j < S ? hist[j] : xin);
#pragma unroll
  for (int j = 0; j < kMaxConvK; ++j)
    if (j < S) st[j] = j + 1 < S ? hist[j + 1] : xin;
  return silu_f(acc);
}

// grid (T, Hk + ⌈Hv·dv/256⌉). Block (t, y < Hk): key head y's q and k channels, one per
// thread, conv + SiLU, then L2-normalised (q̂ also scaled by 1/√dk) in place; block
// (t, y ≥ Hk): 256 v channels, conv + SiLU in place. Block (t, 0) also zeroes token t's head
// counters for the state kernel. A plain launch: launched programmatically dependent (waiting,
// then letting the state kernel start) it cost the 27B Q4_K_M 2% at batch 16 (tg64 1,252 →
// 1,226 tok/s on the H200; no gain at batch 1).
__global__ void __launch_bounds__(kDecPrepThreads)
    decode_prep_kernel(float* __restrict__ mixed, const float* __restrict__ w, float* __restrict__ conv_state,
                       const SeqRun* __restrict__ runs, int* __restrict__ counters, int C, int K, int Hk, int dk,
                       int Hv, float scale) {
  griddep_trigger();  // the state kernel may start loading its state slices
  const int t = int(blockIdx.x), y = int(blockIdx.y), tid = int(threadIdx.x);
  const SeqRun r = runs[t];
  float* x = mixed + int64_t(r.begin) * C;
  float* st = conv_state + int64_t(r.slot) * C * (K - 1);
  if (y == 0)
    for (int h = tid; h < Hv; h += kDecPrepThreads) counters[t * Hv + h] = 0;
  if (y >= Hk) {
    const int ch = 2 * Hk * dk + (y - Hk) * kDecPrepThreads + tid;
    if (ch < C) x[ch] = conv_one(x[ch], w + int64_t(ch) * K, st + int64_t(ch) * (K - 1), K);
    return;
  }
  __shared__ float part[2][kDecPrepThreads / 32];
  const bool is_q = tid < dk, active = tid < 2 * dk;
  const int ch = is_q ? y * dk + tid : Hk * dk + y * dk + (tid - dk);
  const float val = active ? conv_one(x[ch], w + int64_t(ch) * K, st + int64_t(ch) * (K - 1), K) : 0.0f;
  const float sq = warp_sum(active && is_q ? val * val : 0.0f);
  const float sk = warp_sum(active && !is_q ? val * val : 0.0f);
  if ((tid & 31) == 0) {
    part[0][tid >> 5] = sq;
    part[1][tid >> 5] = sk;
  }
  __syncthreads();
  float tq = 0, tk = 0;
#pragma unroll
  for (int i = 0; i < kDecPrepThreads / 32; ++i) {
    tq += part[0][i];
    tk += part[1][i];
  }
  if (!active) return;
  // as l2norm_qk_kernel: q̂ = q / ‖q‖ · scale, k̂ = k / ‖k‖
  x[ch] = is_q ? (val * (1.0f / sqrtf(tq + 1e-6f))) * scale : val * (1.0f / sqrtf(tk + 1e-6f));
}

struct DecodeArgs {
  const float *mixed, *z, *a, *b;            // mixed after the prep kernel: [q̂ | k̂ | v] per row
  const float *a_neg_exp, *dt_bias, *norm;   // the layer's small weights
  StateRef state;                            // [slots, Hv, dk, dv]
  float* out;                                // [T, Hv, dv]
  const SeqRun* runs;
  int* counters;    // [T, Hv]: slices of the head finished
  float* partials;  // [T, Hv, dv/32]: Σ o² of each slice
  int C, Hk, Hv, dv;
  int gs;  // a's and b's row length (Hv, or a shard's padded gate rows)
  float eps;
};

// Σ over the block's 16 row groups of each thread's 4 column partials (in place: every
// thread gets the sums of its own columns). red: [4 warps][32 columns] of shared memory.
__device__ __forceinline__ void sum_row_groups(float (&x)[4], float (*red)[kDecCols]) {
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5, cg = lane & 7;
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

// grid (T, Hv, dv/32), 128 threads. Thread (cg = tid % 8, rg = tid / 8) owns columns
// col0 + 4cg .. +3 of rows rg + 16i (i < DK/16) of the head's state: a warp's 16-byte loads
// cover 4 rows × 128 contiguous bytes.
template <int DK>
__global__ void __launch_bounds__(kDecThreads) decode_state_kernel(DecodeArgs p) {
  static_assert(kDecThreads == 128 && DK % 16 == 0, "16 row groups of 8 threads");
  constexpr int R = DK / 16;
  const int t = int(blockIdx.x), h = int(blockIdx.y), slice = int(blockIdx.z), ns = int(gridDim.z);
  const int tid = int(threadIdx.x), cg = tid & 7, rg = tid >> 3;
  const int dv = p.dv, col = slice * kDecCols + 4 * cg;
  const SeqRun r = p.runs[t];
  const int64_t hrow = int64_t(r.begin) * p.Hv + h;  // (token, head) row of z, out
  // Before the prep kernel's results: the state slice, the gates (a, b come from before it).
  const int64_t S = (int64_t(r.slot) * p.Hv + h) * DK * dv + col;  // in elements
  float4 s[R];
#pragma unroll
  for (int i = 0; i < R; ++i) s[i] = p.state.load4(S + int64_t(rg + 16 * i) * dv);
  const int64_t grow = int64_t(r.begin) * p.gs + h;  // (token, head) of a, b
  const float ga = p.a[grow] + p.dt_bias[h];
  const float decay = expf(p.a_neg_exp[h] * (ga > 20.0f ? ga : log1pf(expf(ga))));  // e^g, g as deltanet_gates
  const float bt = sigmoid_f(p.b[grow]);
  griddep_trigger();
  griddep_wait();

  __shared__ float qs[DK], ks[DK], red[2][kDecThreads / 32][kDecCols];
  __shared__ int last;
  const float* xr = p.mixed + int64_t(r.begin) * p.C;
  const int kh = h / (p.Hv / p.Hk);
  for (int i = tid; i < DK; i += kDecThreads) {
    qs[i] = xr[kh * DK + i];
    ks[i] = xr[(p.Hk + kh) * DK + i];
  }
  const float4 v4 = *reinterpret_cast<const float4*>(xr + 2 * p.Hk * DK + h * dv + col);
  __syncthreads();
  float u[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // u = Sᵀk̂ after the decay
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const float k = ks[rg + 16 * i];
    s[i].x *= decay, s[i].y *= decay, s[i].z *= decay, s[i].w *= decay;
    u[0] += s[i].x * k, u[1] += s[i].y * k, u[2] += s[i].z * k, u[3] += s[i].w * k;
  }
  sum_row_groups(u, red[0]);
  const float d0 = (v4.x - u[0]) * bt, d1 = (v4.y - u[1]) * bt, d2 = (v4.z - u[2]) * bt, d3 = (v4.w - u[3]) * bt;
  float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // o = Sᵀq̂ after the update
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const float k = ks[rg + 16 * i], q = qs[rg + 16 * i];
    s[i].x += k * d0, s[i].y += k * d1, s[i].z += k * d2, s[i].w += k * d3;
    o[0] += s[i].x * q, o[1] += s[i].y * q, o[2] += s[i].z * q, o[3] += s[i].w * q;
    p.state.store4(S + int64_t(rg + 16 * i) * dv, s[i]);
  }
  sum_row_groups(o, red[1]);

  // The gated RMSNorm spans the head's dv/32 slices: each writes its raw o and Σo²; the last
  // to finish normalises the whole head (an acquire-release count; the prep kernel zeroed the counter).
  const int64_t hs = int64_t(t) * p.Hv + h;  // counter and partials of this (token, head)
  if (tid < 32) {
    float ss = o[0] * o[0] + o[1] * o[1] + o[2] * o[2] + o[3] * o[3];
    ss += __shfl_xor_sync(0xffffffffu, ss, 1);  // over the 8 column groups
    ss += __shfl_xor_sync(0xffffffffu, ss, 2);
    ss += __shfl_xor_sync(0xffffffffu, ss, 4);
    if (tid < 8) *reinterpret_cast<float4*>(p.out + hrow * dv + col) = make_float4(o[0], o[1], o[2], o[3]);
    if (tid == 0) p.partials[hs * ns + slice] = ss;
  }
  __syncthreads();  // the block's stores come before thread 0's release
  if (tid == 0) last = atomic_add_acq_rel(p.counters + hs, 1) == ns - 1;
  __syncthreads();  // and thread 0's acquire before the block's reads of the other slices
  if (!last) return;
  float ss = 0;
  for (int i = 0; i < ns; ++i) ss += __ldcg(p.partials + hs * ns + i);
  const float inv = 1.0f / sqrtf(ss / float(dv) + p.eps);
  float* orow = p.out + hrow * dv;
  const float* zr = p.z + hrow * dv;
  for (int j = tid; j < dv; j += kDecThreads) orow[j] = p.norm[j] * (__ldcg(orow + j) * inv) * silu_f(zr[j]);
}

void check_conv(const Tensor& x, const Tensor& w, const Tensor& conv_state, std::span<const SeqRun> runs) {
  const int64_t C = x.cols(), K = w.cols(), S = K - 1;
  QWEN36_CHECK(w.rows() == C && w.dtype == DType::F32, "conv1d: weight {} for {} channels", w.shape_str(), C);
  QWEN36_CHECK(conv_state.ndim == 3 && conv_state.dim(1) == C && conv_state.dim(2) == S,
               "conv1d: state {} for {} channels, kernel {}", conv_state.shape_str(), C, K);
  QWEN36_CHECK(K >= 1 && K <= kMaxConvK, "conv1d: kernel size {} (CUDA supports 1..{})", K, kMaxConvK);
  for (const SeqRun& r : runs)
    QWEN36_CHECK(r.slot >= 0 && r.slot < conv_state.dim(0), "conv1d: slot {} out of range", r.slot);
}

void launch_conv(Ctx& c, Tensor& x, const Tensor& w, float* state, std::span<const SeqRun> runs, bool write_state) {
  Temp<SeqRun> tmp(c, 0);
  const SeqRun* dr = dev_runs(c, runs, tmp);
  if (!dr) return;  // recording could not upload the runs: marked failed, nothing runs
  const int64_t C = x.cols();
  const dim3 grid(unsigned(blocks_for(C, 128)), unsigned(runs.size()));
  conv1d_silu_kernel<<<grid, 128, 0, c.stream>>>(x.as<float>(), w.as<const float>(), state, dr, C, int(w.cols()),
                                                 write_state);
  CUDA_LAUNCH_CHECK();
}

void check_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& state,
                      std::span<const SeqRun> runs) {
  QWEN36_CHECK(q.ndim == 3 && k.ndim == 3 && v.ndim == 3 && state.ndim == 4, "gated_delta_rule: bad ranks");
  const int64_t Hk = q.dim(1), dk = q.dim(2), Hv = v.dim(1), dv = v.dim(2);
  QWEN36_CHECK(Hv % Hk == 0 && state.dim(1) == Hv && state.dim(2) == dk && state.dim(3) == dv,
               "gated_delta_rule: q {} v {} state {}", q.shape_str(), v.shape_str(), state.shape_str());
  QWEN36_CHECK(dv <= 1024, "gated_delta_rule: value head dim {} > 1024", dv);
  for (const SeqRun& r : runs)
    QWEN36_CHECK(r.slot >= 0 && r.slot < state.dim(0), "gated_delta_rule: slot {} out of range", r.slot);
}

// q̂ = q / ‖q‖ · 1/√dk, k̂ = k / ‖k‖ into qn, kn ([T, Hk, dk] each)
void l2norm_qk(Ctx& c, const Tensor& q, const Tensor& k, float* qn, float* kn) {
  const int64_t dk = q.dim(2), rows = q.dim(0) * q.dim(1);
  l2norm_qk_kernel<<<unsigned(blocks_for(rows * 32, 256)), 256, 0, c.stream>>>(
      q.as<const float>(), k.as<const float>(), qn, kn, rows, int(dk), 1.0f / std::sqrt(float(dk)));
  CUDA_LAUNCH_CHECK();
}

// The recurrent kernel over the runs shorter than min_chunked.
void launch_recurrent(Ctx& c, const float* qn, const float* kn, const Tensor& v, const Tensor& g, const Tensor& beta,
                      StateRef state, const SeqRun* dr, size_t nruns, Tensor& out, int64_t Hk, int64_t dk,
                      int min_chunked, bool write_state) {
  const int64_t Hv = v.dim(1), dv = v.dim(2);
  const dim3 grid{unsigned(nruns), unsigned(Hv)};
  const int threads = int((dv + 31) / 32 * 32);
  auto launch = [&](auto kernel) {
    kernel<<<grid, threads, 0, c.stream>>>(qn, kn, v.as<const float>(), g.as<const float>(), beta.as<const float>(),
                                           state, dr, out.as<float>(), int(Hk), int(Hv), int(dv), min_chunked,
                                           write_state);
  };
  switch (dk) {
    case 16: launch(delta_rule_kernel<16>); break;
    case 32: launch(delta_rule_kernel<32>); break;
    case 64: launch(delta_rule_kernel<64>); break;
    case 128: launch(delta_rule_kernel<128>); break;
    default: fail("gated_delta_rule: key head dim {} is not supported by the CUDA backend (16, 32, 64, 128)", dk);
  }
  CUDA_LAUNCH_CHECK();
}

}  // namespace

StateRef state_ref(const Tensor& state) {
  QWEN36_CHECK(state.dtype == DType::F32 || state.dtype == DType::BF16, "DeltaNet: a {} recurrent state (f32 or bf16)",
               dtype_name(state.dtype));
  return StateRef{state.data, state.dtype == DType::BF16};
}

void causal_conv1d_silu(Ctx& c, Tensor& x, const Tensor& w, Tensor& conv_state, std::span<const SeqRun> runs) {
  check_conv(x, w, conv_state, runs);
  if (runs.empty() || x.cols() == 0) return;
  if (conv1d_silu_prefill(c, x, w, conv_state, runs)) return;  // runs of many tokens: cuda_conv1d.cu
  launch_conv(c, x, w, conv_state.as<float>(), runs, true);
}

void causal_conv1d_silu_readonly(Ctx& c, Tensor& x, const Tensor& w, const Tensor& conv_state,
                                 std::span<const SeqRun> runs) {
  check_conv(x, w, conv_state, runs);
  if (runs.empty() || x.cols() == 0) return;
  // The per-channel kernel for every run length: the prefill kernel sums in the same order.
  launch_conv(c, x, w, const_cast<float*>(conv_state.as<const float>()), runs, false);
}

void deltanet_gates(Ctx& c, const Tensor& a, const Tensor& b, const Tensor& a_neg_exp, const Tensor& dt_bias,
                    Tensor& g, Tensor& beta) {
  const int64_t Hv = a_neg_exp.numel(), T = g.numel() / Hv, G = T ? a.numel() / T : Hv;  // G: a's and b's rows
  QWEN36_CHECK(g.numel() == T * Hv && beta.numel() == T * Hv && G >= Hv && a.numel() == T * G && b.numel() == T * G,
               "deltanet_gates: shapes a {} b {} g {} for {} heads", a.shape_str(), b.shape_str(), g.shape_str(), Hv);
  const int64_t n = T * Hv;
  if (!n) return;
  gates_kernel<<<int(std::min<int64_t>(blocks_for(n, 256), 65535)), 256, 0, c.stream>>>(
      a.as<const float>(), b.as<const float>(), a_neg_exp.as<const float>(), dt_bias.as<const float>(), g.as<float>(),
      beta.as<float>(), Hv, G, n);
  CUDA_LAUNCH_CHECK();
}

void gated_delta_rule(Ctx& c, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      Tensor& state, std::span<const SeqRun> runs, Tensor& out, DeltaRuleMode mode) {
  check_delta_rule(q, k, v, state, runs);
  const int64_t T = q.dim(0), Hk = q.dim(1), dk = q.dim(2), Hv = v.dim(1), dv = v.dim(2);
  if (runs.empty() || T == 0) return;
  // Runs with count ≥ min_chunked take the chunked form. The device is asked about the
  // chunked kernels only when a run wants them (never in a recorded decode step).
  const int want = mode == DeltaRuleMode::Chunked ? 1 : mode == DeltaRuleMode::Auto ? kAutoChunkedMin : INT_MAX;
  const bool wanted = std::any_of(runs.begin(), runs.end(), [&](const SeqRun& r) { return r.count >= want; });
  const int min_chunked = wanted && delta_rule_chunked_supported(dk, dv) ? want : INT_MAX;
  bool any_chunked = false, any_recurrent = false;
  for (const SeqRun& r : runs) {
    any_chunked |= r.count > 0 && r.count >= min_chunked;
    any_recurrent |= r.count > 0 && r.count < min_chunked;
  }
  Temp<float> qn(c, size_t(T * Hk * dk)), kn(c, size_t(T * Hk * dk));
  l2norm_qk(c, q, k, qn.get(), kn.get());
  Temp<SeqRun> tmp(c, 0);
  const SeqRun* dr = dev_runs(c, runs, tmp);
  if (!dr) return;  // recording could not upload the runs: marked failed, nothing runs
  if (any_chunked)
    delta_rule_chunked(c, qn.get(), kn.get(), v.as<const float>(), g.as<const float>(), beta.as<const float>(),
                       state_ref(state), out.as<float>(), runs, dr, min_chunked, Hk, Hv, dk, dv);
  if (any_recurrent)
    launch_recurrent(c, qn.get(), kn.get(), v, g, beta, state_ref(state), dr, runs.size(), out, Hk, dk, min_chunked,
                     true);
}

void gated_delta_rule_readonly(Ctx& c, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                               const Tensor& beta, const Tensor& state, std::span<const SeqRun> runs, Tensor& out) {
  check_delta_rule(q, k, v, state, runs);
  const int64_t T = q.dim(0), Hk = q.dim(1), dk = q.dim(2);
  if (runs.empty() || T == 0) return;
  Temp<float> qn(c, size_t(T * Hk * dk)), kn(c, size_t(T * Hk * dk));
  l2norm_qk(c, q, k, qn.get(), kn.get());
  Temp<SeqRun> tmp(c, 0);
  const SeqRun* dr = dev_runs(c, runs, tmp);
  if (!dr) return;
  // token by token whatever the run length, as the CPU twin (Recurrent), the state not written
  launch_recurrent(c, qn.get(), kn.get(), v, g, beta, state_ref(state), dr, runs.size(), out, Hk, dk, INT_MAX, false);
}

bool deltanet_decode(Ctx& c, Tensor& mixed, const Tensor& z, const Tensor& a, const Tensor& b,
                     const DeltaNetWeights& w, float eps, Tensor& conv_state, Tensor& ssm_state,
                     std::span<const SeqRun> runs, Tensor& out) {
  if (out.ndim != 3 || ssm_state.ndim != 4 || conv_state.ndim != 3) return false;
  const int64_t T = mixed.rows(), C = mixed.cols(), K = w.conv1d.cols();
  const int64_t Hv = out.dim(1), dv = out.dim(2), dk = ssm_state.dim(2), Hk = (C - Hv * dv) / (2 * dk);
  const bool dk_ok = dk == 16 || dk == 32 || dk == 64 || dk == 128;  // 2·dk ≤ the prep kernel's 256 threads
  if (!dk_ok || dv % kDecCols != 0 || dv / kDecCols > 64 || K < 1 || K > kMaxConvK || Hk <= 0 || Hv % Hk != 0 ||
      2 * Hk * dk + Hv * dv != C || T == 0 || T > 65535 || int64_t(runs.size()) != T)
    return false;
  const std::initializer_list<const Tensor*> f32s{&mixed,    &z,           &a,          &b,     &out, &conv_state,
                                                  &w.conv1d, &w.a_neg_exp, &w.dt_bias, &w.norm};
  for (const Tensor* t : f32s)
    if (t->dtype != DType::F32) return false;
  if (ssm_state.dtype != DType::F32 && ssm_state.dtype != DType::BF16) return false;
  const int64_t G = a.numel() / T;  // a's and b's row length: Hv or more (Backend::deltanet_decode)
  QWEN36_CHECK(z.numel() == T * Hv * dv && G >= Hv && a.numel() == T * G && b.numel() == T * G && out.dim(0) == T,
               "deltanet_decode: z {} a {} b {} out {} for {} tokens", z.shape_str(), a.shape_str(), b.shape_str(),
               out.shape_str(), T);
  QWEN36_CHECK(ssm_state.dim(1) == Hv && ssm_state.dim(3) == dv && conv_state.dim(1) == C && conv_state.dim(2) == K - 1,
               "deltanet_decode: states {} {} for {} channels, {} heads of {}", conv_state.shape_str(),
               ssm_state.shape_str(), C, Hv, dv);
  QWEN36_CHECK(w.conv1d.rows() == C && w.a_neg_exp.numel() == Hv && w.dt_bias.numel() == Hv && w.norm.numel() == dv,
               "deltanet_decode: weights conv {} a {} dt {} norm {}", w.conv1d.shape_str(), w.a_neg_exp.shape_str(),
               w.dt_bias.shape_str(), w.norm.shape_str());
  for (const SeqRun& r : runs)
    QWEN36_CHECK(r.count == 1 && r.begin >= 0 && r.begin < T && r.slot >= 0 && r.slot < conv_state.dim(0) &&
                     r.slot < ssm_state.dim(0),
                 "deltanet_decode: run (slot {}, begin {}, {} tokens) in a batch of {}", r.slot, r.begin, r.count, T);
  Temp<SeqRun> tmp(c, 0);
  const SeqRun* dr = dev_runs(c, runs, tmp);
  if (!dr) return true;  // recording could not upload the runs: marked failed, nothing runs
  const int ns = int(dv / kDecCols);
  Temp<float> scratch(c, size_t(T * Hv * (1 + ns)));  // head counters (int), then the slices' Σo²
  int* counters = reinterpret_cast<int*>(scratch.get());
  const dim3 pgrid{unsigned(T), unsigned(Hk + blocks_for(Hv * dv, kDecPrepThreads))};
  decode_prep_kernel<<<pgrid, kDecPrepThreads, 0, c.stream>>>(mixed.as<float>(), w.conv1d.as<const float>(),
                                                               conv_state.as<float>(), dr, counters, int(C), int(K),
                                                               int(Hk), int(dk), int(Hv), 1.0f / std::sqrt(float(dk)));
  CUDA_LAUNCH_CHECK();
  const DecodeArgs p{mixed.as<const float>(), z.as<const float>(), a.as<const float>(), b.as<const float>(),
                     w.a_neg_exp.as<const float>(), w.dt_bias.as<const float>(), w.norm.as<const float>(),
                     state_ref(ssm_state), out.as<float>(), dr, counters, scratch.get() + T * Hv,
                     int(C), int(Hk), int(Hv), int(dv), int(G), eps};
  const dim3 sgrid{unsigned(T), unsigned(Hv), unsigned(ns)};
  switch (dk) {
    case 16: launch_pdl(decode_state_kernel<16>, sgrid, dim3(kDecThreads), 0, c.stream, p); break;
    case 32: launch_pdl(decode_state_kernel<32>, sgrid, dim3(kDecThreads), 0, c.stream, p); break;
    case 64: launch_pdl(decode_state_kernel<64>, sgrid, dim3(kDecThreads), 0, c.stream, p); break;
    default: launch_pdl(decode_state_kernel<128>, sgrid, dim3(kDecThreads), 0, c.stream, p); break;
  }
  CUDA_LAUNCH_CHECK();
  return true;
}

}  // namespace qwen36::cuda
