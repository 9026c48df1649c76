// CPU dot products: every kernel equals the reference (both rows dequantized, summed in double)
// on random data, and a micro-benchmark prints GB/s of weight bytes per type.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "dot_bench.h"
#include "quant/cpu_dot.h"
#include "quant/cpu_dot_kernels.h"
#include "quant/quant.h"

namespace qwen36 {
namespace {

const DType kWeightTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0, DType::Q4_1,
                              DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q5_K,
                              DType::Q6_K, DType::Q8_K, DType::IQ4_XS};

std::vector<float> gaussian(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

struct Rows {
  std::vector<std::byte> w, a;
  std::vector<float> wf, af;  // the dequantized rows
};

Rows make_rows(DType wt, int64_t n, uint32_t seed) {
  Rows r;
  const DType at = dot_activation_type(wt);
  const auto w = gaussian(size_t(n), seed, 0.05f), a = gaussian(size_t(n), seed + 1000, 3.0f);
  r.w.resize(dtype_row_bytes(wt, n));
  r.a.resize(dtype_row_bytes(at, n) + 64);
  quantize_row(wt, w.data(), r.w.data(), n);
  quantize_activation(at, a.data(), r.a.data(), n);
  r.wf.resize(size_t(n));
  r.af.resize(size_t(n));
  dequantize_row(wt, r.w.data(), r.wf.data(), n);
  dequantize_row(at, r.a.data(), r.af.data(), n);
  return r;
}

TEST(CpuDot, ActivationTypes) {
  EXPECT_EQ(dot_activation_type(DType::BF16), DType::F32);
  EXPECT_EQ(dot_activation_type(DType::Q5_1), DType::Q8_0);
  EXPECT_EQ(dot_activation_type(DType::Q8_0), DType::Q8_0);
  EXPECT_EQ(dot_activation_type(DType::Q6_K), DType::Q8_K);
  EXPECT_EQ(dot_activation_type(DType::IQ4_XS), DType::Q8_K);
  EXPECT_THROW(dot_activation_type(DType::I32), Error);
  EXPECT_THROW(quantize_activation(DType::Q4_K, nullptr, nullptr, 0), Error);
}

// Tolerance: the integer parts are exact; what differs is float rounding of the per-block
// scale products and the order of the float sums, each ~1e-7 relative to a block's sum of
// |w*a|. 1e-5 of sum |w_i*a_i| covers that with margin and is far below any layout mistake
// (a wrong nibble or scale changes the result by percents).
TEST(CpuDot, EveryKernelMatchesTheReference) {
  for (DType wt : kWeightTypes) {
    for (int64_t n : {256, 1024, 4096}) {
      for (uint32_t seed = 1; seed <= 4; ++seed) {
        const Rows r = make_rows(wt, n, seed * 7 + uint32_t(n));
        double abs_sum = 0;
        for (size_t i = 0; i < r.wf.size(); ++i) abs_sum += std::fabs(double(r.wf[i]) * r.af[i]);
        const double ref = dot_row_reference(wt, r.w.data(), r.a.data(), n);
        const float got = dot_row(wt, r.w.data(), r.a.data(), n);
        ASSERT_NEAR(got, ref, 1e-5 * abs_sum + 1e-6)
            << dtype_name(wt) << " (" << dot_kernel_name(wt) << ") n=" << n << " seed=" << seed;
      }
    }
  }
}

// dot_row runs only the widest kernel the CPU has; this checks every compiled ISA's kernels
// directly, so the AVX2 ones stay tested on an AVX-512 machine.
TEST(CpuDot, EveryIsaKernelMatchesTheReference) {
  std::vector<std::pair<const char*, std::span<const DotKernel>>> lists = {{"avx2", avx2_dot_kernels()}};
  if (dot_kernel_name(DType::Q8_0) == "avx512vnni") lists.push_back({"avx512vnni", avx512_dot_kernels()});
  int checked = 0;
  for (const auto& [isa, kernels] : lists) {
    for (const DotKernel& k : kernels) {
      // One and three blocks (odd counts reach the single-block tails), and longer rows.
      const int64_t blk = std::max<int64_t>(32, dtype_block_elems(k.type));
      for (int64_t n : {blk, 3 * blk, int64_t(2048), int64_t(2304)}) {
        const Rows r = make_rows(k.type, n, uint32_t(n) + 3);
        double abs_sum = 0;
        for (size_t i = 0; i < r.wf.size(); ++i) abs_sum += std::fabs(double(r.wf[i]) * r.af[i]);
        const double ref = dot_row_reference(k.type, r.w.data(), r.a.data(), n);
        ASSERT_NEAR(k.fn(r.w.data(), r.a.data(), n), ref, 1e-5 * abs_sum + 1e-6) << isa << " " << dtype_name(k.type);
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 4 * 13);
}

// dot_rows (prefill: one weight row against many tokens, four at a time where a four-row kernel
// exists) gives every row's dot_row result bitwise, whatever the row count; so do each compiled
// ISA's four-row kernels against that ISA's one-row kernels.
TEST(CpuDot, RowsAreEachRowsDotBitwise) {
  for (DType wt : kWeightTypes) {
    const DType at = dot_activation_type(wt);
    for (int64_t n : {int64_t(256), int64_t(2304)}) {
      const int64_t rows = 9;
      const size_t stride = dtype_row_bytes(at, n);
      const auto wf = gaussian(size_t(n), uint32_t(n) + 5, 0.05f), af = gaussian(size_t(rows * n), 77, 3.0f);
      std::vector<std::byte> w(dtype_row_bytes(wt, n)), a(size_t(rows) * stride);
      quantize_row(wt, wf.data(), w.data(), n);
      for (int64_t r = 0; r < rows; ++r) quantize_activation(at, af.data() + r * n, a.data() + size_t(r) * stride, n);
      for (int64_t count : {int64_t(1), int64_t(4), int64_t(7), rows}) {
        std::vector<float> got(size_t(2 * count), -1.0f);
        dot_rows(wt, w.data(), a.data(), stride, count, n, got.data(), 2);  // every other slot
        for (int64_t r = 0; r < count; ++r)
          EXPECT_EQ(got[size_t(2 * r)], dot_row(wt, w.data(), a.data() + size_t(r) * stride, n))
              << dtype_name(wt) << " n=" << n << " row " << r << " of " << count;
        for (int64_t r = 0; r < count; ++r) EXPECT_EQ(got[size_t(2 * r + 1)], -1.0f) << "wrote past its slot";
      }
    }
  }
  std::vector<std::tuple<const char*, std::span<const DotKernel>, std::span<const Dot4Kernel>>> isas = {
      {"avx2", avx2_dot_kernels(), avx2_dot4_kernels()}};
  if (dot_kernel_name(DType::Q8_0) == "avx512vnni") isas.push_back({"avx512vnni", avx512_dot_kernels(), avx512_dot4_kernels()});
  int checked = 0;
  for (const auto& [isa, ones, fours] : isas) {
    for (const Dot4Kernel& k4 : fours) {
      const auto one = std::find_if(ones.begin(), ones.end(), [&](const DotKernel& k) { return k.type == k4.type; });
      ASSERT_NE(one, ones.end()) << isa << " " << dtype_name(k4.type) << ": a four-row kernel without its one-row twin";
      const int64_t n = 1024 + (k4.type == DType::Q8_0 ? 32 : 0);  // Q8_0: an odd block count too
      const DType at = dot_activation_type(k4.type);
      const size_t stride = dtype_row_bytes(at, n) + 12;  // rows need not be adjacent
      const auto wf = gaussian(size_t(n), 3, 0.05f), af = gaussian(size_t(4 * n), 4, 3.0f);
      std::vector<std::byte> w(dtype_row_bytes(k4.type, n)), a(4 * stride);
      quantize_row(k4.type, wf.data(), w.data(), n);
      for (int r = 0; r < 4; ++r) quantize_activation(at, af.data() + r * n, a.data() + size_t(r) * stride, n);
      float got[4];
      k4.fn(w.data(), a.data(), stride, n, got, 1);
      for (int r = 0; r < 4; ++r) EXPECT_EQ(got[r], one->fn(w.data(), a.data() + size_t(r) * stride, n)) << isa << " " << dtype_name(k4.type);
      ++checked;
    }
  }
  EXPECT_GE(checked, 4);
}

TEST(CpuDot, PlainTypesHandleRowTails) {
  for (DType wt : {DType::F32, DType::F16, DType::BF16}) {
    for (int64_t n : {1, 7, 17, 1001}) {
      const Rows r = make_rows(wt, n, uint32_t(n));
      const double ref = dot_row_reference(wt, r.w.data(), r.a.data(), n);
      double abs_sum = 0;
      for (size_t i = 0; i < r.wf.size(); ++i) abs_sum += std::fabs(double(r.wf[i]) * r.af[i]);
      EXPECT_NEAR(dot_row(wt, r.w.data(), r.a.data(), n), ref, 1e-5 * abs_sum + 1e-6) << dtype_name(wt) << " " << n;
    }
  }
}

TEST(CpuDot, QuantizedActivationsStayCloseToFloat) {
  // The 8-bit activation rounding is small next to the weight rounding: the dot with Q8
  // activations is within 1% (of sum |w*a|) of the dot with float activations.
  const int64_t n = 4096;
  const auto a = gaussian(size_t(n), 99, 3.0f);
  for (DType wt : {DType::Q8_0, DType::Q4_K, DType::Q6_K}) {
    const Rows r = make_rows(wt, n, 5);
    std::vector<std::byte> act(dtype_row_bytes(dot_activation_type(wt), n));
    quantize_activation(dot_activation_type(wt), a.data(), act.data(), n);
    double exact = 0, abs_sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      exact += double(r.wf[size_t(i)]) * a[size_t(i)];
      abs_sum += std::fabs(double(r.wf[size_t(i)]) * a[size_t(i)]);
    }
    EXPECT_NEAR(dot_row(wt, r.w.data(), act.data(), n), exact, 0.01 * abs_sum) << dtype_name(wt);
  }
}

TEST(CpuDot, RejectsPartialBlocks) {
  const Rows r = make_rows(DType::Q4_K, 256, 1);
  EXPECT_THROW(dot_row(DType::Q4_K, r.w.data(), r.a.data(), 128), Error);
}

// Single-thread throughput on rows that stay in cache (kernel speed, not DRAM bandwidth):
// prints GB/s of weight bytes per type. The assertion only checks the benchmark computed
// the same sum on every repetition.
TEST(CpuDotBench, WeightGigabytesPerSecond) {
  const int64_t n = 4096, rows = 64;
  for (DType wt : kWeightTypes) {
    const DType at = dot_activation_type(wt);
    const size_t rb = dtype_row_bytes(wt, n);
    std::vector<std::byte> w(rb * size_t(rows)), act(dtype_row_bytes(at, n));
    const auto wf = gaussian(size_t(n * rows), 11, 0.05f), af = gaussian(size_t(n), 12);
    for (int64_t r = 0; r < rows; ++r) quantize_row(wt, wf.data() + r * n, w.data() + size_t(r) * rb, n);
    quantize_activation(at, af.data(), act.data(), n);
    const test::PassTiming pt = test::time_passes([&] {
      float s = 0;
      for (int64_t r = 0; r < rows; ++r) s += dot_row(wt, w.data() + size_t(r) * rb, act.data(), n);
      return s;
    });
    const double gbs = double(w.size()) * pt.per_second / 1e9;
    const double gelem = double(n * rows) * pt.per_second / 1e9;
    std::printf("dot %-6s %-10s %6.2f GB/s weights  %6.2f Gelem/s\n", std::string(dtype_name(wt)).c_str(),
                std::string(dot_kernel_name(wt)).c_str(), gbs, gelem);
    EXPECT_TRUE(pt.same) << dtype_name(wt);
    EXPECT_TRUE(std::isfinite(pt.first)) << dtype_name(wt);
  }
}

// Prefill's shape: one weight row against many tokens. Token-dots per second through dot_rows
// (four-row kernels where the CPU's set has them) against one dot_row call per token, in one run.
TEST(CpuDotBench, FourTokensPerRowDecoding) {
  const int64_t n = 4096, rows = 16, tokens = 8;
  for (DType wt : {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_0}) {
    const DType at = dot_activation_type(wt);
    const size_t rb = dtype_row_bytes(wt, n), ab = dtype_row_bytes(at, n);
    std::vector<std::byte> w(rb * size_t(rows)), act(ab * size_t(tokens));
    const auto wf = gaussian(size_t(n * rows), 21, 0.05f), af = gaussian(size_t(n * tokens), 22);
    for (int64_t r = 0; r < rows; ++r) quantize_row(wt, wf.data() + r * n, w.data() + size_t(r) * rb, n);
    for (int64_t t = 0; t < tokens; ++t) quantize_activation(at, af.data() + t * n, act.data() + size_t(t) * ab, n);
    std::vector<float> out(static_cast<size_t>(tokens));
    const test::PassTiming many = test::time_passes([&] {
      float s = 0;
      for (int64_t r = 0; r < rows; ++r) {
        dot_rows(wt, w.data() + size_t(r) * rb, act.data(), ab, tokens, n, out.data(), 1);
        for (float v : out) s += v;
      }
      return s;
    });
    const test::PassTiming single = test::time_passes([&] {
      float s = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t t = 0; t < tokens; ++t) s += dot_row(wt, w.data() + size_t(r) * rb, act.data() + size_t(t) * ab, n);
      return s;
    });
    const double per_pass = double(rows * tokens);
    std::printf("dot %-6s %-10s %5.2f M token-dots/s by dot_rows, %5.2f one at a time (%.2fx)\n",
                std::string(dtype_name(wt)).c_str(), std::string(dot_kernel_name(wt)).c_str(),
                many.per_second * per_pass / 1e6, single.per_second * per_pass / 1e6,
                many.per_second / single.per_second);
    EXPECT_EQ(many.first, single.first) << dtype_name(wt) << ": the same sums, bitwise";
  }
}

}  // namespace
}  // namespace qwen36
