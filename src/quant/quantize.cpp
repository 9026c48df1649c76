// Reference quantization into the ggml block layouts. Scales are searched per block with a
// few candidates and a least-squares refit (not llama.cpp's exact search, so the bytes differ
// from llama-quantize, but the format and the error level are the same).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace qwen36 {

namespace {

int nearest(float x) { return int(std::nearbyint(x)); }
uint16_t f2h(float f) { return f32_to_f16(f); }
float h2f(uint16_t h) { return f16_to_f32(h); }

// Value with the largest magnitude (keeps its sign).
float signed_absmax(const float* x, int n) {
  float amax = 0, vmax = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      vmax = x[i];
    }
  return vmax;
}

// Symmetric fit x ≈ s * q, q in [qmin, qmax]; s is stored as f16 by the caller via `round_s`.
void quantize_symmetric(const float* x, int n, float s, int qmin, int qmax, int* q) {
  const float is = s != 0 ? 1.0f / s : 0.0f;
  for (int i = 0; i < n; ++i) q[i] = std::clamp(nearest(x[i] * is), qmin, qmax);
}

// ---- classic 32-element types ----

void q4_0(const float* x, BlockQ4_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    // The extreme value maps to -8, using the asymmetric end of the 4-bit range.
    b[i].d = f2h(signed_absmax(x, kQK) / -8.0f);
    int q[kQK];
    quantize_symmetric(x, kQK, h2f(b[i].d), -8, 7, q);
    for (int j = 0; j < 16; ++j) b[i].qs[j] = uint8_t((q[j] + 8) | ((q[j + 16] + 8) << 4));
  }
}

void q5_0(const float* x, BlockQ5_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    b[i].d = f2h(signed_absmax(x, kQK) / -16.0f);
    int q[kQK];
    quantize_symmetric(x, kQK, h2f(b[i].d), -16, 15, q);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      const int a = q[j] + 16, c = q[j + 16] + 16;
      b[i].qs[j] = uint8_t((a & 15) | ((c & 15) << 4));
      qh |= uint32_t(a >> 4) << j | uint32_t(c >> 4) << (j + 16);
    }
    std::memcpy(b[i].qh, &qh, 4);
  }
}

// Affine x ≈ d * q + m with q in [0, qmax] (Q4_1 / Q5_1).
template <typename Block>
void affine_classic(const float* x, Block& b, int qmax, int* q) {
  float lo = x[0], hi = x[0];
  for (int j = 1; j < kQK; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
  }
  b.d = f2h((hi - lo) / float(qmax));
  b.m = f2h(lo);
  const float d = h2f(b.d), m = h2f(b.m), id = d != 0 ? 1.0f / d : 0.0f;
  for (int j = 0; j < kQK; ++j) q[j] = std::clamp(nearest((x[j] - m) * id), 0, qmax);
}

void q4_1(const float* x, BlockQ4_1* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    int q[kQK];
    affine_classic(x, b[i], 15, q);
    for (int j = 0; j < 16; ++j) b[i].qs[j] = uint8_t(q[j] | (q[j + 16] << 4));
  }
}

void q5_1(const float* x, BlockQ5_1* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    int q[kQK];
    affine_classic(x, b[i], 31, q);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      b[i].qs[j] = uint8_t((q[j] & 15) | ((q[j + 16] & 15) << 4));
      qh |= uint32_t(q[j] >> 4) << j | uint32_t(q[j + 16] >> 4) << (j + 16);
    }
    std::memcpy(b[i].qh, &qh, 4);
  }
}

void q8_0(const float* x, BlockQ8_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = f2h(d);
    for (int j = 0; j < kQK; ++j) b[i].qs[j] = int8_t(std::clamp(nearest(x[j] * id), -127, 127));
  }
}

// ---- K-quants ----

