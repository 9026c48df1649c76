// The Hugging Face checkpoint block types on CUDA (backend/cuda/cuda_quant_hf.cu) against the
// CPU's exact dequantization (quant/hf_blocks.h) and a double-precision product:
//  - decode GEMV (T = 1, 3, 5, 8: one and two passes; one K chunk and several), prefill
//    (T = 40: bf16 slices + cuBLAS) and exact_matmul (f32 slices), per type, random blocks;
//  - embedding rows;
//  - the fixtures of tests/data/quant through the CUDA backend vs the CPU backend's logits;
//  - a cold-L2 bandwidth print for the 27B's 17408 x 5120 matrix in W4_G128 and NVFP4 at T = 1.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "format/model_loader.h"
#include "model/qwen36.h"
#include "quant/hf_blocks.h"
#include "quant_test_util.h"

namespace qwen36::cuda {
// cuda_fp8_gemm.cu: its switch (1 on, 0 off, −1 the environment again) and whether it takes w.
void fp8_gemm_select(int on);
bool fp8_gemm_takes(const Tensor& w, int64_t T);
}  // namespace qwen36::cuda

namespace qwen36::gputest {
namespace {

namespace fs = std::filesystem;

constexpr DType kTypes[] = {DType::W4_G32, DType::W4_G128, DType::F8_B128, DType::NVFP4_B64};

// x [T, K] as the FP8 GEMM quantizes it (cuda_fp8_gemm.cu), back in f32: per token and 128
// columns, scale amax / 448 (e4m3's largest finite), codes e4m3(x · 448 / amax) rounded to
// nearest even and saturated (core/dtype's f32_to_f8_e4m3 of the same f32 product).
HostT w8a8_activations(const HostT& x, int64_t T, int64_t K) {
  HostT xq(DType::F32, {T, K});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < K; g += 128) {
      const float* v = x.t.as<const float>() + t * K + g;
      float amax = 0.0f;
      for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(v[i]));
      const float inv = amax > 0.0f ? 448.0f / amax : 0.0f, scale = amax > 0.0f ? amax / 448.0f : 1.0f;
      for (int i = 0; i < 128; ++i) xq.f()[t * K + g + i] = f8_e4m3_to_f32(f32_to_f8_e4m3(v[i] * inv)) * scale;
    }
  return xq;
}

class CudaQuantHf : public CudaTest {};

// Tolerances (relative to max(1, max |result|)):
//  - GEMV and exact_matmul: the exact weights times f32 activations, summed in f32 in another
//    order than the double reference: ≤ K·2^-24 relative in the worst case, ~1e-6 in practice;
//    1e-4 leaves a wide margin and still catches one wrong code (a code step moves a result by
//    scale·|x| ≈ 1e-2 of these results' magnitude).
//  - prefill (T > 8): weights and activations rounded to bf16 (2^-9 relative each), products
//    summed in f32 by cuBLAS: random errors of ~2^-8·|term|·sqrt(K), ~1e-3 of the largest
//    result; 1e-2.
//  - FP8 weights at T > 8 on Hopper (the W8A8 GEMM): against the twin of its quantized
//    activations, 2e-3 (Fp8GemmMatchesW8A8Twin says why).
TEST_F(CudaQuantHf, MatmulMatchesCpuDequant) {
  struct Shape {
    int64_t N, K;
  };
  // 9216: 288 units of 32 per row, two K chunks (summed by the second kernel); 67 rows: tails.
  // 128 and 64: rows of a few units, as in the tiny fixtures (hidden 64 / 128), where
  // FixturesMatchCpu failed once on the H200 for one fixture (its message was lost).
  const Shape shapes[] = {{256, 512}, {640, 1536}, {67, 9216}, {48, 128}, {40, 64}};
  CudaOptions eo;
  eo.exact_matmul = true;
  auto exact = make_cuda_backend(eo);
  for (DType dt : kTypes)
    for (const Shape& s : shapes) {
      if (s.K % dtype_block_elems(dt) != 0) continue;  // K = 64 holds no 128-element block
      const HostT w = random_hf(rng_, dt, s.N, s.K);
      DevT dw = upload(*gpu_, w), dwe = upload(*exact, w);
      for (int64_t T : {1, 3, 5, 8, 40}) {
        const HostT x = random_t(rng_, DType::F32, {T, s.K});
        // FP8 weights at T > 8 on Hopper: W8A8 (cuda_fp8_gemm.cu), against its twin.
        const bool w8a8 = cuda::fp8_gemm_takes(dw.t, T);
        const std::vector<float> want_f32 = reference(w, x, T);
        const std::vector<float> want = w8a8 ? reference(w, w8a8_activations(x, T, s.K), T) : want_f32;
        DevT dx = upload(*gpu_, x), dout = upload(*gpu_, HostT(DType::F32, {T, s.N}));
        gpu_->matmul(dx.t, dw.t, dout.t);
        std::string where;
        const double tol = T <= 8 ? 1e-4 : w8a8 ? 2e-3 : 1e-2;
        EXPECT_LE(worst_rel_err(download(*gpu_, dout.t), want, T, s.N, 1, &where), tol)
            << dtype_name(dt) << " N=" << s.N << " K=" << s.K << " T=" << T
            << (T <= 8 ? " (gemv) " : w8a8 ? " (prefill, W8A8 twin) " : " (prefill) ") << where;
        if (T == 3 || T == 40) {
          DevT ex = upload(*exact, x), eout = upload(*exact, HostT(DType::F32, {T, s.N}));
          exact->matmul(ex.t, dwe.t, eout.t);
          EXPECT_LE(worst_rel_err(download(*exact, eout.t), want_f32, T, s.N, 1, &where), 1e-4)
              << dtype_name(dt) << " N=" << s.N << " K=" << s.K << " T=" << T << " (exact_matmul) " << where;
        }
      }
    }
}

