// The device-exact dot products (cpu_dot_exact.h): the dispatched kernel (AVX-512 VNNI where the
// CPU has it, else AVX2; QWEN36_CPU_ISA=avx2 or =scalar picks the narrower ones) equals the
// scalar definition bit for bit at every row count, the definition equals a second implementation written from
// the reference dequantizer bit for bit, and both are the dot product (double reference) to f32
// rounding. Weights: quantized random rows and hand-made extreme blocks; activations: random,
// zero, tiny and huge groups.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "dot_bench.h"
#include "quant/blocks.h"
#include "quant/cpu_dot_exact.h"
#include "quant/cpu_dot_g32.h"
#include "quant/quant.h"

namespace qwen36 {
namespace {

const DType kTypes[] = {DType::Q4_K, DType::Q6_K, DType::Q8_0};
constexpr uint16_t kF16One = 0x3C00, kF16Max = 0x7BFF;

using test::gaussian;

// Activations with every kind of 32-group: random (most), all zero, tiny (1e-30: the codes are
// still exact, d near the bottom of f32's normal range) and huge (1e20). Subnormal groups are
// left out: 127 / amax overflows there and the quantizer's sums (ds, hsums) no longer describe
// its codes, which every form of this arithmetic assumes.
std::vector<BlockQ8G32> activations(int64_t n, uint32_t seed, float huge = 1e20f) {
  std::vector<float> x = gaussian(size_t(n), seed, 3.0f);
  std::mt19937 rng(seed + 7);
  for (int64_t g = 0; g < n / 32; ++g) {
    const unsigned kind = rng() % 8;
    float* v = x.data() + 32 * g;
    for (int l = 0; l < 32; ++l) v[l] *= kind == 0 ? 0.0f : kind == 1 ? 1e-30f : kind == 2 ? huge : 1.0f;
  }
  std::vector<BlockQ8G32> a(size_t(n / 256));
  quantize_activation_g32(x.data(), a.data(), n);
  return a;
}

// Extreme super-blocks (kind 0: quantized random values, as a GGUF file holds them): 1: maximal
// scales and codes, 2: maximal scales, codes 0, 3: maximal scales, codes alternating extremes
// (Q6_K: scales −128; Q8_0: codes −128 and 127).
void make_extreme(DType wt, void* blk, int kind) {
  if (wt == DType::Q4_K) {
    auto& b = *static_cast<BlockQ4_K*>(blk);
    b.d = b.dmin = kF16Max;
    std::memset(b.scales, 0, sizeof b.scales);
    for (int j = 0; j < 8; ++j) pack_k_scale_min(b.scales, j, 63, 63);
    std::memset(b.qs, kind == 1 ? 0xFF : kind == 2 ? 0x00 : 0xF0, sizeof b.qs);
  } else if (wt == DType::Q6_K) {
    auto& b = *static_cast<BlockQ6_K*>(blk);
    b.d = kF16Max;
    std::memset(b.scales, kind == 3 ? 0x80 : 0x7F, sizeof b.scales);
    std::memset(b.ql, kind == 1 ? 0xFF : kind == 2 ? 0x00 : 0x0F, sizeof b.ql);
    std::memset(b.qh, kind == 1 ? 0xFF : kind == 2 ? 0x00 : 0x33, sizeof b.qh);
  } else {
    auto* b = static_cast<BlockQ8_0*>(blk);
    for (int i = 0; i < 8; ++i) {
      b[i].d = kF16Max;
      for (int l = 0; l < 32; ++l) b[i].qs[l] = int8_t(kind == 1 ? 127 : kind == 2 ? 0 : l % 2 ? -128 : 127);
    }
  }
}

size_t superblock_bytes(DType wt) { return dtype_row_bytes(wt, 256); }

// A row of n values: quantized random floats, then some super-blocks made extreme (row seed % 3
// of them, at random positions; every kind appears over a few rows).
std::vector<std::byte> weight_row(DType wt, int64_t n, uint32_t seed) {
  std::vector<std::byte> w(dtype_row_bytes(wt, n));
  const auto f = gaussian(size_t(n), seed, 0.05f);
  quantize_row(wt, f.data(), w.data(), n);
  std::mt19937 rng(seed);
  for (uint32_t k = 0; k < seed % 3; ++k) {
    const int64_t s = int64_t(rng() % uint32_t(n / 256));
    make_extreme(wt, w.data() + size_t(s) * superblock_bytes(wt), 1 + int(rng() % 3));
  }
  return w;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// ---- the second implementation: codes and scales read back through dequantize_row ----

// A copy of one super-block with its scales replaced by units, dequantized: the codes as floats
// (Q4_K: q, Q6_K: q − 32, Q8_0: q), exactly.
std::vector<float> unit_codes(DType wt, const std::byte* sb) {
  std::vector<std::byte> c(sb, sb + superblock_bytes(wt));
  if (wt == DType::Q4_K) {
    auto& b = *reinterpret_cast<BlockQ4_K*>(c.data());
    b.d = kF16One, b.dmin = 0;
    std::memset(b.scales, 0, sizeof b.scales);
    for (int j = 0; j < 8; ++j) pack_k_scale_min(b.scales, j, 1, 0);
  } else if (wt == DType::Q6_K) {
    auto& b = *reinterpret_cast<BlockQ6_K*>(c.data());
    b.d = kF16One;
    std::memset(b.scales, 1, sizeof b.scales);
  } else {
    for (int i = 0; i < 8; ++i) reinterpret_cast<BlockQ8_0*>(c.data())[i].d = kF16One;
  }
  std::vector<float> y(256);
  dequantize_row(wt, c.data(), y.data(), 256);
  return y;
}

// Q4_K's 6-bit scales (codes all 1, d = 1, dmin = 0: y = sc) or mins (codes 0, d = 0, dmin = 1:
// y = −m) of the 8 groups, by the same read-back.
std::vector<int> q4k_scales_or_mins(const std::byte* sb, bool mins) {
  BlockQ4_K b;
  std::memcpy(&b, sb, sizeof b);
  b.d = mins ? 0 : kF16One, b.dmin = mins ? kF16One : 0;
  std::memset(b.qs, mins ? 0x00 : 0x11, sizeof b.qs);
  std::vector<float> y(256);
  dequantize_row(DType::Q4_K, &b, y.data(), 256);
  std::vector<int> out(8);
  for (int j = 0; j < 8; ++j) out[size_t(j)] = int(mins ? -y[size_t(32 * j)] : y[size_t(32 * j)]);
  return out;
}

float second_implementation(DType wt, const std::byte* w, const BlockQ8G32* act, int64_t n) {
  const size_t sbb = superblock_bytes(wt);
  float v = 0.0f;
  for (int64_t s = 0; s < n / 256; ++s) {
    const std::byte* sb = w + size_t(s) * sbb;
    const std::vector<float> q = unit_codes(wt, sb);
    const BlockQ8G32& a = act[s];
    // Exact integer sums of 16 codes times activation codes, from value k0.
    auto isum16 = [&](int k0) {
      long long c = 0;
      for (int k = k0; k < k0 + 16; ++k) c += (long long)(q[size_t(k)]) * a.qs[k];
      return c;
    };
    float p = 0.0f;
    if (wt == DType::Q4_K) {
      BlockQ4_K b;
      std::memcpy(&b, sb, sizeof b);
      const std::vector<int> sc = q4k_scales_or_mins(sb, false), m = q4k_scales_or_mins(sb, true);
      for (int j = 0; j < 8; ++j) {
        const float mx = f16_to_f32(b.d) * float(sc[size_t(j)]), my = f16_to_f32(b.dmin) * float(m[size_t(j)]);
        const float t = std::fma(-my, a.ds[j], p);  // the min term first, as the device
        p = std::fma(mx, a.d[j] * float(isum16(32 * j) + isum16(32 * j + 16)), t);
      }
    } else if (wt == DType::Q6_K) {
      BlockQ6_K b;
      std::memcpy(&b, sb, sizeof b);
      for (int j = 0; j < 8; ++j) {
        const long long c = b.scales[2 * j] * isum16(32 * j) + b.scales[2 * j + 1] * isum16(32 * j + 16);
        p = std::fma(f16_to_f32(b.d) * a.d[j], float(c), p);
      }
    } else {
      for (int j = 0; j < 8; ++j) {
        BlockQ8_0 b;
        std::memcpy(&b, sb + size_t(j) * sizeof b, sizeof b);
        p = std::fma(f16_to_f32(b.d) * a.d[j], float(isum16(32 * j) + isum16(32 * j + 16)), p);
      }
    }
    v += p;
  }
  return v;
}

// (1) At every row count 1..40 (rows with a stride wider than a row, and some extreme: full and
// short passes of the 8- and 16-row kernels), every output of dot_rows_exact is bitwise
// dot_row_exact's and the scalar definition's; nothing past out[rows) is written.
TEST(CpuDotExact, RowsMatchTheDefinitionBitwise) {
  for (DType wt : kTypes) {
    for (int64_t n : {256, 512, 2048}) {
      const size_t rb = dtype_row_bytes(wt, n), stride = rb + 2 * superblock_bytes(wt);
      constexpr int kMaxRows = 40;
      std::vector<std::byte> w(kMaxRows * stride);
      for (int r = 0; r < kMaxRows; ++r) {
        const auto row = weight_row(wt, n, uint32_t(100 * r + n));
        std::memcpy(w.data() + size_t(r) * stride, row.data(), rb);
      }
      const auto act = activations(n, uint32_t(n) + 5);
      for (int rows = 1; rows <= kMaxRows; ++rows) {
        std::vector<float> out(kMaxRows + 1, -1.0f);
        dot_rows_exact(wt, w.data(), stride, rows, act.data(), n, out.data());
        for (int r = 0; r < rows; ++r) {
          const std::byte* row = w.data() + size_t(r) * stride;
          const float def = dot_row_exact_scalar(wt, row, act.data(), n);
          ASSERT_TRUE(same_bits(out[size_t(r)], def))
              << dtype_name(wt) << " (" << dot_exact_kernel_name(wt) << ") n=" << n << " rows=" << rows << " row " << r
              << ": " << out[size_t(r)] << " vs " << def;
          ASSERT_TRUE(same_bits(dot_row_exact(wt, row, act.data(), n), def)) << dtype_name(wt) << " row " << r;
        }
        EXPECT_EQ(out[size_t(rows)], -1.0f) << "rows=" << rows;
      }
    }
  }
}

// (2) and (3): the definition is the second implementation bitwise, and the dot product of the
// dequantized rows within f32 rounding. Tolerance 1e-5 of Σ |terms|: each of a row's
// ~3 · 8 · n / 256 roundings is at most 6e-8 of a partial sum. The terms are |w·x| per value;
// Q4_K's w = d·sc·q − dmin·m counts both parts (the dequantized w rounds their difference).
TEST(CpuDotExact, DefinitionIsTheFormulaAndTheDotProduct) {
  int checked = 0;
  for (DType wt : kTypes) {
    for (int64_t n : {256, 768, 2048, 4096}) {
      for (uint32_t seed = 1; seed <= 6; ++seed) {
        const auto w = weight_row(wt, n, seed * 31 + uint32_t(n));
        const auto act = activations(n, seed + 50);
        const float got = dot_row_exact_scalar(wt, w.data(), act.data(), n);
        const float alt = second_implementation(wt, w.data(), act.data(), n);
        ASSERT_TRUE(same_bits(got, alt)) << dtype_name(wt) << " n=" << n << " seed=" << seed << ": " << got << " vs " << alt;
        ASSERT_TRUE(std::isfinite(got)) << dtype_name(wt) << " n=" << n << " seed=" << seed;
        double scale = 0;
        std::vector<float> wf(static_cast<size_t>(n)), part(static_cast<size_t>(n), 0.0f);
        dequantize_row(wt, w.data(), wf.data(), n);
        if (wt == DType::Q4_K)  // the min part alone: d = 0
          for (int64_t s = 0; s < n / 256; ++s) {
            BlockQ4_K b;
            std::memcpy(&b, w.data() + size_t(s) * sizeof b, sizeof b);
            b.d = 0;
            dequantize_row(wt, &b, part.data() + 256 * s, 256);
          }
        for (int64_t i = 0; i < n; ++i) {
          const BlockQ8G32& a = act[size_t(i / 256)];
          const double x = std::fabs(double(a.d[(i % 256) / 32]) * a.qs[i % 256]);
          scale += (std::fabs(double(wf[size_t(i)]) - part[size_t(i)]) + std::fabs(part[size_t(i)])) * x;
        }
        const double ref = dot_row_g32_reference(wt, w.data(), act.data(), n);
        ASSERT_NEAR(got, ref, 1e-5 * scale + 1e-30) << dtype_name(wt) << " n=" << n << " seed=" << seed;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 3 * 4 * 6);
}

// Overflow to infinity (every block extreme, activations up to 1e30) stays bitwise the same in
// all three forms: the same operations round the same way past f32's range too.
TEST(CpuDotExact, ExtremesAgreeBitwise) {
  const int64_t n = 1024;
  int overflowed = 0;
  for (DType wt : kTypes) {
    for (int kind = 1; kind <= 3; ++kind) {
      std::vector<std::byte> w(16 * dtype_row_bytes(wt, n));
      for (int r = 0; r < 16; ++r) {
        const auto row = weight_row(wt, n, uint32_t(r + 1));
        std::memcpy(w.data() + size_t(r) * row.size(), row.data(), row.size());
        for (int64_t s = r % 4; s < n / 256; s += 2)
          make_extreme(wt, w.data() + size_t(r) * row.size() + size_t(s) * superblock_bytes(wt), kind);
      }
      for (float huge : {1e20f, 1e30f, 1e37f}) {
        const auto act = activations(n, uint32_t(kind) + 9, huge);
        float out[16];
        dot_rows_exact(wt, w.data(), dtype_row_bytes(wt, n), 16, act.data(), n, out);
        for (int r = 0; r < 16; ++r) {
          const std::byte* row = w.data() + size_t(r) * dtype_row_bytes(wt, n);
          const float def = dot_row_exact_scalar(wt, row, act.data(), n);
          overflowed += !std::isfinite(def);
          EXPECT_TRUE(same_bits(out[r], def)) << dtype_name(wt) << " kind " << kind << " huge " << huge << " row " << r
                                              << ": " << out[r] << " vs " << def;
          EXPECT_TRUE(same_bits(second_implementation(wt, row, act.data(), n), def))
              << dtype_name(wt) << " kind " << kind << " huge " << huge << " row " << r;
        }
      }
    }
  }
  std::printf("%d of %d outputs overflowed\n", overflowed, 3 * 3 * 3 * 16);
  EXPECT_GT(overflowed, 0) << "the test should reach f32's overflow";
}

TEST(CpuDotExact, KernelNameAndRejections) {
  const char* cap = std::getenv("QWEN36_CPU_ISA");
  for (DType wt : kTypes) {
    EXPECT_TRUE(dot_exact_supported(wt));
    const std::string_view name = dot_exact_kernel_name(wt);
    EXPECT_TRUE(name == "avx512vnni" || name == "avx2" || name == "scalar") << name;
    // The dispatch of dot_row_g32 (dot_isa), whose table has every ISA for these types.
    EXPECT_EQ(name, dot_g32_kernel_name(wt));
    if (cap && (std::string_view(cap) == "scalar" || std::string_view(cap) == "avx2")) {
      EXPECT_EQ(name, cap);
    }
#if defined(__x86_64__)
    // On a CPU with AVX-512 VNNI the tests above ran the AVX-512 kernel (unless capped).
    if (!cap && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")) {
      EXPECT_EQ(name, "avx512vnni");
    }
#endif
  }
  EXPECT_FALSE(dot_exact_supported(DType::Q5_K));
  EXPECT_FALSE(dot_exact_supported(DType::Q4_K_T16));
  const auto w = weight_row(DType::Q4_K, 512, 1);
  const auto act = activations(512, 2);
  float out[2];
  EXPECT_THROW(dot_row_exact(DType::Q5_K, w.data(), act.data(), 512), Error);
  EXPECT_THROW(dot_row_exact(DType::Q4_K, w.data(), act.data(), 128), Error);
  EXPECT_THROW(dot_rows_exact(DType::Q4_K, w.data(), 0, -1, act.data(), 512, out), Error);
}

// Single-thread ns per row on the 35B-A3B's routed-expert shapes (gate / up: 512 rows × 2048,
// down: 2048 × 512), weights just quantized (in cache as far as they fit): dot_row_g32 a row at
// a time against dot_rows_exact 16 rows per call (the device's tile) and dot_row_exact, and the
// scalar definition.
// Checks only that repetitions agree.
TEST(CpuDotExactBench, NanosecondsPerRow) {
  struct Shape {
    int rows;
    int64_t n;
  };
  for (const Shape sh : {Shape{512, 2048}, Shape{2048, 512}}) {
    for (DType wt : kTypes) {
      const size_t rb = dtype_row_bytes(wt, sh.n);
      std::vector<std::byte> w(rb * size_t(sh.rows));
      const auto wf = gaussian(size_t(sh.n) * size_t(sh.rows), 11, 0.05f);
      for (int r = 0; r < sh.rows; ++r) quantize_row(wt, wf.data() + size_t(r) * size_t(sh.n), w.data() + size_t(r) * rb, sh.n);
      std::vector<BlockQ8G32> act(size_t(sh.n / 256));
      quantize_activation_g32(gaussian(size_t(sh.n), 12, 1.0f).data(), act.data(), sh.n);
      std::vector<float> out(size_t(sh.rows));
      const test::PassTiming g32 = test::time_passes([&] {
        float s = 0;
        for (int r = 0; r < sh.rows; ++r) s += dot_row_g32(wt, w.data() + size_t(r) * rb, act.data(), sh.n);
        return s;
      });
      const test::PassTiming exact = test::time_passes([&] {
        for (int r = 0; r < sh.rows; r += 16)
          dot_rows_exact(wt, w.data() + size_t(r) * rb, rb, 16, act.data(), sh.n, out.data() + r);
        float s = 0;
        for (float v : out) s += v;
        return s;
      });
      const test::PassTiming single = test::time_passes([&] {
        float s = 0;
        for (int r = 0; r < sh.rows; ++r) s += dot_row_exact(wt, w.data() + size_t(r) * rb, act.data(), sh.n);
        return s;
      });
      const test::PassTiming scalar = test::time_passes([&] {
        float s = 0;
        for (int r = 0; r < sh.rows; ++r) s += dot_row_exact_scalar(wt, w.data() + size_t(r) * rb, act.data(), sh.n);
        return s;
      });
      auto ns = [&](const test::PassTiming& t) { return 1e9 / (t.per_second * sh.rows); };
      std::printf("%4d x %4lld %-5s ns/row: dot_row_g32 (%s) %6.1f | exact (%s): 16 rows/call %6.1f, 1 row/call %6.1f"
                  " | scalar definition %7.1f\n",
                  sh.rows, (long long)sh.n, std::string(dtype_name(wt)).c_str(),
                  std::string(dot_g32_kernel_name(wt)).c_str(), ns(g32), std::string(dot_exact_kernel_name(wt)).c_str(),
                  ns(exact), ns(single), ns(scalar));
      EXPECT_TRUE(g32.same && exact.same && single.same && scalar.same) << dtype_name(wt);
    }
  }
}

}  // namespace
}  // namespace qwen36
