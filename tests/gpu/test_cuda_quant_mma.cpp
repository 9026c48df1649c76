// The tensor-core GEMM of tiled quantized weights (backend/cuda/cuda_quant_mma.cu) against the
// CPU reference. Weights: the project's quantizer on random rows (Q4_K, Q6_K, Q8_0; random
// W4_G128 blocks), uploaded and repacked on the device (cuda_tile_matrix); the reference is the
// dequantized rows (cpu::weight_row_to_f32) times x in double.
// Tolerances (rel_err: max |Δ| over max(1, max |want|)):
//  - T ≤ 64: activations rounded to int8 per 32 exactly as the decode GEMV (d = amax/127,
//    nearest even); the integer products are exact (int32 MMA) and each k32 group's scale is
//    applied in f32, so against the twin int8_activations() only f32 scaling and summation
//    differ (K/32 terms of relative error ~1e-7): 2e-5, as test_cuda_quant.cpp.
//  - T > 64: tiles dequantized to bf16 (rounded once, as quant/dequantize.cpp) and activations
//    rounded to bf16: 1.5e-2, as the bf16 GEMM tests. exact_matmul (f32 dequantization, f32
//    GEMM, every T): 2e-5 — this checks the tiled dequantizer value by value.
//  - Tiled vs the GGUF-layout decode GEMV (both int8 twins): 2e-5.
//  - W4_G128 (AWQ / GPTQ group 128), W4_G32 and NVFP4 are tiled types too: the same bounds; their own
//    layout's GEMV keeps f32 activations, so tiled vs untiled compare on int8-exact activations
//    (2e-5). NVFP4's −0 codes dequantize to +0 (the product with x is the same).
//  - SwiGLU: g and u within 2e-5 of their scale, the product within ~4e-5: 1e-4.
//  - Model level (tiny-dense, q4_k_m mix, tiling on / off): decode steps compare two int8 twins
//    (differing only in f32 summation order) through 4 layers: logits within 1e-3 of the
//    largest, same greedy choices (except near-ties); prefill as the golden tests' bf16 bound.
// A failure prints the type, shape, T and the worst output (t, n, got, want).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <span>

#include "backend/cpu/cpu_ops.h"
#include "common/scoped_env.h"
#include "gpu_test_util.h"
#include "quant_test_util.h"
#include "model/presets.h"
#include "model/qwen36.h"
#include "quant/quant.h"

namespace qwen36::cuda {
// cuda_quant_mma.cu's test hook: the GEMM variant as QWEN36_MMA_LOADS / QWEN36_MMA_T1_QUANT
// select it ("regs" | "smem" | "auto", "fused" | "kernel" | "auto"); nullptr reads the
// environment again.
void mma_select_variant(const char* loads, const char* t1_quant);
// The same for QWEN36_MMA_STAGED ("on" | "off" | "auto"): 2 ≤ T ≤ 3 on the staged kernels or not.
void mma_select_staged(const char* staged);
// The same for QWEN36_MMA_PAIR ("on" | "off" | "auto"), and the pair launches made so far.
void mma_select_pair(const char* pair);
long long mma_pair_launches();
// The same for QWEN36_MMA_XS ("on" | "off" | "auto"), and the XS launches made so far.
void mma_select_xs(const char* xs);
long long mma_xs_launches();
// The same for QWEN36_MMA_XS_SPLIT ("block" | "grid" | "auto"), and the block-split launches so far.
void mma_select_xs_split(const char* split);
long long mma_xs_split_launches();
// The launches of a one-token norm GEMM with f32 projections in its launch so far.
long long mma_norm_gemv_launches();
// The same for QWEN36_MMA_HB ("on" | "off" | "auto"): Q4_K / Q6_K at 17-64 tokens in the bf16 form.
void mma_select_hb(const char* hb);
// The same for QWEN36_MMA_WG (cuda_quant_wgmma.cu: Q4_K / Q6_K at 17-64 tokens on the warpgroup
// form, sm_90a), and that form's launches so far.
void mma_select_wg(const char* wg);
long long mma_wg_launches();
int wg_slab_tokens(int64_t T, int64_t K);  // the slabs' tokens where that form runs at T (0: it does not)
}  // namespace qwen36::cuda

namespace qwen36::gputest {
namespace {

// The int8 form throughout (QWEN36_MMA_HB=off): these tests bound it against its int8 twin; the
// bf16 form of Q4_K / Q6_K at 17-64 tokens has its own twin (test_cuda_quant_mma_half.cpp).
class CudaQuantMma : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    cuda::mma_select_hb("off");
    cuda::mma_select_wg("off");
  }
  void TearDown() override {
    cuda::mma_select_hb(nullptr);
    cuda::mma_select_wg(nullptr);
  }
};

// W4_G128 (AWQ / GPTQ group 128), W4_G32 and NVFP4 tile too: their blocks come from random_hf
// (quant_test_util.h).
const DType kTypes[] = {DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::W4_G128, DType::NVFP4_B64, DType::W4_G32};
const DType kGgufTypes[] = {DType::Q4_K, DType::Q6_K, DType::Q8_0};

std::vector<float> run(Backend& gpu, const DevT& w, const HostT& x) {
  const int64_t T = x.t.rows(), N = w.t.rows();
  DevT dx = upload(gpu, x), dout = upload(gpu, HostT(DType::F32, {T, N}));
  gpu.matmul(dx.t, w.t, dout.t);
  return download(gpu, dout.t);
}

struct Shape {
  int64_t N, K;
};

// Shapes: one tile; 3 row-tiles of 2 super-blocks; 27 tiles each on its own warp (every
// row-tile summed over 9 warps); 16 rows of 68 super-blocks (one row-tile over 68 warps); 2400
// row-tiles of 4 super-blocks (more tiles than warps: ranges start and end mid row-tile).
const Shape kShapes[] = {{16, 256}, {48, 512}, {48, 2304}, {16, 17408}, {38400, 1024}};
const int64_t kTs[] = {1, 2, 3, 4, 8, 9, 17, 23, 40, 64};

TEST_F(CudaQuantMma, EqualsDotWithInt8Activations) {
  for (DType dt : kTypes)
    for (const Shape& s : kShapes) {
      const bool big = s.N * s.K > (int64_t(8) << 20);
      const HostT w = big ? repeated_rows(rng_, dt, s.N, s.K) : quantized(rng_, dt, s.N, s.K);
      const DevT dw = upload_tiled(*gpu_, w);
      const int64_t step = big ? 61 : 1;
      for (int64_t T : kTs) {
        const HostT x = random_t(rng_, DType::F32, {T, s.K});
        const std::vector<float> got = run(*gpu_, dw, x), want = reference(w, int8_activations(x), T, step);
        std::string where;
        EXPECT_LE(worst_rel_err(got, want, T, s.N, step, &where), 2e-5)
            << dtype_name(dt) << " N=" << s.N << " K=" << s.K << " T=" << T << " " << where;
      }
    }
}

