// Every CUDA op against its CPU reference (qwen36::cpu::*) on random inputs. Tolerances are
// relative to the largest reference magnitude (rel_err): f32-accumulating kernels ≤ 1e-5..1e-4,
// the prefill GEMM with activations rounded to bf16/f16 ≤ 1.5e-2.
#include <array>
#include <chrono>
#include <cstring>
#include <tuple>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "gpu_test_util.h"

namespace qwen36::cuda {  // test hooks of cuda_matmul_norm.cu
void norm_gemv_select(const char* mode);
void norm_gemv_select_warps(int warps);
long long norm_gemv_launches();
}  // namespace qwen36::cuda

namespace qwen36::gputest {
namespace {

class CudaOps : public CudaTest {};

// ---- matmul ----
struct MatmulCase {
  DType dt;
  int64_t T, N, K;
};

void check_matmul(Backend& gpu, std::mt19937& rng, const MatmulCase& c, double tol) {
  HostT x = random_t(rng, DType::F32, {c.T, c.K}), w = random_t(rng, c.dt, {c.N, c.K});
  HostT want(DType::F32, {c.T, c.N});
  cpu::matmul(x.t, w.t, want.t);
  DevT dx = upload(gpu, x), dw = upload(gpu, w), dout = upload(gpu, HostT(DType::F32, {c.T, c.N}));
  gpu.matmul(dx.t, dw.t, dout.t);
  const double e = rel_err(download(gpu, dout.t), want.floats());
  EXPECT_LE(e, tol) << dtype_name(c.dt) << " T=" << c.T << " N=" << c.N << " K=" << c.K;
}

TEST_F(CudaOps, MatmulGemvDecode) {  // T ≤ 8: f32 activations, f32 accumulation
  for (DType dt : {DType::BF16, DType::F16, DType::F32})
    for (int64_t T : {1, 2, 3, 5, 8})
      for (auto [N, K] : {std::pair<int64_t, int64_t>{64, 256}, {37, 100}, {300, 1032}, {9, 4104}, {48, 5120},
                          {2100, 520}})  // N ≤ 2048 with K % 8 == 0: split-K kernel; else row per warp
        check_matmul(*gpu_, rng_, {dt, T, N, K}, 2e-5);
}

TEST_F(CudaOps, MatmulGemmPrefillRoundsActivations) {  // T > 8: cuBLAS, activations → bf16/f16
  for (DType dt : {DType::BF16, DType::F16})
    for (int64_t T : {9, 64, 130})
      for (auto [N, K] : {std::pair<int64_t, int64_t>{64, 256}, {200, 1024}}) check_matmul(*gpu_, rng_, {dt, T, N, K}, 1.5e-2);
  for (int64_t T : {9, 70}) check_matmul(*gpu_, rng_, {DType::F32, T, 96, 200}, 1e-4);  // cublasSgemm
}

TEST_F(CudaOps, MatmulExactMode) {
  CudaOptions o;
  o.exact_matmul = true;
  auto exact = make_cuda_backend(o);
  for (DType dt : {DType::BF16, DType::F16, DType::F32})
    for (int64_t T : {9, 100}) check_matmul(*exact, rng_, {dt, T, 70, 264}, 2e-5);
}

// Decode GEMV on the 27B's large matrices: correct, and its bandwidth (printed; the ≥ 85%
// target is checked by `qwen36 bench`, this reports the kernel alone).
TEST_F(CudaOps, GemvBandwidth27B) {
  const double copy = cuda_copy_bandwidth_gbs(size_t(1) << 30, 5);
  for (auto [N, K] : {std::pair<int64_t, int64_t>{17408, 5120}, {5120, 17408}, {10240, 5120}}) {
    HostT x = random_t(rng_, DType::F32, {1, K}), w = random_t(rng_, DType::BF16, {N, K});
    DevT dx = upload(*gpu_, x), dw = upload(*gpu_, w), dout = upload(*gpu_, HostT(DType::F32, {1, N}));
    gpu_->matmul(dx.t, dw.t, dout.t);
    const std::vector<float> got = download(*gpu_, dout.t);
    double worst = 0;
    std::vector<float> row(static_cast<size_t>(K));
    for (int64_t n = 0; n < N; n += 997) {  // spot-check rows against the CPU
      cpu::weight_row_to_f32(w.t, n, row.data());
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(row[size_t(k)]) * x.f()[k];
      worst = std::max(worst, std::abs(s - got[size_t(n)]));
    }
    EXPECT_LE(worst, 1e-3);
    const int reps = 50;
    cuda_synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) gpu_->matmul(dx.t, dw.t, dout.t);
    cuda_synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    const double gbs = double(w.t.nbytes()) / s / 1e9;
    std::printf("[ gemv ] bf16 %lld x %lld, T=1: %.1f us, %.0f GB/s = %.1f%% of copy bandwidth %.0f GB/s\n",
                (long long)N, (long long)K, s * 1e6, gbs, 100 * gbs / copy, copy);
  }
}

// Decode GEMV bandwidth with the weights NOT in L2: a decode step streams every matrix once,
// so the test rotates over copies of each matrix adding up to > 4× the 60 MB L2 (the test
// above re-reads one matrix and can hit L2). Printed for the row-per-warp and the split-K
// kernels, and for the DeltaNet projections as one matmul_multi vs four matmuls.
TEST_F(CudaOps, GemvBandwidthColdL2) {
  const double copy = cuda_copy_bandwidth_gbs(size_t(1) << 30, 5);
  struct Case {
    std::vector<int64_t> rows;
    int64_t K;
  };
  for (const Case& cs : {Case{{17408}, 5120}, Case{{5120}, 17408}, Case{{5120}, 6144}, Case{{10240, 6144, 48, 48}, 5120}}) {
    int64_t total = 0;
    for (int64_t n : cs.rows) total += n;
    const int copies = int(std::max<int64_t>(2, (256ll << 20) / (total * cs.K * 2) + 1));
    HostT x = random_t(rng_, DType::F32, {1, cs.K}), w = random_t(rng_, DType::BF16, {total, cs.K});
    DevT dx = upload(*gpu_, x);
    std::vector<DevT> dw;
    for (int i = 0; i < copies; ++i) dw.push_back(upload(*gpu_, w));
    std::vector<DevT> dout;
    for (int64_t n : cs.rows) dout.push_back(upload(*gpu_, HostT(DType::F32, {1, n})));
    for (const char* mode : {"multi", "warp", "split"}) {
      if (cs.rows.size() == 1 && std::string(mode) == "multi") continue;
      setenv("QWEN36_GEMV_SPLIT_ROWS", std::string(mode) == "split" ? "100000000" : "2048", 1);
      auto gpu = make_cuda_backend();
      unsetenv("QWEN36_GEMV_SPLIT_ROWS");
      auto step = [&](int i) {
        std::vector<Tensor> ws;
        int64_t r0 = 0;
        for (int64_t n : cs.rows) {
          ws.emplace_back(static_cast<uint8_t*>(dw[size_t(i)].t.data) + size_t(r0 * cs.K) * 2, DType::BF16,
                          std::initializer_list<int64_t>{n, cs.K});
          r0 += n;
        }
        if (std::string(mode) == "multi") {
          std::vector<const Tensor*> wp;
          std::vector<Tensor*> op;
          for (size_t j = 0; j < ws.size(); ++j) wp.push_back(&ws[j]), op.push_back(&dout[j].t);
          gpu->matmul_multi(dx.t, wp, op);
        } else {
          for (size_t j = 0; j < ws.size(); ++j) gpu->matmul(dx.t, ws[j], dout[j].t);
        }
      };
      for (int i = 0; i < copies; ++i) step(i);
      const int reps = 10 * copies;
      cuda_synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) step(r % copies);
      cuda_synchronize();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
      const double gbs = double(total * cs.K * 2) / s / 1e9;
      std::printf("[ gemv-cold ] %s %lld rows (%zu matrices) x %lld: %.1f us, %.0f GB/s = %.1f%% of copy %.0f GB/s\n",
                  mode, (long long)total, cs.rows.size(), (long long)cs.K, s * 1e6, gbs, 100 * gbs / copy, copy);
      // every copy holds the same weights: the last step's outputs are the product with w
      const std::vector<float> got = download(*gpu, dout[0].t);
      std::vector<float> row(static_cast<size_t>(cs.K));
      for (int64_t n = 0; n < cs.rows[0]; n += 991) {
        cpu::weight_row_to_f32(w.t, n, row.data());
        double want = 0;
        for (int64_t k = 0; k < cs.K; ++k) want += double(row[size_t(k)]) * x.f()[k];
        EXPECT_NEAR(got[size_t(n)], want, 1e-3) << mode << " row " << n;
      }
    }
  }
}

