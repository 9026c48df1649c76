// out[T, N] = x[T, K] · w[N, K]ᵀ on int8 tensor cores for Q4_K, Q6_K, Q8_0, W4_G128 / W4_G32
// (AWQ / GPTQ / compressed-tensors int4) and NVFP4 weights stored in the device's tiled layout
// (DTypes *_T16), T ≤ 64, and the dispatch of every tiled matmul (T > 64 and exact_matmul: the
// dequantized slices of cuda_quant_tile_layout.cu, which also repacks GGUF / HF matrices into
// the layout; the routed experts' decode on the same tiles: cuda_quant_moe_mma.cu).
// The register side shared with that file (mma wrappers, tile registers, A fragments, the int8
// activation quantizer) is cuda_quant_mma_frags.cuh; the staged kernels' per-tile computation
// (tile_cols, tile_pairs) is cuda_quant_staged_tiles.cuh; the GEMM's device side (the one-token
// norm and staging, mma_block and the kernels that run it) is cuda_quant_mma_kernels.cuh, and
// this file keeps the activations' quantizer and the host side (plans, dispatch, launches).
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
//    already requested) and the loop reads them there; blocks of 16 warps, one per SM
//    (QWEN36_MMA_XS=off: through L1, whose hit rate was 60% on a 27B gate + up at 16 tokens and 32%
//    on a down projection). Where every block gets a row-tile the tiles split per block as at
//    T ≤ 3 (whole row-tiles a block, its split row-tiles summed in shared memory: no workspace
//    tail; QWEN36_MMA_XS_SPLIT=grid: the grid split, the same warps and ranges as without XS). Its
//    lanes also request each tile's lines into L2 one tile before its register load
//    (QWEN36_MMA_AHEAD).
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
//  - 17-64 tokens, Q4_K and Q6_K (QWEN36_MMA_HB, hb_form): the bf16 form (cuda_quant_mma_half.cuh),
//    the tiles dequantized to bf16 in registers against x rounded to bf16 (ActLayout::o_xh, written
//    beside the int8 codes by the same producers), bf16 MMAs accumulating in f32 along the row: no
//    per-group epilogue, so each n8 tile of tokens costs two MMAs and a 16-byte load. Same grid,
//    split and sums as the int8 form. Its numerics are the prefill GEMMs' (bf16 x and weights, f32
//    sums), not the int8 twin's: a 17-64-token verify pass or batch differs from one-token decode
//    by those roundings (1e-4 of its bf16 twin; test_cuda_quant_mma_half.cpp).
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
#include "backend/cuda/cuda_quant_mma_kernels.cuh"
#include "backend/cuda/cuda_quant_staged_tiles.cuh"
#include "backend/cuda/cuda_quant_wgmma.cuh"

namespace qwen36::cuda {

namespace {


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
                                uint4* __restrict__ xh, int np, int* __restrict__ cnt, int ncnt) {
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
    if (xh) store_act_half(xh, NT, np, c, j, u, v);  // beyond 16 tokens (ActLayout::o_xh)
  }
}