// 2 ≤ T ≤ 3 run the staged kernels (T = 3 for rows of 16 super-blocks or more): the tokens' rows
// in shared memory, the T = 1 kernel's split of the tiles wherever the staged rows leave it the same warps per block (here: K ≤ 5120, every
// type). At T = 2 each token is tile_cols as at T = 1, so its outputs are bitwise those of the
// same token alone: a k = 1 verify pass or a batch of two computes every token as one-token
// decode does. At T = 3 (tile_pairs) the groups' terms are added in another order: within
// 2e-5 of the token alone. The multi-token kernel (QWEN36_MMA_STAGED=off) sums in yet another
// order: within 2e-5 of the staged result (each within 2e-5 of the int8 twin,
// EqualsDotWithInt8Activations).
TEST_F(CudaQuantMma, StagedTokensAsOneToken) {
  const Shape shapes[] = {{2048, 4096}, {6144, 5120}, {48, 2304}, {16, 1024}};
  const char* const quant[] = {"fused", "kernel"};
  struct Restore {
    ~Restore() {
      cuda::mma_select_variant(nullptr, nullptr);
      cuda::mma_select_staged(nullptr);
    }
  } restore;
  for (DType dt : kTypes)
    for (const Shape& s : shapes) {
      const HostT w = quantized(rng_, dt, s.N, s.K);
      const DevT dw = upload_tiled(*gpu_, w);
      for (const char* q : quant)
        for (int64_t T : {2, 3}) {  // T = 3 staged where a row has ≥ 16 super-blocks
          cuda::mma_select_variant(nullptr, q);
          cuda::mma_select_staged("on");
          const HostT x = random_t(rng_, DType::F32, {T, s.K});
          const std::vector<float> got = run(*gpu_, dw, x);
          const std::string what = std::string(dtype_name(dt)) + " N=" + std::to_string(s.N) +
                                   " K=" + std::to_string(s.K) + " T=" + std::to_string(T) + " quant=" + q;
          for (int64_t c = 0; c < T; ++c) {
            HostT row(DType::F32, {1, s.K});
            std::memcpy(row.t.data, x.t.as<float>() + c * s.K, size_t(s.K) * sizeof(float));
            const std::vector<float> alone = run(*gpu_, dw, row);
            const std::vector<float> mine(got.begin() + c * s.N, got.begin() + (c + 1) * s.N);
            if (T == 2) {
              int64_t differ = 0;
              for (int64_t n = 0; n < s.N; ++n) differ += mine[size_t(n)] != alone[size_t(n)];
              EXPECT_EQ(differ, 0) << what << ": token " << c << " differs from the same token alone";
            } else {
              std::string where;
              EXPECT_LE(worst_rel_err(mine, alone, 1, s.N, 1, &where), 2e-5) << what << " token " << c << " " << where;
            }
          }
          cuda::mma_select_staged("off");
          const std::vector<float> multi = run(*gpu_, dw, x);
          std::string where;
          EXPECT_LE(worst_rel_err(multi, got, T, s.N, 1, &where), 2e-5) << what << " multi-token kernel " << where;
        }
    }
}

// A matrix of shape s (repeated rows past 8 M weights), its tiled device copy, and the row step
// at which the large ones' outputs are checked against the reference.
struct TestMatrix {
  HostT w;
  DevT d;
  int64_t step;
};
TestMatrix test_matrix(Backend& gpu, std::mt19937& rng, DType dt, const Shape& s) {
  const bool big = s.N * s.K > (int64_t(8) << 20);
  HostT w = big ? repeated_rows(rng, dt, s.N, s.K) : quantized(rng, dt, s.N, s.K);
  DevT d = upload_tiled(gpu, w);
  return {std::move(w), std::move(d), s.N >= 2048 ? 61 : 1};
}

// got equals other bit for bit (else the failure says `differ`), and is within 2e-5 of m's int8
// twin on x.
void expect_same_and_near_twin(const std::vector<float>& got, const std::vector<float>& other, const TestMatrix& m,
                               const HostT& x, int64_t N, const std::string& what, const char* differ) {
  size_t diff = 0;
  for (size_t i = 0; i < got.size(); ++i) diff += std::memcmp(&got[i], &other[i], sizeof(float)) != 0;
  EXPECT_EQ(diff, 0u) << what << ": " << differ;
  std::string where;
  const int64_t T = x.t.rows();
  EXPECT_LE(worst_rel_err(got, reference(m.w, int8_activations(x), T, m.step), T, N, m.step, &where), 2e-5)
      << what << " " << where;
}

// The multi-token kernel (4 ≤ T ≤ 16 here) with the activations copied into each block's shared
// memory (XS; its grid split, QWEN36_MMA_XS_SPLIT=grid) reads the same fragments and scales as
// from the workspace, in the same order, on the same warps for these shapes (tiles ≥ 16 warps per
// SM or ≤ 8: plan_mma): bitwise the same outputs as without the copy, and within 2e-5 of the int8
// twin. Shapes: the 27B's attention
// and MLP (K = 5120, 17408: at 16 tokens the copy of K = 17408 does not fit, the call reads
// through L1), the 35B-A3B's K = 2048, one row-tile over 68 warps, 2400 row-tiles of 4 super-blocks.
TEST_F(CudaQuantMma, SharedActivationsBitwiseAsWorkspace) {
  const Shape shapes[] = {{6144, 5120}, {5120, 17408}, {2048, 2048}, {16, 17408}, {38400, 1024}};
  struct Restore {
    ~Restore() { cuda::mma_select_xs(nullptr), cuda::mma_select_xs_split(nullptr); }
  } restore;
  cuda::mma_select_xs_split("grid");
  long long xs_calls = 0;
  for (DType dt : kTypes)
    for (const Shape& s : shapes) {
      const TestMatrix m = test_matrix(*gpu_, rng_, dt, s);
      for (int64_t T : {4, 8, 9, 16}) {
        const HostT x = random_t(rng_, DType::F32, {T, s.K});
        const std::string what = std::string(dtype_name(dt)) + " N=" + std::to_string(s.N) +
                                 " K=" + std::to_string(s.K) + " T=" + std::to_string(T);
        cuda::mma_select_xs("on");
        const long long before = cuda::mma_xs_launches();
        const std::vector<float> shared = run(*gpu_, m.d, x);
        xs_calls += cuda::mma_xs_launches() - before;
        cuda::mma_select_xs("off");
        const long long off_before = cuda::mma_xs_launches();
        const std::vector<float> global = run(*gpu_, m.d, x);
        EXPECT_EQ(cuda::mma_xs_launches(), off_before) << what << ": QWEN36_MMA_XS=off launched the copy";
        expect_same_and_near_twin(shared, global, m, x, s.N, what, "outputs differ with the activations in shared memory");
      }
    }
  EXPECT_GT(xs_calls, 0) << "no call took the shared-memory copy of the activations";
}

