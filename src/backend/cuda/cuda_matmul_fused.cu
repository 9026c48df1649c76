// Prefill (T > 8) forms of the fused matmuls (Backend::matmul_multi, matmul_swiglu, mlp) for
// 16-bit weights, and the MLP of quantized weights (T > 64). The decode forms are GEMV
// kernels in cuda_matmul.cu (quantized: cuda_quant_*.cu).
//
// Weights of one group are stored back to back (prepare_weights uploads them in
// weight_tensors order; the synthetic generator allocates them from one arena), so the group
// is one [ΣN, K] matrix: the activations are rounded to bf16/f16 once, and consecutive small
// projections share one GEMM. That matters for the small ones: cuBLAS runs DeltaNet's 48-row
// a/b projections at T = 4096 in ~160 µs each (13 TFLOP/s) on their own. Groups that are not
// contiguous take the composed path.
#include <algorithm>

#include "backend/cuda/cuda_fp8_gemm.cuh"
#include "backend/cuda/cuda_ops.cuh"

namespace qwen36::cuda {

namespace {

// ws[i + 1] starts where ws[i] ends, all of one 16-bit float type and width K.
bool contiguous_half(std::span<const Tensor* const> ws) {
  const DType t = ws[0]->dtype;
  if (t != DType::BF16 && t != DType::F16) return false;
  for (size_t i = 0; i + 1 < ws.size(); ++i) {
    const Tensor& a = *ws[i];
    const Tensor& b = *ws[i + 1];
    if (b.dtype != t || b.cols() != a.cols() || static_cast<const std::byte*>(a.data) + a.nbytes() != b.data)
      return false;
  }
  return true;
}

// out[t, i] = silu(gu[t, i]) * gu[t, I + i] for i < I    (gu: [T, 2I] in the weights' 16-bit
// type; out rows ld_out apart) (grid: x over columns, y over rows — no per-element division).
// O: float, or the 16-bit type itself when the result feeds the down projection's GEMM directly.
__device__ __forceinline__ void store_as(float& d, float v) { d = v; }
__device__ __forceinline__ void store_as(__nv_bfloat16& d, float v) { d = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store_as(__half& d, float v) { d = __float2half_rn(v); }
template <typename H, typename O>
__global__ void swiglu_halves_kernel(const H* __restrict__ gu, O* __restrict__ out, int64_t I, int64_t T, int64_t ld_out) {
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y)
    for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < I; j += int64_t(gridDim.x) * blockDim.x) {
      const float g = to_f32(gu[t * 2 * I + j]), u = to_f32(gu[t * 2 * I + I + j]);
      store_as(out[t * ld_out + j], silu_f(g) * u);
    }
}

// The same element by element, 8 columns a thread: 16-byte loads and stores where the scalar
// form's 2-byte accesses left a prefill's SwiGLU at a third of the copy bandwidth (27B,
// T = 4096: 330 µs for 428 MB). Needs I and ld_out multiples of 8 and 16-byte aligned rows.
template <typename O>
struct alignas(16) Pack8 {  // eight outputs: one 16-byte store (bf16 / f16) or two (f32)
  O v[8];
};

template <typename H, typename O>
__global__ void swiglu_halves8_kernel(const H* __restrict__ gu, O* __restrict__ out, int64_t I, int64_t T,
                                      int64_t ld_out) {
  const int64_t I8 = I / 8;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y)
    for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < I8; j += int64_t(gridDim.x) * blockDim.x) {
      const uint4 gw = reinterpret_cast<const uint4*>(gu + t * 2 * I)[j];
      const uint4 uw = reinterpret_cast<const uint4*>(gu + t * 2 * I + I)[j];
      const H* g = reinterpret_cast<const H*>(&gw);
      const H* u = reinterpret_cast<const H*>(&uw);
      Pack8<O> o;
#pragma unroll
      for (int i = 0; i < 8; ++i) store_as(o.v[i], silu_f(to_f32(g[i])) * to_f32(u[i]));
      reinterpret_cast<Pack8<O>*>(out + t * ld_out)[j] = o;
    }
}

