// Every CPU op (through the Backend interface the model uses) against a naive implementation
// written here from the contract in backend/backend.h: plain loops, double precision.
//
// Tolerances: elementwise ops and norms are checked to 1e-6 abs + 1e-5 rel (a few f32
// roundings); matmul to 1e-5·Σ|x·w| + 1e-6 (the worst-case bound of an f32 dot product of the
// lengths used, which holds whatever order the kernel sums in); data movement exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/kv_cache.h"
#include "core/error.h"
#include "core/portable_exp.h"
#include "cpu_ops_test_util.h"
#include "quant/cpu_dot_exact.h"
#include "quant/cpu_dot_g32.h"
#include "quant/quant.h"

namespace qwen36 {
namespace {

using test::expect_close;
using test::Rng;

double silu_d(double x) { return x / (1.0 + std::exp(-x)); }
double sigmoid_d(double x) { return 1.0 / (1.0 + std::exp(-x)); }

class CpuOps : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend(0);
};

// ---------------------------------------------------------------- embedding

TEST_F(CpuOps, EmbedF32Bf16F16) {
  Rng r(1);
  const int64_t V = 37, D = 29;  // D odd: no vector-width tail assumptions
  const std::vector<int32_t> ids = {0, 36, 5, 5, 17, 1, 36};
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    std::vector<float> tf(static_cast<size_t>(V * D));
    std::vector<uint16_t> th(static_cast<size_t>(V * D));
    std::vector<double> ref_table(static_cast<size_t>(V * D));
    for (size_t i = 0; i < tf.size(); ++i) {
      if (dt == DType::F32) {
        tf[i] = r.uniform(-3, 3);
        ref_table[i] = tf[i];
      } else if (dt == DType::BF16) {
        th[i] = test::random_bf16(r);
        ref_table[i] = test::ref_bf16(th[i]);
      } else {
        th[i] = test::random_f16(r);  // includes subnormals
        ref_table[i] = test::ref_f16(th[i]);
      }
    }
    Tensor table(dt == DType::F32 ? static_cast<void*>(tf.data()) : th.data(), dt, {V, D});
    std::vector<float> out(ids.size() * size_t(D), -7.0f);
    Tensor o = test::f32(out, {int64_t(ids.size()), D});
    be->embed(table, ids, o);
    std::vector<double> want;
    for (int32_t id : ids)
      for (int64_t d = 0; d < D; ++d) want.push_back(ref_table[size_t(id * D + d)]);
    // Widening bf16/f16 to f32 is exact.
    expect_close(out, want, 0, 0, std::string("embed ") + std::string(dtype_name(dt)));
  }
}

TEST_F(CpuOps, EmbedRejectsOutOfVocabularyIds) {
  std::vector<float> table(4 * 3, 1.0f), out(3);
  Tensor t = test::f32(table, {4, 3}), o = test::f32(out, {1, 3});
  for (int32_t bad : {-1, 4, 1 << 30}) {
    const std::vector<int32_t> ids = {bad};
    EXPECT_THROW(be->embed(t, ids, o), Error) << bad;
  }
}

// ---------------------------------------------------------------- norms

TEST_F(CpuOps, RmsNorm) {
  Rng r(2);
  for (int64_t D : {1, 7, 64, 67}) {
    const int64_t R = 11;  // > 8: the parallel path
    auto x = r.vec(size_t(R * D), -4, 4), w = r.vec(size_t(D), 0.5f, 1.5f);
    std::vector<float> out(x.size());
    const float eps = 1e-6f;
    Tensor tx = test::f32(x, {R, D}), tw = test::f32(w, {D}), to = test::f32(out, {R, D});
    be->rms_norm(tx, tw, eps, to);
    std::vector<double> want(x.size());
    for (int64_t i = 0; i < R; ++i) {
      double ss = 0;
      for (int64_t d = 0; d < D; ++d) ss += double(x[size_t(i * D + d)]) * x[size_t(i * D + d)];
      const double inv = 1.0 / std::sqrt(ss / double(D) + eps);
      for (int64_t d = 0; d < D; ++d) want[size_t(i * D + d)] = x[size_t(i * D + d)] * inv * w[size_t(d)];
    }
    expect_close(out, want, 1e-6, 1e-5, "rms_norm D=" + std::to_string(D));
  }
}

// The one-pass residual add + norm against the composition it replaces (add, then rms_norm):
// bitwise, in place and into the other buffer, on the serial and the parallel path.
TEST_F(CpuOps, AddRmsNormIntoBitwiseAsAddThenNorm) {
  Rng r(4);
  for (int64_t R : {1, 11})
    for (int64_t D : {7, 64}) {
      const std::vector<float> y = r.vec(size_t(R * D), -4, 4);
      std::vector<float> d = r.vec(size_t(R * D), -2, 2), w = r.vec(size_t(D), 0.5f, 1.5f);
      std::vector<float> ref_y = y, ref_out(y.size());
      Tensor ty = test::f32(ref_y, {R, D}), td = test::f32(d, {R, D}), tw = test::f32(w, {D});
      Tensor tro = test::f32(ref_out, {R, D});
      be->add(ty, td);
      be->rms_norm(ty, tw, 1e-6f, tro);
      std::vector<float> in = y, other(y.size()), out1(y.size()), inplace = y, out2(y.size());
      Tensor tin = test::f32(in, {R, D}), toth = test::f32(other, {R, D}), to1 = test::f32(out1, {R, D});
      be->add_rms_norm_into(tin, td, toth, tw, 1e-6f, to1);
      Tensor tip = test::f32(inplace, {R, D}), to2 = test::f32(out2, {R, D});
      be->add_rms_norm(tip, td, tw, 1e-6f, to2);
      const std::string what = "R=" + std::to_string(R) + " D=" + std::to_string(D);
      EXPECT_EQ(0, std::memcmp(other.data(), ref_y.data(), y.size() * sizeof(float))) << what << ": y_out";
      EXPECT_EQ(0, std::memcmp(in.data(), y.data(), y.size() * sizeof(float))) << what << ": y must stay";
      EXPECT_EQ(0, std::memcmp(out1.data(), ref_out.data(), y.size() * sizeof(float))) << what << ": norm";
      EXPECT_EQ(0, std::memcmp(inplace.data(), ref_y.data(), y.size() * sizeof(float))) << what << ": in place y";
      EXPECT_EQ(0, std::memcmp(out2.data(), ref_out.data(), y.size() * sizeof(float))) << what << ": in place norm";
    }
}

