// Embedding, RMSNorm variants and elementwise ops of the CPU backend.
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"

namespace qwen36::cpu {

namespace {
void check_f32(const Tensor& t, const char* what) {
  QWEN36_CHECK(t.dtype == DType::F32, "{}: expected f32, got {}", what, t.shape_str());
}
void check_same(const Tensor& a, const Tensor& b, const char* what) {
  QWEN36_CHECK(a.numel() == b.numel(), "{}: {} vs {}", what, a.shape_str(), b.shape_str());
}
// o = x · w / rms(x) for a row x of D whose sum of squares is ss.
void scale_row(const float* x, float ss, int64_t D, float eps, const float* w, float* o) {
  const float inv = 1.0f / std::sqrt(ss / float(D) + eps);
  for (int64_t i = 0; i < D; ++i) o[i] = x[i] * inv * w[i];
}
}  // namespace

void embed(const Tensor& table, std::span<const int32_t> ids, Tensor& out) {
  const int64_t D = table.cols(), V = table.rows();
  check_f32(out, "embed");
  QWEN36_CHECK(out.numel() == int64_t(ids.size()) * D, "embed: out {} for {} ids of width {}", out.shape_str(),
               ids.size(), D);
  for (size_t t = 0; t < ids.size(); ++t) {
    QWEN36_CHECK(ids[t] >= 0 && ids[t] < V, "token id {} is outside the vocabulary (0..{})", ids[t], V - 1);
    weight_row_to_f32(table, ids[t], out.as<float>() + int64_t(t) * D);
  }
}

void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  const int64_t D = w.numel(), R = x.numel() / D;
  check_f32(x, "rms_norm");
  check_f32(w, "rms_norm weight");
  check_same(x, out, "rms_norm");
  QWEN36_CHECK(x.numel() % D == 0, "rms_norm: {} is not rows of {}", x.shape_str(), D);
  const float* wp = w.as<const float>();
#pragma omp parallel for if (R > 8)
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x.as<const float>() + r * D;
    float* o = out.as<float>() + r * D;
    float ss = 0;
    for (int64_t i = 0; i < D; ++i) ss += xr[i] * xr[i];
    scale_row(xr, ss, D, eps, wp, o);
  }
}

// y_out = y + delta and out = its norm, one pass over y and delta per row: the same float
// operations in the same order as add then rms_norm (bitwise the same), without the copy of y
// that the composition needs when y_out is another buffer.
void add_rms_norm_into(const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w, float eps, Tensor& out) {
  const int64_t D = w.numel(), R = y.numel() / D;
  check_f32(y, "add_rms_norm");
  check_f32(delta, "add_rms_norm delta");
  check_f32(y_out, "add_rms_norm output");
  check_f32(w, "add_rms_norm weight");
  check_same(y, delta, "add_rms_norm delta");
  check_same(y, y_out, "add_rms_norm output");
  check_same(y, out, "add_rms_norm norm");
  QWEN36_CHECK(y.numel() % D == 0, "add_rms_norm: {} is not rows of {}", y.shape_str(), D);
  const float* wp = w.as<const float>();
#pragma omp parallel for if (R > 8)
  for (int64_t r = 0; r < R; ++r) {
    const float* yr = y.as<const float>() + r * D;
    const float* dr = delta.as<const float>() + r * D;
    float* v = y_out.as<float>() + r * D;
    float* o = out.as<float>() + r * D;
    float ss = 0;
    for (int64_t i = 0; i < D; ++i) {
      v[i] = yr[i] + dr[i];  // y_out may be y: element i is read before it is written
      ss += v[i] * v[i];
    }
    scale_row(v, ss, D, eps, wp, o);
  }
}

void gated_rms_norm(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Tensor& out) {
  const int64_t D = w.numel(), R = x.numel() / D;
  check_f32(x, "gated_rms_norm");
  check_same(x, z, "gated_rms_norm gate");
  check_same(x, out, "gated_rms_norm");
  const float* wp = w.as<const float>();
#pragma omp parallel for if (R > 8)
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x.as<const float>() + r * D;
    const float* zr = z.as<const float>() + r * D;
    float* o = out.as<float>() + r * D;
    float ss = 0;
    for (int64_t i = 0; i < D; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / float(D) + eps);
    for (int64_t i = 0; i < D; ++i) o[i] = wp[i] * (xr[i] * inv) * silu(zr[i]);
  }
}

void add(Tensor& y, const Tensor& x) {
  check_same(y, x, "add");
  float* yp = y.as<float>();
  const float* xp = x.as<const float>();
  const int64_t n = y.numel();
  for (int64_t i = 0; i < n; ++i) yp[i] += xp[i];
}

void copy_cols(const Tensor& src, int64_t src_col0, Tensor& dst, int64_t dst_col0, int64_t width) {
  const int64_t R = src.rows();
  QWEN36_CHECK(dst.rows() == R && src_col0 >= 0 && dst_col0 >= 0 && src_col0 + width <= src.cols() &&
                   dst_col0 + width <= dst.cols(),
               "copy_cols: {}[:, {}:+{}] → {}[:, {}:]", src.shape_str(), src_col0, width, dst.shape_str(), dst_col0);
  for (int64_t r = 0; r < R; ++r)
    std::memcpy(dst.as<float>() + r * dst.cols() + dst_col0, src.as<const float>() + r * src.cols() + src_col0,
                size_t(width) * sizeof(float));
}

void get_rows(const Tensor& src, std::span<const int32_t> rows, Tensor& dst) {
  const int64_t D = src.cols();
  QWEN36_CHECK(dst.numel() == int64_t(rows.size()) * D, "get_rows: {} rows of {} into {}", rows.size(),
               src.shape_str(), dst.shape_str());
  for (size_t i = 0; i < rows.size(); ++i) {
    QWEN36_CHECK(rows[i] >= 0 && rows[i] < src.rows(), "get_rows: row {} out of range", rows[i]);
    std::memcpy(dst.as<float>() + int64_t(i) * D, src.as<const float>() + rows[i] * D, size_t(D) * sizeof(float));
  }
}

void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  check_same(gate, up, "swiglu");
  check_same(gate, out, "swiglu");
  const float* g = gate.as<const float>();
  const float* u = up.as<const float>();
  float* o = out.as<float>();
  const int64_t n = out.numel();
  for (int64_t i = 0; i < n; ++i) o[i] = silu(g[i]) * u[i];
}

void sigmoid_mul(Tensor& x, const Tensor& gate) {
  check_same(x, gate, "sigmoid_mul");
  float* xp = x.as<float>();
  const float* g = gate.as<const float>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) xp[i] *= sigmoid(g[i]);
}

void add_sigmoid_scaled(Tensor& y, const Tensor& x, const Tensor& s) {
  check_same(y, x, "add_sigmoid_scaled");
  const int64_t T = s.numel(), D = y.numel() / T;
  QWEN36_CHECK(D * T == y.numel(), "add_sigmoid_scaled: {} rows vs {}", T, y.shape_str());
  for (int64_t t = 0; t < T; ++t) {
    const float a = sigmoid(s.as<const float>()[t]);
    float* yr = y.as<float>() + t * D;
    const float* xr = x.as<const float>() + t * D;
    for (int64_t i = 0; i < D; ++i) yr[i] += a * xr[i];
  }
}

}  // namespace qwen36::cpu
