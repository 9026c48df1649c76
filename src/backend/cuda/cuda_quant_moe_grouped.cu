// The grouped form of the routed experts on tiled weights (many pairs: batch decode, prefill
// chunks; cuda_moe.cu takes it from kMinGroupedPairs). The pair kernels (cuda_quant_moe_mma.cu)
// read each pair's expert matrices, so a step of P pairs reads P experts; grouped by expert, a
// block takes a chunk of up to kGroupCols (16) pairs of one expert as the columns of one or two
// sets of the int8 MMA's 8 (a tile's fragments unpacked once for both: tile_cols2) and reads the
// expert once for all of them (35B-A3B at batch 64: 512 pairs over ~221 experts). The
// pairs come sorted by expert from cuda_moe.cu's group_kernel (chunks of kGroupCols sorted rows,
// a record per chunk: its expert, first row and pairs); a column's sums are the pair kernels' to
// the bit (tile_cols: the columns do not mix), so the grouped form writes what moe_down_kernel's
// rows path writes, and a combine pass weights and sums them in pair order as that kernel's
// block does.
//   gate+up (kGateUp): act [P, N] = silu(gate · x[p / k]) ⊙ (up · x[p / k]);
//   down: rows [P, N] = down · act[p].
// Each call's rows (x, then act) are quantized once (quantize_cols_kernel, the blocks' own
// codes). grid (⌈R / (loop · rpb)⌉, chunk bound), 8 warps: block (b, c) reads chunk c's record
// (one read before its first weight load), copies the chunk's rows into shared memory once
// (cp.async) and computes row-tile groups b · loop .. b · loop + loop − 1 (rpb row-tiles each, 16
// rows a row-tile) in turn. Warp w of a row-tile takes units (super-blocks) w % wr, + wr, ... of
// it; a unit's 4 sums a lane go to shared memory (a column's 16 rows kColStride floats apart:
// conflict-free stores), and the block adds a row's units in super-block order. The partial sums
// are double-buffered, so one barrier a group separates them. Pairs with ids outside [0, E) are
// in no chunk (nothing written).
// Session 46's form, a block a (row-tile group, chunk), binary-searched tile_off for its expert
// (eight dependent L2 reads on 256 experts before its first weight load) and ran a short chain
// (tile loads, the rows' copy, 8 MMAs a warp, two barriers); H100, one 35B-A3B Q4_K_M layer
// (CudaMoe.Time35BLayerTiled), that form -> this one, µs: 128 pairs 134.6 -> 102.0, 512 283.5 ->
// 203.0, 1,024 366.0 -> 260.0, 4,096 924.1 -> 673.2. Loading each warp's next unit in registers
// while it computed the current one measured slower (512 pairs 223.0 µs: ptxas spilled for it;
// the other warps' loads hide a unit's latency as well).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_quant_mma_frags.cuh"
#include "backend/cuda/cuda_quant_moe_grouped.cuh"
#include "core/portable_exp.h"

