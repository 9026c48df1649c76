#pragma once
// defines: DotFn, DotKernel, avx2_dot_kernels, avx512_dot_kernels (internal to quant/)
//
// Each SIMD file lists the weight types it accelerates; cpu_dot.cpp picks, per type, the
// widest one the CPU supports. A list is empty when the file was compiled for another ISA.

#include <cstdint>
#include <span>

#include "core/dtype.h"

namespace qwen36 {

using DotFn = float (*)(const void* wrow, const void* act, int64_t n);

struct DotKernel {
  DType type;
  DotFn fn;
};

std::span<const DotKernel> avx2_dot_kernels();
std::span<const DotKernel> avx512_dot_kernels();  // call only when the CPU has AVX-512 VNNI
std::span<const DotKernel> hf_avx2_dot_kernels();  // the Hugging Face checkpoint types (cpu_dot_hf.cpp)

}  // namespace qwen36
