// Block-quantized weights on the GPU (cuda_quant_matmul.cu) against the CPU reference. Weights
// come from the project's quantizer (quantize_row) on random rows whose 32-blocks have varied
// magnitudes; the reference is the dequantized rows (cpu::weight_row_to_f32) times x in double.
// Tolerances (rel_err: max |Δ| over max(1, max |want|)):
//  - Decode GEMV (T ≤ 8) multiplies the weights with the activations rounded to int8 per 32
//    (scale amax/127, nearest even; the min / zero-point terms use the same int8 values). Its
//    CPU twin int8_activations() rounds the same way, so against the reference on those
//    activations only f32 scaling and summation differ: 2e-5. Activations whose 32-blocks are
//    exactly d · k (d a power of two, |k| ≤ 127, one |k| = 127) are their own int8 rounding: the
//    GEMV equals the f32 product there, 2e-5.
//  - Against the f32 product on general activations, each output's error is bounded by
//    Σ_i |w_i| · |x̃_i − x_i| ≤ Σ_i |w_i| · (d_b(i) / 2 + 2^-22 |x_i|) (d_b = amax_b / 127; the
//    second term: x · (127/amax) is one f32 product), checked per output (it is ~10× the
//    typical error, which is printed).
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
#include "quant_test_util.h"
#include "model/qwen36.h"
#include "quant/quant.h"

