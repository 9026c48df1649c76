// AVX-512 VNNI dot products for the types used in practice (Q8_0, Q4_K, Q5_K, Q6_K), against the
// CPU's own 8-bit activations (Q8_0 / Q8_K) and the CUDA backend's per-32 ones (cpu_dot_g32.h).
// They are compiled for that ISA with a target attribute (the build baseline stays x86-64-v3) and
// only used when __builtin_cpu_supports reports AVX-512 F/BW/VL/VNNI (cpu_dot.cpp). Same arithmetic as
// the AVX2 kernels, 64 bytes per step; dpwssd fuses the scale multiply with the accumulation.
#include <type_traits>

#include "quant/blocks.h"
#include "quant/cpu_dot_g32.h"
#include "quant/cpu_dot_k_scales.h"
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
// Every kernel below takes R activation rows (act + r·stride) against one weight row and writes
// out[r·out_stride]: R = 1 is the one-row kernel of the table, R = 4 (CPU activations) the
// four-row one of prefill, which decodes each weight block once for all four. Each row runs the
// same operations in its own accumulators whatever R is, so a token's result is bitwise the same
// in a prefill as in a decode step.
template <typename Act>
QWEN36_AVX512 inline const Act* act_row(const void* a, size_t stride, int r) {
  return reinterpret_cast<const Act*>(static_cast<const std::byte*>(a) + size_t(r) * stride);
}

// Q8_0 weights against Q8_0 activations (block b: y[b]) or per-32 ones (group b % 8 of y[b / 8]).
template <typename Act, int R>
QWEN36_AVX512 void q8_0_rows(const void* w, const void* a, size_t a_stride, int64_t n, float* out, size_t out_stride) {
  constexpr bool kG32 = std::is_same_v<Act, BlockQ8G32>;
  const auto* x = static_cast<const BlockQ8_0*>(w);
  const Act* y[R];
  for (int r = 0; r < R; ++r) y[r] = act_row<Act>(a, a_stride, r);
  auto codes = [](const Act* ya, int64_t b) -> const int8_t* {
    if constexpr (kG32) return ya[b / 8].qs + 32 * (b % 8);
    else return ya[b].qs;
  };
  auto scale = [x](const Act* ya, int64_t b) -> float {
    if constexpr (kG32) return _cvtsh_ss(x[b].d) * ya[b / 8].d[b % 8];
    else return _cvtsh_ss(x[b].d) * _cvtsh_ss(ya[b].d);
  };
  const int64_t nb = n / kQK;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {  // two blocks per 512-bit step
    const __m512i qx = join(loadu256(x[i].qs), loadu256(x[i + 1].qs));
    const __mmask64 neg = _mm512_movepi8_mask(qx);
    const __m512i ax = _mm512_abs_epi8(qx);
    for (int r = 0; r < R; ++r) {
      const __m512i qy = join(loadu256(codes(y[r], i)), loadu256(codes(y[r], i + 1)));
      // |x| (unsigned) times y with x's sign.
      const __m512i sy = _mm512_mask_sub_epi8(qy, neg, _mm512_setzero_si512(), qy);
      const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ax, sy);
      const __m512 d = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(scale(y[r], i)), _mm512_set1_ps(scale(y[r], i + 1)));
      acc[r] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float sum = _mm512_reduce_add_ps(acc[r]);
    for (int64_t j = i; j < nb; ++j) {
      const __m256i qx = loadu256(x[j].qs), qy = loadu256(codes(y[r], j));
      const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx));
      const __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(p, p), _mm256_hadd_epi32(p, p));
      sum += scale(y[r], j) * float(_mm256_extract_epi32(s, 0) + _mm256_extract_epi32(s, 4));
    }
    out[size_t(r) * out_stride] = sum;
  }
}

QWEN36_AVX512 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// For a byte shuffle of a register holding 8 scales (bytes 0-7) in each 128-bit lane: chunk c's
// int16 scales, sc[2c] in the low 256 bits (sub-block 2c's 16 pair sums of maddubs) and
// sc[2c + 1] in the high 256; index bytes with the top bit set give the zero high bytes.
QWEN36_AVX512 inline __m512i k_chunk_scale_index(int c) {
  const __m128i lo = _mm_set1_epi16(int16_t(0x8000 | (2 * c))), hi = _mm_set1_epi16(int16_t(0x8000 | (2 * c + 1)));
  return join(_mm256_set_m128i(lo, lo), _mm256_set_m128i(hi, hi));
}

