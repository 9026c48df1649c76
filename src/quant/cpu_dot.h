#pragma once
// defines: dot_activation_type, quantize_activation, dot_row, dot_rows, dot_row_reference,
//          dot_kernel_name
//
// The CPU backend's matmul multiplies each weight row with each activation row through
// dot_row. Quantized weights are multiplied with activations quantized once per row to the
// matching 8-bit type (as llama.cpp does), so the inner loop is an integer dot product:
//   Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 weights  x  Q8_0 activations
//   Q4_K/Q5_K/Q6_K/Q8_K/IQ4_XS       x  Q8_K activations
//   F32/F16/BF16                     x  F32 activations
// Fast paths: AVX2+FMA (the x86-64-v3 baseline) for every type; AVX-512 VNNI for the types
// used in practice when the CPU has it (chosen once at run time). Builds for other ISAs use
// the scalar path (dequantize a block of both rows, multiply in float). The environment variable
// QWEN36_CPU_ISA=avx2 or =scalar caps the choice (read once, at the first dot product).
// Row pointers must be 4-byte aligned for Q8_K activations (quantize_activation's output is).

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/dtype.h"

namespace qwen36 {

// Activation type a weight type is multiplied with: Q8_0 for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, Q8_K for
// the K-quants and IQ4_XS, F32 for F32/F16/BF16.
DType dot_activation_type(DType weight);

// Converts an f32 activation row to `act` (Q8_0, Q8_K or F32). n: a multiple of act's block size;
// dst holds dtype_row_bytes(act, n) bytes.
void quantize_activation(DType act, const float* x, void* dst, int64_t n);

// One weight row (n elements of type `weight`) times one activation row (n elements of
// dot_activation_type(weight), as written by quantize_activation).
float dot_row(DType weight, const void* wrow, const void* act, int64_t n);

// One weight row times `rows` activation rows (act + r·act_stride): out[r·out_stride] for r < rows,
// each bitwise dot_row's result. Where the CPU's kernel set has a four-row kernel for the type,
// each four rows share one decoding of the weight row (prefill's many tokens against one row).
void dot_rows(DType weight, const void* wrow, const void* act, size_t act_stride, int64_t rows, int64_t n,
              float* out, size_t out_stride);

// The definition dot_row is tested against: both rows dequantized to float, summed in double.
double dot_row_reference(DType weight, const void* wrow, const void* act, int64_t n);

// Which implementation dot_row uses for `weight` on this CPU ("avx2", "avx512vnni", "scalar").
std::string_view dot_kernel_name(DType weight);

}  // namespace qwen36
