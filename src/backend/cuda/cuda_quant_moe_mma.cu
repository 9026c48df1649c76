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
// the shared expert), and each unit's sum goes to shared memory, where the block adds them in
// an order that does not depend on the split: a row's tiles in super-block order, a token's
// pairs in pair order, SiLU by silu_portable — the arithmetic the host reproduces bit for bit
// (quant/cpu_dot_exact.h, expert offload). No atomics, no cross-block arrivals: bitwise
// reproducible (eager or graph replay). gate+up lets the down launch start only after its own
// griddep_wait, so the down blocks read the routing and request their first tiles before theirs
// (H100 35B-A3B Q4_K_M tg64 b1 483.5 -> 497.0, b4 930.4 -> 961.6, session 59). A block quantizes its
// rows itself into shared memory (bitwise quantize_kernel's bytes; 2-8 KB from L2, while its
// first tiles load) and puts a row in all 8 MMA columns: 7/8 of each MMA is wasted, free next
// to the tile loads, and there is no quantization launch or token-column bookkeeping. Per pair
// rather than per expert with its tokens as MMA columns up to a few tokens a call: grouping by
// expert needs a device-side sort and more launches, and pays only where a step's tokens share
// experts; per pair the cost is linear in pairs, as the GEMVs'. Many pairs (batch 32 and more
// on the 35B-A3B) take the grouped form (cuda_quant_moe_grouped.cu). Tiles load with default
// eviction (pairs sharing an expert may find them in L2).
// Ids outside [0, E) contribute nothing. Shapes: D, I multiples of 256 up to kMaxMoeWidth, k ≤ 32,
// P ≤ kMaxMoePairs; anything else returns false and moe_experts takes another path.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_quant_mma_frags.cuh"
#include "core/portable_exp.h"

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
  bool x_early = false;  // gate+up: x complete when the launch starts (Ctx::routed_ids): quantized before the wait
  // down, rows instead of their weighted sum (expert offload's exact combination): pair (t, j)'s
  // row y_j at rows[t·k + j], the shared expert's at sh_row[t]; w and sh_logit unused.
  float *rows = nullptr, *sh_row = nullptr;
};

// Warps of a block whose row-tiles are split wr ways: kMoeWarps (8 / wr row-tiles) or wr (one).
int moe_block_warps(int wr) { return std::max(kMoeWarps, wr); }

// Shared memory of a block of nw warps: `rows` quantized rows of K, `partials` floats of the
// tiles' partial sums, (Q4_K, NVFP4) the warps' scale tables.
template <DType D>
size_t moe_smem(int K, int rows, size_t partials, int nw) {
  return size_t(rows) * (K / 32) * sizeof(ColGroup) + partials * sizeof(float) +
         (table_tile(D) ? size_t(nw) * 16 * kTabStride * sizeof(float2) : 0);
}

// A tile's partial sums of rows g and g + 8 (each lane of a g holds them) into its 16 slots.
__device__ __forceinline__ void store_partial(float* slot, float p0, float p1) {
  const int lane = int(threadIdx.x & 31), g = lane >> 2;
  if ((lane & 3) == 0) slot[g] = p0, slot[g + 8] = p1;
}

