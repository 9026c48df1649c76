// The device-exact dot products of cpu_dot_exact.h: the scalar definition, the AVX2 kernel
// (8 rows in the 8 lanes of each vector) and the dispatch. Compiled with -ffp-contract=off
// (src/quant/CMakeLists.txt): g++ would otherwise fuse a product into a following add, here
// as in the intrinsics (GCC writes _mm256_mul_ps as a plain vector product), and the sequence
// of roundings is the whole point.
#include "quant/cpu_dot_exact.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "quant/blocks.h"
#include "quant/cpu_dot_kernels.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define QWEN36_EXACT_AVX2 1
#include <immintrin.h>
#endif

namespace qwen36 {

bool dot_exact_supported(DType weight) {
  return weight == DType::Q4_K || weight == DType::Q6_K || weight == DType::Q8_0;
}

namespace {

void check_args(DType wt, int64_t n) {
  QWEN36_CHECK(dot_exact_supported(wt), "no device-exact dot product for weights of type {}", dtype_name(wt));
  QWEN36_CHECK(n >= 0 && n % 256 == 0, "dot_row_exact: {} elements is not a multiple of 256", n);
}

// ---- the definition: one row, one group at a time ----

// Group jj (values 32·jj .. +31 of a super-block) reads its codes as the tile repack does
// (cuda_quant_mma.cu's q4k_code / q6k_code): Q4_K the 32 bytes of chunk jj / 2, low nibbles for
// even jj, high for odd; Q6_K half jj / 4 and quarter jj % 4: the low 4 bits from 32 bytes of ql
// (the low nibbles for quarters 0, 1, the high for 2, 3), the high 2 from bits 2 · quarter of
// 32 bytes of qh, 0..63 (the −32 applied in the sum).
float row_q4_k(const void* w, const BlockQ8G32* act, int64_t S) {
  const auto* x = static_cast<const BlockQ4_K*>(w);
  float v = 0.0f;
  for (int64_t s = 0; s < S; ++s) {
    const BlockQ8G32& a = act[s];
    const float d = f16_to_f32(x[s].d), dmin = f16_to_f32(x[s].dmin);
    float p = 0.0f;
    for (int jj = 0; jj < 8; ++jj) {
      uint8_t sc, m;
      unpack_k_scale_min(jj, x[s].scales, sc, m);
      const float mx = d * float(sc), my = dmin * float(m);  // the device's (d·sc, dmin·m) table
      const uint8_t* q = x[s].qs + 32 * (jj / 2);
      const int shift = 4 * (jj % 2);
      int c = 0;
      for (int l = 0; l < 32; ++l) c += ((q[l] >> shift) & 15) * a.qs[32 * jj + l];
      p = std::fma(mx, a.d[jj] * float(c), std::fma(-my, a.ds[jj], p));
    }
    v = v + p;
  }
  return v;
}

float row_q6_k(const void* w, const BlockQ8G32* act, int64_t S) {
  const auto* x = static_cast<const BlockQ6_K*>(w);
  float v = 0.0f;
  for (int64_t s = 0; s < S; ++s) {
    const BlockQ8G32& a = act[s];
    const float dg = f16_to_f32(x[s].d);
    float p = 0.0f;
    for (int jj = 0; jj < 8; ++jj) {
      const int quarter = jj % 4;
      const uint8_t* ql = x[s].ql + 64 * (jj / 4) + 32 * (quarter % 2);
      const uint8_t* qh = x[s].qh + 32 * (jj / 4);
      const int8_t* xq = a.qs + 32 * jj;
      auto code = [&](int l) { return ((ql[l] >> (4 * (quarter / 2))) & 15) | ((qh[l] >> (2 * quarter)) & 3) << 4; };
      int ca = 0, cb = 0;
      for (int l = 0; l < 16; ++l) ca += (code(l) - 32) * xq[l];
      for (int l = 16; l < 32; ++l) cb += (code(l) - 32) * xq[l];
      p = std::fma(dg * a.d[jj], float(x[s].scales[2 * jj] * ca + x[s].scales[2 * jj + 1] * cb), p);
    }
    v = v + p;
  }
  return v;
}

float row_q8_0(const void* w, const BlockQ8G32* act, int64_t S) {
  const auto* x = static_cast<const BlockQ8_0*>(w);
  float v = 0.0f;
  for (int64_t s = 0; s < S; ++s) {
    const BlockQ8G32& a = act[s];
    float p = 0.0f;
    for (int jj = 0; jj < 8; ++jj) {
      const BlockQ8_0& b = x[8 * s + jj];
      int c = 0;
      for (int l = 0; l < 32; ++l) c += b.qs[l] * a.qs[32 * jj + l];
      p = std::fma(f16_to_f32(b.d) * a.d[jj], float(c), p);
    }
    v = v + p;
  }
  return v;
}

using RowFn = float (*)(const void* wrow, const BlockQ8G32* act, int64_t S);
RowFn scalar_row(DType wt) { return wt == DType::Q4_K ? row_q4_k : wt == DType::Q6_K ? row_q6_k : row_q8_0; }

#ifdef QWEN36_EXACT_AVX2

// ---- AVX2: lane r of every vector is row r of 8 ----
//
// Per (row, group) the 32 products go through one maddubs (unsigned weight bytes × signed
// activation codes, which quantize_activation_g32 keeps within ±127: pairs at most
// 2 · 128 · 127 < 32767, no saturation) and a horizontal-add
// tree that leaves the 8 rows' exact integer sums in one vector's lanes; the float steps are then
// vertical, so each lane does the scalar definition's operations in its order.

using Rows8 = const uint8_t* const (&)[8];

inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m128i load16(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Lane r: the sum of the 8 int32 lanes of v[r].
inline __m256i lane_sums32(const __m256i (&v)[8]) {
  const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
  // a: rows 0-3, the sums of lanes 0-3 in the low half and of lanes 4-7 in the high half; b: rows 4-7.
  return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

// Lane r: the sum of the 16 int16 lanes of v[r], when any 8 of them (a 128-bit half) sum within
// int16: three hadd levels in int16 (half as many instructions as widening first), then the two
// halves widened and added.
inline __m256i lane_sums16(const __m256i (&v)[8]) {
  const __m256i a = _mm256_hadd_epi16(_mm256_hadd_epi16(v[0], v[1]), _mm256_hadd_epi16(v[2], v[3]));
  const __m256i b = _mm256_hadd_epi16(_mm256_hadd_epi16(v[4], v[5]), _mm256_hadd_epi16(v[6], v[7]));
  const __m256i t = _mm256_hadd_epi16(a, b);  // each half: rows 0-7, that half's 16 products
  return _mm256_add_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(t)),
                          _mm256_cvtepi16_epi32(_mm256_extracti128_si256(t, 1)));
}

// 16 bytes of 8 rows (h[r]) transposed: k2[i] holds byte 2i of rows 0-7 in bytes 0-7 and byte
// 2i + 1 in bytes 8-15 (three rounds of unpacks).
inline void transpose_8x16(const __m128i (&h)[8], __m128i (&k2)[8]) {
  __m128i a[2][4];
  for (int i = 0; i < 4; ++i) {
    a[0][i] = _mm_unpacklo_epi8(h[2 * i], h[2 * i + 1]);  // bytes 0-7 of rows 2i, 2i + 1, interleaved
    a[1][i] = _mm_unpackhi_epi8(h[2 * i], h[2 * i + 1]);  // bytes 8-15
  }
  for (int half = 0; half < 2; ++half) {
    const __m128i* x = a[half];
    const __m128i c0 = _mm_unpacklo_epi16(x[0], x[1]), c1 = _mm_unpackhi_epi16(x[0], x[1]);  // rows 0-3
    const __m128i c2 = _mm_unpacklo_epi16(x[2], x[3]), c3 = _mm_unpackhi_epi16(x[2], x[3]);  // rows 4-7
    k2[4 * half + 0] = _mm_unpacklo_epi32(c0, c2);
    k2[4 * half + 1] = _mm_unpackhi_epi32(c0, c2);
    k2[4 * half + 2] = _mm_unpacklo_epi32(c1, c3);
    k2[4 * half + 3] = _mm_unpackhi_epi32(c1, c3);
  }
}

// The f16 at byte `at` of each of the 8 rows, as floats.
inline __m256 f16_rows(Rows8 row, size_t at) {
  return _mm256_cvtph_ps(_mm_setr_epi16(int16_t(load_u16(row[0] + at)), int16_t(load_u16(row[1] + at)),
                                        int16_t(load_u16(row[2] + at)), int16_t(load_u16(row[3] + at)),
                                        int16_t(load_u16(row[4] + at)), int16_t(load_u16(row[5] + at)),
                                        int16_t(load_u16(row[6] + at)), int16_t(load_u16(row[7] + at))));
}
// 8 f16 (byte pair k2: low bytes 0-7, high bytes 8-15, as transpose_8x16 leaves them) as floats.
inline __m256 f16_pair_bytes(__m128i k2) { return _mm256_cvtph_ps(_mm_unpacklo_epi8(k2, _mm_unpackhi_epi64(k2, k2))); }
// 8 unsigned / signed bytes (bytes 0-7, or 8-15 with high) as int32 lanes.
inline __m256i u8_lanes(__m128i v, bool high) { return _mm256_cvtepu8_epi32(high ? _mm_unpackhi_epi64(v, v) : v); }
inline __m256i s8_lanes(__m128i v, bool high) { return _mm256_cvtepi8_epi32(high ? _mm_unpackhi_epi64(v, v) : v); }

// Q4_K: the headers' bytes 0-15 (d, dmin, scales[12]) transposed once per super-block, the 6-bit
// scales and mins decoded for 8 rows at once (unpack_k_scale_min's bit moves, per byte: the
// 16-bit shifts only move bits that the masks then drop), then per group the codes' sums.
void rows8_q4_k(Rows8 row, const BlockQ8G32* act, int64_t S, float* out) {
  const __m128i m6 = _mm_set1_epi8(63), m4 = _mm_set1_epi8(15), top2 = _mm_set1_epi8(0x30);
  const __m256i low4 = _mm256_set1_epi8(15);
  __m256 v = _mm256_setzero_ps();
  for (int64_t s = 0; s < S; ++s) {
    const BlockQ8G32& a = act[s];
    const size_t off = size_t(s) * sizeof(BlockQ4_K);
    __m128i h[8], k[8];
    for (int r = 0; r < 8; ++r) h[r] = load16(row[r] + off);
    transpose_8x16(h, k);  // k[0]: d, k[1]: dmin, k[2 + i]: scales[2i], scales[2i + 1]
    const __m256 d = f16_pair_bytes(k[0]), dmin = f16_pair_bytes(k[1]);
    const __m128i sc[4] = {_mm_and_si128(k[2], m6), _mm_and_si128(k[3], m6),
                           _mm_or_si128(_mm_and_si128(k[6], m4), _mm_and_si128(_mm_srli_epi16(k[2], 2), top2)),
                           _mm_or_si128(_mm_and_si128(k[7], m4), _mm_and_si128(_mm_srli_epi16(k[3], 2), top2))};
    const __m128i mn[4] = {
        _mm_and_si128(k[4], m6), _mm_and_si128(k[5], m6),
        _mm_or_si128(_mm_and_si128(_mm_srli_epi16(k[6], 4), m4), _mm_and_si128(_mm_srli_epi16(k[4], 2), top2)),
        _mm_or_si128(_mm_and_si128(_mm_srli_epi16(k[7], 4), m4), _mm_and_si128(_mm_srli_epi16(k[5], 2), top2))};
    __m256 p = _mm256_setzero_ps();
#pragma GCC unroll 8  // constant jj: the nibble / quarter choices and lane picks fold away
    for (int jj = 0; jj < 8; ++jj) {
      const __m256i x = load32(a.qs + 32 * jj);
      __m256i prod[8];
      for (int r = 0; r < 8; ++r) {
        const __m256i q = load32(row[r] + off + offsetof(BlockQ4_K, qs) + 32 * (jj / 2));
        prod[r] = _mm256_maddubs_epi16(_mm256_and_si256(jj % 2 ? _mm256_srli_epi16(q, 4) : q, low4), x);
      }
      // Sums of 16 products of 4-bit codes: at most 16 · 15 · 128 < 32767.
      const __m256i c = lane_sums16(prod);
      const __m256 mx = _mm256_mul_ps(d, _mm256_cvtepi32_ps(u8_lanes(sc[jj / 2], jj % 2)));
      const __m256 my = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(u8_lanes(mn[jj / 2], jj % 2)));
      p = _mm256_fnmadd_ps(my, _mm256_set1_ps(a.ds[jj]), p);  // fma(−my, fy, p): the same single rounding
      p = _mm256_fmadd_ps(mx, _mm256_mul_ps(_mm256_set1_ps(a.d[jj]), _mm256_cvtepi32_ps(c)), p);
    }
    v = _mm256_add_ps(v, p);
  }
  _mm256_storeu_ps(out, v);
}

// Q6_K: codes 0..63 against the activations (pairs ≤ 2 · 63 · 127), one hadd level in int16
// (4 products ≤ 32004), then int32: per row the two 16-halves' Σ q·x, from which the device's
// −32 · (the half's activation sum) comes off once for all 8 rows (its MMA starts from that
// offset: the same exact integers). The 16-scales multiply those exact ca, cb after the
// reduction, from the transposed scale bytes.
void rows8_q6_k(Rows8 row, const BlockQ8G32* act, int64_t S, float* out) {
  const __m256i low4 = _mm256_set1_epi8(15), hi2 = _mm256_set1_epi8(0x30), ones = _mm256_set1_epi16(1);
  __m256 v = _mm256_setzero_ps();
  for (int64_t s = 0; s < S; ++s) {
    const BlockQ8G32& a = act[s];
    const size_t off = size_t(s) * sizeof(BlockQ6_K);
    __m128i h[8], k[8];
    for (int r = 0; r < 8; ++r) h[r] = load16(row[r] + off + offsetof(BlockQ6_K, scales));
    transpose_8x16(h, k);  // k[jj]: scales 2jj (bytes 0-7) and 2jj + 1 (bytes 8-15) of rows 0-7
    const __m256 dg = f16_rows(row, off + offsetof(BlockQ6_K, d));
    alignas(32) int32_t off32[16];  // 32 · the activation sums per 16 (one broadcast load each below)
    for (int i = 0; i < 2; ++i)
      _mm256_store_si256(reinterpret_cast<__m256i*>(off32 + 8 * i),
                         _mm256_slli_epi32(_mm256_cvtepi16_epi32(load16(a.hsums + 8 * i)), 5));
    __m256 p = _mm256_setzero_ps();
#pragma GCC unroll 8  // constant jj: the nibble / quarter choices and lane picks fold away
    for (int jj = 0; jj < 8; ++jj) {
      const int half = jj / 4, quarter = jj % 4;
      const __m256i x = load32(a.qs + 32 * jj);
      __m256i prod[8];
      for (int r = 0; r < 8; ++r) {
        const uint8_t* b = row[r] + off;
        const __m256i ql = load32(b + offsetof(BlockQ6_K, ql) + 64 * half + 32 * (quarter & 1));
        const __m256i qh = load32(b + offsetof(BlockQ6_K, qh) + 32 * half);
        // Bits 2 · quarter, 2 · quarter + 1 of each qh byte to bits 4-5.
        const __m256i hb = quarter == 0   ? _mm256_slli_epi16(qh, 4)
                           : quarter == 1 ? _mm256_slli_epi16(qh, 2)
                           : quarter == 2 ? qh
                                          : _mm256_srli_epi16(qh, 2);
        const __m256i q = _mm256_or_si256(_mm256_and_si256(quarter >= 2 ? _mm256_srli_epi16(ql, 4) : ql, low4),
                                          _mm256_and_si256(hb, hi2));
        prod[r] = _mm256_maddubs_epi16(q, x);
      }
      __m256i m[4];  // rows 2i, 2i + 1: 8-product sums, two per row and 16-half
      for (int i = 0; i < 4; ++i) m[i] = _mm256_madd_epi16(_mm256_hadd_epi16(prod[2 * i], prod[2 * i + 1]), ones);
      // a4: rows 0-3, Σ q·x over the first 16 in the low half, the second 16 in the high half; b4: rows 4-7.
      const __m256i a4 = _mm256_hadd_epi32(m[0], m[1]), b4 = _mm256_hadd_epi32(m[2], m[3]);
      const __m256i ca = _mm256_sub_epi32(_mm256_permute2x128_si256(a4, b4, 0x20), _mm256_set1_epi32(off32[2 * jj]));
      const __m256i cb = _mm256_sub_epi32(_mm256_permute2x128_si256(a4, b4, 0x31), _mm256_set1_epi32(off32[2 * jj + 1]));
      const __m256i c = _mm256_add_epi32(_mm256_mullo_epi32(s8_lanes(k[jj], false), ca),
                                         _mm256_mullo_epi32(s8_lanes(k[jj], true), cb));
      p = _mm256_fmadd_ps(_mm256_mul_ps(dg, _mm256_set1_ps(a.d[jj])), _mm256_cvtepi32_ps(c), p);
    }
    v = _mm256_add_ps(v, p);
  }
  _mm256_storeu_ps(out, v);
}

// Q8_0: signed × signed through the sign trick (|q| against x with q's sign), pairs to int32.
void rows8_q8_0(Rows8 row, const BlockQ8G32* act, int64_t S, float* out) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 v = _mm256_setzero_ps();
  for (int64_t s = 0; s < S; ++s) {
    const BlockQ8G32& a = act[s];
    __m256 p = _mm256_setzero_ps();
#pragma GCC unroll 8  // as the others: constant offsets
    for (int jj = 0; jj < 8; ++jj) {
      const size_t off = size_t(8 * s + jj) * sizeof(BlockQ8_0);
      const __m256i x = load32(a.qs + 32 * jj);
      __m256i prod[8];
      for (int r = 0; r < 8; ++r) {
        const __m256i q = load32(row[r] + off + offsetof(BlockQ8_0, qs));
        prod[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q)), ones);
      }
      const __m256i c = lane_sums32(prod);
      const __m256 e = f16_rows(row, off + offsetof(BlockQ8_0, d));
      p = _mm256_fmadd_ps(_mm256_mul_ps(e, _mm256_set1_ps(a.d[jj])), _mm256_cvtepi32_ps(c), p);
    }
    v = _mm256_add_ps(v, p);
  }
  _mm256_storeu_ps(out, v);
}

