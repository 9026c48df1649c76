// out[T, N] (f32) = x[T, K] · w[N, K]ᵀ for tiled Q4_K / Q6_K / Q8_0 weights (DTypes *_T16, the
// layout of cuda_quant_mma.cu) and T > 64 — the prefill and the serving steps that mix a prefill
// chunk with decode rows — without a bf16 copy of the matrix. The values are those of the
// dequantize → bf16 → cuBLAS path (tiled_gemm): every weight is the float of dequant_tile rounded
// once to bf16, x is rounded to bf16 (round_activations), products are summed in f32; only the
// summation order differs.
//
//  - x (pre-kernel, also zeroing the split-K arrival counters): bf16 rows [Tp][K], Tp = T rounded
//    up to 64 (zero rows), each k32 group permuted so that lane t's 16 bytes (position 8t) hold
//    physical k 4t..4t+3 and 16+4t..16+4t+3. Why: the tiles hold, per lane, exactly those k of
//    rows g and g+8 (the int8 m16n8k32 A fragment). The bf16 m16n8k16 MMA sums over its 16 k in
//    any order, so A and B only need the same permutation of k: logical k 2t, 2t+1, 2t+8, 2t+9 of
//    step 0 are physical 4t .. 4t+3 and those of step 1 are 16+4t .. 16+4t+3. A lane then
//    dequantizes its own tile bytes straight into both steps' A fragments (no shuffles, no
//    ldmatrix), and reads its B fragments of both steps with one 16-byte shared load.
//  - CTA: 8 warps, 256 weight rows (16 row-tiles) × 64 tokens; warp w owns row-tiles 2w, 2w+1
//    and all 8 n8 tiles of tokens (64 f32 accumulators). Why this shape: dequantization is the
//    costly part (~4 instructions per weight: byte permute into a float's mantissa, subtract,
//    fma / multiplies, a bf16x2 pack per 2), so each A fragment must feed many MMAs — here 8;
//    no warp dequantizes a row another warp also dequantizes; and per super-block the CTA reads
//    16 tiles (Q4_K 36 KB) + 64 tokens of x (32 KB) from L2 for 8.4 MFLOP. Issue estimate per
//    k32 group and warp: ~130 dequant + ~20 loads + 32 MMAs.
//  - K loop over super-blocks, 2 stages in shared memory (Q4_K 136 KB + 20 KB of scale tables,
//    Q6_K 169 KB, Q8_0 200 KB: one CTA per SM; a device with less shared memory per block keeps
//    the dequantize path), filled with 16-byte cp.async: the tiles are straight copies of their bytes,
//    x's rows are swizzled (16-byte chunk c of row r at c ^ 4·(r & 1)) so that the 8 lanes of a
//    quarter warp (rows r, r + 1, 64 bytes each) hit distinct banks. A stage is one super-block
//    (16 k16 steps × 16 MMAs per warp), so its load has a whole stage's compute to land in.
//    The first stage's weights are requested before griddep_wait (they depend on no kernel).
//  - Q4_K's (d·sc, dmin·m) per (row, sub-block) are decoded once per tile into a per-warp table
//    (as the int8 GEMM); Q6_K / Q8_0 read their int8 / f16 scales per group from the stage.
//  - Tails: N % 256 — row-tiles past the matrix are not loaded; a warp whose second row-tile is
//    past it computes its first twice and stores once; warps with none skip the compute. T % 64 —
//    n8 tiles wholly past T skip their loads and MMAs (warp-uniform), stores are predicated.
//  - Split-K (grid z): 1 CTA per SM leaves small grids (5120 rows × 128 tokens: 40 CTAs) or
//    ragged waves; the host picks the split count minimizing waves × super-blocks per CTA (plus
//    a reduction charge). Each CTA writes its partial tile to a workspace slot; the last of a
//    tile's CTAs to arrive (counter per output tile, an acquire-release add) adds the slots in
//    split order, its own from registers — no float atomics: bitwise reproducible, eager or in a
//    graph replay.
//  - Switches: by default the dequantize + cuBLAS path (tiled_gemm) runs for every T > 64, as
//    measured since its dequantizer takes a warp per tile (use_dequant); QWEN36_QGEMM=fused |
//    dequant forces one path; QWEN36_QGEMM_SPLITS=n forces the split count; QWEN36_QGEMM_VERBOSE=1 prints each
//    launch shape once (stderr).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_quant_tiles.cuh"

