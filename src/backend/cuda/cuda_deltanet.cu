// Gated DeltaNet on the GPU: causal depthwise conv + SiLU with carried state, the gates, and
// the gated delta rule. CPU twin: backend/cpu/cpu_deltanet.cpp.
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
#include <algorithm>
#include <climits>
#include <cmath>

#include "backend/cuda/cuda_ops.cuh"

namespace qwen36::cuda {

// cuda_delta_chunked.cu
bool delta_rule_chunked_supported(int64_t dk, int64_t dv);
void delta_rule_chunked(Ctx& c, const float* qn, const float* kn, const float* v, const float* g, const float* beta,
                        float* state, float* out, std::span<const SeqRun> runs, const SeqRun* dev_runs,
                        int min_count, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv);

namespace {

constexpr int kMaxConvK = 8;
// Auto mode: the chunked form from this run length on. One chunk of work costs about as much
// as a few dozen serial recurrent steps; 64 (one full chunk) is a conservative start, to be
// tuned from the crossover sweep printed by the CudaDeltaNet timing test.
constexpr int kAutoChunkedMin = 64;

// One thread per (run, channel): the run's tokens in order, window in registers.
__global__ void conv1d_silu_kernel(float* x, const float* w, float* state, const SeqRun* runs, int64_t C, int K) {
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
#pragma unroll
  for (int i = 0; i < kMaxConvK; ++i)
    if (i < S) st[i] = hist[i];
}

__global__ void gates_kernel(const float* a, const float* b, const float* a_neg_exp, const float* dt_bias, float* g,
                             float* beta, int64_t Hv, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t h = i % Hv;
    const float x = a[i] + dt_bias[h];
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    g[i] = a_neg_exp[h] * sp;
    beta[i] = sigmoid_f(b[i]);
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
template <int DK>
__global__ void delta_rule_kernel(const float* __restrict__ qn, const float* __restrict__ kn,
                                  const float* __restrict__ v, const float* __restrict__ g,
                                  const float* __restrict__ beta, float* __restrict__ state, const SeqRun* runs,
                                  float* __restrict__ out, int Hk, int Hv, int dv, int min_chunked) {
  const SeqRun r = runs[blockIdx.x];
  if (r.count >= min_chunked) return;  // the chunked kernels' run
  const int h = blockIdx.y, kh = h / (Hv / Hk), j = threadIdx.x;
  const bool active = j < dv;
  __shared__ float ks[2][DK], qs[2][DK], gb[2][2];
  float* S = state + (int64_t(r.slot) * Hv + h) * DK * dv;
  float s[DK];
#pragma unroll
  for (int i = 0; i < DK; ++i) s[i] = active ? S[int64_t(i) * dv + j] : 0.0f;

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
    __syncthreads();
  }
  if (active) {
#pragma unroll
    for (int i = 0; i < DK; ++i) S[int64_t(i) * dv + j] = s[i];
  }
}

}  // namespace

void causal_conv1d_silu(Ctx& c, Tensor& x, const Tensor& w, Tensor& conv_state, std::span<const SeqRun> runs) {
  const int64_t C = x.cols(), K = w.cols(), S = K - 1;
  QWEN36_CHECK(w.rows() == C && w.dtype == DType::F32, "conv1d: weight {} for {} channels", w.shape_str(), C);
  QWEN36_CHECK(conv_state.ndim == 3 && conv_state.dim(1) == C && conv_state.dim(2) == S,
               "conv1d: state {} for {} channels, kernel {}", conv_state.shape_str(), C, K);
  QWEN36_CHECK(K >= 1 && K <= kMaxConvK, "conv1d: kernel size {} (CUDA supports 1..{})", K, kMaxConvK);
  for (const SeqRun& r : runs)
    QWEN36_CHECK(r.slot >= 0 && r.slot < conv_state.dim(0), "conv1d: slot {} out of range", r.slot);
  if (runs.empty() || C == 0) return;
  Temp<SeqRun> tmp(c, 0);
  const SeqRun* dr = dev_runs(c, runs, tmp);
  const dim3 grid(unsigned(blocks_for(C, 128)), unsigned(runs.size()));
  conv1d_silu_kernel<<<grid, 128, 0, c.stream>>>(x.as<float>(), w.as<const float>(), conv_state.as<float>(), dr,
                                                 C, int(K));
  CUDA_LAUNCH_CHECK();
}

void deltanet_gates(Ctx& c, const Tensor& a, const Tensor& b, const Tensor& a_neg_exp, const Tensor& dt_bias,
                    Tensor& g, Tensor& beta) {
  const int64_t Hv = a_neg_exp.numel(), T = a.numel() / Hv;
  QWEN36_CHECK(a.numel() == T * Hv && b.numel() == T * Hv && g.numel() == T * Hv && beta.numel() == T * Hv,
               "deltanet_gates: shapes a {} b {} for {} heads", a.shape_str(), b.shape_str(), Hv);
  const int64_t n = T * Hv;
  if (!n) return;
  gates_kernel<<<int(std::min<int64_t>(blocks_for(n, 256), 65535)), 256, 0, c.stream>>>(
      a.as<const float>(), b.as<const float>(), a_neg_exp.as<const float>(), dt_bias.as<const float>(), g.as<float>(),
      beta.as<float>(), Hv, n);
  CUDA_LAUNCH_CHECK();
}

void gated_delta_rule(Ctx& c, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      Tensor& state, std::span<const SeqRun> runs, Tensor& out, DeltaRuleMode mode) {
  QWEN36_CHECK(q.ndim == 3 && k.ndim == 3 && v.ndim == 3 && state.ndim == 4, "gated_delta_rule: bad ranks");
  const int64_t T = q.dim(0), Hk = q.dim(1), dk = q.dim(2), Hv = v.dim(1), dv = v.dim(2);
  QWEN36_CHECK(Hv % Hk == 0 && state.dim(1) == Hv && state.dim(2) == dk && state.dim(3) == dv,
               "gated_delta_rule: q {} v {} state {}", q.shape_str(), v.shape_str(), state.shape_str());
  QWEN36_CHECK(dv <= 1024, "gated_delta_rule: value head dim {} > 1024", dv);
  for (const SeqRun& r : runs)
    QWEN36_CHECK(r.slot >= 0 && r.slot < state.dim(0), "gated_delta_rule: slot {} out of range", r.slot);
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
  const int64_t rows = T * Hk;
  l2norm_qk_kernel<<<unsigned(blocks_for(rows * 32, 256)), 256, 0, c.stream>>>(
      q.as<const float>(), k.as<const float>(), qn.get(), kn.get(), rows, int(dk), 1.0f / std::sqrt(float(dk)));
  CUDA_LAUNCH_CHECK();
  Temp<SeqRun> tmp(c, 0);
  const SeqRun* dr = dev_runs(c, runs, tmp);
  if (any_chunked)
    delta_rule_chunked(c, qn.get(), kn.get(), v.as<const float>(), g.as<const float>(), beta.as<const float>(),
                       state.as<float>(), out.as<float>(), runs, dr, min_chunked, Hk, Hv, dk, dv);
  if (!any_recurrent) return;
  const dim3 grid(unsigned(runs.size()), unsigned(Hv));
  const int threads = int((dv + 31) / 32 * 32);
  auto launch = [&](auto kernel) {
    kernel<<<grid, threads, 0, c.stream>>>(qn.get(), kn.get(), v.as<const float>(), g.as<const float>(),
                                           beta.as<const float>(), state.as<float>(), dr, out.as<float>(),
                                           int(Hk), int(Hv), int(dv), min_chunked);
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

}  // namespace qwen36::cuda
