// The tiled GEMM's bf16 form (backend/cuda/cuda_quant_mma_half.cuh: Q4_K and Q6_K tiles at 17-64
// tokens, QWEN36_MMA_HB) against its CPU twin: every weight as the kernel forms it — Q4_K
// bf16(q · bf16(d · sc) + bf16(−dmin · m)), Q6_K bf16((q − 32) · bf16(d · sc)), each one rounding
// to nearest even of the exact value — times x rounded to bf16, summed in double. Only the f32
// sums of the tensor cores differ from the twin (products exact, K terms): 1e-4 of the largest
// output (max(1, max |want|), worst_rel_err). The twin's decoding of the blocks is itself checked
// against the CPU dequantizer (the same codes and scales in f32: 1e-4, an f32 rounding).
// Split row-tiles and stacked matrices: the same call eagerly and replayed from a CUDA graph gives
// bitwise the same outputs (the pieces summed in warp order). The producers of the bf16 fragments
// (the norm kernel, the SwiGLU quantization) are checked bitwise against the composed ops by
// test_cuda_quant_mma.cpp's NormAndSwigluQuantizeForTheGemmBitwiseAsComposed, in both forms.
#include <cmath>
#include <cstring>
#include <cstdio>
#include <functional>
#include <optional>
#include <span>
#include <string>

#include "backend/cpu/cpu_ops.h"
#include "gpu_test_util.h"
#include "quant/blocks.h"
#include "quant_test_util.h"

namespace qwen36::cuda {
// cuda_quant_mma.cu's test hooks: the GEMM's load path (QWEN36_MMA_LOADS: "regs" | "smem"), the
// bf16 form (QWEN36_MMA_HB: "on" | "off"; nullptr reads the environment again) and its launches.
void mma_select_variant(const char* loads, const char* t1_quant);
void mma_select_hb(const char* hb);
void mma_select_hb_blocks(int n);  // QWEN36_MMA_HB_BLOCKS: 1 | 2 blocks per SM at 17-32 tokens
void mma_select_hb_pairs(const char* pairs);  // QWEN36_MMA_HB_PAIRS: "on" | "off" | nullptr
long long mma_pair_min_units();               // the pairs rule's units past 32 tokens
long long mma_hb_launches();
// cuda_quant_wgmma.cu's experiment (returns the K splits used; 0: not an sm_90 device).
// flags: 1 the tiles through shared memory; 2 x as staged by the call before; 4 no sum of split
// pieces; 8 the pieces summed by the last block to arrive.
int wgmma_matmul_experiment(const Tensor& x, const Tensor& w, Tensor& out, int splits, uint32_t lbo, uint32_t sbo,
                            int flags);
// The warpgroup form in the dispatch (QWEN36_MMA_WG: "on" | "off" | nullptr), its launches so far,
// and the slabs' tokens where it runs at T (0: not here — an sm_90a build on an sm_90 device).
void mma_select_wg(const char* wg);
long long mma_wg_launches();
int wg_slab_tokens(int64_t T, int64_t K);
void mma_wg_force_splits(int n);  // QWEN36_MMA_WG_SPLITS: n ≥ 1 forced, 0 the rule, −1 the environment
}  // namespace qwen36::cuda

