// The fused-dequant bf16 GEMM of tiled quantized weights for T > 64 (backend/cuda/cuda_quant_gemm.cu)
// against (a) the dequantize → bf16 → cuBLAS path it replaces (QWEN36_QGEMM=dequant, selected
// through the test hook) and (b) a CPU reference: the GGUF rows dequantized
// (cpu::weight_row_to_f32) and rounded to bf16, times x rounded to bf16, summed in double.
// Tolerances (max |Δ| / max(1, max |want|)):
//  (a) 1e-3: both paths multiply the same bf16 values with f32 accumulation; only the order of
//      the sums differs (MMA k order, split-K partial sums, cuBLAS's tiling): ~1e-6 expected.
//  (b) 5e-4: the same bf16 inputs (each weight is the float the CPU dequantizer computes —
//      tiled_group computes the same floats — rounded once to bf16), the reference summed in
//      double: f32 accumulation over K ≤ 6144 terms, ~1e-6 expected. A wrong fragment, scale or
//      row/token index gives O(1) errors; a weight left unrounded or rounded twice ~1e-3.
// Every case prints nothing on success; a failure names the type, shape, T, split count and the
// worst output (t, n, row-tile, CTA row block, got, want). CudaQuantGemm.Timing27B prints µs and
// TFLOP/s of both paths on the 27B's shapes (run with QWEN36_QGEMM_VERBOSE=1 to see the plans).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "backend/cpu/cpu_ops.h"
#include "gpu_test_util.h"
#include "quant/quant.h"
#include "quant_test_util.h"

namespace qwen36::cuda {
// cuda_quant_gemm.cu's test hook: mode "dequant" | "fused" (nullptr: the environment again);
// splits > 0 forces the split-K count, 0 automatic, < 0 the environment again.
void qgemm_select(const char* mode, int splits);
}  // namespace qwen36::cuda

namespace qwen36::gputest {
namespace {

class CudaQuantGemm : public CudaTest {
 protected:
  void TearDown() override { cuda::qgemm_select(nullptr, -1); }
};

const DType kTypes[] = {DType::Q4_K, DType::Q6_K, DType::Q8_0};

struct Shape {
  int64_t N, K;
};

// N rows repeating `period` random quantized rows. A period that does not divide 256 (the
// kernel's rows per CTA) keeps a wrong row block or row-tile visible.
HostT periodic_rows(std::mt19937& rng, DType dt, int64_t N, int64_t K, int64_t period) {
  if (N <= period) return quantized(rng, dt, N, K);
  const HostT base = quantized(rng, dt, period, K);
  HostT w(dt, {N, K});
  const size_t rb = w.t.row_bytes();
  for (int64_t n = 0; n < N; ++n)
    std::memcpy(w.bytes.data() + size_t(n) * rb, base.bytes.data() + size_t(n % period) * rb, rb);
  return w;
}

std::vector<float> run(Backend& gpu, const DevT& w, const DevT& x, int64_t T) {
  DevT out = upload(gpu, HostT(DType::F32, {T, w.t.rows()}));
  gpu.matmul(x.t, w.t, out.t);
  return download(gpu, out.t);
}

// Rows 0, step, 2·step, … and N − 1 (the last CTA's last row-tile).
std::vector<int64_t> rows_of(int64_t N, int64_t step) {
  std::vector<int64_t> r;
  for (int64_t n = 0; n < N; n += step) r.push_back(n);
  if (r.back() != N - 1) r.push_back(N - 1);
  return r;
}

// The error over rows_of(N, step), relative to max(1, max |want|), and where it is worst.
double checked_err(const std::vector<float>& got, const std::vector<float>& want, int64_t T, int64_t N, int64_t step,
                   std::string* where) {
  double worst = -1, scale = 1;
  int64_t wt = 0, wn = 0;
  const std::vector<int64_t> rows = rows_of(N, step);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n : rows) {
      const size_t i = size_t(t * N + n);
      scale = std::max(scale, std::abs(double(want[i])));
      const double d = std::isnan(got[i]) ? 1e30 : std::abs(double(got[i]) - double(want[i]));
      if (d > worst) worst = d, wt = t, wn = n;
    }
  const size_t i = size_t(wt * N + wn);
  *where = "worst at t=" + std::to_string(wt) + " n=" + std::to_string(wn) + " (row-tile " + std::to_string(wn / 16) +
           ", CTA row block " + std::to_string(wn / 256) + ", token block " + std::to_string(wt / 64) + "): got " +
           std::to_string(got[i]) + " want " + std::to_string(want[i]) + "; max |want| " + std::to_string(scale) +
           ", rel " + std::to_string(worst / scale);
  return worst / scale;
}

// out[t, n] = Σ_k bf16(dequant(w)[n, k]) · bf16(x[t, k]) in double, for n in rows_of(N, step).
std::vector<float> bf16_reference(const HostT& w, const HostT& x, int64_t T, int64_t step) {
  const int64_t N = w.t.rows(), K = w.t.cols();
  std::vector<float> out(size_t(T * N), 0.0f), row(static_cast<size_t>(K));
  std::vector<double> xr(size_t(T * K)), wr(static_cast<size_t>(K));
  for (size_t i = 0; i < xr.size(); ++i) xr[i] = round_bf16(x.t.as<const float>()[i]);
  for (int64_t n : rows_of(N, step)) {
    cpu::weight_row_to_f32(w.t, n, row.data());
    for (int64_t k = 0; k < K; ++k) wr[size_t(k)] = round_bf16(row[size_t(k)]);
    for (int64_t t = 0; t < T; ++t) {
      double s = 0;
      const double* xt = xr.data() + t * K;
      for (int64_t k = 0; k < K; ++k) s += wr[size_t(k)] * xt[k];
      out[size_t(t * N + n)] = float(s);
    }
  }
  return out;
}

// Shapes: one CTA row block; 65 row-tiles (the last CTA holds one row-tile: N % 256 = 16); the
// 27B's out_proj (20 row blocks, 24 super-blocks: split K). T: one token past a CTA's 64, a
// partial n8 tile, two whole token blocks, a tail of 44 (5 n8 tiles and a half), eight blocks.
TEST_F(CudaQuantGemm, MatchesDequantPathAndBf16Reference) {
  const Shape shapes[] = {{256, 512}, {1040, 1536}, {5120, 6144}};
  const int64_t Ts[] = {65, 100, 128, 300, 512};
  for (DType dt : kTypes)
    for (const Shape& s : shapes) {
      const HostT w = periodic_rows(rng_, dt, s.N, s.K, 80);
      const DevT dw = upload_tiled(*gpu_, w);
      const int64_t step = s.N > 2048 ? 61 : 1;
      for (int64_t T : Ts) {
        const HostT x = random_t(rng_, DType::F32, {T, s.K});
        const DevT dx = upload(*gpu_, x);
        cuda::qgemm_select("fused", 0);
        const std::vector<float> got = run(*gpu_, dw, dx, T);
        cuda::qgemm_select("dequant", 0);
        const std::vector<float> base = run(*gpu_, dw, dx, T);
        const std::string what =
            std::string(dtype_name(dt)) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K) + " T=" + std::to_string(T);
        std::string where;
        EXPECT_LE(checked_err(got, base, T, s.N, 1, &where), 1e-3) << what << " vs dequant+cuBLAS: " << where;
        EXPECT_LE(checked_err(got, bf16_reference(w, x, T, step), T, s.N, step, &where), 5e-4)
            << what << " vs CPU bf16 reference: " << where;
      }
    }
}

