// AVX-512 VNNI dot products, compiled for that ISA with a target attribute and used only when
// __builtin_cpu_supports says the CPU has it (cpu_dot.cpp). Not yet specialised: the list is
// empty, so every type uses its AVX2 kernel.
#include "quant/cpu_dot_kernels.h"

namespace qwen36 {

std::span<const DotKernel> avx512_dot_kernels() { return {}; }

}  // namespace qwen36
