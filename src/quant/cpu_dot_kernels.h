#pragma once
// defines: DotFn, DotKernel, DotTable, DotIsa, dot_isa, the SIMD files' kernel lists (internal
// to quant/)
//
// Each SIMD file lists the weight types it accelerates; cpu_dot.cpp (and cpu_dot_g32.cpp for
// per-32 activations) picks, per type, the widest one the CPU supports. A list is empty when the
// file was compiled for another ISA.

#include <cstdint>
#include <span>
#include <string_view>

#include "core/dtype.h"

namespace qwen36 {

using DotFn = float (*)(const void* wrow, const void* act, int64_t n);

struct DotKernel {
  DType type;
  DotFn fn;
};

// Per weight type, the kernel chosen and the name of its ISA (no kernel: fn is null).
struct DotTable {
  static constexpr int kTypes = 64;  // room for every DType
  DotFn fn[kTypes] = {};
  std::string_view name[kTypes] = {};
  // The kernels of `ks` replace earlier choices for their types.
  void add(std::span<const DotKernel> ks, std::string_view isa) {
    for (const DotKernel& k : ks)
      if (k.fn) fn[int(k.type)] = k.fn, name[int(k.type)] = isa;
  }
};
static_assert(int(kLastDType) < DotTable::kTypes);

// The widest kernel set to use: what the CPU has, capped by QWEN36_CPU_ISA=scalar|avx2 (read
// once; benchmarks, and ruling out a SIMD bug).
enum class DotIsa { Scalar, Avx2, Avx512Vnni };
DotIsa dot_isa();

std::span<const DotKernel> avx2_dot_kernels();
std::span<const DotKernel> avx512_dot_kernels();  // call only when the CPU has AVX-512 VNNI
std::span<const DotKernel> hf_avx2_dot_kernels();  // the Hugging Face checkpoint types (cpu_dot_hf.cpp)
// Kernels against per-32 int8 activations (cpu_dot_g32.h's BlockQ8G32 rows), same rules.
std::span<const DotKernel> avx2_g32_kernels();
std::span<const DotKernel> avx512_g32_kernels();  // call only when the CPU has AVX-512 VNNI

}  // namespace qwen36
