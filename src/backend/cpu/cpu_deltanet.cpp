// Gated DeltaNet on the CPU: causal depthwise conv (with state), gates, and the gated delta
// rule in both forms — chunked (prefill, chunk 64, UT transform) and recurrent (decode).
// Both follow the reference maths step by step in f32; tests check they agree.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"

namespace qwen36::cpu {

void causal_conv1d_silu(Tensor& x, const Tensor& w, Tensor& conv_state, std::span<const SeqRun> runs) {
  const int64_t C = x.cols(), K = w.cols(), S = K - 1;
  QWEN36_CHECK(w.rows() == C && w.dtype == DType::F32, "conv1d: weight {} for {} channels", w.shape_str(), C);
  QWEN36_CHECK(conv_state.ndim == 3 && conv_state.dim(1) == C && conv_state.dim(2) == S,
               "conv1d: state {} for {} channels, kernel {}", conv_state.shape_str(), C, K);
  for (const SeqRun& r : runs) {
    QWEN36_CHECK(r.slot >= 0 && r.slot < conv_state.dim(0), "conv1d: slot {} out of range", r.slot);
    float* state = conv_state.as<float>() + int64_t(r.slot) * C * S;
#pragma omp parallel
    {
      std::vector<float> window(size_t(S + r.count));
#pragma omp for schedule(static)
      for (int64_t c = 0; c < C; ++c) {
        // window = [last S inputs of earlier calls, this run's inputs] for channel c
        float* st = state + c * S;
        for (int64_t i = 0; i < S; ++i) window[size_t(i)] = st[i];
        for (int32_t t = 0; t < r.count; ++t) window[size_t(S + t)] = x.as<float>()[int64_t(r.begin + t) * C + c];
        const float* wc = w.as<const float>() + c * K;
        for (int32_t t = 0; t < r.count; ++t) {
          float acc = 0;
          for (int64_t j = 0; j < K; ++j) acc += wc[j] * window[size_t(t + j)];
          x.as<float>()[int64_t(r.begin + t) * C + c] = silu(acc);
        }
        for (int64_t i = 0; i < S; ++i) st[i] = window[size_t(r.count + i)];
      }
    }
  }
}

void deltanet_gates(const Tensor& a, const Tensor& b, const Tensor& a_neg_exp, const Tensor& dt_bias, Tensor& g,
                    Tensor& beta) {
  const int64_t Hv = a_neg_exp.numel(), T = g.numel() / Hv, G = T ? a.numel() / T : Hv;  // G: a's and b's rows
  QWEN36_CHECK(g.numel() == T * Hv && beta.numel() == T * Hv && G >= Hv && a.numel() == T * G && b.numel() == T * G,
               "deltanet_gates: shapes a {} b {} g {} for {} heads", a.shape_str(), b.shape_str(), g.shape_str(), Hv);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hv; ++h) {
      const int64_t i = t * Hv + h, j = t * G + h;
      g.as<float>()[i] = a_neg_exp.as<const float>()[h] * softplus(a.as<const float>()[j] + dt_bias.as<const float>()[h]);
      beta.as<float>()[i] = sigmoid(b.as<const float>()[j]);
    }
}