namespace qwen36::cuda {

namespace {

constexpr int kWarps = 8;                  // per CTA; warp w: row-tiles 2w, 2w + 1
constexpr int kCtaRowTiles = 2 * kWarps;   // 256 rows
constexpr int kTok = 64;                   // tokens per CTA (8 n8 tiles)
constexpr int kNT = kTok / 8;
constexpr int kXRow = 512;                 // bytes of one token's 256 bf16 per stage
constexpr int kXBytes = kTok * kXRow;      // 32 KB
constexpr int kTabStride = 10;             // float2 per row of Q4_K's table: 8 sub-blocks + 2 pad (no bank conflicts)
constexpr int kTabBytes = kWarps * 2 * 16 * kTabStride * int(sizeof(float2));
constexpr int kAccPerThread = 2 * kNT * 4;  // 64

template <DType D>
__host__ __device__ constexpr int stage_bytes() {
  return kCtaRowTiles * TileLayout<D>::kBytes + kXBytes;
}
template <DType D>
__host__ __device__ constexpr int smem_bytes() {
  return 2 * stage_bytes<D>() + (D == DType::Q4_K_T16 ? kTabBytes : 0);
}
static_assert(stage_bytes<DType::Q4_K_T16>() % 128 == 0 && stage_bytes<DType::Q6_K_T16>() % 128 == 0 &&
              stage_bytes<DType::Q8_0_T16>() % 128 == 0 && (kCtaRowTiles * TileLayout<DType::Q6_K_T16>::kBytes) % 128 == 0,
              "x's bank analysis assumes 128-byte aligned regions");

struct QgArgs {
  const uint8_t* w;           // tiled [N / 16][S] tiles
  const uint8_t* xp;          // bf16 [Tp][K], k32 groups permuted (file header)
  float* out;                 // [T, N]
  float* part;                // split-K slots: [tile][split][warp][64][32] f32
  int* cnt;                   // [tile] arrivals (zeroed by the pre-kernel)
  int T, N, K, S, s_per, splits;
};

// 2^23 + byte b of w (a compile-time b once unrolled): one byte permute into a float's mantissa;
// subtracting 2^23 (+ an offset) then gives the byte's integer value exactly, without a
// conversion instruction.
template <int b>
__device__ __forceinline__ float mag(uint32_t w) {
  return __int_as_float(int(__byte_perm(w, 0x4B000000u, 0x7540u | unsigned(b))));
}
constexpr float kMag = 8388608.0f;         // 2^23: byte 0..255 as is
constexpr float kMag32 = 8388640.0f;       // 2^23 + 32: Q6_K's q − 32
constexpr float kMag128 = 8388736.0f;      // 2^23 + 128: a byte XOR 0x80 as its int8 value

// Per tile and super-block: Q4_K's (d·sc, dmin·m) table (16 rows × 8 sub-blocks; lane: row
// lane % 16, sub-blocks 4·(lane / 16) ..), Q6_K's row scales d; Q8_0 needs nothing.
template <DType D>
struct TileScales {
  float dg = 0.0f, dg8 = 0.0f;  // Q6_K: d of rows g and g + 8
};

template <DType D>
__device__ __forceinline__ void tile_scales(const uint8_t* tile, int lane, float2* tab, TileScales<D>& ts) {
  if constexpr (D == DType::Q4_K_T16) {
    const uint4 h = lds4(tile + TileLayout<D>::kHeaders + 16 * (lane & 15));
    float2 v[4];
    q4k_scales(h, lane >> 4, v);
    float4* dst = reinterpret_cast<float4*>(tab + (lane & 15) * kTabStride + 4 * (lane >> 4));
    dst[0] = make_float4(v[0].x, v[0].y, v[1].x, v[1].y);
    dst[1] = make_float4(v[2].x, v[2].y, v[3].x, v[3].y);
  } else if constexpr (D == DType::Q6_K_T16) {
    const int g = lane >> 2;
    ts.dg = h2f(ld_u16(tile + TileLayout<D>::kD + 2 * g));
    ts.dg8 = h2f(ld_u16(tile + TileLayout<D>::kD + 2 * (g + 8)));
  }
}

// The A fragments of both k16 steps of k32 group jj (compile-time once unrolled) of one tile, for
// lane (g, t): a[step] = {row g: k 2t, 2t+1 | row g+8: same | row g: k 2t+8, 2t+9 | row g+8:
// same} in logical k, i.e. physical k 4t .. 4t+3 (step 0) and 16+4t .. 16+4t+3 (step 1). Word
// c[i] holds 4 codes (bytes, physical k +0..+3): i = 0 row g / first 16, 1 row g+8 / first 16,
// 2 row g / second 16, 3 row g+8 / second 16 — the int8 GEMM's a0..a3. Each weight is the float
// dequant_tile computes, rounded once to bf16.
template <DType D>
__device__ __forceinline__ void dequant_group(const uint8_t* tile, const float2* tab, const TileScales<D>& ts,
                                              int jj, int lane, uint32_t (&a)[2][4]) {
  const int g = lane >> 2;
  float y[4][4];
  if constexpr (D == DType::Q4_K_T16 || D == DType::Q6_K_T16) {
    const uint4 v = lds4(tile + 512 * (jj >> 1) + 16 * lane);
    uint32_t c[4];
    if constexpr (D == DType::Q4_K_T16) {
      q4k_codes(v, jj, c);
      const float2 s0 = tab[g * kTabStride + jj], s1 = tab[(g + 8) * kTabStride + jj];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 s = (i & 1) ? s1 : s0;
        y[i][0] = fmaf(s.x, mag<0>(c[i]) - kMag, -s.y);
        y[i][1] = fmaf(s.x, mag<1>(c[i]) - kMag, -s.y);
        y[i][2] = fmaf(s.x, mag<2>(c[i]) - kMag, -s.y);
        y[i][3] = fmaf(s.x, mag<3>(c[i]) - kMag, -s.y);
      }
    } else {
      // The low 4 bits: words X, Y of groups jj (rows g, g + 8), low nibbles k 4t.., high k 16 + 4t..
      const uint32_t X = (jj & 1) ? v.z : v.x, Y = (jj & 1) ? v.w : v.y;
      c[0] = X & 0x0F0F0F0Fu, c[1] = Y & 0x0F0F0F0Fu, c[2] = (X >> 4) & 0x0F0F0F0Fu, c[3] = (Y >> 4) & 0x0F0F0F0Fu;
      // The high 2 bits (file header of cuda_quant_mma.cu): bits 0-1 / 2-3 / 4-5 / 6-7 of each
      // byte of H belong to c[0] / c[1] / c[2] / c[3].
      const uint4 hb = lds4(tile + TileLayout<D>::kHigh + 512 * (jj >> 2) + 16 * lane);
      const uint32_t H = pick(hb, jj & 3);
      c[0] |= (H << 4) & 0x30303030u;
      c[1] |= (H << 2) & 0x30303030u;
      c[2] |= H & 0x30303030u;
      c[3] |= (H >> 2) & 0x30303030u;
      // int8 scales of the group's two 16-halves (bytes 2·jj, 2·jj + 1 of the row's 16)
      const uint32_t w0 = uint32_t(ld_u16(tile + TileLayout<D>::kScales + 16 * g + 2 * jj)) ^ 0x8080u;
      const uint32_t w1 = uint32_t(ld_u16(tile + TileLayout<D>::kScales + 16 * (g + 8) + 2 * jj)) ^ 0x8080u;
      const float sc[4] = {mag<0>(w0) - kMag128, mag<0>(w1) - kMag128, mag<1>(w0) - kMag128, mag<1>(w1) - kMag128};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        // d · float(sc · (q − 32)) as dequant_tile: sc · (q − 32) is an exact integer in f32.
        const float d = (i & 1) ? ts.dg8 : ts.dg;
        y[i][0] = d * (sc[i] * (mag<0>(c[i]) - kMag32));
        y[i][1] = d * (sc[i] * (mag<1>(c[i]) - kMag32));
        y[i][2] = d * (sc[i] * (mag<2>(c[i]) - kMag32));
        y[i][3] = d * (sc[i] * (mag<3>(c[i]) - kMag32));
      }
    }
  } else {
    const uint4 v = lds4(tile + 512 * jj + 16 * lane);
    const uint32_t c[4] = {v.x ^ 0x80808080u, v.y ^ 0x80808080u, v.z ^ 0x80808080u, v.w ^ 0x80808080u};
    const float e0 = h2f(ld_u16(tile + TileLayout<D>::kD + 16 * g + 2 * jj));
    const float e1 = h2f(ld_u16(tile + TileLayout<D>::kD + 16 * (g + 8) + 2 * jj));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float d = (i & 1) ? e1 : e0;
      y[i][0] = d * (mag<0>(c[i]) - kMag128);
      y[i][1] = d * (mag<1>(c[i]) - kMag128);
      y[i][2] = d * (mag<2>(c[i]) - kMag128);
      y[i][3] = d * (mag<3>(c[i]) - kMag128);
    }
  }
