#include "model/weights.h"

#include <fmt/format.h>

#include <set>

#include "core/error.h"

namespace qwen36 {

namespace {

class ShapeChecker {
 public:
  void operator()(const Tensor& t, const std::string& name, std::initializer_list<int64_t> want) {
    QWEN36_CHECK(!t.empty(), "missing tensor {}", name);
    bool ok = t.ndim == int(want.size());
    int i = 0;
    for (int64_t d : want) ok = ok && t.dim(i++) == d;
    if (!ok) {
      Tensor expect(nullptr, t.dtype, want);
      fail("tensor {} has shape {}, expected {}", name, t.shape_str(), expect.shape_str());
    }
  }
};

}  // namespace

std::vector<int32_t> gguf_tiled_heads(int64_t Hk, int64_t Hv) {
  const int64_t r = Hv / Hk;
  std::vector<int32_t> grouped_of_tiled(static_cast<size_t>(Hv));
  for (int64_t j = 0; j < r; ++j)
    for (int64_t i = 0; i < Hk; ++i) grouped_of_tiled[size_t(j * Hk + i)] = int32_t(i * r + j);
  return grouped_of_tiled;
}

size_t ModelWeights::total_bytes() const {
  std::set<const void*> seen;
  size_t total = 0;
  auto add = [&](const Tensor& t) {
    if (!t.empty() && seen.insert(t.data).second) total += t.nbytes();
  };
  add(embed_tokens);
  add(final_norm);
  add(lm_head);
  auto add_mlp = [&](const MlpWeights& m) {
    add(m.gate_proj);
    add(m.up_proj);
    add(m.down_proj);
  };
  auto add_layer = [&](const LayerWeights& l) {
    for (const Tensor* t : {&l.input_norm, &l.post_attention_norm, &l.attn.q_proj, &l.attn.k_proj, &l.attn.v_proj,
                            &l.attn.o_proj, &l.attn.q_norm, &l.attn.k_norm, &l.deltanet.in_proj_qkv,
                            &l.deltanet.in_proj_z, &l.deltanet.in_proj_b, &l.deltanet.in_proj_a, &l.deltanet.conv1d,
                            &l.deltanet.dt_bias, &l.deltanet.a_neg_exp, &l.deltanet.norm, &l.deltanet.out_proj,
                            &l.moe.router, &l.moe.shared_gate})
      add(*t);
    add_mlp(l.mlp);
    add_mlp(l.moe.shared);
    for (const auto& e : l.moe.experts) add_mlp(e);
  };
  for (const auto& l : layers) add_layer(l);
  if (mtp) {
    add(mtp->fc);
    add(mtp->pre_fc_norm_embedding);
    add(mtp->pre_fc_norm_hidden);
    add(mtp->norm);
    add_layer(mtp->layer);
  }
  return total;
}

static void validate_layer(const ModelConfig& c, const LayerWeights& l, const std::string& p, ShapeChecker& check) {
  const int64_t H = c.hidden_size;
  check(l.input_norm, p + "input_layernorm", {H});
  check(l.post_attention_norm, p + "post_attention_layernorm", {H});
  if (l.kind == LayerKind::FullAttention) {
    const auto& a = l.attn;
    check(a.q_proj, p + "self_attn.q_proj", {c.q_proj_rows(), H});
    check(a.k_proj, p + "self_attn.k_proj", {c.n_kv_heads * c.head_dim, H});
    check(a.v_proj, p + "self_attn.v_proj", {c.n_kv_heads * c.head_dim, H});
    check(a.o_proj, p + "self_attn.o_proj", {H, c.n_heads * c.head_dim});
    check(a.q_norm, p + "self_attn.q_norm", {c.head_dim});
    check(a.k_norm, p + "self_attn.k_norm", {c.head_dim});
  } else {
    const auto& d = l.deltanet;
    check(d.in_proj_qkv, p + "linear_attn.in_proj_qkv", {c.conv_dim(), H});
    check(d.in_proj_z, p + "linear_attn.in_proj_z", {c.linear_value_dim(), H});
    check(d.in_proj_b, p + "linear_attn.in_proj_b", {c.gate_rows(), H});
    check(d.in_proj_a, p + "linear_attn.in_proj_a", {c.gate_rows(), H});
    check(d.conv1d, p + "linear_attn.conv1d", {c.conv_dim(), c.conv_kernel});
    check(d.dt_bias, p + "linear_attn.dt_bias", {c.linear_v_heads});
    check(d.a_neg_exp, p + "linear_attn.A_log", {c.linear_v_heads});
    check(d.norm, p + "linear_attn.norm", {c.linear_v_dim});
    check(d.out_proj, p + "linear_attn.out_proj", {H, c.linear_value_dim()});
    if (!d.out_proj_heads.empty()) {
      QWEN36_CHECK(int64_t(d.out_proj_heads.size()) == c.linear_v_heads, "{}linear_attn.out_proj: head order of {} heads",
                   p, d.out_proj_heads.size());
      std::vector<bool> seen(size_t(c.linear_v_heads));
      for (int32_t h : d.out_proj_heads) {
        QWEN36_CHECK(h >= 0 && h < c.linear_v_heads && !seen[size_t(h)], "{}linear_attn.out_proj: bad head order", p);
        seen[size_t(h)] = true;
      }
    }
  }
  auto check_mlp = [&](const MlpWeights& m, const std::string& q, int64_t I) {
    check(m.gate_proj, q + "gate_proj", {I, H});
    check(m.up_proj, q + "up_proj", {I, H});
    check(m.down_proj, q + "down_proj", {H, I});
  };
  if (c.moe) {
    check(l.moe.router, p + "mlp.gate", {c.n_experts, H});
    QWEN36_CHECK(int64_t(l.moe.experts.size()) == c.n_local_experts(), "{}mlp.experts: {} experts loaded, config says {}",
                 p, l.moe.experts.size(), c.n_local_experts());
    for (size_t e = 0; e < l.moe.experts.size(); ++e)
      check_mlp(l.moe.experts[e], fmt::format("{}mlp.experts.{}.", p, e), c.moe_intermediate_size);
    if (c.shared_expert_intermediate_size > 0) {
      check_mlp(l.moe.shared, p + "mlp.shared_expert.", c.shared_expert_intermediate_size);
      check(l.moe.shared_gate, p + "mlp.shared_expert_gate", {1, H});
    }
  } else {
    check_mlp(l.mlp, p + "mlp.", c.intermediate_size);
  }
}

void validate_weights(const ModelWeights& w) {
  const ModelConfig& c = w.config;
  ShapeChecker check;
  check(w.embed_tokens, "embed_tokens", {c.vocab_size, c.hidden_size});
  check(w.final_norm, "norm", {c.hidden_size});
  check(w.lm_head, "lm_head", {c.vocab_size, c.hidden_size});
  QWEN36_CHECK(int64_t(w.layers.size()) == c.n_layers, "{} layers loaded, config says {}", w.layers.size(), c.n_layers);
  for (size_t i = 0; i < w.layers.size(); ++i) {
    QWEN36_CHECK(w.layers[i].kind == c.layer_kinds[i], "layer {} has the wrong kind", i);
    validate_layer(c, w.layers[i], fmt::format("layers.{}.", i), check);
  }
  if (w.mtp) {
    const int64_t H = c.hidden_size;
    check(w.mtp->fc, "mtp.fc", {H, 2 * H});
    check(w.mtp->pre_fc_norm_embedding, "mtp.pre_fc_norm_embedding", {H});
    check(w.mtp->pre_fc_norm_hidden, "mtp.pre_fc_norm_hidden", {H});
    check(w.mtp->norm, "mtp.norm", {H});
    validate_layer(c, w.mtp->layer, "mtp.layers.0.", check);
  }
}

}  // namespace qwen36