// Prefill GEMM throughput at T = 4096 for the 27B's projection shapes (printed; cuBLAS picks
// the kernel): where a prefill profile shows a matmul far below the bf16 peak, this tells
// whether the GEMM or the work around it is slow. Spot-checked against the CPU.
TEST_F(CudaOps, PrefillGemmThroughput27B) {
  const int64_t T = 4096, K = 5120;
  HostT x = random_t(rng_, DType::F32, {T, K});
  DevT dx = upload(*gpu_, x);
  for (int64_t N : {16480, 10240, 6144, 17408, 34816, 12288}) {
    HostT w = random_t(rng_, DType::BF16, {N, K});
    DevT dw = upload(*gpu_, w), dout = upload(*gpu_, HostT(DType::F32, {T, N}));
    gpu_->matmul(dx.t, dw.t, dout.t);
    cuda_synchronize();
    const int reps = 5;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) gpu_->matmul(dx.t, dw.t, dout.t);
    cuda_synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    std::printf("[ gemm ] bf16 T=%lld N=%lld K=%lld: %.3f ms, %.0f TFLOP/s (rounding of x included)\n", (long long)T,
                (long long)N, (long long)K, s * 1e3, 2.0 * double(T) * double(N) * double(K) / s / 1e12);
    const std::vector<float> got = download(*gpu_, dout.t);
    std::vector<float> row(static_cast<size_t>(K));
    cpu::weight_row_to_f32(w.t, N - 1, row.data());
    double want = 0;
    for (int64_t k = 0; k < K; ++k) want += double(row[size_t(k)]) * x.f()[(T - 1) * K + k];
    EXPECT_NEAR(got[size_t((T - 1) * N + N - 1)], want, 0.05 * std::max(1.0, std::abs(want))) << N;
  }
}

// ---- elementwise and norms ----
TEST_F(CudaOps, EmbedAllDtypes) {
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
    HostT table = random_t(rng_, dt, {50, 72});
    const std::vector<int32_t> ids{3, 0, 49, 3, 17};
    HostT want(DType::F32, {5, 72});
    cpu::embed(table.t, ids, want.t);
    DevT dt_ = upload(*gpu_, table), out = upload(*gpu_, HostT(DType::F32, {5, 72}));
    gpu_->embed(dt_.t, ids, out.t);
    EXPECT_EQ(rel_err(download(*gpu_, out.t), want.floats()), 0.0);
    const std::vector<int32_t> bad{50};
    Tensor one = out.t;
    one.shape[0] = 1;
    EXPECT_THROW(gpu_->embed(dt_.t, bad, one), Error);
  }
}

TEST_F(CudaOps, RmsNormAndGated) {
  for (int64_t D : {16, 100, 256, 5120}) {
    HostT x = random_t(rng_, DType::F32, {7, D}, -3, 3), z = random_t(rng_, DType::F32, {7, D}, -3, 3),
          w = random_t(rng_, DType::F32, {D}, 0.5f, 1.5f);
    HostT want(DType::F32, {7, D}), want_g(DType::F32, {7, D});
    cpu::rms_norm(x.t, w.t, 1e-6f, want.t);
    cpu::gated_rms_norm(x.t, z.t, w.t, 1e-6f, want_g.t);
    DevT dx = upload(*gpu_, x), dz = upload(*gpu_, z), dw = upload(*gpu_, w), o = upload(*gpu_, HostT(DType::F32, {7, D}));
    gpu_->rms_norm(dx.t, dw.t, 1e-6f, o.t);
    EXPECT_LE(rel_err(download(*gpu_, o.t), want.floats()), 1e-5) << D;
    gpu_->gated_rms_norm(dx.t, dz.t, dw.t, 1e-6f, o.t);
    EXPECT_LE(rel_err(download(*gpu_, o.t), want_g.floats()), 1e-5) << D;
    gpu_->rms_norm(dx.t, dw.t, 1e-6f, dx.t);  // in place, as the model uses it
    EXPECT_LE(rel_err(download(*gpu_, dx.t), want.floats()), 1e-5) << D;
  }
}

// The fused decode forms against their definition (the composed CPU ops): one launch for
// several matrices sharing x (mixed sizes, as DeltaNet's 10240/6144/48/48-row projections),
// and gate/up with the SwiGLU. f32 accumulation like the plain GEMV: 2e-5.
TEST_F(CudaOps, FusedMatmulMultiAndSwiglu) {
  // K = 1024 at one token, bf16 / f16: the one-wave multi GEMV requesting whole rows before its wait.
  for (DType dt : {DType::BF16, DType::F16, DType::F32})
    for (int64_t T : {1, 3, 8})
      for (int64_t K : {264, 1024}) {
        HostT x = random_t(rng_, DType::F32, {T, K});
        DevT dx = upload(*gpu_, x);
        std::vector<HostT> want;
        std::vector<DevT> dw;
        std::vector<const Tensor*> ws;
        for (int64_t N : {300, 7, 48, 1}) {
          const HostT w = random_t(rng_, dt, {N, K});
          want.emplace_back(DType::F32, std::initializer_list<int64_t>{T, N});
          cpu::matmul(x.t, w.t, want.back().t);
          dw.push_back(upload(*gpu_, w));
        }
        for (const DevT& d : dw) ws.push_back(&d.t);
        const auto got = matmul_multi_outputs(*gpu_, dx.t, ws);
        for (size_t i = 0; i < 4; ++i)
          EXPECT_LE(rel_err(got[i], want[i].floats()), 2e-5)
              << dtype_name(dt) << " T=" << T << " K=" << K << " matrix " << i;

        HostT g = random_t(rng_, dt, {130, K}), u = random_t(rng_, dt, {130, K});
        HostT gw(DType::F32, {T, 130}), uw(DType::F32, {T, 130});
        cpu::matmul(x.t, g.t, gw.t);
        cpu::matmul(x.t, u.t, uw.t);
        cpu::swiglu(gw.t, uw.t, gw.t);
        DevT dg = upload(*gpu_, g), du = upload(*gpu_, u), go = upload(*gpu_, HostT(DType::F32, {T, 130})),
             uo = upload(*gpu_, HostT(DType::F32, {T, 130}));
        gpu_->matmul_swiglu(dx.t, dg.t, du.t, go.t, uo.t);
        EXPECT_LE(rel_err(download(*gpu_, go.t), gw.floats()), 2e-5)
            << dtype_name(dt) << " T=" << T << " K=" << K << " swiglu";
      }
}

// A batch step's MoE router and shared-expert gate (f32, 256 + 1 rows, K = 2048) at 8 < T ≤ 64:
// one matmul_multi takes them as the GEMV over 8-token chunks (and a launch for the T % 8 left);
// f32 accumulation as the GEMV: 2e-5. Printed: its time at 64 tokens against the two matrices
// through matmul (cuBLAS's SGEMM and GEMV), launches queued back to back.
TEST_F(CudaOps, SmallF32MatmulsInTokenChunks) {
  const int64_t K = 2048, rows[] = {256, 1};
  for (int64_t T : {9, 16, 21, 64}) {
    HostT x = random_t(rng_, DType::F32, {T, K});
    DevT dx = upload(*gpu_, x);
    std::vector<HostT> want;
    std::vector<DevT> dw, dout, dref;
    for (int64_t N : rows) {
      HostT w = random_t(rng_, DType::F32, {N, K});
      want.emplace_back(DType::F32, std::initializer_list<int64_t>{T, N});
      cpu::matmul(x.t, w.t, want.back().t);
      dw.push_back(upload(*gpu_, w));
      dout.push_back(upload(*gpu_, HostT(DType::F32, {T, N})));
      dref.push_back(upload(*gpu_, HostT(DType::F32, {T, N})));
    }
    const Tensor* ws[] = {&dw[0].t, &dw[1].t};
    Tensor* outs[] = {&dout[0].t, &dout[1].t};
    gpu_->matmul_multi(dx.t, ws, outs);
    for (size_t i = 0; i < 2; ++i)
      EXPECT_LE(rel_err(download(*gpu_, dout[i].t), want[i].floats()), 2e-5) << "T=" << T << " matrix " << i;
    if (T != 64) continue;
    auto time_us = [&](const std::function<void()>& f) {
      const int reps = 200;
      for (int r = 0; r < 10; ++r) f();
      cuda_synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) f();
      cuda_synchronize();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps * 1e6;
    };
    const double chunks = time_us([&] { gpu_->matmul_multi(dx.t, ws, outs); });
    const double each = time_us([&] {
      for (size_t i = 0; i < 2; ++i) gpu_->matmul(dx.t, dw[i].t, dref[i].t);
    });
    std::printf("[ router ] f32 256 + 1 rows x %lld, T=%lld: 8-token chunks %.1f us, matmul each (cuBLAS) %.1f us\n",
                (long long)K, (long long)T, chunks, each);
  }
}