TEST_F(CpuOps, RmsNormEpsDominatesZeroRow) {
  // An all-zero row must give zeros (eps keeps the rsqrt finite), never NaN.
  std::vector<float> x(16, 0.0f), w(16, 1.0f), out(16, 5.0f);
  Tensor tx = test::f32(x, {1, 16}), tw = test::f32(w, {16}), to = test::f32(out, {1, 16});
  be->rms_norm(tx, tw, 1e-6f, to);
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

TEST_F(CpuOps, GatedRmsNorm) {
  Rng r(3);
  const int64_t R = 13, D = 48;
  auto x = r.vec(size_t(R * D), -3, 3), z = r.vec(size_t(R * D), -6, 6), w = r.vec(size_t(D), 0.5f, 1.5f);
  std::vector<float> out(x.size());
  const float eps = 1e-6f;
  Tensor tx = test::f32(x, {R, D}), tz = test::f32(z, {R, D}), tw = test::f32(w, {D}), to = test::f32(out, {R, D});
  be->gated_rms_norm(tx, tz, tw, eps, to);
  std::vector<double> want(x.size());
  for (int64_t i = 0; i < R; ++i) {
    double ss = 0;
    for (int64_t d = 0; d < D; ++d) ss += double(x[size_t(i * D + d)]) * x[size_t(i * D + d)];
    const double inv = 1.0 / std::sqrt(ss / double(D) + eps);
    for (int64_t d = 0; d < D; ++d) {
      const size_t k = size_t(i * D + d);
      want[k] = w[size_t(d)] * x[k] * inv * silu_d(z[k]);
    }
  }
  expect_close(out, want, 1e-6, 1e-5, "gated_rms_norm");
}

// ---------------------------------------------------------------- elementwise

TEST_F(CpuOps, SwigluSigmoidMulAddSigmoidScaledAdd) {
  Rng r(4);
  const int64_t T = 5, D = 37;
  const size_t n = size_t(T * D);
  // Gates reach ±30 so the exp() inside silu/sigmoid saturates on both sides.
  auto g = r.vec(n, -30, 30), u = r.vec(n, -2, 2), x = r.vec(n, -2, 2), y = r.vec(n, -2, 2), s = r.vec(size_t(T), -8, 8);

  std::vector<float> out(n);
  Tensor tg = test::f32(g, {T, D}), tu = test::f32(u, {T, D}), to = test::f32(out, {T, D});
  be->swiglu(tg, tu, to);
  std::vector<double> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = silu_d(g[i]) * u[i];
  expect_close(out, want, 1e-6, 1e-5, "swiglu");

  std::vector<float> xm = x;
  Tensor txm = test::f32(xm, {T, D});
  be->sigmoid_mul(txm, tg);
  for (size_t i = 0; i < n; ++i) want[i] = x[i] * sigmoid_d(g[i]);
  expect_close(xm, want, 1e-6, 1e-5, "sigmoid_mul");

  std::vector<float> ya = y;
  Tensor tya = test::f32(ya, {T, D}), tx = test::f32(x, {T, D}), ts = test::f32(s, {T, 1});
  be->add_sigmoid_scaled(tya, tx, ts);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < D; ++d) {
      const size_t i = size_t(t * D + d);
      want[i] = y[i] + sigmoid_d(s[size_t(t)]) * x[i];
    }
  expect_close(ya, want, 1e-6, 1e-5, "add_sigmoid_scaled");

  std::vector<float> yb = y;
  Tensor tyb = test::f32(yb, {T, D});
  be->add(tyb, tx);
  for (size_t i = 0; i < n; ++i) want[i] = double(y[i]) + x[i];
  expect_close(yb, want, 0, 1e-7, "add");
}

// ---------------------------------------------------------------- data movement

TEST_F(CpuOps, CopyColsAndGetRows) {
  Rng r(5);
  const int64_t R = 6, SC = 10, DC = 13;
  auto src = r.vec(size_t(R * SC));
  for (auto [s0, d0, w] : {std::tuple<int64_t, int64_t, int64_t>{0, 0, 10}, {3, 7, 6}, {9, 0, 1}, {4, 4, 0}}) {
    std::vector<float> dst(static_cast<size_t>(R * DC));
    for (size_t i = 0; i < dst.size(); ++i) dst[i] = float(i);  // sentinel values outside the window
    const std::vector<float> before = dst;
    Tensor ts = test::f32(src, {R, SC}), td = test::f32(dst, {R, DC});
    be->copy_cols(ts, s0, td, d0, w);
    for (int64_t i = 0; i < R; ++i)
      for (int64_t c = 0; c < DC; ++c) {
        const bool inside = c >= d0 && c < d0 + w;
        const float want = inside ? src[size_t(i * SC + s0 + c - d0)] : before[size_t(i * DC + c)];
        ASSERT_EQ(dst[size_t(i * DC + c)], want) << "row " << i << " col " << c << " window " << s0 << "→" << d0;
      }
  }
  std::vector<float> dst(static_cast<size_t>(R * DC));
  Tensor ts = test::f32(src, {R, SC}), td = test::f32(dst, {R, DC});
  EXPECT_THROW(be->copy_cols(ts, 5, td, 0, 6), Error);   // past the source
  EXPECT_THROW(be->copy_cols(ts, 0, td, 8, 6), Error);   // past the destination
  EXPECT_THROW(be->copy_cols(ts, -1, td, 0, 2), Error);  // negative start

  const std::vector<int32_t> rows = {5, 0, 0, 3};
  std::vector<float> got(rows.size() * size_t(SC));
  Tensor tgot = test::f32(got, {int64_t(rows.size()), SC});
  be->get_rows(ts, rows, tgot);
  for (size_t i = 0; i < rows.size(); ++i)
    for (int64_t c = 0; c < SC; ++c) ASSERT_EQ(got[i * size_t(SC) + size_t(c)], src[size_t(rows[i] * SC + c)]);
  const std::vector<int32_t> bad = {6};
  std::vector<float> one(static_cast<size_t>(SC));
  Tensor tone = test::f32(one, {1, SC});
  EXPECT_THROW(be->get_rows(ts, bad, tone), Error);
}

TEST_F(CpuOps, SplitQGate) {
  Rng r(6);
  const int64_t T = 3, H = 4, hd = 6;
  auto qg = r.vec(size_t(T * H * 2 * hd));
  std::vector<float> q(static_cast<size_t>(T * H * hd)), gate(static_cast<size_t>(T * H * hd));
  Tensor tqg = test::f32(qg, {T, H, 2 * hd}), tq = test::f32(q, {T, H, hd}), tgate = test::f32(gate, {T, H * hd});
  be->split_q_gate(tqg, tq, tgate);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < hd; ++d) {
        ASSERT_EQ(q[size_t((t * H + h) * hd + d)], qg[size_t((t * H + h) * 2 * hd + d)]);
        ASSERT_EQ(gate[size_t(t * H * hd + h * hd + d)], qg[size_t((t * H + h) * 2 * hd + hd + d)]);
      }
}

// ---------------------------------------------------------------- matmul

// out[t, n] = Σ_k x[t, k] w[n, k], in double from independently decoded weights.
void check_matmul(Backend& be, DType dt, int64_t T, int64_t N, int64_t K, uint64_t seed) {
  Rng r(seed);
  auto x = r.vec(size_t(T * K), -2, 2);
  std::vector<float> wf(static_cast<size_t>(N * K));
  std::vector<uint16_t> wh(static_cast<size_t>(N * K));
  std::vector<double> wd(static_cast<size_t>(N * K));
  for (size_t i = 0; i < wd.size(); ++i) {
    if (dt == DType::F32) {
      wf[i] = r.uniform(-1, 1);
      wd[i] = wf[i];
    } else if (dt == DType::BF16) {
      wh[i] = test::random_bf16(r);
      wd[i] = test::ref_bf16(wh[i]);
    } else {
      // Finite halfs of moderate size (a random bit pattern can be 65504).
      do wh[i] = test::random_f16(r);
      while (std::fabs(test::ref_f16(wh[i])) > 4);
      wd[i] = test::ref_f16(wh[i]);
    }
  }
  Tensor w(dt == DType::F32 ? static_cast<void*>(wf.data()) : wh.data(), dt, {N, K});
  std::vector<float> out(static_cast<size_t>(T * N), NAN);
  Tensor tx = test::f32(x, {T, K}), to = test::f32(out, {T, N});
  be.matmul(tx, w, to);
  std::vector<double> want(out.size());
  bool bad = false;
  for (int64_t t = 0; t < T && !bad; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        s += double(x[size_t(t * K + k)]) * wd[size_t(n * K + k)];
        mag += std::fabs(double(x[size_t(t * K + k)]) * wd[size_t(n * K + k)]);
      }
      const double got = out[size_t(t * N + n)];
      if (!(std::fabs(got - s) <= 1e-5 * mag + 1e-6)) {
        ADD_FAILURE() << "matmul " << dtype_name(dt) << " T=" << T << " N=" << N << " K=" << K << " out[" << t << ","
                      << n << "] = " << got << ", expected " << s << " (Σ|xw| " << mag << ")";
        bad = true;
        break;
      }
    }
}