template <bool kSwiglu>
void launch_quantize(Ctx& c, const float* x, const float* up, int T, int K, uint8_t* act, int* cnt, int ncnt) {
  const ActLayout L(T, K);
  const long long qthreads = (long long)L.NT * 8 * (long long)L.G * 8;
  const int qblocks = int(std::min<long long>((qthreads + 255) / 256, (long long)dev_info().sms * 8));
  launch_pdl(quantize_kernel<kSwiglu>, dim3(unsigned(qblocks)), dim3(256), 0, c.stream, x, up, T, K, L.NT, act + L.o_xb,
             reinterpret_cast<float*>(act + L.o_xf), reinterpret_cast<int*>(act + L.o_xi),
             L.o_xh ? reinterpret_cast<uint4*>(act + L.o_xh) : nullptr, L.np, cnt, ncnt);
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

// The variant switches' values by name (parse_variant / variant, cuda_ops.cuh).
enum : int {
  kAuto = kAutoForm,
  kRegs = kFirstForm, kSmem = kSecondForm,
  kFused = kFirstForm, kKernel = kSecondForm,
  kOn = kFirstForm, kOff = kSecondForm,
  kMax = kSecondForm
};
// QWEN36_MMA_CARVEOUT = fit | max (unset: fit): the multi-token ring kernels' shared-memory
// carveout, what their blocks need (the rest L1) or the maximum (plan_mma).
std::atomic<int> g_carveout{-1};
bool carveout_fit() { return variant(g_carveout, "QWEN36_MMA_CARVEOUT", "fit", "max") != kMax; }

template <DType D, int NT, int ROWS, int RING, bool XS = false, int HB = 0>
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
  auto* kern = mma_kernel<D, NT, ROWS, RING, XS, HB>;
  constexpr int kWarpSmem = warp_smem<D, RING, (HB > 0), HB == 3>();
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
      pd.wpb = std::clamp(info.smem_optin / kWarpSmem, 1, kWarps);
      const int smem = pd.wpb * kWarpSmem;
      CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      // The rings want shared memory over L1.
      CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      int(cudaSharedmemCarveoutMaxShared)));
    }
    int bps = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, kern, pd.wpb * 32,
                                                             size_t(pd.wpb) * kWarpSmem));
    pd.bps = std::max(bps, 1);
    // The multi-token rings: only the shared memory their resident blocks use, the rest L1, where
    // the activations' fragments are re-read by the SM's warps (QWEN36_MMA_CARVEOUT=max: the
    // maximum, as the staged kernels). ncu, H100, 24 tokens: the Q6_K down projection's L1 hit
    // rate was 0.4% (int8 form 11%) with 28 KB of L1 left beside the rings, its fragments read
    // from L2 at 5.4 TB/s; fitted, the bf16 form of a 64-token 17408 × 5120 Q6_K GEMM took 62.7
    // µs, not 99.1 (bench/RESULTS.md, session 53). (The register kernels keep the driver's
    // choice: their blocks use a few KB of shared memory; not measured fitted.)
    if constexpr (!REGS && ROWS == 0 && !XS)
      if (carveout_fit()) {
        const long long need = (long long)pd.bps * (pd.wpb * kWarpSmem + 1024);  // + the block's reserved 1 KB
        const int per_sm = std::max(info.smem_per_sm, 1);
        const int pct = int(std::clamp<long long>((need * 100 + per_sm - 1) / per_sm, 1, 100));
        CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout, pct));
      }
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
  p.smem = size_t(p.wpb) * kWarpSmem + (XS ? xs_bytes<D>(S, NT) : 0);
  p.bps = bps, p.regs = pd.regs, p.local = pd.local;
  return p;
}