namespace {

constexpr int64_t kChunk = 64;

// Per (run, value head) inputs, gathered contiguous: q̂ (scaled, normalised), k̂, v, g, β.
struct HeadInputs {
  int64_t n, dk, dv;
  std::vector<float> q, k, v, g, beta;  // [n, dk], [n, dk], [n, dv], [n], [n]
};

void l2norm_into(const float* src, float* dst, int64_t d, float scale) {
  float ss = 0;
  for (int64_t i = 0; i < d; ++i) ss += src[i] * src[i];
  const float inv = 1.0f / std::sqrt(ss + 1e-6f);
  for (int64_t i = 0; i < d; ++i) dst[i] = src[i] * inv * scale;
}

// Into `in`, whose vectors keep their room from call to call (a prefill's rows are fresh pages
// otherwise, faulted in for every head).
void gather(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta, const SeqRun& r,
            int64_t h, HeadInputs& in) {
  const int64_t Hk = q.dim(1), dk = q.dim(2), Hv = v.dim(1), dv = v.dim(2);
  const int64_t kh = h / (Hv / Hk);
  in.n = r.count, in.dk = dk, in.dv = dv;
  in.q.resize(size_t(r.count * dk));
  in.k.resize(size_t(r.count * dk));
  in.v.resize(size_t(r.count * dv));
  in.g.resize(size_t(r.count));
  in.beta.resize(size_t(r.count));
  const float scale = 1.0f / std::sqrt(float(dk));
  for (int64_t t = 0; t < r.count; ++t) {
    const int64_t row = r.begin + t;
    l2norm_into(q.as<const float>() + (row * Hk + kh) * dk, in.q.data() + t * dk, dk, 1.0f);
    for (int64_t i = 0; i < dk; ++i) in.q[size_t(t * dk + i)] *= scale;
    l2norm_into(k.as<const float>() + (row * Hk + kh) * dk, in.k.data() + t * dk, dk, 1.0f);
    std::memcpy(in.v.data() + t * dv, v.as<const float>() + (row * Hv + h) * dv, size_t(dv) * sizeof(float));
    in.g[size_t(t)] = g.as<const float>()[row * Hv + h];
    in.beta[size_t(t)] = beta.as<const float>()[row * Hv + h];
  }
}

// Token by token: S ← e^g S; u = Sᵀk; S += k (β(v − u))ᵀ; o = Sᵀq.     S [dk, dv]
// round_state: S is a bf16 state's f32 copy, stored (rounded to bf16) after every token, as a
// decode step stores it (model/state.h).
void delta_rule_recurrent(const HeadInputs& in, float* S, float* out, int64_t out_stride, bool round_state) {
  const int64_t dk = in.dk, dv = in.dv;
  std::vector<float> u(static_cast<size_t>(dv));
  for (int64_t t = 0; t < in.n; ++t) {
    const float decay = std::exp(in.g[size_t(t)]);
    const float* kt = in.k.data() + t * dk;
    const float* qt = in.q.data() + t * dk;
    const float* vt = in.v.data() + t * dv;
    std::fill(u.begin(), u.end(), 0.0f);
    for (int64_t i = 0; i < dk; ++i) {
      float* Si = S + i * dv;
      for (int64_t j = 0; j < dv; ++j) {
        Si[j] *= decay;
        u[size_t(j)] += Si[j] * kt[i];
      }
    }
    for (int64_t j = 0; j < dv; ++j) u[size_t(j)] = (vt[j] - u[size_t(j)]) * in.beta[size_t(t)];
    float* o = out + t * out_stride;
    std::fill(o, o + dv, 0.0f);
    for (int64_t i = 0; i < dk; ++i) {
      float* Si = S + i * dv;
      for (int64_t j = 0; j < dv; ++j) {
        Si[j] += kt[i] * u[size_t(j)];
        o[j] += Si[j] * qt[i];
      }
    }
    if (round_state)
      for (int64_t x = 0; x < dk * dv; ++x) S[x] = round_bf16(S[x]);
  }
}

// C[M×N] += A[M×K]·B[K×N] (row-major, leading dimensions lda / ldb / ldc; ta: A is given
// transposed, stored K×M). Tiles of 4 rows × 16 columns stay in eight AVX2 registers across k,
// so each loaded B vector serves four rows: the chunk's 64×128×128 products below are these.
void gemm_acc(const float* A, int64_t lda, bool ta, const float* B, int64_t ldb, float* C, int64_t ldc, int64_t M,
              int64_t N, int64_t K) {
  auto a = [&](int64_t i, int64_t k) { return ta ? A[k * lda + i] : A[i * lda + k]; };
  int64_t i = 0;
  for (; i + 4 <= M; i += 4) {
    int64_t j = 0;
    for (; j + 16 <= N; j += 16) {
      __m256 acc[4][2];
      for (int r = 0; r < 4; ++r)
        for (int h = 0; h < 2; ++h) acc[r][h] = _mm256_loadu_ps(C + (i + r) * ldc + j + 8 * h);
      for (int64_t k = 0; k < K; ++k) {
        const __m256 b0 = _mm256_loadu_ps(B + k * ldb + j), b1 = _mm256_loadu_ps(B + k * ldb + j + 8);
        for (int r = 0; r < 4; ++r) {
          const __m256 av = _mm256_set1_ps(a(i + r, k));
          acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
          acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
        }
      }
      for (int r = 0; r < 4; ++r)
        for (int h = 0; h < 2; ++h) _mm256_storeu_ps(C + (i + r) * ldc + j + 8 * h, acc[r][h]);
    }
    const size_t tail = size_t(N - j);  // the columns past the last whole tile
    for (int r = 0; r < 4 && tail > 0; ++r) {
      float* crow = C + (i + r) * ldc + j;
      for (int64_t k = 0; k < K; ++k) {
        const float av = a(i + r, k);
        const float* brow = B + k * ldb + j;
        for (size_t c = 0; c < tail; ++c) crow[c] += av * brow[c];
      }
    }
  }
  for (; i < M; ++i)
    for (int64_t k = 0; k < K; ++k) {
      const float av = a(i, k);
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] += av * B[k * ldb + j];
    }
}

