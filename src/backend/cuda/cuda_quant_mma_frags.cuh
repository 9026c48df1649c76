#pragma once
// defines (file-local to each .cu that includes it): the register side of the int8 tensor-core
// kernels on tiled matrices (cuda_quant_mma.cu's dense GEMM, cuda_quant_moe_mma.cu's routed
// experts): the mma.sync wrappers, a lane's registers of one tile (Raw, load_tile), Q4_K's
// per-row (d·sc, dmin·m) table, the A fragments of a k32 group, and the per-32 int8 activation
// quantizer both kernels' activations go through. The layout these read is described in the
// header of cuda_quant_mma.cu. Included by .cu only.

#include <cstdint>

#include "backend/cuda/cuda_quant_blocks.cuh"
#include "backend/cuda/cuda_quant_tiles.cuh"

namespace qwen36::cuda {
namespace {

constexpr int kTabStride = 10;  // float2 per row of Q4_K's (S, M) table: 8 groups + 2 pad (no bank conflicts)

// A thread's 4 weights of a 32-weight group held by 8 consecutive lanes (every lane of the warp
// takes part): the group's scale d = amax / 127, the 4 codes rounded to nearest even (the
// 1.5 · 2^23 trick) packed little-endian into a word, and the code sums of the thread's 16-half
// of the group (half) and of the other 16-half (other).
struct QuantQuad {
  float d;
  uint32_t packed;
  int half, other;
};
__device__ __forceinline__ QuantQuad quantize_quad(float4 v) {
  float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float d = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  const int q0 = __float_as_int(fmaf(v.x, inv, 12582912.0f)) - 0x4B400000;
  const int q1 = __float_as_int(fmaf(v.y, inv, 12582912.0f)) - 0x4B400000;
  const int q2 = __float_as_int(fmaf(v.z, inv, 12582912.0f)) - 0x4B400000;
  const int q3 = __float_as_int(fmaf(v.w, inv, 12582912.0f)) - 0x4B400000;
  int half = q0 + q1 + q2 + q3;
  half += __shfl_xor_sync(0xffffffffu, half, 1);
  half += __shfl_xor_sync(0xffffffffu, half, 2);
  const int other = __shfl_xor_sync(0xffffffffu, half, 4);
  return {d, (uint32_t(q0) & 255u) | (uint32_t(q1) & 255u) << 8 | (uint32_t(q2) & 255u) << 16 | uint32_t(q3) << 24,
          half, other};
}

__device__ __forceinline__ void mma_u8s8_k32(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}
__device__ __forceinline__ void mma_s8s8_k32(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}
// d = a · b + {c0, c1, c0, c1} (k16: rows g, g + 8 share the per-token init)
__device__ __forceinline__ void mma_u8s8_k16(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b, int c0, int c1) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%8,%7,%8};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(b), "r"(c0), "r"(c1));
}

