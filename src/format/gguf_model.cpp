#include "format/gguf_model.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstring>

#include "core/error.h"
#include "format/gguf.h"
#include "format/weight_convert.h"

namespace qwen36 {

namespace {

class GgufModelReader {
 public:
  GgufModelReader(const GgufFile& f, ModelWeights& w) : f_(f), w_(w) {}

  const Tensor* find(const std::string& name) const {
    const GgufTensorInfo* t = f_.find_tensor(name);
    return t ? &t->tensor : nullptr;
  }
  const Tensor& get(const std::string& name) const {
    const Tensor* t = find(name);
    QWEN36_CHECK(t, "missing tensor {}", name);
    return *t;
  }
  Tensor f32(const std::string& name, std::initializer_list<int64_t> shape = {}) {
    return to_f32(w_, get(name), shape);
  }

  // A copy of `t` whose value-head blocks (block_rows rows each, starting at row0) are moved
  // from tiled to grouped order. Rows are independent in every GGUF type, so this is exact.
  Tensor regroup_rows(const Tensor& t, int64_t row0, int64_t block_rows) {
    const auto perm = gguf_tiled_heads(Hk_, Hv_);
    auto buf = std::make_shared<HostBuffer>(t.nbytes());
    std::memcpy(buf->data(), t.data, t.nbytes());
    const size_t rb = t.row_bytes() * size_t(block_rows);
    const auto* src = static_cast<const std::byte*>(t.data) + size_t(row0) * t.row_bytes();
    for (int64_t p = 0; p < Hv_; ++p)
      std::memcpy(buf->data() + size_t(row0) * t.row_bytes() + size_t(perm[size_t(p)]) * rb, src + size_t(p) * rb, rb);
    w_.storage.push_back(buf);
    Tensor out = t;
    out.data = buf->data();
    return out;
  }
  void set_heads(int64_t Hk, int64_t Hv) { Hk_ = Hk, Hv_ = Hv; }

