#pragma once
// defines: the host side of the 17-64-token Q4_K / Q6_K GEMM on Hopper's warpgroup MMA
// (cuda_quant_wgmma.cu), as the tiled GEMM's dispatch (cuda_quant_mma.cu) calls it.
// Included by .cu files only.

#include <cstddef>
#include <cstdint>

#include "backend/cuda/cuda_ops.cuh"

namespace qwen36::cuda {

// One launch: out = x · wᵀ for up to 4 matrices of one type stored back to back (a stacked tiled
// matrix: matrix m holds row-tiles [rt_end[m − 1], rt_end[m]) and writes out[m], [T, n[m]]),
// x as slabs of np tokens (ActLayout::o_xh with np > 0, written by the activations' producers).
// The row-tiles go in groups of 4 (64 rows, one block's warpgroup), each group's super-blocks
// split in `splits` pieces (wg_splits): where splits > 1, part holds [splits][T][16 · rt] floats
// and cnt one arrival counter per group of 4 row-tiles, zero on entry and left zero.
struct WgArgs {
  const uint8_t* w = nullptr;  // Q4_K_T16 / Q6_K_T16 tiles
  const uint4* xs = nullptr;   // slabs
  float* out[4] = {nullptr, nullptr, nullptr, nullptr};
  int rt_end[4] = {0, 0, 0, 0}, n[4] = {0, 0, 0, 0}, nmat = 1;
  int rt = 0;                  // row-tiles in all (rt_end[nmat − 1])
  float* part = nullptr;
  int* cnt = nullptr;          // null with splits > 1: the pieces are left in part (a test hook sums them)
  int S = 0, T = 0, np = 0, splits = 1;
  uint32_t lbo = 128, sbo = 256;  // the descriptors' byte offsets between core matrices along K, along N
};

// The K splits for rt row-tiles of S super-blocks at T tokens (QWEN36_MMA_WG_SPLITS = N forces N).
int wg_splits(int rt, int S, int T);
// part's floats for a launch (0 where splits == 1).
inline size_t wg_part_floats(const WgArgs& a) { return a.splits > 1 ? size_t(a.splits) * a.T * 16 * size_t(a.rt) : 0; }
// Counters a launch needs (its groups of 4 row-tiles; 0 where splits == 1).
inline int wg_counters(const WgArgs& a) { return a.splits > 1 ? (a.rt + 3) / 4 : 0; }
// Launches the GEMM (launch_pdl on c.stream); t is the tiles' type.
void launch_wgmma(Ctx& c, DType t, const WgArgs& a);

}  // namespace qwen36::cuda