// Fits x ≈ s * q - m over n values with q in [0, qmax], s ≥ 0, m ≥ 0 (the K-quant form: the
// offset can only lower values). Tries several step sizes, refits s and m by least squares for
// each, and keeps the one with the smallest squared error.
void fit_scale_min(const float* x, int n, int qmax, float& s_out, float& m_out) {
  float lo = 0, hi = x[0];
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  s_out = 0;
  m_out = -lo;
  if (hi <= lo) return;
  float best = INFINITY;
  for (int k = -4; k <= 8; ++k) {
    float s = (hi - lo) / (float(qmax) + 0.25f * float(k));
    float m = -lo;
    for (int pass = 0; pass < 2; ++pass) {
      double sq = 0, sq2 = 0, sx = 0, sqx = 0;
      for (int i = 0; i < n; ++i) {
        const int q = std::clamp(nearest((x[i] + m) / s), 0, qmax);
        sq += q;
        sq2 += double(q) * q;
        sx += x[i];
        sqx += double(q) * x[i];
      }
      // y = s q + b minimises the error; the K-quant form needs b = -m ≤ 0.
      const double det = n * sq2 - sq * sq;
      double ns = det > 0 ? (n * sqx - sq * sx) / det : 0, bb = det > 0 ? (sx - ns * sq) / n : 0;
      if (bb > 0) {
        bb = 0;
        ns = sq2 > 0 ? sqx / sq2 : 0;
      }
      if (ns <= 0) break;
      s = float(ns);
      m = float(-bb);
    }
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const int q = std::clamp(nearest((x[i] + m) / s), 0, qmax);
      const double e = double(s) * q - m - x[i];
      err += e * e;
    }
    if (err < best) {
      best = float(err);
      s_out = s;
      m_out = m;
    }
  }
}

// Super-block scales of Q4_K / Q5_K: 8 (scale, min) pairs as 6-bit multiples of d and dmin.
// Returns the per-element q values (0..qmax) quantized with the rounded scales.
void k_affine(const float* x, int qmax, uint16_t& d_out, uint16_t& dmin_out, uint8_t* scales, int* q) {
  float s[8], m[8], smax = 0, mmax = 0;
  for (int j = 0; j < 8; ++j) {
    fit_scale_min(x + 32 * j, 32, qmax, s[j], m[j]);
    smax = std::max(smax, s[j]);
    mmax = std::max(mmax, m[j]);
  }
  d_out = f2h(smax / 63.0f);
  dmin_out = f2h(mmax / 63.0f);
  const float d = h2f(d_out), dmin = h2f(dmin_out);
  uint8_t ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    ls[j] = uint8_t(d > 0 ? std::clamp(nearest(s[j] / d), 0, 63) : 0);
    lm[j] = uint8_t(dmin > 0 ? std::clamp(nearest(m[j] / dmin), 0, 63) : 0);
  }
  std::memset(scales, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      scales[j] |= ls[j];
      scales[j + 4] |= lm[j];
    } else {
      scales[j + 4] = uint8_t((ls[j] & 15) | ((lm[j] & 15) << 4));
      scales[j - 4] |= uint8_t((ls[j] >> 4) << 6);
      scales[j] |= uint8_t((lm[j] >> 4) << 6);
    }
  }
  for (int j = 0; j < 8; ++j) {
    const float sj = d * ls[j], mj = dmin * lm[j];
    for (int i = 0; i < 32; ++i) q[32 * j + i] = sj > 0 ? std::clamp(nearest((x[32 * j + i] + mj) / sj), 0, qmax) : 0;
  }
}

void q4_k(const float* x, BlockQ4_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    int q[kQK_K];
    k_affine(x, 15, b[i].d, b[i].dmin, b[i].scales, q);
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) b[i].qs[32 * c + l] = uint8_t(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
  }
}

void q5_k(const float* x, BlockQ5_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    int q[kQK_K];
    k_affine(x, 31, b[i].d, b[i].dmin, b[i].scales, q);
    std::memset(b[i].qh, 0, sizeof b[i].qh);
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        const int lo = q[64 * c + l], hi = q[64 * c + 32 + l];
        b[i].qs[32 * c + l] = uint8_t((lo & 15) | ((hi & 15) << 4));
        b[i].qh[l] |= uint8_t(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
      }
    }
  }
}

