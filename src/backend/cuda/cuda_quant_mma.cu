// out[T, N] = x[T, K] · w[N, K]ᵀ on int8 tensor cores for Q4_K, Q6_K, Q8_0, W4_G128 / W4_G32
// (AWQ / GPTQ / compressed-tensors int4) and NVFP4 weights stored in the device's tiled layout
// (DTypes *_T16), T ≤ 64, and the dispatch of every tiled matmul (T > 64 and exact_matmul: the
// dequantized slices of cuda_quant_tile_layout.cu, which also repacks GGUF / HF matrices into
// the layout; the routed experts' decode on the same tiles: cuda_quant_moe_mma.cu).
// The register side shared with that file (mma wrappers, tile registers, A fragments, the int8
// activation quantizer) is cuda_quant_mma_frags.cuh; the staged kernels' per-tile computation
// (tile_cols, tile_pairs) is cuda_quant_staged_tiles.cuh.
//
//  - Layout: a [N, K] matrix (N % 16 == 0, K % 256 == 0) is a sequence of tiles (row-tile r of
//    16 rows, super-block s of 256 weights), s fastest, each tile holding exactly the GGUF bytes
//    of its 16 row-blocks, rearranged so that a warp's 16-byte loads are whole mma.sync A
//    fragments (m16n8k32, u8 / s8; g = lane / 4, t = lane % 4: a0 = row g, k 4t..4t+3; a1 = row
//    g + 8, same k; a2, a3 = the same at k + 16). Load i of lane L reads tile + 512 i + 16 L:
//    every warp load is 512 contiguous bytes.
//      Q4_K (2304 B): 4 loads of codes; load i's words are a0, a1, a2, a3 of k32 group 2i in
//        their low nibbles and of group 2i + 1 in their high ones, so each fragment is one AND
//        (the odd group's as 16·q in place, its scale divided by 16 in the warp's table: exact;
//        3 ops per 8 weights before, when a word held a0 and a2 of one group); then the 16 rows'
//        GGUF headers (d, dmin, 12 scale bytes), unchanged.
//      Q6_K (3360 B): 4 loads of the low 4 bits, words X, Y of k32 groups 2i, 2i + 1 (rows g,
//        g + 8), X's low nibbles a0, its high nibbles a2; 2 loads of high-bit words H (group j =
//        4i + word; bits 0-1 / 2-3 / 4-5 / 6-7 of byte b: the high bits of byte b of a0 / a1 /
//        a2 / a3); the 16 rows' int8 scales (16 each); the 16 rows' f16 d.
//      Q8_0 (4352 B): 8 loads, one k32 group each, {a0, a1, a2, a3} as int8; then the f16 d of
//        the 16 rows' 8 blocks ([row][block]).
//      W4_G128 (2176 B, the 32 blocks' bytes): the codes as Q6_K's low bits; then per row the two
//        groups' 16-bit scales, integer zeros and scale kinds (cuda_quant_tiles.cuh). Its A fragments
//        are s8 code − zero (3 integer operations a word), so a group is one s8 MMA and one scale as
//        Q8_0's: the products Σ (q − z) · x are exact, the scale applied in f32.
//      W4_G32 (2560 B, the 128 blocks' bytes): the codes as Q6_K's low bits (a block's code bytes
//        as they stand); per row and half tile the 4 groups' scales, zeros and kinds. Computed as Q4_K,
//        (S, M) = (s, s · z) per (row, group) in the warp's table.
//      NVFP4_B64 (2560 B, the 64 blocks' bytes): e2m1 codes arranged as prmt selectors, then per
//        row and half tile 8 e4m3 16-group scales and 2 f32 global scales (cuda_quant_tiles.cuh).
//        Its A fragments are s8 2·e2m1 (two prmt lookups and 4 integer operations a register);
//        a k32 group is two s8 m16n8k16 MMAs, one per 16-group, whose scales e4m3 · g / 2 the
//        warp decodes into a table per tile as Q4_K's.
//  - Activations (quantize_kernel, a pre-kernel; a thread per 4 weights, a warp per 4 groups of
//    one token): per 32 to int8 exactly as the decode GEMV (d = amax / 127, nearest even via
//    1.5 · 2^23), stored as B fragments per (k32 group, n8 tile): lane L's b0, b1 are one 8-byte
//    load. Per (group, n-tile, t) a float4 {d, d·Σq} of tokens 2t, 2t + 1 (Q4_K's min term) and
//    an int4 {−32·Σq} of each 16-half (Q6_K's offset, used as the MMA's C input so that the
//    int32 result is Σ (q − 32) · x exactly). T·K bytes: L2-resident. It also zeroes the GEMM's
//    arrival counters when they are the call's workspace (without the backend's scratch stack;
//    its counters are zero already, cuda_ops.cuh).
//    At T = 1 each GEMM block stages token 0's fragments and scales (48 bytes per k32 group) in
//    shared memory (stage_x), so the loop reads them there: on the H200 that took a Q4_K
//    17408 × 5120 GEMV from 22.7 to 21.5 µs and a Q6_K one from 31.4 to 27.1 µs (cold L2), and
//    the 27B Q4_K_M decode step from ~9.3 to ~8.7 ms; the T = 1 kernels also spill less. When
//    the kernel before did not quantize x (act), each block quantizes the f32 row itself there
//    (quantize_row, the same codes and scales): no quantize_kernel launch, for 128 bytes read per
//    group instead of 48 and the quantization repeated per block (use_fused_t1). With a NormIn
//    (quant_tiled_matmul_norm) each block computes the row as the layer's residual add and norm
//    (norm_row): no norm launch either.
//  - GEMM (mma_kernel): persistent warps, all resident, each a balanced contiguous range of
//    tiles (memory order; at T = 1 of its block's row-tiles, below). Two load paths, chosen per
//    call (QWEN36_MMA_LOADS = regs | smem; unset: use_regs, as measured on the H200):
//    regs: each lane holds the next tile's 16-byte loads (evict-first) in registers while the
//      current one computes (two register sets in turn); blocks of 8 warps, 2 per SM up to 16
//      tokens (≤ 128 registers; T = 1: one block of 16), the default carveout so that L1 keeps
//      x's fragments, which every warp of an SM re-reads; the first tile is requested before
//      griddep_wait.
//    smem: each warp streams its tiles through a private shared-memory ring of kStages = 3 with
//      cp.async (no registers held by loads in flight): 2 tiles load while one computes, the first
//      2 requested before griddep_wait; the maximum shared-memory carveout.
//    Q4_K's warp decodes the tile's 16 × 8 (d·sc, dmin·m) into shared memory once (each lane a
//    row and 4 groups). Per k32 group and n8 tile of tokens: one MMA into a fresh int32 C (Q6_K:
//    two m16n8k16, one per 16-scale), then a float epilogue per C element; at T ≤ 3 (the staged
//    kernels, instantiations ROWS = T) the warp runs tile_cols against each token's staged row
//    instead: the tile's 8 groups in the 8 MMA columns of one accumulator per token, each lane
//    scaling 2 groups of 2 rows (the routed experts keep tile_row, whose per-tile order their
//    host twin reproduces). A token's result does not depend on the other tokens of the call.
//    QWEN36_MMA_VERBOSE=1 prints each launch shape once (stderr).
//  - T ≤ 3 (staged): the split is per block. Each block (up to 16 warps, one per SM) holds whole
//    row-tiles, ⌊R / grid⌋ or one more of the R, and its warps split those tiles in balanced contiguous
//    ranges; the pieces of a row-tile split between warps meet in shared memory after a block
//    barrier and are summed in warp order. The grid split below kept the tiles perfectly balanced
//    but put a workspace store, a fenced atomic and an L2 round trip on every warp's tail (ncu:
//    ~40% of an 18 MB GEMM's stall samples); a block's barrier costs ~nothing, and its row-tile
//    granularity at most one row-tile's tiles over the block's warps (2176 row-tiles over 132
//    blocks: 17 vs 16.5). H200, 27B Q4_K_M tg128 b1 140.2 → 151.2 t/s, 35B-A3B 348.9 → 368.9.
//    Up to 3 tokens' rows are staged so (3 × 26 KB at K = 17408), 2 for rows of fewer than 16
//    super-blocks (the H200's measurements: kMaxStagedRows).
//  - T > 3 (and QWEN36_MMA_STAGED=off), a row-tile split between warps: each writes its piece
//    to a workspace slot; after its last tile lane 0 counts the warp's arrivals (an acquire-release atomic add on an int counter,
//    one per split row-tile, indexed by the warp holding the row-tile's first tile; never
//    mid-stream, where the atomic's round trip stalled the loads in flight); the last to arrive
//    sums the pieces in a fixed order (warp order) and writes out (no float atomics: bitwise
//    reproducible, eager or graph replay) and resets the counter, so the next launch of the call
//    (read only after its griddep_wait) finds it zero. That sum is on the kernel's critical path
//    (every warp's range ends in a split row-tile), so it requests several warps' pieces, all
//    their entries, before adding: a few L2 round trips. (Round 3 summed entry by entry: T / 2 ·
//    warps-per-row-tile dependent L2 reads, 2 integer divisions each — ~70 at T = 32 on
//    5120 × 17408, the cause of its 30–60 % loss at T ≥ 2.) The split per block, tried at T > 1,
//    was slower at 16 tokens (bench/RESULTS.md, session 13). Launches per call: quantize (not at
//    fused T = 1), then one GEMM per group.
//    XS (9-16 tokens on rows of ≥ 16 super-blocks where it fits, K ≤ ~8192; QWEN36_MMA_XS=on:
//    any T ≤ 16 where it fits, which is K ≤ 17408 up to 8 tokens): each
//    block first copies the activations' fragments and scales of the super-blocks its tiles read
//    from the workspace into its shared memory (cp.async, after griddep_wait; its first two tiles
//    already requested) and the loop reads them there; blocks of 16 warps, one per SM, the same
//    warps and ranges as without it (QWEN36_MMA_XS=off: through L1, whose hit rate was 60% on a
//    27B gate + up at 16 tokens and 32% on a down projection). Its lanes also request each
//    tile's lines into L2 one tile before its register load (QWEN36_MMA_AHEAD).
//  - Grid: nwarps = min(tiles, resident warps); a matrix with fewer tiles than one full block per
//    SM gets blocks of ceil(nwarps / SMs) warps so every SM's load path carries a share (2048 ×
//    512 Q4_K: 256 tiles → 2 warps on each of 128 SMs, not 8 warps on 32). A tile (2.3–4.3 KB) is
//    the smallest unit of work; such a matrix is one DRAM round trip plus two launches.
//    Up to 4 matrices of one type stored back to back (a layer's projections) are one stacked
//    matrix: one quantization of x, then one GEMM launch per such group; at T ≤ 3 a call's two
//    groups of Q6_K and Q4_K (the Q4_K_M mix's DeltaNet qkv and z, b, a; attention v and q, k)
//    are one launch, its blocks shared between them in proportion to their bytes
//    (mma_pair_kernel; QWEN36_MMA_PAIR=off: a launch each).
//    Instruction count at T ≤ 8 (per lane, per 16 weights of a group): Q4_K 6 unpack + 2 LDS +
//    2 LDG + 1 MMA + 16 epilogue ≈ 27 (8 fewer at T = 1; + ~50 per tile for the copy, the
//    shared-memory reads and scales): ~2 per weight; Q6_K ~2.6; Q8_0 ~1.3. Each more n8 tile
//    adds ~19 per 16 weights.
//  - Prefill (T > 64) and exact_matmul: row slices dequantized to bf16 (f32), cuBLAS, as
//    cuda_quant_matmul.cu's quant_gemm; x rounded to bf16 once for the matrices of one call. The
//    dequantizer takes a warp per tile (dequant_tile, cuda_quant_tile_layout.cu): its loads are the tile's 512-byte rows, its
//    stores whole sectors (H200: 27B Q4_K_M pp512 5,335 → 6,672 t/s against a thread per k32
//    group). The MLP's form (gate + up in one GEMM, bf16 SwiGLU): cuda_matmul_fused.cu.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <tuple>
#include <type_traits>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/cuda_act_quant.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_quant_blocks.cuh"
#include "backend/cuda/cuda_quant_mma_frags.cuh"
#include "backend/cuda/cuda_quant_staged_tiles.cuh"