TEST_F(CpuOps, MatmulAllDtypesAndShapes) {
  uint64_t seed = 100;
  int cases = 0;
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (int64_t T : {1, 2, 3, 17})
      for (int64_t K : {1, 7, 8, 33, 67, 160})  // below, at and off the 8- and 32-wide vector steps
        for (int64_t N : {1, 5, 19}) {
          check_matmul(*be, dt, T, N, K, ++seed);
          ++cases;
        }
  EXPECT_EQ(cases, 3 * 4 * 6 * 3);
}

TEST_F(CpuOps, MatmulRejectsMismatchedShapes) {
  std::vector<float> x(2 * 5), w(3 * 4), out(2 * 3);
  Tensor tx = test::f32(x, {2, 5}), tw = test::f32(w, {3, 4}), to = test::f32(out, {2, 3});
  EXPECT_THROW(be->matmul(tx, tw, to), Error);
}

// ---------------------------------------------------------------- RoPE

TEST_F(CpuOps, RopePartialNeoxSeveralRuns) {
  Rng r(7);
  const int64_t heads = 3, hd = 16;
  // Two runs of one batch at different positions (one far into a sequence), then a decode row.
  const std::vector<SeqRun> runs = {{0, 0, 0, 4}, {2, 1000, 4, 3}, {1, 4093, 7, 1}};
  const int64_t T = 8;
  for (int64_t rd : {int64_t(4), int64_t(8), hd})
    for (float theta : {1e4f, 1e7f}) {
      auto x = r.vec(size_t(T * heads * hd), -2, 2);
      std::vector<float> y = x;
      Tensor ty = test::f32(y, {T, heads, hd});
      be->rope(ty, runs, rd, theta);
      std::vector<double> want(x.begin(), x.end());
      std::vector<double> tol(x.size(), 0.0);
      const int64_t half = rd / 2;
      for (const SeqRun& run : runs)
        for (int32_t j = 0; j < run.count; ++j) {
          const double pos = run.pos0 + j;
          for (int64_t h = 0; h < heads; ++h) {
            const size_t base = size_t(((run.begin + j) * heads + h) * hd);
            for (int64_t i = 0; i < half; ++i) {
              const double ang = pos * std::pow(double(theta), -2.0 * double(i) / double(rd));
              const double a = x[base + size_t(i)], b = x[base + size_t(i + half)];
              want[base + size_t(i)] = a * std::cos(ang) - b * std::sin(ang);
              want[base + size_t(i + half)] = b * std::cos(ang) + a * std::sin(ang);
              // The op forms the angle in f32: its rounding (a few ulps of pos·inv_freq) moves
              // the result by about that many radians times |x|.
              const double t = 1e-6 + 4e-7 * ang * (std::fabs(a) + std::fabs(b));
              tol[base + size_t(i)] = tol[base + size_t(i + half)] = t;
            }
          }
        }
      for (size_t i = 0; i < y.size(); ++i) {
        if (tol[i] == 0) {
          ASSERT_EQ(y[i], x[i]) << "pass-through dim " << i % size_t(hd) << " changed (rotary_dim " << rd << ")";
        } else {
          ASSERT_NEAR(y[i], want[i], tol[i]) << "element " << i << " rotary_dim " << rd << " theta " << theta;
        }
      }
    }
  std::vector<float> x(static_cast<size_t>(T * heads * hd));
  Tensor tx = test::f32(x, {T, heads, hd});
  EXPECT_THROW(be->rope(tx, runs, 5, 1e4f), Error);       // odd rotary dim
  EXPECT_THROW(be->rope(tx, runs, hd + 2, 1e4f), Error);  // beyond head_dim
}

// ---------------------------------------------------------------- attention

struct AttnSetup {
  int64_t H, KVH, hd, slots, cap;
};

// Causal softmax attention per the contract, over the whole per-slot history `hk`/`hv`
// ([slots][cap][KVH][hd], already holding this batch's keys at their positions).
std::vector<double> naive_attention(const AttnSetup& s, const std::vector<float>& q, const std::vector<float>& hk,
                                    const std::vector<float>& hv, const std::vector<SeqRun>& runs, double scale,
                                    int64_t T) {
  const int64_t group = s.H / s.KVH;
  std::vector<double> out(static_cast<size_t>(T * s.H * s.hd), 0.0);
  for (const SeqRun& r : runs)
    for (int32_t j = 0; j < r.count; ++j)
      for (int64_t h = 0; h < s.H; ++h) {
        const int64_t t = r.begin + j, n_ctx = r.pos0 + j + 1, kvh = h / group;
        std::vector<double> sc(static_cast<size_t>(n_ctx));
        double mx = -INFINITY;
        for (int64_t p = 0; p < n_ctx; ++p) {
          double d = 0;
          for (int64_t i = 0; i < s.hd; ++i)
            d += double(q[size_t((t * s.H + h) * s.hd + i)]) *
                 hk[size_t(((r.slot * s.cap + p) * s.KVH + kvh) * s.hd + i)];
          sc[size_t(p)] = d * scale;
          mx = std::max(mx, sc[size_t(p)]);
        }
        double sum = 0;
        for (auto& v : sc) sum += v = std::exp(v - mx);
        for (int64_t p = 0; p < n_ctx; ++p)
          for (int64_t i = 0; i < s.hd; ++i)
            out[size_t((t * s.H + h) * s.hd + i)] +=
                sc[size_t(p)] / sum * hv[size_t(((r.slot * s.cap + p) * s.KVH + kvh) * s.hd + i)];
      }
  return out;
}

TEST_F(CpuOps, AttentionGqaSeveralRunsSlotsPositions) {
  for (int64_t ratio : {1, 2, 4}) {
    Rng r(uint64_t(10 + ratio));
    const AttnSetup s{4, 4 / ratio, 12, 3, 40};
    // Runs of one batch: a fresh prefill, a continuation at pos0 = 9, a decode at pos0 = 30.
    const std::vector<SeqRun> runs = {{1, 0, 0, 5}, {0, 9, 5, 4}, {2, 30, 9, 1}};
    const int64_t T = 10, row = s.KVH * s.hd;
    auto q = r.vec(size_t(T * s.H * s.hd), -2, 2), k = r.vec(size_t(T * row), -2, 2), v = r.vec(size_t(T * row));
    // Caches already hold earlier positions of each sequence (and garbage beyond).
    auto kc = r.vec(size_t(s.slots * s.cap * row), -2, 2), vc = r.vec(size_t(s.slots * s.cap * row));
    std::vector<float> hk = kc, hv = vc;  // expected cache contents after the call
    for (const SeqRun& run : runs)
      for (int32_t j = 0; j < run.count; ++j)
        for (int64_t i = 0; i < row; ++i) {
          hk[size_t((run.slot * s.cap + run.pos0 + j) * row + i)] = k[size_t((run.begin + j) * row + i)];
          hv[size_t((run.slot * s.cap + run.pos0 + j) * row + i)] = v[size_t((run.begin + j) * row + i)];
        }
    std::vector<float> out(q.size(), NAN);
    Tensor tq = test::f32(q, {T, s.H, s.hd}), tk = test::f32(k, {T, s.KVH, s.hd}), tv = test::f32(v, {T, s.KVH, s.hd});
    Tensor tkc = test::f32(kc, {s.slots, s.cap, s.KVH, s.hd}), tvc = test::f32(vc, {s.slots, s.cap, s.KVH, s.hd});
    Tensor to = test::f32(out, {T, s.H, s.hd});
    const double scale = 1.0 / std::sqrt(double(s.hd));
    be->attention(tq, tk, tv, tkc, tvc, runs, float(scale), to);
    EXPECT_EQ(kc, hk) << "k cache after append (ratio " << ratio << ")";
    EXPECT_EQ(vc, hv) << "v cache after append (ratio " << ratio << ")";
    expect_close(out, naive_attention(s, q, hk, hv, runs, scale, T), 1e-6, 1e-5,
                 "attention GQA ratio " + std::to_string(ratio));
  }
}

