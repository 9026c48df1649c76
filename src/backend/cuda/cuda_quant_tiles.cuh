#pragma once
// defines (file-local to each .cu that includes it): the byte layout of the device-tiled
// quantized matrices (DTypes Q4_K_T16, Q6_K_T16, Q8_0_T16, W4_G128_T16; the layout is described
// in the header of cuda_quant_mma.cu) as named offsets, the runtime tiled dtype → compile-time
// dispatch (with_tiled_dtype: every tiled type, the dense GEMM's; with_gguf_tiled_dtype: the
// three GGUF ones, which the routed-expert kernels and the T > 64 GEMM take), and
// the cp.async helpers of kernels that stream tiles through shared memory. Included by .cu only
// (cuda_quant_mma.cu, cuda_quant_gemm.cu).
//
// q4k_scales gives the same floats as cuda_quant_mma.cu's q4k_table and dequant_tile compute
// for a tile's (d·sc, dmin·m); the tile byte offsets name the literals of its tile_byte,
// dequant_tile and load_tile.

#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_quant_blocks.cuh"

namespace qwen36::cuda {
namespace {

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
// W4_G128 (AWQ / GPTQ group 128): the codes as Q4_K's (2048 B), then per row 8 bytes for the
// tile's two groups (k 0..127, 128..255): their 16-bit scales s0, s1 (as stored), integer zeros
// z0, z1, and the scales' kinds (bit g: group g's scale is bf16, else f16), a zero byte.
template <>
struct TileLayout<DType::W4_G128_T16> {
  static constexpr int kBytes = 2176;
  static constexpr int kHeaders = 2048;  // [row] {u16 s0, u16 s1, u8 z0, u8 z1, u8 kinds, 0}
};
static_assert(TileLayout<DType::Q4_K_T16>::kBytes == 16 * 144 && TileLayout<DType::Q6_K_T16>::kBytes == 16 * 210 &&
              TileLayout<DType::Q8_0_T16>::kBytes == 16 * 8 * 34 && TileLayout<DType::W4_G128_T16>::kBytes == 32 * 68);

// Q4_K and W4_G128 tiles hold their codes alike (4-bit, the same A-fragment order).
__host__ __device__ constexpr bool nibble_tile(DType t) { return t == DType::Q4_K_T16 || t == DType::W4_G128_T16; }

template <typename F>
bool with_gguf_tiled_dtype(DType t, F&& f) {
  switch (t) {
    case DType::Q4_K_T16: f(std::integral_constant<DType, DType::Q4_K_T16>{}); return true;
    case DType::Q6_K_T16: f(std::integral_constant<DType, DType::Q6_K_T16>{}); return true;
    case DType::Q8_0_T16: f(std::integral_constant<DType, DType::Q8_0_T16>{}); return true;
    default: return false;
  }
}
inline bool gguf_tiled(DType t) { return with_gguf_tiled_dtype(t, [](auto) {}); }
template <typename F>
bool with_tiled_dtype(DType t, F&& f) {
  if (t == DType::W4_G128_T16) {
    f(std::integral_constant<DType, DType::W4_G128_T16>{});
    return true;
  }
  return with_gguf_tiled_dtype(t, f);
}

// 16 bytes global → shared without registers (sm_80+), L2 only.
__device__ __forceinline__ void cpa_16(void* smem, const void* gmem) {
  const unsigned s = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cpa_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cpa_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
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

}  // namespace
}  // namespace qwen36::cuda
