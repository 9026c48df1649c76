#pragma once
// defines: make_cuda_backend, CudaOptions, cuda_available, and the device helpers that
//          `qwen36 bench` and the GPU tests use (ceiling measurements, weights generated in
//          device memory). Host-only header: it includes no CUDA headers.

#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "model/config.h"
#include "model/weights.h"

namespace qwen36 {

struct CudaOptions {
  int device = 0;
  // Prefill matmuls (T > 8 rows) normally run as cuBLAS bf16/f16 tensor-core GEMMs with the
  // f32 activations ROUNDED to the weight type. exact_matmul keeps them f32 (a plain SIMT
  // GEMM with f32 accumulation): slow, for reference checks only.
  bool exact_matmul = false;
};

// True when a CUDA device is usable; otherwise false and *why says why (for GTEST_SKIP).
bool cuda_available(std::string* why = nullptr);

std::unique_ptr<Backend> make_cuda_backend(const CudaOptions& opts = {});

// ---- for benchmarks ----
std::string cuda_device_name(int device = 0);
void cuda_synchronize();
// Device-to-device cudaMemcpy of `bytes`, best of `reps`: GB/s counting bytes read + written.
double cuda_copy_bandwidth_gbs(size_t bytes, int reps);
// cuBLAS bf16 GEMM n×n×n (f32 accumulation, bf16 out), best of `reps`: TFLOP/s.
double cuda_bf16_gemm_tflops(int n, int reps);
// Random weights generated directly in device memory (same structure and scales as
// make_random_weights; values differ); with_mtp: also the MTP head, where the config has one.
// prepare_weights of the CUDA backend keeps them in place.
ModelWeights make_random_weights_cuda(const ModelConfig& config, DType matrix_dtype, uint64_t seed,
                                      bool with_mtp = false);
// The same with block-quantized matrices: `type` is a quantization mix ("q4_k_m", "q8_0", ...;
// per-tensor types as `qwen36 quantize` gives them), a block type ("q4_k", "iq4_xs", ...: every
// quantizable matrix in that type), or a Hugging Face checkpoint type ("awq" = "w4g128", "w4g32",
// "nvfp4", "fp8": the Linear layers such checkpoints quantize, the rest bf16).
ModelWeights make_random_quant_weights_cuda(const ModelConfig& config, const std::string& type, uint64_t seed,
                                            bool with_mtp = false);
// Repacks a Q4_K / Q6_K / Q8_0 / W4_G128 / W4_G32 / NVFP4 matrix in device memory (N % 16 == 0,
// K % 256 == 0) into the CUDA backend's tiled layout (dtype becomes its *_T16), in place and
// synchronously; false when the type or shape does not qualify. prepare_weights does this for
// a model's projections unless QWEN36_NO_TILE=1 (=experts: all but the routed experts, =dense:
// only them) (backend/cuda/cuda_quant_mma.cu).
bool cuda_tile_matrix(Tensor& w);

}  // namespace qwen36
