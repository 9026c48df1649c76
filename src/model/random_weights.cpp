#include "model/random_weights.h"

#include <cmath>

#include "core/error.h"
#include "core/rng.h"

namespace qwen36 {

namespace {

using Rng = SplitMix64;  // one stream per tensor block (core/rng.h)

class Builder {
 public:
  Builder(ModelWeights& w, DType dtype, uint64_t seed) : w_(w), dtype_(dtype), seed_(seed) {}

  Tensor matrix(std::initializer_list<int64_t> shape, float std) { return make(dtype_, shape, [&](Rng& r) { return r.normal() * std; }); }
  Tensor f32(std::initializer_list<int64_t> shape, float mean, float spread) {
    return make(DType::F32, shape, [&](Rng& r) { return mean + (r.uniform() * 2 - 1) * spread; });
  }

 private:
  template <typename F>
  Tensor make(DType t, std::initializer_list<int64_t> shape, F gen) {
    return random_host_tensor(w_.storage, t, shape, seed_ * 1000003ull + counter_++, gen);
  }

  ModelWeights& w_;
  DType dtype_;
  uint64_t seed_;
  uint64_t counter_ = 0;
};

MlpWeights random_mlp(Builder& b, int64_t H, int64_t I) {
  return {b.matrix({I, H}, 1.0f / std::sqrt(float(H))), b.matrix({I, H}, 1.0f / std::sqrt(float(H))),
          b.matrix({H, I}, 1.0f / std::sqrt(float(I)))};
}

LayerWeights random_layer(Builder& b, const ModelConfig& c, LayerKind kind) {
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
    d.in_proj_b = b.matrix({c.gate_rows(), H}, sh);
    d.in_proj_a = b.matrix({c.gate_rows(), H}, sh);
    d.conv1d = b.f32({c.conv_dim(), c.conv_kernel}, 0.0f, 0.5f);
    d.dt_bias = b.f32({c.linear_v_heads}, 0.0f, 0.5f);
    d.a_neg_exp = b.f32({c.linear_v_heads}, -1.0f, 0.5f);  // −exp(A_log) with A_log near 0
    d.norm = b.f32({c.linear_v_dim}, 1.0f, 0.1f);
    d.out_proj = b.matrix({H, vd}, 1.0f / std::sqrt(float(vd)));
  }
  if (c.moe) {
    l.moe.router = b.matrix({c.n_experts, H}, sh);
    for (int64_t e = 0; e < c.n_local_experts(); ++e) l.moe.experts.push_back(random_mlp(b, H, c.moe_intermediate_size));
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

ModelWeights make_random_weights(const ModelConfig& c, DType matrix_dtype, uint64_t seed, bool with_mtp) {
  QWEN36_CHECK(matrix_dtype == DType::F32 || matrix_dtype == DType::F16 || matrix_dtype == DType::BF16,
               "random weights: dtype {} is not supported here", dtype_name(matrix_dtype));
  c.validate();
  ModelWeights w;
  w.config = c;
  Builder b(w, matrix_dtype, seed);
  // Small embeddings (2/sqrt(H) per element): the residual stream is then dominated by what the
  // layers add rather than by the input token, so a tied head does not just repeat its input.
  w.embed_tokens = b.matrix({c.vocab_size, c.hidden_size}, 2.0f / std::sqrt(float(c.hidden_size)));
  w.final_norm = b.f32({c.hidden_size}, 1.0f, 0.1f);
  w.lm_head = c.tie_word_embeddings ? w.embed_tokens
                                    : b.matrix({c.vocab_size, c.hidden_size}, 1.0f / std::sqrt(float(c.hidden_size)));
  for (int64_t i = 0; i < c.n_layers; ++i) w.layers.push_back(random_layer(b, c, c.layer_kinds[size_t(i)]));
  if (with_mtp && c.mtp_layers > 0) {
    MtpWeights m;
    const int64_t H = c.hidden_size;
    m.fc = b.matrix({H, 2 * H}, 1.0f / std::sqrt(float(2 * H)));
    m.pre_fc_norm_embedding = b.f32({H}, 1.0f, 0.1f);
    m.pre_fc_norm_hidden = b.f32({H}, 1.0f, 0.1f);
    m.norm = b.f32({H}, 1.0f, 0.1f);
    m.layer = random_layer(b, c, LayerKind::FullAttention);
    w.mtp = std::move(m);
  }
  validate_weights(w);
  return w;
}

}  // namespace qwen36