namespace qwen36::cuda {

namespace {

constexpr int kWarps = 8;     // warps per block of the GEMM (at most; fewer for small matrices)
constexpr int kOneWarps = 16; // the same for the staged kernels (ROWS), which split row-tiles in blocks
constexpr int kStages = 3;    // tiles in each warp's shared-memory ring: 2 loading while 1 computes

// ================================================================================================
// Activations
// ================================================================================================

// One thread per (token c < 8·NT, k32 group j, quarter u of 4 weights); a warp holds 4 groups of
// one token (G % 8 == 0), so c is warp-uniform: padded tokens (c ≥ T) store zeros without
// loading. The bytes and scales are those of the earlier one-warp-per-group form exactly.
// Also zeroes the GEMM's arrival counters (fresh stream-ordered memory each call).
// kSwiglu: the activations are silu(x) · up, computed here (the MLP's down projection after its
// gate and up ones, cuda_quant_norm.cu), exactly as the swiglu op computes them.
template <bool kSwiglu>
__global__ void quantize_kernel(const float* __restrict__ x, const float* __restrict__ up, int T, int K, int NT,
                                uint8_t* __restrict__ xb, float* __restrict__ xf, int* __restrict__ xi,
                                int* __restrict__ cnt, int ncnt) {
  griddep_trigger();
  griddep_wait();  // x comes from the kernel before; this call's workspace may be the last one's
  const int G = K >> 5, u = int(threadIdx.x & 7);
  const long long stride = (long long)gridDim.x * blockDim.x, id0 = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  for (long long i = id0; i < ncnt; i += stride) cnt[i] = 0;
  const long long n = (long long)NT * 8 * G * 8;  // a multiple of 512: every warp is whole in every round
  for (long long id = id0; id < n; id += stride) {
    const long long jq = id >> 3;
    const int c = int(jq / G), j = int(jq - (long long)c * G);
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (c < T) {
      const size_t at = size_t(c) * K + size_t(j) * 32;
      v = reinterpret_cast<const float4*>(x + at)[u];
      if constexpr (kSwiglu) {
        const float4 w = reinterpret_cast<const float4*>(up + at)[u];
        v = make_float4(silu_f(v.x) * w.x, silu_f(v.y) * w.y, silu_f(v.z) * w.z, silu_f(v.w) * w.w);
      }
    }
    store_act_quad(xb, xf, xi, NT, c, j, u, quantize_quad(v));
  }
}

template <bool kSwiglu>
void launch_quantize(Ctx& c, const float* x, const float* up, int T, int K, uint8_t* act, int* cnt, int ncnt) {
  const ActLayout L(T, K);
  const long long qthreads = (long long)L.NT * 8 * (long long)L.G * 8;
  const int qblocks = int(std::min<long long>((qthreads + 255) / 256, (long long)dev_info().sms * 8));
  launch_pdl(quantize_kernel<kSwiglu>, dim3(unsigned(qblocks)), dim3(256), 0, c.stream, x, up, T, K, L.NT, act + L.o_xb,
             reinterpret_cast<float*>(act + L.o_xf), reinterpret_cast<int*>(act + L.o_xi), cnt, ncnt);
}

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
    for (int id = tid; id < nq; id += nt) cpa_16(wrow + id, w + id);
    cpa_commit();
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
  if constexpr (kSmemW) cpa_wait<0>();  // this thread's quads of w (each reads only its own)
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
  // Up to kMaxMats matrices stored back to back (one tiled matrix of stacked rows): matrix m
  // holds row-tiles [rt_end[m − 1], rt_end[m]) and writes out[m] ([T, n[m]]).
  float* out[4];
  int rt_end[4], n[4], nmat;
  float* part;         // [nwarps][2][T][16] partial sums of row-tiles split between warps
  int* cnt;            // [nwarps] arrivals at the split row-tile whose first tile warp w holds
  long long total;     // tiles = R · S
  int S, T, nwarps;
  int ahead;           // XS: tiles past the register sets whose bytes are requested into L2 (0: none)
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

// Shared memory per warp: the tile ring (smem path only), then (Q4_K, NVFP4) the scale table.
template <DType D, int RING>
__host__ __device__ constexpr int warp_smem() {
  return RING * TileLayout<D>::kBytes + (table_tile(D) ? 16 * kTabStride * int(sizeof(float2)) : 0);
}

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
// without it, so the outputs are bitwise the same for the same warps.
template <DType D, int NT, int ROWS, int RING, bool XS = false>
__device__ __forceinline__ void mma_block(const MmaArgs& a, int bid, int nblocks, uint8_t* smem) {
  static_assert(RING == 0 || RING >= 2, "a ring loads while a stage computes");
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
  [[maybe_unused]] long long q0 = 0, q1 = 0, nb = 0;
  long long b0, b1;
  if constexpr (STAGED) {
    const long long R = a.total / S;
    q0 = (long long)bid * R / nblocks, q1 = (long long)(bid + 1) * R / nblocks;
    nb = (q1 - q0) * S;
    b0 = q0 * S + range_begin(wib, nb, wpb), b1 = q0 * S + range_begin(wib + 1, nb, wpb);
  } else {
    b0 = range_begin(w, a.total, a.nwarps), b1 = range_begin(w + 1, a.total, a.nwarps);
  }
  [[maybe_unused]] uint8_t* ring = smem + size_t(wib) * RING * B;
  [[maybe_unused]] const uint32_t ring_s = uint32_t(__cvta_generic_to_shared(ring)) + 16 * lane;  // this lane's copies
  float2* tab = reinterpret_cast<float2*>(smem + size_t(wpb) * RING * B) + wib * 16 * kTabStride;
  constexpr int kWarpSmem = warp_smem<D, RING>();
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
      reinterpret_cast<uint8_t*>(xs) + staged_bytes(S, ROWS, a.norm.y != nullptr, REGS));
  [[maybe_unused]] int* const wfirst = reinterpret_cast<int*>(bpart + size_t(wpb) * 2 * 16 * ROWS);
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
      if (B1 - B0 < S && B0 % S <= (B1 - 1) % S) s0 = B0 % S, s1 = (B1 - 1) % S + 1;
      const size_t per = size_t(8) * NT;  // (group, n8 tile) fragments of a super-block
      auto copy = [&](void* dst, const void* src, size_t unit) {  // unit: bytes a fragment
        uint8_t* d = static_cast<uint8_t*>(dst) + size_t(s0) * per * unit;
        const uint8_t* g = static_cast<const uint8_t*>(src) + size_t(s0) * per * unit;
        const size_t bytes = size_t(s1 - s0) * per * unit;
        for (size_t o = 16 * threadIdx.x; o < bytes; o += 16 * blockDim.x) cpa_16(d + o, g + o);
      };
      copy(xs_b, a.xb, 32 * sizeof(uint2));
      copy(xs_f, a.xf, 4 * sizeof(float4));
      if constexpr (D == DType::Q6_K_T16) copy(xs_i, a.xi, 4 * sizeof(int4));
      cpa_commit();
      cpa_wait<0>();
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
      if (b0 + p < b1) issue_tile<B>(ring_s + p * B, a.w + size_t(b0 + p) * B + 16 * lane, lane);
      cpa_commit();
    }
  }

  int r = int(b0 / S), s = int(b0 - (long long)r * S);
  const int r_first = r;
  if constexpr (STAGED)
    if (lane == 0) wfirst[wib] = r_first;  // read by the split row-tiles' sums after the loop
  // T = 1 (tile_cols): col_mask[jj] keeps this lane's fragment of the row in MMA jj's B (g == jj).
  [[maybe_unused]] uint32_t col_mask[8];
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) col_mask[jj] = g == jj ? ~0u : 0u;
  float acc[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  // ROWS ≤ 2: tile_cols per token (token c's rows g, g + 8); more: tile_pairs (acc[0]).
  constexpr bool kPairs = ROWS > kColsRows;
  [[maybe_unused]] float sacc[STAGED && !kPairs ? ROWS : 1][2];
#pragma unroll
  for (int c = 0; c < (STAGED && !kPairs ? ROWS : 1); ++c) sacc[c][0] = sacc[c][1] = 0.0f;

  // One tile: every k32 group against every n8 tile of tokens (T = 1: against the staged row;
  // rows g and g + 8 of token column 0 are acc[0][0] and acc[0][2]).
  auto compute = [&](const Raw<D>& R) {
    if constexpr (kPairs) {
      tile_pairs<D, ROWS>(R, xs + size_t(s) * 8, xrow, lane, tab, acc[0]);
      return;
    } else if constexpr (STAGED) {
      tile_cols<D, ROWS>(R, xs + size_t(s) * 8, xrow, lane, tab, col_mask, sacc);
      return;
    }
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
        for (int n = 0; n < NT; ++n) {
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
        for (int n = 0; n < NT; ++n) {
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
        for (int n = 0; n < NT; ++n) {
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
        for (int n = 0; n < NT; ++n) {
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
  // After tile i: a row-tile's piece ends at its last super-block or at the range's end. A
  // whole row-tile is written out; a piece of a split one goes to the warp's slot 0 (its first
  // row-tile) or 1 (its last). Arrivals are counted only after the warp's last tile (arrive).
  auto finish = [&](long long i) {
    if (s == S - 1 || i == b1 - 1) {
      const long long rs = (long long)r * S;
      const bool whole = rs >= b0 && rs + S <= b1;
      size_t stride = 16;
      const int slot = r == r_first ? 0 : 1;
      float* base = whole ? out_of(a, r, stride)
                    : STAGED ? bpart + (wib * 2 + slot) * 16 * ROWS
                          : a.part + (size_t(w) * 2 + slot) * size_t(T) * 16;
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
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int c = 8 * n + 2 * t + e;
            if (c < T) {
              base[size_t(c) * stride + g] = acc[n][e];
              base[size_t(c) * stride + g + 8] = acc[n][2 + e];
            }
          }
#pragma unroll
        for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
      }
    }
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
    float sum[kE];
#pragma unroll
    for (int k = 0; k < kE; ++k) sum[k] = 0.0f;
    for (int v0 = w0; v0 <= w1; v0 += kV) {
      float q[kV][kE];
#pragma unroll
      for (int dv = 0; dv < kV; ++dv) {
        const int v = v0 + dv;
        const int slot = v == w0 ? slot0 : 0;
        const float* p = a.part + (size_t(v) * 2 + slot) * size_t(T) * 16 + lane;
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
    float* o = out_of(a, rr, stride);
#pragma unroll
    for (int k = 0; k < kE; ++k) {
      const int e = lane + 32 * k;
      if (e < ne) o[size_t(e >> 4) * stride + (e & 15)] = sum[k];
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
    Raw<D> A, Bt;
    // XS with a.ahead: tile j's 128-byte lines requested into L2 (prefetch.global.L2) a.ahead
    // tiles before its register load, so that load waits on L2, not DRAM (ncu: 31% of the
    // 16-token kernel's stall cycles on the weights' loads with one register set ahead).
    auto l2_ahead = [&](long long j) {
      if constexpr (XS)
        if (a.ahead > 0 && j < b1)
          for (int l = lane; l * 128 < B; l += 32)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(a.w + size_t(j) * B + 128 * l));
    };
    if (b0 < b1) load_tile<D, true>(a.w + size_t(b0) * B, lane, A);
    if (b0 + 1 < b1) load_tile<D, true>(a.w + size_t(b0 + 1) * B, lane, Bt);
    for (int k = 2; k < 2 + a.ahead; ++k) l2_ahead(b0 + k);
    prefetch_norm();
    griddep_wait();  // the activations (and this call's workspace) come after the kernel before
    stage_x();
    for (long long i = b0; i < b1; i += 2) {
      compute(A);
      finish(i);
      if (i + 2 < b1) load_tile<D, true>(a.w + size_t(i + 2) * B, lane, A);
      l2_ahead(i + 2 + a.ahead);
      if (i + 1 >= b1) break;
      compute(Bt);
      finish(i + 1);
      if (i + 3 < b1) load_tile<D, true>(a.w + size_t(i + 3) * B, lane, Bt);
      l2_ahead(i + 3 + a.ahead);
    }
  } else {
    prefetch_norm();
    griddep_wait();  // the activations (and this call's workspace) come after the kernel before
    stage_x();
    // Ring of RING tiles per warp: tile i computes while tiles i + 1 .. i + RING − 1 load. The
    // stage offsets and the next tile's address advance by B (no per-tile index arithmetic).
    const uint8_t* next = a.w + size_t(b0 + RING - 1) * B + 16 * lane;
    int cur = 0, fill = (RING - 1) * B;
    for (long long i = b0; i < b1; ++i) {
      __syncwarp();  // every lane is done reading the stage refilled now (tile i − 1's)
      if (i + RING - 1 < b1) issue_tile<B>(ring_s + fill, next, lane);
      cpa_commit();  // possibly empty: group k always holds tile b0 + k
      cpa_wait<RING - 1>();
      __syncwarp();  // the headers copied by other lanes are visible
      Raw<D> R;
      load_tile<D, false>(ring + cur, lane, R);
      compute(R);
      finish(i);
      next += B;
      fill = cur;  // the stage just read is the next to refill
      cur = cur == (RING - 1) * B ? 0 : cur + B;
    }
  }
  if constexpr (STAGED) {
    // The block's split row-tiles, each summed by one warp's lanes (entry e: token e / 16, row
    // e mod 16) in warp order (bitwise the same every run) from the pieces in shared memory. A
    // piece's slot comes from its warp's first row-tile as the warp stored it (wfirst): computed
    // here per warp and entry it took two 64-bit divisions each, a serial chain on every block's
    // tail (ncu, 35B-A3B out_proj, a row-tile over 16 warps: ~40% of the kernel's stall samples).
    __syncthreads();
    for (long long rr = q0 + wib; rr < q1; rr += wpb) {
      const long long ls = (rr - q0) * S;  // the row-tile's first tile in the block's nb
      const int v0 = warp_of(ls, nb, wpb), v1 = warp_of(ls + S - 1, nb, wpb);
      if (v0 == v1) continue;  // whole: written by finish
      size_t stride = 0;
      float* const o = out_of(a, int(rr), stride);
      for (int e = lane; e < 16 * ROWS; e += 32) {
        float sum = 0.0f;
        for (int v = v0; v <= v1; ++v) {
          const int slot = wfirst[v] == rr ? 0 : 1;  // rr is v's first row-tile, or its last
          sum += bpart[(v * 2 + slot) * 16 * ROWS + e];
        }
        o[size_t(e >> 4) * stride + (e & 15)] = sum;
      }
    }
  } else {
    arrive_all();
  }
}

template <DType D, int NT, int ROWS, int RING, bool XS>
__global__ void __launch_bounds__(max_threads(ROWS, XS), min_blocks(NT, ROWS, XS)) mma_kernel(const MmaArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  mma_block<D, NT, ROWS, RING, XS>(a, int(blockIdx.x), int(gridDim.x), smem);
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

// The launch shape of one GEMM over `total` tiles, and (for QWEN36_MMA_VERBOSE) the kernel's
// resources.
struct MmaPlan {
  int nwarps = 0, wpb = 0, grid = 0, bps = 0, regs = 0, local = 0;
  size_t smem = 0;
};

// A staged block's shared memory: the rows' staging, then per warp its ring / table and pieces.
template <DType D, int ROWS, int RING>
size_t staged_smem(int S, int wpb, bool norm) {
  return staged_bytes(S, ROWS, norm, RING == 0) + size_t(wpb) * (size_t(warp_smem<D, RING>()) + piece_bytes(ROWS));
}

template <DType D, int NT, int ROWS, int RING, bool XS = false>
MmaPlan plan_mma(long long total, int S, bool norm) {
  constexpr bool REGS = RING == 0;
  struct PerDev {
    int wpb = 0, bps = 0, regs = 0, local = 0;
  };
  static PerDev per_dev[64];
  static std::atomic<uint64_t> done{0};
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  PerDev& pd = per_dev[dev % 64];
  const DevInfo info = dev_info();
  auto* kern = mma_kernel<D, NT, ROWS, RING, XS>;
  once_per_device(done, [&] {
    if constexpr (XS) {
      // Blocks of up to kOneWarps (the copy of the activations takes most of an SM's shared memory:
      // one block each), as many warps per SM as the kernel without it.
      pd.wpb = kOneWarps;
      CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, info.smem_optin));
    } else if constexpr (REGS) {
      // Round 1's launch: blocks of kWarps, the (S, M) table the only shared memory, the
      // default carveout (the rest of the SM's memory stays L1, which holds x's fragments that
      // every warp of the SM re-reads).
      pd.wpb = kWarps;
    } else {
      // As many warps per block as the shared memory allows (sm_86 / sm_89: 7 for Q8_0).
      pd.wpb = std::clamp(info.smem_optin / warp_smem<D, RING>(), 1, kWarps);
      const int smem = pd.wpb * warp_smem<D, RING>();
      CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      // The rings want shared memory over L1.
      CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      int(cudaSharedmemCarveoutMaxShared)));
    }
    int bps = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, kern, pd.wpb * 32,
                                                             size_t(pd.wpb) * warp_smem<D, RING>()));
    pd.bps = std::max(bps, 1);
    // The staged kernels keep the activations in shared memory (sized by K and T): allow any size
    // up to the device's opt-in limit (quant_tiled_matmul takes the general kernel beyond it).
    if constexpr (ROWS > 0)
      CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, info.smem_optin));
    cudaFuncAttributes fa{};
    CUDA_CHECK(cudaFuncGetAttributes(&fa, kern));
    pd.regs = fa.numRegs;
    pd.local = int(fa.localSizeBytes);
  });
  MmaPlan p;
  if constexpr (ROWS > 0) {
    // Blocks of up to kOneWarps warps, as many as shared memory takes next to the staging; as
    // many blocks as are resident, none with fewer row-tiles than another but one.
    const size_t xs = staged_bytes(S, ROWS, norm, REGS);
    int wpb = kOneWarps;
    while (wpb > 1 && staged_smem<D, ROWS, RING>(S, wpb, norm) > size_t(info.smem_optin)) --wpb;
    static std::mutex mu;
    static std::map<std::tuple<int, size_t, int>, int> by_size;
    std::lock_guard<std::mutex> lock(mu);
    auto [it, fresh] = by_size.try_emplace({dev, xs, wpb}, 0);
    if (fresh) {
      CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&it->second, kern, wpb * 32,
                                                               staged_smem<D, ROWS, RING>(S, wpb, norm)));
      it->second = std::max(it->second, 1);
    }
    const long long rows = total / S;
    p.bps = it->second;
    p.grid = int(std::min<long long>(rows, (long long)info.sms * p.bps));
    // No more warps than the smallest block has tiles, where that leaves several.
    p.wpb = int(std::clamp<long long>(rows / p.grid * S, 1, wpb));
    p.nwarps = p.grid * p.wpb;
    p.smem = staged_smem<D, ROWS, RING>(S, p.wpb, norm);
    p.regs = pd.regs, p.local = pd.local;
    return p;
  }
  const int bps = XS ? 1 : pd.bps;
  // Persistent warps, every one resident; never more warps than tiles (a tile is the unit).
  p.nwarps = int(std::min<long long>(total, (long long)info.sms * bps * pd.wpb));
  // A matrix with fewer tiles than one full block per SM: smaller blocks, one per SM, so that
  // every SM's load path carries a share of the bytes (a 2048 × 512 Q4_K: 256 tiles, 2 warps on
  // each of 128 SMs rather than 8 on 32).
  // XS: one block per SM with the warps of the kernel without it (blocks of up to kWarps), so
  // that its sums are the same: blocks of kOneWarps where there are more than 8 warps per SM.
  // The same warps wherever the tiles fill 16 warps per SM or at most 8; between, XS rounds
  // their count down to a multiple of 16 (other splits of the row-tiles, other sums' order).
  p.wpb = std::clamp((p.nwarps + info.sms - 1) / info.sms, 1, XS ? kWarps : pd.wpb);
  // Whole blocks only (at most wpb − 1 warps fewer, each range still ≥ 1 tile).
  p.nwarps = p.nwarps / p.wpb * p.wpb;
  if (XS && p.nwarps > info.sms * p.wpb) p.wpb = kOneWarps, p.nwarps = p.nwarps / kOneWarps * kOneWarps;
  p.grid = p.nwarps / p.wpb;
  p.smem = size_t(p.wpb) * warp_smem<D, RING>() + (XS ? xs_bytes<D>(S, NT) : 0);
  p.bps = bps, p.regs = pd.regs, p.local = pd.local;
  return p;
}

