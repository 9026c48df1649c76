// Gated DeltaNet on the GPU: causal depthwise conv + SiLU with carried state, the gates, the
// gated delta rule and their read-only forms (speculative verify); the fused decode step, chain
// verify pass and commit are in cuda_deltanet_fused.cu. CPU twins: backend/cpu/cpu_deltanet.cpp,
// cpu_deltanet_readonly.cpp.
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
#include <algorithm>
#include <climits>
#include <cmath>

#include "backend/cuda/cuda_conv_window.cuh"
#include "backend/cuda/cuda_deltanet_slices.cuh"
#include "backend/cuda/cuda_ops.cuh"
#include "backend/cuda/cuda_state_ref.cuh"
#include "backend/tree_ops.h"

namespace qwen36::cuda {

// cuda_delta_chunked.cu
bool delta_rule_chunked_supported(int64_t dk, int64_t dv);
void delta_rule_chunked(Ctx& c, const float* qn, const float* kn, const float* v, const float* g, const float* beta,
                        StateRef state, float* out, std::span<const SeqRun> runs, const SeqRun* dev_runs,
                        int min_count, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv);

namespace {

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
  float* st = state + (int64_t(r.slot) * C + c) * (K - 1);
  ConvWindow cw(st, w + c * K, K);
  for (int t = 0; t < r.count; ++t) {
    float* xp = x + int64_t(r.begin + t) * C + c;
    *xp = cw.step(*xp);
  }
  if (write_state) cw.store(st);
}

// A tree's read-only conv: one thread per (channel, token i of the run): the window starts from
// the slot's state and steps through i's root path (its inputs from xin, the run's rows as they
// were), as the chain conv over that path would, and the last output is i's.
__global__ void conv1d_silu_tree_kernel(const float* __restrict__ xin, float* __restrict__ x, const float* w,
                                        const float* state, const int32_t* __restrict__ parent, SeqRun r, int64_t C,
                                        int K) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const int i = int(blockIdx.y);
  int path[kMaxTreeTokens], n = 0;
  for (int j = i; j >= 0 && n < kMaxTreeTokens; j = parent[j]) path[n++] = j;
  ConvWindow cw(state + (int64_t(r.slot) * C + c) * (K - 1), w + c * K, K);
  float o = 0.0f;
  for (int m = n - 1; m >= 0; --m) o = cw.step(xin[int64_t(path[m]) * C + c]);
  x[int64_t(r.begin + i) * C + c] = o;
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
// !write_state: read-only (speculative verify), the state is left as it was. rowmap (else
// null): token t of run r is batch row rowmap[r.begin + t] (a tree's leaf paths, whose shared
// prefixes several blocks compute alike and store alike).
template <int DK>
__global__ void delta_rule_kernel(const float* __restrict__ qn, const float* __restrict__ kn,
                                  const float* __restrict__ v, const float* __restrict__ g,
                                  const float* __restrict__ beta, StateRef state, const SeqRun* runs,
                                  float* __restrict__ out, int Hk, int Hv, int dv, int min_chunked,
                                  bool write_state, const int32_t* __restrict__ rowmap) {
  const SeqRun r = runs[blockIdx.x];
  auto row_of = [&](int t) -> int64_t { return rowmap ? rowmap[r.begin + t] : r.begin + t; };
  if (r.count == 0 || r.count >= min_chunked) return;  // nothing (a tree's padding), or the chunked kernels' run
  const int h = blockIdx.y, kh = h / (Hv / Hk), j = threadIdx.x;
  const bool active = j < dv;
  __shared__ float ks[2][DK], qs[2][DK], gb[2][2];
  const int64_t S = (int64_t(r.slot) * Hv + h) * DK * dv;  // the head's state, in elements
  float s[DK];
#pragma unroll
  for (int i = 0; i < DK; ++i) s[i] = active ? state.load(S + int64_t(i) * dv + j) : 0.0f;

  auto stage = [&](int t, int buf) {
    const int64_t row = row_of(t);
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
    const int64_t row = row_of(t);
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


// A tree's leaf paths through the fused decode kernels' state arithmetic (slice_token, on
// q̂, k̂ from l2norm_qk and the gates' g, β): grid (paths, Hv, dv/32) of kDecThreads threads;
// path r's token t is batch row rowmap[r.begin + t]. A block loads its 32-column slice of the
// head's state (only read: a verify), steps through its path and writes each row's output; a row
// on several paths is computed alike and stored alike. An empty run (a table's padding) returns.
// 32 registers of state a thread instead of the recurrent kernel's 128 (255 with spills there:
// two blocks a SM, two waves for a tree of ~10 leaves).
template <int DK>
__global__ void __launch_bounds__(kDecThreads) tree_slices_kernel(const float* __restrict__ qn,
                                                                  const float* __restrict__ kn,
                                                                  const float* __restrict__ v, const float* __restrict__ g,
                                                                  const float* __restrict__ beta, StateRef state,
                                                                  const SeqRun* paths, const int32_t* __restrict__ rowmap,
                                                                  float* __restrict__ out, int Hk, int Hv, int dv) {
  static_assert(DK % 16 == 0 && DK <= kDecThreads, "16 row groups of 8 threads");
  constexpr int R = DK / 16;
  const SeqRun r = paths[blockIdx.x];
  if (r.count == 0) return;
  const int h = int(blockIdx.y), tid = int(threadIdx.x), cg = tid & 7, rg = tid >> 3;
  const int col = int(blockIdx.z) * kDecCols + 4 * cg, kh = h / (Hv / Hk);
  __shared__ float qs[2][DK], ks[2][DK], red[2][kDecThreads / 32][kDecCols];
  const int64_t S = (int64_t(r.slot) * Hv + h) * DK * dv + col;  // in elements
  float4 s[R];
#pragma unroll
  for (int k = 0; k < R; ++k) s[k] = state.load4(S + int64_t(rg + 16 * k) * dv);
  auto fetch = [&](int t, float& q, float& k, float4& v4) {  // token t's q̂, k̂ element and v columns
    const int64_t row = rowmap[r.begin + t];
    if (tid < DK) q = qn[(row * Hk + kh) * DK + tid], k = kn[(row * Hk + kh) * DK + tid];
    v4 = *reinterpret_cast<const float4*>(v + (row * Hv + h) * dv + col);
  };
  float nq = 0.0f, nk = 0.0f;
  float4 v4;
  fetch(0, nq, nk, v4);
  if (tid < DK) qs[0][tid] = nq, ks[0][tid] = nk;
  for (int t = 0; t < r.count; ++t) {
    const int64_t row = rowmap[r.begin + t];
    const float* q_s = qs[t & 1];
    const float* k_s = ks[t & 1];
    __syncthreads();  // token t's q̂, k̂ are in; the previous token's reads of the other buffer are done
    const float4 vj = v4;
    if (t + 1 < r.count) fetch(t + 1, nq, nk, v4);  // in flight while token t computes
    float o[4];
    slice_token<R, true>(
        s, rg, [&](int e) { return k_s[e]; }, [&](int e) { return q_s[e]; }, vj, expf(g[row * Hv + h]),
        beta[row * Hv + h], red, state, state.bf16, o);
    if (tid < 8) *reinterpret_cast<float4*>(out + (row * Hv + h) * dv + col) = make_float4(o[0], o[1], o[2], o[3]);
    if (t + 1 < r.count && tid < DK) qs[(t + 1) & 1][tid] = nq, ks[(t + 1) & 1][tid] = nk;
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
                      int min_chunked, bool write_state, const int32_t* rowmap = nullptr) {
  const int64_t Hv = v.dim(1), dv = v.dim(2);
  const dim3 grid{unsigned(nruns), unsigned(Hv)};
  const int threads = int((dv + 31) / 32 * 32);
  auto launch = [&](auto kernel) {
    kernel<<<grid, threads, 0, c.stream>>>(qn, kn, v.as<const float>(), g.as<const float>(), beta.as<const float>(),
                                           state, dr, out.as<float>(), int(Hk), int(Hv), int(dv), min_chunked,
                                           write_state, rowmap);
  };
  if (!with_key_dim(dk, [&](auto d) { launch(delta_rule_kernel<decltype(d)::value>); }))
    fail("gated_delta_rule: key head dim {} is not supported by the CUDA backend (16, 32, 64, 128)", dk);
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

bool causal_conv1d_silu_split(Ctx& c, const Tensor& x, const Tensor& w, Tensor& conv_state,
                              std::span<const SeqRun> runs, Tensor& q, Tensor& k, Tensor& v) {
  check_conv(x, w, conv_state, runs);
  const int64_t T = x.rows(), nq = T ? q.numel() / T : 0, nk = T ? k.numel() / T : 0, nv = T ? v.numel() / T : 0;
  QWEN36_CHECK(q.numel() == T * nq && k.numel() == T * nk && v.numel() == T * nv && nq + nk + nv == x.cols(),
               "causal_conv1d_silu_split: q {} k {} v {} do not split x {}", q.shape_str(), k.shape_str(), v.shape_str(),
               x.shape_str());
  return conv1d_silu_prefill_split(c, x, w, conv_state, runs, q, k, v);
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

// Backend::causal_conv1d_silu_tree_readonly and gated_delta_rule_tree_readonly in one launch
// each (the composition of backend/tree_ops.h gathers every leaf's root path, runs the chain op
// over them and scatters: ~10 launches and as many uploads a layer). The conv is bitwise the
// composition (the same window steps over the same root paths); the delta rule steps the same
// root paths through the fused decode kernels' slices (tree_slices_kernel), whose sums run in
// another order than the recurrent kernel's (within 1e-5 of it). The parents and leaf paths
// come from set_batch_trees' table (TreeTable), so a recording holds the pass for any tree of
// the size; a tree without one uploads them (not while recording). False (nothing done) for a
// tree of more than 64 tokens, or one without a table while recording; a malformed tree is
// refused as the composition refuses it.
TreeTake tree_kernels_take(const Ctx& c, const SeqRun& run, std::span<const int32_t> parent, int64_t rows) {
  tree_ops::check_tree(run, parent);
  QWEN36_CHECK(run.begin >= 0 && run.begin + run.count <= rows, "tree verify: rows {} .. +{} of {}", run.begin,
               run.count, rows);
  const TreeTable* t = batch_tree(c, run, parent);
  return {run.count <= kMaxTreeTokens && (t || !c.capturing), t};
}

bool causal_conv1d_silu_tree_readonly(Ctx& c, Tensor& x, const Tensor& w, const Tensor& conv_state, const SeqRun& run,
                                      std::span<const int32_t> parent) {
  const SeqRun one[] = {run};
  check_conv(x, w, conv_state, one);
  const int64_t C = x.cols();
  const auto [take, t] = tree_kernels_take(c, run, parent, x.rows());
  if (!take) return false;
  if (C == 0) return true;
  Temp<float> xin(c, size_t(run.count) * size_t(C));
  CUDA_CHECK(cudaMemcpyAsync(xin.get(), x.as<float>() + int64_t(run.begin) * C, xin.size() * sizeof(float),
                             cudaMemcpyDeviceToDevice, c.stream));
  Temp<int32_t> dparent(c, t ? std::span<const int32_t>() : parent);
  const int32_t* pa = t ? c.trees.dev + t->off : dparent.get();
  const dim3 grid(unsigned(blocks_for(C, 128)), unsigned(run.count));
  conv1d_silu_tree_kernel<<<grid, 128, 0, c.stream>>>(xin.get(), x.as<float>(), w.as<const float>(),
                                                      conv_state.as<const float>(), pa, run, C, int(w.cols()));
  CUDA_LAUNCH_CHECK();
  return true;
}

bool gated_delta_rule_tree_readonly(Ctx& c, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                    const Tensor& beta, const Tensor& state, const SeqRun& run,
                                    std::span<const int32_t> parent, Tensor& out) {
  const SeqRun one[] = {run};
  check_delta_rule(q, k, v, state, one);
  const int64_t T = q.dim(0), Hk = q.dim(1), dk = q.dim(2);
  QWEN36_CHECK(out.numel() == v.numel(), "gated_delta_rule_tree_readonly: out {} for v {}", out.shape_str(),
               v.shape_str());
  const auto [take, t] = tree_kernels_take(c, run, parent, T);
  if (!take) return false;
  Temp<float> qn(c, size_t(T * Hk * dk)), kn(c, size_t(T * Hk * dk));
  l2norm_qk(c, q, k, qn.get(), kn.get());
  // The leaf paths: the table's, padded to `count` runs (the grid does not depend on the tree),
  // or uploaded.
  tree_ops::Paths p;
  if (!t) p = tree_ops::leaf_paths(run, parent);
  Temp<int32_t> up_rows(c, std::span<const int32_t>(p.rows));
  Temp<SeqRun> up_paths(c, std::span<const SeqRun>(p.runs));
  const SeqRun* paths = t ? reinterpret_cast<const SeqRun*>(c.trees.dev + t->off_paths) : up_paths.get();
  const int32_t* rows = t ? c.trees.dev + t->off_rows : up_rows.get();
  const size_t n = t ? size_t(run.count) : p.runs.size();
  const int64_t Hv = v.dim(1), dv = v.dim(2);
  const StateRef st = state_ref(state);
  if (dv % kDecCols == 0) {
    const dim3 grid{unsigned(n), unsigned(Hv), unsigned(dv / kDecCols)};
    auto launch = [&](auto kernel) {
      kernel<<<grid, kDecThreads, 0, c.stream>>>(qn.get(), kn.get(), v.as<const float>(), g.as<const float>(),
                                                 beta.as<const float>(), st, paths, rows, out.as<float>(), int(Hk),
                                                 int(Hv), int(dv));
    };
    if (!with_key_dim(dk, [&](auto d) { launch(tree_slices_kernel<decltype(d)::value>); }))
      fail("gated_delta_rule_tree_readonly: key head dim {} is not supported by the CUDA backend", dk);
    CUDA_LAUNCH_CHECK();
    return true;
  }
  launch_recurrent(c, qn.get(), kn.get(), v, g, beta, st, paths, n, out, Hk, dk, INT_MAX, false, rows);
  return true;
}

}  // namespace qwen36::cuda