// gate+up. grid (row-tile groups, P), moe_block_warps(wr) warps: block (b, p) computes rows 16·r ..
// 16·r + 15 of gate and up, r = b · rpb + warp / wr, for pair p's expert, warp w taking
// super-blocks w % wr, + wr, ... of its row-tile; act = silu(gate) ⊙ up. The arithmetic is
// the canonical one the host's twin reproduces bit for bit (quant/cpu_dot_exact.h): each tile's
// sum (tile_row from 0) into shared memory, a row's tiles added in super-block order, SiLU
// by silu_portable. The block quantizes x's row itself (its first tiles already loading, or,
// after a route kernel that released it only after its own wait (x_early, Ctx::routed_ids),
// before its wait, while the route runs: H100 35B-A3B Q4_K_M b1 494 → 506, b4 even, session
// 60): no quantization launch. An id outside [0, E) gives an act row of zeros.
template <DType D>
__global__ void __launch_bounds__(kMoeMaxWarps * 32) moe_gate_up_kernel(const MoeArgs a) {
  constexpr int B = TileLayout<D>::kBytes;
  extern __shared__ __align__(16) uint8_t smem[];
  const int p = int(blockIdx.y);
  const int S = a.K >> 8, G = a.K >> 5;
  ColGroup* xg = reinterpret_cast<ColGroup*>(smem);
  if (a.x_early) quantize_row(a.x + size_t(p / a.k) * a.K, G, xg);
  griddep_wait();  // the ids (and x, unless x_early) come from the kernels before
  griddep_trigger();  // after the wait: the down launch reads ids and the shared expert's inputs before its own
  const int e = a.ids[p];
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5);
  const int wr = a.wr, nw = int(blockDim.x >> 5), rpb = nw / wr, R = a.N >> 4;
  const int r = int(blockIdx.x) * rpb + warp / wr, r_out = int(blockIdx.x) * rpb + (int(threadIdx.x) >> 4);
  float* act = a.out + size_t(p) * a.N + 16 * size_t(r_out) + (threadIdx.x & 15);
  if (e < 0 || e >= a.E) {  // the whole block, before any barrier
    if (int(threadIdx.x) < rpb * 16 && r_out < R) *act = 0.0f;
    return;
  }
  float* red = reinterpret_cast<float*>(smem + size_t(G) * sizeof(ColGroup));  // [rpb][S][gate, up][16]
  float2* tab = reinterpret_cast<float2*>(red + rpb * S * 2 * 16) + warp * 16 * kTabStride;

  const bool live = r < R;
  const size_t off = size_t(live ? r : 0) * S * B;
  const uint8_t* wg = static_cast<const uint8_t*>(a.table[3 * size_t(e)]) + off;
  const uint8_t* wu = static_cast<const uint8_t*>(a.table[3 * size_t(e) + 1]) + off;
  float* mine = red + size_t(warp / wr) * S * 2 * 16;
  int s = warp % wr;  // < S: wr ≤ S
  Raw<D> RG, RU;
  if (live) {
    load_tile<D, true, false>(wg + size_t(s) * B, lane, RG);
    load_tile<D, true, false>(wu + size_t(s) * B, lane, RU);
  }
  if (!a.x_early) quantize_row(a.x + size_t(p / a.k) * a.K, G, xg);
  __syncthreads();
  if (live) {
    for (;;) {
      float g0 = 0.0f, g1 = 0.0f, u0 = 0.0f, u1 = 0.0f;
      tile_row<D>(RG, xg + s * 8, lane, tab, g0, g1);
      tile_row<D>(RU, xg + s * 8, lane, tab, u0, u1);
      store_partial(mine + (2 * s) * 16, g0, g1);
      store_partial(mine + (2 * s + 1) * 16, u0, u1);
      s += wr;
      if (s >= S) break;
      load_tile<D, true, false>(wg + size_t(s) * B, lane, RG);
      load_tile<D, true, false>(wu + size_t(s) * B, lane, RU);
    }
  }
  __syncthreads();
  if (int(threadIdx.x) < rpb * 16 && r_out < R) {
    const float* pr = red + size_t(threadIdx.x >> 4) * S * 2 * 16 + (threadIdx.x & 15);
    float gate = 0.0f, up = 0.0f;
#pragma unroll 8
    for (int t = 0; t < S; ++t) gate += pr[(2 * t) * 16], up += pr[(2 * t + 1) * 16];
    *act = silu_portable(gate) * up;
  }
}

