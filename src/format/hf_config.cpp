#include "format/hf_config.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace qwen36 {

namespace {

using json = nlohmann::json;

// Typed field access: absent → default; present with the wrong type → Error naming it.
template <typename T>
T get(const json& j, const char* key, T dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if constexpr (std::is_same_v<T, bool>) {
    QWEN36_CHECK(it->is_boolean(), "config: {} must be a boolean", key);
  } else if constexpr (std::is_integral_v<T>) {
    QWEN36_CHECK(it->is_number_integer(), "config: {} must be an integer", key);
  } else if constexpr (std::is_floating_point_v<T>) {
    QWEN36_CHECK(it->is_number(), "config: {} must be a number", key);
  } else {
    QWEN36_CHECK(it->is_string(), "config: {} must be a string", key);
  }
  return it->get<T>();
}

template <typename T>
T require(const json& j, const char* key) {
  QWEN36_CHECK(j.contains(key) && !j[key].is_null(), "config: missing required field {}", key);
  return get<T>(j, key, T{});
}

// A token id as int32; get<int32_t>() alone would wrap 2^32 + 5 to 5 and accept it.
int32_t checked_id(const json& x, const char* key) {
  const bool fits = x.is_number_unsigned() ? x.get<uint64_t>() <= uint64_t(INT32_MAX)
                                           : x.get<int64_t>() >= INT32_MIN && x.get<int64_t>() <= INT32_MAX;
  QWEN36_CHECK(fits, "config: {} value {} is not a 32-bit token id", key, x.dump());
  return x.get<int32_t>();
}

std::vector<int32_t> parse_ids(const json& v, const char* key) {
  std::vector<int32_t> ids;
  if (v.is_null()) return ids;
  if (v.is_number_integer()) return {checked_id(v, key)};
  QWEN36_CHECK(v.is_array(), "config: {} must be an integer or a list of integers", key);
  for (const auto& x : v) {
    QWEN36_CHECK(x.is_number_integer(), "config: {} must be an integer or a list of integers", key);
    ids.push_back(checked_id(x, key));
  }
  return ids;
}

}  // namespace

