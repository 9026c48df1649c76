#include "format/gguf_convert.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/file_text.h"
#include "format/hf_config.h"
#include "format/safetensors.h"
#include "quant/quant.h"
#ifdef QWEN36_HAVE_PCRE2
#include "text/tokenizer.h"
#endif

namespace qwen36 {

namespace fs = std::filesystem;

GgufMetadata gguf_metadata_for_config(const ModelConfig& c, const std::string& name, uint32_t file_type) {
  const std::string a = c.moe ? "qwen35moe" : "qwen35";
  auto k = [&](const char* s) { return a + "." + s; };
  auto u32 = [](int64_t v) { return uint32_t(v); };
  GgufMetadata m;
  m.set_str("general.architecture", a);
  m.set_str("general.type", "model");
  m.set_str("general.name", name);
  m.set_u32(k("block_count"), u32(c.n_layers + c.mtp_layers));
  m.set_u32(k("context_length"), u32(c.max_position_embeddings));
  m.set_u32(k("embedding_length"), u32(c.hidden_size));
  if (!c.moe) m.set_u32(k("feed_forward_length"), u32(c.intermediate_size));
  m.set_u32(k("attention.head_count"), u32(c.n_heads));
  m.set_u32(k("attention.head_count_kv"), u32(c.n_kv_heads));
  m.set_f32(k("rope.freq_base"), c.rope_theta);
  m.set_f32(k("attention.layer_norm_rms_epsilon"), c.rms_norm_eps);
  if (c.moe) {
    m.set_u32(k("expert_count"), u32(c.n_experts));
    m.set_u32(k("expert_used_count"), u32(c.n_experts_per_tok));
  }
  m.set_u32(k("attention.key_length"), u32(c.head_dim));
  m.set_u32(k("attention.value_length"), u32(c.head_dim));
  m.set_u32("general.file_type", file_type);
  if (c.moe) {
    m.set_u32(k("expert_feed_forward_length"), u32(c.moe_intermediate_size));
    if (c.shared_expert_intermediate_size > 0)
      m.set_u32(k("expert_shared_feed_forward_length"), u32(c.shared_expert_intermediate_size));
  }
  m.set_u32(k("ssm.conv_kernel"), u32(c.conv_kernel));
  m.set_u32(k("ssm.state_size"), u32(c.linear_k_dim));
  m.set_u32(k("ssm.group_count"), u32(c.linear_k_heads));
  m.set_u32(k("ssm.time_step_rank"), u32(c.linear_v_heads));
  m.set_u32(k("ssm.inner_size"), u32(c.linear_value_dim()));
  // The interval of the layer pattern (the first full-attention layer's index + 1), written
  // only when every layer follows it; otherwise readers take the kinds from the tensors.
  int64_t interval = 0;
  for (int64_t i = 0; i < c.n_layers && !interval; ++i)
    if (c.layer_kinds[size_t(i)] == LayerKind::FullAttention) interval = i + 1;
  for (int64_t i = 0; i < c.n_layers && interval; ++i)
    if ((c.layer_kinds[size_t(i)] == LayerKind::FullAttention) != ((i + 1) % interval == 0)) interval = 0;
  if (interval > 0) m.set_u32(k("full_attention_interval"), u32(interval));
  m.set_u32(k("rope.dimension_count"), u32(c.rotary_dim));
  const int32_t sections[4] = {11, 11, 10, 0};  // the converter's default mrope sections
  m.set_arr(k("rope.dimension_sections"), GgufType::I32, sections, 4);
  if (c.mtp_layers > 0) m.set_u32(k("nextn_predict_layers"), u32(c.mtp_layers));
  m.set_u32("general.quantization_version", 2);
  return m;
}

void set_tokenizer_metadata(GgufMetadata& m, const GgufVocab& v) {
  m.set_str("tokenizer.ggml.model", "gpt2");
  m.set_str("tokenizer.ggml.pre", v.pre);
  m.set_arr_str("tokenizer.ggml.tokens", v.tokens);
  m.set_arr("tokenizer.ggml.token_type", GgufType::I32, v.token_types.data(), v.token_types.size());
  m.set_arr_str("tokenizer.ggml.merges", v.merges);
  if (v.eos >= 0) m.set_u32("tokenizer.ggml.eos_token_id", uint32_t(v.eos));
  if (v.bos >= 0) m.set_u32("tokenizer.ggml.bos_token_id", uint32_t(v.bos));
  if (v.pad >= 0) m.set_u32("tokenizer.ggml.padding_token_id", uint32_t(v.pad));
  m.set_bool("tokenizer.ggml.add_bos_token", false);
  if (!v.chat_template.empty()) m.set_str("tokenizer.chat_template", v.chat_template);
}

#ifdef QWEN36_HAVE_PCRE2
namespace {
// tokenizer_config.json writes special tokens as a string or as {"content": ...}.
std::string token_content(const nlohmann::json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return "";
}
}  // namespace

GgufVocab vocab_from_hf_dir(const std::string& dir, int64_t vocab_size) {
  const text::TokenizerSpec spec = text::Tokenizer::spec_from_json(read_file((fs::path(dir) / "tokenizer.json").string()));
  GgufVocab v;
  int64_t n = std::max<int64_t>(vocab_size, int64_t(spec.tokens.size()));
  for (const text::AddedToken& t : spec.added_tokens) n = std::max<int64_t>(n, int64_t(t.id) + 1);
  if (n > vocab_size) spdlog::warn("{}: the tokenizer has {} ids, the model only {}", dir, n, vocab_size);
  v.tokens.assign(size_t(n), "");
  v.token_types.assign(size_t(n), 1);
  for (size_t i = 0; i < spec.tokens.size(); ++i) v.tokens[i] = spec.tokens[i];
  for (const text::AddedToken& t : spec.added_tokens) {
    QWEN36_CHECK(t.id >= 0 && t.id < n, "added token {} has id {} outside the vocabulary", t.content, t.id);
    v.tokens[size_t(t.id)] = t.content;
    v.token_types[size_t(t.id)] = t.special ? 3 : 4;
  }
  for (int64_t i = 0; i < n; ++i)
    if (v.tokens[size_t(i)].empty()) v.tokens[size_t(i)] = fmt::format("[PAD{}]", i), v.token_types[size_t(i)] = 5;
  for (const auto& [l, r] : spec.merges) v.merges.push_back(l + " " + r);
  if (spec.pattern == text::pattern_for_pre("qwen35")) v.pre = "qwen35";
  else if (spec.pattern == text::pattern_for_pre("qwen2")) v.pre = "qwen2";
  else spdlog::warn("{}: pre-tokenizer regex is neither Qwen3's nor Qwen3.5's; writing pre = qwen35", dir);

  auto id_of = [&](const std::string& s) -> int32_t {
    if (s.empty()) return -1;
    for (size_t i = 0; i < v.tokens.size(); ++i)
      if (v.tokens[i] == s) return int32_t(i);
    return -1;
  };
  const fs::path cfg = fs::path(dir) / "tokenizer_config.json";
  if (fs::exists(cfg)) {
    const auto j = nlohmann::json::parse(read_file(cfg.string()), nullptr, false);
    if (j.is_object()) {
      if (j.contains("eos_token")) v.eos = id_of(token_content(j["eos_token"]));
      if (j.contains("pad_token")) v.pad = id_of(token_content(j["pad_token"]));
      if (j.contains("bos_token")) v.bos = id_of(token_content(j["bos_token"]));
      if (j.contains("chat_template") && j["chat_template"].is_string()) v.chat_template = j["chat_template"];
    }
  }
  // Qwen has no BOS token; llama.cpp's files name <|endoftext|> (and never add it).
  if (v.bos < 0) v.bos = id_of("<|endoftext|>");
  if (v.eos < 0) v.eos = id_of("<|endoftext|>");
  if (v.chat_template.empty() && fs::exists(fs::path(dir) / "chat_template.jinja"))
    v.chat_template = read_file((fs::path(dir) / "chat_template.jinja").string());
  return v;
}
#else
GgufVocab vocab_from_hf_dir(const std::string& dir, int64_t) {
  fail("{}: this qwen36 was built without PCRE2, so it cannot read tokenizer.json", dir);
}
#endif

namespace {

float identity(float x) { return x; }
float plus_one(float x) { return 1.0f + x; }
float neg_exp(float x) { return -std::exp(x); }

// grouped_of_tiled[p]: the HF (grouped) value head stored at tiled position p.
std::vector<int64_t> grouped_of_tiled(int64_t Hk, int64_t Hv) {
  const int64_t r = Hv / Hk;
  std::vector<int64_t> g(static_cast<size_t>(Hv));
  for (int64_t j = 0; j < r; ++j)
    for (int64_t i = 0; i < Hk; ++i) g[size_t(j * Hk + i)] = i * r + j;
  return g;
}

class HfPlanner {
 public:
  HfPlanner(const SafetensorsSet& st, const ModelConfig& c, DType mt, std::vector<TensorSource>& out)
      : st_(st), c_(c), mt_(mt), out_(out), heads_(grouped_of_tiled(c.linear_k_heads, c.linear_v_heads)) {}