// down and the weighted sum over a token's k pairs (k + 1 with a shared expert: its SwiGLU row
// quantized here from its gate and up projections, its weight the sigmoid of its gate logit;
// three launches fewer than its own SwiGLU, down GEMM and gated add, and its down tiles load
// beside the routed ones). grid (row-tile groups, T), moe_block_warps(wr) warps:
// block (b, t) computes out[t] rows 16·r .. 16·r + 15, r = b · rpb + warp / wr. A row-tile's
// k·S units (pair j, super-block s; u = j·S + s) are split between its wr warps (u = w % wr,
// + wr, ...), a warp's next unit loading while the current one computes; each unit's sum goes
// to shared memory, and the block adds them in the canonical order the host's twin reproduces
// (quant/cpu_dot_exact.h): pair j's row y_j as its tiles added in super-block order, then
// out = Σ_j w_j · y_j as FMAs in pair order (no atomics, no y round trip or combine launch).
// The block quantizes the token's k act rows (contiguous: pairs t·k .. t·k + k − 1). Lane j < k
// of every warp holds pair j's down matrix (null: id outside [0, E), its units are skipped and
// it adds nothing) and weight. k ≤ 32.
template <DType D>
__global__ void __launch_bounds__(kMoeMaxWarps * 32) moe_down_kernel(const MoeArgs a) {
  constexpr int B = TileLayout<D>::kBytes;
  extern __shared__ __align__(16) uint8_t smem[];
  griddep_trigger();
  const int t = int(blockIdx.y), k = a.k, kk = k + (a.sh_down != nullptr);  // kk pairs: the routed, the shared
  // With routed pairs the gate+up launch ran first and let this one start only after its own
  // griddep_wait, so what the kernels before it wrote (ids, weights, the shared expert's gate,
  // up and logit) is complete: read through L2 before this launch's wait, the warps' first two
  // tiles requested and the shared expert's SwiGLU row quantized while the gate+up launch
  // drains; only act waits. The shared expert alone (k = 0) may read the kernel right before.
  const bool early = k > 0;
  if (!early) griddep_wait();
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5);
  const int S = a.K >> 8, G = a.K >> 5, U = kk * S, wr = a.wr, nw = int(blockDim.x >> 5), rpb = nw / wr;
  const int R = a.N >> 4;
  const int r = int(blockIdx.x) * rpb + warp / wr, r_out = int(blockIdx.x) * rpb + (int(threadIdx.x) >> 4);
  ColGroup* xg = reinterpret_cast<ColGroup*>(smem);  // [kk][G]
  float* red = reinterpret_cast<float*>(smem + size_t(kk) * G * sizeof(ColGroup));  // [rpb][U][16]
  float* wts = red + rpb * U * 16;                                                     // [32]: the pairs' weights
  float2* tab = reinterpret_cast<float2*>(wts + 32) + warp * 16 * kTabStride;

  const uint8_t* mine = nullptr;  // lane j < kk: pair j's down matrix, and its weight
  float wmine = 0.0f;
  const bool rows = a.rows != nullptr || a.sh_row != nullptr;
  if (lane < k) {
    const int e = __ldcg(a.ids + size_t(t) * k + lane);
    if (e >= 0 && e < a.E) {
      mine = static_cast<const uint8_t*>(a.table[3 * size_t(e) + 2]);
      if (!rows) wmine = __ldcg(a.w + size_t(t) * k + lane);
    }
  } else if (lane < kk) {
    mine = static_cast<const uint8_t*>(a.sh_down);
    if (!rows) wmine = sigmoid_f(__ldcg(a.sh_logit + t));
  }
  const unsigned valid = __ballot_sync(0xffffffffu, mine != nullptr);
  if (warp == 0) wts[lane] = wmine;  // read after the barriers below
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
  int u = next(warp % wr), un = next(u + wr);  // the warp's first two units
  Raw<D> cur{}, nxt{};
  if (live && u < U) load_tile<D, true, false>(tile_of(u), lane, cur);
  if (live && un < U) load_tile<D, true, false>(tile_of(un), lane, nxt);
  if (kk > k) {  // the shared expert's SwiGLU row (per 32, as if in one pass with the routed rows)
    const float4* g4 = reinterpret_cast<const float4*>(a.sh_gate + size_t(t) * a.K);
    const float4* u4 = reinterpret_cast<const float4*>(a.sh_up + size_t(t) * a.K);
    quantize_row_of([=](int id) { return swiglu4(__ldcg(g4 + id), __ldcg(u4 + id)); }, G, xg + size_t(k) * G);
  }
  if (early) {  // act comes from the gate+up launch
    griddep_wait();
    quantize_row(a.x + size_t(t) * k * a.K, k * G, xg);
  }
  __syncthreads();
  float* units = red + size_t(warp / wr) * U * 16;
  if (live) {
    while (u < U) {  // cur holds unit u; nxt is unit un's, in flight
      const int j = u / S;
      float p0 = 0.0f, p1 = 0.0f;
      tile_row<D>(cur, xg + size_t(j) * G + size_t(u - j * S) * 8, lane, tab, p0, p1);
      store_partial(units + size_t(u) * 16, p0, p1);
      u = un;
      if (u >= U) break;
      cur = nxt;
      un = next(u + wr);
      if (un < U) load_tile<D, true, false>(tile_of(un), lane, nxt);
    }
  }
  __syncthreads();
  // Pair j's row y_j: its tiles added in super-block order, a thread per (row-tile row, pair),
  // into the pair's first slot (only this thread reads the pair's slots of this row).
  for (int i = int(threadIdx.x); i < rpb * kk * 16; i += int(blockDim.x)) {
    const int j = (i >> 4) % kk;
    if (!((valid >> j) & 1u)) continue;
    float* pr = red + (size_t(i / (kk * 16)) * U + size_t(j) * S) * 16 + (i & 15);
    float y = 0.0f;
    for (int s = 0; s < S; ++s) y += pr[s * 16];
    pr[0] = y;
  }
  __syncthreads();
  if (int(threadIdx.x) >= rpb * 16 || r_out >= R) return;
  const float* pr = red + size_t(threadIdx.x >> 4) * U * 16 + (threadIdx.x & 15);
  const size_t col = 16 * size_t(r_out) + (threadIdx.x & 15);
  if (rows) {
    for (int j = 0; j < kk; ++j)
      if ((valid >> j) & 1u) (j < k ? a.rows + (size_t(t) * k + j) * a.N : a.sh_row + size_t(t) * a.N)[col] = pr[j * S * 16];
    return;
  }
  float acc = 0.0f;
