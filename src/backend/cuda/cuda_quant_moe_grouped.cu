// The grouped form of the routed experts on tiled weights (many pairs: batch decode, short
// prefill chunks; cuda_moe.cu takes it from kMinGroupedPairs). The pair kernels
// (cuda_quant_moe_mma.cu) read each pair's expert matrices, so a step of P pairs reads P
// experts; grouped by expert, a block takes a chunk of up to kGroupCols pairs of one expert as
// the int8 MMA's 8 columns and reads the expert once for all of them (35B-A3B at batch 64: 512
// pairs over ~221 experts). The pairs come sorted by expert from cuda_moe.cu's group_kernel
// (chunks of kGroupCols sorted rows); a column's sums are the pair kernels' to the bit
// (tile_cols: the columns do not mix), so the grouped form writes what moe_down_kernel's rows
// path writes, and a combine pass weights and sums them in pair order as that kernel's block does.
//   gate+up (kGateUp): act [P, N] = silu(gate · x[p / k]) ⊙ (up · x[p / k]);
//   down: rows [P, N] = down · act[p].
// Each call's rows (x, then act) are quantized once (quantize_cols_kernel, the blocks' own
// codes) and copied into the blocks by cp.async.
//
// Two forms of the block, the same arithmetic (QWEN36_MOE_GROUPED_FORM):
//  - pipe (the default since session 47): group_kernel also writes a record per chunk (expert,
//    first row, pairs), one read away; a block takes `loop` row-tile groups of its chunk in turn
//    (QWEN36_MOE_GROUPED_LOOP, 4), the chunk's rows copied in once, and its partial sums in two
//    shared buffers so that one barrier a group separates them. H100, one 35B-A3B Q4_K_M layer
//    (CudaMoe.Time35BLayerTiled), grid -> pipe µs: 128 pairs 134.6 -> 102.0, 256 208.2 -> 148.7,
//    512 283.5 -> 203.0, 1,024 366.0 -> 260.0, 4,096 924.1 -> 673.2.
//  - grid (session 46): grid (row-tile groups, chunk bound), a block computes one group of rpb
//    row-tiles for one chunk. It finds its chunk's expert by a binary search over tile_off
//    (eight dependent L2 reads on 256 experts before its first weight load), and its blocks are
//    short: a chain of tile loads, the rows' copy, 8 MMAs a warp and two barriers.
// In both, warp w of a row-tile takes units (super-blocks) w % wr, + wr, ... of it; a unit's 4
// sums a lane go to shared memory (a column's 16 rows kColStride floats apart: conflict-free
// stores), and the block adds a row's units in super-block order. Pairs with ids outside [0, E)
// are in no chunk (nothing written).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <optional>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_quant_mma_frags.cuh"
#include "backend/cuda/cuda_quant_moe_grouped.cuh"
#include "core/portable_exp.h"

