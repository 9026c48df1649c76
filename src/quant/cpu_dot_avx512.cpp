// AVX-512 VNNI dot products for the types used in practice (Q8_0, Q4_K, Q5_K, Q6_K). They are
// compiled for that ISA with a target attribute (the build baseline stays x86-64-v3) and only
// used when __builtin_cpu_supports reports AVX-512 F/BW/VL/VNNI (cpu_dot.cpp). Same arithmetic as
// the AVX2 kernels, 64 bytes per step; dpwssd fuses the scale multiply with the accumulation.
#include "quant/blocks.h"
#include "quant/cpu_dot_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12's AVX-512 intrinsics (inserti64x4, extracti64x4, reduce_add) pass a deliberately
// "undefined" vector as the unused merge source, which -W(maybe-)uninitialized reports inside
// the system header once inlined here. Nothing in this file reads an uninitialized value.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#define QWEN36_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

namespace qwen36 {
namespace {

QWEN36_AVX512 inline __m256i loadu256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
QWEN36_AVX512 inline __m512i join(__m256i lo, __m256i hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}
// int16 lanes: 8 lanes each of a, b, c, d (four groups of 16 values).
QWEN36_AVX512 inline __m512i scales4(int a, int b, int c, int d) {
  return join(_mm256_set_m128i(_mm_set1_epi16(int16_t(b)), _mm_set1_epi16(int16_t(a))),
              _mm256_set_m128i(_mm_set1_epi16(int16_t(d)), _mm_set1_epi16(int16_t(c))));
}
// int16 lanes: 16 lanes of a, then 16 of b (two groups of 32 values).
QWEN36_AVX512 inline __m512i scales2(int a, int b) {
  return join(_mm256_set1_epi16(int16_t(a)), _mm256_set1_epi16(int16_t(b)));
}

QWEN36_AVX512 float dot_q8_0(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ8_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  const int64_t nb = n / kQK;
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {  // two blocks per 512-bit step
    const __m512i qx = join(loadu256(x[i].qs), loadu256(x[i + 1].qs));
    const __m512i qy = join(loadu256(y[i].qs), loadu256(y[i + 1].qs));
    // |x| (unsigned) times y with x's sign.
    const __m512i sy = _mm512_mask_sub_epi8(qy, _mm512_movepi8_mask(qx), _mm512_setzero_si512(), qy);
    const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(qx), sy);
    const __m512 d = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(_cvtsh_ss(x[i].d) * _cvtsh_ss(y[i].d)),
                                          _mm512_set1_ps(_cvtsh_ss(x[i + 1].d) * _cvtsh_ss(y[i + 1].d)));
    acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc);
  }
  float sum = _mm512_reduce_add_ps(acc);
  for (; i < nb; ++i) {
    const __m256i qx = loadu256(x[i].qs), qy = loadu256(y[i].qs);
    const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx));
    const __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(p, p), _mm256_hadd_epi32(p, p));
    sum += _cvtsh_ss(x[i].d) * _cvtsh_ss(y[i].d) * float(_mm256_extract_epi32(s, 0) + _mm256_extract_epi32(s, 4));
  }
  return sum;
}

QWEN36_AVX512 inline int k_mins_dot(const uint8_t* packed, const int16_t* bsums, uint8_t* sc) {
  int s = 0;
  for (int j = 0; j < 8; ++j) {
    uint8_t m;
    unpack_k_scale_min(j, packed, sc[j], m);
    s += int(m) * (bsums[2 * j] + bsums[2 * j + 1]);
  }
  return s;
}

