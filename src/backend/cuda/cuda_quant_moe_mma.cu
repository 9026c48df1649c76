// Routed MoE experts on tiled weights (quant_tiled_moe; cuda_moe.cu takes it up to its pair
// bound; the tile layout is described in cuda_quant_mma.cu's header): as the GGUF path's
// GEMVs (the same int8 twin), two launches. gate+up: a block (8 warps, more where a row-tile
// has more units: moe_warps_per_row_tile) per (token, expert) pair p and 16 · (8 / wr) rows,
// SwiGLU in the epilogue, act [P, I] f32. down: a block per token and 16 · (8 / wr) rows, its
// k pairs' products weighted and summed in the block (no y rows, no combine launch); with a
// shared expert (Backend::moe_experts_shared, a few tokens) that one is one more pair of the
// down block, its SwiGLU row quantized there from its gate and up projections. A row-tile's
// units (gate+up: super-blocks; down: (pair, super-block)) are split wr ways between warps
// (35B: gate/up K = 2048, 8 warps each one gate and one up tile; down 8 pairs × 2
// super-blocks, 8 warps of 2 units, the second loading while the first computes, 9 warps with
// the shared expert), and the pieces meet in shared memory in warp order: no atomics, no
// cross-block arrivals, bitwise reproducible (eager or graph replay). A block quantizes its
// rows itself into shared memory (bitwise quantize_kernel's bytes; 2-8 KB from L2, while its
// first tiles load) and puts a row in all 8 MMA columns: 7/8 of each MMA is wasted, free next
// to the tile loads, and there is no quantization launch or token-column bookkeeping. Why per
// pair rather than per expert with its tokens as MMA columns: that needs a device-side
// grouping by expert (a sort, an extra launch) and pays only where a step's tokens share
// experts; per pair the cost is linear in pairs, as the GEMVs'. Tiles load with default
// eviction (pairs sharing an expert may find them in L2).
// Ids outside [0, E) contribute nothing. Shapes: D, I multiples of 256 up to kMaxMoeWidth, k ≤ 32,
// P ≤ kMaxMoePairs; anything else returns false and moe_experts takes another path.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_quant_mma_frags.cuh"

namespace qwen36::cuda {

namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

constexpr int kMoeWarps = 8;           // warps per block of the pair kernels, at least
constexpr int kMoeMaxWarps = 16;       // and at most (a row-tile's units split wr > 8 ways)
constexpr int kMaxMoeWidth = 16384;    // D and I bound: one row's fragments in shared memory
constexpr int64_t kMaxMoePairs = 65535;  // pairs per call: the grid's y dimension

struct MoeArgs {
  const float* x;            // gate+up: x [T, K] (pair p reads row p / k); down: act [P, K]
  const int32_t* ids;        // [P]: the expert of pair p = t·k + j
  const float* w;            // [P]: its routing weight (down)
  const void* const* table;  // [E][3]: tiled gate, up, down
  float* out;                // gate+up: act [P, N] = silu(gate · x) ⊙ (up · x); down: out [T, N]
  int K, N, k, E, wr;        // N rows of K per matrix; wr warps per row-tile (8 / wr row-tiles per block)
  // down with a shared expert (Backend::moe_experts_shared), else null: pair k of every token
  const float *sh_gate = nullptr, *sh_up = nullptr;  // [T, K]: its gate and up projections
  const void* sh_down = nullptr;                      // tiled [N, K]
  const float* sh_logit = nullptr;                    // [T]: its gate logit; its weight is the sigmoid
};

// Warps of a block whose row-tiles are split wr ways: kMoeWarps (8 / wr row-tiles) or wr (one).
int moe_block_warps(int wr) { return std::max(kMoeWarps, wr); }

// Shared memory of a block of nw warps: `rows` quantized rows, the warps' partial sums (nm per
// row), (Q4_K) the warps' scale tables.
template <DType D>
size_t moe_smem(int K, int rows, int nm, int nw) {
  return size_t(rows) * (K / 32) * sizeof(ColGroup) + size_t(nw) * nm * 16 * sizeof(float) +
         (D == DType::Q4_K_T16 ? size_t(nw) * 16 * kTabStride * sizeof(float2) : 0);
}

// The warps' partial sums of the block's row-tiles meet in warp order (no atomics: bitwise
// reproducible); part[m][0 / 1] are this warp's rows g / g + 8 of its row-tile. Returns, for
// thread i < rpb · 16, the sums of row i % 16 of row-tile i / 16 of the block (nm values).
template <int NM>
__device__ __forceinline__ void block_row_sums(float* red, const float (&part)[NM][2], int wr, float (&sum)[NM]) {
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5), g = lane >> 2;
  if ((lane & 3) == 0) {  // the 4 lanes of a g hold the same values
#pragma unroll
    for (int m = 0; m < NM; ++m) {
      red[(warp * NM + m) * 16 + g] = part[m][0];
      red[(warp * NM + m) * 16 + g + 8] = part[m][1];
    }
  }
  __syncthreads();
#pragma unroll
  for (int m = 0; m < NM; ++m) sum[m] = 0.0f;
  if (int(threadIdx.x) < int(blockDim.x >> 5) / wr * 16) {
    const int rl = int(threadIdx.x) >> 4, row = int(threadIdx.x) & 15;
    for (int q = 0; q < wr; ++q)  // warp order
#pragma unroll
      for (int m = 0; m < NM; ++m) sum[m] += red[((rl * wr + q) * NM + m) * 16 + row];
  }
}