  const Tensor& get(const std::string& name) const {
    const Tensor* t = st_.find(name);
    QWEN36_CHECK(t, "missing tensor {}", name);
    QWEN36_CHECK(t->dtype == DType::BF16 || t->dtype == DType::F16 || t->dtype == DType::F32,
                 "tensor {} has dtype {}; expected bf16, f16 or f32", name, dtype_name(t->dtype));
    return *t;
  }
  bool has(const std::string& name) const { return st_.find(name) != nullptr; }

  // A tensor whose GGUF row r is source row row_map(r), columns optionally permuted (out
  // column j = source column col_map[j]) and each value passed through f.
  void add(std::string name, const Tensor& src, std::vector<int64_t> shape, bool small_f32,
           std::function<int64_t(int64_t)> row_map = {}, std::vector<int64_t> col_map = {},
           float (*f)(float) = identity) {
    TensorSource s;
    s.name = std::move(name);
    s.shape = std::move(shape);
    s.dtype = small_f32 ? DType::F32 : mt_;
    const int64_t cols = s.cols();
    // A row-mapped source (fused experts) may hold more rows than it supplies.
    QWEN36_CHECK(row_map ? src.numel() >= s.rows() * cols && src.numel() % cols == 0 : src.numel() == s.rows() * cols,
                 "tensor for {} has shape {}, expected {} elements", s.name, src.shape_str(), s.rows() * cols);
    const bool plain = !row_map && col_map.empty() && f == identity;
    if (plain && src.dtype == s.dtype) s.raw = src.data;
    const Tensor t = src;
    s.row_f32 = [t, cols, row_map, col_map, f](int64_t r, float* dst) {
      const int64_t sr = row_map ? row_map(r) : r;
      const auto* p = static_cast<const std::byte*>(t.data) + size_t(sr) * dtype_row_bytes(t.dtype, cols);
      if (col_map.empty()) {
        dequantize_row(t.dtype, p, dst, cols);
      } else {
        std::vector<float> tmp(static_cast<size_t>(cols));
        dequantize_row(t.dtype, p, tmp.data(), cols);
        for (int64_t j = 0; j < cols; ++j) dst[j] = tmp[size_t(col_map[size_t(j)])];
      }
      if (f != identity)
        for (int64_t j = 0; j < cols; ++j) dst[j] = f(dst[j]);
    };
    out_.push_back(std::move(s));
  }
  void matrix(const std::string& gguf, const std::string& hf) {
    const Tensor& t = get(hf);
    add(gguf, t, std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.ndim), false);
  }
  void norm(const std::string& gguf, const std::string& hf, bool one) {
    const Tensor& t = get(hf);
    add(gguf, t, {t.numel()}, true, {}, {}, one ? plus_one : identity);
  }