QWEN36_AVX512 float dot_q4_k(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ4_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  // Float accumulation stays in a vector; one horizontal sum per row, not per block.
  __m512 acc = _mm512_setzero_ps();
  float acc_m = 0;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    uint8_t sc[8];
    const int mins = k_mins_dot(x[i].scales, y[i].bsums, sc);
    __m512i sumi = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      // 64 values: low nibbles (sub-block 2c) then high nibbles (2c+1), as the activations lie.
      const __m256i q = loadu256(x[i].qs + 32 * c);
      const __m512i qq = join(_mm256_and_si256(q, low4), _mm256_and_si256(_mm256_srli_epi16(q, 4), low4));
      const __m512i p = _mm512_maddubs_epi16(qq, _mm512_loadu_si512(y[i].qs + 64 * c));
      sumi = _mm512_dpwssd_epi32(sumi, p, scales2(sc[2 * c], sc[2 * c + 1]));
    }
    acc = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(x[i].d) * y[i].d), _mm512_cvtepi32_ps(sumi), acc);
    acc_m += _cvtsh_ss(x[i].dmin) * y[i].d * float(mins);
  }
  return _mm512_reduce_add_ps(acc) - acc_m;
}

QWEN36_AVX512 float dot_q5_k(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ5_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const __m256i low4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  __m512 acc = _mm512_setzero_ps();
  float acc_m = 0;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    uint8_t sc[8];
    const int mins = k_mins_dot(x[i].scales, y[i].bsums, sc);
    const __m256i qh = loadu256(x[i].qh);
    __m512i sumi = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      const __m256i q = loadu256(x[i].qs + 32 * c);
      const __m256i hlo = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4);
      const __m256i hhi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4);
      const __m512i qq = join(_mm256_or_si256(_mm256_and_si256(q, low4), hlo),
                              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low4), hhi));
      const __m512i p = _mm512_maddubs_epi16(qq, _mm512_loadu_si512(y[i].qs + 64 * c));
      sumi = _mm512_dpwssd_epi32(sumi, p, scales2(sc[2 * c], sc[2 * c + 1]));
    }
    acc = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(x[i].d) * y[i].d), _mm512_cvtepi32_ps(sumi), acc);
    acc_m += _cvtsh_ss(x[i].dmin) * y[i].d * float(mins);
  }
  return _mm512_reduce_add_ps(acc) - acc_m;
}

QWEN36_AVX512 float dot_q6_k(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ6_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const __m256i low4 = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3);
  __m512 acc = _mm512_setzero_ps();
  float acc_off = 0;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const int8_t* sc = x[i].scales;
    int offset = 0;  // the -32 of every value, applied once: 32 * sum_k sc[k] * bsums[k]
    for (int k = 0; k < 16; ++k) offset += sc[k] * y[i].bsums[k];
    __m512i sumi = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = loadu256(x[i].ql + 64 * h), ql1 = loadu256(x[i].ql + 64 * h + 32);
      const __m256i qh = loadu256(x[i].qh + 32 * h);
      const __m256i q0 = _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_slli_epi16(_mm256_and_si256(qh, three), 4));
      const __m256i q1 = _mm256_or_si256(_mm256_and_si256(ql1, low4),
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), three), 4));
      const __m256i q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), three), 4));
      const __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), three), 4));
      const int g = 8 * h;
      const __m512i p01 = _mm512_maddubs_epi16(join(q0, q1), _mm512_loadu_si512(y[i].qs + 128 * h));
      const __m512i p23 = _mm512_maddubs_epi16(join(q2, q3), _mm512_loadu_si512(y[i].qs + 128 * h + 64));
      sumi = _mm512_dpwssd_epi32(sumi, p01, scales4(sc[g], sc[g + 1], sc[g + 2], sc[g + 3]));
      sumi = _mm512_dpwssd_epi32(sumi, p23, scales4(sc[g + 4], sc[g + 5], sc[g + 6], sc[g + 7]));
    }
    const float d = _cvtsh_ss(x[i].d) * y[i].d;
    acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
    acc_off += d * float(32 * offset);
  }
  return _mm512_reduce_add_ps(acc) - acc_off;
}

constexpr DotKernel kKernels[] = {
    {DType::Q8_0, dot_q8_0}, {DType::Q4_K, dot_q4_k}, {DType::Q5_K, dot_q5_k}, {DType::Q6_K, dot_q6_k}};

}  // namespace

std::span<const DotKernel> avx512_dot_kernels() { return kKernels; }

}  // namespace qwen36

#else

namespace qwen36 {
std::span<const DotKernel> avx512_dot_kernels() { return {}; }
}  // namespace qwen36

#endif