// gu [T, N] = xh · w[N, K]ᵀ, all in one 16-bit type (f32 accumulation).
void gemm_half_out(Ctx& c, const void* w, const void* xh, bool bf, int64_t T, int64_t N, int64_t K, void* gu) {
  const float one = 1.0f, zero = 0.0f;
  const cudaDataType_t dt = bf ? CUDA_R_16BF : CUDA_R_16F;
  CUBLAS_CHECK(cublasGemmEx(c.cublas, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(T), int(K), &one, w, dt, int(K), xh, dt,
                            int(K), &zero, gu, dt, int(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// gu [T, 2I] = x · [gate; up]ᵀ in the weights' 16-bit type (x rounded to it first).
void gate_up_gemm(Ctx& c, const Tensor& x, const Tensor& gate, void* xh, void* gu) {
  const int64_t K = gate.cols(), I = gate.rows(), T = x.numel() / K;
  const bool bf = gate.dtype == DType::BF16;
  round_activations(c, x.as<const float>(), xh, T * K, bf);
  gemm_half_out(c, gate.data, xh, bf, T, 2 * I, K, gu);
}

template <typename O>
void launch_swiglu_halves(Ctx& c, bool bf, const void* gu, O* out, int64_t I, int64_t T, int64_t ld_out) {
  const bool vec = I % 8 == 0 && ld_out % 8 == 0 && reinterpret_cast<uintptr_t>(gu) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (vec) {
    const dim3 grid(unsigned(blocks_for(I / 8, 128)), unsigned(std::min<int64_t>(T, 65535)));
    if (bf)
      swiglu_halves8_kernel<<<grid, 128, 0, c.stream>>>(static_cast<const __nv_bfloat16*>(gu), out, I, T, ld_out);
    else
      swiglu_halves8_kernel<<<grid, 128, 0, c.stream>>>(static_cast<const __half*>(gu), out, I, T, ld_out);
    CUDA_LAUNCH_CHECK();
    return;
  }
  const dim3 grid(unsigned(blocks_for(I, 256)), unsigned(std::min<int64_t>(T, 65535)));
  if (bf)
    swiglu_halves_kernel<<<grid, 256, 0, c.stream>>>(static_cast<const __nv_bfloat16*>(gu), out, I, T, ld_out);
  else
    swiglu_halves_kernel<<<grid, 256, 0, c.stream>>>(static_cast<const __half*>(gu), out, I, T, ld_out);
  CUDA_LAUNCH_CHECK();
}

// The MLP of quantized matrices (tiled, GGUF or Hugging Face types) at T > 64 where the
// dequantizing GEMMs run (not quant_tiled_gemm's T): x rounded to bf16 once; per slice of ns
// intermediate rows, the gate and up rows dequantized side by side into one [2·ns, K] bf16
// matrix, one GEMM writing bf16, and its SwiGLU into columns of the bf16 act that the down GEMM
// (dequantized slices as matmul's) reads. The composition would write gate and up in f32,
// SwiGLU them in f32, and round x twice and act once more.
bool mlp_prefill_quant(Ctx& c, const Tensor& x, const MlpWeights& m, Tensor& out) {
  const Tensor &gate = m.gate_proj, &up = m.up_proj, &down = m.down_proj;
  const Tensor* ws[] = {&gate, &up, &down};
  for (const Tensor* w : ws)  // quant_supported: the GGUF and HF types (the tiled ones are the device's own)
    if (!dtype_is_tiled(w->dtype) && !(dtype_is_quantized(w->dtype) && quant_supported(w->dtype))) return false;
  const int64_t K = gate.cols(), I = gate.rows(), H = down.rows(), T = x.numel() / std::max<int64_t>(K, 1);
  if (T <= kTiledMaxT || quant_tiled_gemm_takes(T, ws) || x.cols() != K || up.rows() != I || up.cols() != K ||
      down.cols() != I || out.numel() != T * H || 2 * I >= (int64_t(1) << 31) || T * std::max(K, I) >= (int64_t(1) << 31))
    return false;
  for (const Tensor* w : ws)  // the FP8 tensor-core GEMM, where enabled, over the bf16 dequantization
    if (fp8_gemm_takes(*w, T)) return false;
  const int64_t slice = std::clamp<int64_t>((int64_t(48) << 20) / K / 16 * 16, 16, I);  // 96 Mi weights of gate + up
  Temp<__nv_bfloat16> xh(c, size_t(T * K)), act(c, size_t(T * I));
  round_activations(c, x.as<const float>(), xh.get(), T * K, true);
  {
    Temp<__nv_bfloat16> w(c, size_t(2 * slice * K)), gu(c, size_t(T * 2 * slice));
    for (int64_t n0 = 0; n0 < I; n0 += slice) {
      const int64_t ns = std::min(slice, I - n0);
      quant_dequant_rows(c, gate, n0, ns, w.get());
      quant_dequant_rows(c, up, n0, ns, w.get() + ns * K);
      gemm_half_out(c, w.get(), xh.get(), true, T, 2 * ns, K, gu.get());
      launch_swiglu_halves(c, true, gu.get(), act.get() + n0, ns, T, I);
    }
  }
  sliced_dequant_gemm_erased(
      c, nullptr, out.as<float>(), int(T), int(H), int(I), 16,
      [&](int n0, int ns, void* dst, bool) { quant_dequant_rows(c, down, n0, ns, static_cast<__nv_bfloat16*>(dst)); },
      act.get());
  return true;
}

// matmul_multi_prefill's case: T > 8 tokens of f32 x, a group of 16-bit matrices back to back.
bool multi_prefill_takes(const Ctx& c, const Tensor& x, std::span<const Tensor* const> ws,
                         std::span<Tensor* const> outs) {
  if (c.exact_matmul || ws.size() < 2 || ws.size() != outs.size() || x.dtype != DType::F32 || !contiguous_half(ws))
    return false;
  const int64_t K = ws[0]->cols(), T = x.numel() / std::max<int64_t>(K, 1);
  int64_t N = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    if (outs[i]->dtype != DType::F32 || outs[i]->numel() != T * ws[i]->rows()) return false;
    N += ws[i]->rows();
  }
  return T > 8 && x.cols() == K && N < (int64_t(1) << 31) && K < (int64_t(1) << 31);
}

// mlp_prefill's 16-bit case: gate and up back to back, down of their type.
bool mlp_half_takes(const Ctx& c, const Tensor& x, const MlpWeights& m, const Tensor& out) {
  const Tensor* ws[] = {&m.gate_proj, &m.up_proj};
  const Tensor& down = m.down_proj;
  if (c.exact_matmul || x.dtype != DType::F32 || out.dtype != DType::F32 || m.gate_proj.empty() ||
      !contiguous_half(ws) || m.up_proj.rows() != m.gate_proj.rows() || down.dtype != m.gate_proj.dtype)
    return false;
  const int64_t K = m.gate_proj.cols(), I = m.gate_proj.rows(), H = down.rows(), T = x.numel() / std::max<int64_t>(K, 1);
  return T > 8 && x.cols() == K && down.cols() == I && out.numel() == T * H && 2 * I < (int64_t(1) << 31);
}

// The group's GEMMs from x's activations xh, already in the weights' 16-bit type. A matrix of
// kDirectRows rows or more is its own GEMM, written straight into its output; a run of smaller
// ones (DeltaNet's 48-row b / a) is one GEMM into a temporary, copied out. (One GEMM for the
// whole group, copied out column by column, moved the group's output through memory twice
// more: 27B, T = 4096, ~9 ms a forward.)
void multi_prefill_gemms(Ctx& c, const Tensor& x, const void* xh, std::span<const Tensor* const> ws,
                         std::span<Tensor* const> outs) {
  constexpr int64_t kDirectRows = 256;
  const bool bf = ws[0]->dtype == DType::BF16;
  const int64_t K = ws[0]->cols(), T = x.numel() / K;
  for (size_t i = 0; i < ws.size();) {
    size_t j = i + 1;
    int64_t n = ws[i]->rows();
    if (n < kDirectRows)
      while (j < ws.size() && ws[j]->rows() < kDirectRows) n += ws[j++]->rows();
    if (j == i + 1) {
      gemm_half(c, ws[i]->data, xh, bf, int(T), int(n), int(K), outs[i]->as<float>(), int(n));
    } else {
      Temp<float> all(c, size_t(T * n));
      gemm_half(c, ws[i]->data, xh, bf, int(T), int(n), int(K), all.get(), int(n));
      const Tensor whole(all.get(), DType::F32, {T, n});
      int64_t col = 0;
      for (size_t k = i; k < j; col += ws[k++]->rows()) {
        Tensor dst(outs[k]->data, DType::F32, {T, ws[k]->rows()});
        copy_cols(c, whole, col, dst, 0, ws[k]->rows());
      }
    }
    i = j;
  }
}

// mlp_prefill's 16-bit form, x rounded to the weights' type here or already in xh (non-null).
void mlp_half(Ctx& c, const Tensor& x, const MlpWeights& m, Tensor& out, const void* xh) {
  const Tensor& down = m.down_proj;
  const int64_t K = m.gate_proj.cols(), I = m.gate_proj.rows(), H = down.rows(), T = x.numel() / K;
  const bool bf = m.gate_proj.dtype == DType::BF16;
  Temp<uint16_t> xr(c, xh ? 0 : size_t(T * K)), gu(c, size_t(T * 2 * I)), act(c, size_t(T * I));
  if (xh)
    gemm_half_out(c, m.gate_proj.data, xh, bf, T, 2 * I, K, gu.get());
  else
    gate_up_gemm(c, x, m.gate_proj, xr.get(), gu.get());
  // The SwiGLU result goes to the down projection in its 16-bit type: what matmul() would
  // round it to, without the f32 round trip through memory.
  if (bf)
    launch_swiglu_halves(c, true, gu.get(), reinterpret_cast<__nv_bfloat16*>(act.get()), I, T, I);
  else
    launch_swiglu_halves(c, false, gu.get(), reinterpret_cast<__half*>(act.get()), I, T, I);
  gemm_half(c, down.data, act.get(), bf, int(T), int(H), int(I), out.as<float>(), int(H));
}

// x [T, K] (any shape of T·K floats) through a bf16 matrix w [N, K] into out [T, N] at T > 8,
// x written to the GEMM's bf16 input by write_input(xh) (false: not its shape, nothing done).
template <typename F>
bool half_input_prefill(Ctx& c, const Tensor& x, const Tensor& w, Tensor& out, F&& write_input) {
  const int64_t K = w.cols(), N = w.rows(), T = K ? x.numel() / K : 0;
  if (c.exact_matmul || w.dtype != DType::BF16 || x.dtype != DType::F32 || out.dtype != DType::F32 || T <= 8 ||
      x.numel() != T * K || out.numel() != T * N || N >= (int64_t(1) << 31) || K >= (int64_t(1) << 31) ||
      T >= (int64_t(1) << 31))
    return false;
  Temp<__nv_bfloat16> xh(c, size_t(T * K));
  if (!write_input(xh.get())) return false;
  gemm_half(c, w.data, xh.get(), true, int(T), int(N), int(K), out.as<float>(), int(N));
  return true;
}

}  // namespace

bool matmul_multi_prefill(Ctx& c, const Tensor& x, std::span<const Tensor* const> ws, std::span<Tensor* const> outs) {
  if (!multi_prefill_takes(c, x, ws, outs)) return false;
  Temp<uint16_t> xh(c, size_t(x.numel()));
  round_activations(c, x.as<const float>(), xh.get(), x.numel(), ws[0]->dtype == DType::BF16);
  multi_prefill_gemms(c, x, xh.get(), ws, outs);
  return true;
}

bool matmul_swiglu_prefill(Ctx& c, const Tensor& x, const Tensor& gate, const Tensor& up, Tensor& out) {
  const Tensor* ws[] = {&gate, &up};
  if (c.exact_matmul || x.dtype != DType::F32 || !contiguous_half(ws) || up.rows() != gate.rows()) return false;
  const int64_t K = gate.cols(), I = gate.rows(), T = x.numel() / std::max<int64_t>(K, 1);
  if (T <= 8 || x.cols() != K || out.dtype != DType::F32 || out.numel() != T * I || 2 * I >= (int64_t(1) << 31))
    return false;
  Temp<uint16_t> xh(c, size_t(T * K)), gu(c, size_t(T * 2 * I));
  // One GEMM over [gate; up] written in the 16-bit type (f32 accumulation): the SwiGLU reads
  // half the bytes an f32 product would need, and the values are rounded as the down
  // projection's input would be anyway.
  gate_up_gemm(c, x, gate, xh.get(), gu.get());
  launch_swiglu_halves(c, gate.dtype == DType::BF16, gu.get(), out.as<float>(), I, T, I);
  return true;
}

bool mlp_prefill(Ctx& c, const Tensor& x, const MlpWeights& m, Tensor& out) {
  if (!c.exact_matmul && x.dtype == DType::F32 && out.dtype == DType::F32 && !m.gate_proj.empty() &&
      (fp8_mlp(c, x, m, out) || mlp_prefill_quant(c, x, m, out)))
    return true;
  if (!mlp_half_takes(c, x, m, out)) return false;
  mlp_half(c, x, m, out, nullptr);
  return true;
}

bool norm_matmul_multi_prefill(Ctx& c, const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w, float eps,
                               Tensor& x, std::span<const Tensor* const> ws, std::span<Tensor* const> outs) {
  if (!multi_prefill_takes(c, x, ws, outs) || ws[0]->dtype != DType::BF16) return false;
  Temp<__nv_bfloat16> xh(c, size_t(x.numel()));
  if (!add_rms_norm_half(c, y, delta, y_out, w, eps, x, xh.get())) return false;
  multi_prefill_gemms(c, x, xh.get(), ws, outs);
  return true;
}

bool norm_mlp_prefill(Ctx& c, const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w, float eps, Tensor& x,
                      const MlpWeights& m, Tensor& out) {
  if (!mlp_half_takes(c, x, m, out) || m.gate_proj.dtype != DType::BF16) return false;
  Temp<__nv_bfloat16> xh(c, size_t(x.numel()));
  if (!add_rms_norm_half(c, y, delta, y_out, w, eps, x, xh.get())) return false;
  mlp_half(c, x, m, out, xh.get());
  return true;
}

bool gated_matmul_prefill(Ctx& c, const Tensor& x, const Tensor& gate, const Tensor& w, Tensor& out) {
  return half_input_prefill(c, x, w, out, [&](__nv_bfloat16* xh) { return sigmoid_mul_half(c, x, gate, xh); });
}

bool gated_norm_matmul_prefill(Ctx& c, const Tensor& x, const Tensor& z, const Tensor& norm, float eps, const Tensor& w,
                               Tensor& out) {
  return half_input_prefill(c, x, w, out,
                            [&](__nv_bfloat16* xh) { return gated_rms_norm_half(c, x, z, norm, eps, xh); });
}

}  // namespace qwen36::cuda