__device__ __forceinline__ uint32_t pick(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
__device__ __forceinline__ int sext8(uint32_t v) { return int(int8_t(uint8_t(v & 255u))); }


// A tile into a warp's shared-memory stage: lane L copies bytes 512 i + 16 L (the same bytes its
// own fragments come from), the tail (headers) by the first lanes.
template <int B>
__device__ __forceinline__ void issue_tile(uint8_t* stage, const uint8_t* __restrict__ tile, int lane) {
#pragma unroll
  for (int i = 0; i < B / 512; ++i) cpa_16(stage + 512 * i + 16 * lane, tile + 512 * i + 16 * lane);
  if (16 * lane < B % 512) cpa_16(stage + (B / 512) * 512 + 16 * lane, tile + (B / 512) * 512 + 16 * lane);
}

// A lane's registers of one tile.
template <DType D>
struct Raw;
template <>
struct Raw<DType::Q4_K_T16> {
  uint4 q[4], h;
};
template <>
struct Raw<DType::Q6_K_T16> {
  uint4 q[4], hb[2], sc0, sc1;
  uint32_t d;
};
template <>
struct Raw<DType::Q8_0_T16> {
  uint4 q[8], d0, d1;
};

__device__ __forceinline__ uint4 lds4(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }
// Global, evict-first (the weights are read once per call; x's fragments stay in cache).
__device__ __forceinline__ uint4 ldcs4(const uint8_t* p) { return __ldcs(reinterpret_cast<const uint4*>(p)); }

// Global through the read-only path, default eviction (MoE experts: pairs sharing an expert
// read the same tiles, possibly from L2).
__device__ __forceinline__ uint4 ldg4(const uint8_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

// A lane's registers of one tile, from the warp's shared-memory stage (GLOBAL = false) or
// straight from the tiled matrix (GLOBAL = true: the register-prefetch path; STREAM: the loads
// evict first).
template <DType D, bool GLOBAL, bool STREAM = true>
__device__ __forceinline__ void load_tile(const uint8_t* tile, int lane, Raw<D>& R) {
  const int g = lane >> 2;
  auto ld4 = [](const uint8_t* p) { return GLOBAL ? (STREAM ? ldcs4(p) : ldg4(p)) : lds4(p); };
  if constexpr (D == DType::Q4_K_T16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) R.q[i] = ld4(tile + 512 * i + 16 * lane);
    R.h = ld4(tile + 2048 + 16 * (lane & 15));
  } else if constexpr (D == DType::Q6_K_T16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) R.q[i] = ld4(tile + 512 * i + 16 * lane);
#pragma unroll
    for (int i = 0; i < 2; ++i) R.hb[i] = ld4(tile + 2048 + 512 * i + 16 * lane);
    R.sc0 = ld4(tile + 3072 + 16 * g);
    R.sc1 = ld4(tile + 3072 + 16 * (g + 8));
    if constexpr (GLOBAL) {
      const unsigned short* dp = reinterpret_cast<const unsigned short*>(tile + 3328);
      if constexpr (STREAM)
        R.d = uint32_t(__ldcs(dp + g)) | uint32_t(__ldcs(dp + g + 8)) << 16;
      else
        R.d = uint32_t(__ldg(dp + g)) | uint32_t(__ldg(dp + g + 8)) << 16;
    } else {
      R.d = uint32_t(ld_u16(tile + 3328 + 2 * g)) | uint32_t(ld_u16(tile + 3328 + 2 * (g + 8))) << 16;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) R.q[i] = ld4(tile + 512 * i + 16 * lane);
    R.d0 = ld4(tile + 4096 + 16 * g);
    R.d1 = ld4(tile + 4096 + 16 * (g + 8));
  }
}

// Q4_K: the tile's (S, M) = (d·sc, dmin·m) of row lane % 16, groups 4·(lane / 16) .. + 3, into
// the warp's table (16 rows × kTabStride), which every lane then reads by row and group.
__device__ __forceinline__ void q4k_table(const uint4& h, int lane, float2* tab) {
  const bool up = lane >= 16;
  const uint32_t sc4 = up ? (h.w & 0x0F0F0F0Fu) | ((h.y >> 2) & 0x30303030u) : h.y & 0x3F3F3F3Fu;
  const uint32_t m4 = up ? ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u) : h.z & 0x3F3F3F3Fu;
  const float d = h2f(uint16_t(h.x & 0xFFFFu)), dmin = h2f(uint16_t(h.x >> 16));
  float4* dst = reinterpret_cast<float4*>(tab + (lane & 15) * kTabStride + 4 * (lane >> 4));
  __syncwarp();  // the previous tile's readers are done
  dst[0] = make_float4(d * float(sc4 & 255u), dmin * float(m4 & 255u), d * float((sc4 >> 8) & 255u),
                       dmin * float((m4 >> 8) & 255u));
  dst[1] = make_float4(d * float((sc4 >> 16) & 255u), dmin * float((m4 >> 16) & 255u), d * float(sc4 >> 24),
                       dmin * float(m4 >> 24));
  __syncwarp();
}

// The A fragments of k32 group jj (0..7, a compile-time index once unrolled) of a lane's tile
// registers: Q4_K / Q6_K codes as u8 (Q6_K with its high bits, 0..63), Q8_0 as s8.
template <DType D>
__device__ __forceinline__ void a_frags(const Raw<D>& R, int jj, uint32_t& a0, uint32_t& a1, uint32_t& a2,
                                        uint32_t& a3) {
  if constexpr (D == DType::Q8_0_T16) {
    a0 = R.q[jj].x, a1 = R.q[jj].y, a2 = R.q[jj].z, a3 = R.q[jj].w;
  } else {
    const uint4& v = R.q[jj >> 1];
    const uint32_t X = (jj & 1) ? v.z : v.x, Y = (jj & 1) ? v.w : v.y;
    a0 = X & 0x0F0F0F0Fu, a1 = Y & 0x0F0F0F0Fu, a2 = (X >> 4) & 0x0F0F0F0Fu, a3 = (Y >> 4) & 0x0F0F0F0Fu;
    if constexpr (D == DType::Q6_K_T16) {
      const uint32_t H = pick(R.hb[jj >> 2], jj & 3);
      a0 |= (H << 4) & 0x30303030u;
      a1 |= (H << 2) & 0x30303030u;
      a2 |= H & 0x30303030u;
      a3 |= (H >> 2) & 0x30303030u;
    }
  }
}

}  // namespace
}  // namespace qwen36::cuda