// XS with the split per block (QWEN36_MMA_XS_SPLIT=block: whole row-tiles a block, a row-tile
// split between warps summed in shared memory): within 2e-5 of the int8 twin, bitwise the same on
// every run; taken where every block gets a row-tile (6144 and 5120 rows; 38400 rows of 4
// super-blocks), not on 2048 rows (128 row-tiles: the grid split).
TEST_F(CudaQuantMma, SharedActivationsSplitPerBlock) {
  const Shape shapes[] = {{6144, 5120}, {5120, 6144}, {2048, 5120}, {38400, 1024}};
  struct Restore {
    ~Restore() { cuda::mma_select_xs(nullptr), cuda::mma_select_xs_split(nullptr); }
  } restore;
  cuda::mma_select_xs("on");
  cuda::mma_select_xs_split("block");
  long long split_calls = 0;
  for (DType dt : kTypes)
    for (const Shape& s : shapes) {
      const TestMatrix m = test_matrix(*gpu_, rng_, dt, s);
      for (int64_t T : {4, 9, 16}) {
        const HostT x = random_t(rng_, DType::F32, {T, s.K});
        const std::string what = std::string(dtype_name(dt)) + " N=" + std::to_string(s.N) +
                                 " K=" + std::to_string(s.K) + " T=" + std::to_string(T);
        const long long before = cuda::mma_xs_split_launches();
        const std::vector<float> a = run(*gpu_, m.d, x), b = run(*gpu_, m.d, x);
        split_calls += cuda::mma_xs_split_launches() - before;
        expect_same_and_near_twin(a, b, m, x, s.N, what, "two runs differ");
      }
    }
  EXPECT_GT(split_calls, 0) << "no call took the block split";
}

// The 27B MLP's shape, rows spot-checked.
TEST_F(CudaQuantMma, Large27BShapeSpotChecked) {
  for (DType dt : kTypes) {
    const HostT w = repeated_rows(rng_, dt, 17408, 5120);
    const DevT dw = upload_tiled(*gpu_, w);
    for (int64_t T : {1, 2, 4, 8, 64}) {
      const HostT x = random_t(rng_, DType::F32, {T, 5120});
      const std::vector<float> got = run(*gpu_, dw, x), want = reference(w, int8_activations(x), T, 997);
      std::string where;
      EXPECT_LE(worst_rel_err(got, want, T, 17408, 997, &where), 2e-5) << dtype_name(dt) << " T=" << T << " " << where;
    }
  }
}

// Tiled vs the same weights in the GGUF layout through the decode GEMV: two int8 twins. (The HF
// types' own layout takes f32 activations: HfModelsSameWithAndWithoutTiling compares them on
// int8-exact ones.)
TEST_F(CudaQuantMma, TiledEqualsGgufLayoutGemv) {
  for (DType dt : kGgufTypes) {
    const HostT w = quantized(rng_, dt, 304, 2304);
    const DevT plain = upload(*gpu_, w), tiled = upload_tiled(*gpu_, w);
    for (int64_t T : {1, 5, 8}) {
      const HostT x = random_t(rng_, DType::F32, {T, 2304});
      const std::vector<float> a = run(*gpu_, plain, x), b = run(*gpu_, tiled, x);
      std::string where;
      EXPECT_LE(worst_rel_err(b, a, T, 304, 1, &where), 2e-5) << dtype_name(dt) << " T=" << T << " " << where;
    }
  }
}

// T > 64: the tiled dequantizer to bf16 and cuBLAS; exact_matmul: to f32 (value by value).
TEST_F(CudaQuantMma, PrefillAndExactDequantizeTiles) {
  CudaOptions o;
  o.exact_matmul = true;
  auto exact = make_cuda_backend(o);
  for (DType dt : kTypes)
    for (const Shape& s : {Shape{48, 512}, Shape{304, 2304}}) {
      const HostT w = quantized(rng_, dt, s.N, s.K);
      const DevT dw = upload_tiled(*gpu_, w), de = upload_tiled(*exact, w);
      for (int64_t T : {65, 100}) {
        const HostT x = random_t(rng_, DType::F32, {T, s.K});
        std::string where;
        EXPECT_LE(worst_rel_err(run(*gpu_, dw, x), reference(w, x, T), T, s.N, 1, &where), 1.5e-2)
            << dtype_name(dt) << " bf16 N=" << s.N << " T=" << T << " " << where;
      }
      for (int64_t T : {1, 9, 70}) {
        const HostT x = random_t(rng_, DType::F32, {T, s.K});
        std::string where;
        EXPECT_LE(worst_rel_err(run(*exact, de, x), reference(w, x, T), T, s.N, 1, &where), 2e-5)
            << dtype_name(dt) << " exact N=" << s.N << " T=" << T << " " << where;
      }
    }
}

// The dequantizer value by value: x = the identity (T = K rows), so out[t, n] = w[n, t] with one
// non-zero product per sum — bitwise the weight rounded to bf16 (the prefill path; 1 and 0 are
// exact in bf16) or the f32 weight (exact_matmul), against quant/dequantize.cpp. Shapes: one
// row-tile; 19 row-tiles of 9 super-blocks (a slice boundary is not at a tile edge of the grid).
TEST_F(CudaQuantMma, DequantizedTilesBitwiseAsCpu) {
  CudaOptions o;
  o.exact_matmul = true;
  auto exact = make_cuda_backend(o);
  for (DType dt : kTypes)
    for (const Shape& s : {Shape{16, 256}, Shape{304, 2304}}) {
      const HostT w = quantized(rng_, dt, s.N, s.K);
      HostT x(DType::F32, {s.K, s.K});
      for (int64_t t = 0; t < s.K; ++t) x.f()[t * s.K + t] = 1.0f;
      std::vector<float> want(size_t(s.K * s.N)), row(size_t(s.K));
      for (int64_t n = 0; n < s.N; ++n) {
        cpu::weight_row_to_f32(w.t, n, row.data());
        for (int64_t t = 0; t < s.K; ++t) want[size_t(t * s.N + n)] = row[size_t(t)];
      }
      for (Backend* b : {gpu_.get(), exact.get()}) {
        const bool f32 = b == exact.get();
        const std::vector<float> got = run(*b, upload_tiled(*b, w), x);
        int64_t bad = 0, first = -1;
        for (size_t i = 0; i < got.size(); ++i) {
          const float v = f32 ? want[i] : round_bf16(want[i]);
          // bit for bit, but for the sign of a zero (NVFP4's −0 codes: a sum with +0 products)
          const bool same = std::memcmp(&got[i], &v, 4) == 0 || (got[i] == 0.0f && v == 0.0f);
          if (!same && bad++ == 0) first = int64_t(i);
        }
        EXPECT_EQ(bad, 0) << dtype_name(dt) << (f32 ? " f32" : " bf16") << " N=" << s.N << " K=" << s.K
                          << " first at t=" << first / s.N << " n=" << first % s.N << ": "
                          << (first >= 0 ? got[size_t(first)] : 0.0f) << " vs " << (first >= 0 ? want[size_t(first)] : 0.0f);
      }
    }
}

// The MLP at T > 64 (the dequantizing GEMMs; gate and up in one bf16 GEMM per slice, the SwiGLU
// in bf16 into the down GEMM's input): expect_fused_mlp_prefill.
TEST_F(CudaQuantMma, MlpPrefillOfTiledWeights) {
  const int64_t H = 1024, I = 768;
  for (DType dt : {DType::Q4_K, DType::Q6_K, DType::W4_G128, DType::NVFP4_B64}) {
    const HostT wg = quantized(rng_, dt, I, H), wu = quantized(rng_, dt, I, H), wd = quantized(rng_, DType::Q6_K, H, I);
    const DevT dg = upload_tiled(*gpu_, wg), du = upload_tiled(*gpu_, wu), dd = upload_tiled(*gpu_, wd);
    expect_fused_mlp_prefill(*gpu_, rng_, wg, wu, wd, MlpWeights{dg.t, du.t, dd.t}, 300, std::string(dtype_name(dt)));
  }
}

