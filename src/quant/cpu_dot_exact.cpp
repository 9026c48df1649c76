// The device-exact dot products of cpu_dot_exact.h: the scalar definition, the AVX2 kernel
// (8 rows in the 8 lanes of each vector), the AVX-512 VNNI one (16 rows) and the dispatch.
// Compiled with -ffp-contract=off (src/quant/CMakeLists.txt; the AVX-512 functions' target
// attribute keeps it): g++ would otherwise fuse a product into a following add, here as in the
// intrinsics (GCC writes _mm256_mul_ps as a plain vector product), and the sequence of
// roundings is the whole point.
#include "quant/cpu_dot_exact.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "quant/blocks.h"
#include "quant/cpu_dot_kernels.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define QWEN36_EXACT_AVX2 1
// GCC 12's AVX-512 intrinsics pass a deliberately "undefined" vector as the unused merge source,
// which -W(maybe-)uninitialized reports inside the system header once inlined (as in
// cpu_dot_avx512.cpp); silenced for the header's lines only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
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

#if defined(__GNUC__)
#define QWEN36_EXACT_AVX512 1

// ---- AVX-512 (F, BW, VL, VNNI): lane r of every vector is row r of 16 ----
//
// Compiled for that ISA with a target attribute, as cpu_dot_avx512.cpp's kernels (the build
// baseline stays x86-64-v3), and used only where dot_isa() reports AVX-512 VNNI. The AVX2
// structure, 16 rows wide: per row a vector of 64 weight codes (two groups) against the 64
// activation codes through one dpbusd (unsigned × signed bytes, 4 products per int32 lane,
// no saturation: exact), a transpose-and-add tree that leaves per row the four 16-value sums in
// 4 vectors' lanes, and the float steps vertical, each lane doing the definition's operations
// in its order.

#define QWEN36_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

using Rows16 = const uint8_t* const (&)[16];

// q[L], lane r: the sum of the four int32 lanes of p[r]'s 128-bit lane L (16 of its 64 values).
// Two levels of unpack-and-add within 128-bit lanes leave u[j] with, in lane L, quarter L of rows
// 4j .. 4j + 3; a 4 × 4 transpose of 128-bit lanes then puts each quarter in one vector.
QWEN36_AVX512 inline void quarter_sums(const __m512i (&p)[16], __m512i (&q)[4]) {
  __m512i u[4];
  for (int j = 0; j < 4; ++j) {
    __m512i t[2];
    for (int i = 0; i < 2; ++i) {  // rows a, b = 4j + 2i, + 1: per lane a0 + a2, b0 + b2, a1 + a3, b1 + b3
      const __m512i a = p[4 * j + 2 * i], b = p[4 * j + 2 * i + 1];
      t[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    }
    u[j] = _mm512_add_epi32(_mm512_unpacklo_epi64(t[0], t[1]), _mm512_unpackhi_epi64(t[0], t[1]));
  }
  const __m512i l01 = _mm512_shuffle_i32x4(u[0], u[1], 0x44), l23 = _mm512_shuffle_i32x4(u[2], u[3], 0x44);
  const __m512i h01 = _mm512_shuffle_i32x4(u[0], u[1], 0xEE), h23 = _mm512_shuffle_i32x4(u[2], u[3], 0xEE);
  q[0] = _mm512_shuffle_i32x4(l01, l23, 0x88);
  q[1] = _mm512_shuffle_i32x4(l01, l23, 0xDD);
  q[2] = _mm512_shuffle_i32x4(h01, h23, 0x88);
  q[3] = _mm512_shuffle_i32x4(h01, h23, 0xDD);
}

// The 16 bytes at `at` of the 16 rows, transposed within 128-bit lanes: h[m], lane L, dword k,
// byte t holds byte 4m + k of row 4L + t (rows 4L .. 4L + 3 loaded into lane L, then two rounds
// of unpacks).
QWEN36_AVX512 inline void transpose_16x16(Rows16 row, size_t at, __m512i (&h)[4]) {
  __m512i z[4];  // z[j], lane L: row 4L + j
  for (int j = 0; j < 4; ++j) {
    z[j] = _mm512_castsi128_si512(load16(row[j] + at));
    z[j] = _mm512_inserti32x4(z[j], load16(row[4 + j] + at), 1);
    z[j] = _mm512_inserti32x4(z[j], load16(row[8 + j] + at), 2);
    z[j] = _mm512_inserti32x4(z[j], load16(row[12 + j] + at), 3);
  }
  const __m512i a0 = _mm512_unpacklo_epi8(z[0], z[1]), a1 = _mm512_unpackhi_epi8(z[0], z[1]);  // rows 4L, 4L + 1
  const __m512i b0 = _mm512_unpacklo_epi8(z[2], z[3]), b1 = _mm512_unpackhi_epi8(z[2], z[3]);  // rows 4L + 2, 4L + 3
  h[0] = _mm512_unpacklo_epi16(a0, b0);
  h[1] = _mm512_unpackhi_epi16(a0, b0);
  h[2] = _mm512_unpacklo_epi16(a1, b1);
  h[3] = _mm512_unpackhi_epi16(a1, b1);
}

// _mm512_shuffle_epi8 indices that read a transposed h[m] into int32 lanes, lane r = row r: byte
// i of each lane from dword s_i (byte 4m + s_i of the row), or zero where s_i < 0.
QWEN36_AVX512 inline __m512i lane_pick(int s0, int s1, int s2, int s3) {
  const int s[4] = {s0, s1, s2, s3};
  int idx[4];
  for (int t = 0; t < 4; ++t) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(s[i] < 0 ? 0x80 : 4 * s[i] + t) << (8 * i);
    idx[t] = int(v);
  }
  return _mm512_set4_epi32(idx[3], idx[2], idx[1], idx[0]);
}

