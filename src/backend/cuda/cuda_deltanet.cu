// Gated DeltaNet on the GPU: causal depthwise conv + SiLU with carried state, the gates, the
// gated delta rule, their read-only forms (speculative verify), the fused decode step and the
// fused chain verify pass. CPU twins: backend/cpu/cpu_deltanet.cpp, cpu_deltanet_readonly.cpp;
// Backend::deltanet_decode; for deltanet_verify, the composition in Model::deltanet_block.
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
//
// Fused chain verify (Backend::deltanet_verify): the same two kernels, each block stepping
// through its run's k + 1 tokens with the conv window and the state slice in registers, not
// written back for a verify run, whose raw inputs, g and β go to the commit's buffers as they
// are read — instead of ~10 launches a layer (saving copies, conv, q/k/v column copies, gates,
// L2 norm, delta rule, gated norm).
// Fused chain commit (Backend::deltanet_commit): the same kernels again, reading each run's
// saved raw inputs, g and β instead of the pass's, advancing the conv window and the state
// through the kept tokens and storing them once; no outputs. The arithmetic is a decode step's
// throughout, so a verify pass and its commit leave the state a decode step would, bit for bit.
#include <algorithm>
#include <climits>
#include <cmath>
#include <type_traits>
#include <vector>

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

__global__ void conv1d_silu_kernel(float* x, const float* w, float* state, const SeqRun* runs, int64_t C, int K,
                                   bool write_state) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const SeqRun r = runs[blockIdx.y];
  float* st = state + (int64_t(r.slot) * C + c) * (K - 1);
  ConvWindow cw(st, w + c * K, K);
  for (int t = 0; t < r.count; ++t) {
    float* xp = x + int64_t(r.begin + t) * C + c;
    *xp = cw.step(*xp);
  }
  if (write_state) cw.store(st);
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

// ---- fused decode step, chain verify pass and commit ----
constexpr int kDecPrepThreads = 256;  // prep kernel: a key head's q and k channels (2·dk ≤ 256), or 256 v channels
constexpr int kDecThreads = 128;      // state kernel: 8 column groups (4 columns each) × 16 row groups
constexpr int kDecCols = 32;          // state columns per block
constexpr int kVerifyMaxRuns = 64;    // a verify pass's runs: bits of FusedArgs::readonly
constexpr int kPrepChunk = 8;         // prep kernel: tokens whose inputs a thread requests at once
constexpr int kFusedMaxTokens = 64;   // a run's tokens in a verify pass or a commit (the state kernel's gates)

// Both kernels take a block's run from blockIdx.x and step through its tokens. Decode: one
// token per run, advancing its state. Verify: runs of k + 1 tokens that only read their state
// (bit i of `readonly`), their raw inputs, g and β saved for the commit, beside plain one-token
// runs. Commit: runs of the kept tokens, from those saved inputs, advancing the state; no
// outputs (mixed is the kernels' scratch).
enum class Fused { Decode, Verify, Commit };

struct FusedArgs {
  float* mixed;                                // [T, C]: raw inputs; after prep, [q̂ | k̂ | v] per row
  const float *z, *a, *b;                      // [T, Hv, dv], [T, gs], [T, gs] (not Commit)
  const float *conv_w, *a_neg_exp, *dt_bias, *norm;  // the layer's small weights
  float* conv_state;                           // [slots, C, K − 1]
  StateRef state;                              // [slots, Hv, dk, dv]
  float* out;                                  // [T, Hv, dv] (not Commit)
  const SeqRun* runs;
  int* counters;    // [T, Hv]: at (a run's first row, head), the head's slices finished (not Commit)
  float* partials;  // [T, Hv, dv/32]: Σ o² of each slice
  // Verify: the read-only runs' inputs, saved; Commit: read. Rows [0, count) of the run's slot.
  float *conv_in, *g_in, *beta_in;  // [slots, n_save, C], [slots, n_save, Hv] ×2
  uint64_t readonly;
  int n_save;
  int C, K, Hk, dk, Hv, dv;
  int gs;  // a's and b's row length (Hv, or a shard's padded gate rows)
  float scale, eps;
};