namespace qwen36::cuda {

namespace {

constexpr int kGroupCols = kMoeGroupCols;  // pairs a chunk: two sets of the MMA's 8 columns
constexpr int kGroupWarps = 8;             // warps a block: two blocks a SM by registers
constexpr int kColStride = 20;             // floats per column of a unit's partial sums (16 rows + 4 pad)
constexpr int kMaxWidth = 16384;           // D and I bound: a chunk's rows in shared memory
constexpr int64_t kMaxPairs = 65535;       // pairs (and chunks) a call: the grid's y dimension

struct GroupArgs {
  const ColGroup* xq;        // gate+up: x [T, K] (pair p reads row p / k), down: act [P, K], quantized by quantize_cols_kernel
  const void* const* table;  // [E][3]: tiled gate, up, down
  float* out;                // gate+up: act [P, N]; down: rows [P, N]
  int K, N, k, wr;           // N rows of K per matrix; wr warps per row-tile
};

struct MoeGroups {
  const int32_t* row_pair;  // [P]: sorted row -> pair
  const int4* chunk;        // [chunk bound] {expert, first sorted row, pairs, 0}, pairs 0 past the last
  int loop;                 // row-tile groups a block
};

// The source row of a chunk column's pair: gate+up reads x's token row, down the pair's act row.
template <bool kGateUp>
__device__ __forceinline__ int src_row(int pair, int k) {
  return kGateUp ? pair / k : pair;
}

// A unit's 4 sums of this lane (rows g, g + 8 of columns 2t, 2t + 1) into its slot.
__device__ __forceinline__ void store_unit(float* slot, int lane, const float (&v)[4]) {
  const int g = lane >> 2, t = lane & 3;
  slot[(2 * t) * kColStride + g] = v[0], slot[(2 * t + 1) * kColStride + g] = v[1];
  slot[(2 * t) * kColStride + g + 8] = v[2], slot[(2 * t + 1) * kColStride + g + 8] = v[3];
}

// A group's outputs from its partial sums red [rpb][S][M][NC · kColStride]: row-tile rt of the
// group is rt_base + rt; a thread per (column, row-tile, row), 16 consecutive threads writing 16
// consecutive floats; a row's units added in super-block order (the canonical order).
template <bool kGateUp>
__device__ __forceinline__ void store_group(const GroupArgs& a, const float* red, const int* pairs, int n, int rpb,
                                            int rt_base) {
  constexpr int M = kGateUp ? 2 : 1, NC = kGroupCols;
  const int S = a.K >> 8, R = a.N >> 4;
  for (int i = int(threadIdx.x); i < NC * rpb * 16; i += int(blockDim.x)) {
    const int row = i & 15, rt = (i >> 4) % rpb, col = i / (16 * rpb), ro = rt_base + rt;
    if (col >= n || ro >= R) continue;
    const float* pr = red + size_t(rt) * S * M * NC * kColStride + col * kColStride + row;
    float* dst = a.out + size_t(pairs[col]) * a.N + 16 * size_t(ro) + row;
    if constexpr (kGateUp) {
      float gate = 0.0f, up = 0.0f;
      for (int u = 0; u < S; ++u) gate += pr[(2 * u) * NC * kColStride], up += pr[(2 * u + 1) * NC * kColStride];
      *dst = silu_portable(gate) * up;
    } else {
      float y = 0.0f;
      for (int u = 0; u < S; ++u) y += pr[u * NC * kColStride];
      *dst = y;
    }
  }
}

template <DType D, bool kGateUp>
__global__ void __launch_bounds__(kGroupWarps * 32, 2) moe_grouped_kernel(const GroupArgs a, const MoeGroups g) {
  constexpr int B = TileLayout<D>::kBytes, M = kGateUp ? 2 : 1, NC = kGroupCols;
  extern __shared__ __align__(16) uint8_t smem[];
  griddep_trigger();
  griddep_wait();  // the grouping and the quantized rows come from the kernels before
  const int4 rec = g.chunk[blockIdx.y];
  const int e = rec.x, row0 = rec.y, n = rec.z;
  if (n == 0) return;  // past the last chunk: the whole block, before any barrier
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5);
  const int S = a.K >> 8, G = a.K >> 5, wr = a.wr, rpb = int(blockDim.x >> 5) / wr, R = a.N >> 4;
  const int rt0 = int(blockIdx.x) * g.loop * rpb;              // the block's first row-tile
  const int groups = min(g.loop, (R - rt0 + rpb - 1) / rpb);  // ≥ 1: the grid covers R exactly
  const size_t red_n = size_t(rpb) * S * M * NC * kColStride;  // floats of one group's partial sums
  int* pairs = reinterpret_cast<int*>(smem);                             // [NC]: the chunk's pairs
  ColGroup* xg = reinterpret_cast<ColGroup*>(smem + NC * sizeof(int));  // [NC][G]
  float* red = reinterpret_cast<float*>(xg + size_t(NC) * G);            // [2][red_n]: groups i, i + 1
  float2* tab = reinterpret_cast<float2*>(red + 2 * red_n) + warp * 16 * kTabStride;