TEST_F(CpuOps, AttentionIncrementalDecodeEqualsOneShot) {
  Rng r(20);
  const AttnSetup s{4, 2, 8, 1, 16};
  const int64_t n = 11, prefill = 6, row = s.KVH * s.hd;
  auto q = r.vec(size_t(n * s.H * s.hd), -2, 2), k = r.vec(size_t(n * row), -2, 2), v = r.vec(size_t(n * row));
  const float scale = 0.3f;
  auto run_span = [&](std::vector<float>& kc, std::vector<float>& vc, int64_t t0, int64_t cnt, float* o) {
    std::vector<float> qs(q.begin() + t0 * s.H * s.hd, q.begin() + (t0 + cnt) * s.H * s.hd);
    std::vector<float> ks(k.begin() + t0 * row, k.begin() + (t0 + cnt) * row);
    std::vector<float> vs(v.begin() + t0 * row, v.begin() + (t0 + cnt) * row);
    std::vector<float> os(qs.size());
    Tensor tq = test::f32(qs, {cnt, s.H, s.hd}), tk = test::f32(ks, {cnt, s.KVH, s.hd}),
           tv = test::f32(vs, {cnt, s.KVH, s.hd}), to = test::f32(os, {cnt, s.H, s.hd});
    Tensor tkc = test::f32(kc, {s.slots, s.cap, s.KVH, s.hd}), tvc = test::f32(vc, {s.slots, s.cap, s.KVH, s.hd});
    const std::vector<SeqRun> runs = {{0, int32_t(t0), 0, int32_t(cnt)}};
    be->attention(tq, tk, tv, tkc, tvc, runs, scale, to);
    std::copy(os.begin(), os.end(), o);
  };
  std::vector<float> kc1(size_t(s.cap * row)), vc1 = kc1, kc2 = kc1, vc2 = kc1;
  std::vector<float> one(q.size()), inc(q.size());
  run_span(kc1, vc1, 0, n, one.data());
  run_span(kc2, vc2, 0, prefill, inc.data());
  for (int64_t t = prefill; t < n; ++t) run_span(kc2, vc2, t, 1, inc.data() + t * s.H * s.hd);
  expect_close(inc, one, 1e-6, 1e-6, "prefill + decode vs one shot");
  EXPECT_EQ(kc1, kc2);
  EXPECT_EQ(vc1, vc2);
}

TEST_F(CpuOps, AttentionRejectsBadSlotsAndCapacity) {
  const AttnSetup s{2, 1, 4, 2, 8};
  std::vector<float> q(static_cast<size_t>(2 * s.H * s.hd)), k(static_cast<size_t>(2 * s.hd)), v = k, out = q;
  std::vector<float> kc(static_cast<size_t>(s.slots * s.cap * s.hd)), vc = kc;
  Tensor tq = test::f32(q, {2, s.H, s.hd}), tk = test::f32(k, {2, 1, s.hd}), tv = test::f32(v, {2, 1, s.hd});
  Tensor tkc = test::f32(kc, {s.slots, s.cap, 1, s.hd}), tvc = test::f32(vc, {s.slots, s.cap, 1, s.hd});
  Tensor to = test::f32(out, {2, s.H, s.hd});
  for (const SeqRun& bad : {SeqRun{2, 0, 0, 2}, SeqRun{-1, 0, 0, 2}, SeqRun{0, 7, 0, 2}, SeqRun{0, -1, 0, 2}}) {
    const std::vector<SeqRun> runs = {bad};
    EXPECT_THROW(be->attention(tq, tk, tv, tkc, tvc, runs, 1.0f, to), Error)
        << "slot " << bad.slot << " pos0 " << bad.pos0;
  }
}

// A bf16 KV cache: append rounds k, v to nearest (ties to even), attention reads the stored
// values; the output is then exact attention over the rounded history (f32 tolerances).
uint16_t ref_round_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t lo = uint16_t(u >> 16), hi = uint16_t(lo + 1);  // truncation and the next value up in magnitude
  const double dl = std::abs(test::ref_bf16(lo) - double(f)), dh = std::abs(test::ref_bf16(hi) - double(f));
  if (dl != dh) return dl < dh ? lo : hi;
  return (lo & 1) ? hi : lo;
}

TEST_F(CpuOps, AttentionBf16CacheRoundsOnAppend) {
  Rng r(31);
  const AttnSetup s{4, 2, 12, 2, 24};
  const std::vector<SeqRun> runs = {{1, 0, 0, 5}, {0, 3, 5, 2}};
  const int64_t T = 7, row = s.KVH * s.hd, n_cache = s.slots * s.cap * row;
  auto q = r.vec(size_t(T * s.H * s.hd), -2, 2), k = r.vec(size_t(T * row), -2, 2), v = r.vec(size_t(T * row));
  std::vector<uint16_t> kc(static_cast<size_t>(n_cache)), vc = kc;
  for (size_t i = 0; i < kc.size(); ++i) {  // earlier positions: arbitrary bf16 values
    kc[i] = ref_round_bf16(r.uniform(-2, 2));
    vc[i] = ref_round_bf16(r.uniform(-1, 1));
  }
  std::vector<uint16_t> ek = kc, ev = vc;  // expected cache contents after the call
  for (const SeqRun& run : runs)
    for (int32_t j = 0; j < run.count; ++j)
      for (int64_t i = 0; i < row; ++i) {
        ek[size_t((run.slot * s.cap + run.pos0 + j) * row + i)] = ref_round_bf16(k[size_t((run.begin + j) * row + i)]);
        ev[size_t((run.slot * s.cap + run.pos0 + j) * row + i)] = ref_round_bf16(v[size_t((run.begin + j) * row + i)]);
      }
  std::vector<float> hk(ek.size()), hv(ev.size()), out(q.size(), NAN);
  for (size_t i = 0; i < ek.size(); ++i) hk[i] = float(test::ref_bf16(ek[i])), hv[i] = float(test::ref_bf16(ev[i]));
  Tensor tq = test::f32(q, {T, s.H, s.hd}), tk = test::f32(k, {T, s.KVH, s.hd}), tv = test::f32(v, {T, s.KVH, s.hd});
  Tensor tkc(kc.data(), DType::BF16, {s.slots, s.cap, s.KVH, s.hd}), tvc(vc.data(), DType::BF16, {s.slots, s.cap, s.KVH, s.hd});
  Tensor to = test::f32(out, {T, s.H, s.hd});
  const double scale = 1.0 / std::sqrt(double(s.hd));
  be->attention(tq, tk, tv, tkc, tvc, runs, float(scale), to);
  EXPECT_EQ(kc, ek) << "k cache after append";
  EXPECT_EQ(vc, ev) << "v cache after append";
  expect_close(out, naive_attention(s, q, hk, hv, runs, scale, T), 1e-6, 1e-5, "attention over a bf16 cache");
  // Mixed or unsupported cache types are refused.
  Tensor f32c = test::f32(hk, {s.slots, s.cap, s.KVH, s.hd});
  EXPECT_THROW(be->attention(tq, tk, tv, tkc, f32c, runs, float(scale), to), Error);
}