// The prefill's bf16 dequantization value by value: x = the identity (T = K rows), so out[t, n]
// is the one product w[n, t] · 1, bitwise the exact weight rounded to bf16. 81 rows of 384: 12
// units a row, so a warp's 32 units span rows, and the last warp holds a partial set.
TEST_F(CudaQuantHf, PrefillDequantizationBitwise) {
  const int64_t N = 81, K = 384;
  HostT x(DType::F32, {K, K});
  for (int64_t t = 0; t < K; ++t) x.f()[t * K + t] = 1.0f;
  DevT dx = upload(*gpu_, x);
  for (DType dt : kTypes) {
    const HostT w = random_hf(rng_, dt, N, K);
    DevT dw = upload(*gpu_, w), dout = upload(*gpu_, HostT(DType::F32, {K, N}));
    gpu_->matmul(dx.t, dw.t, dout.t);
    const std::vector<float> got = download(*gpu_, dout.t);
    std::vector<float> row(static_cast<size_t>(K));
    int64_t bad = 0;
    for (int64_t n = 0; n < N; ++n) {
      dequantize_row(dt, w.t.row(n), row.data(), K);
      for (int64_t t = 0; t < K; ++t) bad += got[size_t(t * N + n)] != round_bf16(row[size_t(t)]);
    }
    EXPECT_EQ(bad, 0) << dtype_name(dt);
  }
}

// The MLP at T > 64 of HF-typed matrices (gate and up in one bf16 GEMM per slice, the SwiGLU in
// bf16 into the down GEMM's input; cuda_matmul_fused.cu): expect_fused_mlp_prefill.
// FP8 weights take the bf16 form where the W8A8 GEMM is off (QWEN36_FP8_GEMM=0, or not Hopper):
// it is switched off here; the W8A8 GEMM's own tests are the two above and below.
TEST_F(CudaQuantHf, MlpPrefill) {
  const int64_t H = 1024, I = 768;
  cuda::fp8_gemm_select(0);
  for (DType dt : kTypes) {
    const HostT wg = random_hf(rng_, dt, I, H), wu = random_hf(rng_, dt, I, H), wd = random_hf(rng_, dt, H, I);
    const DevT dg = upload(*gpu_, wg), du = upload(*gpu_, wu), dd = upload(*gpu_, wd);
    expect_fused_mlp_prefill(*gpu_, rng_, wg, wu, wd, MlpWeights{dg.t, du.t, dd.t}, 100, std::string(dtype_name(dt)));
  }
  cuda::fp8_gemm_select(-1);
}

