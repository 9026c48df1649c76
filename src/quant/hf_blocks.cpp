// Reference dequantization of the Hugging Face checkpoint block types (quant/hf_blocks.h).
// The formulas here are the definition the fixtures' f32 twins are computed with
// (tools/make_quant_fixtures.py), so the order of the f32 operations matters and is fixed.
#include "quant/hf_blocks.h"

#include "core/error.h"

namespace qwen36 {

namespace {

template <typename B, int L>
void deq_w4(const B* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += L) {
    const float s = w4_scale(b[i].s, b[i].kind);
    const int z = b[i].z;
    for (int j = 0; j < L / 2; ++j) {
      y[j] = s * float(int(b[i].qs[j] & 15) - z);
      y[j + L / 2] = s * float(int(b[i].qs[j] >> 4) - z);
    }
  }
}

void deq_f8(const BlockF8B128* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += 128)
    for (int j = 0; j < 128; ++j) y[j] = f8_e4m3_to_f32(b[i].q[j]) * b[i].d;
}

void deq_nvfp4(const BlockNvfp4B64* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += 64)
    for (int j = 0; j < 64; ++j) {
      const uint8_t q = uint8_t((j & 1) ? b[i].qs[j / 2] >> 4 : b[i].qs[j / 2] & 15);
      y[j] = (e2m1_to_f32(q) * f8_e4m3_to_f32(b[i].s[j / 16])) * b[i].g;
    }
}

}  // namespace

void dequantize_hf_row(DType t, const void* src, float* dst, int64_t n) {
  const int64_t nb = n / dtype_block_elems(t);
  switch (t) {
    case DType::W4_G32: deq_w4<BlockW4G32, 32>(static_cast<const BlockW4G32*>(src), dst, nb); break;
    case DType::W4_G128: deq_w4<BlockW4G128, 128>(static_cast<const BlockW4G128*>(src), dst, nb); break;
    case DType::F8_B128: deq_f8(static_cast<const BlockF8B128*>(src), dst, nb); break;
    case DType::NVFP4_B64: deq_nvfp4(static_cast<const BlockNvfp4B64*>(src), dst, nb); break;
    default: fail("dequantize_hf_row: {} is not a Hugging Face checkpoint block type", dtype_name(t));
  }
}

}  // namespace qwen36
