#pragma once
// defines (file-local to each .cu that includes it): the byte layout of the device-tiled
// quantized matrices (DTypes Q4_K_T16, Q6_K_T16, Q8_0_T16; the layout is described in the header
// of cuda_quant_mma.cu) as named offsets, the runtime tiled dtype → compile-time dispatch, and
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
static_assert(TileLayout<DType::Q4_K_T16>::kBytes == 16 * 144 && TileLayout<DType::Q6_K_T16>::kBytes == 16 * 210 &&
              TileLayout<DType::Q8_0_T16>::kBytes == 16 * 8 * 34);

template <typename F>
bool with_tiled_dtype(DType t, F&& f) {
  switch (t) {
    case DType::Q4_K_T16: f(std::integral_constant<DType, DType::Q4_K_T16>{}); return true;
    case DType::Q6_K_T16: f(std::integral_constant<DType, DType::Q6_K_T16>{}); return true;
    case DType::Q8_0_T16: f(std::integral_constant<DType, DType::Q8_0_T16>{}); return true;
    default: return false;
  }
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

}  // namespace
}  // namespace qwen36::cuda