// The FP8 tensor-core GEMM (cuda_fp8_gemm.cu, on by default; sm_90 only) against its W8A8
// twin in double: x quantized per token and 128 columns as the kernel does (scale amax / 448,
// e4m3 rounded to nearest even and saturated: core/dtype's f32_to_f8_e4m3, the same f32 product
// x · (448 / amax) first), times the exact weights. cuBLASLt sums each 128-column block's products
// before scaling them in f32: 2e-3 of the largest result against the twin. Against the f32
// activations, e4m3's relative steps of 2^-4 (errors of ~2^-6 of a result's scale, the worst of
// ~300,000 results several times that): 5e-2. T = 1025: padded to 1028 tokens for the scale
// layout; N = 68: a slice of 68 rows (a multiple of 4, not of 8).
TEST_F(CudaQuantHf, Fp8GemmMatchesW8A8Twin) {
  struct Shape {
    int64_t N, K;
  };
  cuda::fp8_gemm_select(1);
  for (const Shape& s : {Shape{256, 512}, Shape{68, 1024}})
    for (int64_t T : {1025, 1096}) {  // the GEMM takes T ≥ 1024
      const HostT w = random_hf(rng_, DType::F8_B128, s.N, s.K);
      if (!cuda::fp8_gemm_takes(w.t, T)) {
        cuda::fp8_gemm_select(-1);
        GTEST_SKIP() << "the FP8 block-scaled GEMM needs a compute capability 9.x device";
      }
      const HostT x = random_t(rng_, DType::F32, {T, s.K});
      const HostT xq = w8a8_activations(x, T, s.K);
      DevT dw = upload(*gpu_, w), dx = upload(*gpu_, x), dout = upload(*gpu_, HostT(DType::F32, {T, s.N}));
      gpu_->matmul(dx.t, dw.t, dout.t);
      const std::vector<float> got = download(*gpu_, dout.t);
      std::string where;
      EXPECT_LE(worst_rel_err(got, reference(w, xq, T), T, s.N, 1, &where), 2e-3)
          << "N=" << s.N << " K=" << s.K << " T=" << T << " (W8A8 twin) " << where;
      EXPECT_LE(worst_rel_err(got, reference(w, x, T), T, s.N, 1, &where), 5e-2)
          << "N=" << s.N << " K=" << s.K << " T=" << T << " (f32 activations) " << where;
    }
  cuda::fp8_gemm_select(-1);
}

// The FP8 MLP (cuda_fp8_gemm.cu's fp8_mlp: gate + up in one GEMM, the SwiGLU quantizing straight
// into the down GEMM's e4m3 activations) against the composition of the backend's own ops (two
// W8A8 GEMMs, an f32 SwiGLU, the W8A8 down GEMM): the same quantization points, so they differ
// only where the one GEMM's f32 sums (another N, maybe another algorithm) move a SwiGLU value
// across an e4m3 rounding boundary: one code step (2^-4 of the value) shifts a result by ~2^-4 /
// sqrt(I) of the largest, 1e-2 allows a handful. The scratch outputs stay untouched (the fused
// path ran). T = 1027: padded to 1028 tokens.
TEST_F(CudaQuantHf, Fp8MlpMatchesComposition) {
  const int64_t H = 1024, I = 768, T = 1027;
  const HostT wg = random_hf(rng_, DType::F8_B128, I, H), wu = random_hf(rng_, DType::F8_B128, I, H),
              wd = random_hf(rng_, DType::F8_B128, H, I);
  const DevT dg = upload(*gpu_, wg), du = upload(*gpu_, wu), dd = upload(*gpu_, wd);
  cuda::fp8_gemm_select(1);
  if (!cuda::fp8_gemm_takes(dg.t, T)) {
    cuda::fp8_gemm_select(-1);
    GTEST_SKIP() << "the FP8 block-scaled GEMM needs a compute capability 9.x device";
  }
  const HostT x = random_t(rng_, DType::F32, {T, H});
  const DevT dx = upload(*gpu_, x);
  DevT g = upload(*gpu_, HostT(DType::F32, {T, I})), u = upload(*gpu_, HostT(DType::F32, {T, I})),
       a = upload(*gpu_, HostT(DType::F32, {T, I})), want = upload(*gpu_, HostT(DType::F32, {T, H}));
  gpu_->matmul(dx.t, dg.t, g.t);
  gpu_->matmul(dx.t, du.t, u.t);
  gpu_->swiglu(g.t, u.t, a.t);
  gpu_->matmul(a.t, dd.t, want.t);
  DevT gate_out = upload(*gpu_, HostT(DType::F32, {T, I})), up_out = upload(*gpu_, HostT(DType::F32, {T, I})),
       out = upload(*gpu_, HostT(DType::F32, {T, H}));
  gpu_->mlp(dx.t, MlpWeights{dg.t, du.t, dd.t}, gate_out.t, up_out.t, out.t);
  cuda::fp8_gemm_select(-1);
  std::string where;
  const std::vector<float> got = download(*gpu_, out.t), ref = download(*gpu_, want.t);
  const double err = worst_rel_err(got, ref, T, H, 1, &where);
  std::printf("[ fp8-mlp ] fused vs composed: %.2e of the largest result\n", err);
  EXPECT_LE(err, 1e-2) << where;
  for (const DevT* scratch : {&gate_out, &up_out}) {
    const std::vector<float> v = download(*gpu_, scratch->t);
    EXPECT_EQ(std::count(v.begin(), v.end(), 0.0f), int64_t(v.size())) << "the composition ran";
  }
}