  // Row map of a tensor with `row0` leading rows kept and then Hv blocks of `block` rows tiled.
  std::function<int64_t(int64_t)> tiled_rows(int64_t row0, int64_t block) const {
    return [row0, block, h = heads_](int64_t r) {
      if (r < row0) return r;
      const int64_t p = (r - row0) / block, w = (r - row0) % block;
      return row0 + h[size_t(p)] * block + w;
    };
  }
  std::vector<int64_t> tiled_cols(int64_t block) const {
    std::vector<int64_t> m;
    for (int64_t p = 0; p < c_.linear_v_heads; ++p)
      for (int64_t w = 0; w < block; ++w) m.push_back(heads_[size_t(p)] * block + w);
    return m;
  }

  void mlp(const std::string& b, const std::string& m, const std::string& suffix) {
    matrix(b + "ffn_gate" + suffix, m + "gate_proj.weight");
    matrix(b + "ffn_up" + suffix, m + "up_proj.weight");
    matrix(b + "ffn_down" + suffix, m + "down_proj.weight");
  }

  // Routed experts as three stacked [E, rows, cols] tensors, from either HF layout.
  void experts(const std::string& b, const std::string& m) {
    const int64_t E = c_.n_experts, I = c_.moe_intermediate_size, H = c_.hidden_size;
    if (has(m + "experts.gate_up_proj")) {
      const Tensor& gu = get(m + "experts.gate_up_proj");  // [E, 2I, H], gate rows first
      const Tensor& dn = get(m + "experts.down_proj");     // [E, H, I]
      QWEN36_CHECK(gu.numel() == E * 2 * I * H && dn.numel() == E * H * I, "{}experts: shapes {} / {}", m,
                   gu.shape_str(), dn.shape_str());
      add(b + "ffn_gate_exps.weight", gu, {E, I, H}, false, [I](int64_t r) { return (r / I) * 2 * I + r % I; });
      add(b + "ffn_up_exps.weight", gu, {E, I, H}, false, [I](int64_t r) { return (r / I) * 2 * I + I + r % I; });
      add(b + "ffn_down_exps.weight", dn, {E, H, I}, false);
      return;
    }
    // One tensor per expert: the rows of expert e come from its own tensor.
    for (const char* proj : {"gate", "up", "down"}) {
      std::vector<Tensor> parts;
      for (int64_t e = 0; e < E; ++e) parts.push_back(get(fmt::format("{}experts.{}.{}_proj.weight", m, e, proj)));
      const bool down = std::string(proj) == "down";
      const int64_t rows = down ? H : I, cols = down ? I : H;
      for (const Tensor& t : parts)
        QWEN36_CHECK(t.ndim == 2 && t.dim(0) == rows && t.dim(1) == cols, "{}experts.*.{}_proj: shape {}", m, proj,
                     t.shape_str());
      TensorSource s;
      s.name = b + "ffn_" + proj + "_exps.weight";
      s.shape = {E, rows, cols};
      s.dtype = mt_;
      s.row_f32 = [parts, rows, cols](int64_t r, float* dst) {
        const Tensor& t = parts[size_t(r / rows)];
        dequantize_row(t.dtype, t.row(r % rows), dst, cols);
      };
      out_.push_back(std::move(s));
    }
  }