// Chunked form over chunks of 64 (the tail padded with zeros, which leaves S unchanged):
//   γ = cumsum(g) in the chunk; A_ij = −β_i (k̂_i·k̂_j) e^{γ_i−γ_j} (j < i);
//   T = (I − A)⁻¹ by forward substitution; U = T diag(β) V; W = T diag(β e^γ) K̂;
//   V' = U − W S;  O = (Q̂ ⊙ e^γ) S + tril(Q̂K̂ᵀ ⊙ e^{γ_i−γ_j}) V';
//   S ← e^{γ_last} S + K̂ᵀ diag(e^{γ_last − γ}) V'.
void delta_rule_chunked(const HeadInputs& in, float* S, float* out, int64_t out_stride) {
  const int64_t dk = in.dk, dv = in.dv, C = kChunk;
  std::vector<float> gam(static_cast<size_t>(C)), A(size_t(C * C)), U(size_t(C * dv)), W(size_t(C * dk)), Vn(size_t(C * dv));
  // The products' operands: β V, β e^γ K̂, Q̂ e^γ, K̂ e^{γ_last − γ}, the decayed tril(Q̂K̂ᵀ).
  std::vector<float> Vb(size_t(C * dv)), Kb(size_t(C * dk)), Qe(size_t(C * dk)), Ke(size_t(C * dk)), P(size_t(C * C));
  std::vector<float> Kt(size_t(dk * C)), KK(size_t(C * C)), QK(size_t(C * C));  // K̂ᵀ, K̂K̂ᵀ, Q̂K̂ᵀ
  for (int64_t c0 = 0; c0 < in.n; c0 += C) {
    const int64_t n = std::min(C, in.n - c0);  // real rows; rows n..C-1 are zero padding
    const float* K = in.k.data() + c0 * dk;
    const float* Q = in.q.data() + c0 * dk;
    const float* V = in.v.data() + c0 * dv;
    const float* beta = in.beta.data() + c0;
    float acc = 0;
    for (int64_t i = 0; i < n; ++i) gam[size_t(i)] = acc += in.g[size_t(c0 + i)];

    // The chunk's K̂ᵀ (dk × C, the padding columns zero), then K̂K̂ᵀ and Q̂K̂ᵀ as products.
    std::fill(Kt.begin(), Kt.end(), 0.0f);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t x = 0; x < dk; ++x) Kt[size_t(x * C + i)] = K[i * dk + x];
    std::fill(KK.begin(), KK.end(), 0.0f);
    std::fill(QK.begin(), QK.end(), 0.0f);
    gemm_acc(K, dk, false, Kt.data(), C, KK.data(), C, n, C, dk);
    gemm_acc(Q, dk, false, Kt.data(), C, QK.data(), C, n, C, dk);
    // A (strictly lower), then the row recurrence that turns it into T − I.
    std::fill(A.begin(), A.end(), 0.0f);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < i; ++j)
        A[size_t(i * C + j)] = -(beta[i] * KK[size_t(i * C + j)]) * std::exp(gam[size_t(i)] - gam[size_t(j)]);
    for (int64_t i = 1; i < n; ++i)
      for (int64_t j = 0; j < i; ++j) {
        float s = A[size_t(i * C + j)];
        for (int64_t m = j + 1; m < i; ++m) s += A[size_t(i * C + m)] * A[size_t(m * C + j)];
        A[size_t(i * C + j)] = s;
      }
    // U = T diag(β) V and W = T diag(β e^γ) K̂, with T = A + I (A strictly lower, zero above):
    // the scaled rows, then A times them added.
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t x = 0; x < dv; ++x) Vb[size_t(i * dv + x)] = V[i * dv + x] * beta[i];
      const float e = beta[i] * std::exp(gam[size_t(i)]);
      for (int64_t x = 0; x < dk; ++x) Kb[size_t(i * dk + x)] = K[i * dk + x] * e;
    }
    std::copy(Vb.begin(), Vb.begin() + n * dv, U.begin());
    std::copy(Kb.begin(), Kb.begin() + n * dk, W.begin());
    gemm_acc(A.data(), C, false, Vb.data(), dv, U.data(), dv, n, dv, n);
    gemm_acc(A.data(), C, false, Kb.data(), dk, W.data(), dk, n, dk, n);
    // V' = U − W S
    for (int64_t x = 0; x < n * dk; ++x) W[size_t(x)] = -W[size_t(x)];
    std::copy(U.data(), U.data() + n * dv, Vn.data());
    gemm_acc(W.data(), dk, false, S, dv, Vn.data(), dv, n, dv, dk);
    // O = (Q̂ ⊙ e^γ) S + tril_incl(Q̂K̂ᵀ ⊙ decay) V', the outputs in rows out_stride apart
    for (int64_t i = 0; i < n; ++i) {
      const float eg = std::exp(gam[size_t(i)]);
      for (int64_t x = 0; x < dk; ++x) Qe[size_t(i * dk + x)] = Q[i * dk + x] * eg;
      for (int64_t j = 0; j < C; ++j)
        P[size_t(i * C + j)] = j <= i ? QK[size_t(i * C + j)] * std::exp(gam[size_t(i)] - gam[size_t(j)]) : 0.0f;
    }
    float* o = out + c0 * out_stride;
    for (int64_t i = 0; i < n; ++i) std::fill(o + i * out_stride, o + i * out_stride + dv, 0.0f);
    gemm_acc(Qe.data(), dk, false, S, dv, o, out_stride, n, dv, dk);
    gemm_acc(P.data(), C, false, Vn.data(), dv, o, out_stride, n, dv, n);
    // S ← e^{γ_last} S + Σ_i k̂_i e^{γ_last − γ_i} V'_i
    const float glast = gam[size_t(n - 1)];
    const float el = std::exp(glast);
    for (int64_t x = 0; x < dk * dv; ++x) S[x] *= el;
    for (int64_t i = 0; i < n; ++i) {
      const float e = std::exp(glast - gam[size_t(i)]);
      for (int64_t x = 0; x < dk; ++x) Ke[size_t(i * dk + x)] = K[i * dk + x] * e;
    }
    gemm_acc(Ke.data(), dk, true, Vn.data(), dv, S, dv, dk, dv, n);
  }
}

}  // namespace

