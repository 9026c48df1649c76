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

// One weight row times four activation rows (act + r·act_stride): out[r·out_stride], each bitwise
// the DotFn's result for that row (the same operations per row; the weight row decoded once).
using Dot4Fn = void (*)(const void* wrow, const void* act, size_t act_stride, int64_t n, float* out,
                        size_t out_stride);

struct Dot4Kernel {
  DType type;
  Dot4Fn fn;
};

// Per weight type, the kernel chosen and the name of its ISA (no kernel: fn is null).
struct DotTable {
  static constexpr int kTypes = 64;  // room for every DType
  DotFn fn[kTypes] = {};
  Dot4Fn fn4[kTypes] = {};  // where the chosen ISA has one for the type
  std::string_view name[kTypes] = {};
  // The kernels of `ks` replace earlier choices for their types.
  void add(std::span<const DotKernel> ks, std::string_view isa) {
    for (const DotKernel& k : ks)
      if (k.fn) fn[int(k.type)] = k.fn, fn4[int(k.type)] = nullptr, name[int(k.type)] = isa;
  }
  // Four-row kernels of the ISA just added (after its add: a type's four-row kernel must be its
  // one-row kernel's twin).
  void add4(std::span<const Dot4Kernel> ks) {
    for (const Dot4Kernel& k : ks) fn4[int(k.type)] = k.fn;
  }
};
static_assert(int(kLastDType) < DotTable::kTypes);

// The widest kernel set to use: what the CPU has, capped by QWEN36_CPU_ISA=scalar|avx2 (read
// once; benchmarks, and ruling out a SIMD bug).
enum class DotIsa { Scalar, Avx2, Avx512Vnni };
DotIsa dot_isa();

std::span<const DotKernel> avx2_dot_kernels();
std::span<const DotKernel> avx512_dot_kernels();  // call only when the CPU has AVX-512 VNNI
std::span<const Dot4Kernel> avx2_dot4_kernels();
std::span<const Dot4Kernel> avx512_dot4_kernels();  // call only when the CPU has AVX-512 VNNI
std::span<const DotKernel> hf_avx2_dot_kernels();  // the Hugging Face checkpoint types (cpu_dot_hf.cpp)
// Kernels against per-32 int8 activations (cpu_dot_g32.h's BlockQ8G32 rows), same rules.
std::span<const DotKernel> avx2_g32_kernels();
std::span<const DotKernel> avx512_g32_kernels();  // call only when the CPU has AVX-512 VNNI

}  // namespace qwen36
