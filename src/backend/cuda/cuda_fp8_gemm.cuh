#pragma once
// defines: the FP8 tensor-core GEMM of block-wise FP8 weights (F8_B128) through cuBLASLt's 1×128
//          block scaling (cuda_fp8_gemm.cu: W8A8, Hopper only; QWEN36_FP8_GEMM=0 turns it off).
//          Included by .cu files only.

#include <cstdint>

#include "backend/cuda/cuda_ops.cuh"

namespace qwen36::cuda {

// On unless QWEN36_FP8_GEMM=0 (read once; fp8_gemm_select: the tests' switch, −1 reads the
// environment again).
bool fp8_gemm_enabled();
void fp8_gemm_select(int on);
// Whether fp8_gemm takes w at T tokens: enabled, F8_B128, T ≥ 1024 (fewer: the bf16 path is
// faster), rows % 4 == 0, K % 128 == 0, a device of compute capability 9.x.
bool fp8_gemm_takes(const Tensor& w, int64_t T);
// out[T, N] = x[T, K] · w[N, K]ᵀ (f32 x and out) with x quantized per token and 128 columns to
// e4m3 (scale amax / 448) and w's codes and scales as stored.
void fp8_gemm(Ctx& c, const Tensor& w, const float* x, float* out, int64_t T, int64_t N, int64_t K);
// The MLP (Backend::mlp) when fp8_gemm takes all three matrices: x quantized once, per slice of
// intermediate rows the gate and up rows side by side in one GEMM, whose f32 output a kernel
// SwiGLUs and quantizes straight into the down GEMM's e4m3 activations (the composition: two
// GEMMs into f32 gate and up, an f32 SwiGLU, and down's own quantization pass). The same
// quantization points as the composition. false: not taken.
bool fp8_mlp(Ctx& c, const Tensor& x, const MlpWeights& m, Tensor& out);

}  // namespace qwen36::cuda