// Prefill forms: a group stored back to back (as prepare_weights lays out a checkpoint) has its
// activations rounded to bf16/f16 once; matrices of 256 rows or more are GEMMs of their own
// into their outputs, runs of smaller ones share one GEMM and are copied out (the row sets
// cover both; 1.5e-2, as the plain prefill GEMM). The SwiGLU reads gate/up products rounded to
// the 16-bit type (a further 2^-8 relative: same bound); I = 100 takes its scalar kernel, I = 96
// (whole 16-byte words) the 8-wide one.
TEST_F(CudaOps, FusedMatmulPrefillOverContiguousWeights) {
  const std::vector<std::vector<int64_t>> row_sets{{200, 48, 48, 7}, {300, 48, 48, 264, 7}};
  for (DType dt : {DType::BF16, DType::F16})
    for (int64_t T : {9, 100})
      for (const std::vector<int64_t>& rows : row_sets) {
        const int64_t K = 256;
        int64_t total = 0;
        for (int64_t n : rows) total += n;
        HostT x = random_t(rng_, DType::F32, {T, K}), all = random_t(rng_, dt, {total, K});
        DevT dx = upload(*gpu_, x), dall = upload(*gpu_, all);
        std::vector<Tensor> dw;
        std::vector<HostT> want;
        std::vector<DevT> dout;
        int64_t r0 = 0;
        for (int64_t n : rows) {
          HostT w(dt, {n, K});
          std::memcpy(w.t.data, static_cast<const uint8_t*>(all.t.data) + size_t(r0 * K) * 2, size_t(n * K) * 2);
          want.emplace_back(DType::F32, std::initializer_list<int64_t>{T, n});
          cpu::matmul(x.t, w.t, want.back().t);
          dw.emplace_back(static_cast<uint8_t*>(dall.t.data) + size_t(r0 * K) * 2, dt, std::initializer_list<int64_t>{n, K});
          dout.push_back(upload(*gpu_, HostT(DType::F32, {T, n})));
          r0 += n;
        }
        std::vector<const Tensor*> ws;
        std::vector<Tensor*> outs;
        for (size_t i = 0; i < rows.size(); ++i) ws.push_back(&dw[i]), outs.push_back(&dout[i].t);
        gpu_->matmul_multi(dx.t, ws, outs);
        for (size_t i = 0; i < rows.size(); ++i)
          EXPECT_LE(rel_err(download(*gpu_, dout[i].t), want[i].floats()), 1.5e-2)
              << dtype_name(dt) << " T=" << T << " matrix " << i << " of " << rows.size();

        for (int64_t I : {100, 96}) {  // gate = rows [0, I), up = rows [I, 2I) of the same block
          const size_t bytes = size_t(I * K) * 2;
          HostT g(dt, {I, K}), u(dt, {I, K});
          std::memcpy(g.t.data, all.t.data, bytes);
          std::memcpy(u.t.data, static_cast<const uint8_t*>(all.t.data) + bytes, bytes);
          HostT gw(DType::F32, {T, I}), uw(DType::F32, {T, I});
          cpu::matmul(x.t, g.t, gw.t);
          cpu::matmul(x.t, u.t, uw.t);
          cpu::swiglu(gw.t, uw.t, gw.t);
          const Tensor dg(dall.t.data, dt, {I, K}), du(static_cast<uint8_t*>(dall.t.data) + bytes, dt, {I, K});
          DevT go = upload(*gpu_, HostT(DType::F32, {T, I})), uo = upload(*gpu_, HostT(DType::F32, {T, I}));
          gpu_->matmul_swiglu(dx.t, dg, du, go.t, uo.t);
          EXPECT_LE(rel_err(download(*gpu_, go.t), gw.floats()), 1.5e-2) << dtype_name(dt) << " T=" << T << " I=" << I;

          // the whole MLP: the SwiGLU result enters the down GEMM in the 16-bit type, as the
          // composed path's matmul would round it
          HostT down = random_t(rng_, dt, {K, I}), mw(DType::F32, {T, K});
          cpu::matmul(gw.t, down.t, mw.t);
          DevT ddown = upload(*gpu_, down), mo = upload(*gpu_, HostT(DType::F32, {T, K}));
          MlpWeights m{dg, du, ddown.t};
          gpu_->mlp(dx.t, m, go.t, uo.t, mo.t);
          EXPECT_LE(rel_err(download(*gpu_, mo.t), mw.floats()), 1.5e-2) << dtype_name(dt) << " T=" << T << " I=" << I << " mlp";
        }
      }
}

// The layer forms at prefill over bf16 weights (the norm writing x's bf16 rounding for the
// GEMMs: no rounding kernel) are their compositions, add_rms_norm_into then matmul_multi / mlp,
// bit for bit: the same floats rounded the same way, the same GEMMs. x and y_out too.
TEST_F(CudaOps, NormPrefillFormsAreTheComposition) {
  const int64_t T = 100, D = 256, I = 96;
  const std::vector<int64_t> rows{300, 48, 48};
  HostT y = random_t(rng_, DType::F32, {T, D}, -3, 3), d = random_t(rng_, DType::F32, {T, D}, -3, 3),
        nw = random_t(rng_, DType::F32, {D}, 0.5f, 1.5f), all = random_t(rng_, DType::BF16, {396, D});
  DevT dy = upload(*gpu_, y), dd = upload(*gpu_, d), dnw = upload(*gpu_, nw), dall = upload(*gpu_, all);
  std::vector<Tensor> dw;
  for (int64_t r0 = 0; int64_t n : rows) {
    dw.emplace_back(static_cast<uint8_t*>(dall.t.data) + size_t(r0 * D) * 2, DType::BF16, std::initializer_list<int64_t>{n, D});
    r0 += n;
  }
  const Tensor* ws[] = {&dw[0], &dw[1], &dw[2]};
  auto fresh = [&](int64_t cols) { return upload(*gpu_, HostT(DType::F32, {T, cols})); };
  // the composition
  DevT y1 = fresh(D), x1 = fresh(D), a1 = fresh(300), b1 = fresh(48), c1 = fresh(48);
  Tensor* outs1[] = {&a1.t, &b1.t, &c1.t};
  gpu_->add_rms_norm_into(dy.t, dd.t, y1.t, dnw.t, 1e-6f, x1.t);
  gpu_->matmul_multi(x1.t, ws, outs1);
  // the layer form
  DevT y2 = fresh(D), x2 = fresh(D), a2 = fresh(300), b2 = fresh(48), c2 = fresh(48);
  Tensor* outs2[] = {&a2.t, &b2.t, &c2.t};
  gpu_->add_rms_norm_matmul_multi(dy.t, dd.t, y2.t, dnw.t, 1e-6f, x2.t, ws, outs2);
  EXPECT_EQ(download(*gpu_, y2.t), download(*gpu_, y1.t));
  EXPECT_EQ(download(*gpu_, x2.t), download(*gpu_, x1.t));
  EXPECT_EQ(download(*gpu_, a2.t), download(*gpu_, a1.t));
  EXPECT_EQ(download(*gpu_, b2.t), download(*gpu_, b1.t));
  EXPECT_EQ(download(*gpu_, c2.t), download(*gpu_, c1.t));

  // the MLP: gate = rows [0, I), up = rows [I, 2I) of the block, down its own matrix
  const Tensor dg(dall.t.data, DType::BF16, {I, D}), du(static_cast<uint8_t*>(dall.t.data) + size_t(I * D) * 2,
                                                        DType::BF16, {I, D});
  DevT ddown = upload(*gpu_, random_t(rng_, DType::BF16, {D, I}));
  const MlpWeights m{dg, du, ddown.t};
  DevT g1 = fresh(I), u1 = fresh(I), o1 = fresh(D), g2 = fresh(I), u2 = fresh(I), o2 = fresh(D);
  gpu_->add_rms_norm_into(dy.t, dd.t, y1.t, dnw.t, 1e-6f, x1.t);
  gpu_->mlp(x1.t, m, g1.t, u1.t, o1.t);
  gpu_->add_rms_norm_mlp(dy.t, dd.t, y2.t, dnw.t, 1e-6f, x2.t, m, g2.t, u2.t, o2.t);
  EXPECT_EQ(download(*gpu_, y2.t), download(*gpu_, y1.t));
  EXPECT_EQ(download(*gpu_, x2.t), download(*gpu_, x1.t));
  EXPECT_EQ(download(*gpu_, o2.t), download(*gpu_, o1.t));
}