// 16 f16 in the low halves of int32 lanes, as floats.
QWEN36_AVX512 inline __m512 f16_lanes(__m512i v) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)); }
// The f16 at byte `at` of each of the 16 rows, as floats.
QWEN36_AVX512 inline __m512 f16_rows16(Rows16 row, size_t at) {
  auto h = [&](int r) { return int16_t(load_u16(row[r] + at)); };
  return _mm512_cvtph_ps(_mm256_setr_epi16(h(0), h(1), h(2), h(3), h(4), h(5), h(6), h(7), h(8), h(9), h(10), h(11),
                                           h(12), h(13), h(14), h(15)));
}
// Bytes lo, hi as one 64-byte vector.
QWEN36_AVX512 inline __m512i join(__m256i lo, __m256i hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// Q4_K: the headers (d, dmin, scales[12]: 16 bytes) transposed once per super-block and the
// scales and mins decoded for 16 rows at once (rows8_q4_k's bit moves). Chunk c's 32 bytes go to
// both halves of a vector and one mask keeps the low nibbles (group 2c) in the low half and the
// high nibbles, times 16, in the high (group 2c + 1): that group's sums come out 16 times too,
// exactly (at most 32 · 240 · 128), and an arithmetic shift by 4 divides them back.
QWEN36_AVX512 void rows16_q4_k(Rows16 row, const BlockQ8G32* act, int64_t S, float* out) {
  const __m512i m6 = _mm512_set1_epi8(63), m4 = _mm512_set1_epi8(15), top2 = _mm512_set1_epi8(0x30);
  const __m512i nibbles = join(_mm256_set1_epi8(15), _mm256_set1_epi8(int8_t(0xF0)));
  const __m512i pick_d = lane_pick(0, 1, -1, -1), pick_dmin = lane_pick(2, 3, -1, -1);
  const __m512i pick[4] = {lane_pick(0, -1, -1, -1), lane_pick(1, -1, -1, -1), lane_pick(2, -1, -1, -1),
                           lane_pick(3, -1, -1, -1)};
  __m512 v = _mm512_setzero_ps();
  for (int64_t s = 0; s < S; ++s) {
    const BlockQ8G32& a = act[s];
    const size_t off = size_t(s) * sizeof(BlockQ4_K);
    __m512i h[4];
    transpose_16x16(row, off, h);  // h[0]: d, dmin; h[1 + i]: scales[4i .. 4i + 3]
    const __m512 d = f16_lanes(_mm512_shuffle_epi8(h[0], pick_d));
    const __m512 dmin = f16_lanes(_mm512_shuffle_epi8(h[0], pick_dmin));
    // Per byte (dword k): sc[0] groups k, sc[1] groups 4 + k; mn the same for the mins.
    const __m512i sc[2] = {
        _mm512_and_si512(h[1], m6),
        _mm512_or_si512(_mm512_and_si512(h[3], m4), _mm512_and_si512(_mm512_srli_epi16(h[1], 2), top2))};
    const __m512i mn[2] = {_mm512_and_si512(h[2], m6),
                           _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(h[3], 4), m4),
                                           _mm512_and_si512(_mm512_srli_epi16(h[2], 2), top2))};
    __m512 p = _mm512_setzero_ps();
#pragma GCC unroll 4  // constant c: the offsets and lane picks fold away
    for (int c = 0; c < 4; ++c) {
      const __m512i x = _mm512_loadu_si512(a.qs + 64 * c);
      __m512i prod[16], q[4];
      for (int r = 0; r < 16; ++r) {
        const __m512i w = _mm512_broadcast_i64x4(load32(row[r] + off + offsetof(BlockQ4_K, qs) + 32 * c));
        prod[r] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(w, nibbles), x);
      }
      quarter_sums(prod, q);
      const __m512i cg[2] = {_mm512_add_epi32(q[0], q[1]), _mm512_srai_epi32(_mm512_add_epi32(q[2], q[3]), 4)};
      for (int g = 0; g < 2; ++g) {
        const int jj = 2 * c + g;
        const __m512 mx = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_shuffle_epi8(sc[jj / 4], pick[jj % 4])));
        const __m512 my = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_shuffle_epi8(mn[jj / 4], pick[jj % 4])));
        p = _mm512_fnmadd_ps(my, _mm512_set1_ps(a.ds[jj]), p);  // fma(−my, fy, p)
        p = _mm512_fmadd_ps(mx, _mm512_mul_ps(_mm512_set1_ps(a.d[jj]), _mm512_cvtepi32_ps(cg[g])), p);
      }
    }
    v = _mm512_add_ps(v, p);
  }
  _mm512_storeu_ps(out, v);
}

