// Random model weights generated directly in device memory (for `qwen36 bench --synthetic`
// on full-size shapes, where generating 54 GB on the host and uploading it is slow). The
// structure and scales follow model/random_weights.cpp (matrices ~ N(0, 1/fan_in), norm
// multipliers near 1, DeltaNet decays in a realistic range); the values themselves differ.
#include <cmath>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_ops.cuh"

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
  DeviceBuilder(ModelWeights& w, DType dtype, uint64_t seed) : w_(w), dtype_(dtype), seed_(seed) {}
  Tensor matrix(std::initializer_list<int64_t> shape, float std) { return make(dtype_, shape, true, std, 0); }
  Tensor f32(std::initializer_list<int64_t> shape, float mean, float spread) {
    return make(DType::F32, shape, false, mean, spread);
  }

 private:
  Tensor make(DType t, std::initializer_list<int64_t> shape, bool normal, float a, float b) {
    Tensor x(nullptr, t, shape);
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(x.nbytes(), 1)));
    w_.storage.push_back(std::shared_ptr<const void>(p, [](const void* q) { cudaFree(const_cast<void*>(q)); }));
    x.data = p;
    const int64_t n = x.numel();
    const uint64_t stream = (seed_ * 1000003ull + counter_++) * 0x100000001b3ull;
    const int blocks = int(std::min<int64_t>((n + 255) / 256, 132 * 64));
    if (n > 0) {
      switch (t) {
        case DType::BF16: fill_kernel<<<blocks, 256>>>(static_cast<__nv_bfloat16*>(p), n, stream, normal, a, b); break;
        case DType::F16: fill_kernel<<<blocks, 256>>>(static_cast<__half*>(p), n, stream, normal, a, b); break;
        default: fill_kernel<<<blocks, 256>>>(static_cast<float*>(p), n, stream, normal, a, b); break;
      }
      CUDA_LAUNCH_CHECK();
    }
    return x;
  }
  ModelWeights& w_;
  DType dtype_;
  uint64_t seed_;
  uint64_t counter_ = 0;
};

MlpWeights random_mlp(DeviceBuilder& b, int64_t H, int64_t I) {
  return {b.matrix({I, H}, 1.0f / std::sqrt(float(H))), b.matrix({I, H}, 1.0f / std::sqrt(float(H))),
          b.matrix({H, I}, 1.0f / std::sqrt(float(I)))};
}

LayerWeights random_layer(DeviceBuilder& b, const ModelConfig& c, LayerKind kind) {
  const int64_t H = c.hidden_size;
  const float sh = 1.0f / std::sqrt(float(H));
  LayerWeights l;
  l.kind = kind;
  l.input_norm = b.f32({H}, 1.0f, 0.1f);
  l.post_attention_norm = b.f32({H}, 1.0f, 0.1f);
  if (kind == LayerKind::FullAttention) {
    const int64_t qd = c.n_heads * c.head_dim, kvd = c.n_kv_heads * c.head_dim;
    l.attn = {b.matrix({c.q_proj_rows(), H}, sh), b.matrix({kvd, H}, sh), b.matrix({kvd, H}, sh),
              b.matrix({H, qd}, 1.0f / std::sqrt(float(qd))), b.f32({c.head_dim}, 1.0f, 0.1f),
              b.f32({c.head_dim}, 1.0f, 0.1f)};
  } else {
    const int64_t vd = c.linear_value_dim();
    auto& d = l.deltanet;
    d.in_proj_qkv = b.matrix({c.conv_dim(), H}, sh);
    d.in_proj_z = b.matrix({vd, H}, sh);
    d.in_proj_b = b.matrix({c.linear_v_heads, H}, sh);
    d.in_proj_a = b.matrix({c.linear_v_heads, H}, sh);
    d.conv1d = b.f32({c.conv_dim(), c.conv_kernel}, 0.0f, 0.5f);
    d.dt_bias = b.f32({c.linear_v_heads}, 0.0f, 0.5f);
    d.a_neg_exp = b.f32({c.linear_v_heads}, -1.0f, 0.5f);
    d.norm = b.f32({c.linear_v_dim}, 1.0f, 0.1f);
    d.out_proj = b.matrix({H, vd}, 1.0f / std::sqrt(float(vd)));
  }
  if (c.moe) {
    l.moe.router = b.matrix({c.n_experts, H}, sh);
    for (int64_t e = 0; e < c.n_experts; ++e) l.moe.experts.push_back(random_mlp(b, H, c.moe_intermediate_size));
    if (c.shared_expert_intermediate_size > 0) {
      l.moe.shared = random_mlp(b, H, c.shared_expert_intermediate_size);
      l.moe.shared_gate = b.matrix({1, H}, sh);
    }
  } else {
    l.mlp = random_mlp(b, H, c.intermediate_size);
  }
  return l;
}

}  // namespace

ModelWeights make_random_weights_cuda(const ModelConfig& c, DType matrix_dtype, uint64_t seed) {
  QWEN36_CHECK(matrix_dtype == DType::F32 || matrix_dtype == DType::F16 || matrix_dtype == DType::BF16,
               "random weights: dtype {} is not supported here", dtype_name(matrix_dtype));
  c.validate();
  ModelWeights w;
  w.config = c;
  DeviceBuilder b(w, matrix_dtype, seed);
  w.embed_tokens = b.matrix({c.vocab_size, c.hidden_size}, 1.0f);
  w.final_norm = b.f32({c.hidden_size}, 1.0f, 0.1f);
  w.lm_head = c.tie_word_embeddings ? w.embed_tokens
                                    : b.matrix({c.vocab_size, c.hidden_size}, 1.0f / std::sqrt(float(c.hidden_size)));
  for (int64_t i = 0; i < c.n_layers; ++i) w.layers.push_back(random_layer(b, c, c.layer_kinds[size_t(i)]));
  CUDA_CHECK(cudaDeviceSynchronize());
  validate_weights(w);
  return w;
}

}  // namespace qwen36
