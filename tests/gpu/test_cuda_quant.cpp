// Block-quantized weights on the GPU (cuda_quant_matmul.cu) against the CPU reference. Weights
// come from the project's quantizer (quantize_row) on random rows whose 32-blocks have varied
// magnitudes; the reference is the dequantized rows (cpu::weight_row_to_f32) times x in double.
// Tolerances (rel_err: max |Δ| over max(1, max |want|)):
//  - Decode GEMV (T ≤ 8) quantizes the activations to int8 per 32 (scale amax/127, nearest
//    even). Activations whose 32-blocks are exactly d · k (d a power of two, k ∈ [−127, 127],
//    max |k| = 127) quantize losslessly, so there the GEMV must equal the f32 dot up to f32
//    accumulation: 2e-5. General activations: each element moves by ≤ amax/254, uniformly, so
//    a dot moves by ≈ ‖w‖·amax/(127·√12) against its size ≈ ‖w‖·σx; uniform x has amax/σx = √3,
//    i.e. ≈ 0.4% of a typical dot; the largest error over all outputs stays below 1e-2 of the
//    largest dot.
//  - Prefill (T > 8): weights dequantized to bf16 and activations rounded to bf16 (each ≤ 2^-9
//    relative, random signs): 1.5e-2, as the bf16 GEMM test.
//  - exact_matmul (f32 weights and activations, every T): 2e-5.
//  - embed: the GPU dequantizer rounds once, as quant/dequantize.cpp: equal.
#include <chrono>
#include <cstring>
#include <filesystem>

#include "backend/cpu/cpu_ops.h"
#include "common/test_files.h"
#include "core/error.h"
#include "format/model_loader.h"
#include "gpu_test_util.h"
#include "model/qwen36.h"
#include "quant/quant.h"