// grid (runs, Hk + ⌈Hv·dv/256⌉). Block (i, y < Hk): key head y's q and k channels, one per
// thread, conv + SiLU, then L2-normalised (q̂ also scaled by 1/√dk) in place; block
// (i, y ≥ Hk): 256 v channels, conv + SiLU in place; token by token through run i. Block (i, 0)
// also zeroes the run's head counters for the state kernel. A plain launch: launched
// programmatically dependent (waiting, then letting the state kernel start) it cost the 27B
// Q4_K_M 2% at batch 16 (tg64 1,252 → 1,226 tok/s on the H200; no gain at batch 1).
template <Fused M>
__global__ void __launch_bounds__(kDecPrepThreads) fused_prep_kernel(FusedArgs p) {
  griddep_trigger();  // the state kernel may start loading its state slices
  const int i = int(blockIdx.x), y = int(blockIdx.y), tid = int(threadIdx.x);
  const SeqRun r = p.runs[i];
  const bool ro = M == Fused::Verify && (p.readonly >> i & 1);
  const int n = M == Fused::Decode ? 1 : r.count;
  const int C = p.C, K = p.K, Hk = p.Hk, dk = p.dk;
  float* x = p.mixed + int64_t(r.begin) * C;
  float* st = p.conv_state + int64_t(r.slot) * C * (K - 1);
  float* saved = M == Fused::Decode ? nullptr : p.conv_in + int64_t(r.slot) * p.n_save * C;
  // token j's raw input of channel ch (a commit's, saved by its verify pass), saved as read when read-only
  auto input = [&](int j, int ch) {
    const float xin = M == Fused::Commit ? saved[int64_t(j) * C + ch] : x[int64_t(j) * C + ch];
    if (ro) saved[int64_t(j) * C + ch] = xin;
    return xin;
  };
  if (M != Fused::Commit && y == 0)  // the state kernel's head counters of the run (at its first row)
    for (int e = tid; e < p.Hv; e += kDecPrepThreads) p.counters[int64_t(r.begin) * p.Hv + e] = 0;
  // The inputs of up to kPrepChunk tokens are requested together: one memory round trip per
  // chunk, not per token (a verify pass's and a commit's runs step through k + 1 tokens).
  if (y >= Hk) {
    const int ch = 2 * Hk * dk + (y - Hk) * kDecPrepThreads + tid;
    if (ch >= C) return;
    ConvWindow cw(st + int64_t(ch) * (K - 1), p.conv_w + int64_t(ch) * K, K);
    for (int j0 = 0; j0 < n; j0 += kPrepChunk) {
      float xin[kPrepChunk];
#pragma unroll
      for (int u = 0; u < kPrepChunk; ++u)
        if (j0 + u < n) xin[u] = input(j0 + u, ch);
#pragma unroll
      for (int u = 0; u < kPrepChunk; ++u)
        if (j0 + u < n) x[int64_t(j0 + u) * C + ch] = cw.step(xin[u]);
    }
    if (!ro) cw.store(st + int64_t(ch) * (K - 1));
    return;
  }
  __shared__ float part[2][2][kDecPrepThreads / 32];  // [token parity][q, k][warp]
  const bool is_q = tid < dk, active = tid < 2 * dk;
  const int ch = is_q ? y * dk + tid : Hk * dk + y * dk + (tid - dk);
  ConvWindow cw(st + int64_t(active ? ch : 0) * (K - 1), p.conv_w + int64_t(active ? ch : 0) * K, K);
  float xin[kPrepChunk];
  for (int j = 0; j < n; ++j) {
    if (j % kPrepChunk == 0)  // block-uniform
#pragma unroll
      for (int u = 0; u < kPrepChunk; ++u)
        if (active && j + u < n) xin[u] = input(j + u, ch);
    float* xj = x + int64_t(j) * C;
    float xj_in = xin[0];
#pragma unroll
    for (int u = 1; u < kPrepChunk; ++u)
      if (j % kPrepChunk == u) xj_in = xin[u];  // (a register array indexed by constants only)
    const float val = active ? cw.step(xj_in) : 0.0f;
    const float sq = warp_sum(active && is_q ? val * val : 0.0f);
    const float sk = warp_sum(active && !is_q ? val * val : 0.0f);
    float(*pj)[kDecPrepThreads / 32] = part[j & 1];  // written again two tokens on, past a barrier
    if ((tid & 31) == 0) {
      pj[0][tid >> 5] = sq;
      pj[1][tid >> 5] = sk;
    }
    __syncthreads();
    float tq = 0, tk = 0;
#pragma unroll
    for (int w = 0; w < kDecPrepThreads / 32; ++w) {
      tq += pj[0][w];
      tk += pj[1][w];
    }
    // as l2norm_qk_kernel: q̂ = q / ‖q‖ · scale, k̂ = k / ‖k‖
    if (active) xj[ch] = is_q ? (val * (1.0f / sqrtf(tq + 1e-6f))) * p.scale : val * (1.0f / sqrtf(tk + 1e-6f));
  }
  if (active && !ro) cw.store(st + int64_t(ch) * (K - 1));
}

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

