#pragma once
// The grouped form of the routed experts on tiled weights (cuda_quant_moe_grouped.cu; cuda_moe.cu
// groups the pairs and calls it). Included by .cu only.

#include <cstdint>

#include "backend/cuda/cuda_ops.cuh"

namespace qwen36::cuda {

// The grouped form of the routed experts (many pairs; cuda_quant_moe_grouped.cu): pairs sorted by
// expert on the device in chunks of up to kMoeGroupCols of one expert, each chunk's expert read
// once for its pairs. From cuda_moe.cu's group_kernel with bm = moe_grouped_cols(): row_pair [P],
// sorted row -> pair; chunk [chunks], chunk c's {expert, first sorted row, pairs, 0}, pairs 0
// past the last; chunks: a bound on their number known on the host (the launch's size).
constexpr int kMoeGroupCols = 16;
// Pairs a chunk for group_kernel: QWEN36_MOE_GROUPED_COLS=8 (one set of columns a chunk, session
// 46's chunks), else kMoeGroupCols.
int moe_grouped_cols();
struct MoeGrouping {
  const int32_t* row_pair;
  const int4* chunk;
  int64_t chunks;
};
// Whether the grouped kernels take these types and shapes (shared memory within the opt-in).
bool quant_tiled_moe_grouped_fits(DType gate_up, DType down, int64_t D, int64_t I);
// rows [T·k, D]: row t·k + j = expert ids[t, j]'s down · SwiGLU(gate, up) of x[t], bitwise
// quant_tiled_moe_rows's rows (ids outside [0, E): untouched). Four launches: x quantized,
// gate+up, their rows quantized, down.
void quant_tiled_moe_grouped(Ctx&, const Tensor& x, const Tensor& ids, const void* const* table, DType gate_up,
                             DType down, int64_t I, const MoeGrouping& grouping, Tensor& rows);

}  // namespace qwen36::cuda
