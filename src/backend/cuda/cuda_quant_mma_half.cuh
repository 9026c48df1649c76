#pragma once
// defines (file-local to the .cu that includes it, cuda_quant_mma.cu): the multi-token GEMM's
// bf16 form for Q4_K and Q6_K tiles at 17-64 tokens (mma_kernel's HB; QWEN36_MMA_HB): a tile's
// weights dequantized to bf16 in registers, against the activations rounded to bf16 (no
// quantization), on bf16 m16n8k16 MMAs that accumulate in f32 across the whole row.
//
// Why: the int8 form pays a float epilogue per (k32 group, n8 tile of tokens) — the int32 sums
// converted, scaled by the weight's and the activation's scales and added (16 instructions a lane
// of ~19 per n8 tile, bench/RESULTS.md session 51's ncu) — so its cost grows with every 8 tokens,
// and at 17-32 tokens (a DDTree verify pass) two warps a scheduler wait on those chains. Here the
// scales go into the weights once per tile (~30 instructions a lane per k32 group for Q4_K), and
// every n8 tile adds only two MMAs and one 16-byte load: Q4_K at three n8 tiles ~40 instructions
// a group against ~65.
//
// The fragments: the tiled layout's words hold, for lane (g, t), the codes of k 4t .. 4t + 3
// (rows g, g + 8; a2 / a3 the same at k 16 + 4t). A bf16 m16n8k16 A fragment wants k-slots
// (2t, 2t + 1) and (2t + 8, 2t + 9) of its 16; a sum over k may take its terms in any order, so
// the slots are mapped to physical k (2t, 2t + 1, 2t + 8, 2t + 9) ↔ (4t, 4t + 2, 4t + 1, 4t + 3):
// a code word's bytes 0 and 2 are one register, bytes 1 and 3 the other, each one mask away
// (the 0x4300 trick: bf16 128 + q is exact for q < 128). The activations are stored in the same
// order (store_act_half, cuda_act_quant.cuh): lane (g, t)'s 16 bytes of group j are token g's
// (x[4t], x[4t + 2]), (x[4t + 1], x[4t + 3]), then the same at 16 + 4t: the B fragments of the
// group's two MMAs, one load.
//
// Numerics: w = bf16(s · q − m) with s, m rounded to bf16 (Q4_K: s = d · sc, m = dmin · m; Q6_K:
// w = bf16((q − 32) · s), s = d · sc per 16), one rounding after the exact code; x rounded to bf16
// as the prefill GEMMs round it; f32 sums. The int8 form's results differ by those roundings (the
// tests bound both against the f32 product).
// Included by .cu only.

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/cuda_quant_mma_frags.cuh"
#include "backend/cuda/cuda_sm80.cuh"