// ---------------------------------------------------------------- quantised KV caches
// fp8 e4m3 / q8_0 / q4_0 caches (formats: backend/kv_cache.h). The stored bytes are decoded
// here from the formats' definitions, independently of the code under test: e4m3 by its bit
// fields times the row's power-of-two scale; q8_0/q4_0 blocks as d·q rounded to f16, then
// rotated back with the explicit Hadamard matrix in double precision.

// Nearest f16 (ties to even) of a finite double inside the f16 range.
double ref_round_f16(double x) {
  const double a = std::fabs(x);
  if (a == 0) return x;
  const int e = std::max(std::ilogb(a), -14);  // subnormals share the step of 2^-14
  const double step = std::ldexp(1.0, e - 10);
  return std::copysign(std::nearbyint(a / step) * step, x);
}
double ref_e4m3(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const double v = e == 0 ? std::ldexp(double(m), -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (b & 0x80) ? -v : v;
}
// x = H·y with H[i][j] = (−1)^popcount(i & j) / √n (symmetric, orthonormal: its own inverse).
std::vector<double> ref_hadamard(const std::vector<double>& y) {
  const size_t n = y.size();
  std::vector<double> x(n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    double acc = 0;
    for (size_t j = 0; j < n; ++j) acc += (std::popcount(i & j) & 1) ? -y[j] : y[j];
    x[i] = acc / std::sqrt(double(n));
  }
  return x;
}
// One cached row as the attention must read it, in the original basis; *err2 receives the
// format's bound on the squared L2 error of that row against the value that was appended:
// e4m3 rounds to 3 mantissa bits (relative 2^-4, or half a subnormal step 2^-10·scale);
// q8_0 / q4_0 at most half a step |d|/2 (q4_0: a full step |d| on the side opposite its
// −8 end, clamped at 7) plus the f16 rounding of d·q, in the rotated basis, where the L2
// norm is the same.
std::vector<double> ref_kv_row(DType t, const uint8_t* row, float scale, int64_t hd, const float* appended,
                               double* err2) {
  std::vector<double> y(static_cast<size_t>(hd));
  *err2 = 0;
  if (t == DType::F8_E4M3) {
    for (int64_t i = 0; i < hd; ++i) {
      y[size_t(i)] = ref_e4m3(row[i]) * scale;
      if (appended) {
        const double b = 0.0625 * std::fabs(appended[i]) + std::ldexp(double(scale), -10);
        *err2 += b * b;
      }
    }
    return y;
  }
  const size_t block_bytes = t == DType::Q8_0 ? 34 : 18;
  for (int64_t b = 0; b < hd / 32; ++b) {
    const uint8_t* blk = row + size_t(b) * block_bytes;
    const double d = test::ref_f16(uint16_t(blk[0] | blk[1] << 8));
    for (int j = 0; j < 32; ++j) {
      const int qv = t == DType::Q8_0 ? int(int8_t(blk[2 + j])) : (j < 16 ? (blk[2 + j] & 15) : (blk[2 + j - 16] >> 4)) - 8;
      y[size_t(b * 32 + j)] = ref_round_f16(d * qv);
    }
    const double per = std::fabs(d) * (t == DType::Q8_0 ? 0.5 + 127 * 0x1p-11 : 1.0 + 8 * 0x1p-11);
    *err2 += 32 * per * per;
  }
  return ref_hadamard(y);
}

TEST_F(CpuOps, AttentionQuantizedCachesReadBackTheirDecodedValues) {
  for (DType t : {DType::F8_E4M3, DType::Q8_0, DType::Q4_0}) {
    const std::string name(dtype_name(t));
    Rng r(40 + uint64_t(t));
    const AttnSetup s{4, 2, 64, 2, 24};
    const std::vector<SeqRun> runs = {{1, 0, 0, 5}, {0, 3, 5, 2}};
    const int64_t T = 7, row = s.KVH * s.hd, n_rows = s.slots * s.cap * s.KVH;
    const size_t rb = dtype_row_bytes(t, s.hd), soff = kv_scale_offset(t, s.slots, s.cap, s.KVH, s.hd);
    auto q = r.vec(size_t(T * s.H * s.hd), -2, 2), k = r.vec(size_t(T * row), -2, 2), v = r.vec(size_t(T * row));
    // Every position starts out holding some encoded row (slot 0's positions 0..2 are read).
    std::vector<uint8_t> kc(kv_cache_bytes(t, s.slots, s.cap, s.KVH, s.hd)), vc = kc;
    auto scale_of = [&](const std::vector<uint8_t>& c, int64_t i) {  // row i = (slot, p, h) → [slot][h][p]
      const int64_t slot = i / (s.cap * s.KVH), p = i / s.KVH % s.cap, h = i % s.KVH;
      return const_cast<float*>(reinterpret_cast<const float*>(c.data() + soff)) + (slot * s.KVH + h) * s.cap + p;
    };
    std::vector<float> tmp(static_cast<size_t>(s.hd));
    float unused = 0;
    for (int64_t i = 0; i < n_rows; ++i) {
      const auto x = r.vec(size_t(s.hd), -2, 2), y = r.vec(size_t(s.hd));
      const bool f8 = t == DType::F8_E4M3;
      kv_encode_row(t, x.data(), s.hd, kc.data() + size_t(i) * rb, f8 ? scale_of(kc, i) : &unused, tmp.data());
      kv_encode_row(t, y.data(), s.hd, vc.data() + size_t(i) * rb, f8 ? scale_of(vc, i) : &unused, tmp.data());
    }
    const auto kc0 = kc, vc0 = vc;
    Tensor tq = test::f32(q, {T, s.H, s.hd}), tk = test::f32(k, {T, s.KVH, s.hd}), tv = test::f32(v, {T, s.KVH, s.hd});
    Tensor tkc(kc.data(), t, {s.slots, s.cap, s.KVH, s.hd}), tvc(vc.data(), t, {s.slots, s.cap, s.KVH, s.hd});
    std::vector<float> out(q.size(), NAN);
    Tensor to = test::f32(out, {T, s.H, s.hd});
    const double scale = 1.0 / std::sqrt(double(s.hd));
    be->attention(tq, tk, tv, tkc, tvc, runs, float(scale), to);

    // Appended rows: within the format's error of k, v; other rows (and scales) untouched.
    std::vector<float> hk(size_t(n_rows * s.hd)), hv(hk.size());
    for (int64_t i = 0; i < n_rows; ++i) {
      const int64_t slot = i / (s.cap * s.KVH), p = i / s.KVH % s.cap, h = i % s.KVH;
      int64_t src = -1;  // token row of k / v appended here
      for (const SeqRun& run : runs)
        if (run.slot == slot && p >= run.pos0 && p < run.pos0 + run.count) src = (run.begin + p - run.pos0) * row + h * s.hd;
      for (auto [c, c0, in, hist, nm] : {std::tuple{&kc, &kc0, &k, &hk, "k"}, std::tuple{&vc, &vc0, &v, &hv, "v"}}) {
        const float sc = t == DType::F8_E4M3 ? *scale_of(*c, i) : 1.0f;
        double err2 = 0;
        const float* appended = src >= 0 ? in->data() + src : nullptr;
        const auto dec = ref_kv_row(t, c->data() + size_t(i) * rb, sc, s.hd, appended, &err2);
        for (int64_t d = 0; d < s.hd; ++d) (*hist)[size_t(i * s.hd + d)] = float(dec[size_t(d)]);
        if (src < 0) {
          EXPECT_TRUE(std::equal(c->begin() + i * int64_t(rb), c->begin() + (i + 1) * int64_t(rb), c0->begin() + i * int64_t(rb)))
              << name << " " << nm << " cache row " << i << " changed";
          if (t == DType::F8_E4M3) {
            EXPECT_EQ(sc, *scale_of(*c0, i));
          }
          continue;
        }
        double e2 = 0;
        for (int64_t d = 0; d < s.hd; ++d) e2 += (dec[size_t(d)] - appended[d]) * (dec[size_t(d)] - appended[d]);
        EXPECT_LE(std::sqrt(e2), std::sqrt(err2) * (1 + 1e-9) + 1e-12)
            << name << " " << nm << ": appended row " << i << " reads back with L2 error " << std::sqrt(e2);
      }
    }
    // The output is attention over exactly those values (f32 rotations of q and the output:
    // a few 1e-7 relative).
    expect_close(out, naive_attention(s, q, hk, hv, runs, scale, T), 1e-5, 1e-4, "attention over a " + name + " cache");
  }
}

// Output error of each quantised cache against an f32 cache, on 27B-like heads (hd 256,
// G 6) over a 160-token prefill with q, k ~ U(−2, 2), v ~ U(−1, 1); printed and bounded.
// Where the error comes from: a value error δv moves the output by the softmax-weighted
// mean of δv; a key error moves a score by δs = scale·q·δk, scaling its weight by e^δs and
// moving the output by about δs·|v − o|. The first tokens attend to one or two positions, so
// the maximum is about the largest single-value error: fp8 half a mantissa step, 2^-4·|v| ≤
// 0.0625; q8_0 half a step d/2 with d ≈ 1.3/127 (block maxima of the rotated v, σ ≈ 0.58)
// ≈ 0.005, doubled by the score term; q4_0 up to a step d ≈ 1.3/8 ≈ 0.16. Later tokens
// average many positions, so the rms over all outputs is several times smaller. Measured on
// this data (CPU; the GPU kernels read the same values): max 0.053 / 0.0104 / 0.194, rms
// 0.0060 / 0.00135 / 0.0217 for fp8 / q8_0 / q4_0. The bounds are about twice those.
TEST_F(CpuOps, AttentionQuantizedCacheErrorAgainstF32Cache) {
  const AttnSetup s{6, 1, 256, 1, 160};
  const int64_t T = 160, row = s.KVH * s.hd;
  Rng r(77);
  auto q = r.vec(size_t(T * s.H * s.hd), -2, 2), k = r.vec(size_t(T * row), -2, 2), v = r.vec(size_t(T * row));
  const std::vector<SeqRun> runs = {{0, 0, 0, int32_t(T)}};
  const double scale = 1.0 / 16;
  auto run = [&](DType t) {
    std::vector<uint8_t> kc(kv_cache_bytes(t, s.slots, s.cap, s.KVH, s.hd)), vc = kc;
    Tensor tq = test::f32(q, {T, s.H, s.hd}), tk = test::f32(k, {T, s.KVH, s.hd}), tv = test::f32(v, {T, s.KVH, s.hd});
    Tensor tkc(kc.data(), t, {s.slots, s.cap, s.KVH, s.hd}), tvc(vc.data(), t, {s.slots, s.cap, s.KVH, s.hd});
    std::vector<float> out(q.size(), NAN);
    Tensor to = test::f32(out, {T, s.H, s.hd});
    be->attention(tq, tk, tv, tkc, tvc, runs, float(scale), to);
    return out;
  };
  const std::vector<float> ref = run(DType::F32);
  double ref_rms = 0;
  for (float x : ref) ref_rms += double(x) * x;
  ref_rms = std::sqrt(ref_rms / double(ref.size()));
  struct Bound {
    DType t;
    double max, rms;
  };
  for (auto [t, max_bound, rms_bound] : {Bound{DType::F8_E4M3, 0.1, 0.012}, Bound{DType::Q8_0, 0.02, 0.003},
                                         Bound{DType::Q4_0, 0.35, 0.045}}) {
    const std::vector<float> got = run(t);
    double worst = 0, rms = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double d = std::fabs(double(got[i]) - ref[i]);
      worst = std::max(worst, std::isnan(d) ? 1e30 : d);
      rms += d * d;
    }
    rms = std::sqrt(rms / double(got.size()));
    std::printf("[ kv cache ] %s cache vs f32 cache: max |error| %.5f, rms %.5f (output rms %.4f)\n",
                std::string(dtype_name(t)).c_str(), worst, rms, ref_rms);
    EXPECT_LE(worst, max_bound) << dtype_name(t) << " cache: largest attention output error against the f32 cache";
    EXPECT_LE(rms, rms_bound) << dtype_name(t) << " cache: rms attention output error against the f32 cache";
  }
}