// matmul_multi: tiled matrices of two types, a bf16 one and GGUF-layout Q4_K ones (20 rows:
// not tileable) together; int8-exact activations, so every path is the f32 product: 2e-5.
TEST_F(CudaQuantMma, MultiMixesTiledAndOtherMatrices) {
  const int64_t K = 512;
  const std::vector<std::pair<DType, int64_t>> mats = {
      {DType::Q4_K, 304}, {DType::BF16, 20}, {DType::Q6_K, 48}, {DType::Q4_K, 20}, {DType::Q8_0, 16}};
  std::vector<HostT> hw;
  std::vector<DevT> dw;
  for (auto [dt, n] : mats) {
    hw.push_back(dt == DType::BF16 ? random_t(rng_, dt, {n, K}) : quantized(rng_, dt, n, K));
    dw.push_back(n % 16 == 0 && dt != DType::BF16 ? upload_tiled(*gpu_, hw.back()) : upload(*gpu_, hw.back()));
  }
  std::vector<const Tensor*> ws;
  for (const DevT& d : dw) ws.push_back(&d.t);
  for (int64_t T : {1, 3, 8}) {
    const HostT x = int8_exact_activations(rng_, T, K);
    DevT dx = upload(*gpu_, x);
    const auto outs = matmul_multi_outputs(*gpu_, dx.t, ws);
    for (size_t i = 0; i < mats.size(); ++i) {
      std::string where;
      const std::vector<float>& got = outs[i];
      const std::vector<float> want = reference(hw[i], x, T);
      EXPECT_LE(worst_rel_err(got, want, T, mats[i].second, 1, &where), 2e-5)
          << "matrix " << i << " (" << dtype_name(dw[i].t.dtype) << ") T=" << T << " " << where;
    }
  }
}

// Matrices stored back to back (as prepare_weights lays out a layer's projections) run as one
// stacked matrix in one launch: three of 48, 304 and 16 rows tiled together, viewed apart.
TEST_F(CudaQuantMma, StackedMatricesOneLaunch) {
  const int64_t K = 768;
  const int64_t rows[] = {48, 304, 16};
  for (DType dt : kTypes) {
    const Stacked st = stacked(*gpu_, rng_, dt, rows, K);
    const std::vector<HostT>& hw = st.host;
    const std::vector<Tensor>& views = st.views;
    for (int64_t T : {1, 9, 40}) {
      const HostT x = random_t(rng_, DType::F32, {T, K}), xq = int8_activations(x);
      DevT dx = upload(*gpu_, x);
      StackedCall call = stacked_call(*gpu_, st, T);
      const std::vector<DevT>& dout = call.out;
      gpu_->matmul_multi(dx.t, call.ws, call.outs);
      for (size_t i = 0; i < views.size(); ++i) {
        std::string where;
        EXPECT_LE(worst_rel_err(download(*gpu_, dout[i].t), reference(hw[i], xq, T), T, rows[i], 1, &where), 2e-5)
            << dtype_name(dt) << " matrix " << i << " T=" << T << " " << where;
      }
    }
  }
}

// matmul_swiglu with tiled gate / up: silu(x·gate)·(x·up) against the int8 twin in double.
TEST_F(CudaQuantMma, SwigluMatchesInt8Twin) {
  for (DType dt : kTypes) {
    const int64_t N = 304, K = 1024;
    const HostT g = quantized(rng_, dt, N, K), u = quantized(rng_, dt, N, K);
    const DevT dg = upload_tiled(*gpu_, g), du = upload_tiled(*gpu_, u);
    for (int64_t T : {1, 5, 33}) {
      const HostT x = random_t(rng_, DType::F32, {T, K}), xq = int8_activations(x);
      DevT dx = upload(*gpu_, x), go = upload(*gpu_, HostT(DType::F32, {T, N})), uo = upload(*gpu_, HostT(DType::F32, {T, N}));
      gpu_->matmul_swiglu(dx.t, dg.t, du.t, go.t, uo.t);
      const std::vector<float> rg = reference(g, xq, T), ru = reference(u, xq, T);
      std::vector<float> want(rg.size());
      for (size_t i = 0; i < want.size(); ++i) want[i] = float(double(rg[i]) / (1.0 + std::exp(-double(rg[i]))) * ru[i]);
      std::string where;
      EXPECT_LE(worst_rel_err(download(*gpu_, go.t), want, T, N, 1, &where), 1e-4)
          << dtype_name(dt) << " T=" << T << " " << where;
    }
  }
}

// Row-tiles split between warps are finished inside the GEMM: at T > 1 by the last warp to
// arrive (an arrival counter per split row-tile, reset by that warp), at T = 1 within the block
// after a barrier. The same call three times eagerly, then recorded into a CUDA graph and
// replayed twice, must give bitwise the same outputs (the pieces are summed in warp order, never
// by float atomics), each within 2e-5 of the int8 twin. Shapes: one row-tile over 68 warps (at
// T = 1 one block of 16, 4–5 tiles each); 2048 × 4096 (the 35B's, one tile per warp, 16 warps per
// row-tile); 2048 × 512 (the smallest blocks: 2 warps at T = 1); 5120 × 6144 (ranges start and
// end mid row-tile). Every variant: both load paths (registers, shared-memory ring), and at T = 1
// the activation row quantized by each GEMM block or by quantize_kernel before it.
TEST_F(CudaQuantMma, SplitRowTilesBitwiseSameEagerAndGraphReplay) {
  const Shape shapes[] = {{16, 17408}, {2048, 4096}, {2048, 512}, {5120, 6144}};
  const char* const variants[][2] = {{"regs", "fused"}, {"smem", "fused"}, {"regs", "kernel"}, {"smem", "kernel"}};
  struct Restore {
    ~Restore() { cuda::mma_select_variant(nullptr, nullptr); }
  } restore;
  uint64_t key = 0x5157'0000;
  for (DType dt : kTypes)
    for (const Shape& s : shapes) {
      const TestMatrix m = test_matrix(*gpu_, rng_, dt, s);
      const HostT& w = m.w;
      const DevT& dw = m.d;
      const int64_t step = m.step;
      for (const auto& v : variants) {
        for (int64_t T : {1, 3, 5, 17, 64}) {  // staged ×2, NT = 1, 1, 4, 8: every fixup chunking (kV = 4, 4, 2, 1)
          // the quantization switch changes only the staged kernels (T ≤ 3)
          if (T > 3 && std::strcmp(v[1], "kernel") == 0) continue;
          cuda::mma_select_variant(v[0], v[1]);
          const HostT x = random_t(rng_, DType::F32, {T, s.K});
          const HostT zeros(DType::F32, {T, s.N});
          DevT dx = upload(*gpu_, x), dout = upload(*gpu_, zeros);
          const std::string what = std::string(dtype_name(dt)) + " N=" + std::to_string(s.N) +
                                   " K=" + std::to_string(s.K) + " T=" + std::to_string(T) + " loads=" + v[0] +
                                   " quant=" + v[1];
          std::vector<std::vector<float>> runs;
          for (int r = 0; r < 3; ++r) {
            gpu_->copy_from_host(zeros.t.data, dout.t);  // nothing left over from the run before
            gpu_->matmul(dx.t, dw.t, dout.t);
            runs.push_back(download(*gpu_, dout.t));
          }
          ++key;
          ASSERT_TRUE(gpu_->begin_capture());
          gpu_->matmul(dx.t, dw.t, dout.t);
          ASSERT_TRUE(gpu_->end_capture(key, true)) << what << ": the tiled GEMM could not be recorded";
          for (int r = 0; r < 2; ++r) {
            gpu_->copy_from_host(zeros.t.data, dout.t);
            ASSERT_TRUE(gpu_->replay(key));
            runs.push_back(download(*gpu_, dout.t));
          }
          for (size_t r = 1; r < runs.size(); ++r) {
            size_t diff = 0, first = runs[0].size();
            for (size_t i = 0; i < runs[0].size(); ++i)
              if (std::memcmp(&runs[r][i], &runs[0][i], sizeof(float)) != 0) ++diff, first = std::min(first, i);
            EXPECT_EQ(diff, 0u) << what << (r < 3 ? " eager run " : " graph replay ") << (r < 3 ? r : r - 3) << ": " << diff
                                << " outputs differ from run 0, first at t=" << (first / size_t(s.N)) << " n="
                                << (first % size_t(s.N)) << " (row-tile " << (first % size_t(s.N)) / 16 << ")";
          }
          std::string where;
          EXPECT_LE(worst_rel_err(runs.back(), reference(w, int8_activations(x), T, step), T, s.N, step, &where), 2e-5)
              << what << " " << where;
        }
      }
    }
}