void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      Tensor& state, std::span<const SeqRun> runs, Tensor& out, DeltaRuleMode mode) {
  QWEN36_CHECK(q.ndim == 3 && k.ndim == 3 && v.ndim == 3 && state.ndim == 4, "gated_delta_rule: bad ranks");
  const int64_t Hk = q.dim(1), dk = q.dim(2), Hv = v.dim(1), dv = v.dim(2);
  QWEN36_CHECK(Hv % Hk == 0 && state.dim(1) == Hv && state.dim(2) == dk && state.dim(3) == dv,
               "gated_delta_rule: q {} v {} state {}", q.shape_str(), v.shape_str(), state.shape_str());
  QWEN36_CHECK(state.dtype == DType::F32 || state.dtype == DType::BF16, "gated_delta_rule: a {} state (f32 or bf16)",
               dtype_name(state.dtype));
  const bool bf16 = state.dtype == DType::BF16;
  for (const SeqRun& r : runs) {
    QWEN36_CHECK(r.slot >= 0 && r.slot < state.dim(0), "gated_delta_rule: slot {} out of range", r.slot);
    const bool chunked = mode == DeltaRuleMode::Chunked || (mode == DeltaRuleMode::Auto && r.count > 1);
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t h = 0; h < Hv; ++h) {
      thread_local HeadInputs in;
      gather(q, k, v, g, beta, r, h, in);
      const int64_t at = (int64_t(r.slot) * Hv + h) * dk * dv;
      // A bf16 state is computed on in an f32 copy, widened exactly and rounded back when stored.
      std::vector<float> wide(bf16 ? size_t(dk * dv) : 0);
      uint16_t* Sb = bf16 ? state.as<uint16_t>() + at : nullptr;
      if (bf16)
        for (int64_t x = 0; x < dk * dv; ++x) wide[size_t(x)] = bf16_to_f32(Sb[x]);
      float* S = bf16 ? wide.data() : state.as<float>() + at;
      float* o = out.as<float>() + (int64_t(r.begin) * Hv + h) * dv;
      if (chunked)
        delta_rule_chunked(in, S, o, Hv * dv);
      else
        delta_rule_recurrent(in, S, o, Hv * dv, bf16);
      if (bf16)
        for (int64_t x = 0; x < dk * dv; ++x) Sb[x] = f32_to_bf16(S[x]);
    }
  }
}

}  // namespace qwen36::cpu
