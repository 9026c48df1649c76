#include "format/hf_loader.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/log.h"
#include "format/hf_config.h"
#include "format/hf_quant.h"
#include "format/safetensors.h"
#include "format/weight_convert.h"

namespace qwen36 {

namespace {

// Name lookup over one checkpoint with the text-model prefix already resolved.
class HfNames {
 public:
  HfNames(const SafetensorsSet& st, std::string prefix, ModelWeights& w, const HfQuant& quant)
      : st_(st), prefix_(std::move(prefix)), w_(w), quant_(quant) {}

  const Tensor* find(const std::string& name) const { return st_.find(name); }
  const Tensor& get(const std::string& name) const {
    const Tensor* t = st_.find(name);
    QWEN36_CHECK(t, "missing tensor {}", name);
    return *t;
  }
  // A matrix stays in its stored float dtype (the backend multiplies any of them); a Linear
  // stored quantized (format/hf_quant.h) becomes an internal block type.
  Tensor matrix(const std::string& name) const {
    Tensor q;
    if (quant_.quantized() && name.ends_with(".weight") &&
        load_hf_quant_linear(w_, st_, quant_, name.substr(0, name.size() - 7), q)) {
      if (q.dtype == DType::F32 && f32_fallbacks_++ == 0) first_fallback_ = name;
      return q;
    }
    const Tensor& t = get(name);
    QWEN36_CHECK(t.dtype == DType::BF16 || t.dtype == DType::F16 || t.dtype == DType::F32,
                 "tensor {} has dtype {}; expected bf16, f16 or f32", name, dtype_name(t.dtype));
    return t;
  }
  const std::string& prefix() const { return prefix_; }
  // Quantized Linears that came back as f32 (act-order groups mixed inside 32 columns).
  int64_t f32_fallbacks() const { return f32_fallbacks_; }
  const std::string& first_fallback() const { return first_fallback_; }