// One token over 16-bit weights: the GEMV's blocks compute the norm themselves (cuda_matmul_norm.cu),
// bitwise the norm launch followed by the GEMVs. Shapes: the 35B-A3B's router + shared expert
// (K = 2048, a grid of at most two blocks a SM: whole rows a round), projections of more blocks
// (four loads a row in flight), the 27B's K = 5120 (a thread's five quads of the row), a row of
// fewer quads than threads and one of a partial warp of quads; f16 once. Blocks of 8 warps and
// of 16 (QWEN36_NORM_GEMV16_WARPS) for the GEMVs that do not take whole rows a round.
TEST_F(CudaOps, NormInOneTokenGemvIsTheComposition) {
  struct Case {
    DType dt;
    int64_t K;
    std::vector<int64_t> rows;
    int64_t I;  // the MLP's intermediate size
  };
  const Case cases[] = {{DType::BF16, 2048, {256, 1, 512, 512}, 512},
                        {DType::BF16, 2048, {3000, 48, 48}, 1000},
                        {DType::BF16, 5120, {600, 40}, 700},
                        {DType::F16, 1024, {300, 20}, 130},
                        {DType::BF16, 96, {40, 3}, 24}};
  struct Restore {
    ~Restore() { cuda::norm_gemv_select(nullptr), cuda::norm_gemv_select_warps(0); }
  } restore;
  cuda::norm_gemv_select("on");  // every form, whatever the default takes
  for (int warps : {8, 16}) {  // blocks of the GEMVs that do not take whole rows a round
    for (const Case& c : cases) {
      cuda::norm_gemv_select_warps(warps);
      const int64_t K = c.K;
      const std::string what =
          std::string(dtype_name(c.dt)) + " K=" + std::to_string(K) + " warps=" + std::to_string(warps);
      HostT y = random_t(rng_, DType::F32, {1, K}, -3, 3), d = random_t(rng_, DType::F32, {1, K}, -3, 3),
            nw = random_t(rng_, DType::F32, {K}, 0.5f, 1.5f);
      DevT dy = upload(*gpu_, y), dd = upload(*gpu_, d), dnw = upload(*gpu_, nw);
      std::vector<DevT> dw;
      std::vector<const Tensor*> ws;
      for (int64_t n : c.rows) dw.push_back(upload(*gpu_, random_t(rng_, c.dt, {n, K})));
      for (const DevT& w : dw) ws.push_back(&w.t);
      auto fresh = [&](int64_t cols) { return upload(*gpu_, HostT(DType::F32, {1, cols})); };
      auto outs_of = [&](std::vector<DevT>& o) {
        std::vector<Tensor*> p;
        for (int64_t n : c.rows) o.push_back(fresh(n));
        for (DevT& t : o) p.push_back(&t.t);
        return p;
      };
      // the composition, then the layer form
      std::vector<DevT> o1, o2;
      const std::vector<Tensor*> outs1 = outs_of(o1), outs2 = outs_of(o2);
      DevT y1 = fresh(K), x1 = fresh(K), y2 = fresh(K), x2 = fresh(K);
      gpu_->add_rms_norm_into(dy.t, dd.t, y1.t, dnw.t, 1e-6f, x1.t);
      gpu_->matmul_multi(x1.t, ws, outs1);
      const long long before = cuda::norm_gemv_launches();
      gpu_->add_rms_norm_matmul_multi(dy.t, dd.t, y2.t, dnw.t, 1e-6f, x2.t, ws, outs2);
      EXPECT_EQ(cuda::norm_gemv_launches(), before + 1) << what << ": the norm-computing GEMV was not taken";
      EXPECT_EQ(download(*gpu_, dy.t), y.floats()) << what << ": y was written";
      EXPECT_EQ(download(*gpu_, y2.t), download(*gpu_, y1.t)) << what;
      EXPECT_EQ(download(*gpu_, x2.t), download(*gpu_, x1.t)) << what;
      for (size_t i = 0; i < o1.size(); ++i)
        EXPECT_EQ(download(*gpu_, o2[i].t), download(*gpu_, o1[i].t)) << what << " matrix " << i;
      // and against the CPU's layer form
      HostT cy(DType::F32, {1, K}), cx(DType::F32, {1, K});
      cpu::add_rms_norm_into(y.t, d.t, cy.t, nw.t, 1e-6f, cx.t);
      EXPECT_LE(rel_err(download(*gpu_, x2.t), cx.floats()), 1e-5) << what;

      // the MLP (gate + up + SwiGLU, then down)
      const int64_t I = c.I;
      DevT dg = upload(*gpu_, random_t(rng_, c.dt, {I, K})), du = upload(*gpu_, random_t(rng_, c.dt, {I, K})),
           ddown = upload(*gpu_, random_t(rng_, c.dt, {K, I}));
      const MlpWeights m{dg.t, du.t, ddown.t};
      DevT g1 = fresh(I), u1 = fresh(I), m1 = fresh(K), g2 = fresh(I), u2 = fresh(I), m2 = fresh(K);
      DevT y3 = fresh(K), x3 = fresh(K);
      gpu_->add_rms_norm_into(dy.t, dd.t, y1.t, dnw.t, 1e-6f, x1.t);
      gpu_->mlp(x1.t, m, g1.t, u1.t, m1.t);
      const long long before_mlp = cuda::norm_gemv_launches();
      gpu_->add_rms_norm_mlp(dy.t, dd.t, y3.t, dnw.t, 1e-6f, x3.t, m, g2.t, u2.t, m2.t);
      EXPECT_EQ(cuda::norm_gemv_launches(), before_mlp + 1) << what << ": the norm-computing MLP was not taken";
      EXPECT_EQ(download(*gpu_, y3.t), download(*gpu_, y1.t)) << what << " MLP";
      EXPECT_EQ(download(*gpu_, x3.t), download(*gpu_, x1.t)) << what << " MLP";
      EXPECT_EQ(download(*gpu_, g2.t), download(*gpu_, g1.t)) << what << " MLP SwiGLU";
      EXPECT_EQ(download(*gpu_, m2.t), download(*gpu_, m1.t)) << what << " MLP";
    }
  }
}

TEST_F(CudaOps, AddRmsNorm) {
  for (int64_t D : {100, 102, 2048, 5120}) {  // 102: not whole float4s, the scalar kernel
    HostT y = random_t(rng_, DType::F32, {5, D}, -3, 3), d = random_t(rng_, DType::F32, {5, D}, -3, 3),
          w = random_t(rng_, DType::F32, {D}, 0.5f, 1.5f);
    HostT sum = y, want(DType::F32, {5, D});
    cpu::add(sum.t, d.t);
    cpu::rms_norm(sum.t, w.t, 1e-6f, want.t);
    DevT dy = upload(*gpu_, y), dd = upload(*gpu_, d), dw = upload(*gpu_, w), o = upload(*gpu_, HostT(DType::F32, {5, D}));
    gpu_->add_rms_norm(dy.t, dd.t, dw.t, 1e-6f, o.t);
    EXPECT_LE(rel_err(download(*gpu_, dy.t), sum.floats()), 1e-6) << D;
    EXPECT_LE(rel_err(download(*gpu_, o.t), want.floats()), 1e-5) << D;
    // Into the residual stream's other buffer (the layer form; a bf16 projection takes the plain
    // norm kernel): y stays, y_out gets the sum, x the same norm bitwise as in place.
    DevT dy0 = upload(*gpu_, y), dy2 = upload(*gpu_, HostT(DType::F32, {5, D}));
    DevT o2 = upload(*gpu_, HostT(DType::F32, {5, D}));
    const DevT wb = upload(*gpu_, random_t(rng_, DType::BF16, {16, D}));
    DevT po = upload(*gpu_, HostT(DType::F32, {5, 16}));
    const Tensor* ws[] = {&wb.t};
    Tensor* outs[] = {&po.t};
    gpu_->add_rms_norm_matmul_multi(dy0.t, dd.t, dy2.t, dw.t, 1e-6f, o2.t, ws, outs);
    EXPECT_EQ(download(*gpu_, dy0.t), y.floats()) << D << ": y was written";
    EXPECT_EQ(download(*gpu_, dy2.t), download(*gpu_, dy.t)) << D;
    EXPECT_EQ(download(*gpu_, o2.t), download(*gpu_, o.t)) << D;
  }
}

TEST_F(CudaOps, Elementwise) {
  HostT y = random_t(rng_, DType::F32, {6, 33}, -4, 4), x = random_t(rng_, DType::F32, {6, 33}, -4, 4),
        s = random_t(rng_, DType::F32, {6, 1}, -4, 4);
  DevT dy = upload(*gpu_, y), dx = upload(*gpu_, x), ds = upload(*gpu_, s), o = upload(*gpu_, HostT(DType::F32, {6, 33}));
  HostT w1 = y;
  cpu::add(w1.t, x.t);
  gpu_->add(dy.t, dx.t);
  EXPECT_LE(rel_err(download(*gpu_, dy.t), w1.floats()), 1e-6);
  HostT w2(DType::F32, {6, 33});
  cpu::swiglu(w1.t, x.t, w2.t);
  gpu_->swiglu(dy.t, dx.t, o.t);
  EXPECT_LE(rel_err(download(*gpu_, o.t), w2.floats()), 1e-6);
  cpu::sigmoid_mul(w2.t, x.t);
  gpu_->sigmoid_mul(o.t, dx.t);
  EXPECT_LE(rel_err(download(*gpu_, o.t), w2.floats()), 1e-6);
  cpu::add_sigmoid_scaled(w2.t, x.t, s.t);
  gpu_->add_sigmoid_scaled(o.t, dx.t, ds.t);
  EXPECT_LE(rel_err(download(*gpu_, o.t), w2.floats()), 1e-6);
  // a prefill-sized gate (the float4 kernel)
  HostT bx = random_t(rng_, DType::F32, {40, 2048}, -4, 4), bg = random_t(rng_, DType::F32, {40, 2048}, -4, 4);
  DevT dbx = upload(*gpu_, bx), dbg = upload(*gpu_, bg);
  cpu::sigmoid_mul(bx.t, bg.t);
  gpu_->sigmoid_mul(dbx.t, dbg.t);
  EXPECT_LE(rel_err(download(*gpu_, dbx.t), bx.floats()), 1e-6);
}

