#pragma once
// defines: dot_exact_supported, dot_row_exact, dot_rows_exact, dot_row_exact_scalar,
//          dot_exact_kernel_name
//
// Dot products of GGUF weight rows (Q4_K, Q6_K, Q8_0, plain block layout) with per-32 int8
// activations (BlockQ8G32) that give, bit for bit, the floats of the CUDA backend's int8
// tensor-core kernels on the tiled copies of the same weights (cuda_quant_mma_frags.cuh,
// tile_row): the same integer sums per 32-group and the same f32 roundings in the same order.
// dot_row_g32 (cpu_dot_g32.h) has the GPU's integer sums too but scales and sums them in its own
// order (~1e-7 relative apart); a row computed on the host (expert offload) can then differ from
// the device's by a last bit, and so flip a greedy token. Per row of n = 256·S values:
//
//   v = 0; for each super-block s: p = 0; for each group jj = 0..7 (values 32·jj .. +31):
//     fx = act[s].d[jj], fy = act[s].ds[jj], x = the group's int8 codes
//     Q4_K: p = fma(d·sc, fx · c, fma(−dmin·m, fy, p))      c = Σ q·x, q the 4-bit codes
//     Q6_K: p = fma(d · fx, sa·ca + sb·cb, p)               ca, cb = Σ (q − 32)·x per 16,
//                                                             sa, sb = scales[2jj], [2jj + 1]
//     Q8_0: p = fma(d_b · fx, c, p)                         b = GGUF block 8·s + jj, c = Σ q·x
//   and v = v + p after the super-block's 8 groups.
//
// tile_row, started from 0 per tile, gives one super-block's p (a tile: 16 rows × 256); v,
// the tiles added in super-block order from 0, is the order the device's callers must keep.
// Every product, sum and conversion is one f32 rounding (round to nearest, the ints converted
// after exact integer sums), fma a single one: the scalar definition, the AVX2 kernel (8 rows in
// the 8 lanes of a vector, each lane running the same sequence) and the AVX-512 VNNI one (16 rows
// in 16 lanes) agree bitwise. Activations are assumed as quantize_activation_g32 writes them
// (codes within ±127, ds and hsums the codes' sums: the SIMD kernels and the device's MMA take
// Q6_K's −32 through hsums, the AVX-512 kernel Q8_0's +128 offset too, the definition neither).

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/dtype.h"
#include "quant/cpu_dot_g32.h"

namespace qwen36 {

bool dot_exact_supported(DType weight);  // Q4_K, Q6_K, Q8_0

// The value above for one row (n a multiple of 256; act holds n / 256 blocks).
float dot_row_exact(DType weight, const void* wrow, const BlockQ8G32* act, int64_t n);

// `rows` consecutive rows (row r at w + r·row_bytes; the GPU's tiles hold 16) against one
// activation row: out[r] is bitwise dot_row_exact of row r. The AVX-512 kernel takes 16 rows per
// pass, the AVX2 one 8 (a short pass costs a full one), so this, with rows a multiple of 16, is
// the fast call; dot_row_exact alone costs about what a pass does.
void dot_rows_exact(DType weight, const void* w, size_t row_bytes, int rows, const BlockQ8G32* act, int64_t n,
                    float* out);

// The plain C++ definition the SIMD kernels are tested against; QWEN36_CPU_ISA=scalar makes the
// calls above use it (=avx2 caps them at the AVX2 kernel).
float dot_row_exact_scalar(DType weight, const void* wrow, const BlockQ8G32* act, int64_t n);

// "avx512vnni", "avx2" or "scalar": the kernel dot_rows_exact uses (dot_isa()'s choice, as
// dot_g32_kernel_name).
std::string_view dot_exact_kernel_name(DType weight);

}  // namespace qwen36