#pragma unroll
  for (int st = 0; st < 2; ++st) {
    const int lo = 2 * st, hi = 2 * st + 1;  // words of rows g and g + 8 for this step
    a[st][0] = pack2<__nv_bfloat16>(y[lo][0], y[lo][1]);
    a[st][1] = pack2<__nv_bfloat16>(y[hi][0], y[hi][1]);
    a[st][2] = pack2<__nv_bfloat16>(y[lo][2], y[lo][3]);
    a[st][3] = pack2<__nv_bfloat16>(y[hi][2], y[hi][3]);
  }
}

// One stage: the CTA's row-tiles of super-block s (straight tile copies) and x's 64 rows of it
// (swizzled). Weights and x are issued separately so the first stage's weights can go before
// griddep_wait.
template <DType D>
__device__ __forceinline__ void issue_weights(uint8_t* st, const QgArgs& a, int rt0, int nrt, int s) {
  constexpr int B = TileLayout<D>::kBytes, C = B / 16;
  for (int q = int(threadIdx.x); q < nrt * C; q += kWarps * 32) {
    const int i = q / C, off = q - i * C;
    cp_async16(st + i * B + 16 * off, a.w + (size_t(rt0 + i) * size_t(a.S) + size_t(s)) * B + 16 * size_t(off));
  }
}
template <DType D>
__device__ __forceinline__ void issue_x(uint8_t* st, const QgArgs& a, int tok0, int s) {
  uint8_t* xs = st + kCtaRowTiles * TileLayout<D>::kBytes;
#pragma unroll
  for (int k = 0; k < kXBytes / 16 / (kWarps * 32); ++k) {
    const int q = int(threadIdx.x) + k * kWarps * 32, r = q >> 5, c = q & 31;
    cp_async16(xs + r * kXRow + 16 * (c ^ ((r & 1) << 2)),
           a.xp + (size_t(tok0 + r) * size_t(a.K) + size_t(s) * 256) * 2 + 16 * size_t(c));
  }
}