// Copies of a device matrix adding up to > 256 MB (over 4× the H200's L2): rotating over them
// measures weights streamed from HBM, as in a decode step.
std::vector<DevT> cold_tiled_copies(Backend& gpu, const HostT& w) {
  const int copies = int(std::max<size_t>(2, (size_t(256) << 20) / w.bytes.size() + 1));
  std::vector<DevT> d;
  for (int i = 0; i < copies; ++i) d.push_back(upload_tiled(gpu, w));
  return d;
}

const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != 0 ? v : fallback;
}

// Cold-L2 bandwidth of the tiled GEMM on the 27B's large matrices, T = 1 .. 64, next to the
// device copy bandwidth; spot-checked against the int8 twin. The variant is the environment's
// (QWEN36_MMA_LOADS): run once per setting to compare.
TEST_F(CudaQuantMma, Bandwidth27B) {
  const double copy = cuda_copy_bandwidth_gbs(size_t(1) << 30, 5);
  for (DType dt : {DType::Q4_K, DType::Q6_K, DType::W4_G128, DType::NVFP4_B64})
    for (auto [N, K] : {std::pair<int64_t, int64_t>{17408, 5120}, {5120, 17408}}) {
      const HostT w = repeated_rows(rng_, dt, N, K);
      std::vector<DevT> dw = cold_tiled_copies(*gpu_, w);
      for (int64_t T : {1, 2, 4, 8, 16, 23, 32, 64}) {
        const HostT x = random_t(rng_, DType::F32, {T, K});
        DevT dx = upload(*gpu_, x), dout = upload(*gpu_, HostT(DType::F32, {T, N}));
        const double s = time_per_call(int(dw.size()), [&](int i) { gpu_->matmul(dx.t, dw[size_t(i)].t, dout.t); });
        const std::string what = std::string(dtype_name(dt)) + "-t16 " + std::to_string(N) + " x " + std::to_string(K) +
                                 ", T=" + std::to_string(T);
        std::string where;
        EXPECT_LE(worst_rel_err(download(*gpu_, dout.t), reference(w, int8_activations(x), T, 997), T, N, 997, &where), 2e-5)
            << what << " " << where;
        const double gbs = double(w.t.nbytes()) / s / 1e9;
        std::printf("[ gemv-cold ] %s: %.1f us, %.0f GB/s = %.1f%% of copy bandwidth %.0f GB/s (loads=%s)\n",
                    what.c_str(), s * 1e6, gbs, 100 * gbs / copy, copy, env_or("QWEN36_MMA_LOADS", "auto"));
      }
    }
}

