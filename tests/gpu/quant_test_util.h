#pragma once
// defines: helpers shared by the quantized-weight GPU tests (test_cuda_quant.cpp,
//          test_cuda_quant_mma.cpp, test_cuda_quant_hf.cpp): random quantized rows and HF
//          blocks, int8-exact and int8-rounded activations (the decode kernels' CPU twin), the
//          double-precision reference product, a per-call timer, the worst relative error with
//          its position, the fused MLP prefill's check, tiled device copies (upload_tiled)
//          and matrices stored back to back (stacked).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "gpu_test_util.h"
#include "quant/hf_blocks.h"
#include "quant/quant.h"

namespace qwen36::gputest {

// N x K random blocks of an HF type with every field in its valid range: W4 codes 0..15 and
// zeros 0..16 (GPTQ v1's effective zero reaches 16) with f16 or bf16 scales in [0.01, 0.1]; e4m3
// codes without NaN and block scales in [0.005, 0.05]; NVFP4 codes, e4m3 group scales in [2^-3, 2^2] and a global scale in [0.005, 0.05].
inline HostT random_hf(std::mt19937& rng, DType t, int64_t N, int64_t K) {
  HostT h(t, {N, K});
  std::uniform_int_distribution<int> byte(0, 255), zero(0, 16), bit(0, 1);
  std::uniform_real_distribution<float> small(0.01f, 0.1f);
  const int64_t nb = N * K / dtype_block_elems(t);
  auto e4m3 = [&](int lo, int hi) {  // a byte with exponent field in [lo, hi]
    return uint8_t((std::uniform_int_distribution<int>(lo, hi)(rng) << 3) | (byte(rng) & 7));
  };
  auto w4 = [&](auto* b) {
    for (int64_t i = 0; i < nb; ++i) {
      for (uint8_t& q : b[i].qs) q = uint8_t(byte(rng));
      b[i].z = uint8_t(zero(rng));
      b[i].kind = uint8_t(bit(rng));
      b[i].s = b[i].kind ? f32_to_bf16(small(rng)) : f32_to_f16(small(rng));
    }
  };
  if (t == DType::W4_G32) w4(reinterpret_cast<BlockW4G32*>(h.bytes.data()));
  if (t == DType::W4_G128) w4(reinterpret_cast<BlockW4G128*>(h.bytes.data()));
  if (t == DType::F8_B128) {
    auto* b = reinterpret_cast<BlockF8B128*>(h.bytes.data());
    for (int64_t i = 0; i < nb; ++i) {
      for (uint8_t& q : b[i].q) q = uint8_t(byte(rng) & 0x80) | e4m3(0, 14);  // subnormals included, no NaN
      b[i].d = small(rng) * 0.5f;
    }
  }
  if (t == DType::NVFP4_B64) {
    auto* b = reinterpret_cast<BlockNvfp4B64*>(h.bytes.data());
    for (int64_t i = 0; i < nb; ++i) {
      for (uint8_t& q : b[i].qs) q = uint8_t(byte(rng));
      for (uint8_t& s : b[i].s) s = e4m3(4, 9);
      b[i].g = small(rng) * 0.5f;
    }
  }
  return h;
}

// N random rows quantized to t: N(0, 1) values, each 32-block scaled by a factor in [0.1, 2]
// (the HF checkpoint types, which no quantizer here makes: random_hf).
inline HostT quantized(std::mt19937& rng, DType t, int64_t N, int64_t K) {
  if (dtype_is_hf_block(t)) return random_hf(rng, t, N, K);
  HostT h(t, {N, K});
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(0.1f, 2.0f);
  std::vector<float> row(static_cast<size_t>(K));
  const size_t rb = h.t.row_bytes();
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t b = 0; b < K; b += 32) {
      const float s = scale(rng);
      for (int64_t k = b; k < b + 32; ++k) row[size_t(k)] = nd(rng) * s;
    }
    quantize_row(t, row.data(), h.bytes.data() + size_t(n) * rb, K);
  }
  return h;
}