#pragma unroll 4
  for (int j = 0; j < kk; ++j)
    if ((valid >> j) & 1u) acc = fmaf(wts[j], pr[j * S * 16], acc);
  a.out[size_t(t) * a.N + col] = acc;
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

namespace {

// A call's warps per row-tile and partial-sum floats per block, gate+up and down.
struct Split {
  int gu_wr, dn_wr, gu_nw, dn_nw;
  size_t gu_partials, dn_partials;
  Split(int64_t D, int64_t I, int64_t kk)
      : gu_wr(moe_warps_per_row_tile(int(D / 256))),
        dn_wr(moe_warps_per_row_tile(int(kk * (I / 256)))),
        gu_nw(moe_block_warps(gu_wr)),
        dn_nw(moe_block_warps(dn_wr)),
        gu_partials(size_t(gu_nw / gu_wr) * (D / 256) * 2 * 16),
        dn_partials(size_t(dn_nw / dn_wr) * kk * (I / 256) * 16 + 32) {}  // + the pairs' weights
};

}  // namespace

// The down block holds its token's kk quantized act rows in shared memory (35B: 7 KB), its
// lanes the kk pairs' matrices, and every unit's partial sums; no opt-in above the default 48 KB.
bool quant_tiled_moe_fits(int64_t D, int64_t I, int64_t kk) {
  if (kk < 1 || kk > 32 || D % 256 != 0 || I % 256 != 0 || D > kMaxMoeWidth || I > kMaxMoeWidth) return false;
  const Split sp(D, I, kk);
  return moe_smem<DType::Q4_K_T16>(int(I), int(kk), sp.dn_partials, sp.dn_nw) <= (size_t(48) << 10) &&
         moe_smem<DType::Q4_K_T16>(int(D), 1, sp.gu_partials, sp.gu_nw) <= (size_t(48) << 10);
}

