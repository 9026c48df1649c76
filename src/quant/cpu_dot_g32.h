#pragma once
// defines: BlockQ8G32, dot_g32_supported, g32_row_bytes, quantize_activation_g32, dot_row_g32,
//          dot_row_g32_reference, dot_g32_kernel_name
//
// The CUDA backend's int8 activations on the CPU. Its GEMVs and tensor-core GEMMs of GGUF
// weights quantize an activation row per 32 values (cuda_quant_blocks.cuh's quantize_quad:
// d = amax / 127 in f32, codes rounded to nearest even); the CPU's own dot products use Q8_K
// (one f32 scale per 256, llama.cpp's choice, cpu_dot.h). Routed experts computed on the host
// (expert offload, cpu::MoePass) use this form instead, with the very codes and scales the GPU
// would use: the integer sums are the GPU's exactly, and the outputs differ from the GPU's by
// f32 summation order only (~1e-7 relative, against ~5e-3 with Q8_K activations). Weight types:
// Q4_K, Q5_K, Q6_K, Q8_0 (the types of GGUF files' routed experts); rows a multiple of 256.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/dtype.h"

namespace qwen36 {

// 256 activations as 8 groups of 32. ds and hsums are what the weight types' offsets need
// (Q4_K / Q5_K mins: d · Σq per group; Q6_K's −32: Σq per 16), and dpair the scales as the
// AVX-512 kernels multiply 64 values at a time (lanes 0-7 group 2c, lanes 8-15 group 2c + 1):
// computed once per activation row rather than once per weight row.
struct BlockQ8G32 {
  float d[8];
  float ds[8];
  int16_t hsums[16];
  int8_t qs[256];
  float dpair[4][16];
};
static_assert(sizeof(BlockQ8G32) == 608);

bool dot_g32_supported(DType weight);
inline size_t g32_row_bytes(int64_t n) { return size_t(n / 256) * sizeof(BlockQ8G32); }

// x[0 .. n) into n / 256 blocks at dst (n a multiple of 256; dst 4-byte aligned).
void quantize_activation_g32(const float* x, void* dst, int64_t n);

// One weight row (n elements of a dot_g32_supported type) times one such activation row.
float dot_row_g32(DType weight, const void* wrow, const void* act, int64_t n);

// The definition dot_row_g32 is tested against: both rows dequantized, summed in double.
double dot_row_g32_reference(DType weight, const void* wrow, const void* act, int64_t n);

// "avx512vnni", "avx2" or "scalar" (QWEN36_CPU_ISA caps it as for dot_row).
std::string_view dot_g32_kernel_name(DType weight);

}  // namespace qwen36