namespace qwen36::gputest {
namespace {

struct Shape {
  int64_t N, K;
};
// QWEN36_MMA_HB_PAIRS as a test sets it: never, the backend's rule (unset), everywhere.
enum class Pairs { Off, Auto, On };

class CudaQuantMmaHalf : public CudaTest {
 protected:
  // Each shape, on both load paths, at each T: the backend's call within 1e-4 of the bf16 twin,
  // or, where the form stays int8 (takes_half), of the int8 twin (2e-5, as test_cuda_quant_mma.cpp),
  // with one bf16 launch or none. pick(T) selects T's variants and names them; pairs is set
  // for the whole run.
  void expect_twins(std::span<const Shape> shapes, std::span<const int64_t> Ts, Pairs pairs,
                    const std::function<std::string(int64_t)>& pick);
  void expect_stacked_bitwise(std::span<const int64_t> Ts, uint64_t key, const char* form,
                              const std::function<long long()>& launches, const std::function<void(bool)>& on);
  void SetUp() override {
    CudaTest::SetUp();
    cuda::mma_select_hb("on");
    cuda::mma_select_wg("off");
  }
  void TearDown() override {
    cuda::mma_select_wg(nullptr);
    cuda::mma_wg_force_splits(-1);
    cuda::mma_select_hb(nullptr);
    cuda::mma_select_hb_blocks(0);
    cuda::mma_select_hb_pairs(nullptr);
    cuda::mma_select_variant(nullptr, nullptr);
  }
};

// v rounded to bf16, nearest even (8 significant bits), from the exact double.
double bf16_rne(double v) {
  if (v == 0.0) return v;
  int e = 0;
  const double m = std::frexp(v, &e);  // |m| in [0.5, 1)
  return std::ldexp(std::nearbyint(std::ldexp(m, 8)), e - 8);
}
float f16(uint16_t h) { return f16_to_f32(h); }

// One Q4_K / Q6_K row's weights as the bf16 form computes them (want_form), and as the CPU
// dequantizer's codes and scales give them in f32 (want_f32: the twin's own decoding check).
void form_row(const HostT& w, int64_t n, float* out, float* out_f32) {
  const int64_t K = w.t.cols();
  const uint8_t* row = w.bytes.data() + size_t(n) * w.t.row_bytes();
  for (int64_t b = 0; b < K / 256; ++b) {
    float* o = out + 256 * b;
    float* of = out_f32 + 256 * b;
    if (w.t.dtype == DType::Q4_K) {
      const BlockQ4_K& blk = reinterpret_cast<const BlockQ4_K*>(row)[b];
      const float d = f16(blk.d), dmin = f16(blk.dmin);
      for (int e = 0; e < 256; ++e) {
        const int j = e / 32, c = j / 2, l = e % 32;
        const int q = j % 2 == 0 ? blk.qs[32 * c + l] & 15 : blk.qs[32 * c + l] >> 4;
        uint8_t sc = 0, m = 0;
        unpack_k_scale_min(j, blk.scales, sc, m);
        const double s = bf16_rne(double(d * float(sc))), nm = bf16_rne(double(-dmin * float(m)));
        o[e] = float(bf16_rne(double(q) * s + nm));
        of[e] = d * float(sc) * float(q) - dmin * float(m);
      }
    } else {
      const BlockQ6_K& blk = reinterpret_cast<const BlockQ6_K*>(row)[b];
      const float d = f16(blk.d);
      for (int e = 0; e < 256; ++e) {
        const int h = e / 128, g4 = (e % 128) / 32, l = e % 32;
        const uint8_t lo = blk.ql[64 * h + l + (g4 % 2 ? 32 : 0)];
        const int q = ((g4 < 2 ? lo & 15 : lo >> 4) | (((blk.qh[32 * h + l] >> (2 * g4)) & 3) << 4)) - 32;
        const int sc = blk.scales[e / 16];
        o[e] = float(bf16_rne(double(q) * bf16_rne(double(d * float(sc)))));
        of[e] = d * float(sc) * float(q);
      }
    }
  }
}

// The bf16 form's weights of w ([N, K] f32; rows n % step == 0, the rest zero), the decoding
// checked against cpu::weight_row_to_f32.
HostT form_weights(const HostT& w, int64_t step) {
  const int64_t N = w.t.rows(), K = w.t.cols();
  HostT out(DType::F32, {N, K});
  std::vector<float> f32(static_cast<size_t>(K)), cpu(static_cast<size_t>(K));
  for (int64_t n = 0; n < N; n += step) {
    form_row(w, n, out.f() + n * K, f32.data());
    cpu::weight_row_to_f32(w.t, n, cpu.data());
    double worst = 0.0;
    for (int64_t k = 0; k < K; ++k) worst = std::max(worst, double(std::abs(f32[size_t(k)] - cpu[size_t(k)])));
    EXPECT_LE(worst, 1e-4) << dtype_name(w.t.dtype) << " row " << n << ": the twin decodes the blocks wrongly";
  }
  return out;
}

// Whether the backend takes the bf16 form for dt at T tokens of N rows of K (hb_form,
// cuda_quant_mma.cu): every 17-64-token call but Q4_K rows of ≥ 32 super-blocks past 32 tokens,
// which take pairs of row-tiles where their row-tiles pair up (Pairs::On; Pairs::Auto: into
// at least the backend's mma_pair_min_units() units of two), else stay int8.
bool takes_half(DType dt, int64_t N, int64_t K, int64_t T, Pairs pairs) {
  if (T <= 16) return false;
  const bool int8_rows = dt == DType::Q4_K && K >= 32 * 256 && T > 32;
  const bool enough = pairs == Pairs::On || (pairs == Pairs::Auto && (N / 32) * (K / 256) >= cuda::mma_pair_min_units());
  const bool paired = (N / 16) % 2 == 0 && enough;
  return !int8_rows || paired;
}

HostT bf16_rounded(const HostT& x) {
  HostT y = x;
  for (int64_t i = 0; i < x.t.numel(); ++i) y.f()[i] = float(bf16_rne(double(x.t.as<const float>()[i])));
  return y;
}

// A shape's weights for a twin check: the host matrix (its rows repeated where it is large, every
// 61st then checked), the bf16 form's weights of the checked rows, its tiled device copy.
struct TwinWeights {
  int64_t step;
  HostT w, wf;
  DevT dw;
};
TwinWeights twin_weights(Backend& gpu, std::mt19937& rng, DType dt, const Shape& s) {
  const bool big = s.N * s.K > (int64_t(8) << 20);
  const int64_t step = big ? 61 : 1;
  const HostT w = big ? repeated_rows(rng, dt, s.N, s.K) : quantized(rng, dt, s.N, s.K);
  return TwinWeights{step, w, form_weights(w, step), upload_tiled(gpu, w)};
}

// A 27B-sized matrix for cold-L2 timing: its rows repeated (repeated_rows), the bf16 form's weights
// of every 997th row (the twin's spot check), and device copies adding up to > 256 MB (over 4× the
// H200's L2), which the timed calls rotate through.
struct ColdCopies {
  HostT w, wf;
  std::vector<DevT> dw;
  double mb = 0.0;  // one copy's size
};
ColdCopies cold_copies(Backend& gpu, std::mt19937& rng, DType dt, int64_t N, int64_t K) {
  ColdCopies c{repeated_rows(rng, dt, N, K), HostT(DType::F32, {1}), {}};
  const int copies = int(std::max<size_t>(2, (size_t(256) << 20) / c.w.bytes.size() + 1));
  for (int i = 0; i < copies; ++i) c.dw.push_back(upload_tiled(gpu, c.w));
  c.wf = form_weights(c.w, 997);
  c.mb = double(c.dw[0].t.nbytes()) / 1e6;
  return c;
}
// The 27B's MLP gate / up and down, DeltaNet qkv and the stacked gate + up (the timing tests').
constexpr Shape k27BShapes[] = {{17408, 5120}, {5120, 17408}, {10240, 5120}, {34816, 5120}};

void CudaQuantMmaHalf::expect_twins(std::span<const Shape> shapes, std::span<const int64_t> Ts, Pairs pairs,
                                    const std::function<std::string(int64_t)>& pick) {
  cuda::mma_select_hb_pairs(pairs == Pairs::On ? "on" : pairs == Pairs::Off ? "off" : nullptr);
  for (DType dt : {DType::Q4_K, DType::Q6_K})
    for (const Shape& s : shapes) {
      const TwinWeights tw = twin_weights(*gpu_, rng_, dt, s);
      const int64_t step = tw.step;
      const HostT& w = tw.w;
      const HostT& wf = tw.wf;
      const DevT& dw = tw.dw;
      for (const char* loads : {"regs", "smem"})
        for (int64_t T : Ts) {
          cuda::mma_select_variant(loads, nullptr);
          const std::string variants = pick(T);
          const HostT x = random_t(rng_, DType::F32, {T, s.K});
          DevT dx = upload(*gpu_, x), dout = upload(*gpu_, HostT(DType::F32, {T, s.N}));
          const long long before = cuda::mma_hb_launches();
          gpu_->matmul(dx.t, dw.t, dout.t);
          const std::string what = std::string(dtype_name(dt)) + " N=" + std::to_string(s.N) + " K=" +
                                   std::to_string(s.K) + " T=" + std::to_string(T) + " loads=" + loads + " " + variants;
          const bool half = takes_half(dt, s.N, s.K, T, pairs);
          EXPECT_EQ(cuda::mma_hb_launches(), before + (half ? 1 : 0)) << what << ": the bf16 form ran " << !half;
          const std::vector<float> want =
              half ? reference(wf, bf16_rounded(x), T, step) : reference(w, int8_activations(x), T, step);
          std::string where;
          EXPECT_LE(worst_rel_err(download(*gpu_, dout.t), want, T, s.N, step, &where), half ? 1e-4 : 2e-5)
              << what << " " << where;
        }
    }
  cuda::mma_select_variant(nullptr, nullptr);
}

// Where the form stays int8 (takes_half), that form is checked against its int8 twin instead.
// Shapes: one tile; 3 row-tiles of 2 super-blocks; a row-tile over 68 warps; the 27B's attention
// output and MLP down (K = 17408: the Q6_K ring's and the 24-token verify's shapes); 2400 row-tiles
// of 4 super-blocks (ranges start and end mid row-tile). T: 17-24 (three n8 tiles of four), 25-32,
// 33-64; both load paths, one or two blocks per SM (QWEN36_MMA_HB_BLOCKS, 17-32 tokens).
TEST_F(CudaQuantMmaHalf, EqualsItsBf16Twin) {
  const Shape shapes[] = {{16, 256}, {48, 512}, {16, 17408}, {5120, 6144}, {1024, 17408}, {38400, 1024}};
  const int64_t Ts[] = {17, 23, 24, 25, 32, 33, 64};
  expect_twins(shapes, Ts, Pairs::Auto, [](int64_t T) {
    cuda::mma_select_hb_blocks(T % 2 ? 1 : 2);  // each T on one of the two: both for every shape
    return std::string("blocks=") + (T % 2 ? "1" : "2");
  });
}

// Three matrices stored back to back (48 + 4096 + 16 rows of K = 2048: one stacked launch whose
// split row-tiles, pairs or groups of 4 row-tiles straddle the matrices' borders) at each T in
// the form selected: three eager calls and two replays of the recorded call bitwise the same,
// each matrix within 1e-4 of the twin; launches() counts the form's launches (one a call). Then
// off() switches the form off and one more call must not launch it.
void CudaQuantMmaHalf::expect_stacked_bitwise(std::span<const int64_t> Ts, uint64_t key, const char* form,
                                              const std::function<long long()>& launches,
                                              const std::function<void(bool)>& on) {
  const int64_t K = 2048;
  const int64_t rows[] = {48, 4096, 16};
  for (DType dt : {DType::Q4_K, DType::Q6_K}) {
    const Stacked st = stacked(*gpu_, rng_, dt, rows, K);
    for (int64_t T : Ts) {
      const HostT x = random_t(rng_, DType::F32, {T, K}), xb = bf16_rounded(x);
      DevT dx = upload(*gpu_, x);
      StackedCall call = stacked_call(*gpu_, st, T);
      const std::string what = std::string(dtype_name(dt)) + " T=" + std::to_string(T) + " (" + form + ")";
      auto outputs = [&]() {
        std::vector<float> v;
        for (const DevT& o : call.out) {
          const std::vector<float> d = download(*gpu_, o.t);
          v.insert(v.end(), d.begin(), d.end());
        }
        return v;
      };
      std::vector<std::vector<float>> runs;
      const long long before = launches();
      for (int r = 0; r < 3; ++r) {
        gpu_->matmul_multi(dx.t, call.ws, call.outs);
        runs.push_back(outputs());
      }
      EXPECT_EQ(launches(), before + 3) << what << ": one launch of the form a call";
      ++key;
      ASSERT_TRUE(gpu_->begin_capture());
      gpu_->matmul_multi(dx.t, call.ws, call.outs);
      ASSERT_TRUE(gpu_->end_capture(key, true)) << what << ": the call could not be recorded";
      for (int r = 0; r < 2; ++r) {
        for (DevT& o : call.out) gpu_->copy_from_host(HostT(DType::F32, {T, o.t.cols()}).t.data, o.t);
        ASSERT_TRUE(gpu_->replay(key));
        runs.push_back(outputs());
      }
      for (size_t r = 1; r < runs.size(); ++r) {
        size_t diff = 0;
        for (size_t i = 0; i < runs[0].size(); ++i) diff += std::memcmp(&runs[r][i], &runs[0][i], sizeof(float)) != 0;
        EXPECT_EQ(diff, 0u) << what << (r < 3 ? " eager run " : " replay ") << r << ": outputs differ from run 0";
      }
      size_t o = 0;
      for (size_t i = 0; i < st.host.size(); ++i) {
        const std::vector<float> got(runs.back().begin() + o, runs.back().begin() + o + size_t(T * rows[i]));
        o += got.size();
        std::string where;
        EXPECT_LE(worst_rel_err(got, reference(form_weights(st.host[i], 1), xb, T), T, rows[i], 1, &where), 1e-4)
            << what << " matrix " << i << " " << where;
      }
      on(false);
      const long long off_before = launches();
      gpu_->matmul_multi(dx.t, call.ws, call.outs);
      EXPECT_EQ(launches(), off_before) << what << ": switched off, the form still ran";
      on(true);
    }
  }
}

// The bf16 form (17, 40 and 64 tokens; its row-tiles split between warps across the borders);
// with QWEN36_MMA_HB=off the int8 form runs instead (no bf16 launch).
TEST_F(CudaQuantMmaHalf, StackedBitwiseEagerAndReplayed) {
  const int64_t Ts[] = {17, 40, 64};
  expect_stacked_bitwise(Ts, 0x4842'0000, "bf16", cuda::mma_hb_launches,
                         [](bool on) { cuda::mma_select_hb(on ? "on" : "off"); });
}

// The pair form (QWEN36_MMA_HB_PAIRS=on: units of two row-tiles sharing each B fragment load) on
// both load paths: every shape within 1e-4 of the bf16 twin (a group of an odd row-tile count
// falls back to single tiles, as {48, 512} does), Q4_K rows of ≥ 32 super-blocks past 32 tokens
// included (pairs take them too); stacked matrices whose pairs straddle a matrix border (48 + 4096
// + 16 rows: row-tiles 2 and 3 of different matrices) bitwise the same eagerly and replayed.
TEST_F(CudaQuantMmaHalf, PairsEqualTheirBf16Twin) {
  const Shape shapes[] = {{32, 256}, {48, 512}, {32, 17408}, {5120, 6144}, {1024, 17408}, {38400, 1024}};
  const int64_t Ts[] = {17, 24, 32, 40, 64};
  expect_twins(shapes, Ts, Pairs::On, [](int64_t) { return std::string("pairs"); });
  const int64_t stacked_Ts[] = {24, 64};  // pairs stay on: expect_twins set them for the test
  expect_stacked_bitwise(stacked_Ts, 0x5041'0000, "bf16 pairs", cuda::mma_hb_launches,
                         [](bool on) { cuda::mma_select_hb(on ? "on" : "off"); });
}

// The warpgroup form as the dispatch runs it (QWEN36_MMA_WG=on; cuda_quant_wgmma.cu): the
// activations' slabs from quantize_kernel, one launch per call, within 1e-4 of the bf16 twin; the
// same call again bitwise the same (its arrival counters left zero, the pieces summed in split
// order). Shapes as EqualsItsBf16Twin's: a group of 4 row-tiles with a spare warp ({48, 512}), one
// row-tile of 68 super-blocks (8 splits), 80 and 16 groups (8), 600 groups of 4 super-blocks
// (2), one super-block (1); T over every slab size (24, 32, 48, 64 tokens).
TEST_F(CudaQuantMmaHalf, WarpgroupFormEqualsItsBf16Twin) {
  cuda::mma_select_wg("on");
  if (cuda::wg_slab_tokens(24, 256) == 0) GTEST_SKIP() << "the warpgroup form needs an sm_90a build on an sm_90 device";
  const Shape shapes[] = {{16, 256}, {48, 512}, {16, 17408}, {5120, 6144}, {1024, 17408}, {38400, 1024}};
  for (DType dt : {DType::Q4_K, DType::Q6_K})
    for (const Shape& s : shapes) {
      const TwinWeights tw = twin_weights(*gpu_, rng_, dt, s);
      for (int64_t T : {17, 23, 24, 25, 32, 33, 40, 48, 49, 64}) {
        const HostT x = random_t(rng_, DType::F32, {T, s.K});
        DevT dx = upload(*gpu_, x), dout = upload(*gpu_, HostT(DType::F32, {T, s.N}));
        const std::string what = std::string(dtype_name(dt)) + " N=" + std::to_string(s.N) + " K=" +
                                 std::to_string(s.K) + " T=" + std::to_string(T);
        const long long before = cuda::mma_wg_launches();
        gpu_->matmul(dx.t, tw.dw.t, dout.t);
        const std::vector<float> first = download(*gpu_, dout.t);
        gpu_->matmul(dx.t, tw.dw.t, dout.t);
        const std::vector<float> second = download(*gpu_, dout.t);
        EXPECT_EQ(cuda::mma_wg_launches(), before + 2) << what << ": one warpgroup launch a call";
        EXPECT_EQ(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)), 0)
            << what << ": the second call differs from the first";
        std::string where;
        EXPECT_LE(worst_rel_err(first, reference(tw.wf, bf16_rounded(x), T, tw.step), T, s.N, tw.step, &where), 1e-4)
            << what << " " << where;
      }
    }
}