namespace qwen36::gputest {
namespace {

class CudaQuant : public CudaTest {};

const DType kAllTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0,  DType::Q5_1,  DType::Q8_0,
                           DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_XS};

// N random rows quantized to t: N(0, 1) values, each 32-block scaled by a factor in [0.1, 2].
HostT quantized(std::mt19937& rng, DType t, int64_t N, int64_t K) {
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
HostT int8_exact_activations(std::mt19937& rng, int64_t T, int64_t K) {
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

// out[t, n] = Σ_k dequant(w)[n, k] · x[t, k] in double (rows: only those with n % row_step == 0).
std::vector<float> reference(const HostT& w, const HostT& x, int64_t T, int64_t row_step = 1) {
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

// Where the largest error is (for a failure message).
std::string worst_at(const std::vector<float>& got, const std::vector<float>& want, int64_t N) {
  size_t at = 0;
  double worst = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::isnan(got[i]) ? 1e30 : std::abs(double(got[i]) - double(want[i]));
    if (d > worst) worst = d, at = i;
  }
  return "worst at t=" + std::to_string(int64_t(at) / N) + " n=" + std::to_string(int64_t(at) % N) +
         ": got " + std::to_string(got[at]) + " want " + std::to_string(want[at]);
}

double run_matmul(Backend& gpu, const HostT& w, const HostT& x, int64_t T, std::string* where) {
  const int64_t N = w.t.rows();
  DevT dw = upload(gpu, w), dx = upload(gpu, x), dout = upload(gpu, HostT(DType::F32, {T, N}));
  gpu.matmul(dx.t, dw.t, dout.t);
  const std::vector<float> got = download(gpu, dout.t), want = reference(w, x, T);
  *where = worst_at(got, want, N);
  return rel_err(got, want);
}

struct Shape {
  int64_t N, K;
};

// GEMV segments are 2048 weights (8 super-blocks, 64 blocks). Shapes for every type: one block
// per row and 37 rows (fewer rows than SMs); 301 rows of 5 and of 9 super-blocks (a partial
// segment; a full one and a partial one).
const Shape kShapes[] = {{37, 256}, {301, 1280}, {301, 2304}};

void check_gemv_exact(Backend& gpu, std::mt19937& rng, DType dt, const Shape& s) {
  const HostT w = quantized(rng, dt, s.N, s.K);
  for (int64_t T : {1, 3, 8}) {
    const HostT x = int8_exact_activations(rng, T, s.K);
    std::string where;
    const double e = run_matmul(gpu, w, x, T, &where);
    EXPECT_LE(e, 2e-5) << dtype_name(dt) << " T=" << T << " N=" << s.N << " K=" << s.K << " " << where;
  }
}

TEST_F(CudaQuant, GemvExactActivationsEveryType) {
  for (DType dt : kAllTypes)
    for (const Shape& s : kShapes) check_gemv_exact(*gpu_, rng_, dt, s);
}

// 4421 rows of 2 segments: > 32 rows per block on ≤ 132 SMs, so a block's warps split its
// (row, segment) steps with rows shared by two warps, whose halves meet in shared memory.
TEST_F(CudaQuant, GemvRowsSharedByTwoWarps) {
  for (DType dt : {DType::Q8_0, DType::Q4_K, DType::Q6_K}) check_gemv_exact(*gpu_, rng_, dt, {4421, 2304});
}

TEST_F(CudaQuant, GemvQ8_0RowsOf32Blocks) {  // K a multiple of 32 only: 3 blocks; 64 + 1 blocks
  for (const Shape& s : {Shape{101, 96}, Shape{57, 2080}, Shape{4421, 2080}})
    for (int64_t T : {1, 3, 8}) {
      const HostT w = quantized(rng_, DType::Q8_0, s.N, s.K), x = int8_exact_activations(rng_, T, s.K);
      std::string where;
      EXPECT_LE(run_matmul(*gpu_, w, x, T, &where), 2e-5) << "N=" << s.N << " K=" << s.K << " T=" << T
                                                                   << " " << where;
    }
}

TEST_F(CudaQuant, GemvGeneralActivationsWithinInt8Error) {
  for (DType dt : {DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_XS}) {
    const HostT w = quantized(rng_, dt, 301, 2304);
    for (int64_t T : {1, 2, 5, 8}) {
      const HostT x = random_t(rng_, DType::F32, {T, 2304});
      std::string where;
      const double e = run_matmul(*gpu_, w, x, T, &where);
      std::printf("[ gemv ] %s T=%lld: int8-activation error %.2e of the largest dot\n",
                  std::string(dtype_name(dt)).c_str(), (long long)T, e);
      EXPECT_LE(e, 1e-2) << dtype_name(dt) << " T=" << T << " " << where;
    }
  }
}

// T·K activations too large for shared memory next to the rings (T = 8, K = 17408 on an H200):
// quantized by a separate kernel into global memory.
TEST_F(CudaQuant, GemvLargeKActivationsInGlobalMemory) {
  for (DType dt : {DType::Q8_0, DType::Q4_K, DType::Q6_K}) {
    const HostT w = quantized(rng_, dt, 300, 17408);
    for (int64_t T : {1, 8}) {
      const HostT x = int8_exact_activations(rng_, T, 17408);
      std::string where;
      EXPECT_LE(run_matmul(*gpu_, w, x, T, &where), 2e-5) << dtype_name(dt) << " T=" << T << " " << where;
    }
  }
}

TEST_F(CudaQuant, PrefillDequantizesToBf16) {
  for (DType dt : kAllTypes)
    for (const Shape& s : {Shape{301, 1280}, Shape{37, 2304}}) {
      const HostT w = quantized(rng_, dt, s.N, s.K);
      for (int64_t T : {9, 100}) {
        const HostT x = random_t(rng_, DType::F32, {T, s.K});
        std::string where;
        EXPECT_LE(run_matmul(*gpu_, w, x, T, &where), 1.5e-2)
            << dtype_name(dt) << " T=" << T << " N=" << s.N << " K=" << s.K << " " << where;
      }
    }
}

TEST_F(CudaQuant, ExactModeIsF32) {
  CudaOptions o;
  o.exact_matmul = true;
  auto exact = make_cuda_backend(o);
  for (DType dt : kAllTypes) {
    const HostT w = quantized(rng_, dt, 77, 1280);
    for (int64_t T : {1, 9, 100}) {
      const HostT x = random_t(rng_, DType::F32, {T, 1280});
      std::string where;
      EXPECT_LE(run_matmul(*exact, w, x, T, &where), 2e-5) << dtype_name(dt) << " T=" << T << " " << where;
    }
  }
}

TEST_F(CudaQuant, EmbedEqualsCpu) {
  for (DType dt : kAllTypes) {
    const HostT table = quantized(rng_, dt, 50, 512);
    const std::vector<int32_t> ids{3, 0, 49, 3, 17};
    HostT want(DType::F32, {5, 512});
    cpu::embed(table.t, ids, want.t);
    DevT dt_ = upload(*gpu_, table), out = upload(*gpu_, HostT(DType::F32, {5, 512}));
    gpu_->embed(dt_.t, ids, out.t);
    EXPECT_EQ(rel_err(download(*gpu_, out.t), want.floats()), 0.0) << dtype_name(dt);
    const std::vector<int32_t> bad{50};
    Tensor one = out.t;
    one.shape[0] = 1;
    EXPECT_THROW(gpu_->embed(dt_.t, bad, one), Error) << dtype_name(dt);
  }
}

// Decode GEMV on the 27B's large matrices: spot-checked, and its weight bandwidth printed next
// to the device copy bandwidth (the ≥ 85% target is judged by `qwen36 bench`). Rows are 64
// quantized random rows repeated, so building 90 M weights stays fast.
TEST_F(CudaQuant, GemvBandwidth27B) {
  const double copy = cuda_copy_bandwidth_gbs(size_t(1) << 30, 5);
  for (DType dt : {DType::Q4_K, DType::Q6_K})
    for (auto [N, K] : {std::pair<int64_t, int64_t>{17408, 5120}, {5120, 17408}}) {
      const HostT base = quantized(rng_, dt, 64, K);
      HostT w(dt, {N, K});
      const size_t rb = w.t.row_bytes();
      for (int64_t n = 0; n < N; ++n) std::memcpy(w.bytes.data() + size_t(n) * rb, base.bytes.data() + size_t(n % 64) * rb, rb);
      HostT x = random_t(rng_, DType::F32, {1, K});
      DevT dx = upload(*gpu_, x), dw = upload(*gpu_, w), dout = upload(*gpu_, HostT(DType::F32, {1, N}));
      gpu_->matmul(dx.t, dw.t, dout.t);
      const std::vector<float> got = download(*gpu_, dout.t), want = reference(w, x, 1, 997);
      double worst = 0, scale = 1;
      for (int64_t n = 0; n < N; n += 997) {
        worst = std::max(worst, std::abs(double(got[size_t(n)]) - double(want[size_t(n)])));
        scale = std::max(scale, std::abs(double(want[size_t(n)])));
      }
      EXPECT_LE(worst / scale, 1e-2) << dtype_name(dt) << " " << N << " x " << K;
      const int reps = 50;
      cuda_synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) gpu_->matmul(dx.t, dw.t, dout.t);
      cuda_synchronize();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
      const double gbs = double(w.t.nbytes()) / s / 1e9;
      std::printf("[ gemv ] %s %lld x %lld, T=1: %.1f us, %.0f GB/s = %.1f%% of copy bandwidth %.0f GB/s\n",
                  std::string(dtype_name(dt)).c_str(), (long long)N, (long long)K, s * 1e6, gbs, 100 * gbs / copy,
                  copy);
    }
}

// llama.cpp's own Q8_0 / Q6_K / Q4_K_M files of the dense fixture (tests/data/llamacpp-gguf)
// end to end on the GPU: one 80-token prefill (bf16 GEMMs) and 80 one-token decode steps (int8
// GEMVs). Their distance to llama.cpp's logits of the same file must stay within the
// quantization error itself (llama.cpp vs transformers): each path rounds activations its own
// way (bf16 / int8 per 32; llama.cpp: Q8_0 / Q8_K), so equality is not expected. The CPU
// engine's distance is printed alongside.
class CudaQuantGguf : public ::testing::TestWithParam<std::string> {};

double mean_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += std::abs(double(a[i]) - double(b[i]));
  return s / double(std::max<size_t>(a.size(), 1));
}

TEST_P(CudaQuantGguf, LogitsWithinQuantizationError) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no CUDA device, CUDA tests skipped: " << why;
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(QWEN36_TEST_DATA) / "llamacpp-gguf" / "dense-a";
  const std::string type = GetParam(), file = (dir / ("model-" + type + ".gguf")).string();
  const auto tokens = test::read_raw<int32_t>(dir / "tokens.i32");
  const auto hf = test::read_raw<float>(dir / "logits.f32");
  const auto lc = test::read_raw<float>(dir / ("logits-llamacpp-" + type + ".f32"));
  auto gpu = make_cuda_backend();
  auto cpu = make_cpu_backend();
  Model mg(load_model_weights(file), *gpu), mc(load_model_weights(file), *cpu);
  const int64_t V = mg.config().vocab_size, n = int64_t(tokens.size());
  ASSERT_EQ(hf.size(), size_t(n * V));
  auto prefill = [&](Model& m) {
    ModelState st(m.backend(), m.config(), 1, n, false);
    std::vector<float> out(size_t(n * V));
    m.forward(ForwardBatch::single(tokens, 0, 0, true), st, out.data());
    return out;
  };
  std::vector<float> decode(size_t(n * V));
  {
    ModelState st(*gpu, mg.config(), 1, n, false);
    for (int64_t i = 0; i < n; ++i)
      mg.forward(ForwardBatch::single(std::span(tokens).subspan(size_t(i), 1), int32_t(i), 0), st,
                 decode.data() + i * V);
  }
  const std::vector<float> gp = prefill(mg), cp = prefill(mc);
  const double quant_err = mean_abs_diff(lc, hf), e_pre = mean_abs_diff(gp, lc), e_dec = mean_abs_diff(decode, lc),
               e_cpu = mean_abs_diff(cp, lc);
  std::printf("[ dense-a %s ] mean |x - llama.cpp|: cuda prefill %.4g, cuda decode %.4g, cpu %.4g; "
              "quantization error (llama.cpp - transformers) %.4g\n",
              type.c_str(), e_pre, e_dec, e_cpu, quant_err);
  EXPECT_LE(e_pre, quant_err);
  EXPECT_LE(e_dec, quant_err);
}

INSTANTIATE_TEST_SUITE_P(DenseA, CudaQuantGguf, ::testing::Values("q8_0", "q6_k", "q4_k_m"));

}  // namespace
}  // namespace qwen36::gputest