// Split-K: the same product with 1, 3 and 7 splits (and automatic), each within 1e-3 of the
// dequant path; twice each eagerly, bitwise the same (the last CTA of a tile adds the slots in
// split order); and with splits, recorded into a CUDA graph and replayed: bitwise the eager result.
TEST_F(CudaQuantGemm, SplitKReproducibleEagerAndGraph) {
  for (DType dt : kTypes) {
    const int64_t N = 5120, K = 6144, T = 128;
    const HostT w = periodic_rows(rng_, dt, N, K, 80);
    const DevT dw = upload_tiled(*gpu_, w);
    const HostT x = random_t(rng_, DType::F32, {T, K});
    const DevT dx = upload(*gpu_, x);
    cuda::qgemm_select("dequant", 0);
    const std::vector<float> base = run(*gpu_, dw, dx, T);
    uint64_t key = 0x5147'0000 + uint64_t(dt) * 16;
    for (int splits : {1, 3, 7, 0}) {
      cuda::qgemm_select("fused", splits);
      const std::string what = std::string(dtype_name(dt)) + " splits=" + std::to_string(splits);
      DevT out = upload(*gpu_, HostT(DType::F32, {T, N}));
      std::vector<std::vector<float>> runs;
      for (int r = 0; r < 2; ++r) {
        gpu_->matmul(dx.t, dw.t, out.t);
        runs.push_back(download(*gpu_, out.t));
      }
      ++key;
      ASSERT_TRUE(gpu_->begin_capture());
      gpu_->matmul(dx.t, dw.t, out.t);
      ASSERT_TRUE(gpu_->end_capture(key, true)) << what << ": the fused GEMM could not be recorded";
      const HostT zeros(DType::F32, {T, N});
      gpu_->copy_from_host(zeros.t.data, out.t);
      ASSERT_TRUE(gpu_->replay(key));
      runs.push_back(download(*gpu_, out.t));
      for (size_t r = 1; r < runs.size(); ++r) {
        size_t diff = 0, first = runs[0].size();
        for (size_t i = 0; i < runs[0].size(); ++i)
          if (std::memcmp(&runs[r][i], &runs[0][i], sizeof(float)) != 0) ++diff, first = std::min(first, i);
        EXPECT_EQ(diff, 0u) << what << (r == 1 ? " second eager run" : " graph replay") << ": " << diff
                            << " outputs differ, first at t=" << first / size_t(N) << " n=" << first % size_t(N);
      }
      std::string where;
      EXPECT_LE(checked_err(runs[0], base, T, N, 1, &where), 1e-3) << what << " vs dequant+cuBLAS: " << where;
    }
  }
}

