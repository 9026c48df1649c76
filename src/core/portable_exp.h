#pragma once
// defines: exp_portable, silu_portable
//
// exp and SiLU that give the same float on the GPU and on any IEEE-754 CPU. CUDA's expf ends in
// the hardware's ex2.approx, whose results no CPU can reproduce, and glibc's expf is another
// function again; where the host must compute bitwise what a GPU kernel computes (routed experts
// of expert offload against the tiled MoE kernels, cuda_quant_moe_mma.cu) both sides call these.
// Only correctly rounded operations are used (fma, one integer add to the exponent field, one
// division), and no product feeds an add, so no compiler can fuse or reorder anything: nvcc
// contracts a · b + c into an FMA by default and g++ does too with FMA hardware.
// Accuracy (tests/unit/core): within 1 ulp of exp on [−80, 88.7] and SiLU within 3; below −80
// exp returns 0 (e^−80 < 2^−115: SiLU's 1 + e is 1 there anyway), above 88.7 +inf.

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define QWEN36_HD __host__ __device__ __forceinline__
#else
#define QWEN36_HD inline
#endif

namespace qwen36 {

namespace portable_detail {
QWEN36_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);  // std::fma(float): one rounding, in hardware or libm
#endif
}
QWEN36_HD int32_t bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_int(x);
#else
  int32_t i;
  std::memcpy(&i, &x, sizeof i);
  return i;
#endif
}
QWEN36_HD float from_bits(int32_t i) {
#if defined(__CUDA_ARCH__)
  return __int_as_float(i);
#else
  float x;
  std::memcpy(&x, &i, sizeof x);
  return x;
#endif
}
}  // namespace portable_detail

QWEN36_HD float exp_portable(float y) {
  using namespace portable_detail;
  if (!(y < 88.7f)) return y != y ? y : from_bits(0x7F800000);  // NaN stays NaN, else +inf
  if (y < -80.0f) return 0.0f;
  // y = n · ln 2 + r, |r| ≤ ln 2 / 2: n rounded to nearest by the 1.5 · 2^23 shift (exact below 2^22).
  const float shifted = fma_rn(y, 1.44269504f, 12582912.0f);
  const int32_t n = bits(shifted) - 0x4B400000;
  const float nf = shifted - 12582912.0f;  // exact
  float r = fma_rn(nf, -0.693145752f, y);  // ln 2 in two parts: nf · hi is exact
  r = fma_rn(nf, -1.42860677e-6f, r);
  // e^r by its Taylor series to r^7 (truncation < 6e-9 relative at |r| = 0.35), Horner in FMAs.
  float p = 1.98412698e-4f;
  p = fma_rn(p, r, 1.38888889e-3f);
  p = fma_rn(p, r, 8.33333333e-3f);
  p = fma_rn(p, r, 4.16666667e-2f);
  p = fma_rn(p, r, 1.66666667e-1f);
  p = fma_rn(p, r, 0.5f);
  p = fma_rn(p, r, 1.0f);
  p = fma_rn(p, r, 1.0f);
  // p · 2^n by the exponent field: p ∈ [0.7, 1.42] and n ∈ [−116, 128], so the result is a
  // normal float (or, at the top, the largest ones) and the add is exact.
  return from_bits(bits(p) + n * (1 << 23));
}

// x · sigmoid(x) = x / (1 + e^−x), one division (correctly rounded on both sides).
QWEN36_HD float silu_portable(float x) { return x / (1.0f + exp_portable(-x)); }

}  // namespace qwen36
