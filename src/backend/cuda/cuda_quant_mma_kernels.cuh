#pragma once
// defines (file-local to the .cu that includes it, cuda_quant_mma.cu): the tiled GEMM's device
// side for T ≤ 64 — the one-token norm and activation staging, MmaArgs, mma_block (the staged
// and multi-token kernels' body: load paths, tiles, the split row-tiles' sums) and the kernels
// that run it (mma_kernel, mma_pair_kernel, mma_norm_gemv_kernel with norm_gemv_block). The
// design, layouts and measurements are in cuda_quant_mma.cu's header; its host side plans and
// launches these. Included by .cu only.

#include <cstdint>

#include "backend/cuda/cuda_act_quant.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_quant_blocks.cuh"
#include "backend/cuda/cuda_quant_mma_frags.cuh"
#include "backend/cuda/cuda_quant_mma_half.cuh"
#include "backend/cuda/cuda_quant_staged_tiles.cuh"

namespace qwen36::cuda {
namespace {

constexpr int kWarps = 8;     // warps per block of the GEMM (at most; fewer for small matrices)
constexpr int kOneWarps = 16; // the same for the staged kernels (ROWS), which split row-tiles in blocks
constexpr int kStages = 3;    // tiles in each warp's shared-memory ring: 2 loading while 1 computes

// ================================================================================================
// The GEMM
// ================================================================================================

// T = 1 with a NormIn: token 0's row x = rms_norm(y + delta) · w, computed by every block for
// itself as add_rms_norm_vec_kernel computes it (cuda_elementwise.cu: the same float operations,
// the sum of squares in cuda_act_quant.cuh's fixed order), so x is bitwise the norm kernel's, and
// quantized into xs as quantize_row would from that x. v = y + delta waits in shared memory (vrow)
// between the sum and the scaling. w, a weight, is requested before griddep_wait: the register-
// prefetch kernels copy all of it into shared memory (wrow, cp.async: their registers are taken,
// 5 quads held across the wait spilled), the shared-memory ring kernels hold a thread's first
// kNormW quads in registers (wq: their shared memory is taken; the ring's cp.async groups are
// counted). `writer` (one block of the call) stores y_out and x; xrow, if given, gets x too (the
// f32 projections of norm_gemv_block read it there).
constexpr int kNormW = 5;  // w quads in registers per thread: K = 5120 at 256 threads
template <bool kSmemW>
__device__ __forceinline__ void prefetch_norm_w(const NormIn& n, int G, float4 (&wq)[kNormW], float4* wrow) {
  const int nq = G * 8, nt = int(blockDim.x), tid = int(threadIdx.x);
  const float4* w = reinterpret_cast<const float4*>(n.w);
  if constexpr (kSmemW) {
    for (int id = tid; id < nq; id += nt) cp_async16(wrow + id, w + id);
    cp_async_commit();
  } else {
#pragma unroll
    for (int r = 0; r < kNormW; ++r)
      if (const int id = tid + r * nt; id < nq) wq[r] = w[id];
  }
}
template <bool kSmemW>
__device__ __forceinline__ void norm_row(const NormIn& n, int G, const float4 (&wq)[kNormW],
                                         const float4* __restrict__ wrow, float4* __restrict__ vrow,
                                         float* __restrict__ gss, ColGroup* __restrict__ xs, bool writer,
                                         float4* __restrict__ xrow = nullptr) {
  constexpr int kR = 4;  // quads' loads in flight per thread (y and delta each)
  const int nq = G * 8, nt = int(blockDim.x), tid = int(threadIdx.x);
  const float4* y = reinterpret_cast<const float4*>(n.y);
  const float4* d = reinterpret_cast<const float4*>(n.delta);
  // id < nq is warp-uniform (nq and nt multiples of 32), as the shuffles of group_ss and
  // quantize_quad need.
  for (int i0 = tid; i0 - tid < nq; i0 += kR * nt) {
    float4 a[kR], b[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r)
      if (const int id = i0 + r * nt; id < nq) a[r] = __ldcg(y + id), b[r] = __ldcg(d + id);
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const int id = i0 + r * nt;
      if (id >= nq) break;
      const float4 v = make_float4(a[r].x + b[r].x, a[r].y + b[r].y, a[r].z + b[r].z, a[r].w + b[r].w);
      vrow[id] = v;
      if (writer) reinterpret_cast<float4*>(n.y_out)[id] = v;
      const float q = group_ss(quad_ss(v));
      if ((id & 7) == 0) gss[id >> 3] = q;
    }
  }
  if constexpr (kSmemW) cp_async_wait<0>();  // this thread's quads of w (each reads only its own)
  __syncthreads();
  const float inv = 1.0f / sqrtf(row_ss(gss, G) / float(32 * G) + n.eps);
  auto scale = [&](int id, const float4& g) {  // a thread's own quads of vrow
    const float4 v = vrow[id];
    const float4 x = make_float4(v.x * inv * g.x, v.y * inv * g.y, v.z * inv * g.z, v.w * inv * g.w);
    if (writer) reinterpret_cast<float4*>(n.x)[id] = x;
    if (xrow) xrow[id] = x;
    store_col_quad(xs, id, quantize_quad(x));
  };
  if constexpr (kSmemW) {
    for (int id = tid; id < nq; id += nt) scale(id, wrow[id]);
  } else {
#pragma unroll
    for (int r = 0; r < kNormW; ++r)
      if (const int id = tid + r * nt; id < nq) scale(id, wq[r]);
    for (int id = tid + kNormW * nt; id < nq; id += nt) scale(id, reinterpret_cast<const float4*>(n.w)[id]);
  }
}

struct MmaArgs {
  const uint8_t* w;    // tiles
  const float* x;      // T = 1 quantizing its own row (stage_x): token 0's f32 activations; else null
  NormIn norm;         // T = 1 computing its row as the norm (norm.y non-null; stage_x): its inputs
  const uint2* xb;     // [K/32][NT][32] B fragments
  const float4* xf;    // [K/32][NT][4] {d, d·Σq} of tokens 2t, 2t + 1
  const int4* xi;      // [K/32][NT][4] −32 · Σq per 16-half (Q6_K)
  const uint4* xh;     // HB: [K/32][NT][32] bf16 B fragments (store_act_half), else unused
  // Up to kMaxMats matrices stored back to back (one tiled matrix of stacked rows): matrix m
  // holds row-tiles [rt_end[m − 1], rt_end[m]) and writes out[m] ([T, n[m]]).
  float* out[4];
  int rt_end[4], n[4], nmat;
  float* part;         // [nwarps][2][T][16] partial sums of row-tiles split between warps
  int* cnt;            // [nwarps] arrivals at the split row-tile whose first tile warp w holds
  long long total;     // tiles = R · S
  int S, T, nwarps;
  int ahead;           // XS: tiles past the register sets whose bytes are requested into L2 (0: none)
  int block_split = 0; // XS: the split per block as the staged kernels' (whole row-tiles a block, sums in shared memory)
};
constexpr int kMaxMats = 4;

// Column 0 of row-tile r in its matrix's output, and that output's row stride. Matrices are
// picked with compile-time indices (a runtime index would copy the arguments to local memory).
__device__ __forceinline__ float* out_of(const MmaArgs& a, int r, size_t& stride) {
  float* o = a.out[0];
  int r0 = 0, n = a.n[0];
#pragma unroll
  for (int m = 1; m < kMaxMats; ++m)
    if (m < a.nmat && r >= a.rt_end[m - 1]) o = a.out[m], r0 = a.rt_end[m - 1], n = a.n[m];
  stride = size_t(n);
  return o + 16 * size_t(r - r0);
}

// The warp holding tile i (ranges: warp w has [w·total/nw, (w + 1)·total/nw), nw ≤ total).
__device__ __forceinline__ int warp_of(long long i, long long total, int nw) {
  return int(((i + 1) * nw - 1) / total);
}
__device__ __forceinline__ long long range_begin(int w, long long total, int nw) { return (long long)w * total / nw; }

// Shared memory of the T = 1 activation staging (mma_kernel's stage_x) for S super-blocks: the
// ColGroups; with a NormIn (norm) also v (K floats) and the group sums (K / 32), and for the
// register-prefetch kernels (regs) the norm's weight (K floats; norm_row).
__host__ __device__ constexpr size_t x_stage_bytes(long long S, bool norm = false, bool regs = false) {
  return size_t(S) * 8 * (sizeof(ColGroup) + (norm ? (regs ? 64 : 32) * sizeof(float) + sizeof(float) : 0));
}
// The same for `rows` tokens (the norm only with one).
__host__ __device__ constexpr size_t staged_bytes(long long S, int rows, bool norm = false, bool regs = false) {
  return x_stage_bytes(S, norm, regs) + size_t(rows > 1 ? rows - 1 : 0) * x_stage_bytes(S);
}
// XS (the multi-token kernel, up to 16 tokens): the call's quantized activations as
// quantize_kernel laid them out (ActLayout: the B fragments, {d, d·Σq} and, for Q6_K, the
// 16-halves' offsets of every (k32 group, n8 tile)), copied into each block's shared memory once
// after griddep_wait, so that the loop's activation reads are shared-memory loads in the same
// order as from the workspace (ncu, 27B gate + up at 16 tokens through L1: hit rate 60%, 32% on a
// down projection, and the kernel latency-bound on those misses).
template <DType D>
__host__ __device__ constexpr size_t xs_bytes(long long S, int NT) {
  const size_t frags = size_t(S) * 8 * size_t(NT);
  return frags * 32 * sizeof(uint2) + frags * 4 * sizeof(float4) + (D == DType::Q6_K_T16 ? frags * 4 * sizeof(int4) : 0);
}

// Tokens up to which a call takes the staged kernels (mma_kernel's ROWS), up to which those run
// tile_cols per token (beyond: tile_pairs), and the super-blocks a row needs for tile_pairs.
// H200 (bench/RESULTS.md, session 27), staged against the multi-token kernel: 2 tokens +18%
// (27B Q4_K_M b2) and +11% (35B-A3B b2); 3 tokens +4% (27B MTP k = 2); 4 tokens −1 to −5% on
// the 27B, −7 to −10% on the 35B-A3B (its K = 2048: 8 super-blocks a row-tile): 3 tokens at
// most, 2 for short rows.
constexpr int kMaxStagedRows = 3;
constexpr int kColsRows = 2;
constexpr int kPairsMinS = 16;

// Shared memory per warp: the tile ring (smem path only), then (Q4_K, NVFP4; every tile of the
// bf16 form, HB) the scale table.
template <DType D, int RING, bool HB = false, bool PAIR = false>
__host__ __device__ constexpr int warp_smem() {
  constexpr int kRT = PAIR ? 2 : 1;  // tiles a unit of work (a ring stage, a table each)
  return kRT * (RING * TileLayout<D>::kBytes + (table_tile(D) || HB ? 16 * kTabStride * int(sizeof(float2)) : 0));
}
// The tiles the bf16 form (HB, cuda_quant_mma_half.cuh) is built for.
__host__ __device__ constexpr bool half_tile(DType t) { return t == DType::Q4_K_T16 || t == DType::Q6_K_T16; }

// Threads per block and minimum blocks per SM asked of the compiler (__launch_bounds__), i.e.
// the register cap: ≤ 128 registers (16 warps per SM) up to 16 tokens, as one block of 16 warps
// (ROWS) or two of 8; 32 and 64 tokens (32 accumulators more) one block of 8, taking more
// registers rather than spilling (plan_mma sizes the grid by occupancy).
constexpr int max_threads(int ROWS, bool XS = false) { return (ROWS || XS ? kOneWarps : kWarps) * 32; }
constexpr int min_blocks(int NT, int ROWS, bool XS = false) { return ROWS || XS ? 1 : NT <= 2 ? 2 : 1; }

// ROWS: a block's warps leave the pieces of its split row-tiles here (shared memory after the
// staging): 2 × 16 floats a warp and token, slot 0 for its first row-tile, 1 for its last; after
// all the pieces, each warp's first row-tile (an int a warp, 16 bytes kept per warp).
constexpr size_t piece_bytes(int rows) { return 2 * 16 * sizeof(float) * size_t(rows) + 16; }

// An activation load of the multi-token kernel: through L1 from the workspace, or (XS) from the
// block's shared-memory copy.
template <bool XS, typename V>
__device__ __forceinline__ V ldx(const V* p) {
  if constexpr (XS)
    return *p;
  else
    return __ldca(p);
}

// ROWS = T ≤ kMaxStagedRows (NT == 1): each tile is tile_cols against the T tokens' rows staged
// in shared memory, and the split of the tiles (file header) is per block: block b holds whole row-tiles,
// ⌊b·R / grid⌋ to ⌊(b + 1)·R / grid⌋ of the R, which its warps split in balanced contiguous
// ranges; a row-tile split between warps is summed in shared memory after a block barrier (no
// workspace, fence or atomic). RING: the load path (file header): 0, each lane holds the next
// tile's 16-byte loads in registers while the current one computes (two register sets in turn,
// global loads evict-first); else the per-warp cp.async shared-memory ring of RING tiles. Blocks
// have 1 .. kWarps (ROWS: kOneWarps) warps (small matrices spread over every SM). ROWS = 0: the
// multi-token kernel (grid split, activations read from the workspace). mma_block is block `bid`
// of the `nblocks` that run the call's group a (mma_kernel: the grid; mma_pair_kernel: a share).
// XS: the multi-token kernel (ROWS = 0, up to 16 tokens, register prefetch) reading the
// activations from its block's shared-memory copy (xs_bytes); the grid split and every sum as
// without it, so the outputs are bitwise the same for the same warps. With a.block_split, XS
// splits the tiles per block as the staged kernels do (whole row-tiles a block, a row-tile split
// between warps summed in shared memory after a block barrier): no workspace, atomic or L2
// round trip on the warps' tails (xs_split_bytes more shared memory).
// HB: the multi-token kernel (ROWS = 0, no XS) at 17-64 tokens in the bf16 form (tile_half: the
// tiles dequantized to bf16, the activations a.xh), its sums and split as without it.
// PAIR (with HB): a unit of work is two row-tiles' tiles of one super-block (row-tiles 2p and
// 2p + 1; a.total counts units, a.S per unit-row p) sharing each B fragment load
// (tile_half_pair); its ring stages, tables, pieces and sums hold both.
template <DType D, int NT, int ROWS, int RING, bool XS = false, bool HB = false, bool PAIR = false>
__device__ __forceinline__ void mma_block(const MmaArgs& a, int bid, int nblocks, uint8_t* smem) {
  static_assert(RING == 0 || RING >= 2, "a ring loads while a stage computes");
  static_assert(!HB || (ROWS == 0 && !XS && NT >= 4 && half_tile(D)), "HB: Q4_K / Q6_K at 17-64 tokens");
  static_assert(!PAIR || HB, "PAIR: the bf16 form's pairs of row-tiles");
  constexpr int kRT = PAIR ? 2 : 1;  // row-tiles a unit
  static_assert(ROWS == 0 || NT == 1, "staged rows are at most 8 tokens");
  static_assert(!XS || (ROWS == 0 && RING == 0 && NT <= 2), "XS: the register-prefetch multi-token kernel, ≤ 16 tokens");
  constexpr bool REGS = RING == 0;
  constexpr bool STAGED = ROWS > 0;  // the rows staged, the split per block
  constexpr int B = TileLayout<D>::kBytes;
  griddep_trigger();
  const int lane = int(threadIdx.x & 31), wib = int(threadIdx.x >> 5), wpb = int(blockDim.x >> 5);
  const int w = bid * wpb + wib;
  // The staged kernels' staging and sums have block barriers; XS's copy too (its blocks are
  // whole: plan_mma).
  if (!STAGED && !XS && w >= a.nwarps) return;
  const int g = lane >> 2, t = lane & 3, S = a.S, T = a.T;
  // STAGED: the block's row-tiles [q0, q1) are its nb tiles from q0·S; a warp's range may be empty
  // (fewer tiles than warps) and the warp still takes the block's barriers.
  // (Recomputed for the sums after the loop rather than held in registers through it.)
  auto block_rows = [&](long long& q0, long long& q1, long long& nb) {
    const long long R = a.total / S;
    q0 = (long long)bid * R / nblocks, q1 = (long long)(bid + 1) * R / nblocks;
    nb = (q1 - q0) * S;
  };
  long long b0, b1;
  const bool bsplit = STAGED || (XS && a.block_split);  // the split per block
  constexpr int kPR = STAGED ? ROWS : 8 * NT;            // tokens of a piece slot in shared memory
  if (bsplit) {
    long long q0, q1, nb;
    block_rows(q0, q1, nb);
    b0 = q0 * S + range_begin(wib, nb, wpb), b1 = q0 * S + range_begin(wib + 1, nb, wpb);
  } else {
    b0 = range_begin(w, a.total, a.nwarps), b1 = range_begin(w + 1, a.total, a.nwarps);
  }
  [[maybe_unused]] uint8_t* ring = smem + size_t(wib) * RING * kRT * B;
  [[maybe_unused]] const uint32_t ring_s = smem_addr(ring) + 16 * lane;  // this lane's copies
  float2* tab = reinterpret_cast<float2*>(smem + size_t(wpb) * RING * kRT * B) + wib * kRT * 16 * kTabStride;
  constexpr int kWarpSmem = warp_smem<D, RING, HB, PAIR>();
  // Tile h of unit u: u itself, or (PAIR) row-tile 2p + h of unit-row p = u / S at super-block u % S.
  auto tile_at = [&](long long u, int h) -> const uint8_t* {
    if constexpr (PAIR)
      return a.w + size_t(u + (u / S + h) * S) * B;
    else
      return a.w + size_t(u) * B;
  };
  // ROWS: the tokens' activation rows, staged in shared memory once per block as the routed
  // experts' ColGroups (x_stage_bytes; token c's at xs + c·S·8), so that each tile is tile_cols
  // against them: the loop's B-fragment and scale reads are shared-memory loads, not L1 / L2
  // round trips (ncu: L1 hit rate 46%, 40% of stalls on L1TEX at T = 1 with them read from
  // global). Token c's fragments are lanes 4c .. 4c + 3 of quantize_kernel's (B column c), its
  // scales half (c & 1) of entry t = c / 2.
  ColGroup* const xs = reinterpret_cast<ColGroup*>(smem + size_t(wpb) * kWarpSmem);
  const int xrow = S * 8;
  // XS: the block's copy of the activations (stage_x), in the workspace's layout, where xs is.
  [[maybe_unused]] uint2* const xs_b = reinterpret_cast<uint2*>(xs);
  [[maybe_unused]] float4* const xs_f = reinterpret_cast<float4*>(xs_b + size_t(S) * 8 * NT * 32);
  [[maybe_unused]] int4* const xs_i = reinterpret_cast<int4*>(xs_f + size_t(S) * 8 * NT * 4);
  // NormIn (T = 1): after xs, v, the group sums and (REGS) w (x_stage_bytes); w is requested
  // before griddep_wait (prefetch_norm).
  float4* const vrow = reinterpret_cast<float4*>(reinterpret_cast<uint8_t*>(xs) + x_stage_bytes(S) * ROWS);
  float* const gss = reinterpret_cast<float*>(vrow + 8 * S * 8);
  float4* const wrow = reinterpret_cast<float4*>(gss + S * 8);
  [[maybe_unused]] float* const bpart = reinterpret_cast<float*>(
      reinterpret_cast<uint8_t*>(xs) + (XS ? xs_bytes<D>(S, NT) : staged_bytes(S, ROWS, a.norm.y != nullptr, REGS)));
  [[maybe_unused]] int* const wfirst = reinterpret_cast<int*>(bpart + size_t(wpb) * 2 * 16 * kPR);
  [[maybe_unused]] float4 wq[kNormW];
  auto prefetch_norm = [&]() {
    if constexpr (STAGED)
      if (a.norm.y) prefetch_norm_w<REGS>(a.norm, S * 8, wq, wrow);
  };
  auto stage_x = [&]() {
    if constexpr (XS) {
      // The workspace's fragments and scales as they lie, in 16-byte copies: of the super-blocks
      // [s0, s1) that the block's tiles read (all of them where its range holds a whole row-tile
      // or wraps past one's end; a small matrix's blocks may hold a few tiles of one).
      const long long B0 = range_begin(bid * wpb, a.total, a.nwarps), B1 = range_begin((bid + 1) * wpb, a.total, a.nwarps);
      long long s0 = 0, s1 = S;
      if (!bsplit && B1 - B0 < S && B0 % S <= (B1 - 1) % S) s0 = B0 % S, s1 = (B1 - 1) % S + 1;
      const size_t per = size_t(8) * NT;  // (group, n8 tile) fragments of a super-block
      auto copy = [&](void* dst, const void* src, size_t unit) {  // unit: bytes a fragment
        uint8_t* d = static_cast<uint8_t*>(dst) + size_t(s0) * per * unit;
        const uint8_t* g = static_cast<const uint8_t*>(src) + size_t(s0) * per * unit;
        const size_t bytes = size_t(s1 - s0) * per * unit;
        for (size_t o = 16 * threadIdx.x; o < bytes; o += 16 * blockDim.x) cp_async16(d + o, g + o);
      };
      copy(xs_b, a.xb, 32 * sizeof(uint2));
      copy(xs_f, a.xf, 4 * sizeof(float4));
      if constexpr (D == DType::Q6_K_T16) copy(xs_i, a.xi, 4 * sizeof(int4));
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();  // every warp of the block is live (plan_mma: whole blocks)
    } else if constexpr (STAGED) {
      const int G = S * 8;
      if (a.norm.y) {  // the layer's norm of each token, computed here (NormIn)
        const bool writer = bid == 0 && a.norm.y_out;
#pragma unroll 1
        for (int c = 0; c < ROWS; ++c) {  // v and the group sums are reused: a barrier between rows
          const size_t off = size_t(c) * G * 32;
          NormIn n = a.norm;
          n.y += off, n.delta += off;
          if (writer) n.y_out += off, n.x += off;
          norm_row<REGS>(n, G, wq, wrow, vrow, gss, xs + c * xrow, writer);
          __syncthreads();
        }
        return;
      }
      if (a.x) {  // no quantize_kernel before this launch: every block quantizes the rows itself
#pragma unroll
        for (int c = 0; c < ROWS; ++c) quantize_row(a.x + size_t(c) * G * 32, G, xs + c * xrow);
        __syncthreads();
        return;
      }
      // All of a thread's loads are issued before its first store: one L2 round trip for K up to
      // 8192 at 256 threads. (A load-store loop waited for each load in turn: ncu put 17-23% of
      // a T = 1 GEMM's stall samples on those stores, ~4 round trips after griddep_wait.)
      // Word i of the fragments: token i / 4G, group (i mod 4G) / 4, lane 4·token + i mod 4;
      // scale entry j: token j / G, group j mod G.
      constexpr int kB = 8, kS = 3;  // fragment words and scale entries a thread per round
      const int nb = G * 4 * ROWS, ns = G * ROWS, nt = int(blockDim.x), tid = int(threadIdx.x);
      for (int r = 0; r * kB * nt < nb || r * kS * nt < ns; ++r) {
        uint2 b[kB];
        float4 f[kS];
        int4 z[kS];
#pragma unroll
        for (int u = 0; u < kB; ++u)
          if (const int i = (r * kB + u) * nt + tid; i < nb) {
            const int c = ROWS == 1 ? 0 : i / (4 * G), k = i - c * 4 * G;  // no division at T = 1
            b[u] = __ldcg(a.xb + size_t(k >> 2) * 32 + 4 * c + (k & 3));
          }
#pragma unroll
        for (int u = 0; u < kS; ++u)
          if (const int j = (r * kS + u) * nt + tid; j < ns) {
            const int c = ROWS == 1 ? 0 : j / G, k = j - c * G;
            f[u] = __ldcg(a.xf + size_t(k) * 4 + (c >> 1));
            z[u] = __ldcg(a.xi + size_t(k) * 4 + (c >> 1));
          }
#pragma unroll
        for (int u = 0; u < kB; ++u)
          if (const int i = (r * kB + u) * nt + tid; i < nb) {
            const int c = ROWS == 1 ? 0 : i / (4 * G), k = i - c * 4 * G;
            xs[c * xrow + (k >> 2)].b[k & 3] = b[u];
          }
#pragma unroll
        for (int u = 0; u < kS; ++u)
          if (const int j = (r * kS + u) * nt + tid; j < ns) {
            const int c = ROWS == 1 ? 0 : j / G, k = j - c * G;
            xs[c * xrow + k].s = c & 1 ? make_float4(f[u].z, f[u].w, __int_as_float(z[u].y), __int_as_float(z[u].w))
                                       : make_float4(f[u].x, f[u].y, __int_as_float(z[u].x), __int_as_float(z[u].z));
          }
      }
      __syncthreads();  // every warp of the block is live (plan_mma), so all reach it
    }
  };

  // Either way the first tiles are requested before waiting for the kernel before: the weights
  // depend on no earlier kernel (a small matrix's warps have all their tiles in flight here).
  if constexpr (!REGS) {
#pragma unroll
    for (int p = 0; p < RING - 1; ++p) {
      if (b0 + p < b1)
#pragma unroll
        for (int h = 0; h < kRT; ++h) issue_tile<B>(ring_s + (p * kRT + h) * B, tile_at(b0 + p, h) + 16 * lane, lane);
      cp_async_commit();
    }
  }

  int r = int(b0 / S), s = int(b0 - (long long)r * S);
  const int r_first = r;
  if (bsplit && lane == 0) wfirst[wib] = r_first;  // read by the split row-tiles' sums after the loop
  // T = 1 (tile_cols): col_mask[jj] keeps this lane's fragment of the row in MMA jj's B (g == jj).
  [[maybe_unused]] uint32_t col_mask[8];
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) col_mask[jj] = g == jj ? ~0u : 0u;
  float acc[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  [[maybe_unused]] float acc1[PAIR ? NT : 1][4];  // PAIR: the unit's second row-tile
  if constexpr (PAIR)
#pragma unroll
    for (int n = 0; n < NT; ++n) acc1[n][0] = acc1[n][1] = acc1[n][2] = acc1[n][3] = 0.0f;
  // ROWS ≤ 2: tile_cols per token (token c's rows g, g + 8); more: tile_pairs (acc[0]).
  constexpr bool kPairs = ROWS > kColsRows;
  [[maybe_unused]] float sacc[STAGED && !kPairs ? ROWS : 1][2];
#pragma unroll
  for (int c = 0; c < (STAGED && !kPairs ? ROWS : 1); ++c) sacc[c][0] = sacc[c][1] = 0.0f;

  // One tile: every k32 group against every n8 tile of tokens (T = 1: against the staged row;
  // rows g and g + 8 of token column 0 are acc[0][0] and acc[0][2]).
  auto compute_tile = [&](const Raw<D>& R) {
    if constexpr (HB) {
      const uint4* __restrict__ xh = a.xh + size_t(s) * (8 * NT * 32) + lane;
      if constexpr (NT == 4)
        if (8 * (NT - 1) >= T) return tile_half<D, NT, NT - 1>(R, xh, lane, tab, acc);
      return tile_half<D, NT, NT>(R, xh, lane, tab, acc);
    } else if constexpr (kPairs) {
      tile_pairs<D, ROWS>(R, xs + size_t(s) * 8, xrow, lane, tab, acc[0]);
      return;
    } else if constexpr (STAGED) {
      tile_cols<D, ROWS>(R, xs + size_t(s) * 8, xrow, lane, tab, col_mask, sacc);
      return;
    }
    // NL n8 tiles of tokens (of the layout's NT): 17-24 tokens (a DDTree verify of budget 22)
    // skip the fourth of NT = 4, all padding (a padding column's sums are never stored). At NT = 8
    // the second instantiation cost more than the tile it saved (bench/RESULTS.md, session 50:
    // 35B-A3B b48 −3%, b64 −2%; only the 27B's b48 gained), so 33-64 tokens compute all 8.
    auto tiles = [&]<int NL>() {
      [[maybe_unused]] float dg = 0.0f, dg8 = 0.0f;
      tile_scales(R, lane, tab, dg, dg8);
      // x's entries of this super-block: the unrolled loops below index them with constants, so
      // every load is one instruction with an immediate offset (indexing from a.xb per load, the
      // compiler rebuilt each 64-bit address: 3 integer instructions per load, ~15% of the
      // instructions of a tile at 16 tokens).
      // (XS: the same offsets into the block's copy, read as shared-memory loads.)
      const uint2* __restrict__ xb = (XS ? xs_b : a.xb) + size_t(s) * (8 * NT * 32) + lane;
      const float4* __restrict__ xf = (XS ? xs_f : a.xf) + size_t(s) * (8 * NT * 4) + t;
      [[maybe_unused]] const int4* __restrict__ xi = (XS ? xs_i : a.xi) + size_t(s) * (8 * NT * 4) + t;
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        uint32_t a0, a1, a2, a3;
        a_frags(R, jj, a0, a1, a2, a3);
        if constexpr (min_tile(D)) {
          const float2 m0 = tab[g * kTabStride + jj], m1 = tab[(g + 8) * kTabStride + jj];
#pragma unroll
          for (int n = 0; n < NL; ++n) {
            const uint2 bf = ldx<XS>(xb + (jj * NT + n) * 32);
            const float4 f = ldx<XS>(xf + (jj * NT + n) * 4);
            int c[4];
            mma_u8s8_k32(c, a0, a1, a2, a3, bf.x, bf.y);
            acc[n][0] = fmaf(m0.x, f.x * float(c[0]), fmaf(-m0.y, f.y, acc[n][0]));
            acc[n][2] = fmaf(m1.x, f.x * float(c[2]), fmaf(-m1.y, f.y, acc[n][2]));
            acc[n][1] = fmaf(m0.x, f.z * float(c[1]), fmaf(-m0.y, f.w, acc[n][1]));
            acc[n][3] = fmaf(m1.x, f.z * float(c[3]), fmaf(-m1.y, f.w, acc[n][3]));
          }
        } else if constexpr (D == DType::NVFP4_B64_T16) {
          const float2 m0 = tab[g * kTabStride + jj], m1 = tab[(g + 8) * kTabStride + jj];
#pragma unroll
          for (int n = 0; n < NL; ++n) {
            const uint2 bf = ldx<XS>(xb + (jj * NT + n) * 32);
            const float4 f = ldx<XS>(xf + (jj * NT + n) * 4);
            int ca[4], cb[4];
            mma_s8s8_k16(ca, a0, a1, bf.x);  // the first 16-group
            mma_s8s8_k16(cb, a2, a3, bf.y);  // the second
            acc[n][0] = fmaf(m0.y * f.x, float(cb[0]), fmaf(m0.x * f.x, float(ca[0]), acc[n][0]));
            acc[n][2] = fmaf(m1.y * f.x, float(cb[2]), fmaf(m1.x * f.x, float(ca[2]), acc[n][2]));
            acc[n][1] = fmaf(m0.y * f.z, float(cb[1]), fmaf(m0.x * f.z, float(ca[1]), acc[n][1]));
            acc[n][3] = fmaf(m1.y * f.z, float(cb[3]), fmaf(m1.x * f.z, float(ca[3]), acc[n][3]));
          }
        } else if constexpr (D == DType::Q6_K_T16) {
          // int8 scales of the group's two 16-halves, rows g and g + 8
          const uint32_t w0 = pick(R.sc0, jj >> 1) >> (16 * (jj & 1)), w1 = pick(R.sc1, jj >> 1) >> (16 * (jj & 1));
          const int sa0 = sext8(w0), sb0 = sext8(w0 >> 8), sa1 = sext8(w1), sb1 = sext8(w1 >> 8);
#pragma unroll
          for (int n = 0; n < NL; ++n) {
            const uint2 bf = ldx<XS>(xb + (jj * NT + n) * 32);
            const float4 f = ldx<XS>(xf + (jj * NT + n) * 4);
            const int4 z = ldx<XS>(xi + (jj * NT + n) * 4);
            int ca[4], cb[4];
            mma_u8s8_k16(ca, a0, a1, bf.x, z.x, z.y);  // Σ (q − 32) · x over the first 16
            mma_u8s8_k16(cb, a2, a3, bf.y, z.z, z.w);  // and the second
            acc[n][0] = fmaf(dg * f.x, float(sa0 * ca[0] + sb0 * cb[0]), acc[n][0]);
            acc[n][2] = fmaf(dg8 * f.x, float(sa1 * ca[2] + sb1 * cb[2]), acc[n][2]);
            acc[n][1] = fmaf(dg * f.z, float(sa0 * ca[1] + sb0 * cb[1]), acc[n][1]);
            acc[n][3] = fmaf(dg8 * f.z, float(sa1 * ca[3] + sb1 * cb[3]), acc[n][3]);
          }
        } else {
          float e0, e1;
          s8_scales(R, jj, e0, e1);
#pragma unroll
          for (int n = 0; n < NL; ++n) {
            const uint2 bf = ldx<XS>(xb + (jj * NT + n) * 32);
            const float4 f = ldx<XS>(xf + (jj * NT + n) * 4);
            int c[4];
            mma_s8s8_k32(c, a0, a1, a2, a3, bf.x, bf.y);
            acc[n][0] = fmaf(e0 * f.x, float(c[0]), acc[n][0]);
            acc[n][2] = fmaf(e1 * f.x, float(c[2]), acc[n][2]);
            acc[n][1] = fmaf(e0 * f.z, float(c[1]), acc[n][1]);
            acc[n][3] = fmaf(e1 * f.z, float(c[3]), acc[n][3]);
          }
        }
      }
    };
    if constexpr (NT == 4)
      if (8 * (NT - 1) >= T) return tiles.template operator()<NT - 1>();
    tiles.template operator()<NT>();
  };
  // A unit's tiles in registers: one tile, or (PAIR) the two (tile_half_pair); tile_of(U, h) is
  // tile h of it.
  using Unit = std::conditional_t<PAIR, Raw<D>[2], Raw<D>>;
  auto tile_of = [](Unit& U, int h) -> Raw<D>& {
    if constexpr (PAIR)
      return U[h];
    else
      return U;
  };
  auto compute = [&](const Unit& U) {
    if constexpr (PAIR) {
      const uint4* __restrict__ xh = a.xh + size_t(s) * (8 * NT * 32) + lane;
      if constexpr (NT == 4)
        if (8 * (NT - 1) >= T) return tile_half_pair<D, NT, NT - 1>(U[0], U[1], xh, lane, tab, acc, acc1);
      return tile_half_pair<D, NT, NT>(U[0], U[1], xh, lane, tab, acc, acc1);
    } else {
      compute_tile(U);
    }
  };
  // A row-tile's piece ends at its last super-block or at the range's end (flush, with r the
  // row-tile). A whole row-tile is written out; a piece of a split one goes to the warp's slot 0
  // (its first row-tile) or 1 (its last). Arrivals are counted only after the warp's last tile
  // (arrive).
  auto flush = [&]() {
    const long long rs = (long long)r * S;
    const bool whole = rs >= b0 && rs + S <= b1;
    size_t stride = 16;
    const int slot = r == r_first ? 0 : 1;
    float* base = whole ? out_of(a, kRT * r, stride)
                  : bsplit ? bpart + (wib * 2 + slot) * 16 * kPR
                        : a.part + (size_t(w) * 2 + slot) * size_t(T) * 16 * kRT;
    if constexpr (kPairs) {  // tile_pairs: lanes t, t ^ 2 hold the two group parities
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[0][e] += __shfl_xor_sync(0xffffffffu, acc[0][e], 2);
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (const int c = 2 * t + e; t < 2 && c < ROWS) {
          base[size_t(c) * stride + g] = acc[0][e];
          base[size_t(c) * stride + g + 8] = acc[0][2 + e];
        }
      acc[0][0] = acc[0][1] = acc[0][2] = acc[0][3] = 0.0f;
    } else if constexpr (STAGED) {  // tile_cols: the 4 lanes of a g hold a quarter of the groups each
#pragma unroll
      for (int c = 0; c < ROWS; ++c) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          sacc[c][e] += __shfl_xor_sync(0xffffffffu, sacc[c][e], 1);
          sacc[c][e] += __shfl_xor_sync(0xffffffffu, sacc[c][e], 2);
        }
        if (t == c) {  // token c's rows, by lane t = c of each g
          base[size_t(c) * stride + g] = sacc[c][0];
          base[size_t(c) * stride + g + 8] = sacc[c][1];
        }
        sacc[c][0] = sacc[c][1] = 0.0f;
      }
    } else {
      // A tile's accumulators to rows (token c at dst + c · ld), then cleared for the next piece.
      auto store = [&](float (&ac)[NT][4], float* dst, size_t ld) {
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int c = 8 * n + 2 * t + e;
            if (c < T) {
              dst[size_t(c) * ld + g] = ac[n][e];
              dst[size_t(c) * ld + g + 8] = ac[n][2 + e];
            }
          }
#pragma unroll
        for (int n = 0; n < NT; ++n) ac[n][0] = ac[n][1] = ac[n][2] = ac[n][3] = 0.0f;
      };
      store(acc, base, stride);
      if constexpr (PAIR) {  // the unit's second row-tile: its output, or the slot's second half
        size_t stride1 = 16;
        float* base1 = whole ? out_of(a, kRT * r + 1, stride1) : base + size_t(T) * 16;
        store(acc1, base1, stride1);
      }
    }
  };
  // After tile i (the register-prefetch loop).
  auto finish = [&](long long i) {
    if (s == S - 1 || i == b1 - 1) flush();
    if (++s == S) s = 0, ++r;
  };
  // T > 1: the warp's arrival at split row-tile rr (its pieces written and fenced): the last of the
  // row-tile's warps to arrive (counter cnt[w0], w0 the warp holding its first tile) sums every
  // piece in a fixed order and writes out: no float atomics, so the result is bitwise the same on
  // every run and in every replay; it resets the counter for the next launch (which reads it
  // only after its griddep_wait, i.e. after this grid completed). This runs at the kernel's
  // tail (every warp's range ends in a split row-tile), so it is latency, not bandwidth: each
  // lane holds entries lane + 32 k (k < 4·NT) of the T × 16 sums, and the pieces of kV warps
  // are requested together before any is added (one L2 round trip per kV warps, not one per
  // warp per 32 entries: rounds 2-3 summed entry by entry, T / 2 · warps dependent L2 reads).
  auto arrive = [&](int rr) {
    const long long rs = (long long)rr * S;
    const int w0 = warp_of(rs, a.total, a.nwarps), w1 = warp_of(rs + S - 1, a.total, a.nwarps);
    int last = 0;
    if (lane == 0) last = atomic_add_acq_rel(a.cnt + w0, 1) == w1 - w0;
    last = __shfl_sync(0xffffffffu, last, 0);
    if (!last) return;
    __syncwarp();  // lane 0's acquire comes before every lane's reads of the pieces
    constexpr int kE = 4 * NT;                  // entries per lane (8·NT tokens × 16 rows / 32)
    constexpr int kV = NT <= 2 ? 4 : 8 / NT;    // warps' pieces in flight at once (≤ 32 registers)
    const int ne = T * 16;
    // A piece's slot: every warp after w0 starts inside rr (its first row-tile: slot 0); w0 starts
    // at rr's first tile (slot 0) or before it (rr its last row-tile: slot 1). One division here,
    // not two 64-bit divisions per warp in the loop (the staged kernels' sums: 27B b1 +4%).
    const int slot0 = range_begin(w0, a.total, a.nwarps) < rs ? 1 : 0;
    // (PAIR: the unit-row's two row-tiles in turn, each slot holding both, the first then the second.)
#pragma unroll
    for (int h = 0; h < kRT; ++h) {
      float sum[kE];
#pragma unroll
      for (int k = 0; k < kE; ++k) sum[k] = 0.0f;
      for (int v0 = w0; v0 <= w1; v0 += kV) {
        float q[kV][kE];
#pragma unroll
        for (int dv = 0; dv < kV; ++dv) {
          const int v = v0 + dv;
          const int slot = v == w0 ? slot0 : 0;
          const float* p = a.part + ((size_t(v) * 2 + slot) * kRT + h) * size_t(T) * 16 + lane;
#pragma unroll
          for (int k = 0; k < kE; ++k) q[dv][k] = v <= w1 && lane + 32 * k < ne ? __ldcg(p + 32 * k) : 0.0f;
        }
#pragma unroll
        for (int dv = 0; dv < kV; ++dv)
          if (v0 + dv <= w1) {  // warp order, as a serial sum from 0
#pragma unroll
            for (int k = 0; k < kE; ++k) sum[k] += q[dv][k];
          }
      }
      size_t stride = 0;
      float* o = out_of(a, kRT * rr + h, stride);
#pragma unroll
      for (int k = 0; k < kE; ++k) {
        const int e = lane + 32 * k;
        if (e < ne) o[size_t(e >> 4) * stride + (e & 15)] = sum[k];
      }
    }
    if (lane == 0) a.cnt[w0] = 0;
  };
  // After the last tile: the split row-tiles among the warp's first and last. Counting the
  // first one's arrival here rather than when its piece is done keeps the fence and the atomic's
  // round trip out of the middle of the stream (they drained the warp's loads in flight).
  auto arrive_all = [&]() {
    const int r_last = int((b1 - 1) / S);
    const bool split_first = (long long)r_first * S < b0 || (long long)r_first * S + S > b1;
    const bool split_last = r_last != r_first && (long long)r_last * S + S > b1;
    if (!split_first && !split_last) return;
    __syncwarp();  // every lane's piece stores come before lane 0's release (atomic_add_acq_rel)
    if (split_first) arrive(r_first);
    if (split_last) arrive(r_last);
  };

  if constexpr (REGS) {
    // Two register sets in turn: tile i + 1 loads while tile i computes (no copies). b0 < b1:
    // never more warps than tiles. Both sets are requested before the wait, so a small
    // matrix's warps (a few tiles each) have two tiles arriving while the kernel before ends.
    Unit A, Bt;
    auto load_unit = [&](long long u, Unit& R) {
#pragma unroll
      for (int h = 0; h < kRT; ++h) load_tile<D, true>(tile_at(u, h), lane, tile_of(R, h));
    };
    // XS with a.ahead: tile j's 128-byte lines requested into L2 (prefetch.global.L2) a.ahead
    // tiles before its register load, so that load waits on L2, not DRAM (ncu: 31% of the
    // 16-token kernel's stall cycles on the weights' loads with one register set ahead).
    auto l2_ahead = [&](long long j) {
      if constexpr (XS)
        if (a.ahead > 0 && j < b1)
          for (int l = lane; l * 128 < B; l += 32)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(a.w + size_t(j) * B + 128 * l));
    };
    if (b0 < b1) load_unit(b0, A);
    if (b0 + 1 < b1) load_unit(b0 + 1, Bt);
    for (int k = 2; k < 2 + a.ahead; ++k) l2_ahead(b0 + k);
    prefetch_norm();
    griddep_wait();  // the activations (and this call's workspace) come after the kernel before
    stage_x();
    for (long long i = b0; i < b1; i += 2) {
      compute(A);
      finish(i);
      if (i + 2 < b1) load_unit(i + 2, A);
      l2_ahead(i + 2 + a.ahead);
      if (i + 1 >= b1) break;
      compute(Bt);
      finish(i + 1);
      if (i + 3 < b1) load_unit(i + 3, Bt);
      l2_ahead(i + 3 + a.ahead);
    }
  } else {
    prefetch_norm();
    griddep_wait();  // the activations (and this call's workspace) come after the kernel before
    stage_x();
    // Ring of RING tiles per warp: tile i computes while tiles i + 1 .. i + RING − 1 load. The
    // stage offsets and the next tile's address advance by B (no per-tile index arithmetic).
    // The tiles go by pieces of row-tiles (to the row-tile's end or the range's): the per-tile
    // loop has no flush test and counts in 32 bits (a warp's range is far below 2^31 tiles).
    const uint8_t* next = a.w + size_t(b0 + RING - 1) * B + 16 * lane;
    constexpr int kStage = kRT * B;  // a unit's tiles
    int cur = 0, fill = (RING - 1) * kStage;
    const int n = int(b1 - b0);
    for (int j = 0; j < n;) {
      for (const int end = min(n, j + (S - s)); j < end; ++j, ++s) {
        __syncwarp();  // every lane is done reading the stage refilled now (tile j − 1's)
        if (j + RING - 1 < n) {
          if constexpr (PAIR) {
#pragma unroll
            for (int h = 0; h < kRT; ++h) issue_tile<B>(ring_s + fill + h * B, tile_at(b0 + j + RING - 1, h) + 16 * lane, lane);
          } else {
            issue_tile<B>(ring_s + fill, next, lane);
          }
        }
        cp_async_commit();  // possibly empty: group k always holds tile b0 + k
        cp_async_wait<RING - 1>();
        __syncwarp();  // the headers copied by other lanes are visible
        Unit R;
#pragma unroll
        for (int h = 0; h < kRT; ++h) load_tile<D, false>(ring + cur + h * B, lane, tile_of(R, h));
        compute(R);
        next += B;
        fill = cur;  // the stage just read is the next to refill
        cur = cur == (RING - 1) * kStage ? 0 : cur + kStage;
      }
      flush();
      if (s == S) s = 0, ++r;
    }
  }
  if (bsplit) {
    // The block's split row-tiles, each summed by one warp's lanes (entry e: token e / 16, row
    // e mod 16) in warp order (bitwise the same every run) from the pieces in shared memory. A
    // piece's slot comes from its warp's first row-tile as the warp stored it (wfirst): computed
    // here per warp and entry it took two 64-bit divisions each, a serial chain on every block's
    // tail (ncu, 35B-A3B out_proj, a row-tile over 16 warps: ~40% of the kernel's stall samples).
    __syncthreads();
    long long q0, q1, nb;
    block_rows(q0, q1, nb);
    for (long long rr = q0 + wib; rr < q1; rr += wpb) {
      const long long ls = (rr - q0) * S;  // the row-tile's first tile in the block's nb
      const int v0 = warp_of(ls, nb, wpb), v1 = warp_of(ls + S - 1, nb, wpb);
      if (v0 == v1) continue;  // whole: written by finish
      size_t stride = 0;
      float* const o = out_of(a, int(rr), stride);
      for (int e = lane; e < 16 * (STAGED ? ROWS : T); e += 32) {
        float sum = 0.0f;
        for (int v = v0; v <= v1; ++v) {
          const int slot = wfirst[v] == rr ? 0 : 1;  // rr is v's first row-tile, or its last
          sum += bpart[(v * 2 + slot) * 16 * kPR + e];
        }
        o[size_t(e >> 4) * stride + (e & 15)] = sum;
      }
    }
  } else {
    arrive_all();
  }
}