 private:
  const GgufFile& f_;
  ModelWeights& w_;
  int64_t Hk_ = 1, Hv_ = 1;
};

ModelConfig read_config(const GgufFile& f, std::string& arch) {
  arch = std::string(f.get_str("general.architecture"));
  QWEN36_CHECK(arch == "qwen35" || arch == "qwen35moe",
               "architecture \"{}\" is not a Qwen3.5/3.6 model (expected qwen35 or qwen35moe)", arch);
  auto key = [&](const char* k) { return arch + "." + k; };
  auto opt_int = [&](const char* k, int64_t d) { return f.has(key(k)) ? f.get_int(key(k)) : d; };
  ModelConfig c;
  c.architecture = arch;
  c.moe = arch == "qwen35moe";
  c.mtp_layers = opt_int("nextn_predict_layers", 0);
  c.n_layers = f.get_int(key("block_count")) - c.mtp_layers;
  QWEN36_CHECK(c.n_layers > 0 && c.n_layers <= 1024, "{} = {} is out of range", key("block_count"), c.n_layers);
  c.hidden_size = f.get_int(key("embedding_length"));
  c.max_position_embeddings = opt_int("context_length", 262144);
  c.n_heads = f.get_int(key("attention.head_count"));
  c.n_kv_heads = opt_int("attention.head_count_kv", c.n_heads);
  c.head_dim = opt_int("attention.key_length", c.n_heads ? c.hidden_size / c.n_heads : 0);
  QWEN36_CHECK(opt_int("attention.value_length", c.head_dim) == c.head_dim,
               "attention value_length differs from key_length (not a Qwen3.5/3.6 layout)");
  c.rms_norm_eps = float(f.get_float(key("attention.layer_norm_rms_epsilon")));
  c.rope_theta = f.has(key("rope.freq_base")) ? float(f.get_float(key("rope.freq_base"))) : 1e7f;
  c.rotary_dim = opt_int("rope.dimension_count", c.head_dim);
  c.conv_kernel = f.get_int(key("ssm.conv_kernel"));
  c.linear_k_dim = f.get_int(key("ssm.state_size"));
  c.linear_k_heads = f.get_int(key("ssm.group_count"));
  c.linear_v_heads = f.get_int(key("ssm.time_step_rank"));
  const int64_t inner = f.get_int(key("ssm.inner_size"));
  QWEN36_CHECK(c.linear_v_heads > 0 && inner % c.linear_v_heads == 0, "{} = {} is not a multiple of {} heads",
               key("ssm.inner_size"), inner, c.linear_v_heads);
  c.linear_v_dim = inner / c.linear_v_heads;  // may differ from the key head dim (llama.cpp assumes equal)
  if (c.moe) {
    c.n_experts = f.get_int(key("expert_count"));
    c.n_experts_per_tok = f.get_int(key("expert_used_count"));
    c.moe_intermediate_size = f.get_int(key("expert_feed_forward_length"));
    c.shared_expert_intermediate_size = opt_int("expert_shared_feed_forward_length", 0);
  } else {
    c.intermediate_size = f.get_int(key("feed_forward_length"));
  }
  // Layer kinds from the tensors themselves (a DeltaNet layer has attn_qkv), cross-checked
  // against full_attention_interval when the file states it.
  const int64_t interval = opt_int("full_attention_interval", 0);
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const bool linear = f.find_tensor(fmt::format("blk.{}.attn_qkv.weight", i)) != nullptr;
    c.layer_kinds.push_back(linear ? LayerKind::LinearAttention : LayerKind::FullAttention);
    if (interval > 0)
      QWEN36_CHECK(linear == ((i + 1) % interval != 0), "layer {} contradicts full_attention_interval {}", i, interval);
  }
  const Tensor& emb = f.tensor("token_embd.weight");
  QWEN36_CHECK(emb.ndim == 2 && emb.dim(1) == c.hidden_size, "token_embd.weight has shape {}", emb.shape_str());
  c.vocab_size = emb.dim(0);
  c.tie_word_embeddings = f.find_tensor("output.weight") == nullptr;
  if (f.has("tokenizer.ggml.eos_token_id")) c.eos_token_ids = {int32_t(f.get_int("tokenizer.ggml.eos_token_id"))};
  c.validate();
  return c;
}

LayerWeights read_layer(GgufModelReader& r, const ModelConfig& c, int64_t i, LayerKind kind) {
  const std::string p = fmt::format("blk.{}.", i);
  LayerWeights l;
  l.kind = kind;
  l.input_norm = r.f32(p + "attn_norm.weight");
  l.post_attention_norm = r.f32(p + "post_attention_norm.weight");
  if (kind == LayerKind::FullAttention) {
    l.attn.q_proj = r.get(p + "attn_q.weight");
    l.attn.k_proj = r.get(p + "attn_k.weight");
    l.attn.v_proj = r.get(p + "attn_v.weight");
    l.attn.o_proj = r.get(p + "attn_output.weight");
    l.attn.q_norm = r.f32(p + "attn_q_norm.weight");
    l.attn.k_norm = r.f32(p + "attn_k_norm.weight");
  } else {
    auto& d = l.deltanet;
    const int64_t kd = c.linear_key_dim(), dv = c.linear_v_dim;
    d.in_proj_qkv = r.regroup_rows(r.get(p + "attn_qkv.weight"), 2 * kd, dv);
    d.in_proj_z = r.regroup_rows(r.get(p + "attn_gate.weight"), 0, dv);
    d.in_proj_b = r.regroup_rows(r.get(p + "ssm_beta.weight"), 0, 1);
    d.in_proj_a = r.regroup_rows(r.get(p + "ssm_alpha.weight"), 0, 1);
    d.conv1d = r.regroup_rows(r.f32(p + "ssm_conv1d.weight"), 2 * kd, dv);  // [C, K]
    d.dt_bias = r.regroup_rows(r.f32(p + "ssm_dt.bias", {c.linear_v_heads, 1}), 0, 1);
    d.dt_bias.ndim = 1;
    d.a_neg_exp = r.regroup_rows(r.f32(p + "ssm_a", {c.linear_v_heads, 1}), 0, 1);
    d.a_neg_exp.ndim = 1;
    d.norm = r.f32(p + "ssm_norm.weight");
    d.out_proj = r.get(p + "ssm_out.weight");
    d.out_proj_heads = gguf_tiled_heads(c.linear_k_heads, c.linear_v_heads);
  }
  if (c.moe) {
    l.moe.router = r.get(p + "ffn_gate_inp.weight");
    const Tensor& g = r.get(p + "ffn_gate_exps.weight");  // [E, I, H]
    const Tensor& u = r.get(p + "ffn_up_exps.weight");
    const Tensor& dn = r.get(p + "ffn_down_exps.weight");  // [E, H, I]
    QWEN36_CHECK(g.ndim == 3 && u.ndim == 3 && dn.ndim == 3 && g.dim(0) == c.n_experts && u.dim(0) == c.n_experts &&
                     dn.dim(0) == c.n_experts,
                 "{}ffn_*_exps: expected {} experts, got {} / {} / {}", p, c.n_experts, g.shape_str(), u.shape_str(),
                 dn.shape_str());
    auto expert = [](const Tensor& t, int64_t e) {
      Tensor v(nullptr, t.dtype, {t.dim(1), t.dim(2)});
      v.data = static_cast<std::byte*>(t.data) + size_t(e) * v.nbytes();
      return v;
    };
    for (int64_t e = 0; e < c.n_experts; ++e) l.moe.experts.push_back({expert(g, e), expert(u, e), expert(dn, e)});
    if (c.shared_expert_intermediate_size > 0) {
      l.moe.shared = {r.get(p + "ffn_gate_shexp.weight"), r.get(p + "ffn_up_shexp.weight"),
                      r.get(p + "ffn_down_shexp.weight")};
      Tensor sg = r.get(p + "ffn_gate_inp_shexp.weight");  // ne {H}: one row
      l.moe.shared_gate = Tensor(sg.data, sg.dtype, {1, c.hidden_size});
      QWEN36_CHECK(sg.numel() == c.hidden_size, "{}ffn_gate_inp_shexp.weight has shape {}", p, sg.shape_str());
    }
  } else {
    l.mlp = {r.get(p + "ffn_gate.weight"), r.get(p + "ffn_up.weight"), r.get(p + "ffn_down.weight")};
  }
  return l;
}

}  // namespace