// QWEN36_MMA_WG=auto takes the form where it measured faster (cuda_quant_wgmma.cu): rows of ≥ 16
// super-blocks at 17-64 tokens; elsewhere the bf16 form runs. Each call within 1e-4 of the twin
// whichever form ran.
TEST_F(CudaQuantMmaHalf, WarpgroupAutoRule) {
  cuda::mma_select_wg("on");
  if (cuda::wg_slab_tokens(24, 256) == 0) GTEST_SKIP() << "the warpgroup form needs an sm_90a build on an sm_90 device";
  cuda::mma_select_wg("auto");
  struct Case {
    int64_t K, T;
    bool wg;
  };
  for (const Case& c : {Case{1024, 40, false}, Case{4096, 40, true}, Case{2048, 24, false}, Case{4096, 24, true},
                        Case{4096, 17, true}, Case{8192, 16, false}}) {
    const TwinWeights tw = twin_weights(*gpu_, rng_, DType::Q4_K, Shape{64, c.K});
    const HostT x = random_t(rng_, DType::F32, {c.T, c.K});
    DevT dx = upload(*gpu_, x), dout = upload(*gpu_, HostT(DType::F32, {c.T, 64}));
    const long long before = cuda::mma_wg_launches();
    gpu_->matmul(dx.t, tw.dw.t, dout.t);
    const std::string what = "K=" + std::to_string(c.K) + " T=" + std::to_string(c.T);
    EXPECT_EQ(cuda::mma_wg_launches(), before + (c.wg ? 1 : 0)) << what;
    if (c.T > 16) {
      std::string where;
      EXPECT_LE(worst_rel_err(download(*gpu_, dout.t), reference(tw.wf, bf16_rounded(x), c.T, tw.step), c.T, 64,
                              tw.step, &where),
                1e-4)
          << what << " " << where;
    }
  }
}