// The variant switches, read from the environment once (a test may override them):
// QWEN36_MMA_LOADS = regs | smem (unset: per type and shape, use_regs).
enum : int { kAuto = 0, kRegs = 1, kSmem = 2, kFused = 1, kKernel = 2, kOff = 2 };
int parse_variant(const char* v, const char* a, const char* b) {
  if (v == nullptr || *v == 0 || std::strcmp(v, "auto") == 0) return kAuto;
  if (std::strcmp(v, a) == 0) return 1;
  if (std::strcmp(v, b) == 0) return 2;
  return kAuto;
}
std::atomic<int> g_loads{-1};  // −1: not read yet
int variant(std::atomic<int>& v, const char* env, const char* a, const char* b) {
  int x = v.load(std::memory_order_relaxed);
  if (x < 0) {
    x = parse_variant(std::getenv(env), a, b);
    v.store(x, std::memory_order_relaxed);
  }
  return x;
}
// Defaults from the H200 measurements: Q4_K and Q8_0 were faster with register prefetch (round
// 1), Q6_K with the shared-memory ring (round 2); at T = 1 with the split in blocks, Q4_K rows of
// S ≥ 16 super-blocks with the ring (27B Q4_K_M tg128 b1 151.1 → 154.1 t/s), shorter ones still
// with registers (the 35B-A3B's, K = 2048: 370.6 → 365.5 with the ring).
// The staged kernels (2 ≤ T ≤ 3 too) follow the one-token rule.
bool use_regs(DType t, bool staged, int S) {
  const int v = variant(g_loads, "QWEN36_MMA_LOADS", "regs", "smem");
  if (v != kAuto) return v == kRegs;
  return t == DType::Q8_0_T16 || ((nibble_tile(t) || t == DType::NVFP4_B64_T16) && !(staged && S >= 16));
}
// QWEN36_MMA_T1_QUANT = fused | kernel (unset: fused): at T = 1 (and in every staged kernel) each
// GEMM block quantizes the activation rows into its shared memory itself, or quantize_kernel
// does it once before the GEMM
// (one launch more per call; each block then copies 48 bytes per group instead of reading 128
// and quantizing). While quantize_row waited for its loads one at a time the launch was the
// cheaper (27B Q4_K_M tg b1 122.3 vs 120.1 t/s fused); with its loads batched fused is:
// 27B 136.3 / 136.6 → 136.6 / 137.2, 35B-A3B 313.1 / 312.9 → 320.5 / 321.0 (H200, one machine
// start, two rounds).
std::atomic<int> g_t1_quant{-1};
bool use_fused_t1() { return variant(g_t1_quant, "QWEN36_MMA_T1_QUANT", "fused", "kernel") != kKernel; }
// QWEN36_MMA_STAGED = on | off (unset: on): 2 ≤ T ≤ kMaxStagedRows take the staged kernels (the
// tokens' rows in shared memory, the split per block, tile_cols per token), or the multi-token
// kernel (grid split, B fragments and scales read through L1).
std::atomic<int> g_staged{-1};
bool use_staged() { return variant(g_staged, "QWEN36_MMA_STAGED", "on", "off") != kOff; }
// QWEN36_MMA_PAIR = on | off (unset: on): a staged call's two groups of two types (mma_pair_kernel)
// in one launch, or one launch each. g_pair_launches counts the pair launches (a test hook).
std::atomic<int> g_pair{-1};
bool use_pair() { return variant(g_pair, "QWEN36_MMA_PAIR", "on", "off") != kOff; }
std::atomic<long long> g_pair_launches{0};
// QWEN36_MMA_XS = on | off | auto (unset: auto): the multi-token kernel (T ≤ 16) with the call's
// activations copied into each block's shared memory (XS), or read through L1. auto: XS for
// 9-16 tokens on rows of ≥ 16 super-blocks. H200 (bench/RESULTS.md, session 29), XS everywhere
// against none: 27B Q4_K_M b16 1,292 → 1,330 t/s (+2.9%), b8 even, b4 −1.4%; 35B-A3B (K = 2048
// mostly) b4 −1.5%, b16 −2.0%.
std::atomic<int> g_xs{-1};
std::atomic<long long> g_xs_launches{0};  // XS launches so far (a test hook)
std::atomic<long long> g_norm_gemv_launches{0};  // mma_norm_gemv_kernel launches so far (a test hook)
constexpr int kXsMinS = 16;
// QWEN36_MMA_AHEAD = N (0-8, unset: 1): XS calls request each tile's bytes into L2 N tiles before
// its register load (MmaArgs::ahead). H200, 27B Q4_K_M tg64 b16, two rounds each: 0 1,316.6 /
// 1,316.1 t/s, 1 1,331.9 / 1,329.7, 2 1,325.6 / 1,327.4, 3 1,323.8 / 1,318.5, 4 1,310.6 / 1,311.1.
int xs_ahead() {
  static const int n = [] {
    const char* v = std::getenv("QWEN36_MMA_AHEAD");
    return v && *v ? std::clamp(std::atoi(v), 0, 8) : 1;
  }();
  return n;
}
// XS applies where the copy fits next to 16 warps' tables, and not where QWEN36_MMA_LOADS=smem
// asks for the shared-memory ring (which XS's copy leaves no room for).
bool xs_fits(DType t, int S, int NT) {
  const int v = variant(g_xs, "QWEN36_MMA_XS", "on", "off");
  if (NT > 2 || v == kOff || (v == kAuto && (NT != 2 || S < kXsMinS)) ||
      variant(g_loads, "QWEN36_MMA_LOADS", "regs", "smem") == kSmem)
    return false;
  size_t need = 0;
  with_tiled_dtype(t, [&](auto dt) {
    constexpr DType D = decltype(dt)::value;
    need = xs_bytes<D>(S, NT) + size_t(kOneWarps) * warp_smem<D, 0>();
  });
  return need > 0 && need <= size_t(dev_info().smem_optin);
}