// One stage (super-block) of a warp: its two row-tiles against the CTA's n8 tiles of tokens.
// FULL: all 8 n8 tiles hold tokens — no branch in the stage, so the scheduler can interleave one
// group's dequantization with the previous group's loads and MMAs (a branch per n8 tile would
// cut the stage into 64 basic blocks). Otherwise n8 tiles from nlive on are skipped.
template <DType D, bool FULL>
__device__ __forceinline__ void stage_compute(const uint8_t* st, int my0, int my1, int nlive, float2* tab,
                                              float (&acc)[2][kNT][4]) {
  constexpr int B = TileLayout<D>::kBytes;
  const int lane = int(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  const uint8_t* xs = st + kCtaRowTiles * B;
  const uint8_t* tile[2] = {st + my0 * B, st + my1 * B};
  TileScales<D> ts[2];
  if constexpr (D == DType::Q4_K_T16) __syncwarp();  // the last stage's table readers are done
#pragma unroll
  for (int r = 0; r < 2; ++r) tile_scales<D>(tile[r], lane, tab + r * 16 * kTabStride, ts[r]);
  if constexpr (D == DType::Q4_K_T16) __syncwarp();
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
    uint32_t af[2][2][4];
#pragma unroll
    for (int r = 0; r < 2; ++r) dequant_group<D>(tile[r], tab + r * 16 * kTabStride, ts[r], jj, lane, af[r]);
    const uint8_t* xb = xs + 16 * ((4 * jj + t) ^ ((g & 1) << 2));
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
      if (FULL || n < nlive) {
        const uint4 b = lds4(xb + (8 * n + g) * kXRow);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          mma16816<__nv_bfloat16>(acc[r][n], af[r][0], b.x, b.y);
          mma16816<__nv_bfloat16>(acc[r][n], af[r][1], b.z, b.w);
        }
      }
    }
  }
}