// Matrices of one call (matmul_multi): one x conversion, one launch each, separate split-K
// counters — two types and a split / unsplit pair.
TEST_F(CudaQuantGemm, MultiMatricesOneCall) {
  const int64_t K = 2048, T = 200;
  const std::vector<std::pair<DType, int64_t>> mats = {{DType::Q4_K, 1040}, {DType::Q6_K, 4096}, {DType::Q4_K, 256}};
  std::vector<HostT> hw;
  std::vector<DevT> dw;
  for (auto [dt, n] : mats) {
    hw.push_back(periodic_rows(rng_, dt, n, K, 80));
    dw.push_back(upload_tiled(*gpu_, hw.back()));
  }
  const HostT x = random_t(rng_, DType::F32, {T, K});
  const DevT dx = upload(*gpu_, x);
  std::vector<DevT> dout;
  std::vector<const Tensor*> ws;
  std::vector<Tensor*> outs;
  for (auto [dt, n] : mats) dout.push_back(upload(*gpu_, HostT(DType::F32, {T, n})));
  for (size_t i = 0; i < mats.size(); ++i) ws.push_back(&dw[i].t), outs.push_back(&dout[i].t);
  cuda::qgemm_select("fused", 0);
  gpu_->matmul_multi(dx.t, ws, outs);
  for (size_t i = 0; i < mats.size(); ++i) {
    std::string where;
    EXPECT_LE(checked_err(download(*gpu_, dout[i].t), bf16_reference(hw[i], x, T, 7), T, mats[i].second, 7, &where), 5e-4)
        << "matrix " << i << " (" << dtype_name(mats[i].first) << " " << mats[i].second << " x " << K << ") " << where;
  }
}

// Copies adding up to > 256 MB (over 4× the H200's L2): rotating over them reads the weights
// from HBM on every call, as in a forward pass.
std::vector<DevT> cold_copies(Backend& gpu, const HostT& w) {
  const int copies = int(std::max<size_t>(2, (size_t(256) << 20) / w.bytes.size() + 1));
  std::vector<DevT> d;
  for (int i = 0; i < copies; ++i) d.push_back(upload_tiled(gpu, w));
  return d;
}

// The 27B's large matrices at prefill / mixed-step sizes: the fused GEMM next to the dequantize
// → cuBLAS path, µs per call and TFLOP/s, cold L2; each output checked against the other path.
TEST_F(CudaQuantGemm, Timing27B) {
  const Shape shapes[] = {{17408, 5120}, {5120, 17408}, {10240, 5120}};
  for (DType dt : {DType::Q4_K, DType::Q6_K})
    for (const Shape& s : shapes) {
      const HostT w = repeated_rows(rng_, dt, s.N, s.K);
      std::vector<DevT> dw = cold_copies(*gpu_, w);
      for (int64_t T : {128, 272, 512, 2048}) {
        const HostT x = random_t(rng_, DType::F32, {T, s.K});
        const DevT dx = upload(*gpu_, x);
        DevT out = upload(*gpu_, HostT(DType::F32, {T, s.N}));
        double sec[2];
        std::vector<float> res[2];
        for (int m = 0; m < 2; ++m) {
          cuda::qgemm_select(m == 0 ? "fused" : "dequant", 0);
          sec[m] = time_per_call(int(dw.size()), [&](int i) { gpu_->matmul(dx.t, dw[size_t(i)].t, out.t); });
          gpu_->matmul(dx.t, dw[0].t, out.t);
          res[m] = download(*gpu_, out.t);
        }
        const double flop = 2.0 * double(s.N) * double(s.K) * double(T);
        const std::string what = std::string(dtype_name(dt)) + "-t16 " + std::to_string(s.N) + " x " +
                                 std::to_string(s.K) + ", T=" + std::to_string(T);
        std::printf("[ qgemm ] %s: fused %.1f us (%.0f TFLOP/s), dequant+cuBLAS %.1f us (%.0f TFLOP/s): %.2fx\n",
                    what.c_str(), sec[0] * 1e6, flop / sec[0] / 1e12, sec[1] * 1e6, flop / sec[1] / 1e12, sec[1] / sec[0]);
        std::string where;
        EXPECT_LE(checked_err(res[0], res[1], T, s.N, 1, &where), 1e-3) << what << " " << where;
      }
    }
}

}  // namespace
}  // namespace qwen36::gputest