// Calls f(D1, RING1, D2, RING2, ROWS) as compile-time constants for the pairs mma_pair_kernel
// is built for: a Q6_K group (its ring) and a Q4_K one (use_regs: registers for rows of fewer
// than 16 super-blocks, else the ring), the llama.cpp Q4_K_M mix's DeltaNet qkv / z, b, a and
// attention v / q, k, with 1 to kMaxStagedRows staged tokens. False for any other pair.
template <typename F>
bool with_pair(DType t1, bool regs1, DType t2, bool regs2, int rows, F&& f) {
  if (t1 != DType::Q6_K_T16 || regs1 || t2 != DType::Q4_K_T16 || rows < 1 || rows > kMaxStagedRows) return false;
  using Q6 = std::integral_constant<DType, DType::Q6_K_T16>;
  using Q4 = std::integral_constant<DType, DType::Q4_K_T16>;
  using Ring = std::integral_constant<int, kStages>;
  using Regs = std::integral_constant<int, 0>;
  static_assert(kMaxStagedRows == 3);
  auto go = [&](auto o) {
    if (regs2)
      f(Q6{}, Ring{}, Q4{}, Regs{}, o);
    else
      f(Q6{}, Ring{}, Q4{}, Ring{}, o);
  };
  if (rows == 1) go(std::integral_constant<int, 1>{});
  if (rows == 2) go(std::integral_constant<int, 2>{});
  if (rows == 3) go(std::integral_constant<int, 3>{});
  return true;
}