  void layer(int64_t i, const std::string& p, LayerKind kind) {
    const std::string b = fmt::format("blk.{}.", i);
    norm(b + "attn_norm.weight", p + "input_layernorm.weight", true);
    if (kind == LayerKind::LinearAttention) {
      const std::string d = p + "linear_attn.";
      const int64_t Hv = c_.linear_v_heads, dv = c_.linear_v_dim, H = c_.hidden_size;
      const Tensor& alog = get(d + "A_log");
      add(b + "ssm_a", alog, {Hv}, true, {}, tiled_cols(1), neg_exp);
      const Tensor& conv = get(d + "conv1d.weight");  // [C, 1, K] → ne {K, C}
      add(b + "ssm_conv1d.weight", conv, {c_.conv_dim(), c_.conv_kernel}, true,
          tiled_rows(2 * c_.linear_key_dim(), dv));
      add(b + "ssm_dt.bias", get(d + "dt_bias"), {Hv}, true, {}, tiled_cols(1));
      add(b + "ssm_alpha.weight", get(d + "in_proj_a.weight"), {Hv, H}, false, tiled_rows(0, 1));
      add(b + "ssm_beta.weight", get(d + "in_proj_b.weight"), {Hv, H}, false, tiled_rows(0, 1));
      add(b + "attn_qkv.weight", get(d + "in_proj_qkv.weight"), {c_.conv_dim(), H}, false,
          tiled_rows(2 * c_.linear_key_dim(), dv));
      add(b + "attn_gate.weight", get(d + "in_proj_z.weight"), {Hv * dv, H}, false, tiled_rows(0, dv));
      norm(b + "ssm_norm.weight", d + "norm.weight", false);
      add(b + "ssm_out.weight", get(d + "out_proj.weight"), {H, Hv * dv}, false, {}, tiled_cols(dv));
    }
    const std::string m = p + "mlp.";
    if (c_.moe) {
      experts(b, m);
      const Tensor& router = get(m + "gate.weight");
      add(b + "ffn_gate_inp.weight", router, {c_.n_experts, c_.hidden_size}, true);
      if (c_.shared_expert_intermediate_size > 0) {
        mlp(b, m + "shared_expert.", "_shexp.weight");
        add(b + "ffn_gate_inp_shexp.weight", get(m + "shared_expert_gate.weight"), {1, c_.hidden_size}, true);
      }
    } else {
      mlp(b, m, ".weight");
    }
    norm(b + "post_attention_norm.weight", p + "post_attention_layernorm.weight", true);
    if (kind == LayerKind::FullAttention) {
      const std::string a = p + "self_attn.";
      norm(b + "attn_k_norm.weight", a + "k_norm.weight", true);
      matrix(b + "attn_k.weight", a + "k_proj.weight");
      matrix(b + "attn_output.weight", a + "o_proj.weight");
      norm(b + "attn_q_norm.weight", a + "q_norm.weight", true);
      matrix(b + "attn_q.weight", a + "q_proj.weight");
      matrix(b + "attn_v.weight", a + "v_proj.weight");
    }
  }

