#pragma once
// defines (file-local to the .cu that includes it, cuda_quant_mma.cu): the multi-token GEMM's
// Q4_K tile on f16 tensor cores (an experiment, F16 in mma_block; reached only through the test
// hook q4k_f16_mma_matmul) and the f16 activation fragments it reads (f16_act_kernel).
//
// Why: the int8 multi-token kernel applies each k32 group's scales in f32 per (row, token,
// group), ~19 instructions a lane per 16 weights and n8 tile of tokens, so its cost grows with the
// tokens (a 27B b16 step runs its Q4_K GEMMs at ~55% of the copy bandwidth, bench/RESULTS.md,
// session 44). Here the 6-bit sub-block scale goes into the weights: A = q · sc (integers
// ≤ 945, exact in f16) from the tile's nibbles with the f16 magic-number trick —
// (w & 0x000F000F) | 0x64006400 is 1024 + q (low nibbles), (w & 0x00F000F0) | 0x54005400 is
// 64 + q (high nibbles), fma(m + q, sc, −m · sc) = q · sc with one exact rounding — so a tile's 8
// groups accumulate in one f32 C per n8 tile, scaled once by the row's d; the per-lane cost grows
// with the weights, not the tokens. The min term Σ_j dmin · m_j · X_j (X_j the f32 sum of group
// j's f16 activations) is one more m16n8k16 MMA a tile whose k halves hold X_j's f16 high and low
// parts (~2^-22 of X_j). x is rounded to f16 once (relative 2^-11, finer than the int8 path's
// per-32 rounding); values past 65504 overflow (no per-token scaling in the experiment).
//
// K order: a tile word holds k 4t .. 4t + 3 of its row (the int8 m16n8k32 A fragment), so
// (w & mask) takes k 4t and 4t + 2 and (w >> 8) & mask k 4t + 1 and 4t + 3. The f16 m16n8k16's
// logical k 2t, 2t + 1, 2t + 8, 2t + 9 are those physical k, and the activation fragments are
// written in the same order (f16_act_kernel): the dot product does not care which k is which.
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/cuda_quant_mma_frags.cuh"