// The pair's launch: one block per SM (the staged kernels' occupancy), the first group's share
// of the blocks in proportion to its bytes, the warps per block as many as the fuller group's
// blocks have tiles (up to kOneWarps, as shared memory allows for both types). Returns the
// first group's blocks (p.grid the total), or 0 where the pair does not apply.
int plan_pair(MmaArgs& a1, DType t1, bool regs1, MmaArgs& a2, DType t2, bool regs2, int rows, bool norm,
              MmaPlan& p) {
  int grid1 = 0;
  with_pair(t1, regs1, t2, regs2, rows, [&](auto d1, auto r1, auto d2, auto r2, auto o) {
    constexpr DType D1 = decltype(d1)::value, D2 = decltype(d2)::value;
    constexpr int R1 = decltype(r1)::value, R2 = decltype(r2)::value, ROWS = decltype(o)::value;
    const DevInfo info = dev_info();
    const int S = a1.S, G = info.sms;
    const long long n1 = a1.total / S, n2 = a2.total / S;  // row-tiles
    const double b1 = double(a1.total) * TileLayout<D1>::kBytes, b2 = double(a2.total) * TileLayout<D2>::kBytes;
    if (G < 2 || n1 < 1 || n2 < 1) return;
    const int g1 = int(std::clamp<long long>(std::llround(G * b1 / (b1 + b2)), 1, std::min<long long>(n1, G - 1)));
    const int g2 = int(std::min<long long>(G - g1, n2));
    auto smem = [&](int w) {
      return std::max(staged_smem<D1, ROWS, R1>(S, w, norm), staged_smem<D2, ROWS, R2>(S, w, norm));
    };
    int wpb = int(std::clamp<long long>(std::max(n1 / g1, n2 / g2) * S, 1, kOneWarps));
    while (wpb > 1 && smem(wpb) > size_t(info.smem_optin)) --wpb;
    static std::atomic<uint64_t> done{0};
    once_per_device(done, [&] {
      CUDA_CHECK(cudaFuncSetAttribute(mma_pair_kernel<D1, R1, D2, R2, ROWS>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, info.smem_optin));
    });
    p.grid = g1 + g2, p.wpb = wpb, p.smem = smem(wpb), p.bps = 1;
    p.nwarps = p.grid * wpb;
    a1.nwarps = g1 * wpb, a2.nwarps = g2 * wpb;
    grid1 = g1;
  });
  return grid1;
}