// The warpgroup form on the stacked matrices (its groups of 4 row-tiles straddle the borders), at
// 17, 40 and 64 tokens; QWEN36_MMA_WG=off takes the bf16 form again.
TEST_F(CudaQuantMmaHalf, WarpgroupStackedBitwiseEagerAndReplayed) {
  cuda::mma_select_wg("on");
  if (cuda::wg_slab_tokens(24, 256) == 0) GTEST_SKIP() << "the warpgroup form needs an sm_90a build on an sm_90 device";
  const int64_t Ts[] = {17, 40, 64};
  expect_stacked_bitwise(Ts, 0x5747'0000, "warpgroup", cuda::mma_wg_launches,
                         [](bool on) { cuda::mma_select_wg(on ? "on" : "off"); });
}

// Cold-L2 times of the 27B's large Q4_K and Q6_K matrices at 17-64 tokens, whole calls as the
// dispatch makes them (quantize_kernel, then the GEMM): without the warpgroup form (the bf16 /
// int8 forms as hb_form picks them) and with it, its splits by the rule (wg_splits) and forced to
// 1, 2, 4 and 8 — the figures to fit the rule and to decide QWEN36_MMA_WG's default by. Copies
// adding up to > 256 MB, rotated; the rule's result checked against the twin.
TEST_F(CudaQuantMmaHalf, WarpgroupTiming27B) {
  cuda::mma_select_wg("on");
  if (cuda::wg_slab_tokens(24, 256) == 0) GTEST_SKIP() << "the warpgroup form needs an sm_90a build on an sm_90 device";
  for (DType dt : {DType::Q4_K, DType::Q6_K})
    for (const Shape& s : k27BShapes) {
      const int64_t N = s.N, K = s.K;
      const ColdCopies cc = cold_copies(*gpu_, rng_, dt, N, K);
      const HostT& wf = cc.wf;
      const std::vector<DevT>& dw = cc.dw;
      const int copies = int(dw.size());
      const double mb = cc.mb;
      for (int64_t T : {17, 24, 32, 40, 64}) {
        const HostT x = random_t(rng_, DType::F32, {T, K});
        DevT dx = upload(*gpu_, x), dout = upload(*gpu_, HostT(DType::F32, {T, N}));
        auto timed = [&] { return 1e6 * time_per_call(copies, [&](int i) { gpu_->matmul(dx.t, dw[size_t(i)].t, dout.t); }); };
        cuda::mma_select_wg("off");
        const double base = timed();
        cuda::mma_select_wg("on");
        std::string line;
        double best = 1e30, rule = 0.0;
        int best_splits = 0;
        for (int splits : {1, 2, 4, 8, 0}) {  // the rule last: its result is checked
          cuda::mma_wg_force_splits(splits);
          const double us = timed();
          if (splits == 0) {
            rule = us;
            break;
          }
          char buf[32];
          std::snprintf(buf, sizeof buf, " %d: %.1f", splits, us);
          line += buf;
          if (us < best) best = us, best_splits = splits;
        }
        std::string where;
        EXPECT_LE(worst_rel_err(download(*gpu_, dout.t), reference(wf, bf16_rounded(x), T, 997), T, N, 997, &where), 1e-4)
            << dtype_name(dt) << " N=" << N << " K=" << K << " T=" << T << " " << where;
        std::printf("[ wg-cold ] %s %lld x %lld (%.1f MB), T=%lld: without %.1f us (%.0f GB/s); warpgroup rule %.1f us "
                    "(%.2fx), best %.1f us at %d splits (%.2fx); us by splits%s\n",
                    std::string(dtype_name(dt)).c_str(), (long long)N, (long long)K, mb, (long long)T, base,
                    mb * 1e3 / base, rule, base / rule, best, best_splits, base / best, line.c_str());
      }
      cuda::mma_wg_force_splits(0);
    }
}

