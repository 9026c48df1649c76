// PEFT LoRA adapters merged into the weights at load (format/lora.h).
#include "format/lora.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "core/error.h"
#include "core/log.h"
#include "format/safetensors.h"
#include "format/weight_convert.h"

namespace qwen36 {

float LoraAdapter::scaling(int64_t rank) const {
  return rslora ? alpha / std::sqrt(float(rank)) : alpha / float(rank);
}

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// A config field that must be absent, null, false or empty for a plain LoRA merge.
void refuse_if_set(const Json& cfg, const char* key, const char* why) {
  if (!cfg.contains(key)) return;
  const Json& v = cfg[key];
  const bool set = !(v.is_null() || v == false || (v.is_object() && v.empty()) || (v.is_array() && v.empty()));
  QWEN36_CHECK(!set, "adapter_config.json: {} is not supported ({})", key, why);
}

// "base_model.model.X.lora_A.weight" (or "...lora_A.<adapter>.weight") → X and which half.
bool split_name(std::string_view name, std::string& module, bool& is_a) {
  constexpr std::string_view kBase = "base_model.model.";
  if (name.starts_with(kBase)) name.remove_prefix(kBase.size());
  for (const char* half : {".lora_A.", ".lora_B."}) {
    const size_t at = name.find(half);
    if (at == std::string_view::npos || !name.ends_with("weight")) continue;
    module = std::string(name.substr(0, at));
    is_a = half[6] == 'A';
    return true;
  }
  return false;
}

}  // namespace

LoraAdapter load_lora_adapter(const std::string& dir) {
  return with_context("LoRA adapter " + dir, [&] {
    LoraAdapter a;
    a.path = dir;
    const fs::path cfg_path = fs::path(dir) / "adapter_config.json";
    std::ifstream in(cfg_path);
    QWEN36_CHECK(in, "no adapter_config.json in {} (a PEFT LoRA adapter directory)", dir);
    const Json cfg = Json::parse(in, nullptr, false);
    QWEN36_CHECK(cfg.is_object(), "adapter_config.json is not a JSON object");
    const std::string type = cfg.value("peft_type", "LORA");
    QWEN36_CHECK(type == "LORA", "peft_type {} is not LORA", type);
    QWEN36_CHECK(cfg.contains("r") && cfg["r"].is_number_integer() && cfg["r"].get<int64_t>() > 0 &&
                     cfg.contains("lora_alpha") && cfg["lora_alpha"].is_number(),
                 "adapter_config.json needs a positive integer r and a number lora_alpha");
    a.alpha = cfg["lora_alpha"].get<float>();
    a.rslora = cfg.value("use_rslora", false);
    refuse_if_set(cfg, "use_dora", "DoRA's magnitude vector is not a plain B·A");
    refuse_if_set(cfg, "fan_in_fan_out", "Conv1D-style transposed weights");
    refuse_if_set(cfg, "modules_to_save", "whole replaced modules");
    refuse_if_set(cfg, "alpha_pattern", "per-module alphas");
    const std::string bias = cfg.value("bias", "none");
    QWEN36_CHECK(bias == "none", "bias '{}' is not supported (only 'none')", bias);

    const fs::path st = fs::path(dir) / "adapter_model.safetensors";
    QWEN36_CHECK(fs::exists(st), "no adapter_model.safetensors in {} (adapters saved as PyTorch .bin are not read: "
                 "save with safe_serialization)", dir);
    auto file = std::make_shared<SafetensorsFile>(st.string());
    a.storage = file;
    std::map<std::string, LoraAdapter::Pair> pairs;
    for (const auto& [name, t] : file->tensors()) {
      QWEN36_CHECK(name.find("lora_embedding") == std::string::npos, "{}: embedding adapters are not supported", name);
      std::string module;
      bool is_a = false;
      QWEN36_CHECK(split_name(name, module, is_a), "{} is not a lora_A / lora_B weight (biases, magnitudes and saved "
                   "modules are not supported)", name);
      QWEN36_CHECK(t.ndim == 2 && (t.dtype == DType::F32 || t.dtype == DType::BF16 || t.dtype == DType::F16),
                   "{}: a 2-D bf16, f16 or f32 matrix expected, got {} {}", name, dtype_name(t.dtype), t.shape_str());
      LoraAdapter::Pair& p = pairs[module];
      p.module = module;
      (is_a ? p.a : p.b) = t;
    }
    for (auto& [module, p] : pairs) {
      QWEN36_CHECK(p.a.data && p.b.data, "{} has lora_{} without lora_{}", module, p.a.data ? "A" : "B",
                   p.a.data ? "B" : "A");
      QWEN36_CHECK(p.a.dim(0) == p.b.dim(1), "{}: lora_A {} and lora_B {} disagree on the rank", module,
                   p.a.shape_str(), p.b.shape_str());
      a.pairs.push_back(std::move(p));
    }
    QWEN36_CHECK(!a.pairs.empty(), "adapter_model.safetensors holds no lora_A / lora_B pair");
    return a;
  });
}