// Backend::gated_matmul on the CUDA backend (the gate kernel releasing the projection's launch
// early or late by release_late_before) is its default composition, sigmoid_mul then matmul, bit
// for bit: a dense matrix on the warp-per-row GEMV (released late), one on the split-K GEMV and an
// f32 one (early and late), at 1 and 3 tokens.
TEST_F(CudaOps, GatedMatmulIsTheComposition) {
  struct Case {
    DType dt;
    int64_t N, K;
  };
  for (const Case& cs : {Case{DType::BF16, 2560, 512}, Case{DType::BF16, 256, 512}, Case{DType::F32, 2304, 256}})
    for (int64_t T : {1, 3, 40}) {  // 40: the prefill form over bf16 (the gate writes the GEMM's input)
      const HostT w = random_t(rng_, cs.dt, {cs.N, cs.K}, -0.1f, 0.1f), x = random_t(rng_, DType::F32, {T, cs.K}),
                  g = random_t(rng_, DType::F32, {T, cs.K}, -4, 4);
      DevT dw = upload(*gpu_, w), dg = upload(*gpu_, g), dx1 = upload(*gpu_, x), dx2 = upload(*gpu_, x),
           o1 = upload(*gpu_, HostT(DType::F32, {T, cs.N})), o2 = upload(*gpu_, HostT(DType::F32, {T, cs.N}));
      gpu_->gated_matmul(dx1.t, dg.t, dw.t, o1.t);
      gpu_->sigmoid_mul(dx2.t, dg.t);
      gpu_->matmul(dx2.t, dw.t, o2.t);
      const std::string at = std::string(dtype_name(cs.dt)) + " " + std::to_string(cs.N) + "x" +
                             std::to_string(cs.K) + " T=" + std::to_string(T);
      if (T <= 8 || cs.dt != DType::BF16) {  // the prefill form leaves x as it was
        EXPECT_EQ(download(*gpu_, dx1.t), download(*gpu_, dx2.t)) << at << ": x scaled in place";
      }
      EXPECT_EQ(download(*gpu_, o1.t), download(*gpu_, o2.t)) << at;
    }
}

// Backend::gated_norm_matmul on the CUDA backend is its composition, gated_rms_norm then matmul,
// bit for bit: at prefill over bf16 the norm writes the GEMM's bf16 input (the values the
// GEMM's rounding would give), elsewhere the composition itself.
TEST_F(CudaOps, GatedNormMatmulIsTheComposition) {
  const int64_t H = 4, D = 128, N = 320;
  for (DType dt : {DType::BF16, DType::F32})
    for (int64_t T : {1, 3, 40}) {
      const HostT w = random_t(rng_, dt, {N, H * D}, -0.1f, 0.1f), x = random_t(rng_, DType::F32, {T, H, D}),
                  z = random_t(rng_, DType::F32, {T, H, D}, -4, 4), nw = random_t(rng_, DType::F32, {D}, 0.5f, 1.5f);
      DevT dw = upload(*gpu_, w), dz = upload(*gpu_, z), dn = upload(*gpu_, nw), dx1 = upload(*gpu_, x),
           dx2 = upload(*gpu_, x), o1 = upload(*gpu_, HostT(DType::F32, {T, N})), o2 = upload(*gpu_, HostT(DType::F32, {T, N}));
      gpu_->gated_norm_matmul(dx1.t, dz.t, dn.t, 1e-6f, dw.t, o1.t);
      gpu_->gated_rms_norm(dx2.t, dz.t, dn.t, 1e-6f, dx2.t);
      Tensor x2(dx2.t.data, DType::F32, {T, H * D});
      gpu_->matmul(x2, dw.t, o2.t);
      EXPECT_EQ(download(*gpu_, o1.t), download(*gpu_, o2.t)) << dtype_name(dt) << " T=" << T;
    }
}

TEST_F(CudaOps, CopyColsGetRowsSplitQGate) {
  HostT src = random_t(rng_, DType::F32, {5, 40}), dst = random_t(rng_, DType::F32, {5, 30});
  DevT ds = upload(*gpu_, src), dd = upload(*gpu_, dst);
  cpu::copy_cols(src.t, 7, dst.t, 3, 20);
  gpu_->copy_cols(ds.t, 7, dd.t, 3, 20);
  EXPECT_EQ(rel_err(download(*gpu_, dd.t), dst.floats()), 0.0);
  const std::vector<int32_t> rows{4, 0, 4, 2};
  HostT want(DType::F32, {4, 40});
  cpu::get_rows(src.t, rows, want.t);
  DevT o = upload(*gpu_, HostT(DType::F32, {4, 40}));
  gpu_->get_rows(ds.t, rows, o.t);
  EXPECT_EQ(rel_err(download(*gpu_, o.t), want.floats()), 0.0);
  HostT qg = random_t(rng_, DType::F32, {3, 4, 2 * 16});
  HostT q(DType::F32, {3, 4, 16}), g(DType::F32, {3, 64});
  cpu::split_q_gate(qg.t, q.t, g.t);
  DevT dqg = upload(*gpu_, qg), dq = upload(*gpu_, HostT(DType::F32, {3, 4, 16})), dg = upload(*gpu_, HostT(DType::F32, {3, 64}));
  gpu_->split_q_gate(dqg.t, dq.t, dg.t);
  EXPECT_EQ(rel_err(download(*gpu_, dq.t), q.floats()), 0.0);
  EXPECT_EQ(rel_err(download(*gpu_, dg.t), g.floats()), 0.0);
}

// A tree commit's row moves (Backend::compact_rows): bitwise the CPU backend's row-by-row
// copies, over more tensors than one launch takes (32) and rows of 4 B to 40 KB, a path with a
// row that stays; a row that is not whole 4-byte words (a bf16 row of 3) takes the copies.
TEST_F(CudaOps, CompactRowsIsTheRowByRowCopies) {
  const std::vector<int32_t> from{0, 2, 3, 3, 7, 9, 12, 13, 14, 20};
  const std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  for (const bool odd : {false, true}) {
    std::vector<HostT> host;
    for (int i = 0; i < 40; ++i) {
      const int64_t w = i % 3 == 0 ? 10240 : i % 3 == 1 ? 48 : 1;
      host.push_back(odd && i == 5 ? random_t(rng_, DType::BF16, {24, 3}) : random_t(rng_, DType::F32, {24, w}));
    }
    std::vector<DevT> dev;
    std::vector<Tensor> dts, hts;
    for (HostT& h : host) {
      dev.push_back(upload(*gpu_, h));
      dts.push_back(dev.back().t);
      hts.push_back(h.t);
    }
    cpu->compact_rows(hts, from);
    gpu_->compact_rows(dts, from);
    for (size_t i = 0; i < host.size(); ++i) {
      std::vector<uint8_t> got(host[i].bytes.size());
      gpu_->copy_to_host(dts[i], got.data());
      EXPECT_EQ(got, host[i].bytes) << "tensor " << i << (odd ? " (with an odd row)" : "");
    }
  }
  const DevT small = upload(*gpu_, random_t(rng_, DType::F32, {4, 8}));
  std::vector<Tensor> one{small.t};
  EXPECT_THROW(gpu_->compact_rows(one, std::vector<int32_t>{0, 0}), Error);  // a row from before it
}

// x's [q | k | v] blocks copied out (Backend::copy_column_blocks, one launch on CUDA): bitwise
// the CPU backend's three copies, at the 27B's DeltaNet widths (23 rows: a tree verify pass) and
// at widths that are not whole 16-byte units (the copies' fallback).
TEST_F(CudaOps, CopyColumnBlocksIsTheThreeCopies) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  for (auto [nq, nk, nv] : {std::tuple<int64_t, int64_t, int64_t>{2048, 2048, 6144}, {64, 32, 4}, {6, 5, 3}}) {
    const int64_t T = 23;
    HostT x = random_t(rng_, DType::F32, {T, nq + nk + nv});
    HostT q(DType::F32, {T, nq}), k(DType::F32, {T, nk}), v(DType::F32, {T, nv});
    cpu->copy_column_blocks(x.t, q.t, k.t, v.t);
    DevT dx = upload(*gpu_, x), dq = upload(*gpu_, HostT(DType::F32, {T, nq})),
         dk = upload(*gpu_, HostT(DType::F32, {T, nk})), dv = upload(*gpu_, HostT(DType::F32, {T, nv}));
    gpu_->copy_column_blocks(dx.t, dq.t, dk.t, dv.t);
    EXPECT_EQ(download(*gpu_, dq.t), q.floats()) << nq << " " << nk << " " << nv;
    EXPECT_EQ(download(*gpu_, dk.t), k.floats());
    EXPECT_EQ(download(*gpu_, dv.t), v.floats());
  }
}