// Cold-L2 times of the 27B's large Q4_K and Q6_K matrices at 17-64 tokens in both forms (the
// int8 one with QWEN36_MMA_HB=off; the bf16 one with one and two blocks per SM), one process, the
// forms alternating per shape; the bf16 form spot-checked against its twin. Copies adding up to > 256 MB (over 4× the H200's L2), rotated.
TEST_F(CudaQuantMmaHalf, Bandwidth27BBothForms) {
  for (DType dt : {DType::Q4_K, DType::Q6_K})
    for (auto [N, K] : {std::pair<int64_t, int64_t>{17408, 5120}, {5120, 17408}, {10240, 5120}}) {
      const ColdCopies cc = cold_copies(*gpu_, rng_, dt, N, K);
      const HostT &w = cc.w, &wf = cc.wf;
      const std::vector<DevT>& dw = cc.dw;
      const int copies = int(dw.size());
      for (int64_t T : {17, 23, 24, 32, 40, 64}) {
        const HostT x = random_t(rng_, DType::F32, {T, K});
        DevT dx = upload(*gpu_, x), dout = upload(*gpu_, HostT(DType::F32, {T, N}));
        // int8, bf16 one block per SM, bf16 two (checked below), bf16 on pairs of row-tiles
        double us[4] = {0, 0, 0, 0};
        for (int form : {0, 1, 3, 2}) {
          cuda::mma_select_hb(form ? "on" : "off");
          cuda::mma_select_hb_blocks(form == 1 ? 1 : 2);
          cuda::mma_select_hb_pairs(form == 3 ? "on" : "off");
          us[form] = 1e6 * time_per_call(copies, [&](int i) { gpu_->matmul(dx.t, dw[size_t(i)].t, dout.t); });
        }
        const std::string what = std::string(dtype_name(dt)) + "-t16 " + std::to_string(N) + " x " + std::to_string(K) +
                                 ", T=" + std::to_string(T);
        const bool half = takes_half(dt, N, K, T, Pairs::Off);  // form 2, pairs off, ran last
        const std::vector<float> want =
            half ? reference(wf, bf16_rounded(x), T, 997) : reference(w, int8_activations(x), T, 997);
        std::string where;
        EXPECT_LE(worst_rel_err(download(*gpu_, dout.t), want, T, N, 997, &where), half ? 1e-4 : 2e-5) << what << " " << where;
        std::printf("[ gemm-cold ] %s: int8 form %.1f us, bf16 form %.1f us (1 block / SM), %.1f us (2; T > 32: 1)%s, "
                    "bf16 pairs %.1f us\n",
                    what.c_str(), us[0], us[1], us[2], half ? "" : " (stays int8: the two before are the int8 form)",
                    us[3]);
      }
    }
}