template <DType D>
__global__ void __launch_bounds__(kWarps * 32, 1) qgemm_kernel(const QgArgs a) {
  extern __shared__ __align__(128) uint8_t smem[];
  griddep_trigger();
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5), g = lane >> 2, t = lane & 3;
  const int tok0 = int(blockIdx.x) * kTok, rt0 = int(blockIdx.y) * kCtaRowTiles, z = int(blockIdx.z);
  const int nrt = min(kCtaRowTiles, a.N / 16 - rt0);
  const int nlive = min(kNT, (a.T - tok0 + 7) / 8);  // n8 tiles holding a token < T
  const int s_begin = z * a.s_per, nst = min(a.S, s_begin + a.s_per) - s_begin;  // ≥ 1 (host)
  const bool busy = 2 * warp < nrt;
  const int my0 = 2 * warp, my1 = 2 * warp + 1 < nrt ? 2 * warp + 1 : 2 * warp;  // a dead second: the first again
  float2* tab = reinterpret_cast<float2*>(smem + 2 * stage_bytes<D>()) + warp * 2 * 16 * kTabStride;

  issue_weights<D>(smem, a, rt0, nrt, s_begin);
  griddep_wait();  // x, the counters and the output come after the kernels before
  issue_x<D>(smem, a, tok0, s_begin);
  cp_async_commit();

  float acc[2][kNT][4];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int n = 0; n < kNT; ++n) acc[r][n][0] = acc[r][n][1] = acc[r][n][2] = acc[r][n][3] = 0.0f;

  for (int it = 0; it < nst; ++it) {
    if (it + 1 < nst) {
      uint8_t* nxt = smem + ((it + 1) & 1) * stage_bytes<D>();
      issue_weights<D>(nxt, a, rt0, nrt, s_begin + it + 1);
      issue_x<D>(nxt, a, tok0, s_begin + it + 1);
    }
    cp_async_commit();  // possibly empty: group k always holds stage k
    cp_async_wait<1>();
    __syncthreads();  // every thread's copies of stage `it` are visible
    if (busy) {
      const uint8_t* st = smem + (it & 1) * stage_bytes<D>();
      if (nlive == kNT)
        stage_compute<D, true>(st, my0, my1, nlive, tab, acc);
      else
        stage_compute<D, false>(st, my0, my1, nlive, tab, acc);
    }
    __syncthreads();  // stage `it` is refilled at iteration it + 1
  }

  // acc[r][n][e]: row 16·(rt0 + 2·warp + r) + g + 8·(e / 2), token tok0 + 8n + 2t + e % 2.
  if (a.splits > 1) {
    const size_t tile_id = size_t(blockIdx.y) * gridDim.x + blockIdx.x;
    float* mine = a.part + ((tile_id * a.splits + z) * kWarps + warp) * (kAccPerThread * 32) + lane;
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int n = 0; n < kNT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) __stcg(mine + ((r * kNT + n) * 4 + e) * 32, acc[r][n][e]);
    __syncthreads();  // this CTA's slot is written before thread 0's release counts its arrival
    __shared__ int last;
    if (threadIdx.x == 0) last = atomic_add_acq_rel(a.cnt + tile_id, 1) == a.splits - 1;
    __syncthreads();  // and thread 0's acquire comes before the CTA's reads of the other slots
    if (!last) return;
    // Split order, this CTA's own piece from its registers: the same sums whichever CTA is last.
    float sum[2][kNT][4];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int n = 0; n < kNT; ++n) sum[r][n][0] = sum[r][n][1] = sum[r][n][2] = sum[r][n][3] = 0.0f;
    for (int zz = 0; zz < a.splits; ++zz) {
      const float* p = a.part + ((tile_id * a.splits + zz) * kWarps + warp) * (kAccPerThread * 32) + lane;
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int n = 0; n < kNT; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) sum[r][n][e] += zz == z ? acc[r][n][e] : __ldcg(p + ((r * kNT + n) * 4 + e) * 32);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int n = 0; n < kNT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[r][n][e] = sum[r][n][e];
  }
  if (!busy) return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (r == 1 && my1 == my0) break;  // the dead second row-tile
    const int row = 16 * (rt0 + 2 * warp + r) + g;
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tok = tok0 + 8 * n + 2 * t + (e & 1);
        if (tok < a.T) a.out[size_t(tok) * a.N + row + 8 * (e >> 1)] = acc[r][n][e];
      }
  }
}