// HB: 0 the int8 form; 1 the bf16 form, one block of 8 warps per SM as the int8 one at NT ≥ 4;
// 2 the bf16 form capped at 128 registers, two blocks per SM (its 17-32-token tiles take ~170-230
// registers uncapped; capped, ~40-100 bytes spill: QWEN36_MMA_HB_BLOCKS picks, cuda_quant_mma.cu);
// 3 the bf16 form on pairs of row-tiles (mma_block's PAIR; QWEN36_MMA_HB_PAIRS), one block.
template <DType D, int NT, int ROWS, int RING, bool XS, int HB>
__global__ void __launch_bounds__(max_threads(ROWS, XS), HB == 2 ? 2 : min_blocks(NT, ROWS, XS))
    mma_kernel(const MmaArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  mma_block<D, NT, ROWS, RING, XS, (HB > 0), HB == 3>(a, int(blockIdx.x), int(gridDim.x), smem);
}

// A staged call's (T ≤ 3) two groups of different types that read the same x (a DeltaNet
// layer's Q6_K qkv and Q4_K z, b, a; an attention layer's Q4_K q, k and Q6_K v): one launch,
// blocks [0, grid1) the first group's and the rest the second's, their counts in proportion to
// the groups' bytes (plan_pair), so both end together: no kernel boundary between them, and the
// second group's blocks do not wait for the first's last one. Each block is exactly a staged
// block of its group's own launch (the same norm or quantization of x, the same per-block split).
template <DType D1, int RING1, DType D2, int RING2, int ROWS>
__global__ void __launch_bounds__(max_threads(ROWS), 1)
    mma_pair_kernel(const MmaArgs a1, const MmaArgs a2, int grid1) {
  static_assert(ROWS > 0, "the staged kernels' blocks");
  extern __shared__ __align__(16) uint8_t smem[];
  if (int(blockIdx.x) < grid1)
    mma_block<D1, 1, ROWS, RING1>(a1, int(blockIdx.x), grid1, smem);
  else
    mma_block<D2, 1, ROWS, RING2>(a2, int(blockIdx.x) - grid1, int(gridDim.x) - grid1, smem);
}

