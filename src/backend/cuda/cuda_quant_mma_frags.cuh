#pragma once
// defines (file-local to each .cu that includes it): the register side of the int8 tensor-core
// kernels on tiled matrices (cuda_quant_mma.cu's dense GEMM, cuda_quant_moe_mma.cu's routed
// experts): the mma.sync wrappers, a lane's registers of one tile (Raw, load_tile), Q4_K's
// per-row (d·sc, dmin·m) table, the A fragments of a k32 group, a row of activations quantized
// per 32 (quantize_row_of any source of quads, e.g. quantize_row's f32 row or swiglu4 of a gate
// and an up row; through cuda_quant_blocks.cuh's quantize_quad), and one row against one
// tile (ColGroup, tile_row: the routed experts' rows and the dense GEMM at T = 1). The layout
// these read is described in the header of cuda_quant_mma.cu. Included by .cu only.

#include <cstdint>
#include <utility>

#include "backend/cuda/cuda_quant_blocks.cuh"
#include "backend/cuda/cuda_quant_tiles.cuh"

namespace qwen36::cuda {
namespace {

constexpr int kTabStride = 10;  // float2 per row of Q4_K's (S, M) table: 8 groups + 2 pad (no bank conflicts)

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
// d = a · b over 16 k, s8 × s8 (NVFP4's two 16-groups of a k32 group)
__device__ __forceinline__ void mma_s8s8_k16(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(b), "r"(0));
}
// d = a · b + {c0, c1, c0, c1} (k16: rows g, g + 8 share the per-token init)
__device__ __forceinline__ void mma_u8s8_k16(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b, int c0, int c1) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%8,%7,%8};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(b), "r"(c0), "r"(c1));
}