// Best symmetric scale for x ≈ s * q, q in [qmin, qmax] (least-squares refit of a few candidates).
float fit_symmetric(const float* x, int n, int qmin, int qmax) {
  const float vmax = signed_absmax(x, n);
  if (vmax == 0) return 0;
  float best_s = vmax / float(qmin), best = INFINITY;
  for (int k = 0; k <= 8; ++k) {
    // Map the extreme value to qmin (negative end) or, for k odd, to qmax.
    float s = (k % 2 == 0) ? vmax / (float(qmin) + 0.5f * float(k / 2)) : vmax / (float(qmax) - 0.5f * float(k / 2));
    int q[kQK_K];
    quantize_symmetric(x, n, s, qmin, qmax, q);
    double sqx = 0, sq2 = 0;
    for (int i = 0; i < n; ++i) {
      sqx += double(q[i]) * x[i];
      sq2 += double(q[i]) * q[i];
    }
    if (sq2 > 0) s = float(sqx / sq2);
    quantize_symmetric(x, n, s, qmin, qmax, q);
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const double e = double(s) * q[i] - x[i];
      err += e * e;
    }
    if (err < best) {
      best = float(err);
      best_s = s;
    }
  }
  return best_s;
}

void q6_k(const float* x, BlockQ6_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float s[16], smax = 0;
    for (int j = 0; j < 16; ++j) {
      s[j] = fit_symmetric(x + 16 * j, 16, -32, 31);
      smax = std::max(smax, std::fabs(s[j]));
    }
    b[i].d = f2h(smax / 127.0f);
    const float d = h2f(b[i].d);
    int q[kQK_K];
    for (int j = 0; j < 16; ++j) {
      b[i].scales[j] = int8_t(d > 0 ? std::clamp(nearest(s[j] / d), -127, 127) : 0);
      quantize_symmetric(x + 16 * j, 16, d * b[i].scales[j], -32, 31, q + 16 * j);
    }
    for (int n = 0; n < 2; ++n) {
      for (int l = 0; l < 32; ++l) {
        const int* qq = q + 128 * n + l;
        const int q1 = qq[0] + 32, q2 = qq[32] + 32, q3 = qq[64] + 32, q4 = qq[96] + 32;
        b[i].ql[64 * n + l] = uint8_t((q1 & 15) | ((q3 & 15) << 4));
        b[i].ql[64 * n + l + 32] = uint8_t((q2 & 15) | ((q4 & 15) << 4));
        b[i].qh[32 * n + l] = uint8_t((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
      }
    }
  }
}

void q8_k(const float* x, BlockQ8_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float amax = 0;
    for (int j = 0; j < kQK_K; ++j) amax = std::max(amax, std::fabs(x[j]));
    b[i].d = amax / 127.0f;
    const float id = amax > 0 ? 127.0f / amax : 0.0f;
    for (int j = 0; j < kQK_K; ++j) b[i].qs[j] = int8_t(std::clamp(nearest(x[j] * id), -127, 127));
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += b[i].qs[16 * g + j];
      b[i].bsums[g] = int16_t(sum);
    }
  }
}

// ---- IQ4_XS ----

int nearest_iq4(float v) {
  int best = 0;
  float bd = std::fabs(v - float(kIQ4NLValues[0]));
  for (int k = 1; k < 16; ++k) {
    const float dist = std::fabs(v - float(kIQ4NLValues[k]));
    if (dist < bd) {
      bd = dist;
      best = k;
    }
  }
  return best;
}

float fit_iq4(const float* x) {
  const float vmax = signed_absmax(x, 32);
  if (vmax == 0) return 0;
  float best_s = vmax / -127.0f, best = INFINITY;
  for (int k = -4; k <= 4; ++k) {
    for (float end : {-127.0f, 113.0f}) {  // extreme value onto either end of the grid
      float s = vmax / (end + float(k) * (end < 0 ? 2.0f : -2.0f));
      for (int pass = 0; pass < 2; ++pass) {
        double sgx = 0, sg2 = 0;
        for (int i = 0; i < 32; ++i) {
          const float g = kIQ4NLValues[nearest_iq4(x[i] / s)];
          sgx += double(g) * x[i];
          sg2 += double(g) * g;
        }
        if (sg2 > 0) s = float(sgx / sg2);
      }
      double err = 0;
      for (int i = 0; i < 32; ++i) {
        const double e = double(s) * kIQ4NLValues[nearest_iq4(x[i] / s)] - x[i];
        err += e * e;
      }
      if (err < best) {
        best = float(err);
        best_s = s;
      }
    }
  }
  return best_s;
}