// A prefill's column split (the DeltaNet projections [4096, 16480] → q|k|v|z blocks): bytes
// moved per second, printed; the copy itself checked exactly.
TEST_F(CudaOps, ColumnCopyBandwidth) {
  const int64_t T = 4096, C = 16480;
  HostT src = random_t(rng_, DType::F32, {T, C});
  DevT dsrc = upload(*gpu_, src);
  for (auto [c0, w] : {std::pair<int64_t, int64_t>{0, 10240}, {10240, 6144}, {16384, 48}, {16433, 47}}) {
    DevT ddst = upload(*gpu_, HostT(DType::F32, {T, w}));
    gpu_->copy_cols(dsrc.t, c0, ddst.t, 0, w);
    cuda_synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < 10; ++r) gpu_->copy_cols(dsrc.t, c0, ddst.t, 0, w);
    cuda_synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 10;
    std::printf("[ copy ] columns %lld..+%lld of [%lld, %lld]: %.1f us, %.0f GB/s (read + write)\n", (long long)c0,
                (long long)w, (long long)T, (long long)C, s * 1e6, 2.0 * double(T * w * 4) / s / 1e9);
    const std::vector<float> got = download(*gpu_, ddst.t);
    for (int64_t t = 0; t < T; t += 409)
      for (int64_t j = 0; j < w; j += 7) ASSERT_EQ(got[size_t(t * w + j)], src.f()[t * C + c0 + j]) << t << "," << j;
  }
}

TEST_F(CudaOps, Rope) {
  const std::vector<SeqRun> runs{{0, 5, 0, 3}, {1, 4000, 3, 4}};
  for (int64_t hd : {64, 256}) {
    HostT x = random_t(rng_, DType::F32, {7, 3, hd});
    DevT dx = upload(*gpu_, x);
    cpu::rope(x.t, runs, hd / 4, 1e7f);
    gpu_->rope(dx.t, runs, hd / 4, 1e7f);
    EXPECT_LE(rel_err(download(*gpu_, dx.t), x.floats()), 2e-5) << hd;
  }
}

// The attention's q / k preparation in one launch (qk_norm_rope) against the ops it replaces on
// the same backend (split_q_gate, rms_norm × 2, rope × 2: bitwise) and the CPU's (2e-5), with and
// without the output gate, a decode token and a prefill of runs at other positions.
TEST_F(CudaOps, QkNormRopeAsComposed) {
  const int64_t nh = 6, nkv = 2, hd = 256, rd = 64;
  const HostT qn = random_t(rng_, DType::F32, {hd}, 0.5f, 1.5f), kn = random_t(rng_, DType::F32, {hd}, 0.5f, 1.5f);
  const DevT dqn = upload(*gpu_, qn), dkn = upload(*gpu_, kn);
  const std::vector<SeqRun> decode{{0, 37, 0, 1}}, prefill{{0, 5, 0, 3}, {1, 4000, 3, 4}};
  for (bool gated : {true, false})
    for (const std::vector<SeqRun>* runs : {&decode, &prefill}) {
      const int64_t T = runs == &decode ? 1 : 7;
      const HostT qg = random_t(rng_, DType::F32, {T, nh, (gated ? 2 : 1) * hd}, -3, 3),
                  k = random_t(rng_, DType::F32, {T, nkv, hd}, -3, 3);
      auto run = [&](bool fused) {
        DevT dqg = upload(*gpu_, qg), dk = upload(*gpu_, k);
        DevT dq = gated ? upload(*gpu_, HostT(DType::F32, {T, nh, hd})) : upload(*gpu_, qg);
        DevT dg = upload(*gpu_, HostT(DType::F32, {T, nh * hd}));
        Tensor& q = gated ? dq.t : dqg.t;
        if (fused)
          gpu_->qk_norm_rope(dqg.t, q, gated ? &dg.t : nullptr, dk.t, dqn.t, dkn.t, 1e-6f, *runs, rd, 1e7f);
        else
          gpu_->Backend::qk_norm_rope(dqg.t, q, gated ? &dg.t : nullptr, dk.t, dqn.t, dkn.t, 1e-6f, *runs, rd, 1e7f);
        return std::array<std::vector<float>, 3>{download(*gpu_, q), download(*gpu_, dk.t), download(*gpu_, dg.t)};
      };
      const auto a = run(true), b = run(false);
      const char* what = gated ? "gated" : "plain";
      EXPECT_EQ(a[0], b[0]) << what << " T=" << T << ": q";
      EXPECT_EQ(a[1], b[1]) << what << " T=" << T << ": k";
      if (gated) {
        EXPECT_EQ(a[2], b[2]) << what << " T=" << T << ": gate";
      }
      HostT cq(DType::F32, {T, nh, hd}), cg(DType::F32, {T, nh * hd}), ck = k;
      if (gated) {
        cpu::split_q_gate(qg.t, cq.t, cg.t);
      } else {
        cq = qg;
      }
      cpu::rms_norm(cq.t, qn.t, 1e-6f, cq.t);
      cpu::rms_norm(ck.t, kn.t, 1e-6f, ck.t);
      cpu::rope(cq.t, *runs, rd, 1e7f);
      cpu::rope(ck.t, *runs, rd, 1e7f);
      EXPECT_LE(rel_err(a[0], cq.floats()), 2e-5) << what << " T=" << T;
      EXPECT_LE(rel_err(a[1], ck.floats()), 2e-5) << what << " T=" << T;
      if (gated) {
        EXPECT_EQ(a[2], cg.floats()) << what << " T=" << T;
      }
    }
}

// ---- attention ----
TEST_F(CudaOps, AttentionPrefillThenDecode) {
  struct Shape {
    int64_t H, KVH, hd;
  };
  for (Shape s : {Shape{6, 2, 64}, Shape{24, 4, 256}, Shape{4, 1, 16}, Shape{16, 2, 256}}) {
    const int64_t slots = 3, cap = 80;
    HostT kc(DType::F32, {slots, cap, s.KVH, s.hd}), vc(DType::F32, {slots, cap, s.KVH, s.hd});
    DevT dkc = upload(*gpu_, kc), dvc = upload(*gpu_, vc);
    const float scale = 1.0f / std::sqrt(float(s.hd));
    // Step 1: two sequences prefilled together; step 2: both decode one token; step 3: one
    // more chunk for slot 2.
    const std::vector<std::vector<SeqRun>> steps{{{2, 0, 0, 37}, {0, 0, 37, 20}}, {{0, 20, 0, 1}, {2, 37, 1, 1}},
                                                 {{2, 38, 0, 9}}};
    for (const auto& runs : steps) {
      int64_t T = 0;
      for (const SeqRun& r : runs) T += r.count;
      HostT q = random_t(rng_, DType::F32, {T, s.H, s.hd}, -2, 2), k = random_t(rng_, DType::F32, {T, s.KVH, s.hd}, -2, 2),
            v = random_t(rng_, DType::F32, {T, s.KVH, s.hd});
      HostT want(DType::F32, {T, s.H, s.hd});
      cpu::attention(q.t, k.t, v.t, kc.t, vc.t, runs, scale, want.t);
      DevT dq = upload(*gpu_, q), dk = upload(*gpu_, k), dv = upload(*gpu_, v), o = upload(*gpu_, HostT(DType::F32, {T, s.H, s.hd}));
      gpu_->attention(dq.t, dk.t, dv.t, dkc.t, dvc.t, runs, scale, o.t);
      // Runs of ≥ 16 tokens take the tensor-core flash kernel (q, k, v and p rounded to bf16:
      // ~1e-3 measured, 1e-2 allowed); decode-sized runs the exact f32 kernel.
      bool flash = false;
      for (const SeqRun& r : runs) flash = flash || r.count >= 16;
      EXPECT_LE(rel_err(download(*gpu_, o.t), want.floats()), flash ? 1e-2 : 2e-5) << "H=" << s.H << " hd=" << s.hd;
    }
    EXPECT_LE(rel_err(download(*gpu_, dkc.t), kc.floats()), 0.0);
    EXPECT_LE(rel_err(download(*gpu_, dvc.t), vc.floats()), 0.0);
  }
}

// ---- DeltaNet ----
TEST_F(CudaOps, Conv1dSiluWithState) {
  const int64_t C = 300, K = 4, slots = 3;
  HostT w = random_t(rng_, DType::F32, {C, K}), st(DType::F32, {slots, C, K - 1});
  DevT dw = upload(*gpu_, w), dst = upload(*gpu_, st);
  const std::vector<std::vector<SeqRun>> steps{{{1, 0, 0, 10}, {2, 0, 10, 2}}, {{1, 10, 0, 1}, {2, 2, 1, 1}},
                                               {{2, 3, 0, 70}}, {{0, 0, 0, 200}, {1, 11, 200, 5}}};
  for (const auto& runs : steps) {
    int64_t T = 0;
    for (const SeqRun& r : runs) T += r.count;
    HostT x = random_t(rng_, DType::F32, {T, C}, -2, 2);
    DevT dx = upload(*gpu_, x);
    cpu::causal_conv1d_silu(x.t, w.t, st.t, runs);
    gpu_->causal_conv1d_silu(dx.t, dw.t, dst.t, runs);
    EXPECT_LE(rel_err(download(*gpu_, dx.t), x.floats()), 1e-6);
  }
  EXPECT_LE(rel_err(download(*gpu_, dst.t), st.floats()), 0.0);
}