namespace qwen36::gputest {
namespace {

class CudaQuant : public CudaTest {};

const DType kAllTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0,  DType::Q5_1,  DType::Q8_0,
                           DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_XS};

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

// GEMV tasks are 8 super-blocks or 32 small blocks (a row segment, or whole rows when 2..8 fit).
// Shapes for every type: 37 rows (fewer than SMs) of 256 weights (8 rows / 4 rows per task);
// 301 rows of 5 and 9 super-blocks (one partial segment; a full and a partial one).
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

// 4421 rows of 2+ segments: > 32 rows per block on ≤ 132 SMs, so a block's warps split its
// tasks with rows shared by two warps, whose parts meet in shared memory.
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

// The GEMV is the dot with the int8-rounded activations, exactly (up to f32 arithmetic): every
// type, T = 1..8, shapes with partial segments and with one block per row.
TEST_F(CudaQuant, GemvEqualsDotWithInt8Activations) {
  for (DType dt : kAllTypes)
    for (const Shape& s : {Shape{301, 2304}, Shape{37, 256}, Shape{129, 5120}}) {
      const HostT w = quantized(rng_, dt, s.N, s.K);
      for (int64_t T : {1, 2, 5, 8}) {
        const HostT x = random_t(rng_, DType::F32, {T, s.K});
        DevT dw = upload(*gpu_, w), dx = upload(*gpu_, x), dout = upload(*gpu_, HostT(DType::F32, {T, s.N}));
        gpu_->matmul(dx.t, dw.t, dout.t);
        const std::vector<float> got = download(*gpu_, dout.t), want = reference(w, int8_activations(x), T);
        EXPECT_LE(rel_err(got, want), 2e-5) << dtype_name(dt) << " T=" << T << " N=" << s.N << " K=" << s.K << " "
                                            << worst_at(got, want, s.N);
      }
    }
}

// Against the f32 product: within the int8 rounding bound of each output (see the header).
TEST_F(CudaQuant, GemvGeneralActivationsWithinInt8Bound) {
  for (DType dt : {DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_XS}) {
    const int64_t N = 301, K = 2304;
    const HostT w = quantized(rng_, dt, N, K);
    for (int64_t T : {1, 2, 5, 8}) {
      const HostT x = random_t(rng_, DType::F32, {T, K});
      DevT dw = upload(*gpu_, w), dx = upload(*gpu_, x), dout = upload(*gpu_, HostT(DType::F32, {T, N}));
      gpu_->matmul(dx.t, dw.t, dout.t);
      const std::vector<float> got = download(*gpu_, dout.t), want = reference(w, x, T);
      std::vector<float> row(static_cast<size_t>(K));
      double worst_ratio = 0, se = 0, sw = 0;
      for (int64_t n = 0; n < N; ++n) {
        cpu::weight_row_to_f32(w.t, n, row.data());
        for (int64_t t = 0; t < T; ++t) {
          const float* xt = x.t.as<const float>() + t * K;
          double bound = 0;
          for (int64_t b = 0; b < K; b += 32) {
            float amax = 0.0f;
            for (int64_t i = b; i < b + 32; ++i) amax = std::max(amax, std::abs(xt[i]));
            for (int64_t i = b; i < b + 32; ++i)
              bound += std::abs(double(row[size_t(i)])) * (double(amax) / 254.0 + std::ldexp(std::abs(double(xt[i])), -22));
          }
          const size_t o = size_t(t * N + n);
          const double err = std::abs(double(got[o]) - double(want[o]));
          EXPECT_LE(err, bound * 1.001 + 1e-5) << dtype_name(dt) << " T=" << T << " t=" << t << " n=" << n << ": got "
                                               << got[o] << " want " << want[o];
          worst_ratio = std::max(worst_ratio, err / bound);
          se += err * err, sw += double(want[o]) * want[o];
        }
      }
      std::printf("[ gemv ] %s T=%lld: int8 activations: rms error %.2e of the rms dot, worst error %.2f of its bound\n",
                  std::string(dtype_name(dt)).c_str(), (long long)T, std::sqrt(se / sw), worst_ratio);
    }
  }
}

// Rows shorter than a task (8 super-blocks / 32 blocks): several whole rows per task, their
// lanes reduced separately; N not a multiple of the rows per task.
TEST_F(CudaQuant, GemvShortRowsShareTasks) {
  for (DType dt : kAllTypes) {
    const bool super = dtype_block_elems(dt) == 256;
    for (int64_t K : super ? std::vector<int64_t>{256, 512, 1024} : std::vector<int64_t>{128, 256, 512})
      for (int64_t N : {301, 5}) check_gemv_exact(*gpu_, rng_, dt, {N, K});
  }
}

// A few long rows: each row's segments spread over many warps, summed in warp order.
TEST_F(CudaQuant, GemvRowsSplitAcrossManyWarps) {
  for (DType dt : {DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::IQ4_XS})
    for (int64_t N : {1, 3, 40}) check_gemv_exact(*gpu_, rng_, dt, {N, 17408});
}

// T·K activations too large for shared memory next to the rings (T = 8, K = 17408 on an H200
// for the staged types): the GEMV runs on halves of T.
TEST_F(CudaQuant, GemvLargeActivationsSplitT) {
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

// Copies of a host matrix on the device adding up to > 256 MB (over 4× the H200's L2), so that
// rotating over them measures the weights streamed from HBM, as a decode step does.
std::vector<DevT> cold_copies(Backend& gpu, const HostT& w) {
  const int copies = int(std::max<size_t>(2, (size_t(256) << 20) / w.bytes.size() + 1));
  std::vector<DevT> d;
  for (int i = 0; i < copies; ++i) d.push_back(upload(gpu, w));
  return d;
}

// Outputs n % step == 0 of got [T, N] against the int8 twin (2e-5 of the largest checked).
void spot_check(const std::vector<float>& got, const HostT& w, const HostT& x, int64_t T, const std::string& what,
                int64_t step = 997) {
  const int64_t N = w.t.rows();
  const std::vector<float> want = reference(w, int8_activations(x), T, step);
  double worst = 0, scale = 1;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; n += step) {
      const size_t i = size_t(t * N + n);
      worst = std::max(worst, std::abs(double(got[i]) - double(want[i])));
      scale = std::max(scale, std::abs(double(want[i])));
    }
  EXPECT_LE(worst / scale, 2e-5) << what;
}

// Decode GEMV bandwidth on the 27B's large matrices, weights streamed from HBM (cold L2), next
// to the device copy bandwidth (target ≥ 80% at T = 1; `qwen36 bench` judges the model);
// T = 2, 4, 8 for the Q4_K_M types. Spot-checked against the int8 twin.
TEST_F(CudaQuant, GemvBandwidth27B) {
  const double copy = cuda_copy_bandwidth_gbs(size_t(1) << 30, 5);
  for (DType dt : {DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::Q5_K, DType::IQ4_XS})
    for (auto [N, K] : {std::pair<int64_t, int64_t>{17408, 5120}, {5120, 17408}}) {
      const HostT w = repeated_rows(rng_, dt, N, K);
      std::vector<DevT> dw = cold_copies(*gpu_, w);
      const bool mix = dt == DType::Q4_K || dt == DType::Q6_K;
      for (int64_t T : mix ? std::vector<int64_t>{1, 2, 4, 8} : std::vector<int64_t>{1}) {
        const HostT x = random_t(rng_, DType::F32, {T, K});
        DevT dx = upload(*gpu_, x), dout = upload(*gpu_, HostT(DType::F32, {T, N}));
        const double s = time_per_call(int(dw.size()), [&](int i) { gpu_->matmul(dx.t, dw[size_t(i)].t, dout.t); });
        const std::string what = std::string(dtype_name(dt)) + " " + std::to_string(N) + " x " + std::to_string(K) +
                                 ", T=" + std::to_string(T);
        spot_check(download(*gpu_, dout.t), w, x, T, what);
        const double gbs = double(w.t.nbytes()) / s / 1e9;
        std::printf("[ gemv-cold ] %s: %.1f us, %.0f GB/s = %.1f%% of copy bandwidth %.0f GB/s\n", what.c_str(),
                    s * 1e6, gbs, 100 * gbs / copy, copy);
      }
    }
}

// Backend::matmul_multi with quantized matrices of two types, a bf16 one among them (one launch
// per quantized type, the bf16 through the bf16 multi-GEMV), against separate references;
// K = 512: groups of 4 short rows cross the matrices' boundaries. Int8-exact activations, so
// every product is the f32 one: 2e-5.
TEST_F(CudaQuant, MultiMixedTypes) {
  for (int64_t K : {2304, 512}) {
    const std::vector<std::pair<DType, int64_t>> mats = {
        {DType::Q4_K, 300}, {DType::Q4_K, 7}, {DType::Q6_K, 65}, {DType::BF16, 20}, {DType::Q4_K, 5}};
    std::vector<HostT> hw;
    for (auto [dt, n] : mats) hw.push_back(dt == DType::BF16 ? random_t(rng_, dt, {n, K}) : quantized(rng_, dt, n, K));
    std::vector<DevT> dw;
    std::vector<const Tensor*> ws;
    for (const HostT& h : hw) dw.push_back(upload(*gpu_, h));
    for (const DevT& d : dw) ws.push_back(&d.t);
    for (int64_t T : {1, 3, 8}) {
      const HostT x = int8_exact_activations(rng_, T, K);
      DevT dx = upload(*gpu_, x);
      const auto outs = matmul_multi_outputs(*gpu_, dx.t, ws);
      for (size_t i = 0; i < mats.size(); ++i) {
        const std::vector<float>& got = outs[i];
        const std::vector<float> want = reference(hw[i], x, T);
        EXPECT_LE(rel_err(got, want), 2e-5) << "matrix " << i << " (" << dtype_name(mats[i].first) << ") K=" << K
                                            << " T=" << T << " " << worst_at(got, want, mats[i].second);
      }
    }
  }
}

// Backend::matmul_swiglu on quantized gate/up: silu(x·gate)·(x·up) in one launch, against the
// int8 twin in double. g and u are within 2e-5 of their scale, the product within ~4e-5 of g·u's:
// 1e-4. K = 512: the short-row tasks hold gate and up rows together.
TEST_F(CudaQuant, SwigluMatchesInt8Twin) {
  for (DType dt : {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_0, DType::IQ4_XS})
    for (const Shape& s : {Shape{301, 2304}, Shape{77, 512}}) {
      const HostT g = quantized(rng_, dt, s.N, s.K), u = quantized(rng_, dt, s.N, s.K);
      DevT dg = upload(*gpu_, g), du = upload(*gpu_, u);
      for (int64_t T : {1, 3, 8}) {
        const HostT x = random_t(rng_, DType::F32, {T, s.K});
        const HostT xq = int8_activations(x);
        DevT dx = upload(*gpu_, x), go = upload(*gpu_, HostT(DType::F32, {T, s.N})),
             uo = upload(*gpu_, HostT(DType::F32, {T, s.N}));
        gpu_->matmul_swiglu(dx.t, dg.t, du.t, go.t, uo.t);
        const std::vector<float> rg = reference(g, xq, T), ru = reference(u, xq, T);
        std::vector<float> want(rg.size());
        for (size_t i = 0; i < want.size(); ++i) want[i] = float(double(rg[i]) / (1.0 + std::exp(-double(rg[i]))) * ru[i]);
        const std::vector<float> got = download(*gpu_, go.t);
        EXPECT_LE(rel_err(got, want), 1e-4) << dtype_name(dt) << " N=" << s.N << " K=" << s.K << " T=" << T << " "
                                            << worst_at(got, want, s.N);
      }
    }
}

// The 27B Q4_K_M decode groups with cold weights, T = 1: DeltaNet's in-projections (qkv 10240
// rows, Q6_K in the _M mix's "more bits" layers, else Q4_K; z 6144, b and a 48, Q4_K) as one
// matmul_multi, and the MLP's gate/up (17408 rows each) with the SwiGLU. Printed against the
// copy bandwidth, spot-checked against the int8 twin.
TEST_F(CudaQuant, FusedGroups27B) {
  const double copy = cuda_copy_bandwidth_gbs(size_t(1) << 30, 5);
  const int64_t K = 5120;
  for (DType qkv : {DType::Q4_K, DType::Q6_K}) {
    const std::vector<std::pair<DType, int64_t>> mats = {{qkv, 10240}, {DType::Q4_K, 6144}, {DType::Q4_K, 48}, {DType::Q4_K, 48}};
    std::vector<HostT> hw;
    size_t bytes = 0;
    for (auto [dt, n] : mats) hw.push_back(repeated_rows(rng_, dt, n, K)), bytes += hw.back().bytes.size();
    const int copies = int((size_t(256) << 20) / bytes + 2);
    std::vector<std::vector<DevT>> dw(static_cast<size_t>(copies));
    for (auto& c : dw)
      for (const HostT& h : hw) c.push_back(upload(*gpu_, h));
    const HostT x = random_t(rng_, DType::F32, {1, K});
    DevT dx = upload(*gpu_, x);
    std::vector<DevT> dout;
    for (auto [dt, n] : mats) dout.push_back(upload(*gpu_, HostT(DType::F32, {1, n})));
    std::vector<Tensor*> outs;
    for (DevT& o : dout) outs.push_back(&o.t);
    const double s = time_per_call(copies, [&](int i) {
      std::vector<const Tensor*> ws;
      for (const DevT& d : dw[size_t(i)]) ws.push_back(&d.t);
      gpu_->matmul_multi(dx.t, ws, outs);
    });
    for (size_t i = 0; i < mats.size(); ++i) spot_check(download(*gpu_, dout[i].t), hw[i], x, 1, "deltanet in-proj " + std::to_string(i), 47);
    const double gbs = double(bytes) / s / 1e9;
    std::printf("[ gemv-cold ] deltanet in-proj multi (qkv %s, z/b/a q4_k), T=1: %.1f us, %.0f GB/s = %.1f%% of copy %.0f GB/s\n",
                std::string(dtype_name(qkv)).c_str(), s * 1e6, gbs, 100 * gbs / copy, copy);
  }
  {
    const int64_t N = 17408;
    const HostT g = repeated_rows(rng_, DType::Q4_K, N, K), u = repeated_rows(rng_, DType::Q4_K, N, K);
    const size_t bytes = g.bytes.size() + u.bytes.size();
    const int copies = int((size_t(256) << 20) / bytes + 2);
    std::vector<DevT> dg, du;
    for (int i = 0; i < copies; ++i) dg.push_back(upload(*gpu_, g)), du.push_back(upload(*gpu_, u));
    const HostT x = random_t(rng_, DType::F32, {1, K});
    DevT dx = upload(*gpu_, x), go = upload(*gpu_, HostT(DType::F32, {1, N})), uo = upload(*gpu_, HostT(DType::F32, {1, N}));
    const double s = time_per_call(copies, [&](int i) { gpu_->matmul_swiglu(dx.t, dg[size_t(i)].t, du[size_t(i)].t, go.t, uo.t); });
    const HostT xq = int8_activations(x);
    const std::vector<float> rg = reference(g, xq, 1, 997), ru = reference(u, xq, 1, 997), got = download(*gpu_, go.t);
    double worst = 0, scale = 1;
    for (int64_t n = 0; n < N; n += 997) {
      const double want = double(rg[size_t(n)]) / (1.0 + std::exp(-double(rg[size_t(n)]))) * ru[size_t(n)];
      worst = std::max(worst, std::abs(got[size_t(n)] - want)), scale = std::max(scale, std::abs(want));
    }
    EXPECT_LE(worst / scale, 1e-4) << "mlp swiglu";
    const double gbs = double(bytes) / s / 1e9;
    std::printf("[ gemv-cold ] mlp gate/up + swiglu q4_k 2 x %lld x %lld, T=1: %.1f us, %.0f GB/s = %.1f%% of copy %.0f GB/s\n",
                (long long)N, (long long)K, s * 1e6, gbs, 100 * gbs / copy, copy);
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