// c += a · b, U: u8 (else s8) codes times s8 activations; k32 (a0..a3, b0, b1) or k16 (a0, a1, b0).
template <bool U>
__device__ __forceinline__ void mma_k32_acc(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                            uint32_t b0, uint32_t b1) {
  if constexpr (U)
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  else
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <bool U>
__device__ __forceinline__ void mma_k16_acc(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  if constexpr (U)
    asm("mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

__device__ __forceinline__ int sext8(uint32_t v) { return int(int8_t(uint8_t(v & 255u))); }

// A tile into a warp's shared-memory stage: lane L copies bytes 512 i + 16 L (the same bytes its
// own fragments come from), the tail (headers) by the first lanes. dst, src: the stage and the
// tile advanced by this lane's 16 L; the copies address them with immediate offsets (built from
// a generic pointer per copy, the compiler spent two 64-bit adds on each).
template <int B, int... I>
__device__ __forceinline__ void issue_tile(uint32_t dst, const uint8_t* __restrict__ src, int lane,
                                           std::integer_sequence<int, I...>) {
  (cp_async16_at<512 * I>(dst, src), ...);
  if (16 * lane < B % 512) cp_async16_at<B / 512 * 512>(dst, src);
}
template <int B>
__device__ __forceinline__ void issue_tile(uint32_t dst, const uint8_t* __restrict__ src, int lane) {
  issue_tile<B>(dst, src, lane, std::make_integer_sequence<int, B / 512>{});
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
template <>
struct Raw<DType::NVFP4_B64_T16> {
  uint4 q[4], h;  // h: the half-tile header of row lane % 16, half lane / 16
};
template <>
struct Raw<DType::W4_G32_T16> {
  uint4 q[4], h;  // as NVFP4's
};
template <>
struct Raw<DType::W4_G128_T16> {
  uint4 q[4];
  uint2 h0, h1;  // the headers of rows g and g + 8
};

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
  } else if constexpr (D == DType::NVFP4_B64_T16 || D == DType::W4_G32_T16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) R.q[i] = ld4(tile + 512 * i + 16 * lane);
    R.h = ld4(tile + 2048 + 32 * (lane & 15) + 16 * (lane >> 4));
  } else if constexpr (D == DType::W4_G128_T16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) R.q[i] = ld4(tile + 512 * i + 16 * lane);
    auto ld2 = [](const uint8_t* p) {
      const uint2* q = reinterpret_cast<const uint2*>(p);
      return GLOBAL ? (STREAM ? __ldcs(q) : __ldg(q)) : *q;
    };
    R.h0 = ld2(tile + 2048 + 8 * g);
    R.h1 = ld2(tile + 2048 + 8 * (g + 8));
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

// A lane's 4 float pairs (row lane % 16, k32 groups 4·(lane / 16) .. + 3) into the warp's table
// (16 rows × kTabStride), which every lane then reads by row and group: the per-tile scale
// tables of q4k_table, w4g32_table and nvfp4_table.
__device__ __forceinline__ void store_table(const float2 (&v)[4], int lane, float2* tab) {
  float4* dst = reinterpret_cast<float4*>(tab + (lane & 15) * kTabStride + 4 * (lane >> 4));
  __syncwarp();  // the previous tile's readers are done
  dst[0] = make_float4(v[0].x, v[0].y, v[1].x, v[1].y);
  dst[1] = make_float4(v[2].x, v[2].y, v[3].x, v[3].y);
  __syncwarp();
}

// Q4_K: the tile's (S, M) = (d·sc, dmin·m), S of the odd groups divided by 16: their A
// fragments are the codes' high nibbles in place, 16·q (a_frags), so (S / 16) · (x · 16c) is
// S · (x · c) exactly (powers of two), and every epilogue computes what it computes with q.
// A lane's share of a Q4_K row header h (row lane % 16): the 6-bit scales and mins of k32 groups
// 4 · (lane / 16) .. + 3, one a byte, and the row's d and dmin.
struct Q4kScales {
  uint32_t sc4, m4;
  float d, dmin;
};
__device__ __forceinline__ Q4kScales q4k_scales(const uint4& h, int lane) {
  const bool up = lane >= 16;
  return {up ? (h.w & 0x0F0F0F0Fu) | ((h.y >> 2) & 0x30303030u) : h.y & 0x3F3F3F3Fu,
          up ? ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u) : h.z & 0x3F3F3F3Fu,
          h2f(uint16_t(h.x & 0xFFFFu)), h2f(uint16_t(h.x >> 16))};
}
__device__ __forceinline__ void q4k_table(const uint4& h, int lane, float2* tab) {
  const Q4kScales q = q4k_scales(h, lane);
  float2 sm[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    sm[i] = make_float2(q.d * float((q.sc4 >> (8 * i)) & 255u) * (i & 1 ? 0.0625f : 1.0f),
                        q.dmin * float((q.m4 >> (8 * i)) & 255u));
  store_table(sm, lane, tab);
}

// W4_G32: the tile's (S, M) = (s, s · z) (s · z is exact in f32: 11 significant bits times at
// most 16).
__device__ __forceinline__ void w4g32_table(const uint4& h, int lane, float2* tab) {
  float2 sm[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float s = w4g32_scale(h, i);
    sm[i] = make_float2(s, s * float(w4g32_zero(h, i)));
  }
  store_table(sm, lane, tab);
}

// NVFP4: the tile's two 16-group scales per k32 group (nvfp4_scales).
__device__ __forceinline__ void nvfp4_table(const uint4& h, int lane, float2* tab) {
  float2 s[4];
  nvfp4_scales(h, s);
  store_table(s, lane, tab);
}

// The low 4 bits of k32 group jj's A fragments from a nibble tile's code registers (Q6_K,
// W4_G128, W4_G32: word X of rows g, Y of rows g + 8; low nibbles k 4t.., high nibbles k 16 + 4t..).
__device__ __forceinline__ void nibble_frags(const uint4 (&q)[4], int jj, uint32_t& a0, uint32_t& a1, uint32_t& a2,
                                             uint32_t& a3) {
  const uint4& v = q[jj >> 1];
  const uint32_t X = (jj & 1) ? v.z : v.x, Y = (jj & 1) ? v.w : v.y;
  a0 = X & 0x0F0F0F0Fu, a1 = Y & 0x0F0F0F0Fu, a2 = (X >> 4) & 0x0F0F0F0Fu, a3 = (Y >> 4) & 0x0F0F0F0Fu;
}

// The A fragments of k32 group jj (0..7, a compile-time index once unrolled) of a lane's tile
// registers: Q4_K / Q6_K codes as u8 (Q6_K with its high bits, 0..63), Q8_0 as s8, W4_G128 as s8
// code − zero (−16..15), NVFP4 as s8 2·e2m1.
template <DType D>
__device__ __forceinline__ void a_frags(const Raw<D>& R, int jj, uint32_t& a0, uint32_t& a1, uint32_t& a2,
                                        uint32_t& a3) {
  if constexpr (D == DType::Q8_0_T16) {
    a0 = R.q[jj].x, a1 = R.q[jj].y, a2 = R.q[jj].z, a3 = R.q[jj].w;
  } else if constexpr (D == DType::NVFP4_B64_T16) {
    const uint4& v = R.q[jj >> 1];
    const uint32_t X = (jj & 1) ? v.z : v.x, Y = (jj & 1) ? v.w : v.y;
    a0 = nvfp4_frag(X), a1 = nvfp4_frag(Y), a2 = nvfp4_frag(X >> 16), a3 = nvfp4_frag(Y >> 16);
  } else if constexpr (D == DType::Q4_K_T16) {
    // Group 2i in the low nibbles of load i's words, 2i + 1 in the high ones (TileLayout): one
    // AND a register; the odd group's fragments are 16·q (u8 ≤ 240), its S in the table S / 16.
    const uint4& v = R.q[jj >> 1];
    const uint32_t m = (jj & 1) ? 0xF0F0F0F0u : 0x0F0F0F0Fu;
    a0 = v.x & m, a1 = v.y & m, a2 = v.z & m, a3 = v.w & m;
  } else {
    nibble_frags(R.q, jj, a0, a1, a2, a3);
    if constexpr (D == DType::Q6_K_T16) {
      const uint32_t H = pick(R.hb[jj >> 2], jj & 3);
      a0 |= (H << 4) & 0x30303030u;
      a1 |= (H << 2) & 0x30303030u;
      a2 |= H & 0x30303030u;
      a3 |= (H >> 2) & 0x30303030u;
    } else if constexpr (D == DType::W4_G128_T16) {
      // Per byte (128 + q − z) ^ 128 = q − z as s8: 128 + q ≥ z, so no byte borrows from the next
      // (3 integer instructions a word; __vsub4 is an emulated sequence).
      const uint32_t zg = w4_zeros(R.h0, jj >> 2), zg8 = w4_zeros(R.h1, jj >> 2);
      auto sub = [](uint32_t q, uint32_t z) { return ((q | 0x80808080u) - z) ^ 0x80808080u; };
      a0 = sub(a0, zg), a1 = sub(a1, zg8), a2 = sub(a2, zg), a3 = sub(a3, zg8);
    }
  }
}

// The f32 scales of k32 group jj of rows g (e0) and g + 8 (e1) for the types whose codes are
// s8 with one scale per (row, group): Q8_0 (f16 d per 32), W4_G128 (per 128).
template <DType D>
__device__ __forceinline__ void s8_scales(const Raw<D>& R, int jj, float& e0, float& e1) {
  if constexpr (D == DType::Q8_0_T16) {
    e0 = h2f(uint16_t(pick(R.d0, jj >> 1) >> (16 * (jj & 1))));
    e1 = h2f(uint16_t(pick(R.d1, jj >> 1) >> (16 * (jj & 1))));
  } else {
    e0 = w4_scale(R.h0, jj >> 2);
    e1 = w4_scale(R.h1, jj >> 2);
  }
}

// One k32 group of one activation row as quantize_kernel quantizes it (bitwise the same codes
// and scales): b[t] is the B fragment of every lane with t = lane % 4 (codes 4t .. 4t + 3 and
// 16 + 4t .. 16 + 4t + 3), whatever its g, so all 8 MMA columns hold this row; s = {d, d·Σq,
// −32·ΣqA, −32·ΣqB} (the last two bit-cast ints: Q6_K's offsets per 16-half).
struct __align__(16) ColGroup {
  uint2 b[4];
  float4 s;
};
static_assert(sizeof(ColGroup) == 48);

// Quad id (weights 4u .. 4u + 3 of group j = id / 8, u = id % 8) of a row, quantized (qq from
// quantize_quad), into its ColGroup: word u & 3 of b[0..3].x (u < 4) or .y (u ≥ 4); u = 0 also
// stores the group's scales.
__device__ __forceinline__ void store_col_quad(ColGroup* __restrict__ out, int id, const QuantQuad& qq) {
  const int j = id >> 3, u = id & 7;
  reinterpret_cast<uint32_t*>(&out[j].b[u & 3])[u >> 2] = qq.packed;
  if (u == 0)
    out[j].s = make_float4(qq.d, qq.d * float(qq.half + qq.other), __int_as_float(-32 * qq.half),
                           __int_as_float(-32 * qq.other));
}

// A row of 32·G values, quad id = load(id) (id < 8·G), into out[0, G): every thread of the
// block, 8 per group (a thread per 4 weights, as quantize_kernel); G % 4 == 0, so every warp is
// whole in every round. A thread issues its kR loads before it quantizes any: one L2 round
// trip for G·8 ≤ kR · threads, not one per round.
template <typename Load>
__device__ __forceinline__ void quantize_row_of(Load load, int G, ColGroup* __restrict__ out) {
  constexpr int kR = 4;
  const int n = G * 8, nt = int(blockDim.x);
  for (int id0 = int(threadIdx.x); id0 - int(threadIdx.x) < n; id0 += kR * nt) {
    float4 v[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r)
      if (const int id = id0 + r * nt; id < n) v[r] = load(id);
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const int id = id0 + r * nt;
      if (id >= n) break;  // warp-uniform: n and nt are multiples of 32
      store_col_quad(out, id, quantize_quad(v[r]));
    }
  }
}
// x[0, 32·G) into out[0, G).
__device__ __forceinline__ void quantize_row(const float* __restrict__ x, int G, ColGroup* __restrict__ out) {
  quantize_row_of([x](int id) { return reinterpret_cast<const float4*>(x)[id]; }, G, out);
}
// silu(g) ⊙ u of 4 values (swiglu_kernel's arithmetic).
__device__ __forceinline__ float4 swiglu4(const float4& g, const float4& u) {
  return make_float4(silu_f(g.x) * u.x, silu_f(g.y) * u.y, silu_f(g.z) * u.z, silu_f(g.w) * u.w);
}

// A tile's scales before its groups: Q4_K's (d·sc, dmin·m), W4_G32's (s, s·z) and NVFP4's
// 16-group scales, tables in the warp's shared memory (q4k_table, w4g32_table, nvfp4_table),
// Q6_K's f16 d of rows g (dg) and g + 8 (dg8); Q8_0's and W4_G128's are per group (s8_scales).
template <DType D>
__device__ __forceinline__ void tile_scales(const Raw<D>& R, int lane, [[maybe_unused]] float2* tab,
                                            [[maybe_unused]] float& dg, [[maybe_unused]] float& dg8) {
  if constexpr (D == DType::Q4_K_T16) {
    q4k_table(R.h, lane, tab);
  } else if constexpr (D == DType::W4_G32_T16) {
    w4g32_table(R.h, lane, tab);
  } else if constexpr (D == DType::NVFP4_B64_T16) {
    nvfp4_table(R.h, lane, tab);
  } else if constexpr (D == DType::Q6_K_T16) {
    dg = h2f(uint16_t(R.d & 0xFFFFu));
    dg8 = h2f(uint16_t(R.d >> 16));
  }
}

// k32 group jj of a tile (its A fragments a0..a3 already unpacked) against the 8 MMA columns'
// quantized rows: xb the groups of this lane's B column g (lane / 4), xf0 / xf1 those of its C
// columns 2t, 2t + 1 (t = lane % 4); tab, dg, dg8: tile_scales'. acc[0] += (row g, 2t), acc[1] +=
// (g, 2t + 1), acc[2] += (g + 8, 2t), acc[3] += (g + 8, 2t + 1).
template <DType D>
__device__ __forceinline__ void group_cols(const Raw<D>& R, int jj, uint32_t a0, uint32_t a1, uint32_t a2,
                                           uint32_t a3, const ColGroup* __restrict__ xb,
                                           const ColGroup* __restrict__ xf0, const ColGroup* __restrict__ xf1,
                                           int lane, [[maybe_unused]] const float2* tab, [[maybe_unused]] float dg,
                                           [[maybe_unused]] float dg8, float (&acc)[4]) {
  const int t = lane & 3;
  const uint2 bf = xb[jj].b[t];
  const float4 f0 = xf0[jj].s, f1 = xf1[jj].s;
  if constexpr (min_tile(D)) {
    const int g = lane >> 2;
    const float2 m0 = tab[g * kTabStride + jj], m1 = tab[(g + 8) * kTabStride + jj];
    int c[4];
    mma_u8s8_k32(c, a0, a1, a2, a3, bf.x, bf.y);
    acc[0] = fmaf(m0.x, f0.x * float(c[0]), fmaf(-m0.y, f0.y, acc[0]));
    acc[1] = fmaf(m0.x, f1.x * float(c[1]), fmaf(-m0.y, f1.y, acc[1]));
    acc[2] = fmaf(m1.x, f0.x * float(c[2]), fmaf(-m1.y, f0.y, acc[2]));
    acc[3] = fmaf(m1.x, f1.x * float(c[3]), fmaf(-m1.y, f1.y, acc[3]));
  } else if constexpr (D == DType::Q6_K_T16) {
    const uint32_t w0 = pick(R.sc0, jj >> 1) >> (16 * (jj & 1)), w1 = pick(R.sc1, jj >> 1) >> (16 * (jj & 1));
    const int sa0 = sext8(w0), sb0 = sext8(w0 >> 8), sa1 = sext8(w1), sb1 = sext8(w1 >> 8);
    int ca[4], cb[4];
    mma_u8s8_k16(ca, a0, a1, bf.x, __float_as_int(f0.z), __float_as_int(f1.z));  // Σ (q − 32) · x, first 16
    mma_u8s8_k16(cb, a2, a3, bf.y, __float_as_int(f0.w), __float_as_int(f1.w));  // and the second
    acc[0] = fmaf(dg * f0.x, float(sa0 * ca[0] + sb0 * cb[0]), acc[0]);
    acc[1] = fmaf(dg * f1.x, float(sa0 * ca[1] + sb0 * cb[1]), acc[1]);
    acc[2] = fmaf(dg8 * f0.x, float(sa1 * ca[2] + sb1 * cb[2]), acc[2]);
    acc[3] = fmaf(dg8 * f1.x, float(sa1 * ca[3] + sb1 * cb[3]), acc[3]);
  } else if constexpr (D == DType::NVFP4_B64_T16) {
    const int g = lane >> 2;
    const float2 m0 = tab[g * kTabStride + jj], m1 = tab[(g + 8) * kTabStride + jj];
    int ca[4], cb[4];
    mma_s8s8_k16(ca, a0, a1, bf.x);  // the first 16-group
    mma_s8s8_k16(cb, a2, a3, bf.y);  // the second
    acc[0] = fmaf(m0.y * f0.x, float(cb[0]), fmaf(m0.x * f0.x, float(ca[0]), acc[0]));
    acc[1] = fmaf(m0.y * f1.x, float(cb[1]), fmaf(m0.x * f1.x, float(ca[1]), acc[1]));
    acc[2] = fmaf(m1.y * f0.x, float(cb[2]), fmaf(m1.x * f0.x, float(ca[2]), acc[2]));
    acc[3] = fmaf(m1.y * f1.x, float(cb[3]), fmaf(m1.x * f1.x, float(ca[3]), acc[3]));
  } else {
    float e0, e1;
    s8_scales(R, jj, e0, e1);
    int c[4];
    mma_s8s8_k32(c, a0, a1, a2, a3, bf.x, bf.y);
    acc[0] = fmaf(e0 * f0.x, float(c[0]), acc[0]);
    acc[1] = fmaf(e0 * f1.x, float(c[1]), acc[1]);
    acc[2] = fmaf(e1 * f0.x, float(c[2]), acc[2]);
    acc[3] = fmaf(e1 * f1.x, float(c[3]), acc[3]);
  }
}

// One tile (row-tile r, super-block s) against the 8 MMA columns' quantized rows (8 groups
// each; group_cols' xb, xf0, xf1, acc). Each column's integer products and float epilogue are
// mma_kernel's for a token column and do not depend on the other columns: a row gives the same
// sums in any column, beside any others (the routed experts' grouped kernels rely on it).
template <DType D>
__device__ __forceinline__ void tile_cols(const Raw<D>& R, const ColGroup* __restrict__ xb,
                                          const ColGroup* __restrict__ xf0, const ColGroup* __restrict__ xf1,
                                          int lane, [[maybe_unused]] float2* tab, float (&acc)[4]) {
  float dg = 0.0f, dg8 = 0.0f;
  tile_scales(R, lane, tab, dg, dg8);
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
    uint32_t a0, a1, a2, a3;
    a_frags(R, jj, a0, a1, a2, a3);
    group_cols<D>(R, jj, a0, a1, a2, a3, xb, xf0, xf1, lane, tab, dg, dg8, acc);
  }
}

