#pragma once
// defines: k_scales_mins, k_mins_dot (internal to the SIMD dot products of quant/)
//
// The K-quants' per-super-block scale headers decoded with a few vector operations instead of
// a loop per sub-block: at the 35B-A3B's K = 2048 rows (8 super-blocks) the decode was as
// much work as the products. AVX2 intrinsics only, so kernels of wider ISAs can share them.

#include <cstdint>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>

namespace qwen36 {

// The 12 packed bytes of a Q4_K / Q5_K super-block's scales and mins (unpack_k_scale_min) as
// 8 scales in bytes 0-7 and 8 mins in bytes 8-15, four sub-blocks per 32-bit word: sub-blocks
// 0-3 are the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); sub-blocks 4-7 take their low 4
// bits from bytes 8-11 (scales: low nibbles, mins: high) and their top 2 from the top bits of
// bytes 0-3 (scales) and 4-7 (mins).
inline __m128i k_scales_mins(const uint8_t* packed) {
  uint32_t a, b, c;
  std::memcpy(&a, packed, 4);
  std::memcpy(&b, packed + 4, 4);
  std::memcpy(&c, packed + 8, 4);
  constexpr uint32_t low6 = 0x3F3F3F3F, low4 = 0x0F0F0F0F, low2 = 0x03030303;
  return _mm_set_epi32(int(((c >> 4) & low4) | (((b >> 6) & low2) << 4)), int(b & low6),
                       int((c & low4) | (((a >> 6) & low2) << 4)), int(a & low6));
}

// The mins' part of a super-block, sum_j m[j] * (bsums[2j] + bsums[2j + 1]), as 8 int32 lanes
// (lane j: sub-block j): each min of k_scales_mins widened to int16 twice, against the bsums.
inline __m256i k_mins_dot(__m128i scales_mins, const int16_t* bsums) {
  const __m128i twice = _mm_set_epi8(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
  const __m256i m16 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(scales_mins, twice));
  return _mm256_madd_epi16(m16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bsums)));
}

}  // namespace qwen36

#endif