// f32 matrices beside a one-token GEMM that computes the norm (NormIn): the MoE router and the
// shared expert's gate logit beside that expert's gate / up projections. Matrix m holds rows
// [r_end[m − 1], r_end[m]) of one index space and writes out[m] ([1, rows]).
struct GemvRows {
  const float* w[kMaxMats];
  float* out[kMaxMats];
  int r_end[kMaxMats], nmat;
};

// Shared memory of a norm_gemv_block for S super-blocks: the quantized row norm_row writes (unused
// here), v, the group sums, the norm's weight and x in f32.
__host__ __device__ constexpr size_t norm_gemv_bytes(long long S) {
  return x_stage_bytes(S) + size_t(S) * 256 * 3 * sizeof(float) + size_t(S) * 8 * sizeof(float);
}

// Block bid of nblocks: the rows of g times x, x the token's norm as the GEMM blocks of the same
// launch compute it (norm_row; its f32 values kept in shared memory), so the f32 projections need
// no launch of their own after the norm's (the 35B-A3B's router GEMV: 2.2 µs a layer on the
// chain). Warp w of the blocks takes rows w, w + warps, ...; each lane adds its 8-weight chunks
// lane, lane + 32, ... of the row in gemv_multi_kernel's order and form (cuda_matmul.cu: the
// chunk's 8 products summed, then added), the warp's lanes by warp_sum: the values of
// matmul_multi after the norm, bit for bit. A warp's first row's first chunks are requested
// before griddep_wait (the weights depend on no kernel).
constexpr int kGemvAhead = 4;  // 8-weight chunks of the first row a lane requests before the wait
__device__ __forceinline__ void norm_gemv_block(const MmaArgs& a, const GemvRows& g, int bid, int nblocks,
                                                uint8_t* smem) {
  griddep_trigger();
  const int S = a.S, G = S * 8, K = G * 32, K8 = K / 8, lane = int(threadIdx.x & 31), wpb = int(blockDim.x >> 5);
  const int nw = nblocks * wpb, w0 = bid * wpb + int(threadIdx.x >> 5), R = g.r_end[g.nmat - 1];
  ColGroup* const xs = reinterpret_cast<ColGroup*>(smem);
  float4* const vrow = reinterpret_cast<float4*>(smem + x_stage_bytes(S));
  float* const gss = reinterpret_cast<float*>(vrow + K / 4);
  float4* const wrow = reinterpret_cast<float4*>(gss + G);
  float* const xf = reinterpret_cast<float*>(wrow + K / 4);
  auto row_of = [&](int r, float*& out) {  // compile-time indices only (as out_of)
    const float* w = g.w[0];
    float* o = g.out[0];
    int r0 = 0;
#pragma unroll
    for (int m = 1; m < kMaxMats; ++m)
      if (m < g.nmat && r >= g.r_end[m - 1]) w = g.w[m], o = g.out[m], r0 = g.r_end[m - 1];
    out = o + (r - r0);
    return w + size_t(r - r0) * K;
  };
  float4 ahead[kGemvAhead][2];
  if (w0 < R) {
    float* o;
    const float* w = row_of(w0, o);
#pragma unroll
    for (int u = 0; u < kGemvAhead; ++u)
      if (const int i = lane + 32 * u; i < K8) {
        ahead[u][0] = __ldcs(reinterpret_cast<const float4*>(w + size_t(i) * 8));
        ahead[u][1] = __ldcs(reinterpret_cast<const float4*>(w + size_t(i) * 8) + 1);
      }
  }
  float4 wq[kNormW];
  prefetch_norm_w<true>(a.norm, G, wq, wrow);
  griddep_wait();  // y and delta come from the kernels before
  norm_row<true>(a.norm, G, wq, wrow, vrow, gss, xs, false, reinterpret_cast<float4*>(xf));
  __syncthreads();
  bool first = true;
  for (int r = w0; r < R; r += nw) {
    float* o;
    const float* w = row_of(r, o);
    float acc = 0.0f;
    auto chunk = [&](int i, const float4& a0, const float4& a1) {
      const float4 x0 = reinterpret_cast<const float4*>(xf)[2 * i], x1 = reinterpret_cast<const float4*>(xf)[2 * i + 1];
      acc += a0.x * x0.x + a0.y * x0.y + a0.z * x0.z + a0.w * x0.w + a1.x * x1.x + a1.y * x1.y + a1.z * x1.z + a1.w * x1.w;
    };
    int i = lane;
    if (first) {
#pragma unroll
      for (int u = 0; u < kGemvAhead; ++u, i += 32)
        if (i < K8) chunk(i, ahead[u][0], ahead[u][1]);
      first = false;
    }
    for (; i < K8; i += 32)
      chunk(i, __ldcs(reinterpret_cast<const float4*>(w + size_t(i) * 8)),
            __ldcs(reinterpret_cast<const float4*>(w + size_t(i) * 8) + 1));
    acc = warp_sum(acc);
    if (lane == 0) *o = acc;
  }
}

// A one-token GEMM with the norm (blocks [0, grid1): mma_block as its own launch would run them)
// and the f32 projections of the same x (the others: norm_gemv_block) in one launch.
template <DType D, int RING>
__global__ void __launch_bounds__(max_threads(1), 1) mma_norm_gemv_kernel(const MmaArgs a, const GemvRows g, int grid1) {
  extern __shared__ __align__(16) uint8_t smem[];
  if (int(blockIdx.x) < grid1)
    mma_block<D, 1, 1, RING>(a, int(blockIdx.x), grid1, smem);
  else
    norm_gemv_block(a, g, int(blockIdx.x) - grid1, int(gridDim.x) - grid1, smem);
}

}  // namespace
}  // namespace qwen36::cuda