// gate+up. grid (row-tile groups, P), moe_block_warps(wr) warps: block (b, p) computes rows 16·r ..
// 16·r + 15 of gate and up, r = b · rpb + warp / wr, for pair p's expert, warp w taking
// super-blocks w % wr, + wr, ... of its row-tile; act = silu(gate) ⊙ up. The block quantizes
// x's row itself (its first tiles already loading): no quantization launch. An id outside
// [0, E) gives an act row of zeros.
template <DType D>
__global__ void __launch_bounds__(kMoeMaxWarps * 32) moe_gate_up_kernel(const MoeArgs a) {
  constexpr int B = TileLayout<D>::kBytes;
  extern __shared__ __align__(16) uint8_t smem[];
  griddep_trigger();
  griddep_wait();  // the ids and x come from the kernels before
  const int p = int(blockIdx.y), e = a.ids[p];
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5);
  const int S = a.K >> 8, G = a.K >> 5, wr = a.wr, nw = int(blockDim.x >> 5), rpb = nw / wr, R = a.N >> 4;
  const int r = int(blockIdx.x) * rpb + warp / wr, r_out = int(blockIdx.x) * rpb + (int(threadIdx.x) >> 4);
  float* act = a.out + size_t(p) * a.N + 16 * size_t(r_out) + (threadIdx.x & 15);
  if (e < 0 || e >= a.E) {  // the whole block, before any barrier
    if (int(threadIdx.x) < rpb * 16 && r_out < R) *act = 0.0f;
    return;
  }
  ColGroup* xg = reinterpret_cast<ColGroup*>(smem);
  float* red = reinterpret_cast<float*>(smem + size_t(G) * sizeof(ColGroup));  // [warp][2][16]
  float2* tab = reinterpret_cast<float2*>(red + nw * 2 * 16) + warp * 16 * kTabStride;

  const bool live = r < R;
  const size_t off = size_t(live ? r : 0) * S * B;
  const uint8_t* wg = static_cast<const uint8_t*>(a.table[3 * size_t(e)]) + off;
  const uint8_t* wu = static_cast<const uint8_t*>(a.table[3 * size_t(e) + 1]) + off;
  int s = warp % wr;  // < S: wr ≤ S
  Raw<D> RG, RU;
  if (live) {
    load_tile<D, true, false>(wg + size_t(s) * B, lane, RG);
    load_tile<D, true, false>(wu + size_t(s) * B, lane, RU);
  }
  quantize_row(a.x + size_t(p / a.k) * a.K, G, xg);
  __syncthreads();
  float part[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
  if (live) {
    for (;;) {
      tile_row<D>(RG, xg + s * 8, lane, tab, part[0][0], part[0][1]);
      tile_row<D>(RU, xg + s * 8, lane, tab, part[1][0], part[1][1]);
      s += wr;
      if (s >= S) break;
      load_tile<D, true, false>(wg + size_t(s) * B, lane, RG);
      load_tile<D, true, false>(wu + size_t(s) * B, lane, RU);
    }
  }
  float sum[2];
  block_row_sums<2>(red, part, wr, sum);
  if (int(threadIdx.x) < rpb * 16 && r_out < R) *act = silu_f(sum[0]) * sum[1];
}