// a and b with Hv columns, or with a shard's padded rows (G > Hv: only the first Hv count).
TEST_F(CudaOps, DeltaNetGates) {
  const int64_t T = 9, Hv = 24;
  for (int64_t G : {Hv, int64_t(32)}) {
    HostT a = random_t(rng_, DType::F32, {T, G}, -30, 30), b = random_t(rng_, DType::F32, {T, G}, -5, 5),
          ae = random_t(rng_, DType::F32, {Hv}, -1.5f, -0.5f), dt = random_t(rng_, DType::F32, {Hv});
    HostT g(DType::F32, {T, Hv}), beta(DType::F32, {T, Hv});
    cpu::deltanet_gates(a.t, b.t, ae.t, dt.t, g.t, beta.t);
    DevT da = upload(*gpu_, a), db = upload(*gpu_, b), dae = upload(*gpu_, ae), ddt = upload(*gpu_, dt),
         dg = upload(*gpu_, HostT(DType::F32, {T, Hv})), dbeta = upload(*gpu_, HostT(DType::F32, {T, Hv}));
    gpu_->deltanet_gates(da.t, db.t, dae.t, ddt.t, dg.t, dbeta.t);
    EXPECT_LE(rel_err(download(*gpu_, dg.t), g.floats()), 1e-6) << "G " << G;
    EXPECT_LE(rel_err(download(*gpu_, dbeta.t), beta.floats()), 1e-6) << "G " << G;
  }
}

TEST_F(CudaOps, GatedDeltaRuleAllModesCarryState) {
  struct Shape {
    int64_t Hk, Hv, dk, dv;
  };
  for (Shape s : {Shape{16, 48, 128, 128}, Shape{2, 6, 32, 24}, Shape{1, 2, 16, 48}, Shape{2, 4, 64, 64}}) {
    for (DeltaRuleMode mode : {DeltaRuleMode::Auto, DeltaRuleMode::Chunked, DeltaRuleMode::Recurrent}) {
      const int64_t slots = 3;
      HostT st = random_t(rng_, DType::F32, {slots, s.Hv, s.dk, s.dv}, -0.1f, 0.1f);
      DevT dst = upload(*gpu_, st);
      const std::vector<std::vector<SeqRun>> steps{{{0, 0, 0, 70}, {2, 0, 70, 5}}, {{0, 70, 0, 1}, {2, 5, 1, 1}},
                                                   {{2, 6, 0, 130}}};
      for (const auto& runs : steps) {
        int64_t T = 0;
        for (const SeqRun& r : runs) T += r.count;
        HostT q = random_t(rng_, DType::F32, {T, s.Hk, s.dk}), k = random_t(rng_, DType::F32, {T, s.Hk, s.dk}),
              v = random_t(rng_, DType::F32, {T, s.Hv, s.dv}), g = random_t(rng_, DType::F32, {T, s.Hv}, -2.0f, -0.01f),
              beta = random_t(rng_, DType::F32, {T, s.Hv}, 0.0f, 1.0f);
        HostT want(DType::F32, {T, s.Hv, s.dv});
        cpu::gated_delta_rule(q.t, k.t, v.t, g.t, beta.t, st.t, runs, want.t, mode);
        DevT dq = upload(*gpu_, q), dk = upload(*gpu_, k), dv = upload(*gpu_, v), dg = upload(*gpu_, g),
             db = upload(*gpu_, beta), o = upload(*gpu_, HostT(DType::F32, {T, s.Hv, s.dv}));
        gpu_->gated_delta_rule(dq.t, dk.t, dv.t, dg.t, db.t, dst.t, runs, o.t, mode);
        EXPECT_LE(rel_err(download(*gpu_, o.t), want.floats()), 1e-4) << "dk=" << s.dk << " dv=" << s.dv;
      }
      EXPECT_LE(rel_err(download(*gpu_, dst.t), st.floats()), 1e-4) << "state dk=" << s.dk;
    }
  }
}

// ---- MoE ----
TEST_F(CudaOps, MoeRoute) {
  // every register width of the kernel (E ≤ 128, 256, 512, 1024), E not a multiple of 32, k = 32
  for (auto [E, k] : {std::pair<int64_t, int64_t>{16, 4}, {256, 8}, {8, 2}, {100, 3}, {512, 10}, {1000, 32}})
    for (bool renorm : {true, false}) {
      const int64_t T = 21;
      HostT logits = random_t(rng_, DType::F32, {T, E}, -3, 3);
      for (int64_t e = 0; e < E; e += 3) logits.f()[e] = logits.f()[1];  // ties in row 0: lower id wins
      HostT w(DType::F32, {T, k}), ids(DType::I32, {T, k});
      cpu::moe_route(logits.t, k, renorm, w.t, ids.t);
      DevT dl = upload(*gpu_, logits), dw = upload(*gpu_, HostT(DType::F32, {T, k})),
           di = upload(*gpu_, HostT(DType::I32, {T, k}));
      gpu_->moe_route(dl.t, k, renorm, dw.t, di.t);
      std::vector<int32_t> gids(size_t(T * k));
      gpu_->copy_to_host(di.t, gids.data());
      EXPECT_EQ(gids, std::vector<int32_t>(ids.t.as<int32_t>(), ids.t.as<int32_t>() + T * k)) << E;
      EXPECT_LE(rel_err(download(*gpu_, dw.t), w.floats()), 1e-6);
    }
}

TEST_F(CudaOps, MoeExpertsDecodeAndPrefillPaths) {
  const int64_t E = 16, D = 128, I = 64, k = 4;
  std::vector<HostT> hw;
  std::vector<DevT> dw;
  std::vector<MlpWeights> he, de;
  for (int64_t e = 0; e < E; ++e) {
    hw.push_back(random_t(rng_, DType::BF16, {I, D}, -0.2f, 0.2f));
    hw.push_back(random_t(rng_, DType::BF16, {I, D}, -0.2f, 0.2f));
    hw.push_back(random_t(rng_, DType::BF16, {D, I}, -0.2f, 0.2f));
  }
  for (auto& h : hw) dw.push_back(upload(*gpu_, h));
  for (int64_t e = 0; e < E; ++e) {
    he.push_back({hw[size_t(3 * e)].t, hw[size_t(3 * e + 1)].t, hw[size_t(3 * e + 2)].t});
    de.push_back({dw[size_t(3 * e)].t, dw[size_t(3 * e + 1)].t, dw[size_t(3 * e + 2)].t});
  }
  for (int64_t T : {1, 8, 16, 40}) {  // T·k ≤ 64: fused kernels; larger: grouped per expert (cuBLAS)
    HostT x = random_t(rng_, DType::F32, {T, D}), logits = random_t(rng_, DType::F32, {T, E}, -2, 2);
    HostT w(DType::F32, {T, k}), ids(DType::I32, {T, k}), want(DType::F32, {T, D});
    cpu::moe_route(logits.t, k, true, w.t, ids.t);
    cpu::moe_experts(x.t, w.t, ids.t, he, want.t);
    DevT dx = upload(*gpu_, x), dwt = upload(*gpu_, w), di = upload(*gpu_, ids), o = upload(*gpu_, HostT(DType::F32, {T, D}));
    gpu_->moe_experts(dx.t, dwt.t, di.t, de, o.t);
    EXPECT_LE(rel_err(download(*gpu_, o.t), want.floats()), T * k <= 64 ? 2e-5 : 1.5e-2) << "T=" << T;
  }
}

// ---- batched decode GEMV (2 ≤ T ≤ 8, bf16/f16: the tile kernels of cuda_matmul.cu) ----
// Shapes that leave a block's last warps without rows (N not a multiple of 4 or of the block's
// rows), K with a partial last chunk and a partial last 32-lane step (K = 8: one lane; 264: one
// step and a lane; 2056: chunk tails at every T), and the warps per block forced to 1, 3 and 16
// besides the automatic choice. matmul_multi with a warp's 4 rows straddling matrices (301, 7,
// 48, 1 rows) and matmul_swiglu over several chunks. f32 activations and f32 accumulation like
// the warp-per-row kernel, only the summation order differs: 2e-5, as MatmulGemvDecode.
TEST_F(CudaOps, GemvBatchedTileShapes) {
  setenv("QWEN36_GEMV_SPLIT_ROWS", "0", 1);  // no split-K: every shape takes the tile kernel
  auto gpu = make_cuda_backend();
  unsetenv("QWEN36_GEMV_SPLIT_ROWS");
  for (const char* warps : {"auto", "1", "3", "16"}) {
    if (std::string(warps) != "auto") setenv("QWEN36_GEMV_TILE_WARPS", warps, 1);
    for (DType dt : {DType::BF16, DType::F16})
      for (int64_t T = 2; T <= 8; ++T) {
        for (auto [N, K] : {std::pair<int64_t, int64_t>{5, 8}, {37, 264}, {130, 2056}, {301, 5120}}) {
          SCOPED_TRACE(std::string("warps=") + warps);
          check_matmul(*gpu, rng_, {dt, T, N, K}, 2e-5);
        }
        const int64_t K = 2056;
        HostT x = random_t(rng_, DType::F32, {T, K});
        DevT dx = upload(*gpu, x);
        std::vector<HostT> want;
        std::vector<DevT> dw;
        std::vector<const Tensor*> ws;
        for (int64_t N : {301, 7, 48, 1}) {
          const HostT w = random_t(rng_, dt, {N, K});
          want.emplace_back(DType::F32, std::initializer_list<int64_t>{T, N});
          cpu::matmul(x.t, w.t, want.back().t);
          dw.push_back(upload(*gpu, w));
        }
        for (const DevT& d : dw) ws.push_back(&d.t);
        const auto got = matmul_multi_outputs(*gpu, dx.t, ws);
        for (size_t i = 0; i < 4; ++i)
          EXPECT_LE(rel_err(got[i], want[i].floats()), 2e-5)
              << dtype_name(dt) << " T=" << T << " warps=" << warps << " multi matrix " << i;
        HostT g = random_t(rng_, dt, {133, K}), u = random_t(rng_, dt, {133, K});
        HostT gw(DType::F32, {T, 133}), uw(DType::F32, {T, 133});
        cpu::matmul(x.t, g.t, gw.t);
        cpu::matmul(x.t, u.t, uw.t);
        cpu::swiglu(gw.t, uw.t, gw.t);
        DevT dg = upload(*gpu, g), du = upload(*gpu, u), go = upload(*gpu, HostT(DType::F32, {T, 133})),
             uo = upload(*gpu, HostT(DType::F32, {T, 133}));
        gpu->matmul_swiglu(dx.t, dg.t, du.t, go.t, uo.t);
        EXPECT_LE(rel_err(download(*gpu, go.t), gw.floats()), 2e-5)
            << dtype_name(dt) << " T=" << T << " warps=" << warps << " swiglu";
      }
    unsetenv("QWEN36_GEMV_TILE_WARPS");
  }
}

