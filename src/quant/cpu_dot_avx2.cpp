// AVX2 + FMA + F16C dot products (the x86-64-v3 baseline). Integer products use
// _mm256_maddubs_epi16 (unsigned x signed bytes -> int16 pairs); its int16 sums cannot
// saturate here: the unsigned operand is at most 127 and the activations lie in [-127, 127]
// (quantize_row never writes -128), so a pair is at most 2*127*127 < 32767. Signed x signed
// products move the sign of one operand onto the other first.
#include <cstring>
#include <type_traits>

#include "quant/blocks.h"
#include "quant/cpu_dot_g32.h"
#include "quant/cpu_dot_k_scales.h"
#include "quant/cpu_dot_kernels.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

namespace qwen36 {
namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

inline __m256i loadu256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// 8 int32 sums of pairs of (unsigned u8 x signed s8) products, 4 products each.
inline __m256i dot_u8s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
// Same for signed x signed: |x| times y with x's sign.
inline __m256i dot_s8s8(__m256i x, __m256i y) {
  return dot_u8s8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

// ---- plain types (f32 activations) ----

float dot_f32(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const float*>(w);
  const auto* y = static_cast<const float*>(a);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), acc1);
  }
  float sum = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) sum += x[i] * y[i];
  return sum;
}

float dot_f16(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const float*>(a);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    const __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i + 8)));
    acc0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(y + i), acc0);
    acc1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(y + i + 8), acc1);
  }
  float sum = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) sum += h2f(x[i]) * y[i];
  return sum;
}

inline __m256 bf16x8(const uint16_t* p) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

float dot_bf16(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const float*>(a);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(bf16x8(x + i), _mm256_loadu_ps(y + i), acc0);
    acc1 = _mm256_fmadd_ps(bf16x8(x + i + 8), _mm256_loadu_ps(y + i + 8), acc1);
  }
  float sum = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) sum += bf16_to_f32(x[i]) * y[i];
  return sum;
}

// ---- 32-element blocks x Q8_0 ----

// The Q8_0 / Q8_K-activation kernels take R activation rows (act + r·stride) against one weight
// row and write out[r·out_stride]: R = 1 is the table's one-row kernel, R = 4 prefill's
// four-row one, which decodes each weight block once for all four. Each row runs the same
// operations in its own accumulators whatever R is: a token's result is bitwise the same in a
// prefill as in a decode step.
template <typename Act>
inline const Act* act_row(const void* a, size_t stride, int r) {
  return reinterpret_cast<const Act*>(static_cast<const std::byte*>(a) + size_t(r) * stride);
}
template <void (*Rows)(const void*, const void*, size_t, int64_t, float*, size_t)>
float one_row(const void* w, const void* a, int64_t n) {
  float out;
  Rows(w, a, 0, n, &out, 1);
  return out;
}

template <int R>
void q8_0_rows(const void* w, const void* a, size_t a_stride, int64_t n, float* out, size_t out_stride) {
  const auto* x = static_cast<const BlockQ8_0*>(w);
  const BlockQ8_0* y[R];
  for (int r = 0; r < R; ++r) y[r] = act_row<BlockQ8_0>(a, a_stride, r);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK; ++i) {
    const __m256i qx = loadu256(x[i].qs), ax = _mm256_sign_epi8(qx, qx);
    for (int r = 0; r < R; ++r) {
      const __m256i p = dot_u8s8(ax, _mm256_sign_epi8(loadu256(y[r][i].qs), qx));  // dot_s8s8(x, y)
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * h2f(y[r][i].d)), _mm256_cvtepi32_ps(p), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[size_t(r) * out_stride] = hsum(acc[r]);
}

// 16 bytes of packed nibbles -> 32 bytes: low nibbles first, then high nibbles (Q4_0 order).
inline __m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

float dot_q4_0(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ4_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK; ++i) {
    const __m256i q = _mm256_sub_epi8(unpack_nibbles(x[i].qs), _mm256_set1_epi8(8));
    const __m256i p = dot_s8s8(q, loadu256(y[i].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d)), _mm256_cvtepi32_ps(p), acc);
  }
  return hsum(acc);
}


// Sum of each 4 consecutive signed bytes (for the activation sums of affine types).
inline __m256i sum_s8(__m256i y) { return dot_u8s8(_mm256_set1_epi8(1), y); }

float dot_q4_1(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ4_1*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK; ++i) {
    const __m256i qy = loadu256(y[i].qs);
    const float dy = h2f(y[i].d);
    // d*q + m against dy*qy: d*dy*sum(q*qy) + m*dy*sum(qy).
    const __m256 p = _mm256_cvtepi32_ps(dot_u8s8(unpack_nibbles(x[i].qs), qy));
    const __m256 sy = _mm256_cvtepi32_ps(sum_s8(qy));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * dy), p, acc);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].m) * dy), sy, acc);
  }
  return hsum(acc);
}

