// Per-32 int8 activations (the CUDA backend's): quantization, the scalar kernels, dispatch and
// the reference definition. SIMD kernels: cpu_dot_avx2.cpp, cpu_dot_avx512.cpp (avx*_g32_kernels).
#include "quant/cpu_dot_g32.h"

#include <bit>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "quant/blocks.h"
#include "quant/cpu_dot_kernels.h"
#include "quant/quant.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace qwen36 {

bool dot_g32_supported(DType weight) {
  return weight == DType::Q4_K || weight == DType::Q5_K || weight == DType::Q6_K || weight == DType::Q8_0;
}

namespace {

// One group's sums and scales once its codes are in place.
void finish_group(BlockQ8G32& b, int j, float d, int sum0, int sum1) {
  b.d[j] = d;
  b.ds[j] = d * float(sum0 + sum1);
  b.hsums[2 * j] = int16_t(sum0);
  b.hsums[2 * j + 1] = int16_t(sum1);
  for (int l = 0; l < 8; ++l) b.dpair[j / 2][8 * (j % 2) + l] = d;
}

}  // namespace

// quantize_quad's arithmetic, value for value: the same f32 division for d and for 1 / d's
// stand-in 127 / amax, and the code as the fused v · inv + 1.5 · 2^23 (one rounding, to nearest
// even) read back from the float's low bits. std::fma and the vector FMA are that single
// rounding on any CPU; the maximum is exact in any order. The AVX2 form takes a group in four
// vectors (a decode pass quantizes its 2,048-value row on one thread while the others wait:
// 0.7 µs instead of 15 for the scalar loop, development machine).
void quantize_activation_g32(const float* x, void* dst, int64_t n) {
  QWEN36_CHECK(n % 256 == 0, "quantize_activation_g32: {} values is not a multiple of 256", n);
  auto* b = static_cast<BlockQ8G32*>(dst);
  for (int64_t i = 0; i < n / 256; ++i, x += 256) {
    for (int j = 0; j < 8; ++j) {
      const float* v = x + 32 * j;
#if defined(__AVX2__) && defined(__FMA__)
      __m256 q[4], amax8 = _mm256_setzero_ps();
      const __m256 sign = _mm256_set1_ps(-0.0f);
      for (int k = 0; k < 4; ++k) {
        q[k] = _mm256_loadu_ps(v + 8 * k);
        amax8 = _mm256_max_ps(amax8, _mm256_andnot_ps(sign, q[k]));
      }
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
      const float d = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      __m256i c[4];
      for (int k = 0; k < 4; ++k)
        c[k] = _mm256_sub_epi32(
            _mm256_castps_si256(_mm256_fmadd_ps(q[k], _mm256_set1_ps(inv), _mm256_set1_ps(12582912.0f))),
            _mm256_set1_epi32(0x4B400000));
      // int32 → int8 (|code| ≤ 127: no saturation), the packs' lane interleave undone.
      const __m256i p8 = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(b[i].qs + 32 * j),
                          _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
      auto hsum = [](__m256i a) {
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        return _mm_cvtsi128_si32(_mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1)));
      };
      finish_group(b[i], j, d, hsum(_mm256_add_epi32(c[0], c[1])), hsum(_mm256_add_epi32(c[2], c[3])));
#else
      float amax = 0.0f;
      for (int l = 0; l < 32; ++l) amax = std::fmax(amax, std::fabs(v[l]));
      const float d = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      int sum[2] = {0, 0};
      for (int l = 0; l < 32; ++l) {
        const int q = std::bit_cast<int32_t>(std::fma(v[l], inv, 12582912.0f)) - 0x4B400000;
        b[i].qs[32 * j + l] = int8_t(q);
        sum[l / 16] += q;
      }
      finish_group(b[i], j, d, sum[0], sum[1]);
#endif
    }
  }
}