// The GEMV is deterministic (fixed partition, reductions in a fixed order): repeated calls agree
// bit for bit.
TEST_F(CudaQuantHf, GemvIsDeterministic) {
  for (DType dt : kTypes) {
    const HostT w = random_hf(rng_, dt, 640, 9216);
    const HostT x = random_t(rng_, DType::F32, {3, 9216});
    DevT dw = upload(*gpu_, w), dx = upload(*gpu_, x), dout = upload(*gpu_, HostT(DType::F32, {3, 640}));
    gpu_->matmul(dx.t, dw.t, dout.t);
    const std::vector<float> first = download(*gpu_, dout.t);
    for (int r = 0; r < 3; ++r) {
      gpu_->matmul(dx.t, dw.t, dout.t);
      const std::vector<float> again = download(*gpu_, dout.t);
      EXPECT_EQ(std::memcmp(first.data(), again.data(), first.size() * sizeof(float)), 0) << dtype_name(dt) << " run " << r;
    }
  }
}

// Embedding rows are the exact dequantized rows.
TEST_F(CudaQuantHf, EmbedRowsAreExact) {
  for (DType dt : kTypes) {
    const HostT w = random_hf(rng_, dt, 50, 512);
    DevT dw = upload(*gpu_, w);
    const std::vector<int32_t> ids = {3, 0, 49, 17, 3};
    DevT dout = upload(*gpu_, HostT(DType::F32, {int64_t(ids.size()), 512}));
    gpu_->embed(dw.t, ids, dout.t);
    const std::vector<float> got = download(*gpu_, dout.t);
    std::vector<float> row(512);
    for (size_t i = 0; i < ids.size(); ++i) {
      dequantize_row(dt, w.t.row(ids[i]), row.data(), 512);
      EXPECT_EQ(std::memcmp(row.data(), got.data() + i * 512, 512 * sizeof(float)), 0) << dtype_name(dt) << " id " << ids[i];
    }
  }
}