// ---- EXPERIMENT: the bf16 form on Hopper's warpgroup MMA (src/backend/cuda/cuda_quant_wgmma.cu) ----

struct WgmmaOffsets {
  uint32_t lbo = 128, sbo = 256;
};

// The descriptors' core-matrix offsets that give the twin's result on one row-group at 16 tokens:
// the PTX ISA's reading (along K 128 bytes, along N 256) first, else the other; nullopt: neither
// (or no sm_90 device: skipped by the caller).
std::optional<WgmmaOffsets> wgmma_offsets(Backend& gpu, std::mt19937& rng) {
  const HostT w = quantized(rng, DType::Q4_K, 64, 512), x = random_t(rng, DType::F32, {16, 512});
  const std::vector<float> want = reference(form_weights(w, 1), bf16_rounded(x), 16);
  const DevT dw = upload_tiled(gpu, w);
  DevT dx = upload(gpu, x), dout = upload(gpu, HostT(DType::F32, {16, 64}));
  for (WgmmaOffsets o : {WgmmaOffsets{128, 256}, WgmmaOffsets{256, 128}}) {
    if (cuda::wgmma_matmul_experiment(dx.t, dw.t, dout.t, 1, o.lbo, o.sbo, 0) == 0) return std::nullopt;
    std::string where;
    const double err = worst_rel_err(download(gpu, dout.t), want, 16, 64, 1, &where);
    std::printf("[ wgmma ] offsets along K %u, along N %u: worst error %.3g %s\n", o.lbo, o.sbo, err, where.c_str());
    if (err <= 1e-4) return o;
  }
  // Neither: where a single activation (token n0, k k0) lands, by the PTX ISA's offsets — the
  // token column it reaches and the weight column k it meets (the best fit over the 64 rows).
  const HostT wf = form_weights(w, 1);
  for (auto [n0, k0] : {std::pair<int, int>{0, 0}, {0, 1}, {0, 2}, {0, 8}, {0, 16}, {0, 17}, {0, 32}, {0, 256}, {1, 0},
                        {7, 0}, {8, 0}, {15, 3}}) {
    HostT xp(DType::F32, {16, 512});
    xp.f()[n0 * 512 + k0] = 1.0f;
    DevT dxp = upload(gpu, xp);
    cuda::wgmma_matmul_experiment(dxp.t, dw.t, dout.t, 1, 128, 256, 0);
    const std::vector<float> got = download(gpu, dout.t);
    for (int n = 0; n < 16; ++n) {
      double mag = 0;
      for (int r = 0; r < 64; ++r) mag += std::abs(got[size_t(n * 64 + r)]);
      if (mag == 0) continue;
      int best_k = -1;
      double best = 1e30;
      for (int k = 0; k < 512; ++k) {
        double e = 0;
        for (int r = 0; r < 64; ++r) e += std::abs(double(got[size_t(n * 64 + r)]) - double(wf.t.as<const float>()[r * 512 + k]));
        if (e < best) best = e, best_k = k;
      }
      std::printf("[ wgmma ] probe x(token %d, k %d) reaches token %d, meets weight k %d (misfit %.3g of %.3g)\n", n0, k0,
                  n, best_k, best, mag);
    }
  }
  return std::nullopt;
}