// down and the weighted sum over a token's k pairs (k + 1 with a shared expert: its SwiGLU row
// quantized here from its gate and up projections, its weight the sigmoid of its gate logit;
// three launches fewer than its own SwiGLU, down GEMM and gated add, and its down tiles load
// beside the routed ones). grid (row-tile groups, T), moe_block_warps(wr) warps:
// block (b, t) computes out[t] rows 16·r .. 16·r + 15, r = b · rpb + warp / wr, as Σ_j w[t, j] ·
// down_e(j) · act[t·k + j]: a row-tile's k·S units (pair j, super-block s; u = j·S + s) are
// split between its wr warps (u = w % wr, + wr, ...), each unit's product weighted in f32 as it
// is added, and the warps' sums meet in warp order (no atomics, no y round trip or combine
// launch). The block quantizes the token's k act rows (contiguous: pairs t·k .. t·k + k − 1).
// Lane j < k of every warp holds pair j's down matrix (null: id outside [0, E), its units are
// skipped) and weight; a warp's next unit loads while the current one computes. k ≤ 32.
template <DType D>
__global__ void __launch_bounds__(kMoeMaxWarps * 32) moe_down_kernel(const MoeArgs a) {
  constexpr int B = TileLayout<D>::kBytes;
  extern __shared__ __align__(16) uint8_t smem[];
  griddep_trigger();
  griddep_wait();  // act comes from the gate+up launch
  const int t = int(blockIdx.y), k = a.k, kk = k + (a.sh_down != nullptr);  // kk pairs: the routed, the shared
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5);
  const int S = a.K >> 8, G = a.K >> 5, U = kk * S, wr = a.wr, nw = int(blockDim.x >> 5), rpb = nw / wr;
  const int R = a.N >> 4;
  const int r = int(blockIdx.x) * rpb + warp / wr, r_out = int(blockIdx.x) * rpb + (int(threadIdx.x) >> 4);
  ColGroup* xg = reinterpret_cast<ColGroup*>(smem);  // [kk][G]
  float* red = reinterpret_cast<float*>(smem + size_t(kk) * G * sizeof(ColGroup));  // [warp][16]
  float2* tab = reinterpret_cast<float2*>(red + nw * 16) + warp * 16 * kTabStride;

  const uint8_t* mine = nullptr;  // lane j < kk: pair j's down matrix, and its weight
  float wmine = 0.0f;
  if (lane < k) {
    const int e = a.ids[size_t(t) * k + lane];
    if (e >= 0 && e < a.E) {
      mine = static_cast<const uint8_t*>(a.table[3 * size_t(e) + 2]);
      wmine = a.w[size_t(t) * k + lane];
    }
  } else if (lane < kk) {
    mine = static_cast<const uint8_t*>(a.sh_down);
    wmine = sigmoid_f(a.sh_logit[t]);
  }
  const unsigned valid = __ballot_sync(0xffffffffu, mine != nullptr);
  const bool live = r < R;
  // The first unit ≥ u of this warp (u ≡ warp % wr) whose pair is valid; U when none is left.
  auto next = [&](int u) {
    while (u < U && !((valid >> (u / S)) & 1u)) u += wr;
    return u;
  };
  // Unit u's tile (warp-uniform u: every lane takes part in the shuffle).
  auto tile_of = [&](int u) {
    const int j = u / S;
    const auto base = reinterpret_cast<const uint8_t*>(
        __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(mine), j));
    return base + (size_t(r) * S + size_t(u - j * S)) * B;
  };
  int u = next(warp % wr);
  Raw<D> cur{}, nxt{};
  if (live && u < U) load_tile<D, true, false>(tile_of(u), lane, cur);
  if (kk == k) {
    quantize_row(a.x + size_t(t) * k * a.K, k * G, xg);
  } else {  // the routed rows and the shared expert's SwiGLU row in one pass (one L2 round trip)
    const float4* x4 = reinterpret_cast<const float4*>(a.x + size_t(t) * k * a.K);
    const float4* g4 = reinterpret_cast<const float4*>(a.sh_gate + size_t(t) * a.K);
    const float4* u4 = reinterpret_cast<const float4*>(a.sh_up + size_t(t) * a.K);
    const int routed = k * G * 8;  // quads
    quantize_row_of([=](int id) { return id < routed ? x4[id] : swiglu4(g4[id - routed], u4[id - routed]); }, kk * G,
                    xg);
  }
  __syncthreads();
  float part[1][2] = {{0.0f, 0.0f}};
  if (live) {
    while (u < U) {
      const int un = next(u + wr);
      if (un < U) load_tile<D, true, false>(tile_of(un), lane, nxt);
      const int j = u / S;
      float p0 = 0.0f, p1 = 0.0f;
      tile_row<D>(cur, xg + size_t(j) * G + size_t(u - j * S) * 8, lane, tab, p0, p1);
      const float wj = __shfl_sync(0xffffffffu, wmine, j);
      part[0][0] = fmaf(wj, p0, part[0][0]);
      part[0][1] = fmaf(wj, p1, part[0][1]);
      cur = nxt;
      u = un;
    }
  }
  float sum[1];
  block_row_sums<1>(red, part, wr, sum);
  if (int(threadIdx.x) < rpb * 16 && r_out < R) a.out[size_t(t) * a.N + 16 * size_t(r_out) + (threadIdx.x & 15)] = sum[0];
}