namespace {

// quant_tiled_moe and quant_tiled_moe_rows: out (the weighted sums) or rows / sh_row. T tokens
// of D; k = 0 (rows, with sh): the shared expert's row only, no gate+up launch.
bool tiled_moe(Ctx& c, int64_t T, int64_t D, const Tensor* x, const Tensor* weights, const Tensor& ids,
               const void* const* table, DType gate_up, DType down, int64_t E, int64_t I, Tensor* out,
               const SharedDown* sh, Tensor* rows, Tensor* sh_row) {
  const int64_t k = ids.empty() ? 0 : ids.cols(), P = T * k, kk = k + (sh != nullptr);
  const bool by_rows = out == nullptr;
  if (c.exact_matmul || !dtype_is_tiled(gate_up) || !dtype_is_tiled(down) || T < 1 || kk < 1 || P > kMaxMoePairs ||
      D % 256 != 0 || I % 256 != 0 || D > kMaxMoeWidth || I > kMaxMoeWidth || E < 1 || E >= (int64_t(1) << 30) ||
      (k > 0 && (!x || x->dtype != DType::F32 || !aligned16(x->data) || x->rows() != T || x->cols() != D ||
                 ids.dtype != DType::I32 || ids.rows() != T)) ||
      (!by_rows && (!weights || weights->dtype != DType::F32 || weights->numel() != P || out->dtype != DType::F32 ||
                    out->numel() != T * D)) ||
      (by_rows && k > 0 && (!rows || rows->dtype != DType::F32 || rows->numel() != P * D)) ||
      (by_rows && sh && (!sh_row || sh_row->dtype != DType::F32 || sh_row->numel() != T * D)))
    return false;
  if (!quant_tiled_moe_fits(D, I, kk)) return false;
  const Split sp(D, I, kk);
  const int gu_wr = sp.gu_wr, dn_wr = sp.dn_wr, gu_nw = sp.gu_nw, dn_nw = sp.dn_nw;
  const size_t gu_partials = sp.gu_partials, dn_partials = sp.dn_partials;
  // The shared expert: one more pair of the down kernel, of the routed experts' down type and shape.
  if (sh && !(sh->down.dtype == down && sh->down.rows() == D && sh->down.cols() == I && aligned16(sh->down.data) &&
              sh->gate.dtype == DType::F32 && sh->up.dtype == DType::F32 && sh->gate.numel() == T * I &&
              sh->up.numel() == T * I && aligned16(sh->gate.data) && aligned16(sh->up.data) &&
              (by_rows || (sh->logit.dtype == DType::F32 && sh->logit.numel() == T))))
    return false;
  Temp<float> act(c, size_t(std::max<int64_t>(P, 1) * I));  // the pairs' SwiGLU rows (35B at 256 pairs: 0.5 MB)
  const int32_t* id = k > 0 ? ids.as<const int32_t>() : nullptr;
  const float* w = by_rows ? nullptr : weights->as<const float>();
  MoeArgs dn{act.get(), id, w, table, by_rows ? nullptr : out->as<float>(), int(I), int(D), int(k), int(E), dn_wr};
  if (sh) {
    dn.sh_gate = sh->gate.as<const float>(), dn.sh_up = sh->up.as<const float>();
    dn.sh_down = sh->down.data, dn.sh_logit = by_rows ? nullptr : sh->logit.as<const float>();
  }
  if (by_rows) dn.rows = k > 0 ? rows->as<float>() : nullptr, dn.sh_row = sh ? sh_row->as<float>() : nullptr;
  if (k > 0) {
    MoeArgs gu{x->as<const float>(), id, w, table, act.get(), int(D), int(I), int(k), int(E), gu_wr};
    gu.x_early = ids.data == c.routed_ids;
    with_tiled_dtype(gate_up, [&](auto dt) {
      constexpr DType DT = decltype(dt)::value;
      launch_moe(c, moe_gate_up_kernel<DT>, gu, unsigned(P), moe_smem<DT>(int(D), 1, gu_partials, gu_nw));
    });
  }
  with_tiled_dtype(down, [&](auto dt) {
    constexpr DType DT = decltype(dt)::value;
    launch_moe(c, moe_down_kernel<DT>, dn, unsigned(T), moe_smem<DT>(int(I), int(kk), dn_partials, dn_nw));
  });
  return true;
}

}  // namespace

bool quant_tiled_moe(Ctx& c, const Tensor& x, const Tensor& weights, const Tensor& ids, const void* const* table,
                     DType gate_up, DType down, int64_t E, int64_t I, Tensor& out, const SharedDown* sh) {
  if (ids.empty() || ids.cols() < 1) return false;
  return tiled_moe(c, x.rows(), x.cols(), &x, &weights, ids, table, gate_up, down, E, I, &out, sh, nullptr, nullptr);
}

bool quant_tiled_moe_rows(Ctx& c, int64_t T, int64_t D, const Tensor* x, const Tensor& ids, const void* const* table,
                          DType gate_up, DType down, int64_t E, int64_t I, Tensor* rows, const SharedDown* sh,
                          Tensor* sh_row) {
  return tiled_moe(c, T, D, x, nullptr, ids, table, gate_up, down, E, I, nullptr, sh, rows, sh_row);
}

}  // namespace qwen36::cuda
