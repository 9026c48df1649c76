// Reference dequantization of every block type (formulas in quant/blocks.h).
#include <cstring>

#include "core/error.h"
#include "quant/blocks.h"
#include "quant/hf_blocks.h"
#include "quant/quant.h"

namespace qwen36 {

namespace {

float h2f(uint16_t h) { return f16_to_f32(h); }

void deq_q4_0(const BlockQ4_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = h2f(b[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = d * float((b[i].qs[j] & 15) - 8);
      y[j + 16] = d * float((b[i].qs[j] >> 4) - 8);
    }
  }
}

void deq_q4_1(const BlockQ4_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = h2f(b[i].d), m = h2f(b[i].m);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = d * float(b[i].qs[j] & 15) + m;
      y[j + 16] = d * float(b[i].qs[j] >> 4) + m;
    }
  }
}

// The 5-bit values of a Q5_0/Q5_1 block, 0..31.
void q5_values(const uint8_t* qh_bytes, const uint8_t* qs, int* q) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  for (int j = 0; j < kQK / 2; ++j) {
    q[j] = (qs[j] & 15) | int(((qh >> j) & 1) << 4);
    q[j + 16] = (qs[j] >> 4) | int(((qh >> (j + 16)) & 1) << 4);
  }
}

void deq_q5_0(const BlockQ5_0* b, float* y, int64_t nb) {
  int q[kQK];
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = h2f(b[i].d);
    q5_values(b[i].qh, b[i].qs, q);
    for (int j = 0; j < kQK; ++j) y[j] = d * float(q[j] - 16);
  }
}

void deq_q5_1(const BlockQ5_1* b, float* y, int64_t nb) {
  int q[kQK];
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = h2f(b[i].d), m = h2f(b[i].m);
    q5_values(b[i].qh, b[i].qs, q);
    for (int j = 0; j < kQK; ++j) y[j] = d * float(q[j]) + m;
  }
}

void deq_q8_0(const BlockQ8_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = h2f(b[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = d * float(b[i].qs[j]);
  }
}

void deq_q4_k(const BlockQ4_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
    for (int c = 0; c < 4; ++c, y += 64) {
      const uint8_t* q = b[i].qs + 32 * c;
      uint8_t sc0, m0, sc1, m1;
      unpack_k_scale_min(2 * c, b[i].scales, sc0, m0);
      unpack_k_scale_min(2 * c + 1, b[i].scales, sc1, m1);
      const float d0 = d * sc0, mm0 = dmin * m0, d1 = d * sc1, mm1 = dmin * m1;
      for (int l = 0; l < 32; ++l) {
        y[l] = d0 * float(q[l] & 15) - mm0;
        y[l + 32] = d1 * float(q[l] >> 4) - mm1;
      }
    }
  }
}

void deq_q5_k(const BlockQ5_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
    for (int c = 0; c < 4; ++c, y += 64) {
      const uint8_t* q = b[i].qs + 32 * c;
      uint8_t sc0, m0, sc1, m1;
      unpack_k_scale_min(2 * c, b[i].scales, sc0, m0);
      unpack_k_scale_min(2 * c + 1, b[i].scales, sc1, m1);
      const float d0 = d * sc0, mm0 = dmin * m0, d1 = d * sc1, mm1 = dmin * m1;
      const uint8_t u0 = uint8_t(1u << (2 * c)), u1 = uint8_t(2u << (2 * c));
      for (int l = 0; l < 32; ++l) {
        y[l] = d0 * float((q[l] & 15) + ((b[i].qh[l] & u0) ? 16 : 0)) - mm0;
        y[l + 32] = d1 * float((q[l] >> 4) + ((b[i].qh[l] & u1) ? 16 : 0)) - mm1;
      }
    }
  }
}

void deq_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    for (int n = 0; n < 2; ++n, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * float(sc[is] * q1);
        y[l + 32] = d * float(sc[is + 2] * q2);
        y[l + 64] = d * float(sc[is + 4] * q3);
        y[l + 96] = d * float(sc[is + 6] * q4);
      }
    }
  }
}

void deq_q8_k(const BlockQ8_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK_K)
    for (int j = 0; j < kQK_K; ++j) y[j] = b[i].d * float(b[i].qs[j]);
}

void deq_iq4_xs(const BlockIQ4_XS* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(b[i].d);
    for (int ib = 0; ib < 8; ++ib, y += 32) {
      const int ls = ((b[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 15) | (((b[i].scales_h >> (2 * ib)) & 3) << 4);
      const float dl = d * float(ls - 32);
      const uint8_t* q = b[i].qs + 16 * ib;
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * float(kIQ4NLValues[q[j] & 15]);
        y[j + 16] = dl * float(kIQ4NLValues[q[j] >> 4]);
      }
    }
  }
}

}  // namespace

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  const int64_t be = dtype_block_elems(t);
  QWEN36_CHECK(n >= 0 && n % be == 0, "dequantize_row: {} elements is not a multiple of the {} block size {}", n,
               dtype_name(t), be);
  const int64_t nb = n / be;
  switch (t) {
    case DType::F32: std::memcpy(dst, src, size_t(n) * 4); break;
    case DType::F16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(h[i]);
      break;
    }
    case DType::BF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(h[i]);
      break;
    }
    case DType::Q4_0: deq_q4_0(static_cast<const BlockQ4_0*>(src), dst, nb); break;
    case DType::Q4_1: deq_q4_1(static_cast<const BlockQ4_1*>(src), dst, nb); break;
    case DType::Q5_0: deq_q5_0(static_cast<const BlockQ5_0*>(src), dst, nb); break;
    case DType::Q5_1: deq_q5_1(static_cast<const BlockQ5_1*>(src), dst, nb); break;
    case DType::Q8_0: deq_q8_0(static_cast<const BlockQ8_0*>(src), dst, nb); break;
    case DType::Q4_K: deq_q4_k(static_cast<const BlockQ4_K*>(src), dst, nb); break;
    case DType::Q5_K: deq_q5_k(static_cast<const BlockQ5_K*>(src), dst, nb); break;
    case DType::Q6_K: deq_q6_k(static_cast<const BlockQ6_K*>(src), dst, nb); break;
    case DType::Q8_K: deq_q8_k(static_cast<const BlockQ8_K*>(src), dst, nb); break;
    case DType::IQ4_XS: deq_iq4_xs(static_cast<const BlockIQ4_XS*>(src), dst, nb); break;
    case DType::I32: case DType::U8: case DType::I64:
      fail("dequantize_row: {} is not a float type", dtype_name(t));
    case DType::Q4_K_T16: case DType::Q6_K_T16: case DType::Q8_0_T16: case DType::W4_G128_T16:
    case DType::NVFP4_B64_T16: case DType::W4_G32_T16:
      fail("dequantize_row: {} is the CUDA backend's tiled weight layout: the CPU cannot read it", dtype_name(t));
    case DType::W4_G32: case DType::W4_G128: case DType::F8_B128: case DType::NVFP4_B64:
      dequantize_hf_row(t, src, dst, n);
      break;
    case DType::F8_E4M3: {
      const auto* b = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f8_e4m3_to_f32(b[i]);
      break;
    }
  }
}

}  // namespace qwen36