namespace qwen36::cuda {
namespace {

constexpr uint32_t kF16MagicLo = 0x64006400u;  // f16 1024: + q in mantissa bits 0-3
constexpr uint32_t kF16MagicHi = 0x54005400u;  // f16 64: + q in mantissa bits 4-7

__device__ __forceinline__ uint32_t hfma2u(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ uint32_t hsub2u(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ uint32_t hmul2u(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
// c += a · b, m16n8k16, f16 inputs, f32 accumulators.
__device__ __forceinline__ void hmma16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_h2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
// (byte k0 of w, byte k1 of w) as f16 (6-bit scales and mins): 1024 + v by the magic, minus 1024.
__device__ __forceinline__ uint32_t bytes_h2(uint32_t w, int k0, int k1) {
  const uint32_t s = uint32_t(k0) | 0x40u | uint32_t(k1) << 8 | 0x4000u;
  return hsub2u(prmt(w, 0x64646464u, s), kF16MagicLo);
}

// x [T, K] f32 → the f16 B fragments of every (k32 group G, n8 tile n, lane), at (G·NT + n)·32 +
// lane: lane (g, t) holds token 8n + g's {x[4t], x[4t+2]}, {x[4t+1], x[4t+3]}, {x[16+4t],
// x[16+4t+2]}, {x[16+4t+1], x[16+4t+3]} of the group (the k order of the tile's words), and per
// (super-block s, n, lane) at (s·NT + n)·32 + lane the min MMA's B: {hi(X_2t), hi(X_2t+1)},
// {lo(X_2t), lo(X_2t+1)} of token 8n + g. Tokens past T are zeros. A warp per (G, n).
__global__ void f16_act_kernel(const float* __restrict__ x, int T, int K, int NT, uint4* __restrict__ xh,
                               __half* __restrict__ xm) {
  griddep_trigger();
  griddep_wait();
  const int lane = int(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  const long long wid = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const long long groups = K / 32;
  if (wid >= groups * NT) return;
  const int n = int(wid % NT);
  const long long G = wid / NT;
  const int tok = 8 * n + g;
  float v[8] = {};
  if (tok < T) {
    const float* p = x + size_t(tok) * K + size_t(G) * 32;
    const float4 a = *reinterpret_cast<const float4*>(p + 4 * t), b = *reinterpret_cast<const float4*>(p + 16 + 4 * t);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
  float r[8], sum = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) sum += r[i] = __half2float(__float2half_rn(v[i]));
  xh[size_t(wid) * 32 + lane] = make_uint4(pack_h2(r[0], r[2]), pack_h2(r[1], r[3]), pack_h2(r[4], r[6]), pack_h2(r[5], r[7]));
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  if (t == 0) {
    const int j = int(G % 8);
    const __half hi = __float2half_rn(sum), lo = __float2half_rn(sum - __half2float(hi));
    __half* e = xm + ((size_t(G / 8) * NT + n) * 32 + g * 4 + j / 2) * 4;
    e[j & 1] = hi;
    e[2 + (j & 1)] = lo;
  }
}

// One Q4_K tile against the f16 fragments of its super-block (xh: its first group's, lane's
// entry; xm: its min B, lane's entry): acc[n] += d · C − dmin · C_min per row.
template <int NT, bool XS>
__device__ __forceinline__ void q4k_f16_tile(const Raw<DType::Q4_K_T16>& R, const uint4* __restrict__ xh,
                                             const uint2* __restrict__ xm, int lane, float (&acc)[NT][4]) {
  const int g = lane >> 2, t = lane & 3;
  uint4 hg, hg8;  // the headers of rows g and g + 8 (lane r holds row r % 16's)
  hg.x = __shfl_sync(0xffffffffu, R.h.x, g), hg8.x = __shfl_sync(0xffffffffu, R.h.x, g + 8);
  hg.y = __shfl_sync(0xffffffffu, R.h.y, g), hg8.y = __shfl_sync(0xffffffffu, R.h.y, g + 8);
  hg.z = __shfl_sync(0xffffffffu, R.h.z, g), hg8.z = __shfl_sync(0xffffffffu, R.h.z, g + 8);
  hg.w = __shfl_sync(0xffffffffu, R.h.w, g), hg8.w = __shfl_sync(0xffffffffu, R.h.w, g + 8);
  // Q4_K's 12 scale bytes: 6-bit scales of groups 0-3 and 4-7, and mins, rows g and g + 8
  const uint32_t sc_lo = hg.y & 0x3F3F3F3Fu, sc_hi = (hg.w & 0x0F0F0F0Fu) | ((hg.y >> 2) & 0x30303030u);
  const uint32_t sc8_lo = hg8.y & 0x3F3F3F3Fu, sc8_hi = (hg8.w & 0x0F0F0F0Fu) | ((hg8.y >> 2) & 0x30303030u);
  float C[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) C[n][0] = C[n][1] = C[n][2] = C[n][3] = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 q = R.q[i];
    const uint32_t X8 = q.x >> 8, Y8 = q.y >> 8, Z8 = q.z >> 8, W8 = q.w >> 8;
#pragma unroll
    for (int par = 0; par < 2; ++par) {  // group 2i (low nibbles), 2i + 1 (high)
      const int j = 2 * i + par;
      const uint32_t mask = par ? 0x00F000F0u : 0x000F000Fu, magic = par ? kF16MagicHi : kF16MagicLo;
      const uint32_t neg = par ? 0xD400D400u : 0xE400E400u;  // −64, −1024
      const uint32_t sc = bytes_h2(j < 4 ? sc_lo : sc_hi, j & 3, j & 3);
      const uint32_t sc8 = bytes_h2(j < 4 ? sc8_lo : sc8_hi, j & 3, j & 3);
      const uint32_t bias = hmul2u(sc, neg), bias8 = hmul2u(sc8, neg);
      auto w0 = [&](uint32_t v) { return hfma2u((v & mask) | magic, sc, bias); };    // row g
      auto w1 = [&](uint32_t v) { return hfma2u((v & mask) | magic, sc8, bias8); };  // row g + 8
      const uint32_t a0 = w0(q.x), a1 = w1(q.y), a2 = w0(X8), a3 = w1(Y8);
      const uint32_t c0 = w0(q.z), c1 = w1(q.w), c2 = w0(Z8), c3 = w1(W8);
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const uint4 bx = ldx<XS>(xh + (j * NT + n) * 32);
        hmma16(C[n], a0, a1, a2, a3, bx.x, bx.y);
        hmma16(C[n], c0, c1, c2, c3, bx.z, bx.w);
      }
    }
  }
  // The min term: A = m of groups 2t, 2t + 1 in both k halves, B = the groups' sums (hi, lo).
  const uint32_t m_lo = hg.z & 0x3F3F3F3Fu, m_hi = ((hg.w >> 4) & 0x0F0F0F0Fu) | ((hg.z >> 2) & 0x30303030u);
  const uint32_t m8_lo = hg8.z & 0x3F3F3F3Fu, m8_hi = ((hg8.w >> 4) & 0x0F0F0F0Fu) | ((hg8.z >> 2) & 0x30303030u);
  const int k0 = (2 * t) & 3;
  const uint32_t am = bytes_h2(t < 2 ? m_lo : m_hi, k0, k0 + 1), am8 = bytes_h2(t < 2 ? m8_lo : m8_hi, k0, k0 + 1);
  const float d = h2f(uint16_t(hg.x & 0xFFFFu)), dmin = h2f(uint16_t(hg.x >> 16));
  const float d8 = h2f(uint16_t(hg8.x & 0xFFFFu)), dmin8 = h2f(uint16_t(hg8.x >> 16));
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    float cm[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const uint2 mv = ldx<XS>(xm + n * 32);
    hmma16(cm, am, am8, am, am8, mv.x, mv.y);
    acc[n][0] = fmaf(d, C[n][0], fmaf(-dmin, cm[0], acc[n][0]));
    acc[n][1] = fmaf(d, C[n][1], fmaf(-dmin, cm[1], acc[n][1]));
    acc[n][2] = fmaf(d8, C[n][2], fmaf(-dmin8, cm[2], acc[n][2]));
    acc[n][3] = fmaf(d8, C[n][3], fmaf(-dmin8, cm[3], acc[n][3]));
  }
}

}  // namespace
}  // namespace qwen36::cuda