// The variant switches, read from the environment once (a test may override them):
// QWEN36_MMA_LOADS = regs | smem (unset: per type and shape, use_regs).
std::atomic<int> g_loads{-1};  // −1: not read yet
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
// QWEN36_MMA_HB = on | off (unset: on): Q4_K and Q6_K tiles at 17-64 tokens in the bf16 form
// (cuda_quant_mma_half.cuh: no per-group epilogue), or the int8 one. g_hb_launches counts the
// bf16 form's launches (a test hook).
std::atomic<int> g_hb{-1};
std::atomic<long long> g_hb_launches{0};
// QWEN36_MMA_HB_BLOCKS = 1 | 2 (unset: per type, hb_form): the bf16 form at 17-32 tokens in one
// block of 8 warps per SM (≤ 255 registers) or two (≤ 128, a few spills).
std::atomic<int> g_hb_blocks{-1};
// The form of a multi-token call's group (with_mma's hb): 0 int8, 1-2 the bf16 form's blocks per
// SM, 3 the bf16 form on pairs of row-tiles sharing each B fragment load (mma_block's PAIR: half
// the fragments' L2 traffic that bounds these GEMMs). H100 (bench/RESULTS.md, sessions 53-54;
// cold L2, µs int8 / bf16 one block / two / pairs): at 17-32 tokens every 27B shape gains or
// ties with Q4_K on two blocks (17408 × 5120 at 24 tokens 41.4 / 39.2 / 35.6 / 42.5) and Q6_K on
// one (54.1 / 43.8 / 46.0 / 51.3); at 33-64 tokens rows of ≥ 32 super-blocks take pairs (5120 ×
// 17408 at 40 tokens: Q4_K int8 84.8, pairs 71.6; Q6_K 116.1 / 94.0 / – / 77.6), the others one
// block (Q6_K 17408 × 5120: 117.1 / 61.5 / – / 65.3; pairs lose there at 17-32 tokens).
// In the model at 33-64 tokens the H200 measured otherwise (session 55, tg32, every 27B and
// 35B-A3B group on pairs against the rule then, S >= 32): 27B Q4_K_M b40 / 48 / 64 1,513.6 /
// 1,742.0 / 2,163.6 -> 1,613.9 / 1,859.3 / 2,304.0 (+6.6%), 35B-A3B b48 / 64 3,429.7 / 4,109.1 ->
// 3,207.4 / 3,837.1 (-6.5%); the rule then against none: -0.2 to -0.5%. Pairs halve a group's
// units of work; the 27B's matrices keep >= 3,840 units of two row-tiles, the 35B-A3B's (K = 2048
// and 4096) <= 2,048. So past 32 tokens pairs run where a group keeps kPairMinUnits of them.
// QWEN36_MMA_HB_PAIRS = on | off (unset: as above): pairs wherever the bf16 form runs, or never.
// Pairs need the group's row-tiles (rt) to pair up; an odd count takes the single-tile rule.
std::atomic<int> g_hb_pairs{-1};
constexpr long long kPairMinUnits = 3072;
int hb_form(DType t, int S, int NT, int rt) {
  if (NT < 4 || !half_tile(t) || variant(g_hb, "QWEN36_MMA_HB", "on", "off") == kOff) return 0;
  const int pairs = rt % 2 == 0 ? variant(g_hb_pairs, "QWEN36_MMA_HB_PAIRS", "on", "off") : kOff;
  if (pairs == kOn || (pairs == kAuto && NT > 4 && (long long)(rt / 2) * S >= kPairMinUnits)) return 3;
  if (NT > 4) return t == DType::Q4_K_T16 && S >= 32 ? 0 : 1;
  const int blocks = variant(g_hb_blocks, "QWEN36_MMA_HB_BLOCKS", "1", "2");  // 0: unset
  return blocks ? blocks : t == DType::Q4_K_T16 ? 2 : 1;
}
// QWEN36_MMA_PAIR = on | off (unset: on): a staged call's two groups of two types (mma_pair_kernel)
// in one launch, or one launch each. g_pair_launches counts the pair launches (a test hook).
std::atomic<int> g_pair{-1};
bool use_pair() { return variant(g_pair, "QWEN36_MMA_PAIR", "on", "off") != kOff; }
std::atomic<long long> g_pair_launches{0};
// QWEN36_MMA_XS = on | off | auto (unset: auto): the multi-token kernel (T ≤ 16) with the call's
// activations copied into each block's shared memory (XS), or read through L1. auto: XS for
// 9-16 tokens on rows of ≥ 16 super-blocks. H200 (bench/RESULTS.md, session 29), XS everywhere
// against none: 27B Q4_K_M b16 1,292 → 1,330 t/s (+2.9%), b8 even, b4 −1.4%; 35B-A3B (K = 2048
// mostly) b4 −1.5%, b16 −2.0%. With the block split (below), session 45: at 4-8 tokens the H100
// gained (27B b4 431.4 → 439.8, b8 801.7 → 821.8) but the H200 did not (b4 502.7 → 497.4, b8
// 943.1 → 940.0; b9 851.3 → 888.7), so auto stays at 9-16.
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
// QWEN36_MMA_XS_SPLIT = block | grid (unset: block): an XS call with a row-tile per block splits
// its tiles per block (MmaArgs::block_split: whole row-tiles a block, as the staged
// kernels; a row-tile split between warps summed in shared memory after a block barrier) or over
// the grid (perfectly balanced tiles, but every warp's tail a workspace store, a fenced atomic and
// the last arriver's L2 reads). H100, session 45, grid → block, rounds alternating: 27B Q4_K_M
// tg64 b16 1,282.5 → 1,318.5 t/s (+2.8%), b9 774.1 → 802.9 (+3.7%).
std::atomic<int> g_xs_split{-1};
std::atomic<long long> g_xs_split_launches{0};  // block-split XS launches so far (a test hook)
bool use_xs_block_split() { return variant(g_xs_split, "QWEN36_MMA_XS_SPLIT", "block", "grid") != kOff; }
// The block split's shared memory beyond XS's: two piece slots of 8·NT tokens and the first
// row-tile, per warp.
size_t xs_split_bytes(int wpb, int NT) { return size_t(wpb) * piece_bytes(8 * NT); }
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