namespace {

// ---- scalar kernels: each 32-group's integer sum exact, then scaled in f32 ----

// Code l of sub-block j (0..7) of a Q4_K / Q5_K super-block: chunk j / 2, low or high nibble.
template <typename Block>
int k_code(const Block& b, int j, int l) {
  const uint8_t byte = b.qs[32 * (j / 2) + l];
  int q = (j & 1) ? byte >> 4 : byte & 15;
  if constexpr (std::is_same_v<Block, BlockQ5_K>) q |= ((b.qh[l] >> j) & 1) << 4;
  return q;
}

template <typename Block>
float dot_k_nibbles_scalar(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const Block*>(w);
  const auto* y = static_cast<const BlockQ8G32*>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / 256; ++i) {
    float acc = 0.0f, acc_m = 0.0f;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      unpack_k_scale_min(j, x[i].scales, sc, m);
      int isum = 0;
      for (int l = 0; l < 32; ++l) isum += k_code(x[i], j, l) * y[i].qs[32 * j + l];
      acc += y[i].d[j] * float(int(sc) * isum);
      acc_m += float(m) * y[i].ds[j];
    }
    sum += f16_to_f32(x[i].d) * acc - f16_to_f32(x[i].dmin) * acc_m;
  }
  return sum;
}

// Value v (0..255) of a Q6_K super-block, 0..63 (the −32 comes from the activation sums).
int q6_code(const BlockQ6_K& b, int v) {
  const int h = v / 128, r = v % 128, quarter = r / 32, l = r % 32;
  const uint8_t low = b.ql[64 * h + l + 32 * (quarter & 1)];
  const int lo = quarter >= 2 ? low >> 4 : low & 15;
  return lo | (((b.qh[32 * h + l] >> (2 * quarter)) & 3) << 4);
}

float dot_q6_k_scalar(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ6_K*>(w);
  const auto* y = static_cast<const BlockQ8G32*>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / 256; ++i) {
    float acc = 0.0f;
    for (int j = 0; j < 8; ++j) {
      int isum = 0;
      for (int k = 2 * j; k < 2 * j + 2; ++k) {
        int part = 0;
        for (int l = 16 * k; l < 16 * k + 16; ++l) part += q6_code(x[i], l) * y[i].qs[l];
        isum += x[i].scales[k] * (part - 32 * y[i].hsums[k]);
      }
      acc += y[i].d[j] * float(isum);
    }
    sum += f16_to_f32(x[i].d) * acc;
  }
  return sum;
}

float dot_q8_0_scalar(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ8_0*>(w);
  const auto* y = static_cast<const BlockQ8G32*>(a);
  float sum = 0.0f;
  for (int64_t b = 0; b < n / 32; ++b) {
    const BlockQ8G32& g = y[b / 8];
    const int j = int(b % 8);
    int isum = 0;
    for (int l = 0; l < 32; ++l) isum += x[b].qs[l] * g.qs[32 * j + l];
    sum += f16_to_f32(x[b].d) * g.d[j] * float(isum);
  }
  return sum;
}

DotTable make_table() {
  DotTable t;
  const DotKernel scalar[] = {{DType::Q4_K, dot_k_nibbles_scalar<BlockQ4_K>},
                              {DType::Q5_K, dot_k_nibbles_scalar<BlockQ5_K>},
                              {DType::Q6_K, dot_q6_k_scalar},
                              {DType::Q8_0, dot_q8_0_scalar}};
  t.add(scalar, "scalar");
  const DotIsa isa = dot_isa();
  if (isa == DotIsa::Scalar) return t;
  t.add(avx2_g32_kernels(), "avx2");
  if (isa == DotIsa::Avx512Vnni) t.add(avx512_g32_kernels(), "avx512vnni");
  return t;
}

const DotTable& table() {
  static const DotTable t = make_table();
  return t;
}

void check_args(DType wt, int64_t n) {
  QWEN36_CHECK(dot_g32_supported(wt), "no per-32 int8 activation dot product for weights of type {}", dtype_name(wt));
  QWEN36_CHECK(n >= 0 && n % 256 == 0, "dot_row_g32: {} elements is not a multiple of 256", n);
}

}  // namespace

float dot_row_g32(DType wt, const void* w, const void* a, int64_t n) {
  check_args(wt, n);
  return table().fn[int(wt)](w, a, n);
}

double dot_row_g32_reference(DType wt, const void* w, const void* a, int64_t n) {
  check_args(wt, n);
  std::vector<float> wf(static_cast<size_t>(n));
  dequantize_row(wt, w, wf.data(), n);
  const auto* y = static_cast<const BlockQ8G32*>(a);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += double(wf[size_t(i)]) * y[i / 256].d[(i % 256) / 32] * y[i / 256].qs[i % 256];
  return sum;
}

std::string_view dot_g32_kernel_name(DType wt) {
  check_args(wt, 0);
  return table().name[int(wt)];
}

}  // namespace qwen36