// e4m3 conversion: every finite code round-trips; halfway values round to even; saturation.
TEST_F(CpuOps, Fp8E4m3ConversionRoundsToNearestEvenAndSaturates) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;  // NaN
    EXPECT_EQ(f8_e4m3_to_f32(uint8_t(b)), float(ref_e4m3(uint8_t(b)))) << "code " << b;
    EXPECT_EQ(f32_to_f8_e4m3(float(ref_e4m3(uint8_t(b)))), uint8_t(b)) << "code " << b;
    // Halfway to the next code up in magnitude: ties go to the even code.
    if ((b & 0x7f) < 0x7e) {
      const double mid = (ref_e4m3(uint8_t(b)) + ref_e4m3(uint8_t(b + 1))) / 2;
      EXPECT_EQ(f32_to_f8_e4m3(float(mid)), uint8_t((b & 1) ? b + 1 : b)) << "halfway above code " << b;
    }
  }
  EXPECT_EQ(f32_to_f8_e4m3(1e9f), 0x7e);
  EXPECT_EQ(f32_to_f8_e4m3(-500.0f), 0xfe);
  EXPECT_EQ(f32_to_f8_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(f32_to_f8_e4m3(0x1p-11f), 0x00);  // a quarter step: rounds to zero
  EXPECT_EQ(f32_to_f8_e4m3(NAN) & 0x7f, 0x7f);
}

// ---------------------------------------------------------------- causal conv1d

// Per channel: seq = [state, inputs]; out[t] = silu(Σ_j w[c, j] seq[t + j]); state = last K−1.
void naive_conv(const std::vector<float>& x, const std::vector<float>& w, std::vector<double>& state, int64_t n,
                int64_t C, int64_t K, std::vector<double>& out) {
  const int64_t S = K - 1;
  out.assign(size_t(n * C), 0.0);
  for (int64_t c = 0; c < C; ++c) {
    std::vector<double> seq(state.begin() + c * S, state.begin() + (c + 1) * S);
    for (int64_t t = 0; t < n; ++t) seq.push_back(x[size_t(t * C + c)]);
    for (int64_t t = 0; t < n; ++t) {
      double acc = 0;
      for (int64_t j = 0; j < K; ++j) acc += w[size_t(c * K + j)] * seq[size_t(t + j)];
      out[size_t(t * C + c)] = silu_d(acc);
    }
    for (int64_t i = 0; i < S; ++i) state[size_t(c * S + i)] = seq[size_t(n + i)];
  }
}

TEST_F(CpuOps, CausalConv1dStateCarriedAcrossCalls) {
  Rng r(30);
  const int64_t C = 11, K = 4, S = K - 1, n = 10;
  auto w = r.vec(size_t(C * K), -1, 1), x = r.vec(size_t(n * C), -2, 2), init = r.vec(size_t(C * S), -2, 2);
  std::vector<double> ref_state(init.begin(), init.end()), want;
  naive_conv(x, w, ref_state, n, C, K, want);
  Tensor tw = test::f32(w, {C, K});

  // Splits of the same n tokens: one call, token by token, and uneven pieces.
  const std::vector<std::vector<int64_t>> splits = {{10}, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, {3, 5, 2}, {1, 9}, {2, 8}};
  for (const auto& split : splits) {
    std::vector<float> y = x, st = init;
    Tensor tst = test::f32(st, {1, C, S});
    int64_t t0 = 0;
    for (int64_t cnt : split) {
      Tensor part(y.data() + t0 * C, DType::F32, {cnt, C});
      const std::vector<SeqRun> runs = {{0, int32_t(t0), 0, int32_t(cnt)}};
      be->causal_conv1d_silu(part, tw, tst, runs);
      t0 += cnt;
    }
    ASSERT_EQ(t0, n);
    const std::string what = "conv split of " + std::to_string(split.size()) + " calls";
    expect_close(y, want, 1e-6, 1e-5, what);
    expect_close(st, std::vector<double>(ref_state), 0, 0, what + " state");  // raw inputs, copied exactly
  }
}