// A tiny dense model in the q4_k_m mix made on the device, with and without tiling. First every
// matrix in place (and the fused forms) on general activations: both layouts quantize them to
// int8 identically, so outputs agree to 2e-5; every untiled tensor is byte-identical. Then the
// two models decode the same 20 tokens one per forward (int8 GEMV vs int8 MMA everywhere):
// logits within 1e-3 of the largest, same greedy picks. Prefill is not compared here: a 12-token
// prefill takes the chunked delta rule (tf32 tensor cores) and, untiled, bf16 activations, whose
// roundings this random model amplifies to ~2% of its logits (measured) — the golden and
// CudaQuantGguf tests bound prefill against the references.
// type: the synthetic model's weights; own_f32: its untiled matrices take f32 activations (the
// HF types' GEMV), so the matrices compare on int8-exact activations and the decode steps by
// decode_bound (int8 vs f32 activations) instead of 1e-3 (two int8 twins).
void same_with_and_without_tiling(Backend* gpu_, std::mt19937& rng_, const char* type, bool own_f32, double decode_bound) {
  const ModelConfig cfg = model_preset("tiny-dense", 4);
  auto make = [&](bool tile) {
    const ScopedEnv no_tile("QWEN36_NO_TILE", tile ? nullptr : "1");
    auto m = std::make_unique<Model>(make_random_quant_weights_cuda(cfg, type, 11), *gpu_);
    return m;
  };
  auto plain = make(false), tiled = make(true);
  int n_tiled = 0;
  for (const LayerWeights& l : tiled->weights().layers)
    for (const Tensor* t : {&l.mlp.gate_proj, &l.mlp.up_proj, &l.mlp.down_proj, &l.attn.o_proj, &l.deltanet.out_proj})
      n_tiled += dtype_is_tiled(t->dtype);
  EXPECT_GT(n_tiled, 0) << "no matrix of the tiny model was tiled";
  EXPECT_FALSE(dtype_is_tiled(tiled->weights().embed_tokens.dtype));
  // Every matrix in place: the tiled model's matmul (and its fused forms) equal the GGUF-layout
  // model's on the same int8-exact activations.
  {
    auto check = [&](const char* what, int64_t layer, const std::vector<const Tensor*>& a,
                     const std::vector<const Tensor*>& b, int mode) {  // 0: each, 1: multi, 2: swiglu
      const int64_t K = a[0]->cols();
      const HostT x = own_f32 ? int8_exact_activations(rng_, 1, K) : random_t(rng_, DType::F32, {1, K});
      DevT dx = upload(*gpu_, x);
      std::vector<DevT> oa, ob;
      std::vector<Tensor*> pa, pb;
      for (const Tensor* t : a) {
        oa.push_back(upload(*gpu_, HostT(DType::F32, {1, t->rows()})));
        ob.push_back(upload(*gpu_, HostT(DType::F32, {1, t->rows()})));
      }
      for (size_t i = 0; i < a.size(); ++i) pa.push_back(&oa[i].t), pb.push_back(&ob[i].t);
      if (mode == 1) {
        gpu_->matmul_multi(dx.t, a, pa);
        gpu_->matmul_multi(dx.t, b, pb);
      } else if (mode == 2) {
        gpu_->matmul_swiglu(dx.t, *a[0], *a[1], *pa[0], *pa[1]);
        gpu_->matmul_swiglu(dx.t, *b[0], *b[1], *pb[0], *pb[1]);
      } else {
        for (size_t i = 0; i < a.size(); ++i) gpu_->matmul(dx.t, *a[i], *pa[i]), gpu_->matmul(dx.t, *b[i], *pb[i]);
      }
      for (size_t i = 0; i < (mode == 2 ? 1 : a.size()); ++i) {
        const std::vector<float> ga = download(*gpu_, oa[i].t), gb = download(*gpu_, ob[i].t);
        EXPECT_LE(rel_err(gb, ga), 2e-5) << what << " layer " << layer << " matrix " << i << " (" << dtype_name(a[i]->dtype)
                                         << " vs " << dtype_name(b[i]->dtype) << " " << a[i]->shape_str() << ")";
      }
    };
    const ModelWeights& wa = plain->weights();
    const ModelWeights& wb = tiled->weights();
    for (size_t l = 0; l < wa.layers.size(); ++l) {
      const LayerWeights& A = wa.layers[l];
      const LayerWeights& B = wb.layers[l];
      check("mlp each", int64_t(l), {&A.mlp.gate_proj, &A.mlp.up_proj}, {&B.mlp.gate_proj, &B.mlp.up_proj}, 0);
      check("mlp down", int64_t(l), {&A.mlp.down_proj}, {&B.mlp.down_proj}, 0);
      check("mlp swiglu", int64_t(l), {&A.mlp.gate_proj, &A.mlp.up_proj}, {&B.mlp.gate_proj, &B.mlp.up_proj}, 2);
      if (A.kind == LayerKind::FullAttention) {
        check("attn each", int64_t(l), {&A.attn.q_proj, &A.attn.k_proj, &A.attn.v_proj, &A.attn.o_proj},
              {&B.attn.q_proj, &B.attn.k_proj, &B.attn.v_proj, &B.attn.o_proj}, 0);
        check("attn multi", int64_t(l), {&A.attn.q_proj, &A.attn.k_proj, &A.attn.v_proj},
              {&B.attn.q_proj, &B.attn.k_proj, &B.attn.v_proj}, 1);
      } else {
        const DeltaNetWeights& a = A.deltanet;
        const DeltaNetWeights& b = B.deltanet;
        check("deltanet each", int64_t(l), {&a.in_proj_qkv, &a.in_proj_z, &a.in_proj_b, &a.in_proj_a, &a.out_proj},
              {&b.in_proj_qkv, &b.in_proj_z, &b.in_proj_b, &b.in_proj_a, &b.out_proj}, 0);
        check("deltanet multi", int64_t(l), {&a.in_proj_qkv, &a.in_proj_z, &a.in_proj_b, &a.in_proj_a},
              {&b.in_proj_qkv, &b.in_proj_z, &b.in_proj_b, &b.in_proj_a}, 1);
      }
    }
    check("lm_head", -1, {&wa.lm_head}, {&wb.lm_head}, 0);
    // Tiling rewrites matrices in place: every other tensor must be byte-identical.
    auto same_bytes = [&](const char* what, int64_t layer, const Tensor& a, const Tensor& b) {
      if (dtype_is_tiled(b.dtype) || a.empty()) return;
      std::vector<std::byte> ha(a.nbytes()), hb(b.nbytes());
      gpu_->copy_to_host(a, ha.data());
      gpu_->copy_to_host(b, hb.data());
      EXPECT_EQ(0, std::memcmp(ha.data(), hb.data(), ha.size())) << what << " layer " << layer << " changed by tiling";
    };
    for (size_t l = 0; l < wa.layers.size(); ++l) {
      const LayerWeights& A = wa.layers[l];
      const LayerWeights& B = wb.layers[l];
      const int64_t li = int64_t(l);
      same_bytes("input_norm", li, A.input_norm, B.input_norm);
      same_bytes("post_attention_norm", li, A.post_attention_norm, B.post_attention_norm);
      same_bytes("q_norm", li, A.attn.q_norm, B.attn.q_norm);
      same_bytes("k_norm", li, A.attn.k_norm, B.attn.k_norm);
      same_bytes("conv1d", li, A.deltanet.conv1d, B.deltanet.conv1d);
      same_bytes("dt_bias", li, A.deltanet.dt_bias, B.deltanet.dt_bias);
      same_bytes("a_neg_exp", li, A.deltanet.a_neg_exp, B.deltanet.a_neg_exp);
      same_bytes("deltanet norm", li, A.deltanet.norm, B.deltanet.norm);
      same_bytes("gate (when untiled)", li, A.mlp.gate_proj, B.mlp.gate_proj);
    }
    same_bytes("final_norm", -1, wa.final_norm, wb.final_norm);
    same_bytes("embed_tokens", -1, wa.embed_tokens, wb.embed_tokens);
  }
  const int64_t V = cfg.vocab_size;
  std::vector<int32_t> toks{5, 901, 33, 7000, 12, 4, 150000, 77, 8, 19, 3, 250};
  const size_t n_prompt = toks.size();
  // Reference: one token per forward; the greedy continuation is appended as it goes.
  std::vector<float> want, got, row(static_cast<size_t>(V));
  {
    ModelState st(*gpu_, cfg, 1, 64, false);
    for (size_t i = 0; i < n_prompt + 8; ++i) {
      plain->forward(ForwardBatch::single(std::span(&toks[i], 1), int32_t(i), 0), st, row.data());
      want.insert(want.end(), row.begin(), row.end());
      if (i + 1 >= n_prompt && toks.size() < n_prompt + 8) toks.push_back(int32_t(std::max_element(row.begin(), row.end()) - row.begin()));
    }
  }
  {
    ModelState st(*gpu_, cfg, 1, 64, false);
    for (size_t i = 0; i < n_prompt + 8; ++i) {
      tiled->forward(ForwardBatch::single(std::span(&toks[i], 1), int32_t(i), 0), st, row.data());
      got.insert(got.end(), row.begin(), row.end());
    }
  }
  ASSERT_EQ(got.size(), want.size());
  const auto [worst, scale, at] = worst_diff(got, want);
  std::printf("[ tiny-dense %s ] tiled vs own layout (T=1 steps): max |dlogit| %.3g of %.3g at row %zu\n", type,
              worst, scale, at / size_t(V));
  for (size_t r = 0; r < n_prompt + 8; ++r) {  // per-row picture, for a failure
    double d = 0, m = 0;
    for (size_t i = r * size_t(V); i < (r + 1) * size_t(V); ++i)
      d = std::max(d, std::abs(double(want[i]) - got[i])), m = std::max(m, double(std::abs(want[i])));
    std::printf("[ tiny-dense %s ] row %2zu (%s): max |dlogit| %.3g, max |logit| %.3g\n", type, r,
                r < n_prompt ? "prompt" : "generated", d, m);
  }
  EXPECT_LE(worst / scale, decode_bound) << type << ": worst at row " << at / size_t(V);
  expect_same_argmax_away_from_ties(got, want, size_t(V), decode_bound * scale);
}

TEST_F(CudaQuantMma, ModelSameWithAndWithoutTiling) { same_with_and_without_tiling(gpu_.get(), rng_, "q4_k_m", false, 1e-3); }

