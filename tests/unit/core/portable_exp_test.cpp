// exp_portable / silu_portable (core/portable_exp.h): accuracy against double precision over
// their whole range, and the edges. That the GPU computes the same bits is checked where it
// matters, on the device (CudaMoe.CpuExactExpertsAreTheTiledKernelsBitwise).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/portable_exp.h"

namespace qwen36 {
namespace {

// Distance in units in the last place between a float and the exactly rounded double value.
double ulps(float got, double want) {
  const float w = float(want);
  const double ulp = std::nextafter(std::fabs(w), std::numeric_limits<float>::infinity()) - std::fabs(w);
  return std::fabs(double(got) - want) / ulp;
}

TEST(PortableExp, WithinTwoUlpOverItsRange) {
  double worst = 0;
  float at = 0;
  for (float y = -80.0f; y < 88.7f; y = std::nextafter(y, 100.0f) + 1e-4f) {  // ~1.7 M points
    const double u = ulps(exp_portable(y), std::exp(double(y)));
    if (u > worst) worst = u, at = y;
  }
  std::printf("[ exp ] worst %.3f ulp at %.9g\n", worst, at);
  EXPECT_LE(worst, 2.0) << "at y = " << at;
}

TEST(PortableExp, Edges) {
  EXPECT_EQ(exp_portable(0.0f), 1.0f);
  EXPECT_EQ(exp_portable(-80.5f), 0.0f);
  EXPECT_EQ(exp_portable(-1000.0f), 0.0f);
  EXPECT_EQ(exp_portable(88.7f), std::numeric_limits<float>::infinity());
  EXPECT_EQ(exp_portable(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(exp_portable(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isfinite(exp_portable(88.69f)));
}

TEST(PortableExp, SiluWithinFewUlp) {
  double worst = 0;
  float at = 0;
  for (float x = -100.0f; x < 100.0f; x += 1.37e-4f) {
    const double want = double(x) / (1.0 + std::exp(-double(x)));
    if (std::fabs(want) < 1e-30) continue;
    const double u = ulps(silu_portable(x), want);
    if (u > worst) worst = u, at = x;
  }
  std::printf("[ silu ] worst %.3f ulp at %.9g\n", worst, at);
  EXPECT_LE(worst, 4.0) << "at x = " << at;
  EXPECT_EQ(silu_portable(0.0f), 0.0f);
  EXPECT_EQ(silu_portable(200.0f), 200.0f);
  EXPECT_EQ(silu_portable(-200.0f), 0.0f);  // −200 / inf = −0
}

}  // namespace
}  // namespace qwen36
