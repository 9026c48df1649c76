// out[T, N] = x[T, K] · w[N, K]ᵀ on the CPU, for f32 / f16 / bf16 weights.
//
// Decode (T small) is bound by reading the weights once, so rows of w are split over the
// threads and each row is streamed exactly once: it is widened to f32 in a per-thread
// buffer that stays in L1/L2 while every activation row is dotted with it.
#include <immintrin.h>

#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "quant/cpu_dot.h"
#include "quant/quant.h"

namespace qwen36::cpu {

namespace {

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

inline __m256 load_bf16x8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

float dot_f32(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// bf16 row · f32 vector without widening the row first (the decode GEMV path).
float dot_bf16(const uint16_t* w, const float* x, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(load_bf16x8(w + i), _mm256_loadu_ps(x + i), s0);
    s1 = _mm256_fmadd_ps(load_bf16x8(w + i + 8), _mm256_loadu_ps(x + i + 8), s1);
    s2 = _mm256_fmadd_ps(load_bf16x8(w + i + 16), _mm256_loadu_ps(x + i + 16), s2);
    s3 = _mm256_fmadd_ps(load_bf16x8(w + i + 24), _mm256_loadu_ps(x + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(load_bf16x8(w + i), _mm256_loadu_ps(x + i), s0);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  for (; i < n; ++i) s += bf16_to_f32(w[i]) * x[i];
  return s;
}

}  // namespace

void weight_row_to_f32(const Tensor& w, int64_t row, float* out) {
  const int64_t K = w.cols();
  switch (w.dtype) {
    case DType::F32: {
      const float* p = w.as<const float>() + row * K;
      std::copy(p, p + K, out);
      return;
    }
    case DType::BF16: {
      const uint16_t* p = w.as<const uint16_t>() + row * K;
      int64_t i = 0;
      for (; i + 8 <= K; i += 8) _mm256_storeu_ps(out + i, load_bf16x8(p + i));
      for (; i < K; ++i) out[i] = bf16_to_f32(p[i]);
      return;
    }
    case DType::F16: {
      const uint16_t* p = w.as<const uint16_t>() + row * K;
      int64_t i = 0;
      for (; i + 8 <= K; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i))));
      for (; i < K; ++i) out[i] = f16_to_f32(p[i]);
      return;
    }
    default:
      QWEN36_CHECK(dtype_is_quantized(w.dtype), "matmul: weight dtype {} is not supported by the CPU backend",
                   dtype_name(w.dtype));
      dequantize_row(w.dtype, w.row(row), out, K);
  }
}

void matmul(const Tensor& x, const Tensor& w, Tensor& out) {
  const int64_t K = w.cols(), N = w.rows(), T = x.numel() / K;
  QWEN36_CHECK(x.dtype == DType::F32 && out.dtype == DType::F32, "matmul: activations must be f32");
  QWEN36_CHECK(x.cols() == K && out.numel() == T * N, "matmul: x {} · w {} → out {}", x.shape_str(), w.shape_str(),
               out.shape_str());
  const float* xp = x.as<const float>();
  float* op = out.as<float>();
  if (dtype_is_quantized(w.dtype)) {
    // Block-quantized weights are multiplied the way the format is meant to be used: the
    // activations are quantized once (Q8_0 / Q8_K) and every row is an integer dot product.
    const DType at = dot_activation_type(w.dtype);
    const size_t arow = dtype_row_bytes(at, K);
    std::vector<std::byte> xq(size_t(T) * arow);
    for (int64_t t = 0; t < T; ++t) quantize_activation(at, xp + t * K, xq.data() + size_t(t) * arow, K);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t t = 0; t < T; ++t) op[t * N + n] = dot_row(w.dtype, w.row(n), xq.data() + size_t(t) * arow, K);
    return;
  }
  if (w.dtype == DType::BF16 && T <= 2) {
    const uint16_t* wp = w.as<const uint16_t>();
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t t = 0; t < T; ++t) op[t * N + n] = dot_bf16(wp + n * K, xp + t * K, K);
    return;
  }
  if (w.dtype == DType::F32) {
    const float* wp = w.as<const float>();
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t t = 0; t < T; ++t) op[t * N + n] = dot_f32(wp + n * K, xp + t * K, K);
    return;
  }
#pragma omp parallel
  {
    std::vector<float> row(size_t(K + 8));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      weight_row_to_f32(w, n, row.data());
      for (int64_t t = 0; t < T; ++t) op[t * N + n] = dot_f32(row.data(), xp + t * K, K);
    }
  }
}

}  // namespace qwen36::cpu