// Activations [T, K] whose 32-blocks are d · k with d = 2^-e (e ∈ 0..8), k ∈ [−127, 127] and one
// |k| = 127: int8 quantization per 32 is exact. Block 1 is zero (amax = 0).
inline HostT int8_exact_activations(std::mt19937& rng, int64_t T, int64_t K) {
  HostT h(DType::F32, {T, K});
  std::uniform_int_distribution<int> k(-127, 127), e(0, 8), pos(0, 31);
  for (int64_t b = 0; b < T * K; b += 32) {
    const float d = std::ldexp(1.0f, -e(rng));
    for (int64_t i = 0; i < 32; ++i) h.f()[b + i] = d * float(k(rng));
    h.f()[b + pos(rng)] = d * (k(rng) < 0 ? -127.0f : 127.0f);
    if (b == 32) std::fill(h.f() + b, h.f() + b + 32, 0.0f);
  }
  return h;
}

// x rounded as the decode GEMV rounds it: per 32, d = amax/127, q = x · (127/amax) to the
// nearest even integer by one FMA with 1.5 · 2^23 (as the kernel), value d · q.
inline HostT int8_activations(const HostT& x) {
  HostT y = x;
  const float* a = x.t.as<const float>();
  float* o = y.f();
  for (int64_t b = 0; b < x.t.numel(); b += 32) {
    float amax = 0.0f;
    for (int64_t i = b; i < b + 32; ++i) amax = std::max(amax, std::abs(a[i]));
    const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t i = b; i < b + 32; ++i) o[i] = d * (std::fma(a[i], id, 12582912.0f) - 12582912.0f);
  }
  return y;
}

// out[t, n] = Σ_k dequant(w)[n, k] · x[t, k] in double (rows: only those with n % row_step == 0).
inline std::vector<float> reference(const HostT& w, const HostT& x, int64_t T, int64_t row_step = 1) {
  const int64_t N = w.t.rows(), K = w.t.cols();
  std::vector<float> out(size_t(T * N), 0.0f), row(static_cast<size_t>(K));
  for (int64_t n = 0; n < N; n += row_step) {
    cpu::weight_row_to_f32(w.t, n, row.data());
    for (int64_t t = 0; t < T; ++t) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(row[size_t(k)]) * double(x.t.as<const float>()[t * K + k]);
      out[size_t(t * N + n)] = float(s);
    }
  }
  return out;
}

// A device copy of w in the tiled layout.
inline DevT upload_tiled(Backend& gpu, const HostT& w) {
  DevT d = upload(gpu, w);
  EXPECT_TRUE(cuda_tile_matrix(d.t)) << dtype_name(w.t.dtype) << " " << w.t.shape_str();
  EXPECT_TRUE(dtype_is_tiled(d.t.dtype));
  return d;
}

// Random matrices of `rows` rows each stored back to back in one tiled device matrix (as
// prepare_weights lays out a layer's projections), and views of them apart.
struct Stacked {
  std::vector<HostT> host;
  DevT dev;
  std::vector<Tensor> views;
};
inline Stacked stacked(Backend& gpu, std::mt19937& rng, DType dt, std::span<const int64_t> rows, int64_t K) {
  Stacked st;
  int64_t total = 0;
  for (int64_t n : rows) total += n;
  HostT all(dt, {total, K});
  size_t at = 0;
  for (int64_t n : rows) {
    st.host.push_back(quantized(rng, dt, n, K));
    std::memcpy(all.bytes.data() + at, st.host.back().bytes.data(), st.host.back().bytes.size());
    at += st.host.back().bytes.size();
  }
  st.dev = upload_tiled(gpu, all);
  size_t off = 0;
  for (int64_t n : rows) {
    st.views.emplace_back(static_cast<uint8_t*>(st.dev.t.data) + off, st.dev.t.dtype, std::initializer_list<int64_t>{n, K});
    off += st.views.back().nbytes();
  }
  return st;
}

// matmul_multi's arguments for a stacked matrix's views at T tokens: the views, and zeroed
// outputs [T, rows] (outs point into out: move the struct, do not copy it).
struct StackedCall {
  std::vector<DevT> out;
  std::vector<const Tensor*> ws;
  std::vector<Tensor*> outs;
};
inline StackedCall stacked_call(Backend& gpu, const Stacked& st, int64_t T) {
  StackedCall c;
  c.out.reserve(st.views.size());
  for (const Tensor& v : st.views) {
    c.out.push_back(upload(gpu, HostT(DType::F32, {T, v.rows()})));
    c.ws.push_back(&v);
    c.outs.push_back(&c.out.back().t);
  }
  return c;
}