 private:
  const SafetensorsSet& st_;
  std::string prefix_;
  ModelWeights& w_;
  const HfQuant& quant_;
  mutable int64_t f32_fallbacks_ = 0;
  mutable std::string first_fallback_;
};

void load_mlp(const HfNames& n, const std::string& p, MlpWeights& m) {
  m.gate_proj = n.matrix(p + "gate_proj.weight");
  m.up_proj = n.matrix(p + "up_proj.weight");
  m.down_proj = n.matrix(p + "down_proj.weight");
}

// Routed experts come either fused and 3-D (gate_up_proj [E, 2I, H], down_proj [E, H, I];
// gate rows first) or one tensor per expert. Both become per-expert 2-D views.
void load_experts(const HfNames& n, const std::string& p, const ModelConfig& c, MoeWeights& moe) {
  const int64_t E = c.n_experts, I = c.moe_intermediate_size, H = c.hidden_size;
  moe.experts.resize(size_t(E));
  if (const Tensor* gu = n.find(p + "experts.gate_up_proj")) {
    const Tensor down = n.matrix(p + "experts.down_proj");
    const Tensor gate_up = n.matrix(p + "experts.gate_up_proj");
    QWEN36_CHECK(gu->ndim == 3 && gu->dim(0) == E && gu->dim(1) == 2 * I && gu->dim(2) == H,
                 "tensor {}experts.gate_up_proj has shape {}, expected [{}, {}, {}]", p, gu->shape_str(), E, 2 * I, H);
    QWEN36_CHECK(down.ndim == 3 && down.dim(0) == E && down.dim(1) == H && down.dim(2) == I,
                 "tensor {}experts.down_proj has shape {}, expected [{}, {}, {}]", p, down.shape_str(), E, H, I);
    const size_t esz = dtype_block_bytes(gate_up.dtype);
    for (int64_t e = 0; e < E; ++e) {
      auto* base = static_cast<std::byte*>(gate_up.data) + size_t(e * 2 * I * H) * esz;
      moe.experts[size_t(e)].gate_proj = Tensor(base, gate_up.dtype, {I, H});
      moe.experts[size_t(e)].up_proj = Tensor(base + size_t(I * H) * esz, gate_up.dtype, {I, H});
      moe.experts[size_t(e)].down_proj =
          Tensor(static_cast<std::byte*>(down.data) + size_t(e * H * I) * dtype_block_bytes(down.dtype), down.dtype,
                 {H, I});
    }
    return;
  }
  for (int64_t e = 0; e < E; ++e) load_mlp(n, fmt::format("{}experts.{}.", p, e), moe.experts[size_t(e)]);
}

LayerWeights load_layer(ModelWeights& w, const HfNames& n, const std::string& p, LayerKind kind) {
  const ModelConfig& c = w.config;
  LayerWeights l;
  l.kind = kind;
  l.input_norm = norm_plus_one(w, n.get(p + "input_layernorm.weight"));
  l.post_attention_norm = norm_plus_one(w, n.get(p + "post_attention_layernorm.weight"));
  if (kind == LayerKind::FullAttention) {
    const std::string a = p + "self_attn.";
    l.attn.q_proj = n.matrix(a + "q_proj.weight");
    l.attn.k_proj = n.matrix(a + "k_proj.weight");
    l.attn.v_proj = n.matrix(a + "v_proj.weight");
    l.attn.o_proj = n.matrix(a + "o_proj.weight");
    l.attn.q_norm = norm_plus_one(w, n.get(a + "q_norm.weight"));
    l.attn.k_norm = norm_plus_one(w, n.get(a + "k_norm.weight"));
  } else {
    const std::string d = p + "linear_attn.";
    auto& g = l.deltanet;
    g.in_proj_qkv = n.matrix(d + "in_proj_qkv.weight");
    g.in_proj_z = n.matrix(d + "in_proj_z.weight");
    g.in_proj_b = n.matrix(d + "in_proj_b.weight");
    g.in_proj_a = n.matrix(d + "in_proj_a.weight");
    const Tensor& conv = n.get(d + "conv1d.weight");  // [C, 1, K]
    QWEN36_CHECK(conv.ndim == 3 && conv.dim(1) == 1, "tensor {}conv1d.weight has shape {}, expected [C, 1, K]", d,
                 conv.shape_str());
    g.conv1d = to_f32(w, conv, {conv.dim(0), conv.dim(2)});
    g.dt_bias = to_f32(w, n.get(d + "dt_bias"));
    g.a_neg_exp = convert_f32(w, n.get(d + "A_log"), [](float x) { return -std::exp(x); });
    g.norm = to_f32(w, n.get(d + "norm.weight"));
    g.out_proj = n.matrix(d + "out_proj.weight");
  }
  const std::string m = p + "mlp.";
  if (c.moe) {
    l.moe.router = n.matrix(m + "gate.weight");
    load_experts(n, m, c, l.moe);
    if (c.shared_expert_intermediate_size > 0) {
      load_mlp(n, m + "shared_expert.", l.moe.shared);
      l.moe.shared_gate = n.matrix(m + "shared_expert_gate.weight");
    }
  } else {
    load_mlp(n, m, l.mlp);
  }
  return l;
}

}  // namespace

ModelWeights load_hf_checkpoint(const std::string& dir) {
  ModelWeights w;
  w.config = load_hf_config(dir);
  const HfQuant quant = read_hf_quant(dir);  // throws for an unsupported format or option
  if (quant.quantized()) spdlog::info("{}: {} checkpoint", dir, quant.describe());
  auto st = std::make_shared<SafetensorsSet>(dir);
  w.storage.push_back(st);
  return with_context(dir, [&] {
    // Multimodal wrappers nest the text model under model.language_model.
    const std::string prefix =
        st->find("model.language_model.embed_tokens.weight") ? "model.language_model." : "model.";
    HfNames n(*st, prefix, w, quant);
    const ModelConfig& c = w.config;
    w.embed_tokens = n.matrix(prefix + "embed_tokens.weight");
    w.final_norm = norm_plus_one(w, n.get(prefix + "norm.weight"));
    if (c.tie_word_embeddings) {
      w.lm_head = w.embed_tokens;
    } else {
      w.lm_head = n.matrix("lm_head.weight");
    }
    for (int64_t i = 0; i < c.n_layers; ++i)
      w.layers.push_back(load_layer(w, n, fmt::format("{}layers.{}.", prefix, i), c.layer_kinds[size_t(i)]));

    // MTP weights are optional: tiny test checkpoints announce an MTP layer they do not hold.
    if (c.mtp_layers > 0 && st->find("mtp.fc.weight")) {
      MtpWeights mtp;
      mtp.fc = n.matrix("mtp.fc.weight");
      mtp.pre_fc_norm_embedding = norm_plus_one(w, n.get("mtp.pre_fc_norm_embedding.weight"));
      mtp.pre_fc_norm_hidden = norm_plus_one(w, n.get("mtp.pre_fc_norm_hidden.weight"));
      mtp.norm = norm_plus_one(w, n.get("mtp.norm.weight"));
      mtp.layer = load_layer(w, n, "mtp.layers.0.", LayerKind::FullAttention);
      w.mtp = std::move(mtp);
    } else if (c.mtp_layers > 0) {
      spdlog::debug("config announces {} MTP layer(s) but the checkpoint has no mtp.* tensors", c.mtp_layers);
    }
    if (n.f32_fallbacks() > 0)
      spdlog::warn("{} quantized Linear(s), {} first, use an act-order g_idx that mixes groups within 32 columns: "
                   "stored dequantized as f32 (exact, 8x memory)",
                   n.f32_fallbacks(), n.first_fallback());
    validate_weights(w);
    return std::move(w);
  });
}

}  // namespace qwen36