TEST_F(CpuOps, CausalConv1dSeveralRunsSlots) {
  Rng r(31);
  const int64_t C = 6, K = 4, S = K - 1, slots = 3;
  auto w = r.vec(size_t(C * K));
  // One batch: slot 2 prefills 5 tokens, slot 0 decodes 1, slot 1 continues with 2 (short
  // runs read the previous state beyond their own inputs).
  const std::vector<SeqRun> runs = {{2, 0, 0, 5}, {0, 17, 5, 1}, {1, 4, 6, 2}};
  const int64_t T = 8;
  auto x = r.vec(size_t(T * C), -2, 2), st = r.vec(size_t(slots * C * S), -2, 2);
  const std::vector<float> st0 = st;
  std::vector<float> y = x;
  Tensor ty = test::f32(y, {T, C}), tw = test::f32(w, {C, K}), tst = test::f32(st, {slots, C, S});
  be->causal_conv1d_silu(ty, tw, tst, runs);
  for (const SeqRun& run : runs) {
    std::vector<float> xs(x.begin() + run.begin * C, x.begin() + (run.begin + run.count) * C);
    std::vector<double> rs(st0.begin() + run.slot * C * S, st0.begin() + (run.slot + 1) * C * S), want;
    naive_conv(xs, w, rs, run.count, C, K, want);
    expect_close(y.data() + run.begin * C, want.data(), want.size(), 1e-6, 1e-5,
                 "conv run in slot " + std::to_string(run.slot));
    expect_close(st.data() + run.slot * C * S, rs.data(), rs.size(), 0, 0,
                 "conv state of slot " + std::to_string(run.slot));
  }
}

// ---------------------------------------------------------------- DeltaNet gates

TEST_F(CpuOps, DeltanetGatesIncludingSoftplusThreshold) {
  Rng r(40);
  const int64_t T = 9, Hv = 6;
  std::vector<float> a(static_cast<size_t>(T * Hv)), b(static_cast<size_t>(T * Hv)), g(a.size()), beta(a.size());
  auto ane = r.vec(size_t(Hv), -8, -0.01f), dtb = r.vec(size_t(Hv), -2, 2);
  for (size_t i = 0; i < a.size(); ++i) {
    // Rows 0-2 ordinary, 3-5 around the threshold 20, 6-8 far above it (exp would overflow f32).
    const int64_t t = int64_t(i) / Hv;
    a[i] = t < 3 ? r.uniform(-10, 10) : t < 6 ? r.uniform(17, 23) : r.uniform(80, 200);
    b[i] = r.uniform(-12, 12);
  }
  Tensor ta = test::f32(a, {T, Hv}), tb = test::f32(b, {T, Hv}), tane = test::f32(ane, {Hv}),
         tdtb = test::f32(dtb, {Hv}), tg = test::f32(g, {T, Hv}), tbeta = test::f32(beta, {T, Hv});
  be->deltanet_gates(ta, tb, tane, tdtb, tg, tbeta);
  std::vector<double> wg(a.size()), wb(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const size_t h = i % size_t(Hv);
    const double x = double(a[i]) + dtb[h];
    // softplus(x) = log(1 + e^x); past 20 it equals x to double precision.
    const double sp = x > 20 ? x : std::log1p(std::exp(x));
    wg[i] = ane[h] * sp;
    wb[i] = sigmoid_d(b[i]);
  }
  expect_close(g, wg, 1e-6, 1e-5, "g");
  expect_close(beta, wb, 1e-7, 1e-6, "beta");
  for (float v : g) EXPECT_TRUE(std::isfinite(v) && v <= 0);
}

// ---------------------------------------------------------------- MoE

struct Route {
  std::vector<int32_t> ids;
  std::vector<double> w;
};

// Softmax, stable sort by probability descending (ties: lower id first), top-k, renormalise.
Route naive_route(const float* l, int64_t E, int64_t k, bool renorm) {
  double mx = -INFINITY, sum = 0;
  for (int64_t e = 0; e < E; ++e) mx = std::max(mx, double(l[e]));
  std::vector<double> p(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) sum += p[size_t(e)] = std::exp(double(l[e]) - mx);
  for (auto& v : p) v /= sum;
  std::vector<int32_t> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  Route rt;
  double top = 0;
  for (int64_t j = 0; j < k; ++j) top += p[size_t(order[size_t(j)])];
  for (int64_t j = 0; j < k; ++j) {
    rt.ids.push_back(order[size_t(j)]);
    rt.w.push_back(p[size_t(order[size_t(j)])] / (renorm ? top : 1.0));
  }
  return rt;
}

TEST_F(CpuOps, MoeRouteTopKTiesRenorm) {
  Rng r(50);
  const int64_t E = 8, T = 12;
  std::vector<float> logits(static_cast<size_t>(T * E));
  for (int64_t t = 0; t < T; ++t) {
    // Distinct logits 0.1 apart in a random order: no near-ties between float and double.
    std::vector<int32_t> perm(static_cast<size_t>(E));
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t i = E - 1; i > 0; --i) std::swap(perm[size_t(i)], perm[size_t(r.below(i + 1))]);
    for (int64_t e = 0; e < E; ++e) logits[size_t(t * E + e)] = float(perm[size_t(e)]) * 0.1f - 0.3f;
  }
  // Exact ties: all equal; pairs equal at the top; a tie straddling the k boundary.
  for (int64_t e = 0; e < E; ++e) logits[size_t(0 * E + e)] = 1.5f;
  for (int64_t e = 0; e < E; ++e) logits[size_t(1 * E + e)] = (e == 6 || e == 2) ? 3.0f : (e == 5 || e == 1) ? 2.0f : 0;
  for (int64_t e = 0; e < E; ++e) logits[size_t(2 * E + e)] = e == 4 ? 5.0f : (e % 3 == 0 ? 1.0f : -1.0f);
  for (int64_t k : {int64_t(1), int64_t(2), int64_t(3), int64_t(4), E})
    for (bool renorm : {false, true}) {
      std::vector<float> w(static_cast<size_t>(T * k));
      std::vector<int32_t> ids(static_cast<size_t>(T * k), -1);
      Tensor tl = test::f32(logits, {T, E}), tw = test::f32(w, {T, k}), ti = test::i32(ids, {T, k});
      be->moe_route(tl, k, renorm, tw, ti);
      for (int64_t t = 0; t < T; ++t) {
        const Route want = naive_route(logits.data() + t * E, E, k, renorm);
        for (int64_t j = 0; j < k; ++j) {
          ASSERT_EQ(ids[size_t(t * k + j)], want.ids[size_t(j)]) << "token " << t << " k " << k << " slot " << j;
          ASSERT_NEAR(w[size_t(t * k + j)], want.w[size_t(j)], 1e-6 * (1 + want.w[size_t(j)]))
              << "token " << t << " k " << k << " renorm " << renorm;
        }
      }
    }
  std::vector<float> w(static_cast<size_t>(T * (E + 1)));
  std::vector<int32_t> ids(w.size());
  Tensor tl = test::f32(logits, {T, E});
  Tensor tw0(w.data(), DType::F32, {T, 0}), ti0(ids.data(), DType::I32, {T, 0});
  EXPECT_THROW(be->moe_route(tl, 0, true, tw0, ti0), Error);
  Tensor tw9 = test::f32(w, {T, E + 1}), ti9 = test::i32(ids, {T, E + 1});
  EXPECT_THROW(be->moe_route(tl, E + 1, true, tw9, ti9), Error);
}