// Q6_K: chunk c (groups 2c, 2c + 1: half c / 2, quarters 2 (c % 2) and + 1) as 64 codes 0..63,
// ql's 64 bytes of the half (its low nibbles for c even, high for c odd) with qh's 32 in both
// halves shifted so each quarter's 2 bits land on bits 4-5 (masked shifts: one amount per
// 256-bit half). The quarter sums are rows8_q6_k's Σ q·x per 16, the −32 · (activation sum)
// taken off for all 16 rows at once; the scales, transposed per super-block, multiply the exact
// ca, cb as in rows8_q6_k (sign-extended from the top byte of each lane).
QWEN36_AVX512 void rows16_q6_k(Rows16 row, const BlockQ8G32* act, int64_t S, float* out) {
  const __m512i m4 = _mm512_set1_epi8(15), hi2 = _mm512_set1_epi8(0x30);
  const __m512i pick_top[4] = {lane_pick(-1, -1, -1, 0), lane_pick(-1, -1, -1, 1), lane_pick(-1, -1, -1, 2),
                               lane_pick(-1, -1, -1, 3)};
  constexpr __mmask32 kLowHalf = 0x0000FFFF, kHighHalf = 0xFFFF0000;  // 16-bit lanes
  __m512 v = _mm512_setzero_ps();
  for (int64_t s = 0; s < S; ++s) {
    const BlockQ8G32& a = act[s];
    const size_t off = size_t(s) * sizeof(BlockQ6_K);
    __m512i h[4];
    transpose_16x16(row, off + offsetof(BlockQ6_K, scales), h);  // h[m]: scales 4m .. 4m + 3
    const __m512 dg = f16_rows16(row, off + offsetof(BlockQ6_K, d));
    __m512 p = _mm512_setzero_ps();
#pragma GCC unroll 4  // constant c: the nibble / shift choices and lane picks fold away
    for (int c = 0; c < 4; ++c) {
      const int half = c / 2;
      const __m512i x = _mm512_loadu_si512(a.qs + 64 * c);
      __m512i prod[16], q[4];
      for (int r = 0; r < 16; ++r) {
        const uint8_t* b = row[r] + off;
        const __m512i ql = _mm512_loadu_si512(b + offsetof(BlockQ6_K, ql) + 64 * half);
        const __m512i qh = _mm512_broadcast_i64x4(load32(b + offsetof(BlockQ6_K, qh) + 32 * half));
        // Quarters 0 | 1: qh << 4 | qh << 2; quarters 2 | 3: qh | qh >> 2.
        const __m512i hb = c % 2 ? _mm512_mask_srli_epi16(qh, kHighHalf, qh, 2)
                                 : _mm512_mask_slli_epi16(_mm512_slli_epi16(qh, 2), kLowHalf, qh, 4);
        const __m512i w = _mm512_or_si512(_mm512_and_si512(c % 2 ? _mm512_srli_epi16(ql, 4) : ql, m4),
                                          _mm512_and_si512(hb, hi2));
        prod[r] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x);
      }
      quarter_sums(prod, q);
      for (int g = 0; g < 2; ++g) {
        const int jj = 2 * c + g;
        const __m512i ca = _mm512_sub_epi32(q[2 * g], _mm512_set1_epi32(32 * a.hsums[2 * jj]));
        const __m512i cb = _mm512_sub_epi32(q[2 * g + 1], _mm512_set1_epi32(32 * a.hsums[2 * jj + 1]));
        // scales[2jj], [2jj + 1] = scales 4c + 2g, + 1: h[c], dwords 2g, 2g + 1.
        const __m512i sa = _mm512_srai_epi32(_mm512_shuffle_epi8(h[c], pick_top[2 * g]), 24);
        const __m512i sb = _mm512_srai_epi32(_mm512_shuffle_epi8(h[c], pick_top[2 * g + 1]), 24);
        const __m512i ci = _mm512_add_epi32(_mm512_mullo_epi32(sa, ca), _mm512_mullo_epi32(sb, cb));
        p = _mm512_fmadd_ps(_mm512_mul_ps(dg, _mm512_set1_ps(a.d[jj])), _mm512_cvtepi32_ps(ci), p);
      }
    }
    v = _mm512_add_ps(v, p);
  }
  _mm512_storeu_ps(out, v);
}