// Calls f(type, NT, ROWS, RING) as compile-time constants for a tiled type, NT ∈ {1, 2, 4, 8},
// ROWS (the staged tokens, 0 or T ≤ kMaxStagedRows, only with NT = 1) and the load path (RING: 0
// registers, else the ring's depth). (A ring of 4 or 5 tiles measured slower than 3 for Q4_K at
// T = 1 on the H200: 27B Q4_K_M tg128 b1 154.1, 152.5, 141.5 t/s.)
// xs (NT ≤ 2, rows = 0): the multi-token kernel with the activations in shared memory (XS),
// always on registers.
template <typename F>
void with_mma(DType t, int NT, int rows, bool regs, bool xs, F&& f) {
  with_tiled_dtype(t, [&](auto dt) {
    using Off = std::false_type;
    auto go = [&](auto nt, auto o) {
      if constexpr (decltype(nt)::value <= 2 && decltype(o)::value == 0)
        if (xs) return f(dt, nt, o, std::integral_constant<int, 0>{}, std::true_type{});
      if (regs)
        f(dt, nt, o, std::integral_constant<int, 0>{}, Off{});
      else
        f(dt, nt, o, std::integral_constant<int, kStages>{}, Off{});
    };
    using NT1 = std::integral_constant<int, 1>;
    static_assert(kMaxStagedRows == 3);
    switch (NT) {
      case 1:
        switch (rows) {
          case 1: go(NT1{}, std::integral_constant<int, 1>{}); break;
          case 2: go(NT1{}, std::integral_constant<int, 2>{}); break;
          case 3: go(NT1{}, std::integral_constant<int, 3>{}); break;
          default: go(NT1{}, std::integral_constant<int, 0>{}); break;
        }
        break;
      case 2: go(std::integral_constant<int, 2>{}, std::integral_constant<int, 0>{}); break;
      case 4: go(std::integral_constant<int, 4>{}, std::integral_constant<int, 0>{}); break;
      default: go(std::integral_constant<int, 8>{}, std::integral_constant<int, 0>{}); break;
    }
  });
}

// QWEN36_MMA_VERBOSE=1: each (type, rows, K, T, variant) launched, once per process, to stderr.
void log_plan(DType t, int nmat, long long rows, long long K, long long T, int NT, bool regs, bool xs,
              const MmaPlan& p, long long total) {
  static const bool on = [] {
    const char* v = std::getenv("QWEN36_MMA_VERBOSE");
    return v != nullptr && *v != 0 && std::strcmp(v, "0") != 0;
  }();
  if (!on) return;
  static std::mutex mu;
  static std::set<std::string> seen;
  char key[160];
  std::snprintf(key, sizeof key, "%d %d %lld %lld %lld %d %d", int(t), nmat, rows, K, T, int(regs), int(xs));
  std::lock_guard<std::mutex> lock(mu);
  if (!seen.insert(key).second) return;
  const std::string name(dtype_name(t));
  std::fprintf(stderr,
               "[qwen36 mma] %s N=%lld (%d matrices) K=%lld T=%lld NT=%d: loads=%s | %d regs, %d B local, "
               "%d warps/block, %d blocks/SM (max), %d blocks, %d warps, %zu B smem/block, %lld tiles, %.2f "
               "tiles/warp\n",
               name.c_str(), rows, nmat, K, T, NT, xs ? "regs, x in smem" : regs ? "regs" : "smem",
               p.regs, p.local, p.wpb, p.bps, p.grid, p.nwarps, p.smem, total, double(total) / double(p.nwarps));
}

// ================================================================================================
// Host side
// ================================================================================================

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }


}  // namespace