// The 32 5th bits of a Q5 block (a little-endian u32) as bytes 0x10 or 0x00.
inline __m256i q5_high_bits(const uint8_t* qh_bytes) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  // Byte j takes byte j/8 of qh, then keeps bit j%8.
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(int(qh)),
                                             _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202,
                                                                0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

float dot_q5_0(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ5_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK; ++i) {
    const __m256i q = _mm256_sub_epi8(_mm256_or_si256(unpack_nibbles(x[i].qs), q5_high_bits(x[i].qh)),
                                      _mm256_set1_epi8(16));
    const __m256i p = dot_s8s8(q, loadu256(y[i].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d)), _mm256_cvtepi32_ps(p), acc);
  }
  return hsum(acc);
}

float dot_q5_1(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ5_1*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK; ++i) {
    const __m256i qy = loadu256(y[i].qs);
    const float dy = h2f(y[i].d);
    const __m256i q = _mm256_or_si256(unpack_nibbles(x[i].qs), q5_high_bits(x[i].qh));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * dy), _mm256_cvtepi32_ps(dot_u8s8(q, qy)), acc);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].m) * dy), _mm256_cvtepi32_ps(sum_s8(qy)), acc);
  }
  return hsum(acc);
}

// ---- 256-element super-blocks x Q8_K ----

float dot_q8_k(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ8_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    __m256i sumi = _mm256_setzero_si256();
    for (int j = 0; j < kQK_K; j += 32) sumi = _mm256_add_epi32(sumi, dot_s8s8(loadu256(x[i].qs + j), loadu256(y[i].qs + j)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(x[i].d * y[i].d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum(acc);
}

// Q4_K and Q5_K share the super-block header (d, dmin, 6-bit scales and mins) and the nibble
// layout (chunk c: the low nibbles of qs[32c, +32) are sub-block 2c, the high ones 2c + 1); Q5_K
// adds bit 4 of every code from qh (bits 2c and 2c + 1 of each byte). A sub-block's scale
// reaches its 16 int16 pair sums by a byte shuffle of the decoded scales (index byte 0x80:
// the zero high byte). Act: BlockQ8_K (one scale per super-block: the sub-blocks' integer sums
// add up before one float multiply) or BlockQ8G32 (a scale per sub-block: a float multiply-add
// per sub-block; the mins against the activations' d · Σq).
template <typename Block, typename Act, int R>
void k_nibbles_rows(const void* w, const void* a, size_t a_stride, int64_t n, float* out, size_t out_stride) {
  constexpr bool kFifthBit = std::is_same_v<Block, BlockQ5_K>, kG32 = std::is_same_v<Act, BlockQ8G32>;
  const auto* x = static_cast<const Block*>(w);
  const Act* y[R];
  for (int r = 0; r < R; ++r) y[r] = act_row<Act>(a, a_stride, r);
  const __m256i low4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  __m256 acc[R], acc_m[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), acc_m[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const __m128i sm = k_scales_mins(x[i].scales);
    const __m256i sc = _mm256_broadcastsi128_si256(sm);
    float d[R];
    for (int r = 0; r < R; ++r) {
      if constexpr (kG32) {
        d[r] = h2f(x[i].d);
        const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8)));
        acc_m[r] = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].dmin)), _mm256_mul_ps(m, _mm256_loadu_ps(y[r][i].ds)), acc_m[r]);
      } else {
        d[r] = h2f(x[i].d) * y[r][i].d;
        acc_m[r] = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].dmin) * y[r][i].d),
                                   _mm256_cvtepi32_ps(k_mins_dot(sm, y[r][i].bsums)), acc_m[r]);
      }
    }
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFifthBit) qh = loadu256(x[i].qh);
    __m256i sumi[R];
    for (int r = 0; r < R; ++r) sumi[r] = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i q4 = loadu256(x[i].qs + 32 * c);
      __m256i lo = _mm256_and_si256(q4, low4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), low4);
      if constexpr (kFifthBit) {
        // Bit 2c / 2c+1 of each qh byte, moved to bit 4 (the shift stays inside each byte
        // after the mask, since 2c+1 < 8).
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
      }
      const __m256i s_lo = _mm256_shuffle_epi8(sc, _mm256_set1_epi16(int16_t(0x8000 | (2 * c))));
      const __m256i s_hi = _mm256_shuffle_epi8(sc, _mm256_set1_epi16(int16_t(0x8000 | (2 * c + 1))));
      for (int r = 0; r < R; ++r) {
        const __m256i slo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, loadu256(y[r][i].qs + 64 * c)), s_lo);
        const __m256i shi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, loadu256(y[r][i].qs + 64 * c + 32)), s_hi);
        if constexpr (kG32) {
          acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d[r] * y[r][i].d[2 * c]), _mm256_cvtepi32_ps(slo), acc[r]);
          acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d[r] * y[r][i].d[2 * c + 1]), _mm256_cvtepi32_ps(shi), acc[r]);
        } else {
          sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(slo, shi));
        }
      }
    }
    if constexpr (!kG32)
      for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d[r]), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
  }
  for (int r = 0; r < R; ++r) out[size_t(r) * out_stride] = hsum(acc[r]) - hsum(acc_m[r]);
}

