#pragma once
// defines (file-local to each .cu that includes it): the byte layout of the device-tiled
// quantized matrices (DTypes *_T16; the layout is described in the header of cuda_quant_mma.cu)
// as named offsets, the runtime tiled dtype → compile-time dispatch (with_tiled_dtype: every
// tiled type; with_gguf_tiled_dtype: the three GGUF ones, which the T > 64 GEMM of
// cuda_quant_gemm.cu takes), a tile's 16-byte loads (lds4, pick) and the per-type header
// decoders (and Q4_K's codes); it brings cuda_sm80.cuh's cp.async helpers to the kernels that
// stream tiles through shared memory. Included by .cu only (cuda_quant_mma.cu, cuda_quant_moe_mma.cu, cuda_quant_gemm.cu).
//
// q4k_scales gives the same floats as cuda_quant_mma.cu's q4k_table (whose odd groups' d·sc is
// divided by 16, exactly) and dequant_tile compute for a tile's (d·sc, dmin·m); the tile byte
// offsets name the literals of its tile_byte,
// dequant_tile and load_tile.

#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_quant_blocks.cuh"
#include "backend/cuda/cuda_sm80.cuh"

namespace qwen36::cuda {
namespace {

// 16 bytes at p (a tile in global or shared memory) as one load; word i of such a load.
__device__ __forceinline__ uint4 lds4(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ uint32_t pick(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// A tile: 16 rows × one super-block (256 weights) of a [N, K] matrix; tile (r, s) at byte
// (r·S + s)·kBytes, S = K / 256. Lane L's 16-byte load i of the codes is at 512·i + 16·L.
template <DType D>
struct TileLayout;
template <>
struct TileLayout<DType::Q4_K_T16> {
  static constexpr int kBytes = 2304;
  static constexpr int kHeaders = 2048;  // 16 × {f16 d, f16 dmin, 12 scale bytes}, row-major
};
template <>
struct TileLayout<DType::Q6_K_T16> {
  static constexpr int kBytes = 3360;
  static constexpr int kHigh = 2048;    // 2 loads of high-bit words (k32 group 4·i + word)
  static constexpr int kScales = 3072;  // [row][16] int8
  static constexpr int kD = 3328;       // [row] f16
};
template <>
struct TileLayout<DType::Q8_0_T16> {
  static constexpr int kBytes = 4352;
  static constexpr int kD = 4096;  // [row][block] f16
};
// W4_G128 (AWQ / GPTQ group 128): the codes as Q6_K's low bits (2048 B), then per row 8 bytes for
// the tile's two groups (k 0..127, 128..255): their 16-bit scales s0, s1 (as stored), integer zeros
// z0, z1, and the scales' kinds (bit g: group g's scale is bf16, else f16), a zero byte.
template <>
struct TileLayout<DType::W4_G128_T16> {
  static constexpr int kBytes = 2176;
  static constexpr int kHeaders = 2048;  // [row] {u16 s0, u16 s1, u8 z0, u8 z1, u8 kinds, 0}
};
// W4_G32 (GPTQ / compressed-tensors int4 in groups of 32 or 64): the codes as Q6_K's low bits (a
// block's 16 code bytes are the tile's bytes as they stand); then per row and half h of the tile (groups
// 4h .. 4h + 3) 16 bytes: the 4 groups' 16-bit scales, their integer zeros, their scale kinds
// (bit i: group 4h + i's scale is bf16, else f16) and 3 zero bytes. Computed as Q4_K: per
// (row, group) (S, M) = (s, s · z) in the warp's table, w = S · q − M.
template <>
struct TileLayout<DType::W4_G32_T16> {
  static constexpr int kBytes = 2560;
  static constexpr int kHeaders = 2048;  // [row][half] {4 × u16 s, 4 × u8 z, u8 kinds, 0, 0, 0}
};
// NVFP4_B64 (modelopt / compressed-tensors NVFP4): the e2m1 codes (2048 B) with each A register's
// 4 weights in 16 contiguous bits, the low half of a word for rows g / g + 8 at k 4t.. (a0 / a1),
// the high half at k 16 + 4t.. (a2 / a3), so a register's nibbles are prmt selectors as they
// stand (nvfp4_frag); then per row and half h of the tile (k 128h ..): the 8 e4m3 scales of its
// 16-weight groups and the f32 global scales of its two 64-weight blocks (16 bytes: one lane's load).
template <>
struct TileLayout<DType::NVFP4_B64_T16> {
  static constexpr int kBytes = 2560;
  static constexpr int kHeaders = 2048;  // [row][half] {8 × e4m3, f32 g, f32 g}
};
static_assert(TileLayout<DType::Q4_K_T16>::kBytes == 16 * 144 && TileLayout<DType::Q6_K_T16>::kBytes == 16 * 210 &&
              TileLayout<DType::Q8_0_T16>::kBytes == 16 * 8 * 34 && TileLayout<DType::W4_G128_T16>::kBytes == 32 * 68 &&
              TileLayout<DType::NVFP4_B64_T16>::kBytes == 64 * 40 && TileLayout<DType::W4_G32_T16>::kBytes == 128 * 20);

// Q4_K, W4_G128 and W4_G32 tiles hold 4-bit codes (Q4_K two groups a load, the others as Q6_K's low
// bits: TileLayout, cuda_quant_mma.cu's header).
__host__ __device__ constexpr bool nibble_tile(DType t) {
  return t == DType::Q4_K_T16 || t == DType::W4_G128_T16 || t == DType::W4_G32_T16;
}
// The tiles computed as Q4_K: u8 codes, a scale and a min per (row, k32 group), w = S · q − M.
__host__ __device__ constexpr bool min_tile(DType t) { return t == DType::Q4_K_T16 || t == DType::W4_G32_T16; }
// The tiles whose warp decodes per-(row, k32 group) float pairs into a shared-memory table once
// (the (S, M) of min_tile types, NVFP4's two 16-group scales).
__host__ __device__ constexpr bool table_tile(DType t) { return min_tile(t) || t == DType::NVFP4_B64_T16; }

template <typename F>
bool with_gguf_tiled_dtype(DType t, F&& f) {
  switch (t) {
    case DType::Q4_K_T16: f(std::integral_constant<DType, DType::Q4_K_T16>{}); return true;
    case DType::Q6_K_T16: f(std::integral_constant<DType, DType::Q6_K_T16>{}); return true;
    case DType::Q8_0_T16: f(std::integral_constant<DType, DType::Q8_0_T16>{}); return true;
    default: return false;
  }
}
template <typename F>
bool with_tiled_dtype(DType t, F&& f) {
  switch (t) {
    case DType::W4_G128_T16: f(std::integral_constant<DType, DType::W4_G128_T16>{}); return true;
    case DType::NVFP4_B64_T16: f(std::integral_constant<DType, DType::NVFP4_B64_T16>{}); return true;
    case DType::W4_G32_T16: f(std::integral_constant<DType, DType::W4_G32_T16>{}); return true;
    default: return with_gguf_tiled_dtype(t, f);
  }
}

// Q4_K: k32 group jj's codes (0..15, a byte each) from load jj / 2 of a tile, v: group jj in the
// nibble of its parity of every word (TileLayout); c[0..3] are a0..a3's codes (rows g, g + 8; k
// 4t.. and 16 + 4t..). The dequantizers' reading; the GEMMs' a_frags masks without the shift.
__device__ __forceinline__ void q4k_codes(const uint4& v, int jj, uint32_t (&c)[4]) {
  const int sh = 4 * (jj & 1);
  c[0] = (v.x >> sh) & 0x0F0F0F0Fu, c[1] = (v.y >> sh) & 0x0F0F0F0Fu;
  c[2] = (v.z >> sh) & 0x0F0F0F0Fu, c[3] = (v.w >> sh) & 0x0F0F0F0Fu;
}

// Q4_K: from the 16-byte header h of one row (d | dmin, 12 scale bytes), the (d·sc, dmin·m) of
// sub-blocks 4·half .. 4·half + 3, each rounded as dequant_tile / quant/dequantize.cpp round them
// (h2f(d) · float(sc), then the weight is fmaf(d·sc, q, −dmin·m)).
__device__ __forceinline__ void q4k_scales(const uint4& h, int half, float2 (&out)[4]) {
  const uint32_t sc4 = half ? (h.w & 0x0F0F0F0Fu) | ((h.y >> 2) & 0x30303030u) : h.y & 0x3F3F3F3Fu;
  const uint32_t m4 = half ? ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u) : h.z & 0x3F3F3F3Fu;
  const float d = h2f(uint16_t(h.x & 0xFFFFu)), dmin = h2f(uint16_t(h.x >> 16));
#pragma unroll
  for (int i = 0; i < 4; ++i) out[i] = make_float2(d * float((sc4 >> (8 * i)) & 255u), dmin * float((m4 >> (8 * i)) & 255u));
}

// W4_G128: a row's header (8 bytes, TileLayout) → group grp's scale as f32 (exact: f16 and bf16
// widen exactly) and its zero replicated in each byte of a word (subtracted from 4 codes at once).
__device__ __forceinline__ float w4_scale(const uint2& h, int grp) {
  const uint32_t s = (h.x >> (16 * grp)) & 0xFFFFu;
  return (h.y >> (16 + grp)) & 1u ? __uint_as_float(s << 16) : h2f(uint16_t(s));
}
__device__ __forceinline__ uint32_t w4_zeros(const uint2& h, int grp) { return ((h.y >> (8 * grp)) & 255u) * 0x01010101u; }
// W4_G32: a row's half-tile header h (TileLayout) → group i's (i < 4) scale as f32 and zero.
__device__ __forceinline__ float w4g32_scale(const uint4& h, int i) {
  const uint32_t s = ((i < 2 ? h.x : h.y) >> (16 * (i & 1))) & 0xFFFFu;
  return (h.w >> i) & 1u ? __uint_as_float(s << 16) : h2f(uint16_t(s));
}
__device__ __forceinline__ int w4g32_zero(const uint4& h, int i) { return int((h.z >> (8 * i)) & 255u); }

// NVFP4: 4 e2m1 codes as prmt selectors (nibble i: weight i's code, sign bit 3) → 4 s8 values
// 2·e2m1 ∈ {0, ±1, ±2, ±3, ±4, ±6, ±8, ±12} (exact). A selector nibble with bit 3 set replicates
// the picked byte's sign, so p is the doubled magnitude for positive codes and 0 for negative
// ones, m the magnitude for both, and 2p − m the signed value (per byte offset by 128: no byte
// borrows from the next). −0 becomes 0.
__device__ __forceinline__ uint32_t nvfp4_frag(uint32_t sel) {
  constexpr uint32_t kLo = 0x03020100u, kHi = 0x0C080604u;  // 2·{0, 0.5, 1, 1.5 | 2, 3, 4, 6}
  uint32_t p, m;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(p) : "r"(kLo), "r"(kHi), "r"(sel));
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(m) : "r"(kLo), "r"(kHi), "r"(sel & 0x7777u));
  return ((p + p + 0x80808080u) - m) ^ 0x80808080u;
}
// NVFP4: a row's half-tile header h (TileLayout) → the f32 scales e4m3(s) · g / 2 of its k32
// groups 4·half + i (i < 4) as (first 16, second 16): the codes are 2·e2m1, so the halving is
// exact, and each product rounds once.
__device__ __forceinline__ void nvfp4_scales(const uint4& h, float2 (&out)[4]) {
  const float g0 = __uint_as_float(h.z) * 128.0f, g1 = __uint_as_float(h.w) * 128.0f;  // · 256 (e4m3 · 2^-8) / 2
  const float2 b02 = f16x2_to_f2(e4m3_to_f16x2(h.x << 8)), b13 = f16x2_to_f2(e4m3_to_f16x2(h.x));
  const float2 b46 = f16x2_to_f2(e4m3_to_f16x2(h.y << 8)), b57 = f16x2_to_f2(e4m3_to_f16x2(h.y));
  out[0] = make_float2(b02.x * g0, b13.x * g0);
  out[1] = make_float2(b02.y * g0, b13.y * g0);
  out[2] = make_float2(b46.x * g1, b57.x * g1);
  out[3] = make_float2(b46.y * g1, b57.y * g1);
}

}  // namespace
}  // namespace qwen36::cuda