ModelConfig parse_hf_config(const json& root) {
  QWEN36_CHECK(root.is_object(), "config: not a JSON object");
  const json& j = root.contains("text_config") ? root["text_config"] : root;
  QWEN36_CHECK(j.is_object(), "config: text_config is not an object");

  ModelConfig c;
  const std::string model_type = get<std::string>(j, "model_type", get<std::string>(root, "model_type", ""));
  if (model_type == "qwen3_5_text" || model_type == "qwen3_5") {
    c.moe = false;
  } else if (model_type == "qwen3_5_moe_text" || model_type == "qwen3_5_moe") {
    c.moe = true;
  } else {
    fail("config: model_type \"{}\" is not a Qwen3.5/3.6 text model (expected qwen3_5_text, qwen3_5_moe_text, "
         "qwen3_5 or qwen3_5_moe)", model_type);
  }
  if (root.contains("architectures") && root["architectures"].is_array() && !root["architectures"].empty() &&
      root["architectures"][0].is_string())
    c.architecture = root["architectures"][0].get<std::string>();

  c.vocab_size = require<int64_t>(j, "vocab_size");
  c.hidden_size = require<int64_t>(j, "hidden_size");
  c.n_layers = require<int64_t>(j, "num_hidden_layers");
  QWEN36_CHECK(c.n_layers > 0 && c.n_layers <= 1024, "config: num_hidden_layers = {} is out of range", c.n_layers);
  c.rms_norm_eps = get<float>(j, "rms_norm_eps", 1e-6f);
  c.tie_word_embeddings = get<bool>(j, "tie_word_embeddings", get<bool>(root, "tie_word_embeddings", false));
  c.max_position_embeddings = get<int64_t>(j, "max_position_embeddings", 262144);

  const std::string act = get<std::string>(j, "hidden_act", "silu");
  QWEN36_CHECK(act == "silu", "config: hidden_act \"{}\" is not supported (only silu)", act);
  QWEN36_CHECK(!get<bool>(j, "attention_bias", false), "config: attention_bias = true is not supported");

  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    QWEN36_CHECK(j["layer_types"].is_array(), "config: layer_types must be a list");
    for (const auto& t : j["layer_types"]) {
      QWEN36_CHECK(t.is_string(), "config: layer_types entries must be strings");
      const std::string s = t.get<std::string>();
      if (s == "linear_attention")
        c.layer_kinds.push_back(LayerKind::LinearAttention);
      else if (s == "full_attention")
        c.layer_kinds.push_back(LayerKind::FullAttention);
      else
        fail("config: unknown layer type \"{}\"", s);
    }
  } else {
    const int64_t interval = get<int64_t>(j, "full_attention_interval", 4);
    QWEN36_CHECK(interval > 0, "config: full_attention_interval must be positive");
    for (int64_t i = 0; i < c.n_layers; ++i)
      c.layer_kinds.push_back((i + 1) % interval == 0 ? LayerKind::FullAttention : LayerKind::LinearAttention);
  }

  c.n_heads = get<int64_t>(j, "num_attention_heads", 0);
  c.n_kv_heads = get<int64_t>(j, "num_key_value_heads", c.n_heads);
  c.head_dim = get<int64_t>(j, "head_dim", c.n_heads ? c.hidden_size / c.n_heads : 0);
  c.attn_output_gate = get<bool>(j, "attn_output_gate", true);

  // RoPE: transformers 5 nests these in rope_parameters; older configs keep them top-level.
  const json empty = json::object();
  const json& rp = j.contains("rope_parameters") && j["rope_parameters"].is_object() ? j["rope_parameters"] : empty;
  const std::string rope_type = get<std::string>(rp, "rope_type", "default");
  QWEN36_CHECK(rope_type == "default", "config: rope_type \"{}\" is not supported (only default)", rope_type);
  c.rope_theta = get<float>(rp, "rope_theta", get<float>(j, "rope_theta", 1e7f));
  const double partial = get<double>(rp, "partial_rotary_factor", get<double>(j, "partial_rotary_factor", 0.25));
  QWEN36_CHECK(partial > 0 && partial <= 1, "config: partial_rotary_factor = {} is out of range", partial);
  c.rotary_dim = int64_t(double(c.head_dim) * partial);

  c.linear_k_heads = get<int64_t>(j, "linear_num_key_heads", 0);
  c.linear_v_heads = get<int64_t>(j, "linear_num_value_heads", 0);
  c.linear_k_dim = get<int64_t>(j, "linear_key_head_dim", 0);
  c.linear_v_dim = get<int64_t>(j, "linear_value_head_dim", 0);
  c.conv_kernel = get<int64_t>(j, "linear_conv_kernel_dim", 0);

  if (c.moe) {
    c.n_experts = require<int64_t>(j, "num_experts");
    c.n_experts_per_tok = require<int64_t>(j, "num_experts_per_tok");
    c.moe_intermediate_size = require<int64_t>(j, "moe_intermediate_size");
    c.shared_expert_intermediate_size = get<int64_t>(j, "shared_expert_intermediate_size", 0);
    if (j.contains("mlp_only_layers") && j["mlp_only_layers"].is_array())
      QWEN36_CHECK(j["mlp_only_layers"].empty(), "config: mlp_only_layers (dense layers in a MoE model) is not supported");
  } else {
    c.intermediate_size = require<int64_t>(j, "intermediate_size");
  }
  c.mtp_layers = get<int64_t>(j, "mtp_num_hidden_layers", 0);
  QWEN36_CHECK(!get<bool>(j, "mtp_use_dedicated_embeddings", false),
               "config: mtp_use_dedicated_embeddings = true is not supported");
  c.eos_token_ids = parse_ids(j.contains("eos_token_id") ? j["eos_token_id"] : root.value("eos_token_id", json()),
                              "eos_token_id");
  c.validate();
  return c;
}

ModelConfig load_hf_config(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path path = fs::path(dir) / "config.json";
  // A directory opens as a stream whose first read throws std::ios_base::failure; reject it here.
  QWEN36_CHECK(fs::is_regular_file(path), "{}: cannot open (is {} a Hugging Face checkpoint directory?)",
               path.string(), dir);
  std::ifstream in(path);
  QWEN36_CHECK(in.good(), "{}: cannot open (is {} a Hugging Face checkpoint directory?)", path.string(), dir);
  const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  QWEN36_CHECK(!j.is_discarded(), "{}: invalid JSON", path.string());
  ModelConfig c = with_context(path.string(), [&] { return parse_hf_config(j); });

  // generation_config.json carries the stop ids for generate(); prefer it when present.
  const fs::path gen = fs::path(dir) / "generation_config.json";
  if (fs::is_regular_file(gen)) {
    std::ifstream gin(gen);
    const json g = json::parse(gin, nullptr, false);
    if (g.is_object() && g.contains("eos_token_id")) {
      auto ids = with_context(gen.string(), [&] { return parse_ids(g["eos_token_id"], "eos_token_id"); });
      if (!ids.empty()) c.eos_token_ids = ids;
      with_context(gen.string(), [&] { c.validate(); });
    }
  }
  return c;
}

}  // namespace qwen36