// Batched decode GEMV bandwidth with the weights not in L2 (rotating over copies adding up to
// > 256 MB, as GemvBandwidthColdL2) for the 27B's three large shapes at T = 1, 2, 4, 8, then
// T = 8 with the warps per block forced (tuning data for tile_warps), then the fused forms
// (the MLP's gate/up SwiGLU, the DeltaNet projections' multi) at T = 1 and 8. Printed; each
// run's output spot-checked against the CPU at 2e-5 of the largest checked magnitude (f32
// accumulation, as GemvBatchedTileShapes).
TEST_F(CudaOps, GemvBatchedBandwidthColdL2) {
  const double copy = cuda_copy_bandwidth_gbs(size_t(1) << 30, 5);
  // Σ_k w[n, k] · x[t, k] in double.
  auto dot = [](const HostT& w, int64_t n, const HostT& x, int64_t t) {
    std::vector<float> row(static_cast<size_t>(w.t.cols()));
    cpu::weight_row_to_f32(w.t, n, row.data());
    double s = 0;
    for (int64_t k = 0; k < w.t.cols(); ++k) s += double(row[size_t(k)]) * x.t.as<const float>()[t * w.t.cols() + k];
    return s;
  };
  // Times step(i) rotating over the copies i and prints the weight bandwidth.
  auto time_steps = [&](int copies, auto&& step, double bytes, const std::string& what) {
    for (int i = 0; i < copies; ++i) step(i);
    const int reps = 30 * copies;
    cuda_synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) step(r % copies);
    cuda_synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    const double gbs = bytes / s / 1e9;
    std::printf("[ gemv-batch ] %s: %.1f us, %.0f GB/s = %.1f%% of copy %.0f GB/s\n", what.c_str(), s * 1e6, gbs,
                100 * gbs / copy, copy);
  };
  auto copies_for = [](double bytes) { return int(std::max<double>(2, double(256ll << 20) / bytes + 1)); };

  for (auto [N, K] : {std::pair<int64_t, int64_t>{17408, 5120}, {5120, 17408}, {10240, 5120}}) {
    HostT w = random_t(rng_, DType::BF16, {N, K});
    const int copies = copies_for(double(w.t.nbytes()));
    std::vector<DevT> dw;
    for (int i = 0; i < copies; ++i) dw.push_back(upload(*gpu_, w));
    std::vector<std::pair<int64_t, std::string>> runs;
    for (int64_t T : {1, 2, 4, 8}) runs.emplace_back(T, "auto");
    for (const char* warps : {"3", "4", "5", "6", "8", "10", "12", "16"}) runs.emplace_back(8, warps);
    for (const auto& [T, warps] : runs) {
      if (warps != "auto") setenv("QWEN36_GEMV_TILE_WARPS", warps.c_str(), 1);
      HostT x = random_t(rng_, DType::F32, {T, K});
      DevT dx = upload(*gpu_, x), dout = upload(*gpu_, HostT(DType::F32, {T, N}));
      const std::string what = "bf16 " + std::to_string(N) + " x " + std::to_string(K) + " T=" + std::to_string(T) +
                               (T > 1 ? " warps=" + warps : std::string());
      time_steps(copies, [&](int i) { gpu_->matmul(dx.t, dw[size_t(i)].t, dout.t); }, double(w.t.nbytes()), what);
      unsetenv("QWEN36_GEMV_TILE_WARPS");
      const std::vector<float> got = download(*gpu_, dout.t);
      double worst = 0, scale = 1;
      int64_t worst_t = 0, worst_n = 0;
      for (int64_t n = 0; n < N; n += 997)
        for (int64_t t = 0; t < T; ++t) {
          const double want = dot(w, n, x, t), d = std::abs(double(got[size_t(t * N + n)]) - want);
          scale = std::max(scale, std::abs(want));
          if (!(d <= worst)) worst = d, worst_t = t, worst_n = n;
        }
      EXPECT_LE(worst / scale, 2e-5) << what << ": worst at t=" << worst_t << " row " << worst_n;
    }
  }

  // MLP gate/up + SwiGLU (17408 x 5120 twice) and the DeltaNet projections as one multi.
  const int64_t K = 5120, I = 17408;
  HostT g = random_t(rng_, DType::BF16, {I, K}), u = random_t(rng_, DType::BF16, {I, K});
  const std::vector<int64_t> rows{10240, 6144, 48, 48};
  HostT wm = random_t(rng_, DType::BF16, {16480, K});
  for (int64_t T : {1, 8}) {
    HostT x = random_t(rng_, DType::F32, {T, K});
    DevT dx = upload(*gpu_, x);
    {
      const int copies = copies_for(2.0 * double(g.t.nbytes()));
      std::vector<DevT> dg, du;
      for (int i = 0; i < copies; ++i) dg.push_back(upload(*gpu_, g)), du.push_back(upload(*gpu_, u));
      DevT go = upload(*gpu_, HostT(DType::F32, {T, I})), uo = upload(*gpu_, HostT(DType::F32, {T, I}));
      time_steps(copies, [&](int i) { gpu_->matmul_swiglu(dx.t, dg[size_t(i)].t, du[size_t(i)].t, go.t, uo.t); },
                 2.0 * double(g.t.nbytes()), "swiglu bf16 2 x 17408 x 5120 T=" + std::to_string(T));
      const std::vector<float> got = download(*gpu_, go.t);
      double worst = 0, scale = 1;
      for (int64_t n = 0; n < I; n += 997)
        for (int64_t t = 0; t < T; ++t) {
          const double gs = dot(g, n, x, t), want = gs / (1 + std::exp(-gs)) * dot(u, n, x, t);
          scale = std::max(scale, std::abs(want));
          worst = std::max(worst, std::abs(double(got[size_t(t * I + n)]) - want));
        }
      EXPECT_LE(worst / scale, 2e-5) << "swiglu T=" << T;
    }
    {
      const int copies = copies_for(double(wm.t.nbytes()));
      std::vector<DevT> dw;
      for (int i = 0; i < copies; ++i) dw.push_back(upload(*gpu_, wm));
      std::vector<DevT> dout;
      for (int64_t n : rows) dout.push_back(upload(*gpu_, HostT(DType::F32, {T, n})));
      auto step = [&](int i) {
        std::vector<Tensor> ws;
        int64_t r0 = 0;
        for (int64_t n : rows) {
          ws.emplace_back(static_cast<uint8_t*>(dw[size_t(i)].t.data) + size_t(r0 * K) * 2, DType::BF16,
                          std::initializer_list<int64_t>{n, K});
          r0 += n;
        }
        const Tensor* wp[] = {&ws[0], &ws[1], &ws[2], &ws[3]};
        Tensor* op[] = {&dout[0].t, &dout[1].t, &dout[2].t, &dout[3].t};
        gpu_->matmul_multi(dx.t, wp, op);
      };
      time_steps(copies, step, double(wm.t.nbytes()), "multi bf16 10240+6144+48+48 x 5120 T=" + std::to_string(T));
      // rows of the last two matrices too: they share warps and blocks with the large ones
      double worst = 0, scale = 1;
      int64_t r0 = 0;
      for (size_t j = 0; j < rows.size(); ++j) {
        const std::vector<float> got = download(*gpu_, dout[j].t);
        for (int64_t n = 0; n < rows[j]; n += (rows[j] > 100 ? 997 : 7))
          for (int64_t t = 0; t < T; ++t) {
            const double want = dot(wm, r0 + n, x, t);
            scale = std::max(scale, std::abs(want));
            worst = std::max(worst, std::abs(double(got[size_t(t * rows[j] + n)]) - want));
          }
        r0 += rows[j];
      }
      EXPECT_LE(worst / scale, 2e-5) << "multi T=" << T;
    }
  }
}

}  // namespace
}  // namespace qwen36::gputest
