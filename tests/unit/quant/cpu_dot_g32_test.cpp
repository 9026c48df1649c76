// Per-32 int8 activations (the CUDA backend's, cpu_dot_g32.h): the quantizer is the GPU's
// rounding, and every kernel equals the reference on random rows.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "dot_bench.h"
#include "quant/cpu_dot.h"
#include "quant/cpu_dot_g32.h"
#include "quant/cpu_dot_kernels.h"
#include "quant/quant.h"

namespace qwen36 {
namespace {

const DType kTypes[] = {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_0};

using test::gaussian;

std::vector<BlockQ8G32> quantized(const std::vector<float>& x) {
  std::vector<BlockQ8G32> b(x.size() / 256);
  quantize_activation_g32(x.data(), b.data(), int64_t(x.size()));
  return b;
}

// The code of v is v · (127 / amax) rounded to nearest even, the product exact (as the GPU's
// fused multiply-add takes it; two floats' product is exact in double), the scale amax / 127;
// ds and hsums are the codes' sums, dpair the scales again. Ties and an all-zero group included.
TEST(CpuDotG32, QuantizerIsTheDeviceRounding) {
  std::vector<float> x = gaussian(1024, 3, 2.0f);
  for (int l = 0; l < 32; ++l) x[64 + size_t(l)] = 0.0f;      // group 2: all zero
  for (int l = 0; l < 32; ++l) x[96 + size_t(l)] = float(l) - 16.0f;  // group 3: amax 16, ties at ±0.5 codes
  x[200] = -7.5f;
  const std::vector<BlockQ8G32> b = quantized(x);
  int ties = 0;
  for (size_t g = 0; g < x.size() / 32; ++g) {
    const BlockQ8G32& blk = b[g / 8];
    const int j = int(g % 8);
    float amax = 0.0f;
    for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(x[32 * g + size_t(l)]));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    ASSERT_EQ(blk.d[j], amax / 127.0f) << "group " << g;
    int sum[2] = {0, 0};
    for (int l = 0; l < 32; ++l) {
      const double exact = double(x[32 * g + size_t(l)]) * double(inv);
      ties += std::fabs(exact - std::trunc(exact)) == 0.5;
      const int q = blk.qs[32 * j + l];
      ASSERT_EQ(q, int(std::nearbyint(exact))) << "group " << g << " value " << l;
      sum[l / 16] += q;
    }
    EXPECT_EQ(blk.hsums[2 * j], sum[0]);
    EXPECT_EQ(blk.hsums[2 * j + 1], sum[1]);
    EXPECT_EQ(blk.ds[j], blk.d[j] * float(sum[0] + sum[1]));
    for (int l = 0; l < 8; ++l) EXPECT_EQ(blk.dpair[j / 2][8 * (j % 2) + l], blk.d[j]);
  }
  EXPECT_EQ(b[0].d[2], 0.0f);
  EXPECT_GT(ties, 0) << "the test data should reach a rounding tie";
}

struct Rows {
  std::vector<std::byte> w;
  std::vector<BlockQ8G32> a;
  double abs_sum = 0;  // Σ |w_i · a_i| of the dequantized rows
};

Rows make_rows(DType wt, int64_t n, uint32_t seed) {
  Rows r;
  const auto w = gaussian(size_t(n), seed, 0.05f);
  r.w.resize(dtype_row_bytes(wt, n));
  quantize_row(wt, w.data(), r.w.data(), n);
  r.a = quantized(gaussian(size_t(n), seed + 1000, 3.0f));
  std::vector<float> wf(static_cast<size_t>(n));
  dequantize_row(wt, r.w.data(), wf.data(), n);
  for (int64_t i = 0; i < n; ++i)
    r.abs_sum += std::fabs(double(wf[size_t(i)]) * r.a[size_t(i / 256)].d[(i % 256) / 32] * r.a[size_t(i / 256)].qs[i % 256]);
  return r;
}

// Tolerance as CpuDot's: the integer sums are exact, the float scaling and summation order
// differ (~1e-7 of a group's |w·a| each); a wrong code, scale or group is off by percents.
TEST(CpuDotG32, EveryKernelMatchesTheReference) {
  std::vector<std::pair<const char*, std::span<const DotKernel>>> lists = {{"avx2", avx2_g32_kernels()}};
  if (dot_g32_kernel_name(DType::Q4_K) == "avx512vnni") lists.push_back({"avx512vnni", avx512_g32_kernels()});
  int checked = 0;
  for (DType wt : kTypes) {
    for (int64_t n : {256, 768, 2048, 4096}) {
      for (uint32_t seed = 1; seed <= 3; ++seed) {
        const Rows r = make_rows(wt, n, seed * 13 + uint32_t(n));
        const double ref = dot_row_g32_reference(wt, r.w.data(), r.a.data(), n);
        const double tol = 1e-5 * r.abs_sum + 1e-6;
        ASSERT_NEAR(dot_row_g32(wt, r.w.data(), r.a.data(), n), ref, tol)
            << dtype_name(wt) << " (" << dot_g32_kernel_name(wt) << ") n=" << n << " seed=" << seed;
        for (const auto& [isa, kernels] : lists)
          for (const DotKernel& k : kernels)
            if (k.type == wt) {
              ASSERT_NEAR(k.fn(r.w.data(), r.a.data(), n), ref, tol) << isa << " " << dtype_name(wt) << " n=" << n;
              ++checked;
            }
      }
    }
  }
  // Every type on AVX2 at least (the dev and CI machines), AVX-512 where the CPU has it.
  EXPECT_GE(checked, 4 * 4 * 3);
}

// Per-32 scales follow the values more closely than Q8_K's one per 256: against the dot with
// float activations, the error is within the Q8_K form's on rows with a few large values.
TEST(CpuDotG32, CloserToFloatThanQ8K) {
  const int64_t n = 4096;
  std::vector<float> a = gaussian(size_t(n), 99, 1.0f);
  for (int64_t i = 0; i < n; i += 256) a[size_t(i + 5)] = 40.0f;  // one outlier per super-block
  double err_g32 = 0, err_k = 0;
  for (DType wt : {DType::Q4_K, DType::Q6_K}) {
    for (uint32_t seed = 1; seed <= 8; ++seed) {
      const auto w = gaussian(size_t(n), seed, 0.05f);
      std::vector<std::byte> wq(dtype_row_bytes(wt, n)), ak(dtype_row_bytes(DType::Q8_K, n));
      quantize_row(wt, w.data(), wq.data(), n);
      std::vector<float> wf(static_cast<size_t>(n));
      dequantize_row(wt, wq.data(), wf.data(), n);
      double exact = 0;
      for (int64_t i = 0; i < n; ++i) exact += double(wf[size_t(i)]) * a[size_t(i)];
      quantize_activation(DType::Q8_K, a.data(), ak.data(), n);
      err_k += std::fabs(dot_row(wt, wq.data(), ak.data(), n) - exact);
      err_g32 += std::fabs(dot_row_g32(wt, wq.data(), quantized(a).data(), n) - exact);
    }
  }
  std::printf("summed |error| against float activations: per-32 %.4g, Q8_K %.4g\n", err_g32, err_k);
  EXPECT_LT(err_g32, err_k);
}

TEST(CpuDotG32, RejectsWhatItDoesNotDo) {
  EXPECT_FALSE(dot_g32_supported(DType::IQ4_XS));
  EXPECT_FALSE(dot_g32_supported(DType::BF16));
  const Rows r = make_rows(DType::Q4_K, 512, 1);
  EXPECT_THROW(dot_row_g32(DType::IQ4_XS, r.w.data(), r.a.data(), 512), Error);
  EXPECT_THROW(dot_row_g32(DType::Q4_K, r.w.data(), r.a.data(), 128), Error);
  std::vector<float> x(100);
  std::vector<BlockQ8G32> b(1);
  EXPECT_THROW(quantize_activation_g32(x.data(), b.data(), 100), Error);
}

// Single-thread throughput on cached rows, as CpuDotBench: GB/s of weight bytes per type with
// per-32 activations (the host expert pass's kernels). Checks only that repetitions agree.
TEST(CpuDotG32Bench, WeightGigabytesPerSecond) {
  const int64_t n = 2048, rows = 64;
  for (DType wt : kTypes) {
    const size_t rb = dtype_row_bytes(wt, n);
    std::vector<std::byte> w(rb * size_t(rows));
    const auto wf = gaussian(size_t(n * rows), 11, 0.05f);
    for (int64_t r = 0; r < rows; ++r) quantize_row(wt, wf.data() + r * n, w.data() + size_t(r) * rb, n);
    const std::vector<BlockQ8G32> act = quantized(gaussian(size_t(n), 12, 1.0f));
    const test::PassTiming pt = test::time_passes([&] {
      float s = 0;
      for (int64_t r = 0; r < rows; ++r) s += dot_row_g32(wt, w.data() + size_t(r) * rb, act.data(), n);
      return s;
    });
    std::printf("dot-g32 %-6s %-10s %6.2f GB/s weights\n", std::string(dtype_name(wt)).c_str(),
                std::string(dot_g32_kernel_name(wt)).c_str(), double(w.size()) * pt.per_second / 1e9);
    EXPECT_TRUE(pt.same && std::isfinite(pt.first)) << dtype_name(wt);
  }
}

}  // namespace
}  // namespace qwen36