// Q4_K and Q5_K (the 5th bit from qh: bits 2c and 2c + 1 of each byte for chunk c) against Q8_K
// activations (the sub-blocks' scaled integer sums add up, one float multiply per super-block)
// or per-32 ones (chunk c's 16 int32 lanes are groups 2c and 2c + 1: times the activations'
// dpair[c], summed per super-block, then one multiply by its d).
template <typename Block, typename Act, int R>
QWEN36_AVX512 void k_nibbles_rows(const void* w, const void* a, size_t a_stride, int64_t n, float* out,
                                  size_t out_stride) {
  constexpr bool kFifthBit = std::is_same_v<Block, BlockQ5_K>, kG32 = std::is_same_v<Act, BlockQ8G32>;
  const auto* x = static_cast<const Block*>(w);
  const Act* y[R];
  for (int r = 0; r < R; ++r) y[r] = act_row<Act>(a, a_stride, r);
  const __m256i low4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  const __m512i idx[4] = {k_chunk_scale_index(0), k_chunk_scale_index(1), k_chunk_scale_index(2),
                          k_chunk_scale_index(3)};
  // Float accumulation stays in vectors; one horizontal sum per row, not per block.
  __m512 acc[R];
  __m256 acc_m[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps(), acc_m[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const __m128i sm = k_scales_mins(x[i].scales);
    const __m512i sc = _mm512_broadcast_i32x4(sm);
    for (int r = 0; r < R; ++r) {
      if constexpr (kG32) {
        const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8)));
        acc_m[r] = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(x[i].dmin)), _mm256_mul_ps(m, _mm256_loadu_ps(y[r][i].ds)),
                                   acc_m[r]);
      } else {
        acc_m[r] = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(x[i].dmin) * y[r][i].d),
                                   _mm256_cvtepi32_ps(k_mins_dot(sm, y[r][i].bsums)), acc_m[r]);
      }
    }
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFifthBit) qh = loadu256(x[i].qh);
    __m512 blk[R];
    __m512i sumi[R];
    for (int r = 0; r < R; ++r) blk[r] = _mm512_setzero_ps(), sumi[r] = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      // 64 values: low nibbles (sub-block 2c) then high nibbles (2c+1), as the activations lie.
      const __m256i q = loadu256(x[i].qs + 32 * c);
      __m256i lo = _mm256_and_si256(q, low4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
      if constexpr (kFifthBit) {
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
      }
      const __m512i codes = join(lo, hi), scales = _mm512_shuffle_epi8(sc, idx[c]);
      for (int r = 0; r < R; ++r) {
        const __m512i p = _mm512_maddubs_epi16(codes, _mm512_loadu_si512(y[r][i].qs + 64 * c));
        if constexpr (kG32) {
          const __m512i s = _mm512_dpwssd_epi32(_mm512_setzero_si512(), p, scales);
          blk[r] = _mm512_fmadd_ps(_mm512_loadu_ps(y[r][i].dpair[c]), _mm512_cvtepi32_ps(s), blk[r]);
        } else {
          sumi[r] = _mm512_dpwssd_epi32(sumi[r], p, scales);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      if constexpr (kG32)
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(x[i].d)), blk[r], acc[r]);
      else
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(x[i].d) * y[r][i].d), _mm512_cvtepi32_ps(sumi[r]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[size_t(r) * out_stride] = _mm512_reduce_add_ps(acc[r]) - hsum(acc_m[r]);
}

// For a byte shuffle of a register holding 8 int16 scales in each 128-bit lane: lane L gets
// scale first + L in all of its 8 words.
QWEN36_AVX512 inline __m512i q6_scale_index(int first) {
  auto word = [](int k) { return _mm_set1_epi16(int16_t((2 * k + 1) << 8 | 2 * k)); };
  return join(_mm256_set_m128i(word(first + 1), word(first)), _mm256_set_m128i(word(first + 3), word(first + 2)));
}

