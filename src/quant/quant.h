#pragma once
// defines: dequantize_row, quantize_row, quantize_supported
//
// Reference (scalar, portable) conversions between float rows and GGUF block types. They are
// the ground truth the fast CPU dot products are tested against; speed is secondary.
// `n` must be a multiple of the type's block size (dtype_block_elems); F32/F16/BF16 work too.

#include <cstdint>

#include "core/dtype.h"

namespace qwen36 {

// Every DType except I32, U8 and I64.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_XS, F8_E4M3
// (the Hugging Face checkpoint types of quant/hf_blocks.h are only ever loaded).
bool quantize_supported(DType t);
void quantize_row(DType t, const float* src, void* dst, int64_t n);

}  // namespace qwen36