// Rows in passes of 8; a short last pass repeats its last row in the spare lanes.
void rows_avx2(DType wt, const uint8_t* w, size_t row_bytes, int rows, const BlockQ8G32* act, int64_t S,
               float* out) {
  auto* const kernel = wt == DType::Q4_K ? rows8_q4_k : wt == DType::Q6_K ? rows8_q6_k : rows8_q8_0;
  for (int r0 = 0; r0 < rows; r0 += 8) {
    const uint8_t* row[8];
    for (int l = 0; l < 8; ++l) row[l] = w + size_t(std::min(r0 + l, rows - 1)) * row_bytes;
    alignas(32) float v[8];
    kernel(row, act, S, v);
    std::memcpy(out + r0, v, sizeof(float) * size_t(std::min(8, rows - r0)));
  }
}

bool use_avx2() {
  static const bool avx2 = dot_isa() != DotIsa::Scalar;
  return avx2;
}

#else

bool use_avx2() { return false; }

#endif

}  // namespace

float dot_row_exact_scalar(DType wt, const void* wrow, const BlockQ8G32* act, int64_t n) {
  check_args(wt, n);
  return scalar_row(wt)(wrow, act, n / 256);
}

float dot_row_exact(DType wt, const void* wrow, const BlockQ8G32* act, int64_t n) {
  float v;
  dot_rows_exact(wt, wrow, 0, 1, act, n, &v);
  return v;
}

void dot_rows_exact(DType wt, const void* w, size_t row_bytes, int rows, const BlockQ8G32* act, int64_t n,
                    float* out) {
  check_args(wt, n);
  QWEN36_CHECK(rows >= 0, "dot_rows_exact: {} rows", rows);
#ifdef QWEN36_EXACT_AVX2
  if (use_avx2()) return rows_avx2(wt, static_cast<const uint8_t*>(w), row_bytes, rows, act, n / 256, out);
#endif
  const RowFn f = scalar_row(wt);
  for (int r = 0; r < rows; ++r) out[r] = f(static_cast<const uint8_t*>(w) + size_t(r) * row_bytes, act, n / 256);
}

std::string_view dot_exact_kernel_name(DType wt) {
  check_args(wt, 0);
  return use_avx2() ? "avx2" : "scalar";
}

}  // namespace qwen36
