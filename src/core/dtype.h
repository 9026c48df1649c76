#pragma once
// defines: DType, dtype_name, dtype_block_bytes/dtype_row_bytes, bf16/f16 <-> f32 conversions
//
// Element types of tensors. Block-quantized types (GGUF K-quants etc.) are described by
// quant/ and have a block size > 1; for them dtype_block_bytes() is the size of one block.

#include <bit>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace qwen36 {

enum class DType : uint8_t {
  F32,
  F16,
  BF16,
  I32,
  // GGUF block types (layouts in quant/blocks.h)
  Q4_0,
  Q4_1,
  Q5_0,
  Q5_1,
  Q8_0,
  Q4_K,
  Q5_K,
  Q6_K,
  Q8_K,
  IQ4_XS,
  // OCP FP8 E4M3 ("e4m3fn"), one byte per element (the fp8 KV cache, backend/kv_cache.h)
  F8_E4M3,
  // Raw integers of Hugging Face quantized checkpoints, seen only while loading
  // (format/hf_quant.h): U8 = packed FP4 codes, I64 = compressed-tensors' weight_shape.
  U8,
  I64,
  // Weight blocks of Hugging Face quantized checkpoints (layouts in quant/hf_blocks.h):
  // 4-bit codes with their group's scale and integer zero (AWQ, GPTQ, compressed-tensors),
  // FP8 E4M3 with a per-128 f32 scale (block-wise FP8), NVFP4 (E2M1, E4M3 per 16, f32 global).
  W4_G32,
  W4_G128,
  F8_B128,
  NVFP4_B64,
  // The CUDA backend's tiled layouts of Q4_K, Q6_K, Q8_0, W4_G128, NVFP4 and W4_G32 matrices
  // (16-row tiles of 256 weights for its tensor-core GEMM, backend/cuda/cuda_quant_mma.cu): the
  // same bytes per block as the source type, so sizes are unchanged, but rows are not stored one
  // after another. Only the CUDA backend makes and reads them; everything else rejects them.
  // They are the enum's last entries (dtype_is_tiled).
  Q4_K_T16,
  Q6_K_T16,
  Q8_0_T16,
  W4_G128_T16,
  NVFP4_B64_T16,
  W4_G32_T16,
};
inline constexpr DType kLastDType = DType::W4_G32_T16;

std::string_view dtype_name(DType t);
// Bytes per block and elements per block (1 for plain types).
size_t dtype_block_bytes(DType t);
int64_t dtype_block_elems(DType t);
// Bytes needed for n elements (n must be a multiple of the block size).
size_t dtype_row_bytes(DType t, int64_t n);
inline bool dtype_is_quantized(DType t) { return dtype_block_elems(t) > 1; }
// A device-tiled layout (Q4_K_T16 .. kLastDType): rows cannot be read on their own.
inline bool dtype_is_tiled(DType t) { return t >= DType::Q4_K_T16 && t <= kLastDType; }

// bf16: the top 16 bits of an IEEE f32. Conversion rounds to nearest even; NaN stays NaN.
inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// IEEE half precision.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// FP8 E4M3 (bias 7, 3 mantissa bits, subnormals, no infinities; 0x7f/0xff are NaN; max ±448).
// f32 → e4m3 rounds to nearest even and saturates to ±448 (NaN stays NaN); every e4m3 value
// is exact in f32 (and in f16 and bf16).
float f8_e4m3_to_f32(uint8_t b);
uint8_t f32_to_f8_e4m3(float f);

}  // namespace qwen36