namespace {

// T tokens fit the staged kernels: their rows in shared memory (with a NormIn also v and the
// group sums) next to up to 8 warps' rings (Q8_0: 3 × 4352 B each), tables and pieces; beyond the
// opt-in limit (K of several 10^5 at T = 1) the general kernel, dead columns and all.
bool staged_fits(int64_t K, int64_t T, bool norm) {
  return size_t(kWarps) * (kStages * 4352 + 16 * kTabStride * sizeof(float2) + piece_bytes(int(T))) +
             staged_bytes(K / 256, int(T), norm, true) <=
         size_t(dev_info().smem_optin);
}

// quant_tiled_matmul, and with norm quant_tiled_matmul_norm (one token; x is where the norm's
// output goes, the call's first launch writing it). False (nothing done) only with norm: when the
// norm's shared memory would change the grid or the warps per block from the same call without
// it, whose split of the row-tiles between warps (and so its sums' order) the form must keep.
// Calls f(D, RING) as compile-time constants for the one-token GEMMs that mma_norm_gemv_kernel is
// built for (Q4_K, Q6_K, Q8_0 on either load path); false for another type.
template <typename F>
bool with_norm_gemv(DType t, bool regs, F&& f) {
  auto go = [&](auto d) {
    if (regs)
      f(d, std::integral_constant<int, 0>{});
    else
      f(d, std::integral_constant<int, kStages>{});
    return true;
  };
  switch (t) {
    case DType::Q4_K_T16: return go(std::integral_constant<DType, DType::Q4_K_T16>{});
    case DType::Q6_K_T16: return go(std::integral_constant<DType, DType::Q6_K_T16>{});
    case DType::Q8_0_T16: return go(std::integral_constant<DType, DType::Q8_0_T16>{});
    default: return false;
  }
}

bool tiled_matmul(Ctx& c, const Tensor& x, std::span<const Tensor* const> ws, std::span<Tensor* const> outs,
                  const void* act, const NormIn* norm, const GemvRows* gemv = nullptr) {
  QWEN36_CHECK(!ws.empty() && ws.size() == outs.size(), "matmul: {} tiled weights for {} outputs", ws.size(), outs.size());
  const int64_t K = ws[0]->cols(), T = x.numel() / std::max<int64_t>(K, 1);
  QWEN36_CHECK(x.dtype == DType::F32 && x.cols() == K && aligned16(x.data), "matmul: activations must be f32 rows of {}", K);
  QWEN36_CHECK(T * K < (int64_t(1) << 31), "matmul: {} activations are too many", T * K);
  for (size_t i = 0; i < ws.size(); ++i) {
    const Tensor& w = *ws[i];
    QWEN36_CHECK(dtype_is_tiled(w.dtype) && w.cols() == K && w.rows() % 16 == 0 && K % 256 == 0 && aligned16(w.data),
                 "matmul: tiled weight {} {} does not fit x {}", dtype_name(w.dtype), w.shape_str(), x.shape_str());
    QWEN36_CHECK(outs[i]->dtype == DType::F32 && outs[i]->numel() == T * w.rows(), "matmul: x {} · w {} → out {}",
                 x.shape_str(), w.shape_str(), outs[i]->shape_str());
  }
  if (T == 0) return true;
  const float* xp = x.as<const float>();
  if (T > kTiledMaxT && !c.exact_matmul && quant_tiled_gemm(c, x, ws, outs)) return true;  // cuda_quant_gemm.cu
  if (T > kTiledMaxT || c.exact_matmul) {
    // x rounded to bf16 once for all the matrices (a DeltaNet layer's four)
    Temp<uint16_t> xh(c, !c.exact_matmul && ws.size() > 1 ? size_t(T * K) : 0);
    if (xh.get()) round_activations(c, xp, xh.get(), T * K, true);
    for (size_t i = 0; i < ws.size(); ++i)
      quant_tiled_dequant_gemm(c, *ws[i], xp, outs[i]->as<float>(), int(T), int(ws[i]->rows()), int(K), xh.get());
    return true;
  }
  const int NT = act_n_tiles(T);
  const bool one = T == 1 && staged_fits(K, 1, norm != nullptr);
  // The tokens staged in shared memory (mma_kernel's ROWS; 0: the multi-token kernel).
  int rows = one                                                                                ? 1
             : T <= kMaxStagedRows && (T <= kColsRows || K / 256 >= kPairsMinS) && use_staged() &&
                     staged_fits(K, T, norm != nullptr)
                 ? int(T)
                                                                                                : 0;
  if (norm && rows == 0) return false;  // the norm is computed by the staged kernels only
  // Matrices stored back to back with one type (prepare_weights and the synthetic generator
  // place a layer's projections so) are one stacked tiled matrix: one launch for up to 4.
  struct Group {
    MmaArgs a{};
    MmaPlan p;
    DType t = DType::F32;
    bool regs = true, xs = false;  // xs: the multi-token kernel with the activations in shared memory
  };
  std::vector<Group> groups;
  int max_warps = 1;
  // tile_pairs' rows take shared memory from the warps' rings: where that leaves a block fewer
  // warps than one token's (a Q6_K down projection's K = 17408 at 3 tokens: 14 of 16), the
  // call takes the multi-token kernel, which keeps 16 warps per SM (H200: ≈ even at 4 tokens
  // with the fewer warps, bench/RESULTS.md session 27).
  bool narrower = false;
  auto plan_groups = [&]() -> bool {
    groups.clear();
    max_warps = 1;
    for (size_t i = 0; i < ws.size();) {
      size_t e = i + 1;
      while (e < ws.size() && e - i < size_t(kMaxMats) && ws[e]->dtype == ws[i]->dtype &&
             static_cast<const uint8_t*>(ws[e - 1]->data) + ws[e - 1]->nbytes() == ws[e]->data)
        ++e;
      Group gr;
      MmaArgs& a = gr.a;
      a.w = static_cast<const uint8_t*>(ws[i]->data);
      a.S = int(K / 256);
      a.T = int(T);
      a.nmat = int(e - i);
      int rt = 0;
      for (int m = 0; m < kMaxMats; ++m) {
        const size_t mm = i + size_t(std::min(m, a.nmat - 1));
        if (m < a.nmat) rt += int(ws[mm]->rows() / 16);
        a.out[m] = outs[mm]->as<float>();
        a.rt_end[m] = rt;
        a.n[m] = int(ws[mm]->rows());
      }
      a.total = (long long)rt * a.S;
      gr.t = ws[i]->dtype;
      gr.xs = rows == 0 && xs_fits(gr.t, a.S, NT);
      gr.regs = gr.xs || use_regs(gr.t, rows > 0, a.S);
      bool same_split = true;
      with_mma(gr.t, NT, rows, gr.regs, gr.xs, [&](auto dt, auto nt, auto o, auto rg, auto x) {
        auto plan = plan_mma<decltype(dt)::value, decltype(nt)::value, decltype(o)::value, decltype(rg)::value,
                             decltype(x)::value>;
        gr.p = plan(a.total, a.S, norm != nullptr);
        if (norm) {
          const MmaPlan q = plan(a.total, a.S, false);
          same_split = gr.p.nwarps == q.nwarps && gr.p.grid == q.grid;
        }
      });
      if (!same_split) return false;
      if (rows > kColsRows)
        with_mma(gr.t, NT, 1, gr.regs, false, [&](auto dt, auto nt, auto o, auto rg, auto) {
          const MmaPlan q =
              plan_mma<decltype(dt)::value, decltype(nt)::value, decltype(o)::value, decltype(rg)::value>(a.total, a.S,
                                                                                                          false);
          narrower = narrower || gr.p.nwarps < q.nwarps;
        });
      a.nwarps = gr.p.nwarps;
      max_warps = std::max(max_warps, a.nwarps);
      groups.push_back(gr);
      i = e;
    }
    return true;
  };
  if (!plan_groups()) return false;
  if (narrower) {
    if (norm) return false;
    rows = 0;
    plan_groups();
  }
  // A staged call's two groups of two types (the Q6_K one first): one launch (mma_pair_kernel).
  MmaPlan pair;
  int pair_grid1 = 0;
  if (rows >= 1 && groups.size() == 2 && groups[0].t != groups[1].t && use_pair()) {
    const size_t q6 = groups[1].t == DType::Q6_K_T16 ? 1 : 0;
    Group &g1 = groups[q6], &g2 = groups[1 - q6];
    pair_grid1 = plan_pair(g1.a, g1.t, g1.regs, g2.a, g2.t, g2.regs, rows, norm != nullptr, pair);
    if (pair_grid1 > 0 && q6 == 1) std::swap(groups[0], groups[1]);  // without a pair, the call's order stays
  }
  // f32 projections of the same x (quant_tiled_matmul_norm_gemv): blocks of their own beside the
  // GEMM's, on SMs it leaves idle (the 35B-A3B's shared gate / up: 64 row-tiles, 64 blocks).
  int gemv_blocks = 0;
  size_t gemv_smem = 0;
  if (gemv) {
    if (rows != 1 || !norm || groups.size() != 1) return false;
    const Group& gr = groups[0];
    const int R = gemv->r_end[gemv->nmat - 1];
    gemv_blocks = std::min(dev_info().sms - gr.p.grid, (R + gr.p.wpb - 1) / gr.p.wpb);
    gemv_smem = std::max(gr.p.smem, norm_gemv_bytes(gr.a.S));
    if (gemv_blocks < 1 || gemv_smem > size_t(dev_info().smem_optin) || !with_norm_gemv(gr.t, gr.regs, [](auto, auto) {}))
      return false;
  }
  for (const Group& gr : groups)
    log_plan(gr.t, gr.a.nmat, (long long)gr.a.rt_end[gr.a.nmat - 1] * 16, K, T, NT, gr.regs, gr.xs,
             pair.grid > 0 ? pair : gr.p, gr.a.total);
  // One workspace: the activations once for every matrix (none when the staged kernels quantize
  // in the GEMM or the kernel before quantized them: act) and, for the multi-token kernel, the
  // split row-tiles' pieces and the arrival counters (shared by the groups: each launch runs
  // after the one before; the staged kernels sum their split row-tiles inside their blocks). The
  // scratch stack's counters are zero already and left so; a workspace's own are cleared by
  // quantize_kernel, or with act by a memset.
  const bool staged = rows > 0;
  int* const counters =
      !staged && c.scratch && max_warps <= ScratchStack::kCounters ? c.scratch->counters() : nullptr;
  const bool own_cnt = !staged && !counters;
  const bool fused = !act && !norm && staged && use_fused_t1();
  const ActLayout L(T, K);
  auto up = [](size_t b) { return (b + 255) / 256 * 256; };
  const size_t o_part = fused || act || norm ? 0 : L.bytes;
  const size_t o_cnt = o_part + (staged ? 0 : up(size_t(max_warps) * 2 * size_t(T) * 16 * sizeof(float)));
  Temp<uint8_t> ws_mem(c, o_cnt + (own_cnt ? up(size_t(max_warps) * sizeof(int)) : 0));
  uint8_t* const base = ws_mem.get();
  const uint8_t* const xq = act ? static_cast<const uint8_t*>(act) : base;
  int* const cnt = own_cnt ? reinterpret_cast<int*>(base + o_cnt) : counters;
  if (!fused && !act && !norm)
    launch_quantize<false>(c, xp, nullptr, int(T), int(K), base, cnt, own_cnt ? max_warps : 0);
  else if (own_cnt)
    CUDA_CHECK(cudaMemsetAsync(cnt, 0, size_t(max_warps) * sizeof(int), c.stream));
  for (Group& gr : groups) {
    gr.a.x = fused ? xp : nullptr;
    if (norm) {  // the first group writes y_out and x
      gr.a.norm = *norm;
      if (&gr != &groups.front()) gr.a.norm.y_out = gr.a.norm.x = nullptr;
    }
    gr.a.xb = reinterpret_cast<const uint2*>(xq + L.o_xb);
    gr.a.xf = reinterpret_cast<const float4*>(xq + L.o_xf);
    gr.a.xi = reinterpret_cast<const int4*>(xq + L.o_xi);
    gr.a.part = reinterpret_cast<float*>(base + o_part);
    gr.a.cnt = cnt;
    gr.a.ahead = gr.xs ? xs_ahead() : 0;
  }
  if (gemv_blocks > 0) {
    g_norm_gemv_launches.fetch_add(1, std::memory_order_relaxed);
    const Group& gr = groups[0];
    with_norm_gemv(gr.t, gr.regs, [&](auto dt, auto rg) {
      auto* kern = mma_norm_gemv_kernel<decltype(dt)::value, decltype(rg)::value>;
      static std::atomic<uint64_t> done{0};
      once_per_device(done, [&] {
        CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, dev_info().smem_optin));
      });
      launch_pdl(kern, dim3(unsigned(gr.p.grid + gemv_blocks)), dim3(unsigned(gr.p.wpb * 32)), gemv_smem, c.stream, gr.a,
                 *gemv, gr.p.grid);
    });
    return true;
  }
  if (pair.grid > 0) {
    with_pair(groups[0].t, groups[0].regs, groups[1].t, groups[1].regs, rows,
              [&](auto d1, auto r1, auto d2, auto r2, auto o) {
                launch_pdl(mma_pair_kernel<decltype(d1)::value, decltype(r1)::value, decltype(d2)::value,
                                           decltype(r2)::value, decltype(o)::value>,
                           dim3(unsigned(pair.grid)), dim3(unsigned(pair.wpb * 32)), pair.smem, c.stream, groups[0].a,
                           groups[1].a, pair_grid1);
              });
    g_pair_launches.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  for (const Group& gr : groups) {
    if (gr.xs) g_xs_launches.fetch_add(1, std::memory_order_relaxed);
    with_mma(gr.t, NT, rows, gr.regs, gr.xs, [&](auto dt, auto nt, auto o, auto rg, auto x) {
      launch_pdl(mma_kernel<decltype(dt)::value, decltype(nt)::value, decltype(o)::value, decltype(rg)::value,
                            decltype(x)::value>,
                 dim3(unsigned(gr.p.grid)), dim3(unsigned(gr.p.wpb * 32)), gr.p.smem, c.stream, gr.a);
    });
  }
  return true;
}

}  // namespace