template <typename Act, int R>
QWEN36_AVX512 void q6_k_rows(const void* w, const void* a, size_t a_stride, int64_t n, float* out, size_t out_stride) {
  constexpr bool kG32 = std::is_same_v<Act, BlockQ8G32>;
  const auto* x = static_cast<const BlockQ6_K*>(w);
  const Act* y[R];
  for (int r = 0; r < R; ++r) y[r] = act_row<Act>(a, a_stride, r);
  const __m512i low4 = _mm512_set1_epi8(0x0F), three = _mm512_set1_epi8(3);
  // A half's 128 values as two 64-value vectors, [ql0 | ql1] low nibbles and high nibbles; the
  // 2 high bits of each come from qh shifted by 0 / 2 (low nibbles) and 4 / 6 (high nibbles).
  // With per-32 activations the 256-bit halves of each are one group: 4h, 4h + 1 (dpair[2h]) and
  // 4h + 2, 4h + 3 (dpair[2h + 1]).
  const __m512i shift_lo = join(_mm256_set1_epi16(0), _mm256_set1_epi16(2)),
                shift_hi = join(_mm256_set1_epi16(4), _mm256_set1_epi16(6));
  const __m512i idx_lo = q6_scale_index(0), idx_hi = q6_scale_index(4);
  __m512 acc[R];
  __m256 acc_off[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps(), acc_off[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales)));
    // The -32 of every value, applied once: 32 * sum_k sc[k] * (sum of the activations of 16-group k)
    // times the super-block's scale (Q8_K) or, lane j, group j's (per-32).
    __m256 dv[R];
    for (int r = 0; r < R; ++r) {
      if constexpr (kG32) {
        dv[r] = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(x[i].d)), _mm256_loadu_ps(y[r][i].d));
        acc_off[r] = _mm256_fmadd_ps(dv[r], _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, loadu256(y[r][i].hsums))),
                                     acc_off[r]);
      } else {
        dv[r] = _mm256_set1_ps(_cvtsh_ss(x[i].d) * y[r][i].d);
        acc_off[r] = _mm256_fmadd_ps(dv[r], _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, loadu256(y[r][i].bsums))),
                                     acc_off[r]);
      }
    }
    __m512 blk[R];
    __m512i sumi[R];
    for (int r = 0; r < R; ++r) blk[r] = _mm512_setzero_ps(), sumi[r] = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      const __m512i sc = _mm512_broadcast_i32x4(h ? _mm256_extracti128_si256(s16, 1) : _mm256_castsi256_si128(s16));
      const __m512i ql = _mm512_loadu_si512(x[i].ql + 64 * h);
      const __m512i qh = _mm512_broadcast_i64x4(loadu256(x[i].qh + 32 * h));
      const __m512i q01 = _mm512_or_si512(
          _mm512_and_si512(ql, low4), _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, shift_lo), three), 4));
      const __m512i q23 =
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                          _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, shift_hi), three), 4));
      const __m512i s_lo = _mm512_shuffle_epi8(sc, idx_lo), s_hi = _mm512_shuffle_epi8(sc, idx_hi);
      for (int r = 0; r < R; ++r) {
        const __m512i p01 = _mm512_maddubs_epi16(q01, _mm512_loadu_si512(y[r][i].qs + 128 * h));
        const __m512i p23 = _mm512_maddubs_epi16(q23, _mm512_loadu_si512(y[r][i].qs + 128 * h + 64));
        if constexpr (kG32) {
          const __m512i s01 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), p01, s_lo);
          const __m512i s23 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), p23, s_hi);
          blk[r] = _mm512_fmadd_ps(_mm512_loadu_ps(y[r][i].dpair[2 * h]), _mm512_cvtepi32_ps(s01), blk[r]);
          blk[r] = _mm512_fmadd_ps(_mm512_loadu_ps(y[r][i].dpair[2 * h + 1]), _mm512_cvtepi32_ps(s23), blk[r]);
        } else {
          sumi[r] = _mm512_dpwssd_epi32(sumi[r], p01, s_lo);
          sumi[r] = _mm512_dpwssd_epi32(sumi[r], p23, s_hi);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      if constexpr (kG32)
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(x[i].d)), blk[r], acc[r]);
      else
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(_mm256_cvtss_f32(dv[r])), _mm512_cvtepi32_ps(sumi[r]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[size_t(r) * out_stride] = _mm512_reduce_add_ps(acc[r]) - 32.0f * hsum(acc_off[r]);
}

// The table's one-row form of a rows kernel.
template <void (*Rows)(const void*, const void*, size_t, int64_t, float*, size_t)>
QWEN36_AVX512 float one_row(const void* w, const void* a, int64_t n) {
  float out;
  Rows(w, a, 0, n, &out, 1);
  return out;
}

constexpr DotKernel kKernels[] = {{DType::Q8_0, one_row<q8_0_rows<BlockQ8_0, 1>>},
                                   {DType::Q4_K, one_row<k_nibbles_rows<BlockQ4_K, BlockQ8_K, 1>>},
                                   {DType::Q5_K, one_row<k_nibbles_rows<BlockQ5_K, BlockQ8_K, 1>>},
                                   {DType::Q6_K, one_row<q6_k_rows<BlockQ8_K, 1>>}};
constexpr DotKernel kG32Kernels[] = {{DType::Q8_0, one_row<q8_0_rows<BlockQ8G32, 1>>},
                                     {DType::Q4_K, one_row<k_nibbles_rows<BlockQ4_K, BlockQ8G32, 1>>},
                                     {DType::Q5_K, one_row<k_nibbles_rows<BlockQ5_K, BlockQ8G32, 1>>},
                                     {DType::Q6_K, one_row<q6_k_rows<BlockQ8G32, 1>>}};
constexpr Dot4Kernel k4Kernels[] = {{DType::Q8_0, q8_0_rows<BlockQ8_0, 4>},
                                    {DType::Q4_K, k_nibbles_rows<BlockQ4_K, BlockQ8_K, 4>},
                                    {DType::Q5_K, k_nibbles_rows<BlockQ5_K, BlockQ8_K, 4>},
                                    {DType::Q6_K, q6_k_rows<BlockQ8_K, 4>}};

}  // namespace

std::span<const DotKernel> avx512_dot_kernels() { return kKernels; }
std::span<const Dot4Kernel> avx512_dot4_kernels() { return k4Kernels; }
std::span<const DotKernel> avx512_g32_kernels() { return kG32Kernels; }

}  // namespace qwen36

#else

namespace qwen36 {
std::span<const DotKernel> avx512_dot_kernels() { return {}; }
std::span<const Dot4Kernel> avx512_dot4_kernels() { return {}; }
std::span<const DotKernel> avx512_g32_kernels() { return {}; }
}  // namespace qwen36

#endif
