// out[T, N] = x[T, K] · w[N, K]ᵀ on the CPU, for f32 / f16 / bf16 and block-quantized weights.
//
// Decode (T small) is bound by reading the weights once, so rows of w are split over the
// threads and each row is streamed exactly once: it is widened to f32 in a per-thread
// buffer that stays in L1/L2 while every activation row is dotted with it. Block-quantized
// rows are dotted with 8-bit activations instead (quant/cpu_dot.h), four tokens per decoding
// of the row where the kernel set has a four-row kernel; a token's result is the same bits
// whatever T is, so a verify pass reproduces decode steps exactly.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "quant/cpu_dot.h"
#include "quant/quant.h"

namespace qwen36::cpu {

namespace {

// The quantized tokens a matmul pass keeps in cache beside the weight row (L2: 1-2 MiB).
constexpr size_t kTokenChunkBytes = size_t{256} << 10;

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

inline __m256 load_f32x8(const float* p) { return _mm256_loadu_ps(p); }
inline float to_f32(float x) { return x; }
inline float to_f32(uint16_t x) { return bf16_to_f32(x); }

// Weight row (f32, or bf16 widened in registers) · f32 vector, four independent accumulators.
template <typename W, __m256 (*Load)(const W*)>
float dot(const W* w, const float* x, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(Load(w + i), _mm256_loadu_ps(x + i), s0);
    s1 = _mm256_fmadd_ps(Load(w + i + 8), _mm256_loadu_ps(x + i + 8), s1);
    s2 = _mm256_fmadd_ps(Load(w + i + 16), _mm256_loadu_ps(x + i + 16), s2);
    s3 = _mm256_fmadd_ps(Load(w + i + 24), _mm256_loadu_ps(x + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(Load(w + i), _mm256_loadu_ps(x + i), s0);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  for (; i < n; ++i) s += to_f32(w[i]) * x[i];
  return s;
}

float dot_f32(const float* a, const float* b, int64_t n) { return dot<float, load_f32x8>(a, b, n); }
// bf16 row · f32 vector without widening the row first (the decode GEMV path).
float dot_bf16(const uint16_t* w, const float* x, int64_t n) { return dot<uint16_t, load_bf16x8>(w, x, n); }

// out[t * ldo + r] = w_r · x_t for r < 4 and every t < T; w holds 4 consecutive rows of K.
void tile_4rows(const float* w, int64_t K, const float* x, int64_t T, float* out, int64_t ldo) {
  const float* w0 = w;
  const float* w1 = w + K;
  const float* w2 = w + 2 * K;
  const float* w3 = w + 3 * K;
  const int64_t K8 = K / 8 * 8;
  int64_t t = 0;
  for (; t + 3 <= T; t += 3) {
    const float* x0 = x + t * K;
    const float* x1 = x0 + K;
    const float* x2 = x1 + K;
    __m256 acc[12];
    for (auto& a : acc) a = _mm256_setzero_ps();
    for (int64_t k = 0; k < K8; k += 8) {
      const __m256 a0 = _mm256_loadu_ps(x0 + k), a1 = _mm256_loadu_ps(x1 + k), a2 = _mm256_loadu_ps(x2 + k);
      const __m256 b[4] = {_mm256_loadu_ps(w0 + k), _mm256_loadu_ps(w1 + k), _mm256_loadu_ps(w2 + k),
                           _mm256_loadu_ps(w3 + k)};
      for (int r = 0; r < 4; ++r) {
        acc[r] = _mm256_fmadd_ps(b[r], a0, acc[r]);
        acc[4 + r] = _mm256_fmadd_ps(b[r], a1, acc[4 + r]);
        acc[8 + r] = _mm256_fmadd_ps(b[r], a2, acc[8 + r]);
      }
    }
    const float* xs[3] = {x0, x1, x2};
    const float* ws[4] = {w0, w1, w2, w3};
    for (int j = 0; j < 3; ++j)
      for (int r = 0; r < 4; ++r) {
        float v = hsum(acc[j * 4 + r]);
        for (int64_t k = K8; k < K; ++k) v += ws[r][k] * xs[j][k];
        out[(t + j) * ldo + r] = v;
      }
  }
  for (; t < T; ++t)
    for (int r = 0; r < 4; ++r) out[t * ldo + r] = dot_f32(w + r * K, x + t * K, K);
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
  // Checked here, outside the parallel regions: an exception must not escape an OpenMP region.
  QWEN36_CHECK(w.dtype == DType::F32 || w.dtype == DType::F16 || w.dtype == DType::BF16 || dtype_is_quantized(w.dtype),
               "matmul: weight dtype {} is not supported by the CPU backend", dtype_name(w.dtype));
  const float* xp = x.as<const float>();
  float* op = out.as<float>();
  if (dtype_is_quantized(w.dtype) && dot_activation_type(w.dtype) == DType::F32) {
    // The Hugging Face checkpoint types (quant/hf_blocks.h) keep f32 activations: decode dots
    // each row in place, prefill widens rows through the tile below (weight_row_to_f32).
    if (T <= 2) {
#pragma omp parallel for schedule(static)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t t = 0; t < T; ++t) op[t * N + n] = dot_row(w.dtype, w.row(n), xp + t * K, K);
      return;
    }
  } else if (dtype_is_quantized(w.dtype)) {
    // Block-quantized weights are multiplied the way the format is meant to be used: the
    // activations are quantized once (Q8_0 / Q8_K) and every row is an integer dot product.
    // Each weight row meets the tokens four at a time (dot_rows: one decoding of the row per
    // four), the tokens taken in chunks whose quantized rows stay in L2 while every weight row
    // passes over them.
    const DType at = dot_activation_type(w.dtype);
    const size_t arow = dtype_row_bytes(at, K);
    // Kept between calls: a fresh prefill-sized buffer is fresh pages, faulted in on every call.
    // (The caller's buffer: inside the parallel region below `xq` would name each thread's own.)
    thread_local std::vector<std::byte> xq;
    if (xq.size() < size_t(T) * arow) xq.resize(size_t(T) * arow);
    std::byte* const xqp = xq.data();
    for (int64_t t = 0; t < T; ++t) quantize_activation(at, xp + t * K, xqp + size_t(t) * arow, K);
    const int64_t chunk = std::max<int64_t>(4, int64_t(kTokenChunkBytes / arow) / 4 * 4);
#pragma omp parallel
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
      const int64_t rows = std::min(chunk, T - t0);
#pragma omp for schedule(static)
      for (int64_t n = 0; n < N; ++n)
        dot_rows(w.dtype, w.row(n), xqp + size_t(t0) * arow, arow, rows, K, op + t0 * N + n, size_t(N));
    }
    return;
  }
  if (w.dtype == DType::BF16 && T <= 2) {
    const uint16_t* wp = w.as<const uint16_t>();
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t t = 0; t < T; ++t) op[t * N + n] = dot_bf16(wp + n * K, xp + t * K, K);
    return;
  }
  if (w.dtype == DType::F32 && T <= 2) {
    const float* wp = w.as<const float>();
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t t = 0; t < T; ++t) op[t * N + n] = dot_f32(wp + n * K, xp + t * K, K);
    return;
  }
  // Prefill: widen 4 weight rows at a time (f32 rows are read in place), then a 4-row ×
  // 3-token register tile reuses every loaded vector several times (12 accumulators fit the
  // 16 AVX2 registers).
  const int64_t N4 = N / 4 * 4;
  const float* w32 = w.dtype == DType::F32 ? w.as<const float>() : nullptr;
#pragma omp parallel
  {
    std::vector<float> rows(w32 ? 0 : size_t(4 * K + 8));
    // Rows n .. n + count − 1 of w as f32, contiguous.
    auto f32_rows = [&](int64_t n, int count) -> const float* {
      if (w32) return w32 + n * K;
      for (int r = 0; r < count; ++r) weight_row_to_f32(w, n + r, rows.data() + r * K);
      return rows.data();
    };
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N4; n += 4) tile_4rows(f32_rows(n, 4), K, xp, T, op + n, N);
#pragma omp for schedule(static)
    for (int64_t n = N4; n < N; ++n) {
      const float* row = f32_rows(n, 1);
      for (int64_t t = 0; t < T; ++t) op[t * N + n] = dot_f32(row, xp + t * K, K);
    }
  }
}

}  // namespace qwen36::cpu
