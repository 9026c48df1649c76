#pragma once
// defines: random_model_tensors (what a random model holds, in which order, with which scales)
//
// One description of a random model's tensors for both builders: the host one
// (model/random_weights.cpp) and the device one (backend/cuda/cuda_random.cu), which differ only
// in where values are made. A builder B provides
//   Tensor matrix(const std::string& gguf_name, std::initializer_list<int64_t> shape, float std);
//   Tensor f32(std::initializer_list<int64_t> shape, float mean, float spread);
//   void set_layer(int64_t i);  // names given to matrix() are then "blk.<i>.<name>"
// and makes its tensors in the order they are asked for (the values of each follow from that
// order: keep it). Scales keep activations O(1) at any depth: matrices ~ N(0, 1/fan_in), norm
// multipliers near 1, DeltaNet decays in a realistic range.

#include <cmath>
#include <cstdint>
#include <string>

#include "model/weights.h"

namespace qwen36::random_model {

// kind: "" (dense MLP), "_exps" (routed experts), "_shexp" (shared expert), as in GGUF names.
template <typename B>
MlpWeights mlp(B& b, int64_t H, int64_t I, const std::string& kind) {
  return {b.matrix("ffn_gate" + kind + ".weight", {I, H}, 1.0f / std::sqrt(float(H))),
          b.matrix("ffn_up" + kind + ".weight", {I, H}, 1.0f / std::sqrt(float(H))),
          b.matrix("ffn_down" + kind + ".weight", {H, I}, 1.0f / std::sqrt(float(I)))};
}

// gguf: the layer as a GGUF file loads (format/gguf_model.h), its out_proj reading the value
// heads in llama.cpp's tiled order, so that a benchmark pays what a real file's pass does.
template <typename B>
LayerWeights layer(B& b, const ModelConfig& c, LayerKind kind, bool gguf) {
  const int64_t H = c.hidden_size;
  const float sh = 1.0f / std::sqrt(float(H));
  LayerWeights l;
  l.kind = kind;
  l.input_norm = b.f32({H}, 1.0f, 0.1f);
  l.post_attention_norm = b.f32({H}, 1.0f, 0.1f);
  if (kind == LayerKind::FullAttention) {
    const int64_t qd = c.n_heads * c.head_dim, kvd = c.n_kv_heads * c.head_dim;
    l.attn = {b.matrix("attn_q.weight", {c.q_proj_rows(), H}, sh), b.matrix("attn_k.weight", {kvd, H}, sh),
              b.matrix("attn_v.weight", {kvd, H}, sh),
              b.matrix("attn_output.weight", {H, qd}, 1.0f / std::sqrt(float(qd))), b.f32({c.head_dim}, 1.0f, 0.1f),
              b.f32({c.head_dim}, 1.0f, 0.1f)};
  } else {
    const int64_t vd = c.linear_value_dim();
    auto& d = l.deltanet;
    d.in_proj_qkv = b.matrix("attn_qkv.weight", {c.conv_dim(), H}, sh);
    d.in_proj_z = b.matrix("attn_gate.weight", {vd, H}, sh);
    d.in_proj_b = b.matrix("ssm_beta.weight", {c.gate_rows(), H}, sh);
    d.in_proj_a = b.matrix("ssm_alpha.weight", {c.gate_rows(), H}, sh);
    d.conv1d = b.f32({c.conv_dim(), c.conv_kernel}, 0.0f, 0.5f);
    d.dt_bias = b.f32({c.linear_v_heads}, 0.0f, 0.5f);
    d.a_neg_exp = b.f32({c.linear_v_heads}, -1.0f, 0.5f);  // −exp(A_log) with A_log near 0
    d.norm = b.f32({c.linear_v_dim}, 1.0f, 0.1f);
    d.out_proj = b.matrix("ssm_out.weight", {H, vd}, 1.0f / std::sqrt(float(vd)));
    if (gguf) d.out_proj_heads = gguf_tiled_heads(c.linear_k_heads, c.linear_v_heads);
  }
  if (c.moe) {
    // router, shared gate, shared gate / up back to back: the model reads them in one pass
    l.moe.router = b.matrix("ffn_gate_inp.weight", {c.n_experts, H}, sh);
    if (c.shared_expert_intermediate_size > 0) {
      l.moe.shared_gate = b.matrix("ffn_gate_inp_shexp.weight", {1, H}, sh);
      l.moe.shared = mlp(b, H, c.shared_expert_intermediate_size, "_shexp");
    }
    for (int64_t e = 0; e < c.n_local_experts(); ++e)
      l.moe.experts.push_back(mlp(b, H, c.moe_intermediate_size, "_exps"));
  } else {
    l.mlp = mlp(b, H, c.intermediate_size, "");
  }
  return l;
}

// Every tensor of w for config c (w.config set by the caller): embeddings ~ N(0, embed_std²),
// then the final norm, lm_head (unless tied), the layers and, with with_mtp, the MTP head under
// GGUF's nextn names (as the CPU model's plan), so that benches draft for real.
template <typename B>
void tensors(B& b, ModelWeights& w, const ModelConfig& c, float embed_std, bool with_mtp, bool gguf) {
  const int64_t H = c.hidden_size;
  w.embed_tokens = b.matrix("token_embd.weight", {c.vocab_size, H}, embed_std);
  w.final_norm = b.f32({H}, 1.0f, 0.1f);
  w.lm_head = c.tie_word_embeddings ? w.embed_tokens
                                    : b.matrix("output.weight", {c.vocab_size, H}, 1.0f / std::sqrt(float(H)));
  for (int64_t i = 0; i < c.n_layers; ++i) {
    b.set_layer(i);
    w.layers.push_back(layer(b, c, c.layer_kinds[size_t(i)], gguf));
  }
  if (with_mtp && c.mtp_layers > 0) {
    b.set_layer(c.n_layers);
    MtpWeights m;
    m.fc = b.matrix("nextn.eh_proj.weight", {H, 2 * H}, 1.0f / std::sqrt(float(2 * H)));
    m.pre_fc_norm_embedding = b.f32({H}, 1.0f, 0.1f);
    m.pre_fc_norm_hidden = b.f32({H}, 1.0f, 0.1f);
    m.norm = b.f32({H}, 1.0f, 0.1f);
    m.layer = layer(b, c, LayerKind::FullAttention, gguf);
    w.mtp = std::move(m);
  }
}

}  // namespace qwen36::random_model