TEST_F(CpuOps, MoeExpertsWeightedSwigluSum) {
  Rng r(60);
  const int64_t E = 5, D = 24, I = 10, T = 7, k = 2;
  // Experts in mixed dtypes: even ones f32, odd ones bf16 (a model never mixes, the op may not care).
  std::vector<std::vector<float>> wf(size_t(E * 3));
  std::vector<std::vector<uint16_t>> wh(size_t(E * 3));
  std::vector<std::vector<double>> wd(size_t(E * 3));
  std::vector<MlpWeights> experts(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t shapes[3][2] = {{I, D}, {I, D}, {D, I}};
    Tensor* dst[3] = {&experts[size_t(e)].gate_proj, &experts[size_t(e)].up_proj, &experts[size_t(e)].down_proj};
    for (int m = 0; m < 3; ++m) {
      const size_t idx = size_t(e * 3 + m), n = size_t(shapes[m][0] * shapes[m][1]);
      if (e % 2 == 0) {
        wf[idx] = r.vec(n, -0.5f, 0.5f);
        wd[idx].assign(wf[idx].begin(), wf[idx].end());
        *dst[m] = Tensor(wf[idx].data(), DType::F32, {shapes[m][0], shapes[m][1]});
      } else {
        for (size_t i = 0; i < n; ++i) {
          wh[idx].push_back(uint16_t((std::bit_cast<uint32_t>(r.uniform(-0.5f, 0.5f))) >> 16));
          wd[idx].push_back(test::ref_bf16(wh[idx].back()));
        }
        *dst[m] = Tensor(wh[idx].data(), DType::BF16, {shapes[m][0], shapes[m][1]});
      }
    }
  }
  auto x = r.vec(size_t(T * D), -2, 2);
  std::vector<int32_t> ids = {0, 1, 4, 2, 2, 3, 1, 0, 3, 4, 0, 2, 1, 4};  // expert 2 and 0 shared by tokens
  std::vector<float> rw = r.vec(size_t(T * k), 0.05f, 1.0f), out(size_t(T * D), NAN);
  Tensor tx = test::f32(x, {T, D}), trw = test::f32(rw, {T, k}), tids = test::i32(ids, {T, k}),
         to = test::f32(out, {T, D});
  be->moe_experts(tx, trw, tids, experts, to);
  std::vector<double> want(out.size(), 0.0), mag(out.size(), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids[size_t(t * k + j)];
      const auto &G = wd[size_t(e * 3)], &U = wd[size_t(e * 3 + 1)], &Dn = wd[size_t(e * 3 + 2)];
      std::vector<double> act(static_cast<size_t>(I));
      for (int64_t i = 0; i < I; ++i) {
        double gs = 0, us = 0;
        for (int64_t d = 0; d < D; ++d) {
          gs += G[size_t(i * D + d)] * x[size_t(t * D + d)];
          us += U[size_t(i * D + d)] * x[size_t(t * D + d)];
        }
        act[size_t(i)] = silu_d(gs) * us;
      }
      for (int64_t d = 0; d < D; ++d) {
        double s = 0;
        for (int64_t i = 0; i < I; ++i) s += Dn[size_t(d * I + i)] * act[size_t(i)];
        want[size_t(t * D + d)] += rw[size_t(t * k + j)] * s;
      }
    }
  expect_close(out, want, 1e-5, 1e-4, "moe_experts");
  ids[3] = int32_t(E);
  EXPECT_THROW(be->moe_experts(tx, trw, tids, experts, to), Error);
}

// GGUF-quantized experts (Q4_K gate/up, Q6_K down) take the one-region pass over all routed
// experts on its exact path: the CUDA backend's per-32 int8 activations (cpu_dot_g32.h), its
// tiled kernels' arithmetic (dot_row_exact, silu_portable) and each token's pairs summed in
// routing order. It must give bitwise what each pair computed on its own in those terms gives,
// at decode and prefill sizes, with experts no token routes to; moe_expert_rows gives the
// pairs' rows themselves, and moe_combine_rows over them the same sums.
TEST_F(CpuOps, MoeExpertsQuantizedEqualPerExpertDots) {
  Rng r(61);
  const int64_t E = 6, D = 256, I = 512, k = 2;
  const test::QuantExperts q = test::quant_experts(r, E, D, I);
  const std::vector<MlpWeights>& experts = q.mlp;
  // One row of x times the rows of w (quantized per 32), as the pass computes them.
  auto project = [](const float* x, const Tensor& w) {
    const int64_t K = w.cols(), N = w.rows();
    std::vector<BlockQ8G32> xq(static_cast<size_t>(K / 256));
    std::vector<float> y(static_cast<size_t>(N));
    quantize_activation_g32(x, xq.data(), K);
    for (int64_t o = 0; o < N; ++o) y[size_t(o)] = dot_row_exact(w.dtype, w.row(o), xq.data(), K);
    return y;
  };
  for (int64_t T : {1, 9}) {
    auto x = r.vec(size_t(T * D), -2, 2);
    std::vector<int32_t> ids(size_t(T * k));
    for (int64_t t = 0; t < T; ++t) ids[size_t(t * k)] = int32_t((3 * t) % 5), ids[size_t(t * k + 1)] = int32_t((3 * t + 2) % 5);
    std::vector<float> rw = r.vec(size_t(T * k), 0.05f, 1.0f), out(size_t(T * D), NAN), want(size_t(T * D), 0.0f),
                       rows(size_t(T * k * D), NAN), rows_want(size_t(T * k * D)), summed(size_t(T * D), NAN);
    Tensor tx = test::f32(x, {T, D}), trw = test::f32(rw, {T, k}), tids = test::i32(ids, {T, k}),
           to = test::f32(out, {T, D}), trows = test::f32(rows, {T * k, D}), tsum = test::f32(summed, {T, D});
    be->moe_experts(tx, trw, tids, experts, to);  // expert 5 never routed
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) {  // routing order
        const MlpWeights& m = experts[size_t(ids[size_t(t * k + j)])];
        std::vector<float> g = project(x.data() + t * D, m.gate_proj);
        const std::vector<float> u = project(x.data() + t * D, m.up_proj);
        for (int64_t i = 0; i < I; ++i) g[size_t(i)] = silu_portable(g[size_t(i)]) * u[size_t(i)];
        const std::vector<float> y = project(g.data(), m.down_proj);
        std::copy(y.begin(), y.end(), rows_want.begin() + (t * k + j) * D);
        const float w = rw[size_t(t * k + j)];
        for (int64_t d = 0; d < D; ++d) want[size_t(t * D + d)] = std::fma(w, y[size_t(d)], want[size_t(t * D + d)]);
      }
    EXPECT_EQ(std::memcmp(out.data(), want.data(), out.size() * sizeof(float)), 0) << "T=" << T;
    ASSERT_TRUE(be->moe_expert_rows(tx, tids, experts, trows)) << "T=" << T;
    EXPECT_EQ(std::memcmp(rows.data(), rows_want.data(), rows.size() * sizeof(float)), 0) << "rows, T=" << T;
    be->moe_combine_rows(trows, trw, tids, E, nullptr, nullptr, tsum);
    EXPECT_EQ(std::memcmp(summed.data(), want.data(), summed.size() * sizeof(float)), 0) << "combined, T=" << T;
  }
}

}  // namespace
}  // namespace qwen36