namespace qwen36::cuda {
namespace {

__device__ __forceinline__ uint32_t bf2_bits(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); }
__device__ __forceinline__ __nv_bfloat162 bits_bf2(uint32_t v) { return *reinterpret_cast<__nv_bfloat162*>(&v); }
// (v, v) as a bf16 pair, rounded to nearest even.
__device__ __forceinline__ uint32_t bf2_splat(float v) { return bf2_bits(__float2bfloat162_rn(v)); }

// The bf16 pairs 128 + code of a word's bytes 0 and 2 (lo) and 1 and 3 (hi), each byte's code
// its bits under kMask (exact: 128 + q with q < 128).
template <uint32_t kMask>
__device__ __forceinline__ void code_pairs(uint32_t w, uint32_t& lo, uint32_t& hi) {
  lo = (w & (kMask * 0x00010001u)) | 0x43004300u;
  hi = ((w >> 8) & (kMask * 0x00010001u)) | 0x43004300u;
}

// Q4_K: the warp's table of bf16 pairs {(s, s), (−m, −m)} per (row, k32 group), s = d · sc, m =
// dmin · m (no 1/16 on the odd groups: their codes are shifted down here, not used in place).
// Each lane decodes row lane % 16, groups 4 · (lane / 16) .. + 3 (q4k_scales), as q4k_table does.
__device__ __forceinline__ void q4k_half_table(const uint4& h, int lane, float2* tab) {
  const Q4kScales q = q4k_scales(h, lane);
  float2 sm[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    sm[i] = make_float2(__uint_as_float(bf2_splat(q.d * float((q.sc4 >> (8 * i)) & 255u))),
                        __uint_as_float(bf2_splat(-q.dmin * float((q.m4 >> (8 * i)) & 255u))));
  store_table(sm, lane, tab);
}

// Q6_K: the warp's table of bf16 pairs (s, s) per (row, 16-half), s = d · sc, as 32-bit words
// (row r's 16 at tab + r · kTabStride, read as words). Lane (g, t) holds rows g and g + 8's
// scales and d (Raw): it writes halves 4t .. 4t + 3 of both.
__device__ __forceinline__ void q6k_half_table(const Raw<DType::Q6_K_T16>& R, int lane, float2* tab) {
  const int g = lane >> 2, t = lane & 3;
  const float d0 = h2f(uint16_t(R.d & 0xFFFFu)), d1 = h2f(uint16_t(R.d >> 16));
  const uint32_t w0 = pick(R.sc0, t), w1 = pick(R.sc1, t);  // bytes 4t .. 4t + 3: halves 4t ..
  uint4 v0, v1;
  v0.x = bf2_splat(d0 * float(sext8(w0))), v0.y = bf2_splat(d0 * float(sext8(w0 >> 8)));
  v0.z = bf2_splat(d0 * float(sext8(w0 >> 16))), v0.w = bf2_splat(d0 * float(sext8(w0 >> 24)));
  v1.x = bf2_splat(d1 * float(sext8(w1))), v1.y = bf2_splat(d1 * float(sext8(w1 >> 8)));
  v1.z = bf2_splat(d1 * float(sext8(w1 >> 16))), v1.w = bf2_splat(d1 * float(sext8(w1 >> 24)));
  __syncwarp();  // the previous tile's readers are done
  reinterpret_cast<uint4*>(tab + g * kTabStride)[t] = v0;
  reinterpret_cast<uint4*>(tab + (g + 8) * kTabStride)[t] = v1;
  __syncwarp();
}

// A pair of codes as bf16 (128 + q) to its weight: Q4_K s · q − m (one rounding after the exact
// q), Q6_K (q − 32) · s.
__device__ __forceinline__ uint32_t q4k_weight(uint32_t v, uint32_t s, uint32_t nm) {
  const __nv_bfloat162 q = __hsub2(bits_bf2(v), __float2bfloat162_rn(128.0f));
  return bf2_bits(__hfma2(q, bits_bf2(s), bits_bf2(nm)));
}
__device__ __forceinline__ uint32_t q6k_weight(uint32_t v, uint32_t s) {
  const __nv_bfloat162 q = __hsub2(bits_bf2(v), __float2bfloat162_rn(160.0f));
  return bf2_bits(__hmul2(q, bits_bf2(s)));
}

// A tile's scale table (q4k_half_table / q6k_half_table) into the warp's tab.
template <DType D>
__device__ __forceinline__ void half_table(const Raw<D>& R, int lane, float2* tab) {
  static_assert(D == DType::Q4_K_T16 || D == DType::Q6_K_T16, "the bf16 form: Q4_K and Q6_K tiles");
  if constexpr (D == DType::Q4_K_T16)
    q4k_half_table(R.h, lane, tab);
  else
    q6k_half_table(R, lane, tab);
}

// The bf16 A fragments of k32 group jj of a tile (its table in tab): w[0..3] the first MMA's
// (k 0-15: rows g / g + 8 of the even bytes, then of the odd ones), w[4..7] the second's (k 16-31).
template <DType D>
__device__ __forceinline__ void half_group(const Raw<D>& R, int jj, int g, const float2* tab, uint32_t (&w)[8]) {
  uint32_t p0, q0, p1, q1, p2, q2, p3, q3;  // rows g / g + 8 of the first 16, then the second
  if constexpr (D == DType::Q4_K_T16) {
    // Group 2i in the low nibbles of load i's words, 2i + 1 in the high ones.
    const uint4& v = R.q[jj >> 1];
    const int sh = 4 * (jj & 1);  // a constant once unrolled
    code_pairs<0xFu>(v.x >> sh, p0, q0), code_pairs<0xFu>(v.y >> sh, p1, q1);
    code_pairs<0xFu>(v.z >> sh, p2, q2), code_pairs<0xFu>(v.w >> sh, p3, q3);
    const float2 e0 = tab[g * kTabStride + jj], e1 = tab[(g + 8) * kTabStride + jj];
    const uint32_t s0 = __float_as_uint(e0.x), n0 = __float_as_uint(e0.y);
    const uint32_t s1 = __float_as_uint(e1.x), n1 = __float_as_uint(e1.y);
    p0 = q4k_weight(p0, s0, n0), q0 = q4k_weight(q0, s0, n0), p2 = q4k_weight(p2, s0, n0), q2 = q4k_weight(q2, s0, n0);
    p1 = q4k_weight(p1, s1, n1), q1 = q4k_weight(q1, s1, n1), p3 = q4k_weight(p3, s1, n1), q3 = q4k_weight(q3, s1, n1);
  } else {
    uint32_t a0, a1, a2, a3;  // u8 codes 0..63
    a_frags(R, jj, a0, a1, a2, a3);
    code_pairs<0x3Fu>(a0, p0, q0), code_pairs<0x3Fu>(a1, p1, q1);
    code_pairs<0x3Fu>(a2, p2, q2), code_pairs<0x3Fu>(a3, p3, q3);
    // halves 2jj (k 0-15) and 2jj + 1 (k 16-31) of rows g and g + 8
    const uint2 e0 = reinterpret_cast<const uint2*>(tab + g * kTabStride)[jj];
    const uint2 e1 = reinterpret_cast<const uint2*>(tab + (g + 8) * kTabStride)[jj];
    p0 = q6k_weight(p0, e0.x), q0 = q6k_weight(q0, e0.x), p2 = q6k_weight(p2, e0.y), q2 = q6k_weight(q2, e0.y);
    p1 = q6k_weight(p1, e1.x), q1 = q6k_weight(q1, e1.x), p3 = q6k_weight(p3, e1.y), q3 = q6k_weight(q3, e1.y);
  }
  w[0] = p0, w[1] = p1, w[2] = q0, w[3] = q1, w[4] = p2, w[5] = p3, w[6] = q2, w[7] = q3;
}

// acc += a k32 group of one tile against one n8 tile of tokens: its two MMAs, w the group's A
// fragments (half_group), b the B fragments of both (one 16-byte load).
__device__ __forceinline__ void mma_group(float (&acc)[4], const uint32_t (&w)[8], const uint4& b) {
  const uint32_t lo[4] = {w[0], w[1], w[2], w[3]}, hi[4] = {w[4], w[5], w[6], w[7]};
  mma16816<__nv_bfloat16>(acc, lo, b.x, b.y);
  mma16816<__nv_bfloat16>(acc, hi, b.z, b.w);
}

// One tile against the first NL n8 tiles of tokens (of the layout's NT): xh is this lane's B
// fragments of the tile's super-block (entry (jj · NT + n) · 32 for group jj, n8 tile n).
template <DType D, int NT, int NL>
__device__ __forceinline__ void tile_half(const Raw<D>& R, const uint4* __restrict__ xh, int lane, float2* tab,
                                          float (&acc)[NT][4]) {
  const int g = lane >> 2;
  half_table(R, lane, tab);
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
    uint32_t w[8];
    half_group(R, jj, g, tab, w);
#pragma unroll
    for (int n = 0; n < NL; ++n) {
      mma_group(acc[n], w, __ldca(xh + (jj * NT + n) * 32));
    }
  }
}

// Two tiles of one super-block (row-tiles 2p and 2p + 1: the pair form, QWEN36_MMA_HB_PAIRS)
// against the same B fragments, each loaded once for both: half the fragment traffic of
// tile_half per tile. tab holds the two tiles' tables one after the other.
template <DType D, int NT, int NL>
__device__ __forceinline__ void tile_half_pair(const Raw<D>& R0, const Raw<D>& R1, const uint4* __restrict__ xh,
                                               int lane, float2* tab, float (&acc0)[NT][4], float (&acc1)[NT][4]) {
  const int g = lane >> 2;
  float2* const tab1 = tab + 16 * kTabStride;
  half_table(R0, lane, tab);
  half_table(R1, lane, tab1);
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
    uint32_t w0[8], w1[8];
    half_group(R0, jj, g, tab, w0);
    half_group(R1, jj, g, tab1, w1);
#pragma unroll
    for (int n = 0; n < NL; ++n) {
      const uint4 b = __ldca(xh + (jj * NT + n) * 32);
      mma_group(acc0[n], w0, b);
      mma_group(acc1[n], w1, b);
    }
  }
}

}  // namespace
}  // namespace qwen36::cuda