// tile_cols for two sets of 8 columns (x[h]: set h's xb, xf0, xf1 for set h; acc[h] its sums),
// the tile's fragments unpacked once for both; the second set only where `two` (warp-uniform).
// Each column's sums are tile_cols'.
template <DType D>
__device__ __forceinline__ void tile_cols2(const Raw<D>& R, const ColGroup* const (&x)[2][3], bool two, int lane,
                                           [[maybe_unused]] float2* tab, float (&acc)[2][4]) {
  float dg = 0.0f, dg8 = 0.0f;
  tile_scales(R, lane, tab, dg, dg8);
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
    uint32_t a0, a1, a2, a3;
    a_frags(R, jj, a0, a1, a2, a3);
    group_cols<D>(R, jj, a0, a1, a2, a3, x[0][0], x[0][1], x[0][2], lane, tab, dg, dg8, acc[0]);
    if (two) group_cols<D>(R, jj, a0, a1, a2, a3, x[1][0], x[1][1], x[1][2], lane, tab, dg, dg8, acc[1]);
  }
}

// One tile against one quantized row (its 8 groups at xg) in every MMA column: acc0 += rows g,
// acc1 += rows g + 8 of the tile (the 4 lanes of a g hold the same values). tile_cols with one
// row; the other column's arithmetic is dead and compiles away.
template <DType D>
__device__ __forceinline__ void tile_row(const Raw<D>& R, const ColGroup* __restrict__ xg, int lane, float2* tab,
                                         float& acc0, float& acc1) {
  float acc[4] = {acc0, acc0, acc1, acc1};
  tile_cols<D>(R, xg, xg, xg, lane, tab, acc);
  acc0 = acc[0], acc1 = acc[2];
}

}  // namespace
}  // namespace qwen36::cuda