// N rows repeated from 64 quantized random rows (building 90 M weights stays fast).
inline HostT repeated_rows(std::mt19937& rng, DType dt, int64_t N, int64_t K) {
  const HostT base = quantized(rng, dt, 64, K);
  HostT w(dt, {N, K});
  const size_t rb = w.t.row_bytes();
  for (int64_t n = 0; n < N; ++n) std::memcpy(w.bytes.data() + size_t(n) * rb, base.bytes.data() + size_t(n % 64) * rb, rb);
  return w;
}

// Seconds per call of f(i), i cycling over n (after one warm round).
template <typename F>
inline double time_per_call(int n, F&& f) {
  for (int i = 0; i < n; ++i) f(i);
  const int reps = std::max(10 * n, 50);
  cuda_synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) f(r % n);
  cuda_synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

// max |got − want| / max(1, max |want|) over the rows n % step == 0 of [T, N] results (NaN counts
// as a huge error), and in *where the position (t, n; n / 16 is the row-tile of the tiled
// layouts) with both values.
inline double worst_rel_err(const std::vector<float>& got, const std::vector<float>& want, int64_t T, int64_t N,
                            int64_t step, std::string* where) {
  double worst = -1, scale = 1;
  int64_t wt = 0, wn = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; n += step) {
      const size_t i = size_t(t * N + n);
      scale = std::max(scale, std::abs(double(want[i])));
      const double d = std::isnan(got[i]) ? 1e30 : std::abs(double(got[i]) - double(want[i]));
      if (d > worst) worst = d, wt = t, wn = n;
    }
  const size_t i = size_t(wt * N + wn);
  *where = "worst at t=" + std::to_string(wt) + " n=" + std::to_string(wn) + " (row-tile " + std::to_string(wn / 16) +
           ", row " + std::to_string(wn % 16) + "): got " + std::to_string(got[i]) + " want " + std::to_string(want[i]) +
           " (max |want| " + std::to_string(scale) + ")";
  return worst / scale;
}

// Backend::mlp of device weights m (host copies wg, wu, wd) on T random tokens against the CPU
// in double: x, the weights, gate / up and their SwiGLU each rounded to bf16 once, f32 sums — the
// bf16 bound 2e-2. gate_out / up_out are scratch the fused prefill form leaves untouched (the
// composition writes them): zeros afterwards = it ran.
inline void expect_fused_mlp_prefill(Backend& gpu, std::mt19937& rng, const HostT& wg, const HostT& wu,
                                     const HostT& wd, const MlpWeights& m, int64_t T, const std::string& what) {
  const int64_t H = wg.t.cols(), I = wg.t.rows();
  const HostT x = random_t(rng, DType::F32, {T, H});
  const std::vector<float> g = reference(wg, x, T), u = reference(wu, x, T);
  HostT a(DType::F32, {T, I});
  for (int64_t i = 0; i < T * I; ++i) a.f()[i] = cpu::silu(g[size_t(i)]) * u[size_t(i)];
  const std::vector<float> want = reference(wd, a, T);
  const DevT dx = upload(gpu, x);
  DevT gate_out = upload(gpu, HostT(DType::F32, {T, I})), up_out = upload(gpu, HostT(DType::F32, {T, I})),
       out = upload(gpu, HostT(DType::F32, {T, H}));
  gpu.mlp(dx.t, m, gate_out.t, up_out.t, out.t);
  std::string where;
  EXPECT_LE(worst_rel_err(download(gpu, out.t), want, T, H, 1, &where), 2e-2) << what << " " << where;
  for (const DevT* scratch : {&gate_out, &up_out}) {
    const std::vector<float> v = download(gpu, scratch->t);
    EXPECT_EQ(std::count(v.begin(), v.end(), 0.0f), int64_t(v.size())) << what << ": the composition ran";
  }
}

}  // namespace qwen36::gputest