  const uint8_t* w0 = static_cast<const uint8_t*>(a.table[3 * size_t(e) + (kGateUp ? 0 : 2)]);
  const uint8_t* w1 = kGateUp ? static_cast<const uint8_t*>(a.table[3 * size_t(e) + 1]) : nullptr;
  const int s0 = warp % wr;  // < S: wr ≤ S
  auto row_of = [&](int i) { return rt0 + i * rpb + warp / wr; };  // this warp's row-tile in group i
  auto load = [&](const uint8_t* w, int i, int s, Raw<D>& T) {
    load_tile<D, true, false>(w + (size_t(row_of(i)) * S + s) * B, lane, T);
  };
  Raw<D> C0{}, C1{};
  if (row_of(0) < R) {
    load(w0, 0, s0, C0);
    if constexpr (kGateUp) load(w1, 0, s0, C1);
  }
  if (int(threadIdx.x) < NC) pairs[threadIdx.x] = g.row_pair[row0 + min(int(threadIdx.x), n - 1)];
  {  // the chunk's n quantized rows (3 × 16 bytes a group), all in flight at once; their pairs
     // read from the grouping (no barrier since the stores to `pairs`)
    const int per = 3 * G;
    const uint32_t base = smem_addr(xg);
    for (int i = int(threadIdx.x); i < n * per; i += int(blockDim.x)) {
      const int col = i / per;
      const ColGroup* row = a.xq + size_t(src_row<kGateUp>(g.row_pair[row0 + col], a.k)) * G;
      cp_async16_at<0>(base + 16 * uint32_t(i), reinterpret_cast<const uint8_t*>(row) + 16 * size_t(i - col * per));
    }
    cp_async_wait_all();
  }
  __syncthreads();
  // Column set h (pairs 8h .. 8h + 7; the second only where the chunk has more than 8): this
  // lane's B column g, its C columns 2t, 2t + 1 (a padding column repeats the last pair; its sums
  // are not written). Offsets in ColGroups; super-block s's groups start 8·s further.
  const int t = lane & 3;
  const bool two = n > 8;
  int xo[2][3];
  for (int h = 0; h < 2; ++h) {
    xo[h][0] = min(8 * h + (lane >> 2), n - 1) * G;
    xo[h][1] = min(8 * h + 2 * t, n - 1) * G;
    xo[h][2] = min(8 * h + 2 * t + 1, n - 1) * G;
  }
  // A tile against the chunk's columns (both sets: one unpacking of its fragments) into slot.
  auto unit = [&](const Raw<D>& W, int s, float* slot) {
    const ColGroup* x[2][3];
    for (int h = 0; h < 2; ++h)
      for (int q = 0; q < 3; ++q) x[h][q] = xg + xo[h][q] + s * 8;
    float v[2][4] = {};
    tile_cols2<D>(W, x, two, lane, tab, v);
    store_unit(slot, lane, v[0]);
    if (two) store_unit(slot + 8 * kColStride, lane, v[1]);
  };
  for (int i = 0; i < groups; ++i) {
    float* buf = red + size_t(i & 1) * red_n;
    float* mine = buf + size_t(warp / wr) * S * M * NC * kColStride;
    if (row_of(i) < R) {
      for (int s = s0; s < S; s += wr) {
        unit(C0, s, mine + size_t(M * s) * NC * kColStride);
        if constexpr (kGateUp) unit(C1, s, mine + size_t(2 * s + 1) * NC * kColStride);
        // this warp's next unit: (i, s + wr), else (i + 1, s0) if the block has it
        const int ni = s + wr < S ? i : i + 1, ns = s + wr < S ? s + wr : s0;
        if (ni < groups && row_of(ni) < R) {
          load(w0, ni, ns, C0);
          if constexpr (kGateUp) load(w1, ni, ns, C1);
        }
      }
    }
    // Group i's sums complete; group i + 1 writes the other buffer, so no second barrier: group
    // i + 2 writes this one only after the next barrier, which every thread reaches after its
    // share of this store.
    __syncthreads();
    store_group<kGateUp>(a, buf, pairs, n, rpb, rt0 + i * rpb);
  }
}

// Rows [n, 32·G] quantized once per call for the grouped blocks (gate+up: x, every chunk of a
// token's pairs reads its row; down: act, every row-tile group of a chunk reads its pairs'):
// 48 bytes per 32 values instead of 128 of f32, and no quantization per block. A block per row,
// quantize_row's codes.
__global__ void __launch_bounds__(256) quantize_cols_kernel(const float* __restrict__ x, int G, ColGroup* __restrict__ out) {
  griddep_trigger();
  griddep_wait();
  quantize_row(x + size_t(blockIdx.x) * G * 32, G, out + size_t(blockIdx.x) * G);
}

// Warps per row-tile for S units: a power of two (kGroupWarps / wr row-tiles a block).
int grouped_wr(int S) { return S >= 8 ? 8 : S >= 4 ? 4 : S >= 2 ? 2 : 1; }

// Row-tile groups a block: QWEN36_MOE_GROUPED_LOOP (1-64), default 4. H200, one 35B-A3B layer,
// loop 2 / 4 / 8, µs: 256 pairs 152.5 / 136.2 / 142.7, 512 209.4 / 189.6 / 194.0, 4,096 745.8 /
// 682.9 / 666.5. −1: not read yet (moe_grouped_loop_select stores a choice for tests).
std::atomic<int> g_group_loop{-1};
int group_loop() {
  int n = g_group_loop.load(std::memory_order_relaxed);
  if (n < 0) {
    const char* v = std::getenv("QWEN36_MOE_GROUPED_LOOP");
    const int x = v ? std::atoi(v) : 0;
    n = x >= 1 && x <= 64 ? x : 4;
    g_group_loop.store(n, std::memory_order_relaxed);
  }
  return n;
}

// Shared memory of a block over K (the rows' width), M matrices (gate+up 2, down 1): the chunk's
// pairs and quantized rows, two groups' partial sums, Q4_K's and NVFP4's scale tables.
template <DType D>
size_t grouped_smem(int K, int M) {
  const int S = K / 256, rpb = kGroupWarps / grouped_wr(S);
  return kGroupCols * sizeof(int) + size_t(kGroupCols) * (K / 32) * sizeof(ColGroup) +
         2 * size_t(rpb) * S * M * kGroupCols * kColStride * sizeof(float) +
         (table_tile(D) ? size_t(kGroupWarps) * 16 * kTabStride * sizeof(float2) : 0);
}

template <DType D, bool kGateUp>
void launch_grouped(Ctx& c, const GroupArgs& a, const MoeGroups& g, int64_t chunks) {
  auto* kernel = moe_grouped_kernel<D, kGateUp>;
  static std::atomic<uint64_t> done{0};
  once_per_device(done, [&] {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dev_info().smem_optin));
  });
  const int per_block = kGroupWarps / a.wr * g.loop;  // row-tiles
  launch_pdl(kernel, dim3(unsigned((a.N / 16 + per_block - 1) / per_block), unsigned(chunks)),
             dim3(kGroupWarps * 32), grouped_smem<D>(a.K, kGateUp ? 2 : 1), c.stream, a, g);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool quant_tiled_moe_grouped_fits(DType gate_up, DType down, int64_t D, int64_t I) {
  if (!dtype_is_tiled(gate_up) || !dtype_is_tiled(down) || D % 256 != 0 || I % 256 != 0 || D > kMaxWidth ||
      I > kMaxWidth)
    return false;
  const size_t limit = size_t(dev_info().smem_optin);
  bool fits = true;
  with_tiled_dtype(gate_up, [&](auto dt) { fits = fits && grouped_smem<decltype(dt)::value>(int(D), 2) <= limit; });
  with_tiled_dtype(down, [&](auto dt) { fits = fits && grouped_smem<decltype(dt)::value>(int(I), 1) <= limit; });
  return fits;
}