// The gates of (token row, head h), as deltanet_gates: g = a_neg_exp · softplus(a + dt_bias), β = σ(b).
__device__ __forceinline__ float2 gates_of(const FusedArgs& p, int64_t row, int h) {
  const int64_t i = row * p.gs + h;
  const float ga = p.a[i] + p.dt_bias[h];
  return make_float2(p.a_neg_exp[h] * (ga > 20.0f ? ga : log1pf(expf(ga))), sigmoid_f(p.b[i]));
}

// grid (runs, Hv, dv/32), 128 threads. Thread (cg = tid % 8, rg = tid / 8) owns columns
// col0 + 4cg .. +3 of rows rg + 16i (i < DK/16) of the head's state: a warp's 16-byte loads
// cover 4 rows × 128 contiguous bytes. The slice stays in registers through the run's tokens.
// A token's chain is its two reductions: its gates are loaded for all tokens before the wait,
// the next token's q̂, k̂, v are requested while this one computes, and the gated RMSNorm of the
// head (which spans the slices) is done once for all the run's tokens, by the head's last block
// to finish (one acquire-release count per block; the prep kernel zeroed the counter).
template <int DK, Fused M>
__global__ void __launch_bounds__(kDecThreads) fused_state_kernel(FusedArgs p) {
  static_assert(kDecThreads == 128 && DK % 16 == 0 && DK <= kDecThreads, "16 row groups of 8 threads");
  constexpr int R = DK / 16;
  constexpr bool kOut = M != Fused::Commit;  // a pass's outputs (a commit has none)
  const int i = int(blockIdx.x), h = int(blockIdx.y), slice = int(blockIdx.z), ns = int(gridDim.z);
  const int tid = int(threadIdx.x), cg = tid & 7, rg = tid >> 3;
  const int dv = p.dv, col = slice * kDecCols + 4 * cg;
  const SeqRun r = p.runs[i];
  const bool ro = M == Fused::Verify && (p.readonly >> i & 1);
  const int n = M == Fused::Decode ? 1 : r.count;
  __shared__ float2 gts[kFusedMaxTokens];  // (g, β) of each token
  __shared__ float qs[2][DK], ks[2][DK], red[2][kDecThreads / 32][kDecCols];
  __shared__ int last;
  // Before the prep kernel's results: the state slice and the gates (a, b or the saved g, β
  // come from before it); a verify run's gates are saved for its commit.
  const int64_t S = (int64_t(r.slot) * p.Hv + h) * DK * dv + col;  // in elements
  float4 s[R];
#pragma unroll
  for (int k = 0; k < R; ++k) s[k] = p.state.load4(S + int64_t(rg + 16 * k) * dv);
  for (int j = tid; j < n; j += kDecThreads) {
    const int64_t si = (int64_t(r.slot) * p.n_save + j) * p.Hv + h;  // (Verify, Commit) token j in g_in, beta_in
    if constexpr (M == Fused::Commit) {
      gts[j] = make_float2(p.g_in[si], p.beta_in[si]);
    } else {
      gts[j] = gates_of(p, int64_t(r.begin) + j, h);
      if (ro && slice == 0) p.g_in[si] = gts[j].x, p.beta_in[si] = gts[j].y;
    }
  }
  griddep_trigger();
  griddep_wait();

  const int kh = h / (p.Hv / p.Hk);
  const int64_t q_off = int64_t(kh) * DK, k_off = int64_t(p.Hk + kh) * DK, v_off = 2 * int64_t(p.Hk) * DK + h * dv + col;
  // token j's q̂, k̂ element (thread tid < DK) and v columns, from the prep kernel's rows
  auto fetch = [&](int j, float& q, float& k, float4& v) {
    const float* xr = p.mixed + (int64_t(r.begin) + j) * p.C;
    if (tid < DK) q = xr[q_off + tid], k = xr[k_off + tid];
    v = *reinterpret_cast<const float4*>(xr + v_off);
  };
  float nq = 0.0f, nk = 0.0f;
  float4 v4;
  fetch(0, nq, nk, v4);
  if (tid < DK) qs[0][tid] = nq, ks[0][tid] = nk;
  for (int j = 0; j < n; ++j) {
    const int64_t row = int64_t(r.begin) + j;
    const float* q_s = qs[j & 1];
    const float* k_s = ks[j & 1];
    __syncthreads();  // token j's q̂, k̂ (and gts) are in; the previous token's reads of the other buffer are done
    const float4 vj = v4;
    if (j + 1 < n) fetch(j + 1, nq, nk, v4);  // in flight while token j computes
    const float decay = expf(gts[j].x), bt = gts[j].y;
    float u[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // u = Sᵀk̂ after the decay
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const float kk = k_s[rg + 16 * k];
      s[k].x *= decay, s[k].y *= decay, s[k].z *= decay, s[k].w *= decay;
      u[0] += s[k].x * kk, u[1] += s[k].y * kk, u[2] += s[k].z * kk, u[3] += s[k].w * kk;
    }
    sum_row_groups(u, red[0]);
    const float d0 = (vj.x - u[0]) * bt, d1 = (vj.y - u[1]) * bt, d2 = (vj.z - u[2]) * bt, d3 = (vj.w - u[3]) * bt;
    float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // o = Sᵀq̂ after the update
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const float kk = k_s[rg + 16 * k], q = q_s[rg + 16 * k];
      s[k].x += kk * d0, s[k].y += kk * d1, s[k].z += kk * d2, s[k].w += kk * d3;
      if constexpr (kOut) o[0] += s[k].x * q, o[1] += s[k].y * q, o[2] += s[k].z * q, o[3] += s[k].w * q;
      if (p.state.bf16 && n > 1) {  // as stored and loaded again by the next decode step (model/state.h)
        s[k].x = p.state.stored(s[k].x), s[k].y = p.state.stored(s[k].y);
        s[k].z = p.state.stored(s[k].z), s[k].w = p.state.stored(s[k].w);
      }
    }
    if constexpr (kOut) {
      sum_row_groups(o, red[1]);
      // this slice's raw o and Σo² of (token, head): normalised below, once the head is whole
      const int64_t hs = row * p.Hv + h;
      if (tid < 32) {
        float ss = o[0] * o[0] + o[1] * o[1] + o[2] * o[2] + o[3] * o[3];
        ss += __shfl_xor_sync(0xffffffffu, ss, 1);  // over the 8 column groups
        ss += __shfl_xor_sync(0xffffffffu, ss, 2);
        ss += __shfl_xor_sync(0xffffffffu, ss, 4);
        if (tid < 8) *reinterpret_cast<float4*>(p.out + hs * dv + col) = make_float4(o[0], o[1], o[2], o[3]);
        if (tid == 0) p.partials[hs * ns + slice] = ss;
      }
    }
    if (j + 1 < n && tid < DK) qs[(j + 1) & 1][tid] = nq, ks[(j + 1) & 1][tid] = nk;
  }
  if (!ro) {
#pragma unroll
    for (int k = 0; k < R; ++k) p.state.store4(S + int64_t(rg + 16 * k) * dv, s[k]);
  }
  if constexpr (!kOut) return;
  // The gated RMSNorm spans the head's dv/32 slices: the last of its blocks to finish (an
  // acquire-release count on the run's first token's counter) normalises all the run's rows.
  __syncthreads();  // the block's stores come before thread 0's release
  if (tid == 0) last = atomic_add_acq_rel(p.counters + int64_t(r.begin) * p.Hv + h, 1) == ns - 1;
  __syncthreads();  // and thread 0's acquire before the block's reads of the other slices
  if (!last) return;
  for (int j = 0; j < n; ++j) {
    const int64_t hs = (int64_t(r.begin) + j) * p.Hv + h;
    float ss = 0;
    for (int e = 0; e < ns; ++e) ss += __ldcg(p.partials + hs * ns + e);
    const float inv = 1.0f / sqrtf(ss / float(dv) + p.eps);
    float* orow = p.out + hs * dv;
    const float* zr = p.z + hs * dv;
    for (int e = tid; e < dv; e += kDecThreads) orow[e] = p.norm[e] * (__ldcg(orow + e) * inv) * silu_f(zr[e]);
  }
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

