// Dispatch of the CPU dot products, the scalar fallback and the reference definition.
#include "quant/cpu_dot.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "quant/cpu_dot_kernels.h"
#include "quant/quant.h"

namespace qwen36 {

DType dot_activation_type(DType weight) {
  switch (weight) {
    case DType::F32: case DType::F16: case DType::BF16:
    // The HF checkpoint types keep f32 activations: they reproduce the dequantized model.
    case DType::W4_G32: case DType::W4_G128: case DType::F8_B128: case DType::NVFP4_B64:
      return DType::F32;
    case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::Q8_0:
      return DType::Q8_0;
    case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: case DType::Q8_K: case DType::IQ4_XS:
      return DType::Q8_K;
    case DType::I32: case DType::F8_E4M3: case DType::U8: case DType::I64: break;
    case DType::Q4_K_T16: case DType::Q6_K_T16: case DType::Q8_0_T16: case DType::W4_G128_T16:
    case DType::NVFP4_B64_T16: case DType::W4_G32_T16:
      fail("{} is the CUDA backend's tiled weight layout: the CPU cannot read it", dtype_name(weight));
  }
  fail("no dot product for weights of type {}", dtype_name(weight));
}

void quantize_activation(DType act, const float* x, void* dst, int64_t n) {
  QWEN36_CHECK(act == DType::F32 || act == DType::Q8_0 || act == DType::Q8_K,
               "quantize_activation: {} is not an activation type", dtype_name(act));
  quantize_row(act, x, dst, n);
}

namespace {

// Scalar path for any type: dequantize a chunk of both rows into floats and multiply.
float dot_scalar(DType wt, const void* w, const void* a, int64_t n) {
  const DType at = dot_activation_type(wt);
  const int64_t chunk = std::max<int64_t>({dtype_block_elems(wt), dtype_block_elems(at), 32});
  float wf[256], af[256];
  const auto* wp = static_cast<const std::byte*>(w);
  const auto* ap = static_cast<const std::byte*>(a);
  float sum = 0;
  for (int64_t i = 0; i < n; i += chunk) {
    const int64_t k = std::min(chunk, n - i);  // only plain types have a partial last chunk
    dequantize_row(wt, wp + dtype_row_bytes(wt, i), wf, k);
    dequantize_row(at, ap + dtype_row_bytes(at, i), af, k);
    for (int64_t j = 0; j < k; ++j) sum += wf[j] * af[j];
  }
  return sum;
}

}  // namespace

DotIsa dot_isa() {
  static const DotIsa isa = [] {
    const char* cap_env = std::getenv("QWEN36_CPU_ISA");
    const std::string_view cap = cap_env ? cap_env : "";
    if (cap == "scalar") return DotIsa::Scalar;
#if defined(__x86_64__)
    if (cap != "avx2" && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
      return DotIsa::Avx512Vnni;
#endif
    return DotIsa::Avx2;
  }();
  return isa;
}

namespace {

// A slot without a kernel uses the scalar path.
DotTable make_table() {
  DotTable t;
  for (std::string_view& n : t.name) n = "scalar";
  const DotIsa isa = dot_isa();
  if (isa == DotIsa::Scalar) return t;
  t.add(avx2_dot_kernels(), "avx2");
  t.add4(avx2_dot4_kernels());
  t.add(hf_avx2_dot_kernels(), "avx2");
  if (isa == DotIsa::Avx512Vnni) {
    t.add(avx512_dot_kernels(), "avx512vnni");
    t.add4(avx512_dot4_kernels());
  }
  return t;
}

const DotTable& table() {
  static const DotTable t = make_table();
  return t;
}

void check_args(DType wt, int64_t n) {
  QWEN36_CHECK(wt != DType::I32 && wt != DType::U8 && wt != DType::I64, "no dot product for weights of type {}",
               dtype_name(wt));
  const int64_t be = std::max(dtype_block_elems(wt), dtype_block_elems(dot_activation_type(wt)));
  QWEN36_CHECK(n >= 0 && n % be == 0, "dot_row: {} elements is not a multiple of the {} block size {}", n,
               dtype_name(wt), be);
}

}  // namespace

float dot_row(DType wt, const void* w, const void* a, int64_t n) {
  // The check is one modulo per row; the row itself is thousands of multiply-adds.
  check_args(wt, n);
  const DotFn f = table().fn[int(wt)];
  return f ? f(w, a, n) : dot_scalar(wt, w, a, n);
}

void dot_rows(DType wt, const void* w, const void* a, size_t a_stride, int64_t rows, int64_t n, float* out,
              size_t out_stride) {
  check_args(wt, n);
  const DotFn f = table().fn[int(wt)];
  const Dot4Fn f4 = table().fn4[int(wt)];
  const auto* ap = static_cast<const std::byte*>(a);
  int64_t r = 0;
  if (f4)
    for (; r + 4 <= rows; r += 4) f4(w, ap + size_t(r) * a_stride, a_stride, n, out + size_t(r) * out_stride, out_stride);
  for (; r < rows; ++r) {
    const void* row = ap + size_t(r) * a_stride;
    out[size_t(r) * out_stride] = f ? f(w, row, n) : dot_scalar(wt, w, row, n);
  }
}

double dot_row_reference(DType wt, const void* w, const void* a, int64_t n) {
  check_args(wt, n);
  std::vector<float> wf(static_cast<size_t>(n)), af(static_cast<size_t>(n));
  dequantize_row(wt, w, wf.data(), n);
  dequantize_row(dot_activation_type(wt), a, af.data(), n);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += double(wf[size_t(i)]) * af[size_t(i)];
  return sum;
}

std::string_view dot_kernel_name(DType wt) {
  QWEN36_CHECK(wt != DType::I32, "no dot product for weights of type i32");
  return table().name[int(wt)];
}

}  // namespace qwen36