namespace {

// Where a module's matrix lives in the canonical weights, and, for a DeltaNet out_proj kept in
// a GGUF's tiled head order, which head each column block holds (the adapter's A is in the
// checkpoint's head order).
struct Target {
  Tensor* t = nullptr;
  const std::vector<int32_t>* col_heads = nullptr;
};

Tensor* layer_matrix(LayerWeights& l, bool moe, std::string_view rest, const std::vector<int32_t>*& heads) {
  QWEN36_CHECK(!rest.starts_with("mlp.experts."), "routed experts take no merged adapter (each expert is a matrix of "
               "its own, and quantized in most checkpoints)");
  if (l.kind == LayerKind::FullAttention) {
    if (rest == "self_attn.q_proj") return &l.attn.q_proj;
    if (rest == "self_attn.k_proj") return &l.attn.k_proj;
    if (rest == "self_attn.v_proj") return &l.attn.v_proj;
    if (rest == "self_attn.o_proj") return &l.attn.o_proj;
  } else {
    DeltaNetWeights& d = l.deltanet;
    if (rest == "linear_attn.in_proj_qkv") return &d.in_proj_qkv;
    if (rest == "linear_attn.in_proj_z") return &d.in_proj_z;
    if (rest == "linear_attn.in_proj_b") return &d.in_proj_b;
    if (rest == "linear_attn.in_proj_a") return &d.in_proj_a;
    if (rest == "linear_attn.out_proj") {
      heads = d.out_proj_heads.empty() ? nullptr : &d.out_proj_heads;
      return &d.out_proj;
    }
  }
  MlpWeights& m = moe ? l.moe.shared : l.mlp;
  const std::string_view mlp = moe ? "mlp.shared_expert." : "mlp.";
  if (rest.starts_with(mlp)) {
    const std::string_view p = rest.substr(mlp.size());
    if (p == "gate_proj") return &m.gate_proj;
    if (p == "up_proj") return &m.up_proj;
    if (p == "down_proj") return &m.down_proj;
  }
  if (moe && rest == "mlp.shared_expert_gate") return &l.moe.shared_gate;
  if (moe && rest == "mlp.gate") return &l.moe.router;
  return nullptr;
}

Target resolve(ModelWeights& w, const std::string& module) {
  std::string_view m = module;
  Target t;
  if (m == "lm_head") {
    QWEN36_CHECK(!w.config.tie_word_embeddings, "lm_head: the output head is the embedding here (tied); an adapter "
                 "on it would change the input embeddings too");
    t.t = &w.lm_head;
    return t;
  }
  for (std::string_view prefix : {"model.language_model.", "model."})
    if (m.starts_with(prefix)) {
      m.remove_prefix(prefix.size());
      break;
    }
  LayerWeights* layer = nullptr;
  if (m.starts_with("mtp.layers.0.") && w.mtp) {
    layer = &w.mtp->layer;
    m.remove_prefix(13);
  } else if (m.starts_with("layers.")) {
    m.remove_prefix(7);
    const size_t dot = m.find('.');
    int64_t i = -1;
    if (dot != std::string_view::npos && dot > 0 && dot < 6 &&
        std::all_of(m.begin(), m.begin() + dot, [](char c) { return c >= '0' && c <= '9'; }))
      i = std::stoll(std::string(m.substr(0, dot)));
    QWEN36_CHECK(i >= 0 && i < int64_t(w.layers.size()), "{}: no such layer in this {}-layer model", module,
                 w.layers.size());
    layer = &w.layers[size_t(i)];
    m.remove_prefix(dot + 1);
  }
  if (layer) t.t = layer_matrix(*layer, w.config.moe, m, t.col_heads);
  QWEN36_CHECK(t.t, "{} is not a linear layer of this model's {} layers", module,
               layer && layer->kind == LayerKind::FullAttention ? "attention" : "DeltaNet or MLP");
  return t;
}

// dst's row o = src's row o + Σ_k c·B[o, k] · A[k, :], computed in f32 and stored in src's dtype.
template <typename T, float (*Load)(T), T (*Store)(float)>
void merge_rows(const Tensor& src, void* dst, const std::vector<float>& a, const std::vector<float>& b, int64_t rank,
                float c) {
  const int64_t rows = src.rows(), cols = src.cols();
  const T* s = src.as<const T>();
  T* d = static_cast<T*>(dst);
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(cols));
#pragma omp for schedule(static)
    for (int64_t o = 0; o < rows; ++o) {
      for (int64_t j = 0; j < cols; ++j) row[size_t(j)] = Load(s[o * cols + j]);
      for (int64_t k = 0; k < rank; ++k) {
        const float f = c * b[size_t(o * rank + k)];
        const float* ak = a.data() + k * cols;
        for (int64_t j = 0; j < cols; ++j) row[size_t(j)] += f * ak[j];
      }
      for (int64_t j = 0; j < cols; ++j) d[o * cols + j] = Store(row[size_t(j)]);
    }
  }
}