// One call of the fused kernels: its mode and, beyond deltanet_decode's, the verify runs and
// the saved-input buffers; the pass's tensors (z, a, b, out: null for a commit).
struct FusedCall {
  Fused mode;
  Tensor& mixed;
  const Tensor *z, *a, *b;
  Tensor* out;
  std::span<const SeqRun> runs, verify;
  Tensor *conv_in, *g_in, *beta_in;  // written by a verify pass, read by a commit
};

// Launches a FusedCall; false: shapes, dtypes or runs the kernels do not handle, nothing launched.
static bool launch_fused(Ctx& c, const FusedCall& f, const DeltaNetWeights& w, float eps, Tensor& conv_state,
                         Tensor& ssm_state) {
  static constexpr const char* kOps[] = {"deltanet_decode", "deltanet_verify", "deltanet_commit"};
  const char* op = kOps[int(f.mode)];
  const bool pass = f.mode != Fused::Commit, saves = f.mode != Fused::Decode;
  Tensor& mixed = f.mixed;
  const std::span<const SeqRun> runs = f.runs;
  if (ssm_state.ndim != 4 || conv_state.ndim != 3 || mixed.ndim != 2 || runs.empty() || runs.size() > 65535)
    return false;
  const int64_t T = mixed.rows(), C = mixed.cols(), K = w.conv1d.cols();
  const int64_t Hv = ssm_state.dim(1), dk = ssm_state.dim(2), dv = ssm_state.dim(3), Hk = (C - Hv * dv) / (2 * dk);
  const bool dk_ok = dk == 16 || dk == 32 || dk == 64 || dk == 128;  // 2·dk ≤ the prep kernel's 256 threads
  if (!dk_ok || dv % kDecCols != 0 || dv / kDecCols > 64 || K < 1 || K > kMaxConvK || Hk <= 0 || Hv % Hk != 0 ||
      2 * Hk * dk + Hv * dv != C || T == 0 || (pass && f.out->ndim != 3))
    return false;
  std::vector<const Tensor*> f32s{&mixed, &conv_state, &w.conv1d, &w.a_neg_exp, &w.dt_bias, &w.norm};
  if (pass) f32s.insert(f32s.end(), {f.z, f.a, f.b, f.out});
  if (saves) f32s.insert(f32s.end(), {f.conv_in, f.g_in, f.beta_in});
  for (const Tensor* t : f32s)
    if (t->dtype != DType::F32) return false;
  if (ssm_state.dtype != DType::F32 && ssm_state.dtype != DType::BF16) return false;
  const int64_t G = pass ? f.a->numel() / T : Hv;  // a's and b's row length: Hv or more (Backend::deltanet_decode)
  if (pass)
    QWEN36_CHECK(f.z->numel() == T * Hv * dv && G >= Hv && f.a->numel() == T * G && f.b->numel() == T * G &&
                     f.out->dim(0) == T && f.out->dim(1) == Hv && f.out->dim(2) == dv,
                 "{}: z {} a {} b {} out {} for {} tokens", op, f.z->shape_str(), f.a->shape_str(), f.b->shape_str(),
                 f.out->shape_str(), T);
  QWEN36_CHECK(conv_state.dim(1) == C && conv_state.dim(2) == K - 1, "{}: states {} {} for {} channels, {} heads of {}",
               op, conv_state.shape_str(), ssm_state.shape_str(), C, Hv, dv);
  QWEN36_CHECK(w.conv1d.rows() == C && w.a_neg_exp.numel() == Hv && w.dt_bias.numel() == Hv && w.norm.numel() == dv,
               "{}: weights conv {} a {} dt {} norm {}", op, w.conv1d.shape_str(), w.a_neg_exp.shape_str(),
               w.dt_bias.shape_str(), w.norm.shape_str());
  int64_t n_save = 0;
  if (saves) {
    const Tensor &ci = *f.conv_in, &gi = *f.g_in, &bi = *f.beta_in;
    n_save = ci.ndim == 3 ? ci.dim(1) : 0;
    QWEN36_CHECK(n_save > 0 && ci.dim(2) == C && gi.ndim == 3 && bi.ndim == 3 && gi.dim(1) == n_save &&
                     gi.dim(2) == Hv && bi.dim(1) == n_save && bi.dim(2) == Hv && gi.dim(0) == ci.dim(0) &&
                     bi.dim(0) == ci.dim(0),
                 "{}: saved inputs {} / {} / {} for {} channels, {} heads", op, ci.shape_str(), gi.shape_str(),
                 bi.shape_str(), C, Hv);
  }
  // Which runs only read their state: the verify runs, found in `runs` by their first row.
  uint64_t readonly = 0;
  if (f.mode == Fused::Verify) {
    if (runs.size() > size_t(kVerifyMaxRuns)) return false;
    for (const SeqRun& v : f.verify) {
      const auto it = std::find_if(runs.begin(), runs.end(), [&](const SeqRun& r) { return r.begin == v.begin; });
      QWEN36_CHECK(it != runs.end() && it->slot == v.slot && it->count == v.count,
                   "{}: verify run (slot {}, begin {}, {} tokens) is not one of the batch's runs", op, v.slot, v.begin,
                   v.count);
      readonly |= uint64_t(1) << (it - runs.begin());
    }
  }
  int64_t rows = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const SeqRun& r = runs[i];
    const bool many = f.mode == Fused::Commit || (readonly >> i & 1);  // runs of several tokens allowed
    if ((r.count != 1 && !many) || r.count > kFusedMaxTokens) return false;  // e.g. a prefill's run: not fused
    QWEN36_CHECK(r.count >= 1 && r.begin >= 0 && r.begin + r.count <= T && r.slot >= 0 &&
                     r.slot < conv_state.dim(0) && r.slot < ssm_state.dim(0) &&
                     (!saves || (r.count <= n_save && r.slot < f.conv_in->dim(0))),
                 "{}: run (slot {}, begin {}, {} tokens) in a batch of {}", op, r.slot, r.begin, r.count, T);
    rows += r.count;
  }
  QWEN36_CHECK(rows == T, "{}: runs of {} tokens in a batch of {}", op, rows, T);
  Temp<SeqRun> tmp(c, 0);
  const SeqRun* dr = dev_runs(c, runs, tmp);
  if (!dr) return true;  // recording could not upload the runs: marked failed, nothing runs
  const int ns = int(dv / kDecCols);
  Temp<float> scratch(c, pass ? size_t(T * Hv * (1 + ns)) : 0);  // head counters (int), then the slices' Σo²
  FusedArgs p{};
  p.mixed = mixed.as<float>();
  if (pass) p.z = f.z->as<const float>(), p.a = f.a->as<const float>(), p.b = f.b->as<const float>();
  if (pass) p.out = f.out->as<float>();
  p.conv_w = w.conv1d.as<const float>(), p.a_neg_exp = w.a_neg_exp.as<const float>();
  p.dt_bias = w.dt_bias.as<const float>(), p.norm = w.norm.as<const float>();
  p.conv_state = conv_state.as<float>(), p.state = state_ref(ssm_state), p.runs = dr;
  p.counters = reinterpret_cast<int*>(scratch.get()), p.partials = pass ? scratch.get() + T * Hv : nullptr;
  if (saves) p.conv_in = f.conv_in->as<float>(), p.g_in = f.g_in->as<float>(), p.beta_in = f.beta_in->as<float>();
  p.readonly = readonly, p.n_save = int(n_save);
  p.C = int(C), p.K = int(K), p.Hk = int(Hk), p.dk = int(dk), p.Hv = int(Hv), p.dv = int(dv), p.gs = int(G);
  p.scale = 1.0f / std::sqrt(float(dk)), p.eps = eps;
  const unsigned nr = unsigned(runs.size());
  const dim3 pgrid{nr, unsigned(Hk + blocks_for(Hv * dv, kDecPrepThreads))}, sgrid{nr, unsigned(Hv), unsigned(ns)};
  auto launch = [&](auto mode) {
    constexpr Fused M = decltype(mode)::value;
    fused_prep_kernel<M><<<pgrid, kDecPrepThreads, 0, c.stream>>>(p);
    CUDA_LAUNCH_CHECK();
    switch (dk) {
      case 16: launch_pdl(fused_state_kernel<16, M>, sgrid, dim3(kDecThreads), 0, c.stream, p); break;
      case 32: launch_pdl(fused_state_kernel<32, M>, sgrid, dim3(kDecThreads), 0, c.stream, p); break;
      case 64: launch_pdl(fused_state_kernel<64, M>, sgrid, dim3(kDecThreads), 0, c.stream, p); break;
      default: launch_pdl(fused_state_kernel<128, M>, sgrid, dim3(kDecThreads), 0, c.stream, p); break;
    }
    CUDA_LAUNCH_CHECK();
  };
  switch (f.mode) {
    case Fused::Decode: launch(std::integral_constant<Fused, Fused::Decode>{}); break;
    case Fused::Verify: launch(std::integral_constant<Fused, Fused::Verify>{}); break;
    case Fused::Commit: launch(std::integral_constant<Fused, Fused::Commit>{}); break;
  }
  return true;
}