namespace qwen36::cuda {

namespace {

constexpr int kGroupCols = kMoeGroupCols;  // pairs a chunk: the MMA's columns
constexpr int kGroupWarps = 16;            // warps a block, at most (QWEN36_MOE_GROUPED_WARPS: 8 or 16)
constexpr int kColStride = 20;             // floats per column of a unit's partial sums (16 rows + 4 pad)
constexpr int kMaxWidth = 16384;           // D and I bound: a chunk's rows in shared memory
constexpr int64_t kMaxPairs = 65535;       // pairs (and chunks) a call: the grid's y dimension

struct GroupArgs {
  const float* x;            // gate+up: x [T, K] (pair p reads row p / k); down: act [P, K]
  const ColGroup* xq;        // those rows quantized by quantize_cols_kernel, [rows][K / 32]; null: the blocks quantize them
  const void* const* table;  // [E][3]: tiled gate, up, down
  float* out;                // gate+up: act [P, N]; down: rows [P, N]
  int K, N, k, E, wr;        // N rows of K per matrix; wr warps per row-tile
};

struct MoeGroups {
  const int32_t* off;       // [E + 1]: expert e's first sorted row
  const int32_t* tile_off;  // [E + 1]: its first chunk; tile_off[E] chunks in all
  const int32_t* row_pair;  // [P]: sorted row -> pair
  const int4* chunk;        // pipe: [chunk bound] {expert, first sorted row, pairs, 0}, pairs 0 past the last
  int loop;                 // pipe: row-tile groups a block
};

// The source row of a chunk column's pair: gate+up reads x's token row, down the pair's act row.
template <bool kGateUp>
__device__ __forceinline__ int src_row(int pair, int k) {
  return kGateUp ? pair / k : pair;
}

// The chunk's n quantized rows (3 × 16 bytes a group) into xg by cp.async, all in flight at once;
// column col's pair is pair_of[col] (the block's shared copy, or the grouping's row_pair from the
// chunk's first row). Waits for its own copies only: the caller's barrier publishes them.
template <bool kGateUp>
__device__ __forceinline__ void copy_chunk_rows(const GroupArgs& a, const int* pair_of, int n, ColGroup* xg) {
  const int per = 3 * (a.K >> 5);
  const uint32_t base = uint32_t(__cvta_generic_to_shared(xg));
  for (int i = int(threadIdx.x); i < n * per; i += int(blockDim.x)) {
    const int col = i / per;
    const ColGroup* row = a.xq + size_t(src_row<kGateUp>(pair_of[col], a.k)) * (a.K >> 5);
    cpa_16_at<0>(base + 16 * uint32_t(i), reinterpret_cast<const uint8_t*>(row) + 16 * size_t(i - col * per));
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");
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

// The grid form: grid (row-tile groups, chunk bound), block (b, c) computes rows 16·r .. 16·r + 15,
// r = b · rpb + warp / wr, for chunk c's pairs.
template <DType D, bool kGateUp>
__global__ void __launch_bounds__(kGroupWarps * 32) moe_grouped_kernel(const GroupArgs a, const MoeGroups g) {
  constexpr int B = TileLayout<D>::kBytes, M = kGateUp ? 2 : 1, NC = kGroupCols;
  extern __shared__ __align__(16) uint8_t smem[];
  griddep_trigger();
  griddep_wait();  // the grouping, x or act come from the kernels before
  const int c = int(blockIdx.y);
  if (c >= g.tile_off[a.E]) return;  // past the last chunk: the whole block, before any barrier
  int lo = 0, hi = a.E - 1;  // the chunk's expert: the last e with tile_off[e] <= c (a non-empty one)
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (g.tile_off[mid] <= c)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int e = lo;
  const int row0 = g.off[e] + NC * (c - g.tile_off[e]), n = min(NC, g.off[e + 1] - row0);
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5);
  const int S = a.K >> 8, G = a.K >> 5, wr = a.wr, rpb = int(blockDim.x >> 5) / wr, R = a.N >> 4;
  const int r = int(blockIdx.x) * rpb + warp / wr;
  int* pairs = reinterpret_cast<int*>(smem);                             // [NC]: the chunk's pairs
  ColGroup* xg = reinterpret_cast<ColGroup*>(smem + NC * sizeof(int));  // [NC][G]
  float* red = reinterpret_cast<float*>(xg + size_t(NC) * G);            // [rpb][S][M][NC · kColStride]
  float2* tab = reinterpret_cast<float2*>(red + size_t(rpb) * S * M * NC * kColStride) + warp * 16 * kTabStride;

  const bool live = r < R;
  const size_t off = size_t(live ? r : 0) * S * B;
  const uint8_t* w0 = static_cast<const uint8_t*>(a.table[3 * size_t(e) + (kGateUp ? 0 : 2)]) + off;
  const uint8_t* w1 = kGateUp ? static_cast<const uint8_t*>(a.table[3 * size_t(e) + 1]) + off : nullptr;
  int s = warp % wr;  // < S: wr ≤ S
  Raw<D> R0{}, R1{};
  if (live) {
    load_tile<D, true, false>(w0 + size_t(s) * B, lane, R0);
    if constexpr (kGateUp) load_tile<D, true, false>(w1 + size_t(s) * B, lane, R1);
  }
  if (int(threadIdx.x) < NC) pairs[threadIdx.x] = g.row_pair[row0 + min(int(threadIdx.x), n - 1)];
  __syncthreads();
  if (a.xq) {
    copy_chunk_rows<kGateUp>(a, pairs, n, xg);
  } else {
    const int q = G * 8;  // quads a row
    quantize_row_of(
        [&](int id) {
          const int i = id / q;
          const float* src = a.x + size_t(src_row<kGateUp>(pairs[i], a.k)) * a.K;
          return reinterpret_cast<const float4*>(src)[id - i * q];
        },
        n * G, xg);
  }
  __syncthreads();
  // B: this lane's column g (a padding column repeats the last pair; its sums are not written);
  // the epilogue's columns 2t, 2t + 1
  const int t = lane & 3;
  const ColGroup* xb = xg + size_t(min(lane >> 2, n - 1)) * G;
  const ColGroup* xf0 = xg + size_t(min(2 * t, n - 1)) * G;
  const ColGroup* xf1 = xg + size_t(min(2 * t + 1, n - 1)) * G;
  float* mine = red + size_t(warp / wr) * S * M * NC * kColStride;
  if (live) {
    for (;;) {
      float v0[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      tile_cols<D>(R0, xb + s * 8, xf0 + s * 8, xf1 + s * 8, lane, tab, v0);
      store_unit(mine + size_t(M * s) * NC * kColStride, lane, v0);
      if constexpr (kGateUp) {
        float v1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        tile_cols<D>(R1, xb + s * 8, xf0 + s * 8, xf1 + s * 8, lane, tab, v1);
        store_unit(mine + size_t(2 * s + 1) * NC * kColStride, lane, v1);
      }
      s += wr;
      if (s >= S) break;
      load_tile<D, true, false>(w0 + size_t(s) * B, lane, R0);
      if constexpr (kGateUp) load_tile<D, true, false>(w1 + size_t(s) * B, lane, R1);
    }
  }
  __syncthreads();
  store_group<kGateUp>(a, red, pairs, n, rpb, int(blockIdx.x) * rpb);
}

// Whether the pipe form double-buffers a warp's tiles in registers: where the current and the next
// unit's live tiles (gate+up: three, the next up tile loading once the current gate tile's MMAs
// are done; down: two) take at most 72 of the 128 registers two 8-warp blocks a SM leave (Q4_K,
// NVFP4, W4; Q6_K down). Q6_K / Q8_0 gate+up and Q8_0 down (ptxas spilled 92 bytes a thread)
// load the next unit after the current one's MMAs, as the grid form does.
template <DType D, bool kGateUp>
constexpr bool kPipeAhead = (kGateUp ? 3 : 2) * sizeof(Raw<D>) <= 288;

// The pipe form: grid (⌈R / (loop · rpb)⌉, chunk bound), 8 warps; block (b, c) computes row-tile
// groups b · loop .. b · loop + loop − 1 (rpb row-tiles each) for chunk c's pairs. kAhead: a
// warp's next unit loads while it computes the current one (QWEN36_MOE_GROUPED_AHEAD=on, where
// kPipeAhead; ptxas spills 44 bytes a thread for it in the 35B's Q4_K gate+up, and it measured
// slower).
template <DType D, bool kGateUp, bool kAhead>
__global__ void __launch_bounds__(8 * 32, 2) moe_grouped_pipe_kernel(const GroupArgs a, const MoeGroups g) {
  constexpr int B = TileLayout<D>::kBytes, M = kGateUp ? 2 : 1, NC = kGroupCols;
  extern __shared__ __align__(16) uint8_t smem[];
  griddep_trigger();
  griddep_wait();  // the grouping and the quantized rows come from the kernels before
  const int4 rec = g.chunk[blockIdx.y];
  const int e = rec.x, row0 = rec.y, n = rec.z;
  if (n == 0) return;  // past the last chunk: the whole block, before any barrier
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5);
  const int S = a.K >> 8, G = a.K >> 5, wr = a.wr, rpb = int(blockDim.x >> 5) / wr, R = a.N >> 4;
  const int rt0 = int(blockIdx.x) * g.loop * rpb;                  // the block's first row-tile
  const int groups = min(g.loop, (R - rt0 + rpb - 1) / rpb);      // ≥ 1: the grid covers R exactly
  const size_t red_n = size_t(rpb) * S * M * NC * kColStride;      // floats of one group's partial sums
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
  // this warp's unit after (i, s): (i, s + wr), else (i + 1, s0); false past the block's last live one
  auto next = [&](int& i, int& s) {
    if (s + wr < S) {
      s += wr;
    } else {
      ++i, s = s0;
    }
    return i < groups && row_of(i) < R;
  };
  Raw<D> C0{}, C1{}, N0{}, N1{};
  if (row_of(0) < R) {
    load(w0, 0, s0, C0);
    if constexpr (kGateUp) load(w1, 0, s0, C1);
  }
  if (int(threadIdx.x) < NC) pairs[threadIdx.x] = g.row_pair[row0 + min(int(threadIdx.x), n - 1)];
  copy_chunk_rows<kGateUp>(a, g.row_pair + row0, n, xg);  // no barrier since pairs' stores: read from the grouping
  __syncthreads();
  const int t = lane & 3;  // as in the grid form
  const ColGroup* xb = xg + size_t(min(lane >> 2, n - 1)) * G;
  const ColGroup* xf0 = xg + size_t(min(2 * t, n - 1)) * G;
  const ColGroup* xf1 = xg + size_t(min(2 * t + 1, n - 1)) * G;
  for (int i = 0; i < groups; ++i) {
    float* buf = red + size_t(i & 1) * red_n;
    float* mine = buf + size_t(warp / wr) * S * M * NC * kColStride;
    if (row_of(i) < R) {
      for (int s = s0; s < S; s += wr) {
        int ni = i, ns = s;
        const bool more = next(ni, ns);
        // the next unit's up tile loads into the registers the gate tile's MMAs free: three
        // tiles' registers live at a time, not four
        if (kAhead && more) load(w0, ni, ns, N0);
        float v0[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        tile_cols<D>(C0, xb + s * 8, xf0 + s * 8, xf1 + s * 8, lane, tab, v0);
        store_unit(mine + size_t(M * s) * NC * kColStride, lane, v0);
        if constexpr (kGateUp) {
          if (kAhead && more) load(w1, ni, ns, N1);
          float v1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          tile_cols<D>(C1, xb + s * 8, xf0 + s * 8, xf1 + s * 8, lane, tab, v1);
          store_unit(mine + size_t(2 * s + 1) * NC * kColStride, lane, v1);
        }
        if constexpr (kAhead) {
          C0 = N0;
          if constexpr (kGateUp) C1 = N1;
        } else if (more) {
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
// quantize_row's codes (bitwise the blocks' own).
__global__ void __launch_bounds__(256) quantize_cols_kernel(const float* __restrict__ x, int G, ColGroup* __restrict__ out) {
  griddep_trigger();
  griddep_wait();
  quantize_row(x + size_t(blockIdx.x) * G * 32, G, out + size_t(blockIdx.x) * G);
}

// The grouped kernels' warps per row-tile for S units: a power of two (warps / wr row-tiles a block).
int grouped_wr(int S) { return S >= 8 ? 8 : S >= 4 ? 4 : S >= 2 ? 2 : 1; }

// Variant switches (cuda_ops.cuh), −1 not read yet.
std::atomic<int> g_group_warps{-1}, g_group_xq{-1}, g_group_form{-1}, g_group_ahead{-1};
// Warps of a grid-form block: 8 (two blocks a SM by registers; H100, 35B-A3B Q4_K_M tg32 b64
// 2,985 → 3,172 tok/s against 16, one block a SM), QWEN36_MOE_GROUPED_WARPS=16: 16. The pipe
// form's blocks have 8.
int group_warps() { return variant(g_group_warps, "QWEN36_MOE_GROUPED_WARPS", "8", "16") == 2 ? kGroupWarps : 8; }
// Whether the grouped kernels read their rows quantized once per call (QWEN36_MOE_GROUPED_XQ=0:
// each grid-form block quantizes its pairs' f32 rows; the pipe form needs them quantized).
bool group_xq() { return variant(g_group_xq, "QWEN36_MOE_GROUPED_XQ", "1", "0") != 2; }
// The pipe form (QWEN36_MOE_GROUPED_LOOP row-tile groups a block, default 4) unless
// QWEN36_MOE_GROUPED_FORM=grid (or QWEN36_MOE_GROUPED_XQ=0, which the pipe form does not take).
bool group_pipe() { return variant(g_group_form, "QWEN36_MOE_GROUPED_FORM", "grid", "pipe") != 1 && group_xq(); }
// QWEN36_MOE_GROUPED_AHEAD=on: the pipe form with its register double buffer where it fits
// (kPipeAhead). Off by default: the other warps' loads hide a unit's latency as well, and the
// buffer's registers cost (H100, one 35B-A3B layer at 512 pairs: 223.0 µs with it, 203.0 without).
bool group_ahead() { return variant(g_group_ahead, "QWEN36_MOE_GROUPED_AHEAD", "on", "off") == 1; }
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

// Shared memory of a grouped block over K (the rows' width), M matrices (gate+up 2, down 1):
// the chunk's pairs and quantized rows, the partial sums (the pipe form: two groups'), Q4_K's
// and NVFP4's scale tables.
template <DType D>
size_t grouped_smem(int K, int M, bool pipe) {
  const int nw = pipe ? 8 : group_warps(), S = K / 256, rpb = nw / grouped_wr(S);
  return kGroupCols * sizeof(int) + size_t(kGroupCols) * (K / 32) * sizeof(ColGroup) +
         (pipe ? 2 : 1) * size_t(rpb) * S * M * kGroupCols * kColStride * sizeof(float) +
         (table_tile(D) ? size_t(nw) * 16 * kTabStride * sizeof(float2) : 0);
}

template <DType D, bool kGateUp>
void launch_grouped(Ctx& c, const GroupArgs& a, const MoeGroups& g, int64_t chunks) {
  const bool pipe = g.chunk != nullptr;
  constexpr bool kAhead = kPipeAhead<D, kGateUp>;
  auto* kernel = !pipe                   ? moe_grouped_kernel<D, kGateUp>
                 : kAhead && group_ahead() ? moe_grouped_pipe_kernel<D, kGateUp, kAhead>
                                           : moe_grouped_pipe_kernel<D, kGateUp, false>;
  const size_t smem = grouped_smem<D>(a.K, kGateUp ? 2 : 1, pipe);
  static std::atomic<uint64_t> done{0};  // every form's kernel at once
  once_per_device(done, [&] {
    for (auto* k : {moe_grouped_kernel<D, kGateUp>, moe_grouped_pipe_kernel<D, kGateUp, kAhead>,
                    moe_grouped_pipe_kernel<D, kGateUp, false>})
      CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, dev_info().smem_optin));
  });
  const int nw = pipe ? 8 : group_warps(), rpb = nw / a.wr, per_block = rpb * (pipe ? g.loop : 1);
  launch_pdl(kernel, dim3(unsigned((a.N / 16 + per_block - 1) / per_block), unsigned(chunks)), dim3(nw * 32), smem,
             c.stream, a, g);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool quant_tiled_moe_grouped_fits(DType gate_up, DType down, int64_t D, int64_t I) {
  if (!dtype_is_tiled(gate_up) || !dtype_is_tiled(down) || D % 256 != 0 || I % 256 != 0 || D > kMaxWidth ||
      I > kMaxWidth)
    return false;
  const size_t limit = size_t(dev_info().smem_optin);
  const bool pipe = group_pipe();  // the form the call will take
  bool fits = true;
  with_tiled_dtype(gate_up, [&](auto dt) { fits = fits && grouped_smem<decltype(dt)::value>(int(D), 2, pipe) <= limit; });
  with_tiled_dtype(down, [&](auto dt) { fits = fits && grouped_smem<decltype(dt)::value>(int(I), 1, pipe) <= limit; });
  return fits;
}

bool moe_grouped_chunk_records() { return group_pipe(); }

void moe_grouped_form_select(const char* form, int loop, const char* ahead) {
  g_group_form.store(form ? parse_variant(form, "grid", "pipe") : -1);
  g_group_loop.store(loop >= 1 && loop <= 64 ? loop : -1);
  g_group_ahead.store(ahead ? parse_variant(ahead, "on", "off") : -1);
}

void quant_tiled_moe_grouped(Ctx& c, const Tensor& x, const Tensor& ids, const void* const* table, DType gate_up,
                             DType down, int64_t E, int64_t I, const MoeGrouping& grouping, Tensor& rows) {
  const int64_t T = x.rows(), D = x.cols(), k = ids.cols(), P = T * k;
  QWEN36_CHECK(quant_tiled_moe_grouped_fits(gate_up, down, D, I) && x.dtype == DType::F32 && aligned16(x.data) &&
                   ids.rows() == T && P <= kMaxPairs && grouping.chunks <= kMaxPairs && rows.dtype == DType::F32 &&
                   rows.numel() == P * D,
               "quant_tiled_moe_grouped: x {} top-{} of {} / {} experts is not a shape it takes", x.shape_str(), k,
               dtype_name(gate_up), dtype_name(down));
  if (P == 0) return;
  // the pipe form where it was asked for and the grouping wrote its chunk records
  const bool pipe = grouping.chunk != nullptr && group_pipe();
  const MoeGroups g{grouping.off, grouping.tile_off, grouping.row_pair, pipe ? grouping.chunk : nullptr, group_loop()};
  Temp<float> act(c, size_t(P * I));
  GroupArgs gu{x.as<const float>(), nullptr, table, act.get(), int(D), int(I), int(k), int(E), grouped_wr(int(D / 256))};
  GroupArgs dn{act.get(), nullptr, table, rows.as<float>(), int(I), int(D), int(k), int(E), grouped_wr(int(I / 256))};
  const bool xq = pipe || group_xq();
  std::optional<Temp<ColGroup>> xqs, aqs;
  auto quantize = [&](const float* src, int64_t n, int64_t K, std::optional<Temp<ColGroup>>& dst) {
    dst.emplace(c, size_t(n * (K / 32)));
    launch_pdl(quantize_cols_kernel, dim3(unsigned(n)), dim3(256), 0, c.stream, src, int(K / 32), dst->get());
    return dst->get();
  };
  if (xq) gu.xq = quantize(x.as<const float>(), T, D, xqs);
  with_tiled_dtype(gate_up, [&](auto dt) { launch_grouped<decltype(dt)::value, true>(c, gu, g, grouping.chunks); });
  if (xq) dn.xq = quantize(act.get(), P, I, aqs);
  with_tiled_dtype(down, [&](auto dt) { launch_grouped<decltype(dt)::value, false>(c, dn, g, grouping.chunks); });
}

}  // namespace qwen36::cuda