// Calls f(type, NT, ROWS, RING, XS, HB) as compile-time constants for a tiled type, NT ∈ {1, 2,
// 4, 8}, ROWS (the staged tokens, 0 or T ≤ kMaxStagedRows, only with NT = 1) and the load path
// (RING: 0 registers, else the ring's depth). (A ring of 4 or 5 tiles measured slower than 3 for
// Q4_K at T = 1 on the H200: 27B Q4_K_M tg128 b1 154.1, 152.5, 141.5 t/s.)
// xs (NT ≤ 2, rows = 0): the multi-token kernel with the activations in shared memory (XS),
// always on registers. hb (NT ≥ 4, rows = 0, half_tile): the bf16 form, HB = 1 or (NT = 4, hb =
// 2) 2: its blocks per SM, 3: on pairs of row-tiles (mma_kernel).
template <int V>
using Int = std::integral_constant<int, V>;
template <typename F>
void with_mma(DType t, int NT, int rows, bool regs, bool xs, int hb, F&& f) {
  with_tiled_dtype(t, [&](auto dt) {
    using Off = std::false_type;
    using On = std::true_type;
    auto go = [&](auto nt, auto o) {
      constexpr int kNT = decltype(nt)::value, kRows = decltype(o)::value;
      auto on_path = [&](auto h) {  // the load path regs picks, without XS, HB = h
        if (regs) return f(dt, nt, o, Int<0>{}, Off{}, h);
        return f(dt, nt, o, Int<kStages>{}, Off{}, h);
      };
      if constexpr (kNT <= 2 && kRows == 0)
        if (xs) return f(dt, nt, o, Int<0>{}, On{}, Int<0>{});
      if constexpr (kNT >= 4 && kRows == 0 && half_tile(std::remove_cvref_t<decltype(dt)>::value)) {
        if constexpr (kNT == 4)
          if (hb == 2) return on_path(Int<2>{});
        if (hb == 3) return on_path(Int<3>{});
        if (hb > 0) return on_path(Int<1>{});
      }
      on_path(Int<0>{});
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
void log_plan(DType t, int nmat, long long rows, long long K, long long T, int NT, bool regs, bool xs, int hb,
              const MmaPlan& p, long long total) {
  static const bool on = [] {
    const char* v = std::getenv("QWEN36_MMA_VERBOSE");
    return v != nullptr && *v != 0 && std::strcmp(v, "0") != 0;
  }();
  if (!on) return;
  static std::mutex mu;
  static std::set<std::string> seen;
  char key[160];
  std::snprintf(key, sizeof key, "%d %d %lld %lld %lld %d %d %d", int(t), nmat, rows, K, T, int(regs), int(xs), int(hb));
  std::lock_guard<std::mutex> lock(mu);
  if (!seen.insert(key).second) return;
  const std::string name(dtype_name(t));
  std::fprintf(stderr,
               "[qwen36 mma] %s N=%lld (%d matrices) K=%lld T=%lld NT=%d: loads=%s%s | %d regs, %d B local, "
               "%d warps/block, %d blocks/SM (max), %d blocks, %d warps, %zu B smem/block, %lld units, %.2f "
               "units/warp\n",
               name.c_str(), rows, nmat, K, T, NT, xs ? "regs, x in smem" : regs ? "regs" : "smem",
               hb == 4 ? ", warpgroup" : hb == 3 ? ", bf16 pairs" : hb ? ", bf16" : "",
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
  // Where the activations' bf16 copy is the warpgroup form's slabs (L.np > 0: 17-64 tokens,
  // QWEN36_MMA_WG), every Q4_K / Q6_K group takes that form (cuda_quant_wgmma.cu).
  const ActLayout L(T, K);
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
    int hb = 0;                    // the bf16 form (17-64 tokens, Q4_K / Q6_K): with_mma's hb
    bool wg = false;               // the warpgroup form (its launch: wa)
    WgArgs wa;
  };
  std::vector<Group> groups;
  int max_warps = 1, max_cnt = 1;  // warps of a multi-token launch; arrival counters of any launch
  size_t wg_part = 0;              // the warpgroup launches' pieces (floats)
  // tile_pairs' rows take shared memory from the warps' rings: where that leaves a block fewer
  // warps than one token's (a Q6_K down projection's K = 17408 at 3 tokens: 14 of 16), the
  // call takes the multi-token kernel, which keeps 16 warps per SM (H200: ≈ even at 4 tokens
  // with the fewer warps, bench/RESULTS.md session 27).
  bool narrower = false;
  auto plan_groups = [&]() -> bool {
    groups.clear();
    max_warps = max_cnt = 1;
    wg_part = 0;
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
      if (L.np > 0 && rows == 0 && half_tile(gr.t)) {
        WgArgs& w = gr.wa;
        w.w = a.w, w.nmat = a.nmat, w.rt = rt, w.S = a.S, w.T = a.T, w.np = L.np;
        for (int m = 0; m < kMaxMats; ++m) w.out[m] = a.out[m], w.rt_end[m] = a.rt_end[m], w.n[m] = a.n[m];
        w.splits = wg_splits(rt, a.S, a.T);
        gr.wg = true;
        max_cnt = std::max(max_cnt, wg_counters(w));
        wg_part = std::max(wg_part, wg_part_floats(w));
        groups.push_back(gr);
        i = e;
        continue;
      }
      gr.xs = rows == 0 && xs_fits(gr.t, a.S, NT);
      gr.regs = gr.xs || use_regs(gr.t, rows > 0, a.S);
      gr.hb = rows == 0 ? hb_form(gr.t, a.S, NT, rt) : 0;
      if (gr.hb == 3) a.total = (long long)(rt / 2) * a.S;  // units of two row-tiles
      bool same_split = true;
      with_mma(gr.t, NT, rows, gr.regs, gr.xs, gr.hb, [&](auto dt, auto nt, auto o, auto rg, auto x, auto h) {
        auto plan = plan_mma<decltype(dt)::value, decltype(nt)::value, decltype(o)::value, decltype(rg)::value,
                             decltype(x)::value, decltype(h)::value>;
        gr.p = plan(a.total, a.S, norm != nullptr);
        if (norm) {
          const MmaPlan q = plan(a.total, a.S, false);
          same_split = gr.p.nwarps == q.nwarps && gr.p.grid == q.grid;
        }
      });
      if (!same_split) return false;
      // The block split where every block gets a row-tile and its pieces fit beside the copy
      // (else the grid split: XS never gives way to it); the same blocks and warps.
      if (gr.xs && use_xs_block_split() && a.total / a.S >= gr.p.grid &&
          gr.p.smem + xs_split_bytes(gr.p.wpb, NT) <= size_t(dev_info().smem_optin)) {
        a.block_split = 1;
        gr.p.smem += xs_split_bytes(gr.p.wpb, NT);
      }
      if (rows > kColsRows)
        with_mma(gr.t, NT, 1, gr.regs, false, 0, [&](auto dt, auto nt, auto o, auto rg, auto, auto) {
          const MmaPlan q =
              plan_mma<decltype(dt)::value, decltype(nt)::value, decltype(o)::value, decltype(rg)::value>(a.total, a.S,
                                                                                                          false);
          narrower = narrower || gr.p.nwarps < q.nwarps;
        });
      a.nwarps = gr.p.nwarps;
      max_warps = std::max(max_warps, a.nwarps);
      max_cnt = std::max(max_cnt, a.nwarps);
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
  for (const Group& gr : groups) {
    MmaPlan wp;  // the warpgroup form's launch: blocks of 4 warps, a group of 4 row-tiles × a split each
    wp.wpb = 4, wp.grid = (gr.wa.rt + 3) / 4 * gr.wa.splits, wp.nwarps = 4 * wp.grid;
    log_plan(gr.t, gr.a.nmat, (long long)gr.a.rt_end[gr.a.nmat - 1] * 16, K, T, NT, gr.regs, gr.xs, gr.wg ? 4 : gr.hb,
             gr.wg ? wp : pair.grid > 0 ? pair : gr.p, gr.a.total);
  }
  // One workspace: the activations once for every matrix (none when the staged kernels quantize
  // in the GEMM or the kernel before quantized them: act) and, for the multi-token kernel, the
  // split row-tiles' pieces and the arrival counters (shared by the groups: each launch runs
  // after the one before; the staged kernels sum their split row-tiles inside their blocks). The
  // scratch stack's counters are zero already and left so; a workspace's own are cleared by
  // quantize_kernel, or with act by a memset.
  const bool staged = rows > 0;
  int* const counters =
      !staged && c.scratch && max_cnt <= ScratchStack::kCounters ? c.scratch->counters() : nullptr;
  const bool own_cnt = !staged && !counters;
  const bool fused = !act && !norm && staged && use_fused_t1();
  auto up = [](size_t b) { return (b + 255) / 256 * 256; };
  const size_t o_part = fused || act || norm ? 0 : L.bytes;
  // (pieces of two row-tiles a slot where a group runs on pairs of them)
  const bool any_pair = std::any_of(groups.begin(), groups.end(), [](const Group& gr) { return gr.hb == 3; });
  const size_t o_cnt =
      o_part + (staged ? 0
                       : up(std::max(size_t(max_warps) * 2 * size_t(T) * 16 * (any_pair ? 2 : 1), wg_part) *
                            sizeof(float)));
  Temp<uint8_t> ws_mem(c, o_cnt + (own_cnt ? up(size_t(max_cnt) * sizeof(int)) : 0));
  uint8_t* const base = ws_mem.get();
  const uint8_t* const xq = act ? static_cast<const uint8_t*>(act) : base;
  int* const cnt = own_cnt ? reinterpret_cast<int*>(base + o_cnt) : counters;
  if (!fused && !act && !norm)
    launch_quantize<false>(c, xp, nullptr, int(T), int(K), base, cnt, own_cnt ? max_cnt : 0);
  else if (own_cnt)
    CUDA_CHECK(cudaMemsetAsync(cnt, 0, size_t(max_cnt) * sizeof(int), c.stream));
  for (Group& gr : groups) {
    gr.a.x = fused ? xp : nullptr;
    if (norm) {  // the first group writes y_out and x
      gr.a.norm = *norm;
      if (&gr != &groups.front()) gr.a.norm.y_out = gr.a.norm.x = nullptr;
    }
    gr.a.xb = reinterpret_cast<const uint2*>(xq + L.o_xb);
    gr.a.xf = reinterpret_cast<const float4*>(xq + L.o_xf);
    gr.a.xi = reinterpret_cast<const int4*>(xq + L.o_xi);
    gr.a.xh = L.o_xh ? reinterpret_cast<const uint4*>(xq + L.o_xh) : nullptr;
    gr.a.part = reinterpret_cast<float*>(base + o_part);
    gr.a.cnt = cnt;
    gr.a.ahead = gr.xs ? xs_ahead() : 0;
    gr.wa.xs = gr.a.xh, gr.wa.part = gr.a.part, gr.wa.cnt = cnt;
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
    if (gr.wg) {
      launch_wgmma(c, gr.t, gr.wa);
      continue;
    }
    if (gr.xs) g_xs_launches.fetch_add(1, std::memory_order_relaxed);
    if (gr.a.block_split) g_xs_split_launches.fetch_add(1, std::memory_order_relaxed);
    if (gr.hb) g_hb_launches.fetch_add(1, std::memory_order_relaxed);
    with_mma(gr.t, NT, rows, gr.regs, gr.xs, gr.hb, [&](auto dt, auto nt, auto o, auto rg, auto x, auto h) {
      launch_pdl(mma_kernel<decltype(dt)::value, decltype(nt)::value, decltype(o)::value, decltype(rg)::value,
                            decltype(x)::value, decltype(h)::value>,
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
// The same for QWEN36_MMA_HB ("on" | "off" | "auto"), and the bf16 form's launches so far.
void mma_select_hb(const char* hb) { g_hb.store(hb ? parse_variant(hb, "on", "off") : -1); }
// The same for QWEN36_MMA_HB_BLOCKS (1 | 2; 0 reads the environment again).
void mma_select_hb_blocks(int n) { g_hb_blocks.store(n == 1 || n == 2 ? n : -1); }
// The same for QWEN36_MMA_HB_PAIRS ("on" | "off" | "auto").
void mma_select_hb_pairs(const char* pairs) { g_hb_pairs.store(pairs ? parse_variant(pairs, "on", "off") : -1); }
// The units of two row-tiles a group keeps where pairs run past 32 tokens unforced (hb_form).
long long mma_pair_min_units() { return kPairMinUnits; }
long long mma_hb_launches() { return g_hb_launches.load(); }
// The same for QWEN36_MMA_PAIR, and the count of pair launches so far.
void mma_select_pair(const char* pair) { g_pair.store(pair ? parse_variant(pair, "on", "off") : -1); }
long long mma_pair_launches() { return g_pair_launches.load(); }
// The same for QWEN36_MMA_XS, and the XS launches made so far.
void mma_select_xs(const char* xs) { g_xs.store(xs ? parse_variant(xs, "on", "off") : -1); }
// The same for QWEN36_MMA_XS_SPLIT ("block" | "grid" | "auto").
void mma_select_xs_split(const char* split) { g_xs_split.store(split ? parse_variant(split, "block", "grid") : -1); }
long long mma_xs_split_launches() { return g_xs_split_launches.load(); }
long long mma_xs_launches() { return g_xs_launches.load(); }
// The launches of a one-token norm GEMM with f32 projections beside it so far.
long long mma_norm_gemv_launches() { return g_norm_gemv_launches.load(); }

}  // namespace qwen36::cuda