float load_f32(float x) { return x; }
float store_f32(float x) { return x; }
float load_bf16(uint16_t x) { return bf16_to_f32(x); }
float load_f16(uint16_t x) { return f16_to_f32(x); }

}  // namespace

int merge_lora(ModelWeights& w, const LoraAdapter& adapter, float scale) {
  return with_context("LoRA adapter " + adapter.path, [&] {
    std::vector<Target> targets;
    for (const LoraAdapter::Pair& p : adapter.pairs) {
      const Target t = resolve(w, p.module);
      const Tensor& m = *t.t;
      QWEN36_CHECK(m.dtype == DType::BF16 || m.dtype == DType::F16 || m.dtype == DType::F32,
                   "{} is stored as {}: an adapter merges into bf16, f16 or f32 weights only (merge it into the "
                   "checkpoint before quantizing: PEFT's merge_and_unload)", p.module, dtype_name(m.dtype));
      QWEN36_CHECK(m.ndim == 2 && p.a.dim(1) == m.cols() && p.b.dim(0) == m.rows(),
                   "{}: lora_B {} · lora_A {} does not make the weight's shape {}", p.module, p.b.shape_str(),
                   p.a.shape_str(), m.shape_str());
      for (const Target& u : targets)
        QWEN36_CHECK(u.t != t.t, "{} is named twice", p.module);
      targets.push_back(t);
    }
    for (size_t i = 0; i < targets.size(); ++i) {
      const LoraAdapter::Pair& p = adapter.pairs[i];
      Tensor& m = *targets[i].t;
      const int64_t rank = p.a.dim(0), cols = m.cols();
      std::vector<float> a(size_t(rank * cols)), b(size_t(p.b.numel()));
      // A's columns in the stored order (a tiled out_proj's block q holds head col_heads[q]).
      const std::vector<int32_t>* heads = targets[i].col_heads;
      const int64_t block = heads ? cols / int64_t(heads->size()) : cols;
      for (int64_t k = 0; k < rank; ++k)
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t from = heads ? int64_t((*heads)[size_t(j / block)]) * block + j % block : j;
          a[size_t(k * cols + j)] = tensor_get_f32(p.a, k * cols + from);
        }
      for (int64_t x = 0; x < p.b.numel(); ++x) b[size_t(x)] = tensor_get_f32(p.b, x);
      auto buf = std::make_shared<HostBuffer>(m.nbytes());
      const float c = scale * adapter.scaling(rank);
      if (m.dtype == DType::F32) merge_rows<float, load_f32, store_f32>(m, buf->data(), a, b, rank, c);
      else if (m.dtype == DType::BF16) merge_rows<uint16_t, load_bf16, f32_to_bf16>(m, buf->data(), a, b, rank, c);
      else merge_rows<uint16_t, load_f16, f32_to_f16>(m, buf->data(), a, b, rank, c);
      m.data = buf->data();
      w.storage.push_back(std::move(buf));
    }
    spdlog::info("LoRA {}: merged into {} matrices (alpha {}, scale {})", adapter.path, targets.size(), adapter.alpha,
                 scale);
    return int(targets.size());
  });
}

}  // namespace qwen36