 private:
  const SafetensorsSet& st_;
  const ModelConfig& c_;
  DType mt_;
  std::vector<TensorSource>& out_;
  std::vector<int64_t> heads_;
};

uint32_t ftype_of(DType t) {
  return t == DType::F32 ? 0u : t == DType::F16 ? 1u : 32u;
}

}  // namespace

ModelPlan plan_from_hf(const std::string& dir, DType matrix_type) {
  QWEN36_CHECK(matrix_type == DType::BF16 || matrix_type == DType::F16 || matrix_type == DType::F32,
               "convert: output type must be bf16, f16 or f32, not {}", dtype_name(matrix_type));
  ModelConfig c = load_hf_config(dir);
  auto st = std::make_shared<SafetensorsSet>(dir);
  ModelPlan plan;
  plan.keep_alive.push_back(st);
  return with_context(dir, [&] {
    const bool has_mtp = c.mtp_layers > 0 && st->find("mtp.fc.weight");
    if (!has_mtp && c.mtp_layers > 0)
      spdlog::info("config announces {} MTP layer(s) but there are no mtp.* tensors: writing none", c.mtp_layers);
    if (!has_mtp) c.mtp_layers = 0;
    plan.meta = gguf_metadata_for_config(c, fs::path(dir).filename().string(), ftype_of(matrix_type));
    if (fs::exists(fs::path(dir) / "tokenizer.json"))
      set_tokenizer_metadata(plan.meta, vocab_from_hf_dir(dir, c.vocab_size));
    else
      spdlog::warn("{}: no tokenizer.json; the GGUF will have no tokenizer", dir);

    const std::string prefix = st->find("model.language_model.embed_tokens.weight") ? "model.language_model." : "model.";
    HfPlanner p(*st, c, matrix_type, plan.tensors);
    // The converter's order: HF names sorted (lm_head before model.*), then MTP last.
    if (!c.tie_word_embeddings) p.matrix("output.weight", "lm_head.weight");
    p.matrix("token_embd.weight", prefix + "embed_tokens.weight");
    for (int64_t i = 0; i < c.n_layers; ++i)
      p.layer(i, fmt::format("{}layers.{}.", prefix, i), c.layer_kinds[size_t(i)]);
    p.norm("output_norm.weight", prefix + "norm.weight", true);
    if (has_mtp) {
      const std::string b = fmt::format("blk.{}.", c.n_layers);
      p.layer(c.n_layers, "mtp.layers.0.", LayerKind::FullAttention);
      p.matrix(b + "nextn.eh_proj.weight", "mtp.fc.weight");
      p.norm(b + "nextn.enorm.weight", "mtp.pre_fc_norm_embedding.weight", true);
      p.norm(b + "nextn.hnorm.weight", "mtp.pre_fc_norm_hidden.weight", true);
      p.norm(b + "nextn.shared_head_norm.weight", "mtp.norm.weight", true);
    }
    return std::move(plan);
  });
}

uint64_t convert_hf_to_gguf(const std::string& dir, const std::string& out, DType matrix_type, bool progress) {
  const ModelPlan plan = plan_from_hf(dir, matrix_type);
  std::vector<DType> types;
  for (const TensorSource& t : plan.tensors) types.push_back(t.dtype);
  return write_model_plan(plan, types, out, progress);
}

}  // namespace qwen36