void iq4_xs(const float* x, BlockIQ4_XS* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float s[8];
    for (int j = 0; j < 8; ++j) s[j] = fit_iq4(x + 32 * j);
    const float smax = signed_absmax(s, 8);
    b[i].d = f2h(smax / -32.0f);  // ls - 32 spans [-32, 31]: the largest scale takes -32
    const float d = h2f(b[i].d);
    b[i].scales_h = 0;
    std::memset(b[i].scales_l, 0, sizeof b[i].scales_l);
    for (int ib = 0; ib < 8; ++ib) {
      const int ls = (d != 0 ? std::clamp(nearest(s[ib] / d), -32, 31) : 0) + 32;
      b[i].scales_l[ib / 2] |= uint8_t((ls & 15) << (4 * (ib % 2)));
      b[i].scales_h = uint16_t(b[i].scales_h | ((ls >> 4) << (2 * ib)));
      const float dl = d * float(ls - 32), idl = dl != 0 ? 1.0f / dl : 0.0f;
      const float* xs = x + 32 * ib;
      for (int j = 0; j < 16; ++j)
        b[i].qs[16 * ib + j] = uint8_t(nearest_iq4(xs[j] * idl) | (nearest_iq4(xs[j + 16] * idl) << 4));
    }
  }
}

}  // namespace

bool quantize_supported(DType t) {
  return t != DType::I32 && t != DType::U8 && t != DType::I64 && t != DType::W4_G32 && t != DType::W4_G128 &&
         t != DType::F8_B128 && t != DType::NVFP4_B64 && !dtype_is_tiled(t);
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  const int64_t be = dtype_block_elems(t);
  QWEN36_CHECK(n >= 0 && n % be == 0, "quantize_row: {} elements is not a multiple of the {} block size {}", n,
               dtype_name(t), be);
  const int64_t nb = n / be;
  switch (t) {
    case DType::F32: std::memcpy(dst, src, size_t(n) * 4); break;
    case DType::F16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = f32_to_f16(src[i]);
      break;
    }
    case DType::BF16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = f32_to_bf16(src[i]);
      break;
    }
    case DType::Q4_0: q4_0(src, static_cast<BlockQ4_0*>(dst), nb); break;
    case DType::Q4_1: q4_1(src, static_cast<BlockQ4_1*>(dst), nb); break;
    case DType::Q5_0: q5_0(src, static_cast<BlockQ5_0*>(dst), nb); break;
    case DType::Q5_1: q5_1(src, static_cast<BlockQ5_1*>(dst), nb); break;
    case DType::Q8_0: q8_0(src, static_cast<BlockQ8_0*>(dst), nb); break;
    case DType::Q4_K: q4_k(src, static_cast<BlockQ4_K*>(dst), nb); break;
    case DType::Q5_K: q5_k(src, static_cast<BlockQ5_K*>(dst), nb); break;
    case DType::Q6_K: q6_k(src, static_cast<BlockQ6_K*>(dst), nb); break;
    case DType::Q8_K: q8_k(src, static_cast<BlockQ8_K*>(dst), nb); break;
    case DType::IQ4_XS: iq4_xs(src, static_cast<BlockIQ4_XS*>(dst), nb); break;
    case DType::I32: case DType::U8: case DType::I64:
      fail("quantize_row: {} is not a float type", dtype_name(t));
    case DType::Q4_K_T16: case DType::Q6_K_T16: case DType::Q8_0_T16: case DType::W4_G128_T16:
    case DType::NVFP4_B64_T16: case DType::W4_G32_T16:
      fail("quantize_row: {} is the CUDA backend's tiled weight layout (made on the device)", dtype_name(t));
    case DType::W4_G32: case DType::W4_G128: case DType::F8_B128: case DType::NVFP4_B64:
      fail("quantize_row: {} only comes from Hugging Face checkpoints (format/hf_quant.h)", dtype_name(t));
    case DType::F8_E4M3: {
      auto* b = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) b[i] = f32_to_f8_e4m3(src[i]);
      break;
    }
  }
}

}  // namespace qwen36
