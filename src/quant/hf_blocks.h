#pragma once
// defines: BlockW4G32, BlockW4G128, BlockF8B128, BlockNvfp4B64, dtype_is_hf_block, w4_scale, e2m1_to_f32,
//          kE2M1Values, dequantize_hf_row, hf_dot_f32_scalar
//
// The internal weight types that Hugging Face quantized checkpoints are mapped into at load
// (format/hf_quant.cpp does the mapping). Each block carries the parameters of the group it
// belongs to, so a row is self-contained like a GGUF row, and every stored value is the
// checkpoint's own bits (codes, f16/bf16/e4m3 scales, f32 global scales): dequantization is
// exact in f32 and bit-identical to the formula given per type. Bytes per weight stay close to
// the checkpoint's (W4_G128: 4.25 bits, the checkpoint's group-128 layout 4.16).
//
// Activations stay f32 (dot_activation_type is F32): these types reproduce the dequantized
// model up to summation order, which is what the fixtures test.

#include <cstdint>

#include "core/dtype.h"

namespace qwen36 {

// W4_G32 / W4_G128 (AWQ, GPTQ, compressed-tensors pack-quantized): 32 / 128 weights of one
// group. y[j] = scale * float(q_j - z), one f32 multiply, where scale is the stored 16-bit value
// widened (f16 when kind == 0, bf16 when kind == 1) and z the integer zero (0..16: GPTQ v1
// stores zero - 1, so its effective zero reaches 16; symmetric formats use 8).
// Codes: element j < L/2 in the low nibble of qs[j], element j + L/2 in its high nibble
// (L = 32 or 128; Q4_0's order, so a SIMD unpack is one mask and one shift).
struct BlockW4G32 {
  uint16_t s;
  uint8_t z;
  uint8_t kind;
  uint8_t qs[16];
};
struct BlockW4G128 {
  uint16_t s;
  uint8_t z;
  uint8_t kind;
  uint8_t qs[64];
};
// F8_B128 (block-wise FP8, `weight_scale_inv` of 128x128 tiles): 128 consecutive weights of a
// row and the f32 scale of their tile. y[j] = e4m3(q[j]) * d (one f32 multiply).
struct BlockF8B128 {
  float d;
  uint8_t q[128];
};
// NVFP4_B64 (modelopt / compressed-tensors NVFP4): 64 weights = 4 groups of 16.
// y[j] = (e2m1(q_j) * e4m3(s[j / 16])) * g: the first product is exact (2 x 4 significant
// bits), the multiply by the per-tensor f32 global scale g rounds once. Codes as stored by the
// checkpoint: element 2i in the low nibble of qs[i], 2i + 1 in the high nibble.
struct BlockNvfp4B64 {
  float g;
  uint8_t s[4];
  uint8_t qs[32];
};

static_assert(sizeof(BlockW4G32) == 20 && sizeof(BlockW4G128) == 68 && sizeof(BlockF8B128) == 132 &&
              sizeof(BlockNvfp4B64) == 40);

// The types above: loaded from quantized Hugging Face checkpoints, CPU kernels only so far.
inline bool dtype_is_hf_block(DType t) {
  return t == DType::W4_G32 || t == DType::W4_G128 || t == DType::F8_B128 || t == DType::NVFP4_B64;
}

inline float w4_scale(uint16_t s, uint8_t kind) { return kind ? bf16_to_f32(s) : f16_to_f32(s); }

// E2M1: bit 3 sign, bits 2..0 index {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
inline constexpr float kE2M1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
inline float e2m1_to_f32(uint8_t nibble) { return kE2M1Values[nibble & 15]; }

// Reference dequantization of n elements (a multiple of the block size) of W4_G32, W4_G128,
// F8_B128 or NVFP4_B64 (quant/quant.h's dequantize_row forwards here).
void dequantize_hf_row(DType t, const void* src, float* dst, int64_t n);

}  // namespace qwen36