// AWQ (W4_G128), NVFP4 and W4_G32: untiled, the HF GEMV with f32 activations; tiled, int8 per 32.
// Decode steps through 4 layers: within 2e-2 of the largest logit (int8 rounding of every
// activation row: ~0.4% a product, compounding over the layers; AWQ measured 1.7e-2).
TEST_F(CudaQuantMma, HfModelsSameWithAndWithoutTiling) {
  for (const char* type : {"awq", "nvfp4", "w4g32"}) same_with_and_without_tiling(gpu_.get(), rng_, type, true, 2e-2);
}

// A staged call's two groups of two types (a DeltaNet layer's Q6_K qkv with its Q4_K z, b, a
// stored back to back) are one launch, in either order, plain or with the layer's norm, for 1-3
// tokens (3 only on rows of >= 16 super-blocks, as the staged kernels): each output against
// the int8 twin, and the norm's outputs bitwise those of the two launches.
TEST_F(CudaQuantMma, PairOfTypesOneLaunch) {
  struct Restore {
    ~Restore() { cuda::mma_select_pair(nullptr); }
  } restore;
  for (const int64_t K : {2048, 5120}) {  // rows of 8 super-blocks (Q4_K on registers) and of 20 (the ring)
    const HostT hq = quantized(rng_, DType::Q6_K, 1040, K);
    const DevT dq = upload_tiled(*gpu_, hq);
    const int64_t rows[] = {512, 16, 16};  // z, b, a: one stacked Q4_K matrix
    const Stacked st = stacked(*gpu_, rng_, DType::Q4_K, rows, K);
    const std::vector<HostT>& hz = st.host;
    const std::vector<Tensor>& views = st.views;
    const HostT* hw[] = {&hq, &hz[0], &hz[1], &hz[2]};
    const int64_t n_of[] = {1040, 512, 16, 16};
    const DevT norm = upload(*gpu_, random_t(rng_, DType::F32, {K}, 0.5f, 1.5f));
    for (const int64_t T : {1, 2, 3}) {
      const HostT h = random_t(rng_, DType::F32, {T, K}), delta = random_t(rng_, DType::F32, {T, K});
      const DevT dd = upload(*gpu_, delta);
      const long long launches = T < 3 || K / 256 >= 16 ? 1 : 0;
      for (const bool q6_first : {true, false}) {
        for (const bool with_norm : {false, true}) {
          struct Run {
            DevT h2, x;
            std::vector<DevT> out;
          };
          auto run = [&](const char* pair) {
            cuda::mma_select_pair(pair);
            const DevT dh = upload(*gpu_, h);
            Run r{upload(*gpu_, HostT(DType::F32, {T, K})), upload(*gpu_, h), {}};
            for (int64_t n : n_of) r.out.push_back(upload(*gpu_, HostT(DType::F32, {T, n})));
            std::vector<const Tensor*> ws = {&dq.t, &views[0], &views[1], &views[2]};
            std::vector<Tensor*> outs = {&r.out[0].t, &r.out[1].t, &r.out[2].t, &r.out[3].t};
            if (!q6_first) {  // the Q4_K group first
              std::rotate(ws.begin(), ws.begin() + 1, ws.end());
              std::rotate(outs.begin(), outs.begin() + 1, outs.end());
            }
            const long long before = cuda::mma_pair_launches();
            if (with_norm)
              gpu_->add_rms_norm_matmul_multi(dh.t, dd.t, r.h2.t, norm.t, 1e-6f, r.x.t, ws, outs);
            else
              gpu_->matmul_multi(r.x.t, ws, outs);
            EXPECT_EQ(cuda::mma_pair_launches() - before, std::strcmp(pair, "on") == 0 ? launches : 0)
                << "K=" << K << " T=" << T << " pair " << pair << (with_norm ? " with the norm" : "");
            return r;
          };
          const Run paired = run("on"), apart = run("off");
          HostT xh(DType::F32, {T, K});
          const std::vector<float> xv = download(*gpu_, paired.x.t);
          std::copy(xv.begin(), xv.end(), xh.f());
          const HostT xq = int8_activations(xh);
          for (size_t i = 0; i < 4; ++i) {
            std::string where;
            const std::vector<float> got = download(*gpu_, paired.out[i].t), want = reference(*hw[i], xq, T);
            EXPECT_LE(worst_rel_err(got, want, T, n_of[i], 1, &where), 2e-5)
                << "K=" << K << " T=" << T << " matrix " << i << (with_norm ? " with the norm " : " ") << where;
          }
          if (with_norm) {
            EXPECT_EQ(download(*gpu_, paired.x.t), download(*gpu_, apart.x.t)) << "normalised x, K=" << K << " T=" << T;
            EXPECT_EQ(download(*gpu_, paired.h2.t), download(*gpu_, apart.h2.t)) << "residual stream, K=" << K;
          }
        }
      }
    }
  }
}