// x [T, K] f32 → xp [Tp, K] bf16 (round to nearest even, as round_activations), k32 groups
// permuted (file header), rows T .. Tp − 1 zero; one thread per 16 output bytes (lane t of a
// group: physical k 4t .. 4t+3, 16+4t .. 16+4t+3). Also zeroes the split-K counters.
__global__ void qgemm_x_kernel(const float* __restrict__ x, int T, int Tp, int K, uint4* __restrict__ xp,
                               int* __restrict__ cnt, int ncnt) {
  griddep_trigger();
  griddep_wait();  // x comes from the kernel before; this call's workspace may be the last one's
  const long long stride = (long long)gridDim.x * blockDim.x, id0 = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  for (long long i = id0; i < ncnt; i += stride) cnt[i] = 0;
  const int C = K / 8;
  const long long n = (long long)Tp * C;
  for (long long id = id0; id < n; id += stride) {
    const int row = int(id / C), c = int(id - (long long)row * C), j = c >> 2, t = c & 3;
    uint4 o = make_uint4(0u, 0u, 0u, 0u);
    if (row < T) {
      const float4* xr = reinterpret_cast<const float4*>(x + size_t(row) * K + size_t(j) * 32);
      const float4 lo = xr[t], hi = xr[4 + t];
      o = make_uint4(pack2<__nv_bfloat16>(lo.x, lo.y), pack2<__nv_bfloat16>(lo.z, lo.w),
                     pack2<__nv_bfloat16>(hi.x, hi.y), pack2<__nv_bfloat16>(hi.z, hi.w));
    }
    xp[id] = o;
  }
}

// ---- host ----

// Switches: mode −1 not read yet, 0 fused always, 1 dequant always, 2 by T (the default);
// splits 0 = automatic.
std::atomic<int> g_mode{-1}, g_splits{-1};
// The default picks by T from H200 measurements. Against the first dequantizer (a thread per k32
// group, CudaQuantGemm.Timing27B, cold L2, 27B shapes) this kernel won 1.44–2.00x at T = 128 and
// lost from T = 272 (it runs at 150–250 TFLOP/s), so it ran up to T = 192. With the warp-per-tile
// dequantizer the whole 27B Q4_K_M prefill (bench, one machine start) measured pp96 2,015 vs
// 2,155 t/s for dequantize + cuBLAS, pp128 2,886 vs 2,835, pp160 2,502 vs 3,359, pp192 3,331 vs
// 3,907: it is no longer taken by default (kFusedMaxT = kTiledMaxT).
constexpr int kFusedMaxT = int(kTiledMaxT);
bool use_dequant(int T) {
  int m = g_mode.load(std::memory_order_relaxed);
  if (m < 0) {
    const char* v = std::getenv("QWEN36_QGEMM");
    m = v == nullptr ? 2 : std::strcmp(v, "fused") == 0 ? 0 : std::strcmp(v, "dequant") == 0 ? 1 : 2;
    g_mode.store(m, std::memory_order_relaxed);
  }
  return m == 1 || (m == 2 && T > kFusedMaxT);
}
int forced_splits() {
  int s = g_splits.load(std::memory_order_relaxed);
  if (s < 0) {
    const char* v = std::getenv("QWEN36_QGEMM_SPLITS");
    s = v != nullptr ? std::max(0, std::atoi(v)) : 0;
    g_splits.store(s, std::memory_order_relaxed);
  }
  return s;
}