void moe_grouped_loop_select(int loop) { g_group_loop.store(loop >= 1 && loop <= 64 ? loop : -1); }

int moe_grouped_cols() {
  static const int n = [] {
    const char* v = std::getenv("QWEN36_MOE_GROUPED_COLS");
    return v && std::atoi(v) == 8 ? 8 : kGroupCols;
  }();
  return n;
}

void quant_tiled_moe_grouped(Ctx& c, const Tensor& x, const Tensor& ids, const void* const* table, DType gate_up,
                             DType down, int64_t I, const MoeGrouping& grouping, Tensor& rows) {
  const int64_t T = x.rows(), D = x.cols(), k = ids.cols(), P = T * k;
  QWEN36_CHECK(quant_tiled_moe_grouped_fits(gate_up, down, D, I) && x.dtype == DType::F32 && aligned16(x.data) &&
                   ids.rows() == T && P <= kMaxPairs && grouping.chunks <= kMaxPairs && rows.dtype == DType::F32 &&
                   rows.numel() == P * D,
               "quant_tiled_moe_grouped: x {} top-{} of {} / {} experts is not a shape it takes", x.shape_str(), k,
               dtype_name(gate_up), dtype_name(down));
  if (P == 0) return;
  const MoeGroups g{grouping.row_pair, grouping.chunk, group_loop()};
  Temp<float> act(c, size_t(P * I));
  Temp<ColGroup> xq(c, size_t(T * (D / 32))), aq(c, size_t(P * (I / 32)));
  launch_pdl(quantize_cols_kernel, dim3(unsigned(T)), dim3(256), 0, c.stream, x.as<const float>(), int(D / 32), xq.get());
  const GroupArgs gu{xq.get(), table, act.get(), int(D), int(I), int(k), grouped_wr(int(D / 256))};
  with_tiled_dtype(gate_up, [&](auto dt) { launch_grouped<decltype(dt)::value, true>(c, gu, g, grouping.chunks); });
  launch_pdl(quantize_cols_kernel, dim3(unsigned(P)), dim3(256), 0, c.stream, act.get(), int(I / 32), aq.get());
  const GroupArgs dn{aq.get(), table, rows.as<float>(), int(I), int(D), int(k), grouped_wr(int(I / 256))};
  with_tiled_dtype(down, [&](auto dt) { launch_grouped<decltype(dt)::value, false>(c, dn, g, grouping.chunks); });
}

}  // namespace qwen36::cuda