// Warps per row-tile for `units` tiles per row-tile. From 8 units on, as many warps as give each
// ⌊units / 8⌋ (up to kMoeMaxWarps): the 35B's gate/up, K = 2048: 8 super-blocks, 8 warps of one,
// all the row-tile's tiles in flight at once; its down, 8 pairs × 2 super-blocks: 8 warps of 2;
// with the shared expert 9 pairs: 9 warps of 2, not 8 of which two take a third. Fewer units:
// fewer warps per row-tile, more row-tiles per block.
int moe_warps_per_row_tile(int units) {
  if (units >= 8) return std::min(kMoeMaxWarps, (units + units / 8 - 1) / (units / 8));
  return units >= 4 ? 4 : units >= 2 ? 2 : 1;
}

template <typename Kernel>
void launch_moe(Ctx& c, Kernel kernel, const MoeArgs& a, unsigned grid_y, size_t smem) {
  const int nw = moe_block_warps(a.wr), rpb = nw / a.wr, R = a.N / 16;
  launch_pdl(kernel, dim3(unsigned((R + rpb - 1) / rpb), grid_y), dim3(nw * 32), smem, c.stream, a);
}

}  // namespace

bool quant_tiled_moe(Ctx& c, const Tensor& x, const Tensor& weights, const Tensor& ids, const void* const* table,
                     DType gate_up, DType down, int64_t E, int64_t I, Tensor& out, const SharedDown* sh) {
  const int64_t T = x.rows(), D = x.cols(), k = ids.cols(), P = T * k, kk = k + (sh != nullptr);
  if (c.exact_matmul || !dtype_is_tiled(gate_up) || !dtype_is_tiled(down) || P < 1 || P > kMaxMoePairs ||
      k < 1 || D % 256 != 0 || I % 256 != 0 || D > kMaxMoeWidth || I > kMaxMoeWidth || E < 1 ||
      E >= (int64_t(1) << 30) || x.dtype != DType::F32 || !aligned16(x.data) || ids.dtype != DType::I32 ||
      ids.rows() != T || weights.dtype != DType::F32 || weights.numel() != P || out.dtype != DType::F32 ||
      out.numel() != T * D)
    return false;
  // The down block holds its token's kk quantized act rows in shared memory (35B: 7 KB), its
  // lanes the kk pairs' matrices; no opt-in above the default 48 KB.
  const int gu_wr = moe_warps_per_row_tile(int(D / 256)), dn_wr = moe_warps_per_row_tile(int(kk * (I / 256)));
  if (kk > 32 || moe_smem<DType::Q4_K_T16>(int(I), int(kk), 1, moe_block_warps(dn_wr)) > (size_t(48) << 10))
    return false;
  // The shared expert: one more pair of the down kernel, of the routed experts' down type and shape.
  if (sh && !(sh->down.dtype == down && sh->down.rows() == D && sh->down.cols() == I && aligned16(sh->down.data) &&
              sh->gate.dtype == DType::F32 && sh->up.dtype == DType::F32 && sh->gate.numel() == T * I &&
              sh->up.numel() == T * I && aligned16(sh->gate.data) && aligned16(sh->up.data) &&
              sh->logit.dtype == DType::F32 && sh->logit.numel() == T))
    return false;
  Temp<float> act(c, size_t(P * I));  // the pairs' SwiGLU rows (35B at 256 pairs: 0.5 MB)
  const MoeArgs gu{x.as<const float>(), ids.as<const int32_t>(), weights.as<const float>(), table, act.get(),
                   int(D), int(I), int(k), int(E), gu_wr};
  MoeArgs dn{act.get(), ids.as<const int32_t>(), weights.as<const float>(), table, out.as<float>(),
             int(I), int(D), int(k), int(E), dn_wr};
  if (sh) {
    dn.sh_gate = sh->gate.as<const float>(), dn.sh_up = sh->up.as<const float>();
    dn.sh_down = sh->down.data, dn.sh_logit = sh->logit.as<const float>();
  }
  with_tiled_dtype(gate_up, [&](auto dt) {
    constexpr DType DT = decltype(dt)::value;
    launch_moe(c, moe_gate_up_kernel<DT>, gu, unsigned(P), moe_smem<DT>(int(D), 1, 2, moe_block_warps(gu_wr)));
  });
  with_tiled_dtype(down, [&](auto dt) {
    constexpr DType DT = decltype(dt)::value;
    launch_moe(c, moe_down_kernel<DT>, dn, unsigned(T), moe_smem<DT>(int(I), int(kk), 1, moe_block_warps(dn_wr)));
  });
  return true;
}

}  // namespace qwen36::cuda
