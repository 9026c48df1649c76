#pragma once
// defines (file-local to the .cu that includes it, cuda_quant_mma.cu): the staged kernels'
// per-tile computation, one tile against the 1-3 tokens' activation rows staged in shared
// memory as ColGroups: tile_cols (a token's 8 groups in the 8 MMA columns, up to 2 tokens and the
// T = 1 decode step) and tile_pairs (3 tokens, the groups in pairs with the tokens in the
// columns). Their arithmetic is the multi-token kernel's per term (the same integers, the same
// f32 operations), so the int8 twin is the same. Included by .cu only.

#include <cstdint>

#include "backend/cuda/cuda_quant_mma_frags.cuh"

namespace qwen36::cuda {
namespace {

// Up to 3 tokens: one tile against each token's staged row (token c's 8 groups at xg + c·xrow)
// with the groups in the 8 MMA columns. tile_row gives every MMA column the same row, so the 4
// lanes of a g repeat each other's epilogue, 8 groups × 2 rows each, with 4 shared-memory reads a
// group. Here B's column jj holds group jj (lanes g == jj give their fragment of it, the others
// zeros), so one accumulator per token collects all 8 groups' integer products, each in its own
// column: lane (g, t) ends with groups 2t, 2t + 1 of rows g (c0, c1) and g + 8 (c2, c3) and
// scales just those, each group's term as tile_row's (the same integers, the same f32
// operations). The A fragments are unpacked once for all the tokens. acc[c][0] / acc[c][1]: the
// lane's partial sums of rows g / g + 8 over its groups; finish adds the 4 lanes of a g at the
// row-tile's end.
template <DType D, int TT>
__device__ __forceinline__ void tile_cols(const Raw<D>& R, const ColGroup* __restrict__ xg, int xrow, int lane,
                                          [[maybe_unused]] float2* tab, const uint32_t (&mask)[8],
                                          float (&acc)[TT][2]) {
  const int g = lane >> 2, t = lane & 3;
  [[maybe_unused]] float dg = 0.0f, dg8 = 0.0f;
  tile_scales(R, lane, tab, dg, dg8);
  constexpr bool kPair = D == DType::Q6_K_T16 || D == DType::NVFP4_B64_T16;  // two k16 MMAs a group
  constexpr bool kU8 = D == DType::Q4_K_T16 || D == DType::Q6_K_T16 || D == DType::W4_G32_T16;
  uint2 mine[TT];
  int ca[TT][4], cb[TT][4];
#pragma unroll
  for (int c = 0; c < TT; ++c) {
    mine[c] = xg[c * xrow + g].b[t];
#pragma unroll
    for (int e = 0; e < 4; ++e) ca[c][e] = cb[c][e] = 0;
  }
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
    uint32_t a0, a1, a2, a3;
    a_frags(R, jj, a0, a1, a2, a3);
#pragma unroll
    for (int c = 0; c < TT; ++c) {
      const uint32_t bx = mine[c].x & mask[jj], by = mine[c].y & mask[jj];
      if constexpr (kPair) {
        mma_k16_acc<kU8>(ca[c], a0, a1, bx);  // the first 16 of each group
        mma_k16_acc<kU8>(cb[c], a2, a3, by);  // and the second
      } else {
        mma_k32_acc<kU8>(ca[c], a0, a1, a2, a3, bx, by);
      }
    }
  }
#pragma unroll
  for (int c = 0; c < TT; ++c) {
    float& acc0 = acc[c][0];
    float& acc1 = acc[c][1];
    const float4 fa = xg[c * xrow + 2 * t].s, fb = xg[c * xrow + 2 * t + 1].s;  // {d, d·Σq, offsets}
    if constexpr (table_tile(D)) {
      const float4 m0 = *reinterpret_cast<const float4*>(tab + g * kTabStride + 2 * t);
      const float4 m1 = *reinterpret_cast<const float4*>(tab + (g + 8) * kTabStride + 2 * t);
      if constexpr (min_tile(D)) {  // (S, M) of groups 2t (x, y) and 2t + 1 (z, w)
        acc0 = fmaf(m0.x, fa.x * float(ca[c][0]), fmaf(-m0.y, fa.y, acc0));
        acc0 = fmaf(m0.z, fb.x * float(ca[c][1]), fmaf(-m0.w, fb.y, acc0));
        acc1 = fmaf(m1.x, fa.x * float(ca[c][2]), fmaf(-m1.y, fa.y, acc1));
        acc1 = fmaf(m1.z, fb.x * float(ca[c][3]), fmaf(-m1.w, fb.y, acc1));
      } else {  // NVFP4: the two 16-groups' scales of groups 2t (x, y) and 2t + 1 (z, w)
        acc0 = fmaf(m0.y * fa.x, float(cb[c][0]), fmaf(m0.x * fa.x, float(ca[c][0]), acc0));
        acc0 = fmaf(m0.w * fb.x, float(cb[c][1]), fmaf(m0.z * fb.x, float(ca[c][1]), acc0));
        acc1 = fmaf(m1.y * fa.x, float(cb[c][2]), fmaf(m1.x * fa.x, float(ca[c][2]), acc1));
        acc1 = fmaf(m1.w * fb.x, float(cb[c][3]), fmaf(m1.z * fb.x, float(ca[c][3]), acc1));
      }
    } else if constexpr (D == DType::Q6_K_T16) {
      // int8 scales of the 16-halves of groups 2t, 2t + 1 (bytes 4t .. 4t + 3 of the row's 16);
      // the offsets −32·Σq per half (tile_row's MMA C input) added to the integer sums here.
      const uint32_t w0 = pick(R.sc0, t), w1 = pick(R.sc1, t);
      const int za = __float_as_int(fa.z), zb = __float_as_int(fa.w), zc = __float_as_int(fb.z),
                zd = __float_as_int(fb.w);
      auto v = [&](uint32_t w, int a, int b, int sh) {  // sa·(a + offset) + sb·(b + offset) of one group
        return sext8(w >> sh) * (a + (sh ? zc : za)) + sext8(w >> (sh + 8)) * (b + (sh ? zd : zb));
      };
      acc0 = fmaf(dg * fa.x, float(v(w0, ca[c][0], cb[c][0], 0)), acc0);
      acc0 = fmaf(dg * fb.x, float(v(w0, ca[c][1], cb[c][1], 16)), acc0);
      acc1 = fmaf(dg8 * fa.x, float(v(w1, ca[c][2], cb[c][2], 0)), acc1);
      acc1 = fmaf(dg8 * fb.x, float(v(w1, ca[c][3], cb[c][3], 16)), acc1);
    } else {  // Q8_0: f16 d per group; W4_G128: one scale per 128 (groups 2t, 2t + 1 share it)
      float e0a, e0b, e1a, e1b;
      if constexpr (D == DType::Q8_0_T16) {
        const uint32_t d0 = pick(R.d0, t), d1 = pick(R.d1, t);
        e0a = h2f(uint16_t(d0 & 0xFFFFu)), e0b = h2f(uint16_t(d0 >> 16));
        e1a = h2f(uint16_t(d1 & 0xFFFFu)), e1b = h2f(uint16_t(d1 >> 16));
      } else {
        e0a = e0b = w4_scale(R.h0, t >> 1);
        e1a = e1b = w4_scale(R.h1, t >> 1);
      }
      acc0 = fmaf(e0a * fa.x, float(ca[c][0]), acc0);
      acc0 = fmaf(e0b * fb.x, float(ca[c][1]), acc0);
      acc1 = fmaf(e1a * fa.x, float(ca[c][2]), acc1);
      acc1 = fmaf(e1b * fb.x, float(ca[c][3]), acc1);
    }
  }
}

// 3 tokens (the function takes up to 4): tile_cols per token would take 8·TT MMAs a tile, each
// with one useful column in 8, which makes the tensor pipe the limit (27B Q4_K_M at 4 tokens: −11% against the
// multi-token kernel). Here the groups go in pairs with the tokens in the columns: MMA 2i's
// columns 0-3 are tokens 0-3 of group 2i, MMA 2i + 1's columns 4-7 the same tokens of group
// 2i + 1, both into one int accumulator (disjoint columns: lane (g, t) gives its B fragment, of
// token g % 4 and the groups of parity g / 4, to one MMA of each pair and zeros to the other).
// After the pair, lane (g, t) holds group 2i + t / 2 of tokens e0 = 2 (t % 2), e0 + 1 for rows g
// (c0, c1) and g + 8 (c2, c3) and scales just those: 8 MMAs and 4 epilogues of 4 terms a tile,
// each term as the multi-token kernel's (the same integers, the same f32 operations). acc: the
// lane's sums of (row g, e0), (g, e0 + 1), (g + 8, e0), (g + 8, e0 + 1) over its groups; finish
// adds the lanes t, t ^ 2 (the two group parities) at the row-tile's end.
template <DType D, int TT>
__device__ __forceinline__ void tile_pairs(const Raw<D>& R, const ColGroup* __restrict__ xg, int xrow, int lane,
                                           [[maybe_unused]] float2* tab, float (&acc)[4]) {
  static_assert(TT >= 1 && TT <= 4, "four token columns a group");
  const int g = lane >> 2, t = lane & 3, h = t >> 1;
  [[maybe_unused]] float dg = 0.0f, dg8 = 0.0f;
  tile_scales(R, lane, tab, dg, dg8);
  constexpr bool kPair = D == DType::Q6_K_T16 || D == DType::NVFP4_B64_T16;  // two k16 MMAs a group
  constexpr bool kU8 = D == DType::Q4_K_T16 || D == DType::Q6_K_T16 || D == DType::W4_G32_T16;
  // B: token g % 4 (its row clamped to the staged ones; a padding token's fragment is masked)
  const int bt = g & 3;
  const ColGroup* const xb = xg + (bt < TT ? bt : TT - 1) * xrow + (g >> 2);  // group 2i + g / 4 at xb[2i]
  const uint32_t m_even = bt < TT && g < 4 ? ~0u : 0u, m_odd = bt < TT && g >= 4 ? ~0u : 0u;
  // the epilogue's tokens e0, e0 + 1 (clamped: a padding token's sums are never written)
  const int e0 = 2 * (t & 1);
  const ColGroup* const xf0 = xg + (e0 < TT ? e0 : TT - 1) * xrow + h;  // group 2i + h at xf0[2i]
  const ColGroup* const xf1 = xg + (e0 + 1 < TT ? e0 + 1 : TT - 1) * xrow + h;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t a0, a1, a2, a3, o0, o1, o2, o3;
    a_frags(R, 2 * i, a0, a1, a2, a3);
    a_frags(R, 2 * i + 1, o0, o1, o2, o3);
    const uint2 bf = xb[2 * i].b[t];
    int ca[4] = {0, 0, 0, 0}, cb[4] = {0, 0, 0, 0};
    if constexpr (kPair) {
      mma_k16_acc<kU8>(ca, a0, a1, bf.x & m_even);  // the first 16 of each group
      mma_k16_acc<kU8>(cb, a2, a3, bf.y & m_even);  // and the second
      mma_k16_acc<kU8>(ca, o0, o1, bf.x & m_odd);
      mma_k16_acc<kU8>(cb, o2, o3, bf.y & m_odd);
    } else {
      mma_k32_acc<kU8>(ca, a0, a1, a2, a3, bf.x & m_even, bf.y & m_even);
      mma_k32_acc<kU8>(ca, o0, o1, o2, o3, bf.x & m_odd, bf.y & m_odd);
    }
    const float4 f0 = xf0[2 * i].s, f1 = xf1[2 * i].s;  // {d, d·Σq, offsets} of e0, e0 + 1
    if constexpr (table_tile(D)) {
      const int grp = 2 * i + h;
      const float2 m0 = tab[g * kTabStride + grp], m1 = tab[(g + 8) * kTabStride + grp];
      if constexpr (min_tile(D)) {  // (S, M)
        acc[0] = fmaf(m0.x, f0.x * float(ca[0]), fmaf(-m0.y, f0.y, acc[0]));
        acc[1] = fmaf(m0.x, f1.x * float(ca[1]), fmaf(-m0.y, f1.y, acc[1]));
        acc[2] = fmaf(m1.x, f0.x * float(ca[2]), fmaf(-m1.y, f0.y, acc[2]));
        acc[3] = fmaf(m1.x, f1.x * float(ca[3]), fmaf(-m1.y, f1.y, acc[3]));
      } else {  // NVFP4: the two 16-groups' scales
        acc[0] = fmaf(m0.y * f0.x, float(cb[0]), fmaf(m0.x * f0.x, float(ca[0]), acc[0]));
        acc[1] = fmaf(m0.y * f1.x, float(cb[1]), fmaf(m0.x * f1.x, float(ca[1]), acc[1]));
        acc[2] = fmaf(m1.y * f0.x, float(cb[2]), fmaf(m1.x * f0.x, float(ca[2]), acc[2]));
        acc[3] = fmaf(m1.y * f1.x, float(cb[3]), fmaf(m1.x * f1.x, float(ca[3]), acc[3]));
      }
    } else if constexpr (D == DType::Q6_K_T16) {
      // int8 scales of group 2i + h's 16-halves, rows g and g + 8; the offsets −32·Σq per half
      // (the multi-token kernel's MMA C input) added to the integer sums here.
      const uint32_t w0 = pick(R.sc0, i) >> (16 * h), w1 = pick(R.sc1, i) >> (16 * h);
      const int sa0 = sext8(w0), sb0 = sext8(w0 >> 8), sa1 = sext8(w1), sb1 = sext8(w1 >> 8);
      const int za0 = __float_as_int(f0.z), zb0 = __float_as_int(f0.w), za1 = __float_as_int(f1.z),
                zb1 = __float_as_int(f1.w);
      acc[0] = fmaf(dg * f0.x, float(sa0 * (ca[0] + za0) + sb0 * (cb[0] + zb0)), acc[0]);
      acc[1] = fmaf(dg * f1.x, float(sa0 * (ca[1] + za1) + sb0 * (cb[1] + zb1)), acc[1]);
      acc[2] = fmaf(dg8 * f0.x, float(sa1 * (ca[2] + za0) + sb1 * (cb[2] + zb0)), acc[2]);
      acc[3] = fmaf(dg8 * f1.x, float(sa1 * (ca[3] + za1) + sb1 * (cb[3] + zb1)), acc[3]);
    } else {  // Q8_0: f16 d per group; W4_G128: one scale per 128
      float e0s, e1s;
      if constexpr (D == DType::Q8_0_T16) {
        e0s = h2f(uint16_t(pick(R.d0, i) >> (16 * h)));
        e1s = h2f(uint16_t(pick(R.d1, i) >> (16 * h)));
      } else {
        e0s = w4_scale(R.h0, i >> 1);
        e1s = w4_scale(R.h1, i >> 1);
      }
      acc[0] = fmaf(e0s * f0.x, float(ca[0]), acc[0]);
      acc[1] = fmaf(e0s * f1.x, float(ca[1]), acc[1]);
      acc[2] = fmaf(e1s * f0.x, float(ca[2]), acc[2]);
      acc[3] = fmaf(e1s * f1.x, float(ca[3]), acc[3]);
    }
  }
}

}  // namespace
}  // namespace qwen36::cuda
