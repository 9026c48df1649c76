// AVX2 + FMA dot products of the Hugging Face checkpoint block types (quant/hf_blocks.h) with
// f32 activations. Each weight is formed exactly as dequantize_hf_row forms it (same f32
// operations in the same order), then multiply-added into 8-wide accumulators: the result
// differs from the f32 matmul of the dequantized weights only by summation order.
// Written for clarity over speed: the CPU path is the reference, not the fast path.
#include "quant/cpu_dot_kernels.h"
#include "quant/hf_blocks.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace qwen36 {
namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 8 consecutive code bytes widened to int32 lanes.
inline __m256i load8_u8(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }

template <typename B, int L>
float dot_w4(const void* w, const void* a, int64_t n) {
  const auto* b = static_cast<const B*>(w);
  const auto* x = static_cast<const float*>(a);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  const __m256i m15 = _mm256_set1_epi32(15);
  for (int64_t i = 0; i < n / L; ++i, x += L) {
    const __m256 s = _mm256_set1_ps(w4_scale(b[i].s, b[i].kind));
    const __m256i z = _mm256_set1_epi32(b[i].z);
    for (int j = 0; j < L / 2; j += 8) {
      const __m256i q = load8_u8(b[i].qs + j);
      const __m256 lo = _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(q, m15), z)));
      const __m256 hi = _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(q, 4), z)));
      acc0 = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x + j), acc0);
      acc1 = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x + L / 2 + j), acc1);
    }
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

// All 256 E4M3 codes as f32 (gathered 8 at a time).
struct E4M3Table {
  float v[256];
  E4M3Table() {
    for (int i = 0; i < 256; ++i) v[i] = f8_e4m3_to_f32(uint8_t(i));
  }
};
const E4M3Table& e4m3_table() {
  static const E4M3Table t;
  return t;
}

float dot_f8_b128(const void* w, const void* a, int64_t n) {
  const auto* b = static_cast<const BlockF8B128*>(w);
  const auto* x = static_cast<const float*>(a);
  const float* lut = e4m3_table().v;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / 128; ++i, x += 128) {
    const __m256 d = _mm256_set1_ps(b[i].d);
    for (int j = 0; j < 128; j += 16) {
      const __m256 w0 = _mm256_mul_ps(_mm256_i32gather_ps(lut, load8_u8(b[i].q + j), 4), d);
      const __m256 w1 = _mm256_mul_ps(_mm256_i32gather_ps(lut, load8_u8(b[i].q + j + 8), 4), d);
      acc0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + j), acc0);
      acc1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + j + 8), acc1);
    }
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

float dot_nvfp4_b64(const void* w, const void* a, int64_t n) {
  const auto* b = static_cast<const BlockNvfp4B64*>(w);
  const auto* x = static_cast<const float*>(a);
  const float* lut = e4m3_table().v;
  // Lane l of an 8-byte load holds elements 2l (low nibble) and 2l + 1 (high nibble); an
  // unpack and a 128-bit permute put them back in element order after the two gathers.
  const __m256i m15 = _mm256_set1_epi32(15);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / 64; ++i, x += 64) {
    const __m256 g = _mm256_set1_ps(b[i].g);
    for (int grp = 0; grp < 4; ++grp) {
      const __m256 s = _mm256_set1_ps(lut[b[i].s[grp]]);
      const __m256i q = load8_u8(b[i].qs + 8 * grp);  // elements 16 grp .. 16 grp + 15
      const __m256 lo = _mm256_i32gather_ps(kE2M1Values, _mm256_and_si256(q, m15), 4);
      const __m256 hi = _mm256_i32gather_ps(kE2M1Values, _mm256_srli_epi32(q, 4), 4);
      // Interleave lo/hi: e0 e1 e2 ... e7 then e8 .. e15.
      const __m256 a0 = _mm256_unpacklo_ps(lo, hi), a1 = _mm256_unpackhi_ps(lo, hi);
      const __m256 v0 = _mm256_permute2f128_ps(a0, a1, 0x20), v1 = _mm256_permute2f128_ps(a0, a1, 0x31);
      const __m256 w0 = _mm256_mul_ps(_mm256_mul_ps(v0, s), g);
      const __m256 w1 = _mm256_mul_ps(_mm256_mul_ps(v1, s), g);
      acc = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + 16 * grp), acc);
      acc = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + 16 * grp + 8), acc);
    }
  }
  return hsum(acc);
}

constexpr DotKernel kKernels[] = {
    {DType::W4_G32, dot_w4<BlockW4G32, 32>},
    {DType::W4_G128, dot_w4<BlockW4G128, 128>},
    {DType::F8_B128, dot_f8_b128},
    {DType::NVFP4_B64, dot_nvfp4_b64},
};

}  // namespace

std::span<const DotKernel> hf_avx2_dot_kernels() { return kKernels; }

}  // namespace qwen36

#else

namespace qwen36 {
std::span<const DotKernel> hf_avx2_dot_kernels() { return {}; }
}  // namespace qwen36

#endif