void quant_tiled_matmul(Ctx& c, const Tensor& x, std::span<const Tensor* const> ws, std::span<Tensor* const> outs,
                        const void* act) {
  tiled_matmul(c, x, ws, outs, act, nullptr);
}

bool quant_tiled_matmul_norm(Ctx& c, const NormIn& norm, const Tensor& x, std::span<const Tensor* const> ws,
                             std::span<Tensor* const> outs) {
  const int64_t K = x.cols();
  if (c.exact_matmul || ws.empty() || x.rows() < 1 || x.rows() > kMaxStagedRows || x.dtype != DType::F32 ||
      K % 256 != 0 || !staged_fits(K, x.rows(), true) || !aligned16(norm.y) || !aligned16(norm.delta) ||
      !aligned16(norm.w) || !aligned16(norm.y_out) || !aligned16(norm.x))
    return false;
  return tiled_matmul(c, x, ws, outs, nullptr, &norm);
}

bool quant_tiled_matmul_norm_gemv(Ctx& c, const NormIn& norm, const Tensor& x, std::span<const Tensor* const> ws,
                                  std::span<Tensor* const> outs, std::span<const Tensor* const> fws,
                                  std::span<Tensor* const> fouts) {
  const int64_t K = x.cols();
  if (fws.empty() || fws.size() > size_t(kMaxMats) || fws.size() != fouts.size() || x.rows() != 1) return false;
  GemvRows g{};
  int64_t rows = 0;
  for (size_t m = 0; m < size_t(kMaxMats); ++m) {
    const size_t i = std::min(m, fws.size() - 1);
    const Tensor& w = *fws[i];
    Tensor& o = *fouts[i];
    if (w.dtype != DType::F32 || w.cols() != K || !aligned16(w.data) || o.dtype != DType::F32 || o.numel() != w.rows())
      return false;
    if (m < fws.size()) rows += w.rows();
    g.w[m] = w.as<const float>(), g.out[m] = o.as<float>(), g.r_end[m] = int(rows);
  }
  g.nmat = int(fws.size());
  if (rows < 1 || rows > (int64_t(1) << 20) || c.exact_matmul || K % 256 != 0 || !staged_fits(K, 1, true) ||
      !aligned16(norm.y) || !aligned16(norm.delta) || !aligned16(norm.w) || !aligned16(norm.y_out) ||
      !aligned16(norm.x))
    return false;
  return tiled_matmul(c, x, ws, outs, nullptr, &norm, &g);
}

size_t quant_act_bytes(int64_t T, int64_t K) { return ActLayout(T, K).bytes; }

void quantize_act(Ctx& c, const float* x, const float* up, int64_t T, int64_t K, void* act) {
  QWEN36_CHECK(T >= 1 && T <= kTiledMaxT && K % 32 == 0, "quantize_act: {} tokens of width {}", T, K);
  if (up)
    launch_quantize<true>(c, x, up, int(T), int(K), static_cast<uint8_t*>(act), nullptr, 0);
  else
    launch_quantize<false>(c, x, nullptr, int(T), int(K), static_cast<uint8_t*>(act), nullptr, 0);
}

// Test hook (declared by the tests, not in cuda_ops.cuh): the variant as QWEN36_MMA_LOADS /
// QWEN36_MMA_T1_QUANT would select it ("regs" | "smem" | "auto", "fused" | "kernel" | "auto");
// nullptr reads the environment again.
void mma_select_variant(const char* loads, const char* t1_quant) {
  g_loads.store(loads ? parse_variant(loads, "regs", "smem") : -1);
  g_t1_quant.store(t1_quant ? parse_variant(t1_quant, "fused", "kernel") : -1);
}
// The same for QWEN36_MMA_STAGED ("on" | "off" | "auto").
void mma_select_staged(const char* staged) { g_staged.store(staged ? parse_variant(staged, "on", "off") : -1); }
// The same for QWEN36_MMA_PAIR, and the count of pair launches so far.
void mma_select_pair(const char* pair) { g_pair.store(pair ? parse_variant(pair, "on", "off") : -1); }
long long mma_pair_launches() { return g_pair_launches.load(); }
// The same for QWEN36_MMA_XS, and the XS launches made so far.
void mma_select_xs(const char* xs) { g_xs.store(xs ? parse_variant(xs, "on", "off") : -1); }
long long mma_xs_launches() { return g_xs_launches.load(); }
// The launches of a one-token norm GEMM with f32 projections beside it so far.
long long mma_norm_gemv_launches() { return g_norm_gemv_launches.load(); }

}  // namespace qwen36::cuda