// Every shape and T within 1e-4 of the bf16 twin (the weights and x as the bf16 form rounds
// them): one row-group of one super-block; 2 row-groups of 8; the 27B's attention output at
// K = 6144 (split along K); a K = 17408 row; automatic splits and none.
TEST_F(CudaQuantMmaHalf, WgmmaExperimentEqualsBf16Twin) {
  {
    DevT dx = upload(*gpu_, HostT(DType::F32, {1, 256})), dout = upload(*gpu_, HostT(DType::F32, {1, 64}));
    const DevT dw = upload_tiled(*gpu_, quantized(rng_, DType::Q4_K, 64, 256));
    if (cuda::wgmma_matmul_experiment(dx.t, dw.t, dout.t, 1, 128, 256, 0) == 0) GTEST_SKIP() << "not an sm_90 device";
  }
  const std::optional<WgmmaOffsets> off = wgmma_offsets(*gpu_, rng_);
  ASSERT_TRUE(off.has_value()) << "no descriptor offsets give the twin's result";
  const Shape shapes[] = {{64, 256}, {128, 2048}, {5120, 6144}, {64, 17408}};
  for (DType dt : {DType::Q4_K, DType::Q6_K})
    for (const Shape& s : shapes) {
      const TwinWeights tw = twin_weights(*gpu_, rng_, dt, s);
      for (int64_t T : {1, 5, 8, 9, 16, 17, 24, 25, 32, 33, 64})
        for (int splits : {0, 1})
          for (int flags : {0, 1, 8, 9}) {  // registers / ring; pieces summed by a kernel / the last block
            const HostT x = random_t(rng_, DType::F32, {T, s.K});
            DevT dx = upload(*gpu_, x), dout = upload(*gpu_, HostT(DType::F32, {T, s.N}));
            const int used = cuda::wgmma_matmul_experiment(dx.t, tw.dw.t, dout.t, splits, off->lbo, off->sbo, flags);
            std::string where;
            EXPECT_LE(worst_rel_err(download(*gpu_, dout.t), reference(tw.wf, bf16_rounded(x), T, tw.step), T, s.N, tw.step,
                                    &where),
                      1e-4)
                << dtype_name(dt) << " N=" << s.N << " K=" << s.K << " T=" << T << " splits=" << used << " flags=" << flags
                << " " << where;
          }
    }
}