// Q6_K: 16 sub-blocks of 16 with int8 scales, codes 0..63 whose −32 is applied once through
// the activations' sums per 16 (Q8_K: bsums, BlockQ8G32: hsums). With per-32 activation scales
// (BlockQ8G32) the 32-value vector m of half h is group 4h + m: its scaled sums take its scale.
template <typename Act, int R>
void q6_k_rows(const void* w, const void* a, size_t a_stride, int64_t n, float* out, size_t out_stride) {
  constexpr bool kG32 = std::is_same_v<Act, BlockQ8G32>;
  const auto* x = static_cast<const BlockQ6_K*>(w);
  const Act* y[R];
  for (int r = 0; r < R; ++r) y[r] = act_row<Act>(a, a_stride, r);
  const __m256i low4 = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(3);
  // For a byte shuffle of 8 int16 scales in each 128-bit lane: scale 2m in the low lane's words
  // and 2m + 1 in the high lane's (the two groups of 16 of a 32-value vector).
  __m256i idx[4];
  for (int m = 0; m < 4; ++m) {
    auto word = [](int k) { return _mm_set1_epi16(int16_t((2 * k + 1) << 8 | 2 * k)); };
    idx[m] = _mm256_set_m128i(word(2 * m + 1), word(2 * m));
  }
  __m256 acc[R], acc_off[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), acc_off[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales)));
    float d[R];
    // The -32 of every value, applied once: 32 * sum_k sc[k] * (sum of the activations of group k).
    for (int r = 0; r < R; ++r) {
      if constexpr (kG32) {
        d[r] = h2f(x[i].d);
        // Lane j: sub-blocks 2j and 2j + 1, one activation group: times that group's scale.
        const __m256 dg = _mm256_mul_ps(_mm256_set1_ps(d[r]), _mm256_loadu_ps(y[r][i].d));
        acc_off[r] = _mm256_fmadd_ps(dg, _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, loadu256(y[r][i].hsums))),
                                     acc_off[r]);
      } else {
        d[r] = h2f(x[i].d) * y[r][i].d;
        acc_off[r] = _mm256_fmadd_ps(_mm256_set1_ps(d[r]),
                                     _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, loadu256(y[r][i].bsums))), acc_off[r]);
      }
    }
    __m256i sumi[R];
    for (int r = 0; r < R; ++r) sumi[r] = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = loadu256(x[i].ql + 64 * h);
      const __m256i ql1 = loadu256(x[i].ql + 64 * h + 32);
      const __m256i qh = loadu256(x[i].qh + 32 * h);
      const __m256i sc = _mm256_broadcastsi128_si256(h ? _mm256_extracti128_si256(s16, 1) : _mm256_castsi256_si128(s16));
      __m256i q[4];
      q[0] = _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_slli_epi16(_mm256_and_si256(qh, two), 4));
      q[1] = _mm256_or_si256(_mm256_and_si256(ql1, low4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), two), 4));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), two), 4));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), two), 4));
      for (int m = 0; m < 4; ++m) {
        // 32 values = two groups of 16 with their own scales: int16 lanes 0-7 and 8-15.
        const __m256i scale = _mm256_shuffle_epi8(sc, idx[m]);
        for (int r = 0; r < R; ++r) {
          const __m256i p = _mm256_maddubs_epi16(q[m], loadu256(y[r][i].qs + 128 * h + 32 * m));
          const __m256i s = _mm256_madd_epi16(p, scale);
          if constexpr (kG32)
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d[r] * y[r][i].d[4 * h + m]), _mm256_cvtepi32_ps(s), acc[r]);
          else
            sumi[r] = _mm256_add_epi32(sumi[r], s);
        }
      }
    }
    if constexpr (!kG32)
      for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d[r]), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
  }
  for (int r = 0; r < R; ++r) out[size_t(r) * out_stride] = hsum(acc[r]) - 32.0f * hsum(acc_off[r]);
}

