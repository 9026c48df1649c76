// quantize_row -> dequantize_row: relative RMS error per type within the bound its bits per
// weight allow, plus the degenerate inputs (zeros, constants) that break naive scale searches.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "quant/quant.h"

namespace qwen36 {
namespace {

std::vector<float> gaussian(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

double rel_rms_error(DType t, const std::vector<float>& x) {
  std::vector<std::byte> q(dtype_row_bytes(t, int64_t(x.size())));
  std::vector<float> y(x.size());
  quantize_row(t, x.data(), q.data(), int64_t(x.size()));
  dequantize_row(t, q.data(), y.data(), int64_t(x.size()));
  double e2 = 0, x2 = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    e2 += double(y[i] - x[i]) * (y[i] - x[i]);
    x2 += double(x[i]) * x[i];
  }
  return std::sqrt(e2 / x2);
}

// Expected error of a uniform b-bit quantizer of Gaussian blocks: the step is the block's range
// over 2^b - 1 levels, the error of rounding to a step is step/sqrt(12). The range of a block of
// 32 normals is about 4.2 sigma (2 x the expected maximum), of 16 about 3.5 sigma. Symmetric
// types spend one level on the sign and lose ~1 bit of range usage; the bound allows 30% over
// the estimate for f16 scale rounding and the 6-bit super-block scales.
double expected_bound(double bits, double block_range) {
  return 1.3 * block_range / (std::pow(2.0, bits) - 1.0) / std::sqrt(12.0);
}

struct Case {
  DType t;
  double bound;
};

TEST(Quantize, RmsErrorWithinBitsPerWeightBound) {
  const auto x = gaussian(256 * 64, 7);
  const Case cases[] = {
      {DType::Q8_0, expected_bound(8, 2 * 4.2)},  {DType::Q8_K, expected_bound(8, 2 * 4.2)},
      {DType::Q6_K, expected_bound(6, 2 * 3.5)},  {DType::Q5_0, expected_bound(5, 2 * 4.2)},
      {DType::Q5_1, expected_bound(5, 4.2)},      {DType::Q5_K, expected_bound(5, 4.2)},
      {DType::Q4_0, expected_bound(4, 2 * 4.2)},  {DType::Q4_1, expected_bound(4, 4.2)},
      {DType::Q4_K, expected_bound(4, 4.2)},      {DType::IQ4_XS, expected_bound(4, 4.2)},
  };
  for (const auto& c : cases) {
    const double e = rel_rms_error(c.t, x);
    std::printf("%-7s rel RMS error %.4f (bound %.4f)\n", std::string(dtype_name(c.t)).c_str(), e, c.bound);
    EXPECT_LT(e, c.bound) << dtype_name(c.t);
    EXPECT_GT(e, 0.0) << dtype_name(c.t);  // a lossless result would mean the test measures nothing
  }
  // More bits, less error.
  EXPECT_LT(rel_rms_error(DType::Q6_K, x), rel_rms_error(DType::Q5_K, x));
  EXPECT_LT(rel_rms_error(DType::Q5_K, x), rel_rms_error(DType::Q4_K, x));
  EXPECT_LT(rel_rms_error(DType::Q8_0, x), rel_rms_error(DType::Q6_K, x));
}

TEST(Quantize, PlainTypes) {
  const auto x = gaussian(64, 3);
  EXPECT_EQ(rel_rms_error(DType::F32, x), 0.0);
  EXPECT_LT(rel_rms_error(DType::F16, x), 1e-3);
  EXPECT_LT(rel_rms_error(DType::BF16, x), 4e-3);
}

TEST(Quantize, DegenerateBlocks) {
  const DType types[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0,
                         DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_K, DType::IQ4_XS};
  for (DType t : types) {
    for (float v : {0.0f, 3.0f, -0.25f}) {
      std::vector<float> x(512, v), y(512);
      std::vector<std::byte> q(dtype_row_bytes(t, 512));
      quantize_row(t, x.data(), q.data(), 512);
      dequantize_row(t, q.data(), y.data(), 512);
      for (float z : y) {
        ASSERT_TRUE(std::isfinite(z)) << dtype_name(t);
        ASSERT_NEAR(z, v, 0.02 * std::fabs(v) + 1e-6) << dtype_name(t) << " constant " << v;
      }
    }
  }
}

}  // namespace
}  // namespace qwen36