struct KernelInfo {
  int bps = 0, regs = 0, local = 0;
};

// Raises the kernel's shared-memory limit on the current device (once) and reads its occupancy.
template <DType D>
KernelInfo kernel_info() {
  static KernelInfo per_dev[64];
  static std::atomic<uint64_t> done{0};
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  KernelInfo& ki = per_dev[dev % 64];
  once_per_device(done, [&] {
    auto* kern = qgemm_kernel<D>;
    CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes<D>()));
    CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    int(cudaSharedmemCarveoutMaxShared)));
    int bps = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, kern, kWarps * 32, size_t(smem_bytes<D>())));
    cudaFuncAttributes fa{};
    CUDA_CHECK(cudaFuncGetAttributes(&fa, kern));
    ki.bps = std::max(bps, 1);
    ki.regs = fa.numRegs;
    ki.local = int(fa.localSizeBytes);
  });
  return ki;
}

struct Plan {
  int rb = 0, tb = 0, splits = 1, s_per = 0;
};

// The split count minimizing waves × super-blocks per CTA (the CTAs of a wave run side by side,
// one per SM) plus the slots' cost: each split CTA writes 64 KB and the last of a tile reads
// them all back — charged one super-block step per wave and half a step per split (a CTA's
// step reads ~70 KB: the slots are traffic of the same order, without the compute to hide it).
// Slots are capped at 128 MB. The smaller count on a tie. Measured nowhere yet: the first thing
// to tune (QWEN36_QGEMM_SPLITS forces a count).
Plan plan_gemm(int N, int Tp, int S, int slots) {
  Plan p;
  p.rb = (N / 16 + kCtaRowTiles - 1) / kCtaRowTiles;
  p.tb = Tp / kTok;
  const long long tiles = (long long)p.rb * p.tb;
  auto shape = [&](int want, int& splits, int& s_per) {
    s_per = (S + want - 1) / want;
    splits = (S + s_per - 1) / s_per;  // every split non-empty
  };
  p.s_per = S;
  if (const int f = forced_splits(); f > 0) {
    shape(std::min(f, S), p.splits, p.s_per);
    return p;
  }
  constexpr long long kSlotCap = (128ll << 20) / (kAccPerThread * kWarps * 32 * 4);  // slots in 128 MB
  double best = 1e300;
  for (int want = 1; want <= std::min(S, 32); ++want) {
    int sp = 0, per = 0;
    shape(want, sp, per);
    if (sp != want || (sp > 1 && tiles * sp > kSlotCap)) continue;
    const long long waves = (tiles * sp + slots - 1) / slots;
    const double cost = double(waves) * per + (sp > 1 ? double(waves) + 0.5 * sp : 0.0);
    if (cost < best) best = cost, p.splits = sp, p.s_per = per;
  }
  return p;
}

void log_plan(DType t, int N, int K, int T, const Plan& p, const KernelInfo& ki, size_t smem) {
  static const bool on = [] {
    const char* v = std::getenv("QWEN36_QGEMM_VERBOSE");
    return v != nullptr && *v != 0 && std::strcmp(v, "0") != 0;
  }();
  if (!on) return;
  static std::mutex mu;
  static std::set<std::string> seen;
  char key[96];
  std::snprintf(key, sizeof key, "%d %d %d %d", int(t), N, K, T);
  std::lock_guard<std::mutex> lock(mu);
  if (!seen.insert(key).second) return;
  const std::string name(dtype_name(t));
  std::fprintf(stderr,
               "[qwen36 qgemm] %s N=%d K=%d T=%d: grid %d x %d x %d (token blocks, row blocks, splits of %d "
               "super-blocks), %d regs, %d B local, %zu B smem, %d CTA/SM\n",
               name.c_str(), N, K, T, p.tb, p.rb, p.splits, p.s_per, ki.regs, ki.local, smem, ki.bps);
}

}  // namespace

bool quant_tiled_gemm_takes(int64_t T, std::span<const Tensor* const> ws) {
  if (ws.empty() || T >= (int64_t(1) << 31) || use_dequant(int(T))) return false;
  const DevInfo info = dev_info();
  for (const Tensor* w : ws) {
    bool fits = false;
    with_gguf_tiled_dtype(w->dtype, [&](auto dt) { fits = smem_bytes<decltype(dt)::value>() + 256 <= info.smem_optin; });
    if (!fits) return false;  // not a tiled type, or a GPU with less shared memory per block (sm_86 / sm_89)
  }
  return true;
}

