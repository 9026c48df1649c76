#pragma once
// defines: the CUDA entry points of the Hugging Face checkpoint block types (W4_G32, W4_G128,
//          F8_B128, NVFP4_B64; layouts quant/hf_blocks.h), implemented in cuda_quant_hf.cu
//          (matmul, embed, MoE expert dequantization) and cuda_quant_random.cu (random blocks).
//          cuda_quant_matmul.cu forwards these types here. Included by .cu files only.

#include <span>

#include "backend/cuda/cuda_ops.cuh"

namespace qwen36::cuda {

// W4_G32, W4_G128, F8_B128, NVFP4_B64.
bool hf_quant_supported(DType t);
// out[T, N] = x[T, K] · w[N, K]ᵀ (f32 rows, T, N ≥ 1; quant_matmul checks the shapes): T ≤ 8
// without exact_matmul: the GEMV of cuda_quant_hf.cu (f32 activations); otherwise dequantized
// slices and cuBLAS (bf16, or f32 with exact_matmul), as quant_matmul does for GGUF types.
void hf_quant_matmul(Ctx& c, const Tensor& w, const float* x, float* out, int T, int N, int K);
// Rows r0 .. r0 + n − 1 of w as bf16 rows of out (the prefill's values); false for other types.
bool hf_quant_dequant_rows(Ctx& c, const Tensor& w, int64_t r0, int64_t n, __nv_bfloat16* out);
// Rows rows[0 .. n) (device ids, checked by the caller: quant_embed) of an HF-quantized table as
// f32 rows of out.
void hf_quant_embed_rows(Ctx& c, const Tensor& table, const int32_t* rows, int n, float* out);
// quant_dequant_experts for the HF types (same arguments and scratch layout).
void hf_quant_dequant_experts(Ctx& c, DType t, const void* const* table, int kind0, int nkind, const int32_t* off,
                              int e0, int ne, int64_t rows, int64_t K, __nv_bfloat16* scratch);
// n weights of random HF blocks of type t at dst (std ≈ sigma, mean ≈ 0), default stream
// (cuda_quant_random.cu; quant_random_fill forwards here).
void hf_random_fill(DType t, void* dst, int64_t n, float sigma, uint64_t seed);

}  // namespace qwen36::cuda