// Cold-L2 times of the 27B's matrices (as Bandwidth27BBothForms) at 4-64 tokens: the backend's own
// form at that T against the experiment's two load paths (tiles in registers, through the shared
// ring), each with its automatic splits and with 1, 2, 4 and 8, whole (x staged, pieces summed by
// a kernel), whole with the pieces summed by the last block and, in parentheses, the GEMM kernel
// alone; GB/s of the matrix's bytes. Spot-checked against the twin.
TEST_F(CudaQuantMmaHalf, WgmmaExperimentTiming27B) {
  const std::optional<WgmmaOffsets> off = wgmma_offsets(*gpu_, rng_);
  if (!off) GTEST_SKIP() << "not an sm_90 device, or the descriptor offsets are wrong (see the test above)";
  for (DType dt : {DType::Q4_K, DType::Q6_K})
    for (const Shape& s : k27BShapes) {
      const int64_t N = s.N, K = s.K;
      const ColdCopies cc = cold_copies(*gpu_, rng_, dt, N, K);
      const HostT& wf = cc.wf;
      const std::vector<DevT>& dw = cc.dw;
      const int copies = int(dw.size());
      const double mb = cc.mb;
      for (int64_t T : {4, 8, 16, 24, 32, 64}) {
        const HostT x = random_t(rng_, DType::F32, {T, K});
        DevT dx = upload(*gpu_, x), dout = upload(*gpu_, HostT(DType::F32, {T, N}));
        cuda_synchronize();
        const double base = 1e6 * time_per_call(copies, [&](int i) { gpu_->matmul(dx.t, dw[size_t(i)].t, dout.t); });
        const std::vector<float> want = reference(wf, bf16_rounded(x), T, 997);
        std::string line;
        double best[2] = {1e30, 1e30};
        int best_splits[2] = {0, 0};
        for (bool ring : {false, true}) {
          line += ring ? "; ring" : "; regs";
          for (int splits : {0, 1, 2, 4, 8}) {
            int used = 0;
            const int flags = ring ? 1 : 0;
            const double us = 1e6 * time_per_call(copies, [&](int i) {
              used = cuda::wgmma_matmul_experiment(dx.t, dw[size_t(i)].t, dout.t, splits, off->lbo, off->sbo, flags);
            });
            const double kernel_us = 1e6 * time_per_call(copies, [&](int i) {  // x staged by the calls above
              cuda::wgmma_matmul_experiment(dx.t, dw[size_t(i)].t, dout.t, splits, off->lbo, off->sbo, flags | 2 | 4);
            });
            const double last_us = 1e6 * time_per_call(copies, [&](int i) {  // the last block sums
              cuda::wgmma_matmul_experiment(dx.t, dw[size_t(i)].t, dout.t, splits, off->lbo, off->sbo, flags | 8);
            });
            cuda::wgmma_matmul_experiment(dx.t, dw[0].t, dout.t, splits, off->lbo, off->sbo, flags);  // whole, checked
            char buf[96];
            std::snprintf(buf, sizeof buf, " %s%d: %.1f / %.1f (%.1f)", splits == 0 ? "auto " : "", used, us, last_us,
                          kernel_us);
            line += buf;
            if (us < best[ring]) best[ring] = us, best_splits[ring] = used;
            if (last_us < best[ring]) best[ring] = last_us, best_splits[ring] = used;
            std::string where;
            EXPECT_LE(worst_rel_err(download(*gpu_, dout.t), want, T, N, 997, &where), 1e-4)
                << dtype_name(dt) << " N=" << N << " K=" << K << " T=" << T << " splits=" << used << " ring=" << ring
                << " " << where;
          }
        }
        std::printf("[ wgmma-cold ] %s %lld x %lld (%.1f MB), T=%lld: backend %.1f us (%.0f GB/s); best regs %.1f us "
                    "(%.0f GB/s, splits %d, %.2fx), ring %.1f us (%.0f GB/s, splits %d, %.2fx); by splits, us whole / last block sums (kernel alone)%s\n",
                    std::string(dtype_name(dt)).c_str(), (long long)N, (long long)K, mb, (long long)T, base,
                    mb * 1e3 / base, best[0], mb * 1e3 / best[0], best_splits[0], base / best[0], best[1],
                    mb * 1e3 / best[1], best_splits[1], base / best[1], line.c_str());
      }
    }
}

}  // namespace
}  // namespace qwen36::gputest