bool quant_tiled_gemm(Ctx& c, const Tensor& x, std::span<const Tensor* const> ws, std::span<Tensor* const> outs) {
  if (ws.empty() || !quant_tiled_gemm_takes(x.numel() / std::max<int64_t>(ws[0]->cols(), 1), ws)) return false;
  const DevInfo info = dev_info();
  const int K = int(ws[0]->cols()), S = K / 256;
  const int T = int(x.numel() / K), Tp = (T + kTok - 1) / kTok * kTok;
  // Plans, and the workspace: x once for every matrix, the slots (shared: the launches run one
  // after another) and one counter per output tile of each split matrix.
  std::vector<Plan> plans;
  size_t ncnt = 0, nslot = 0;
  for (const Tensor* w : ws) {
    KernelInfo ki;
    with_gguf_tiled_dtype(w->dtype, [&](auto dt) { ki = kernel_info<decltype(dt)::value>(); });
    plans.push_back(plan_gemm(int(w->rows()), Tp, S, info.sms * ki.bps));
    const Plan& p = plans.back();
    with_gguf_tiled_dtype(w->dtype, [&](auto dt) {
      log_plan(w->dtype, int(w->rows()), K, T, p, ki, size_t(smem_bytes<decltype(dt)::value>()));
    });
    if (p.splits > 1) {
      ncnt += size_t(p.rb) * p.tb;
      nslot = std::max(nslot, size_t(p.rb) * p.tb * p.splits * kWarps * kAccPerThread * 32);
    }
  }
  auto up = [](size_t b) { return (b + 255) / 256 * 256; };
  const size_t o_x = 0, o_cnt = up(size_t(Tp) * K * 2), o_part = o_cnt + up(ncnt * sizeof(int));
  Temp<uint8_t> ws_mem(c, o_part + nslot * sizeof(float));
  uint8_t* base = ws_mem.get();
  const long long chunks = (long long)Tp * (K / 8);
  const int blocks = int(std::min<long long>((chunks + 255) / 256, (long long)info.sms * 16));
  launch_pdl(qgemm_x_kernel, dim3(unsigned(blocks)), dim3(256), 0, c.stream, x.as<const float>(), T, Tp, K,
             reinterpret_cast<uint4*>(base + o_x), reinterpret_cast<int*>(base + o_cnt), int(ncnt));
  size_t cnt_at = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    const Plan& p = plans[i];
    QgArgs a{};
    a.w = static_cast<const uint8_t*>(ws[i]->data);
    a.xp = base + o_x;
    a.out = outs[i]->as<float>();
    a.part = reinterpret_cast<float*>(base + o_part);
    a.cnt = reinterpret_cast<int*>(base + o_cnt) + cnt_at;
    a.T = T, a.N = int(ws[i]->rows()), a.K = K, a.S = S, a.s_per = p.s_per, a.splits = p.splits;
    if (p.splits > 1) cnt_at += size_t(p.rb) * p.tb;
    with_gguf_tiled_dtype(ws[i]->dtype, [&](auto dt) {
      constexpr DType D = decltype(dt)::value;
      launch_pdl(qgemm_kernel<D>, dim3(unsigned(p.tb), unsigned(p.rb), unsigned(p.splits)), dim3(kWarps * 32),
                 size_t(smem_bytes<D>()), c.stream, a);
    });
  }
  return true;
}

// Test hook (declared by the tests, not in cuda_ops.cuh): mode "dequant" | "fused" (nullptr: the
// environment's QWEN36_QGEMM again); splits > 0 forces the split count, 0 automatic, < 0 the
// environment's QWEN36_QGEMM_SPLITS again.
void qgemm_select(const char* mode, int splits) {
  g_mode.store(mode == nullptr ? -1 : std::strcmp(mode, "dequant") == 0 ? 1 : 0);
  g_splits.store(splits < 0 ? -1 : splits);
}

}  // namespace qwen36::cuda