// The fixtures of tests/data/quant (tiny models whose quantized Linears are every HF format):
// the CUDA backend's logits against the CPU backend's, for a 37-token prefill with
// exact_matmul (f32 everywhere: 2e-3, the golden tests' exact bound) and for token-by-token
// decode (the GEMV: 1e-3, as CudaGolden.IncrementalDecodeMatchesCpu).
TEST_F(CudaQuantHf, FixturesMatchCpu) {
  const char* formats[] = {"awq", "gptq-sym", "ct-int4", "ct-int4-sym-g128", "fp8", "nvfp4", "ct-nvfp4", "gptq-actorder"};
  auto cpu = make_cpu_backend(1);
  CudaOptions eo;
  eo.exact_matmul = true;
  for (const char* f : formats) {
    const std::string dir = (fs::path(QWEN36_TEST_DATA) / "quant" / f).string();
    Model mc(load_model_weights(dir), *cpu);
    const int64_t V = mc.config().vocab_size;
    std::vector<int32_t> tokens;
    for (int i = 0; i < 37; ++i) tokens.push_back(int32_t((i * 53 + 7) % V));
    {
      auto be = make_cuda_backend(eo);
      Model mg(load_model_weights(dir), *be);
      const int64_t n = int64_t(tokens.size());
      ModelState sc(*cpu, mc.config(), 1, n, false), sg(*be, mg.config(), 1, n, false);
      std::vector<float> lc(size_t(n * V)), lg(size_t(n * V));
      mc.forward(ForwardBatch::single(tokens, 0, 0, true), sc, lc.data());
      mg.forward(ForwardBatch::single(tokens, 0, 0, true), sg, lg.data());
      float worst = 0;
      for (size_t i = 0; i < lc.size(); ++i) worst = std::max(worst, std::abs(lc[i] - lg[i]));
      std::printf("[ %s ] cuda exact prefill vs cpu: max |dlogit| = %.3g\n", f, double(worst));
      EXPECT_LE(worst, 2e-3f) << f << " prefill (exact_matmul)";
    }
    {
      auto be = make_cuda_backend();
      Model mg(load_model_weights(dir), *be);
      const int64_t n = 12;
      ModelState sc(*cpu, mc.config(), 1, n, false), sg(*be, mg.config(), 1, n, false);
      std::vector<float> lc(static_cast<size_t>(V)), lg(static_cast<size_t>(V));
      float worst = 0;
      for (int64_t i = 0; i < n; ++i) {
        const auto tok = std::span<const int32_t>(tokens).subspan(size_t(i), 1);
        mc.forward(ForwardBatch::single(tok, int32_t(i), 0), sc, lc.data());
        mg.forward(ForwardBatch::single(tok, int32_t(i), 0), sg, lg.data());
        for (size_t k = 0; k < lc.size(); ++k) worst = std::max(worst, std::abs(lc[k] - lg[k]));
      }
      std::printf("[ %s ] cuda decode vs cpu, %lld steps: max |dlogit| = %.3g\n", f, (long long)n, double(worst));
      EXPECT_LE(worst, 1e-3f) << f << " decode";
    }
  }
}

// Cold-L2 GEMV bandwidth on the 27B's 17408 x 5120 MLP matrix (T = 1), next to the device copy
// bandwidth; spot-checked against the reference. Copies adding up to > 256 MB (over 4x the
// H200's L2) are rotated so every call streams its weights from HBM.
TEST_F(CudaQuantHf, Bandwidth27B) {
  const double copy = cuda_copy_bandwidth_gbs(size_t(1) << 30, 5);
  for (DType dt : {DType::W4_G128, DType::NVFP4_B64, DType::F8_B128})
    for (auto [N, K] : {std::pair<int64_t, int64_t>{17408, 5120}, {5120, 17408}}) {
      const HostT base = random_hf(rng_, dt, 64, K);
      HostT w(dt, {N, K});
      const size_t rb = w.t.row_bytes();
      for (int64_t n = 0; n < N; ++n)
        std::memcpy(w.bytes.data() + size_t(n) * rb, base.bytes.data() + size_t(n % 64) * rb, rb);
      const int copies = int(std::max<size_t>(2, (size_t(256) << 20) / w.bytes.size() + 1));
      std::vector<DevT> dw;
      for (int i = 0; i < copies; ++i) dw.push_back(upload(*gpu_, w));
      for (int64_t T : {1, 4, 8}) {
        const HostT x = random_t(rng_, DType::F32, {T, K});
        DevT dx = upload(*gpu_, x), dout = upload(*gpu_, HostT(DType::F32, {T, N}));
        const double s = time_per_call(copies, [&](int i) { gpu_->matmul(dx.t, dw[size_t(i)].t, dout.t); });
        std::string where;
        EXPECT_LE(worst_rel_err(download(*gpu_, dout.t), reference(w, x, T, 997), T, N, 997, &where), 1e-4)
            << dtype_name(dt) << " " << where;
        const double gbs = double(w.t.nbytes()) / s / 1e9;
        std::printf("[ hf-gemv-cold ] %s %lld x %lld, T=%lld: %.1f us, %.0f GB/s = %.1f%% of copy bandwidth %.0f GB/s\n",
                    std::string(dtype_name(dt)).c_str(), (long long)N, (long long)K, (long long)T, s * 1e6, gbs,
                    100 * gbs / copy, copy);
      }
    }
}

}  // namespace
}  // namespace qwen36::gputest
