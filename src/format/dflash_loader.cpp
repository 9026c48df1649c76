#include "format/dflash_loader.h"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "format/safetensors.h"
#include "format/weight_convert.h"

namespace qwen36 {

namespace {

using json = nlohmann::json;

const json* find_key(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

int64_t int_of(const json& v, const std::string& key, int64_t lo, int64_t hi) {
  QWEN36_CHECK(v.is_number_integer() && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi,
               "DFlash config: \"{}\" must be an integer in {}..{}, not {}", key, lo, hi, v.dump());
  return v.get<int64_t>();
}

int64_t require_int(const json& j, const char* key, int64_t lo = 1, int64_t hi = int64_t(1) << 40) {
  const json* v = find_key(j, key);
  QWEN36_CHECK(v, "DFlash config: \"{}\" is missing", key);
  return int_of(*v, key, lo, hi);
}

double number_or(const json& j, const char* key, double fallback) {
  const json* v = find_key(j, key);
  if (!v) return fallback;
  QWEN36_CHECK(v->is_number(), "DFlash config: \"{}\" must be a number, not {}", key, v->dump());
  return v->get<double>();
}

// A key of the drafter section (dflash_config) or, in older files, the top level; both
// present must agree.
const json* drafter_key(const json& j, const json& dc, const char* key) {
  const json* a = find_key(dc, key);
  const json* b = find_key(j, key);
  QWEN36_CHECK(!a || !b || *a == *b, "DFlash config: \"{}\" differs between dflash_config ({}) and the top level ({})", key,
               a ? a->dump() : "", b ? b->dump() : "");
  return a ? a : b;
}

// The reference's default target layers: n ids spread evenly over 1 .. L − 3.
std::vector<int32_t> default_target_layers(int64_t n_target, int64_t n) {
  if (n == 1) return {int32_t(n_target / 2)};
  std::vector<int32_t> ids;
  const double start = 1, span = double(n_target - 3) - start;
  for (int64_t i = 0; i < n; ++i) ids.push_back(int32_t(std::lround(start + double(i) * span / double(n - 1))));
  return ids;
}

}  // namespace

DFlashConfig parse_dflash_config(const json& j) {
  QWEN36_CHECK(j.is_object(), "DFlash config: expected a JSON object");
  if (const json* a = find_key(j, "architectures")) {
    QWEN36_CHECK(a->is_array(), "DFlash config: \"architectures\" must be a list");
    bool ok = false;
    for (const json& x : *a) {
      QWEN36_CHECK(!(x.is_string() && x.get<std::string>() == "DFlash2DraftModel"),
                   "DFlash config: DFlash2DraftModel (conv taps + candidate selector) is not supported, only DFlashDraftModel");
      ok = ok || (x.is_string() && x.get<std::string>() == "DFlashDraftModel");
    }
    QWEN36_CHECK(ok, "DFlash config: architectures {} is not DFlashDraftModel", a->dump());
  }
  const json empty = json::object();
  const json* dcp = find_key(j, "dflash_config");
  QWEN36_CHECK(!dcp || dcp->is_object(), "DFlash config: \"dflash_config\" must be an object");
  const json& dc = dcp ? *dcp : empty;
  if (const json* b = find_key(j, "attention_bias"))
    QWEN36_CHECK(b->is_boolean() && !b->get<bool>(), "DFlash config: attention_bias = {} is not supported", b->dump());
  if (const json* act = find_key(j, "hidden_act"))
    QWEN36_CHECK(*act == "silu", "DFlash config: hidden_act {} is not supported (silu)", act->dump());

  DFlashConfig c;
  c.hidden_size = require_int(j, "hidden_size");
  c.n_layers = require_int(j, "num_hidden_layers", 1, 1024);
  c.n_heads = require_int(j, "num_attention_heads", 1, 4096);
  c.n_kv_heads = find_key(j, "num_key_value_heads") ? require_int(j, "num_key_value_heads", 1, 4096) : c.n_heads;
  c.head_dim = find_key(j, "head_dim") ? require_int(j, "head_dim", 1, 4096) : c.hidden_size / c.n_heads;
  c.intermediate_size = require_int(j, "intermediate_size");
  c.vocab_size = find_key(j, "vocab_size") ? require_int(j, "vocab_size") : 0;
  c.rms_norm_eps = float(number_or(j, "rms_norm_eps", 1e-6));

  // RoPE: transformers 5 nests it in rope_parameters, older files keep rope_theta / rope_scaling.
  const json* rp = find_key(j, "rope_parameters");
  QWEN36_CHECK(!rp || rp->is_object(), "DFlash config: \"rope_parameters\" must be an object");
  c.rope_theta = float(number_or(rp ? *rp : empty, "rope_theta", number_or(j, "rope_theta", 10000.0)));
  const json* scaling = find_key(j, "rope_scaling");
  std::string rope_type = "default";
  for (const json* s : {rp, scaling})
    if (s && s->is_object())
      for (const char* key : {"rope_type", "type"})
        if (const json* t = find_key(*s, key); t && t->is_string()) rope_type = t->get<std::string>();
  if (rope_type != "default")  // acceptance may suffer past the unscaled range; output cannot
    spdlog::warn("DFlash drafter: rope_type \"{}\" is applied as plain RoPE (theta {})", rope_type, c.rope_theta);

  const json* window = find_key(j, "sliding_window");
  c.sliding_window = window ? int_of(*window, "sliding_window", 1, int64_t(1) << 40) : 0;
  if (const json* lt = find_key(j, "layer_types")) {
    QWEN36_CHECK(lt->is_array() && int64_t(lt->size()) == c.n_layers,
                 "DFlash config: \"layer_types\" must list {} layer types", c.n_layers);
    for (const json& t : *lt) {
      QWEN36_CHECK(t == "sliding_attention" || t == "full_attention",
                   "DFlash config: layer type {} is not sliding_attention or full_attention", t.dump());
      c.sliding.push_back(t == "sliding_attention");
    }
  } else {
    c.sliding.assign(size_t(c.n_layers), false);
  }

  const json* block = drafter_key(j, dc, "block_size");
  QWEN36_CHECK(block, "DFlash config: \"block_size\" is missing (top level or dflash_config)");
  c.block_size = int32_t(int_of(*block, "block_size", 2, 17));
  const json* mask = drafter_key(j, dc, "mask_token_id");
  QWEN36_CHECK(mask, "DFlash config: \"mask_token_id\" is missing (dflash_config)");
  c.mask_token_id = int32_t(int_of(*mask, "mask_token_id", 0, INT32_MAX));
  if (const json* ids = drafter_key(j, dc, "target_layer_ids")) {
    QWEN36_CHECK(ids->is_array() && !ids->empty(), "DFlash config: \"target_layer_ids\" must be a non-empty list");
    for (const json& x : *ids) c.target_layer_ids.push_back(int32_t(int_of(x, "target_layer_ids", 0, 4096)));
  } else {
    const json* nt = drafter_key(j, dc, "num_target_layers");
    QWEN36_CHECK(nt, "DFlash config: neither \"target_layer_ids\" nor \"num_target_layers\" is given");
    c.target_layer_ids = default_target_layers(int_of(*nt, "num_target_layers", 4, 4096), c.n_layers);
  }
  c.validate();
  return c;
}

DFlashWeights load_dflash_checkpoint(const std::string& path) {
  namespace fs = std::filesystem;
  QWEN36_CHECK(!path.ends_with(".gguf"),
               "{}: DFlash GGUF drafters (general.architecture = dflash) are not supported yet; use the Hugging Face "
               "directory (config.json + safetensors)", path);
  const fs::path dir = fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
  return with_context(dir.string(), [&] {
    const fs::path cfg = dir / "config.json";
    std::ifstream in(cfg);
    QWEN36_CHECK(in.good(), "no config.json (a DFlash drafter is a Hugging Face directory)");
    json j;
    try {
      j = json::parse(in);
    } catch (const json::exception& e) {
      fail("config.json is not valid JSON ({})", e.what());
    }
    DFlashWeights w;
    w.config = parse_dflash_config(j);
    auto st = std::make_shared<SafetensorsSet>(dir.string());
    w.storage.push_back(st);
    const std::string prefix = st->find("model.fc.weight") ? "model." : "";
    std::set<std::string> used;
    auto get = [&](const std::string& name) -> const Tensor& {
      const Tensor* t = st->find(prefix + name);
      QWEN36_CHECK(t, "missing tensor {}{}", prefix, name);
      used.insert(prefix + name);
      return *t;
    };
    auto matrix = [&](const std::string& name) {
      const Tensor& t = get(name);
      QWEN36_CHECK(t.dtype == DType::BF16 || t.dtype == DType::F16 || t.dtype == DType::F32,
                   "tensor {} has dtype {}; expected bf16, f16 or f32", name, dtype_name(t.dtype));
      return t;
    };
    auto vec = [&](const std::string& name) {  // Qwen3 RMSNorm weights multiply as stored
      const Tensor& t = get(name);
      const int64_t n = t.numel();
      auto buf = std::make_shared<HostBuffer>(size_t(n) * sizeof(float));
      float* out = reinterpret_cast<float*>(buf->data());
      for (int64_t i = 0; i < n; ++i) out[i] = tensor_get_f32(t, i);
      w.storage.push_back(buf);
      return Tensor(out, DType::F32, t.shape.data(), t.ndim);
    };
    w.fc = matrix("fc.weight");
    w.hidden_norm = vec("hidden_norm.weight");
    w.norm = vec("norm.weight");
    for (int64_t i = 0; i < w.config.n_layers; ++i) {
      const std::string p = "layers." + std::to_string(i) + ".";
      DFlashLayer l;
      l.input_norm = vec(p + "input_layernorm.weight");
      l.post_attention_norm = vec(p + "post_attention_layernorm.weight");
      l.q_proj = matrix(p + "self_attn.q_proj.weight");
      l.k_proj = matrix(p + "self_attn.k_proj.weight");
      l.v_proj = matrix(p + "self_attn.v_proj.weight");
      l.o_proj = matrix(p + "self_attn.o_proj.weight");
      l.q_norm = vec(p + "self_attn.q_norm.weight");
      l.k_norm = vec(p + "self_attn.k_norm.weight");
      l.mlp.gate_proj = matrix(p + "mlp.gate_proj.weight");
      l.mlp.up_proj = matrix(p + "mlp.up_proj.weight");
      l.mlp.down_proj = matrix(p + "mlp.down_proj.weight");
      w.layers.push_back(l);
    }
    // Anything else would be a variant this loader does not know (e.g. DFlash2's conv taps).
    for (const std::string& name : st->names()) {
      if (used.count(name)) continue;
      const bool shared = name.find("embed_tokens") != std::string::npos || name.find("lm_head") != std::string::npos ||
                          name.find("rotary_emb") != std::string::npos;
      QWEN36_CHECK(shared, "unexpected tensor {} (not part of a DFlashDraftModel)", name);
    }
    return w;
  });
}

}  // namespace qwen36