// The layer forms whose producers quantize for the tiled GEMM (add_rms_norm_matmul_multi,
// add_rms_norm_mlp: cuda_quant_norm.cu) against the composition they replace (Backend's own
// definitions: add_rms_norm_into, quantize_kernel, the GEMM, swiglu, quantize_kernel, the GEMM) on
// the same backend: the same float values reach the same quantizer and GEMM, so the outputs, the
// residual stream and the normalised x are bitwise equal. At T ≤ 3 (here 1, and 3 at K = 8192) the GEMM
// blocks compute the norm themselves (quant_tiled_matmul_norm): K = 1024 on blocks of 1 to 8 warps (the 16-row
// matrix: one warp a block, past the norm weight's share in registers of the shared-memory ring
// kernels); K = 8192, where a Q6_K GEMM with the norm's shared memory would fit fewer blocks per
// SM, so the form declines for the call (another split of its row-tiles, other sums). T = 40 has
// 24 padding tokens, which the norm's blocks zero; the projections mix a bf16 matrix with the
// tiled ones. Each form runs twice, h → h2 then h2 → h, as the model's residual stream alternates.
// The third form, "wg", is the warpgroup one (QWEN36_MMA_WG=on; where it runs, sm_90a, Q4_K / Q6_K
// at T = 40 read slabs from the same producers: at least one of its launches is expected).
TEST_F(CudaQuantMma, NormAndSwigluQuantizeForTheGemmBitwiseAsComposed) {
  // every form at T = 40: the bf16 one reads the fragments the norm kernel and the SwiGLU
  // quantization write beside the int8 codes (store_act_half), the warpgroup one its slabs there
  for (const std::string hb : {"off", "on", "wg"}) {
    cuda::mma_select_hb(hb == "off" ? "off" : "on");
    cuda::mma_select_wg(hb == "wg" ? "on" : "off");
    const long long wg_before = cuda::mma_wg_launches();
    for (const int64_t K : {1024, 8192}) {
      const int64_t I = 768;
      for (DType dt : kTypes) {
        const DevT w1 = upload_tiled(*gpu_, quantized(rng_, dt, 304, K));
        const DevT w2 = upload_tiled(*gpu_, quantized(rng_, dt, 16, K));
        const DevT wb = upload(*gpu_, random_t(rng_, DType::BF16, {16, K}));
        MlpWeights m;
        const DevT g = upload_tiled(*gpu_, quantized(rng_, dt, I, K)), u = upload_tiled(*gpu_, quantized(rng_, dt, I, K));
        const DevT d = upload_tiled(*gpu_, quantized(rng_, dt, K, I));
        m.gate_proj = g.t, m.up_proj = u.t, m.down_proj = d.t;
        const DevT norm = upload(*gpu_, random_t(rng_, DType::F32, {K}, 0.5f, 1.5f));
        for (int64_t T : {1, 3, 5, 40}) {  // the norm in the staged GEMMs at T ≤ 3
          if (K > 1024 && T > 3) continue;
          const HostT h = random_t(rng_, DType::F32, {T, K}), delta = random_t(rng_, DType::F32, {T, K});
          const DevT dd = upload(*gpu_, delta);
          struct Run {
            DevT h, h2, x, o1, o2, o3, gate, up, y;
          };
          auto run = [&](bool fused) {
            Run r{upload(*gpu_, h), upload(*gpu_, HostT(DType::F32, {T, K})), upload(*gpu_, HostT(DType::F32, {T, K})),
                  upload(*gpu_, HostT(DType::F32, {T, 304})), upload(*gpu_, HostT(DType::F32, {T, 16})),
                  upload(*gpu_, HostT(DType::F32, {T, 16})), upload(*gpu_, HostT(DType::F32, {T, I})),
                  upload(*gpu_, HostT(DType::F32, {T, I})), upload(*gpu_, HostT(DType::F32, {T, K}))};
            const Tensor* ws[] = {&w1.t, &wb.t, &w2.t};
            Tensor* outs[] = {&r.o1.t, &r.o3.t, &r.o2.t};
            if (fused) {
              gpu_->add_rms_norm_matmul_multi(r.h.t, dd.t, r.h2.t, norm.t, 1e-6f, r.x.t, ws, outs);
              gpu_->add_rms_norm_mlp(r.h2.t, dd.t, r.h.t, norm.t, 1e-6f, r.x.t, m, r.gate.t, r.up.t, r.y.t);
            } else {
              gpu_->Backend::add_rms_norm_matmul_multi(r.h.t, dd.t, r.h2.t, norm.t, 1e-6f, r.x.t, ws, outs);
              gpu_->Backend::add_rms_norm_mlp(r.h2.t, dd.t, r.h.t, norm.t, 1e-6f, r.x.t, m, r.gate.t, r.up.t, r.y.t);
            }
            return r;
          };
          const Run a = run(true), b = run(false);
          auto same = [&](const char* what, const DevT& p, const DevT& q) {
            const std::vector<float> vp = download(*gpu_, p.t), vq = download(*gpu_, q.t);
            size_t diff = 0;
            for (size_t i = 0; i < vp.size(); ++i) diff += std::memcmp(&vp[i], &vq[i], sizeof(float)) != 0;
            EXPECT_EQ(diff, 0u) << what << " " << dtype_name(dt) << " K=" << K << " T=" << T << " form " << hb << ": "
                                << diff << " of "
                                << vp.size() << " values differ (largest relative difference " << rel_err(vp, vq) << ")";
          };
          same("residual stream, first add", a.h2, b.h2);
          same("residual stream, second add", a.h, b.h);
          same("normalised x", a.x, b.x);
          same("tiled projection 1", a.o1, b.o1);
          same("tiled projection 2", a.o2, b.o2);
          same("bf16 projection", a.o3, b.o3);
          same("mlp output", a.y, b.y);
        }
      }
    }
    if (hb == "wg" && cuda::wg_slab_tokens(40, 1024) > 0) {
      EXPECT_GT(cuda::mma_wg_launches(), wg_before) << "QWEN36_MMA_WG=on never took the warpgroup form";
    }
  }
}

// At one token, f32 projections of the norm's x (the MoE router and the shared expert's gate
// logit, beside that expert's tiled gate / up) run in the norm GEMM's launch, on blocks that
// compute the norm themselves (quant_tiled_matmul_norm_gemv): every output bitwise the composed
// ops' (add_rms_norm, then matmul_multi's GEMV), the launch taken for the types it is built for
// (W4_G128: the separate GEMV launch, the same values).
TEST_F(CudaQuantMma, NormGemmWithF32ProjectionsBitwiseAsComposed) {
  const int64_t K = 2048, I = 512;
  for (DType dt : {DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::W4_G128}) {
    // the expert's gate and up as the model stores them: one stacked matrix (one GEMM group)
    const DevT gu = upload_tiled(*gpu_, quantized(rng_, dt, 2 * I, K));
    const DevT router = upload(*gpu_, random_t(rng_, DType::F32, {256, K}));
    const DevT gate1 = upload(*gpu_, random_t(rng_, DType::F32, {1, K}));
    const DevT norm = upload(*gpu_, random_t(rng_, DType::F32, {K}, 0.5f, 1.5f));
    const HostT h = random_t(rng_, DType::F32, {1, K}), delta = random_t(rng_, DType::F32, {1, K});
    const DevT dd = upload(*gpu_, delta);
    struct Run {
      DevT h2, x, logits, sg, ogu;
    };
    auto run = [&](bool fused) {
      const DevT dh = upload(*gpu_, h);
      Run r{upload(*gpu_, HostT(DType::F32, {1, K})), upload(*gpu_, HostT(DType::F32, {1, K})),
            upload(*gpu_, HostT(DType::F32, {1, 256})), upload(*gpu_, HostT(DType::F32, {1, 1})),
            upload(*gpu_, HostT(DType::F32, {1, 2 * I}))};
      const Tensor* ws[] = {&router.t, &gate1.t, &gu.t};
      Tensor* outs[] = {&r.logits.t, &r.sg.t, &r.ogu.t};
      if (fused)
        gpu_->add_rms_norm_matmul_multi(dh.t, dd.t, r.h2.t, norm.t, 1e-6f, r.x.t, ws, outs);
      else
        gpu_->Backend::add_rms_norm_matmul_multi(dh.t, dd.t, r.h2.t, norm.t, 1e-6f, r.x.t, ws, outs);
      return r;
    };
    const long long before = cuda::mma_norm_gemv_launches();
    const Run a = run(true);
    const long long launched = cuda::mma_norm_gemv_launches() - before;
    const Run b = run(false);
    EXPECT_EQ(launched, dt == DType::W4_G128 ? 0 : 1) << dtype_name(dt);
    auto same = [&](const char* what, const DevT& p, const DevT& q) {
      const std::vector<float> vp = download(*gpu_, p.t), vq = download(*gpu_, q.t);
      size_t diff = 0;
      for (size_t i = 0; i < vp.size(); ++i) diff += std::memcmp(&vp[i], &vq[i], sizeof(float)) != 0;
      EXPECT_EQ(diff, 0u) << what << " " << dtype_name(dt) << ": " << diff << " of " << vp.size()
                          << " values differ (largest relative difference " << rel_err(vp, vq) << ")";
    };
    same("residual stream", a.h2, b.h2);
    same("normalised x", a.x, b.x);
    same("router logits", a.logits, b.logits);
    same("shared gate logit", a.sg, b.sg);
    same("gate / up projection", a.ogu, b.ogu);
  }
}

}  // namespace
}  // namespace qwen36::gputest