// Q8_0: blocks 8s + 2c and + 1 in one vector, offset by 128 (the bytes' top bit flipped) to
// unsigned 0..255 for dpbusd: Σ (q + 128)·x, from which 128 · (the group's activation sum)
// comes off for all 16 rows at once, as Q6_K's −32.
QWEN36_AVX512 void rows16_q8_0(Rows16 row, const BlockQ8G32* act, int64_t S, float* out) {
  const __m512i bias = _mm512_set1_epi8(int8_t(0x80));
  __m512 v = _mm512_setzero_ps();
  for (int64_t s = 0; s < S; ++s) {
    const BlockQ8G32& a = act[s];
    __m512 p = _mm512_setzero_ps();
#pragma GCC unroll 4  // as the others: constant offsets
    for (int c = 0; c < 4; ++c) {
      const size_t off = size_t(8 * s + 2 * c) * sizeof(BlockQ8_0);
      const __m512i x = _mm512_loadu_si512(a.qs + 64 * c);
      __m512i prod[16], q[4];
      for (int r = 0; r < 16; ++r) {
        const uint8_t* b = row[r] + off + offsetof(BlockQ8_0, qs);
        const __m512i w = join(load32(b), load32(b + sizeof(BlockQ8_0)));
        prod[r] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(w, bias), x);
      }
      quarter_sums(prod, q);
      for (int g = 0; g < 2; ++g) {
        const int jj = 2 * c + g;
        const __m512i ci = _mm512_sub_epi32(_mm512_add_epi32(q[2 * g], q[2 * g + 1]),
                                            _mm512_set1_epi32(128 * (a.hsums[2 * jj] + a.hsums[2 * jj + 1])));
        const __m512 e = f16_rows16(row, off + size_t(g) * sizeof(BlockQ8_0) + offsetof(BlockQ8_0, d));
        p = _mm512_fmadd_ps(_mm512_mul_ps(e, _mm512_set1_ps(a.d[jj])), _mm512_cvtepi32_ps(ci), p);
      }
    }
    v = _mm512_add_ps(v, p);
  }
  _mm512_storeu_ps(out, v);
}