// Q8_0 weights against per-32 activations: block b is group b % 8 of activation block b / 8.
float dot_q8_0_g32(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ8_0*>(w);
  const auto* y = static_cast<const BlockQ8G32*>(a);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK; ++b) {
    const BlockQ8G32& g = y[b / 8];
    const __m256i s = dot_s8s8(loadu256(x[b].qs), loadu256(g.qs + 32 * (b % 8)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[b].d) * g.d[b % 8]), _mm256_cvtepi32_ps(s), acc);
  }
  return hsum(acc);
}

// IQ4_XS: 8 sub-blocks of 32 codes looked up in a 16-entry grid; sub-block ib's 6-bit scale is
// the nibble ib of scales_l (low 4 bits) and bits 2ib, 2ib + 1 of scales_h (high 2). All 8 are
// decoded at once in int32 lanes (variable shifts of the broadcast fields), minus 32, and kept
// as the same int16 twice per lane, so that one lane broadcast gives a sub-block's madd factor:
// its int16 pair sums times the scale, summed in pairs (exact: |pair| <= 2 * 127 * 127, |scale| <= 32).
float dot_iq4_xs(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockIQ4_XS*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const __m128i grid128 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NLValues));
  const __m256i grid = _mm256_set_m128i(grid128, grid128);
  const __m256i low_shift = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28),
                high_shift = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    uint32_t sl;
    std::memcpy(&sl, x[i].scales_l, 4);
    const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int(sl)), low_shift), _mm256_set1_epi32(15));
    const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(x[i].scales_h), high_shift),
                                        _mm256_set1_epi32(3));
    const __m256i ls = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
    const __m256i ls2 = _mm256_or_si256(_mm256_and_si256(ls, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(ls, 16));
    __m256i sumi = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib) {
      const __m256i v = _mm256_shuffle_epi8(grid, unpack_nibbles(x[i].qs + 16 * ib));
      const __m256i qy = loadu256(y[i].qs + 32 * ib);
      const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(qy, v));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_permutevar8x32_epi32(ls2, _mm256_set1_epi32(ib))));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * y[i].d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum(acc);
}

constexpr DotKernel kKernels[] = {
    {DType::F32, dot_f32},
    {DType::F16, dot_f16},
    {DType::BF16, dot_bf16},
    {DType::Q8_0, one_row<q8_0_rows<1>>},
    {DType::Q4_0, dot_q4_0},
    {DType::Q4_K, one_row<k_nibbles_rows<BlockQ4_K, BlockQ8_K, 1>>},
    {DType::Q5_K, one_row<k_nibbles_rows<BlockQ5_K, BlockQ8_K, 1>>},
    {DType::Q6_K, one_row<q6_k_rows<BlockQ8_K, 1>>},
    {DType::IQ4_XS, dot_iq4_xs},
    {DType::Q4_1, dot_q4_1},
    {DType::Q5_0, dot_q5_0},
    {DType::Q5_1, dot_q5_1},
    {DType::Q8_K, dot_q8_k},
};

constexpr DotKernel kG32Kernels[] = {
    {DType::Q4_K, one_row<k_nibbles_rows<BlockQ4_K, BlockQ8G32, 1>>},
    {DType::Q5_K, one_row<k_nibbles_rows<BlockQ5_K, BlockQ8G32, 1>>},
    {DType::Q6_K, one_row<q6_k_rows<BlockQ8G32, 1>>},
    {DType::Q8_0, dot_q8_0_g32},
};

constexpr Dot4Kernel k4Kernels[] = {{DType::Q8_0, q8_0_rows<4>},
                                    {DType::Q4_K, k_nibbles_rows<BlockQ4_K, BlockQ8_K, 4>},
                                    {DType::Q5_K, k_nibbles_rows<BlockQ5_K, BlockQ8_K, 4>},
                                    {DType::Q6_K, q6_k_rows<BlockQ8_K, 4>}};

}  // namespace

std::span<const DotKernel> avx2_dot_kernels() { return kKernels; }
std::span<const Dot4Kernel> avx2_dot4_kernels() { return k4Kernels; }
std::span<const DotKernel> avx2_g32_kernels() { return kG32Kernels; }

}  // namespace qwen36

#else

namespace qwen36 {
std::span<const DotKernel> avx2_dot_kernels() { return {}; }
std::span<const Dot4Kernel> avx2_dot4_kernels() { return {}; }
std::span<const DotKernel> avx2_g32_kernels() { return {}; }
}  // namespace qwen36

#endif
