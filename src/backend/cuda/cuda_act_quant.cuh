#pragma once
// defines (file-local to each .cu that includes it): ActLayout (where the tiled GEMM's int8
// activations live in a workspace) and store_act_quad (one thread's 4 codes and its group's
// scales into it): the layout of cuda_quant_mma.cu's header, written by its quantize_kernel and
// by kernels that quantize their own output for the GEMM after them (the add_rms_norm kernel,
// cuda_elementwise.cu; used by cuda_quant_norm.cu).
// Included by .cu files only.

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/cuda_quant_blocks.cuh"

namespace qwen36::cuda {

// The tokens (a multiple of 8) of the warpgroup GEMM's slabs where that form runs at T tokens of
// width K on the current device (cuda_quant_wgmma.cu: QWEN36_MMA_WG, 17-64 tokens, sm_90a), else 0.
int wg_slab_tokens(int64_t T, int64_t K);

namespace {

// n8 tiles of tokens the GEMM computes for T tokens (T ≤ 64): the kernels are instantiated for
// 1, 2, 4 and 8; tokens T .. 8·NT − 1 are padding whose codes are zero.
inline int act_n_tiles(int64_t T) { return T <= 8 ? 1 : T <= 16 ? 2 : T <= 32 ? 4 : 8; }

// [K/32][NT][32] uint2 B fragments, then [K/32][NT][4] float4 {d, d·Σq} of token pairs, then
// [K/32][NT][4] int4 of Q6_K's −32·Σq per 16-half; each part 256-byte aligned. Beyond 16 tokens
// (NT ≥ 4) also the activations rounded to bf16 (o_xh, store_act_half), which the Q4_K and Q6_K
// tiles read there: as the bf16 GEMM's B fragments ([K/32][NT][32] uint4, cuda_quant_mma_half.cuh),
// or where the warpgroup form runs (np > 0) as its slabs of np tokens (cuda_quant_wgmma.cu's
// header; no more bytes than the fragments). Every producer and the GEMM build the layout from
// the same (T, K), so they agree on which.
struct ActLayout {
  int64_t G = 0;  // k32 groups
  int NT = 1;
  int np = 0;     // o_xh holds slabs of np tokens (0: B fragments)
  size_t o_xb = 0, o_xf = 0, o_xi = 0, o_xh = 0, bytes = 0;  // o_xh = 0: none (NT ≤ 2)

  ActLayout(int64_t T, int64_t K) : G(K / 32), NT(act_n_tiles(T)) {
    auto up = [](size_t b) { return (b + 255) / 256 * 256; };
    const size_t frags = size_t(G) * size_t(NT);
    o_xf = o_xb + up(frags * 32 * sizeof(uint2));
    o_xi = o_xf + up(frags * 4 * sizeof(float4));
    bytes = o_xi + up(frags * 4 * sizeof(int4));
    if (NT >= 4) {
      o_xh = bytes, bytes += up(frags * 32 * sizeof(uint4));
      if (K % 256 == 0) np = wg_slab_tokens(T, K);
    }
  }
};

// Token c's codes 4u .. 4u + 3 of k32 group j (u = lane % 8 of the 8 lanes holding the group,
// qq from quantize_quad): one 32-bit store; lane u = 0 also stores the group's scales.
__device__ __forceinline__ void store_act_quad(uint8_t* __restrict__ xb, float* __restrict__ xf,
                                               int* __restrict__ xi, int NT, int c, int64_t j, int u,
                                               const QuantQuad& qq) {
  const int nt = c >> 3, gg = c & 7;
  const size_t frag = size_t(j) * size_t(NT) + size_t(nt);
  // weights 4u .. 4u + 3: t = u % 4, 16-half u / 4
  *reinterpret_cast<uint32_t*>(xb + (frag * 32 + 4 * gg + (u & 3)) * 8 + 4 * (u >> 2)) = qq.packed;
  if (u == 0) {  // entry (frag, t = gg / 2); this token is its (gg & 1)-th
    const size_t e = (frag * 4 + size_t(gg >> 1)) * 4;
    xf[e + 2 * (gg & 1)] = qq.d;  // float4 {d, d·Σq} of token 2t, then of 2t + 1
    xf[e + 2 * (gg & 1) + 1] = qq.d * float(qq.half + qq.other);
    xi[e + (gg & 1)] = -32 * qq.half;  // int4 {−32·ΣqA(2t), −32·ΣqA(2t+1), −32·ΣqB(2t), −32·ΣqB(2t+1)}
    xi[e + 2 + (gg & 1)] = -32 * qq.other;
  }
}

// Token c's values 4u .. 4u + 3 of k32 group j (v, unquantized) rounded to bf16, as the pairs
// (v.x, v.z) and (v.y, v.w) (the k order of cuda_quant_mma_half.cuh's header): np = 0 into the
// bf16 GEMM's B fragments, lane (c % 8, u % 4) of fragment (j, c / 8), its 8-byte half u / 4;
// np > 0 (ActLayout::np) into the warpgroup GEMM's slabs, word u % 4 of token c's row of core
// matrices 0 (the even k) and 1 (the odd k) of k16 step 2j + u / 4 (tokens c ≥ np have no place).
__device__ __forceinline__ void store_act_half(uint4* __restrict__ xh, int NT, int np, int c, int64_t j, int u,
                                               float4 v) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.z), hi = __floats2bfloat162_rn(v.y, v.w);
  const uint32_t lw = *reinterpret_cast<const uint32_t*>(&lo), hw = *reinterpret_cast<const uint32_t*>(&hi);
  if (np > 0) {
    if (c >= np) return;
    const int64_t step = 2 * j + (u >> 2);
    uint32_t* at = reinterpret_cast<uint32_t*>(xh + (step * (np >> 3) + (c >> 3)) * 16 + (c & 7)) + (u & 3);
    at[0] = lw;   // core matrix 0: 128 bytes = 8 uint4 …
    at[32] = hw;  // … before core matrix 1
    return;
  }
  const size_t frag = size_t(j) * size_t(NT) + size_t(c >> 3);
  reinterpret_cast<uint2*>(xh + frag * 32 + 4 * (c & 7) + (u & 3))[u >> 2] = make_uint2(lw, hw);
}

// The sum of squares of a normalised row in one fixed order, whatever the block's size, so that
// the norm kernel and every block of a one-token GEMM that computes the norm itself (mma_kernel's
// NormIn) get the same float and so the same x, bitwise. A thread holds quad i (4 values) of the
// row; the 8 quads of a k32 group are 8 consecutive lanes (quad i on lane i % 8 of its octet:
// blocks of whole warps). group_ss: the group's sum by a 3-step xor tree (every lane of the octet
// gets it; lane 0 of the octet stores it to gss[group]); row_ss, after a barrier: lane l adds
// gss[l + 32 i] for ascending i, then a 5-step xor tree (every lane of every warp gets it).
__device__ __forceinline__ float quad_ss(float4 v) { return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w; }
__device__ __forceinline__ float group_ss(float q) {
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) q += __shfl_xor_sync(0xffffffffu, q, o);
  return q;
}
__device__ __forceinline__ float row_ss(const float* gss, int G) {
  const int lane = int(threadIdx.x & 31);
  float s = 0.0f;
  for (int j = lane; j < G; j += 32) s += gss[j];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

}  // namespace
}  // namespace qwen36::cuda