bool deltanet_decode(Ctx& c, Tensor& mixed, const Tensor& z, const Tensor& a, const Tensor& b,
                     const DeltaNetWeights& w, float eps, Tensor& conv_state, Tensor& ssm_state,
                     std::span<const SeqRun> runs, Tensor& out) {
  if (int64_t(runs.size()) != mixed.rows()) return false;
  const FusedCall f{Fused::Decode, mixed, &z, &a, &b, &out, runs, {}, nullptr, nullptr, nullptr};
  return launch_fused(c, f, w, eps, conv_state, ssm_state);
}

bool deltanet_verify(Ctx& c, Tensor& mixed, const Tensor& z, const Tensor& a, const Tensor& b,
                     const DeltaNetWeights& w, float eps, Tensor& conv_state, Tensor& ssm_state,
                     std::span<const SeqRun> runs, std::span<const SeqRun> verify, Tensor& conv_in, Tensor& g_in,
                     Tensor& beta_in, Tensor& out) {
  const FusedCall f{Fused::Verify, mixed, &z, &a, &b, &out, runs, verify, &conv_in, &g_in, &beta_in};
  return launch_fused(c, f, w, eps, conv_state, ssm_state);
}

bool deltanet_commit(Ctx& c, const DeltaNetWeights& w, Tensor& conv_state, Tensor& ssm_state,
                     std::span<const SeqRun> runs, const Tensor& conv_in, const Tensor& g_in, const Tensor& beta_in,
                     Tensor& mixed) {
  // (a commit's kernels only read the saved inputs)
  const FusedCall f{Fused::Commit, mixed,  nullptr,  nullptr, nullptr, nullptr, runs, {}, const_cast<Tensor*>(&conv_in),
                    const_cast<Tensor*>(&g_in), const_cast<Tensor*>(&beta_in)};
  return launch_fused(c, f, w, 0.0f, conv_state, ssm_state);
}

}  // namespace qwen36::cuda