// Rows in passes of 16; a short last pass repeats its last row in the spare lanes.
QWEN36_AVX512 void rows_avx512(DType wt, const uint8_t* w, size_t row_bytes, int rows, const BlockQ8G32* act,
                               int64_t S, float* out) {
  auto* const kernel = wt == DType::Q4_K ? rows16_q4_k : wt == DType::Q6_K ? rows16_q6_k : rows16_q8_0;
  for (int r0 = 0; r0 < rows; r0 += 16) {
    const uint8_t* row[16];
    for (int l = 0; l < 16; ++l) row[l] = w + size_t(std::min(r0 + l, rows - 1)) * row_bytes;
    alignas(64) float v[16];
    kernel(row, act, S, v);
    std::memcpy(out + r0, v, sizeof(float) * size_t(std::min(16, rows - r0)));
  }
}

#endif  // __GNUC__

#endif  // QWEN36_EXACT_AVX2

// The widest kernel dot_isa() allows (QWEN36_CPU_ISA caps it).
enum class Kernel { Scalar, Avx2, Avx512 };

Kernel kernel() {
  static const Kernel k = [] {
    [[maybe_unused]] const DotIsa isa = dot_isa();
#ifdef QWEN36_EXACT_AVX512
    if (isa == DotIsa::Avx512Vnni) return Kernel::Avx512;
#endif
#ifdef QWEN36_EXACT_AVX2
    if (isa != DotIsa::Scalar) return Kernel::Avx2;
#endif
    return Kernel::Scalar;
  }();
  return k;
}

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
  const auto* wb = static_cast<const uint8_t*>(w);
  switch (kernel()) {
#ifdef QWEN36_EXACT_AVX512
    case Kernel::Avx512: return rows_avx512(wt, wb, row_bytes, rows, act, n / 256, out);
#endif
#ifdef QWEN36_EXACT_AVX2
    case Kernel::Avx2: return rows_avx2(wt, wb, row_bytes, rows, act, n / 256, out);
#endif
    default: break;
  }
  const RowFn f = scalar_row(wt);
  for (int r = 0; r < rows; ++r) out[r] = f(wb + size_t(r) * row_bytes, act, n / 256);
}

std::string_view dot_exact_kernel_name(DType wt) {
  check_args(wt, 0);
  switch (kernel()) {
    case Kernel::Avx512: return "avx512vnni";
    case Kernel::Avx2: return "avx2";
    case Kernel::Scalar: break;
  }
  return "scalar";
}

}  // namespace qwen36
