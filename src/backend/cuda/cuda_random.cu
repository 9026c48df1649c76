// Random model weights generated directly in device memory (for `qwen36 bench --synthetic`
// on full-size shapes, where generating 54 GB on the host and uploading it is slow). The
// tensors, their order and scales are model/random_layers.h's, as the host builder's
// (model/random_weights.cpp); the values themselves differ.
// Block-quantized models take each matrix's type from the rules `qwen36 quantize` applies
// (quant/mix_rules.h, via the CPU synthetic model's plan) and random valid blocks
// (cuda::quant_random_fill).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <unordered_map>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_ops.cuh"
#include "model/random_layers.h"
#include "model/random_quant_weights.h"
#include "quant/quantize_model.h"

namespace qwen36 {

namespace {

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// normal: sum of four 16-bit uniforms, rescaled (≈ N(0,1)); uniform: mean ± spread.
template <typename T>
__global__ void fill_kernel(T* p, int64_t n, uint64_t stream, bool normal, float a, float b) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = mix64(stream + uint64_t(i) * 0x9e3779b97f4a7c15ull);
    float v;
    if (normal) {
      const float s = float(r & 0xffff) + float((r >> 16) & 0xffff) + float((r >> 32) & 0xffff) + float(r >> 48);
      v = (s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f * a;
    } else {
      v = a + (float(r >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * b;
    }
    if constexpr (std::is_same_v<T, float>)
      p[i] = v;
    else if constexpr (std::is_same_v<T, __nv_bfloat16>)
      p[i] = __float2bfloat16_rn(v);
    else
      p[i] = __float2half_rn(v);
  }
}

class DeviceBuilder {
 public:
  // types: the type of every matrix by GGUF name (block-quantized synthetic models), else dtype.
  DeviceBuilder(ModelWeights& w, DType dtype, uint64_t seed, const std::unordered_map<std::string, DType>* types)
      : w_(w), dtype_(dtype), seed_(seed), types_(types) {}
  void set_layer(int64_t i) { prefix_ = "blk." + std::to_string(i) + "."; }
  // name: the GGUF name within the layer set by set_layer ("attn_q.weight"), or a global one.
  Tensor matrix(const std::string& name, std::initializer_list<int64_t> shape, float std) {
    return make(type_of(name), shape, true, std, 0);
  }
  Tensor f32(std::initializer_list<int64_t> shape, float mean, float spread) {
    return make(DType::F32, shape, false, mean, spread);
  }

 private:
  Tensor make(DType t, std::initializer_list<int64_t> shape, bool normal, float a, float b) {
    Tensor x(nullptr, t, shape);
    void* p = place(x.nbytes());
    x.data = p;
    const int64_t n = x.numel();
    const uint64_t stream = (seed_ * 1000003ull + counter_++) * 0x100000001b3ull;
    const int blocks = int(std::min<int64_t>((n + 255) / 256, 132 * 64));
    if (n > 0 && dtype_is_quantized(t)) {
      cuda::quant_random_fill(t, p, n, a, stream);  // cuda_quant_matmul.cu
    } else if (n > 0) {
      switch (t) {
        case DType::BF16: fill_kernel<<<blocks, 256>>>(static_cast<__nv_bfloat16*>(p), n, stream, normal, a, b); break;
        case DType::F16: fill_kernel<<<blocks, 256>>>(static_cast<__half*>(p), n, stream, normal, a, b); break;
        default: fill_kernel<<<blocks, 256>>>(static_cast<float*>(p), n, stream, normal, a, b); break;
      }
      CUDA_LAUNCH_CHECK();
    }
    return x;
  }
  // Tensors are placed one after another in 4 GiB arenas (256-byte aligned), as
  // prepare_weights lays out a loaded checkpoint: a layer's projections that read the same
  // input end up back to back, which the prefill GEMMs use (cuda_matmul_fused.cu).
  void* place(size_t bytes) {
    constexpr size_t kArena = size_t(4) << 30;
    bytes = std::max<size_t>((bytes + 255) / 256 * 256, 256);
    if (bytes > kArena) return own(bytes);  // e.g. the embedding: its own allocation
    if (bytes > arena_left_) {
      arena_ = static_cast<std::byte*>(own(kArena));
      arena_left_ = kArena;
    }
    void* p = arena_;
    arena_ += bytes;
    arena_left_ -= bytes;
    return p;
  }
  void* own(size_t bytes) {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, bytes));
    w_.storage.push_back(std::shared_ptr<const void>(p, [](const void* q) { cudaFree(const_cast<void*>(q)); }));
    return p;
  }
  std::byte* arena_ = nullptr;
  size_t arena_left_ = 0;
  DType type_of(const std::string& name) const {
    if (!types_) return dtype_;
    auto it = types_->find(name);
    if (it == types_->end()) it = types_->find(prefix_ + name);
    QWEN36_CHECK(it != types_->end(), "internal: random model has no tensor {}{}", prefix_, name);
    return it->second;
  }
  ModelWeights& w_;
  DType dtype_;
  uint64_t seed_;
  uint64_t counter_ = 0;
  const std::unordered_map<std::string, DType>* types_;
  std::string prefix_;
};

// A block type by its name ("q4_k", "IQ4_XS"), case-insensitive; F32 when none.
DType quant_block_type(const std::string& name) {
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q5_K,
                  DType::Q6_K, DType::IQ4_XS}) {
    std::string n(dtype_name(t));
    if (n.size() == name.size() && std::equal(n.begin(), n.end(), name.begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
        }))
      return t;
  }
  return DType::F32;
}

