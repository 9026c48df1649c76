#pragma once
// defines: helpers shared by the CPU-op tests: a deterministic generator (Rng), tensors over
//          std::vector storage, independent bf16/f16 decoders, and a closeness check that
//          reports the worst element; GGUF-quantized random experts.
//
// The decoders are written here on purpose (not core/dtype.h): the tests must not trust the
// code they check.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/weights.h"
#include "quant/quant.h"

namespace qwen36::test {

// splitmix64: the same numbers on every platform and standard library (std::*_distribution
// is not portable), so a failure reproduces anywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  float uniform(float lo, float hi) { return float(lo + (hi - lo) * uniform()); }
  // Roughly normal (sum of 4 uniforms, variance 1): enough for test inputs.
  float normal() { return float((uniform() + uniform() + uniform() + uniform() - 2.0) * std::sqrt(3.0)); }
  int64_t below(int64_t n) { return int64_t(next() % uint64_t(n)); }
  std::vector<float> vec(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::vector<float> v(n);
    for (auto& x : v) x = uniform(lo, hi);
    return v;
  }

 private:
  uint64_t s_;
};

inline Tensor f32(std::vector<float>& v, std::initializer_list<int64_t> dims) {
  Tensor t(v.data(), DType::F32, dims);
  EXPECT_EQ(size_t(t.numel()), v.size()) << "test bug: storage does not match " << t.shape_str();
  return t;
}
inline Tensor i32(std::vector<int32_t>& v, std::initializer_list<int64_t> dims) {
  Tensor t(v.data(), DType::I32, dims);
  EXPECT_EQ(size_t(t.numel()), v.size()) << "test bug: storage does not match " << t.shape_str();
  return t;
}

// bf16 is the top half of an f32.
inline double ref_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// IEEE binary16 by its definition (normal, subnormal, inf/nan).
inline double ref_f16(uint16_t h) {
  const int sign = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 0)
    v = std::ldexp(double(m), -24);
  else if (e == 31)
    v = m ? NAN : INFINITY;
  else
    v = std::ldexp(1.0 + m / 1024.0, e - 15);
  return sign ? -v : v;
}
// Random bit patterns of finite values: every exponent, subnormals included.
inline uint16_t random_bf16(Rng& r) {
  for (;;) {
    const auto h = uint16_t(r.next());
    const int e = (h >> 7) & 0xff;
    if (e != 0xff && e > 100 && e < 150) return h;  // finite, |x| in a sane range for sums
  }
}
inline uint16_t random_f16(Rng& r) {
  for (;;) {
    const auto h = uint16_t(r.next());
    if (((h >> 10) & 31) != 31) return h;
  }
}

// Every |actual − expected| ≤ atol + rtol·|expected|; on failure names the worst index.
inline void expect_close(const float* actual, const double* expected, size_t n, double atol, double rtol,
                         const std::string& what) {
  bool bad = false;
  double worst_excess = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < n; ++i) {
    const double excess = std::fabs(double(actual[i]) - expected[i]) - (atol + rtol * std::fabs(expected[i]));
    if (excess <= 0) continue;  // NaN falls through to "bad"
    if (!bad || !(excess <= worst_excess)) {
      worst_excess = excess;
      worst_i = i;
    }
    bad = true;
  }
  EXPECT_FALSE(bad) << what << ": element " << worst_i << " is " << actual[worst_i] << ", expected "
                    << expected[worst_i] << " (atol " << atol << ", rtol " << rtol << ")";
}
inline void expect_close(const std::vector<float>& actual, const std::vector<double>& expected, double atol,
                         double rtol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  expect_close(actual.data(), expected.data(), actual.size(), atol, rtol, what);
}
inline void expect_close(const std::vector<float>& actual, const std::vector<float>& expected, double atol,
                         double rtol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  std::vector<double> e(expected.begin(), expected.end());
  expect_close(actual.data(), e.data(), actual.size(), atol, rtol, what);
}

// E routed experts of Q4_K gate / up and Q6_K down (the 35B-A3B Q4_K_M experts' types),
// hidden D, intermediate I, quantized from uniform(-0.5, 0.5) rows of r; the tensors point
// into `bytes`.
struct QuantExperts {
  std::vector<std::vector<std::byte>> bytes;
  std::vector<MlpWeights> mlp;
};
inline QuantExperts quant_experts(Rng& r, int64_t E, int64_t D, int64_t I) {
  QuantExperts q;
  q.bytes.resize(size_t(E * 3));
  q.mlp.resize(size_t(E));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t shapes[3][2] = {{I, D}, {I, D}, {D, I}};
    const DType types[3] = {DType::Q4_K, DType::Q4_K, DType::Q6_K};
    Tensor* dst[3] = {&q.mlp[size_t(e)].gate_proj, &q.mlp[size_t(e)].up_proj, &q.mlp[size_t(e)].down_proj};
    for (int m = 0; m < 3; ++m) {
      std::vector<std::byte>& b = q.bytes[size_t(e * 3 + m)];
      const auto f = r.vec(size_t(shapes[m][0] * shapes[m][1]), -0.5f, 0.5f);
      const size_t rb = dtype_row_bytes(types[m], shapes[m][1]);
      b.resize(rb * size_t(shapes[m][0]));
      for (int64_t row = 0; row < shapes[m][0]; ++row)
        quantize_row(types[m], f.data() + row * shapes[m][1], b.data() + size_t(row) * rb, shapes[m][1]);
      *dst[m] = Tensor(b.data(), types[m], {shapes[m][0], shapes[m][1]});
    }
  }
  return q;
}

}  // namespace qwen36::test