ModelWeights load_gguf_model(const std::string& path) {
  auto file = std::make_shared<GgufFile>(path);
  ModelWeights w;
  w.storage.push_back(file);
  return with_context(path, [&] {
    std::string arch;
    w.config = read_config(*file, arch);
    const ModelConfig& c = w.config;
    GgufModelReader r(*file, w);
    r.set_heads(c.linear_k_heads, c.linear_v_heads);
    w.embed_tokens = r.get("token_embd.weight");
    w.final_norm = r.f32("output_norm.weight");
    w.lm_head = c.tie_word_embeddings ? w.embed_tokens : r.get("output.weight");
    for (int64_t i = 0; i < c.n_layers; ++i) w.layers.push_back(read_layer(r, c, i, c.layer_kinds[size_t(i)]));
    if (c.mtp_layers > 0) {
      const std::string p = fmt::format("blk.{}.", c.n_layers);
      MtpWeights m;
      m.fc = r.get(p + "nextn.eh_proj.weight");
      m.pre_fc_norm_embedding = r.f32(p + "nextn.enorm.weight");
      m.pre_fc_norm_hidden = r.f32(p + "nextn.hnorm.weight");
      m.norm = r.f32(p + "nextn.shared_head_norm.weight");
      m.layer = read_layer(r, c, c.n_layers, LayerKind::FullAttention);
      w.mtp = std::move(m);
    }
    validate_weights(w);
    spdlog::debug("{}: GGUF v{}, {} tensors", path, file->version(), file->tensors().size());
    return std::move(w);
  });
}

}  // namespace qwen36