ModelWeights build(const ModelConfig& c, DType matrix_dtype, uint64_t seed,
                   const std::unordered_map<std::string, DType>* types, bool with_mtp, bool gguf = false) {
  c.validate();
  ModelWeights w;
  w.config = c;
  DeviceBuilder b(w, matrix_dtype, seed, types);
  random_model::tensors(b, w, c, 1.0f, with_mtp, gguf);
  CUDA_CHECK(cudaDeviceSynchronize());
  validate_weights(w);
  return w;
}

}  // namespace

ModelWeights make_random_weights_cuda(const ModelConfig& c, DType matrix_dtype, uint64_t seed, bool with_mtp) {
  QWEN36_CHECK(matrix_dtype == DType::F32 || matrix_dtype == DType::F16 || matrix_dtype == DType::BF16,
               "random weights: dtype {} is not supported here", dtype_name(matrix_dtype));
  return build(c, matrix_dtype, seed, nullptr, with_mtp);
}

// A Hugging Face checkpoint type by its bench name (awq / w4g128, w4g32, nvfp4, fp8); F32 when none.
DType hf_synthetic_type(const std::string& name) {
  if (name == "awq" || name == "w4g128") return DType::W4_G128;
  if (name == "w4g32") return DType::W4_G32;
  if (name == "nvfp4") return DType::NVFP4_B64;
  if (name == "fp8") return DType::F8_B128;
  return DType::F32;
}

ModelWeights make_random_quant_weights_cuda(const ModelConfig& c, const std::string& type, uint64_t seed,
                                            bool with_mtp) {
  if (const DType hf = hf_synthetic_type(type); hf != DType::F32) {
    // The Linear layers such checkpoints quantize (attention, GDN qkv / z / out, MLPs and
    // experts; rows of whole blocks); embeddings, lm_head, routers, the shared-expert gate and
    // the tiny GDN a/b projections stay bf16, as their modules_to_not_convert / ignore lists.
    const ModelPlan plan = random_model_plan(c, seed, "qwen36-random");
    std::unordered_map<std::string, DType> by_name;
    for (const TensorSource& t : plan.tensors) {
      const std::string& n = t.name;
      const bool skip = n.starts_with("token_embd") || n.starts_with("output.") || n.find("ffn_gate_inp") != n.npos ||
                        n.find("ssm_alpha") != n.npos || n.find("ssm_beta") != n.npos;
      by_name[n] = !skip && t.shape.size() >= 2 && t.shape.back() % dtype_block_elems(hf) == 0 ? hf : DType::BF16;
    }
    return build(c, DType::BF16, seed, &by_name, with_mtp);
  }
  // The per-tensor types `qwen36 quantize` would give the CPU synthetic model of the same
  // preset (model/random_quant_weights.cpp): a mix's rules, or for a block type every matrix
  // the Q8_0 mix quantizes in that type (Q8_0 where a row cannot hold its blocks).
  const std::optional<QuantMix> mix = parse_quant_mix(type);
  const DType pure = mix ? DType::F32 : quant_block_type(type);
  QWEN36_CHECK(mix || pure != DType::F32, "random weights: {} is neither a quantization mix nor a block type", type);
  ModelPlan plan = random_model_plan(c, seed, "qwen36-random");
  const std::vector<DType> types = choose_plan_types(plan, mix ? *mix : QuantMix::Q8_0);
  std::unordered_map<std::string, DType> by_name;
  for (size_t i = 0; i < types.size(); ++i) {
    DType t = types[i];
    if (!mix && dtype_is_quantized(t) && plan.tensors[i].cols() % dtype_block_elems(pure) == 0) t = pure;
    by_name[plan.tensors[i].name] = t;
  }
  return build(c, DType::BF16, seed, &by_name, with_mtp, /*gguf=*/true);
}

}  // namespace qwen36
