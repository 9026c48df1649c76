#include "quant/mix_rules.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <numeric>

#include "core/error.h"

namespace qwen36 {

namespace {

// Broad roles of tensors, by name, in the order llama-quantize tests them (attn_qkv before
// attn_v: a DeltaNet in_proj_qkv counts as "attention V-like").
enum class Role { Output, TokenEmbd, AttnQkv, AttnV, AttnK, AttnQ, AttnOutput, FfnUp, FfnGate, FfnDown, Other };

bool has(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

Role role_of(std::string_view name) {
  if (name == "output.weight") return Role::Output;
  if (name == "token_embd.weight" || name == "per_layer_token_embd.weight") return Role::TokenEmbd;
  if (has(name, "attn_qkv.weight") || has(name, "attn_kv_b.weight")) return Role::AttnQkv;
  if (has(name, "attn_v.weight")) return Role::AttnV;
  if (has(name, "attn_k.weight")) return Role::AttnK;
  if (has(name, "attn_q.weight")) return Role::AttnQ;
  if (has(name, "attn_output.weight")) return Role::AttnOutput;
  if (has(name, "ffn_up")) return Role::FfnUp;
  if (has(name, "ffn_gate")) return Role::FfnGate;
  if (has(name, "ffn_down")) return Role::FfnDown;
  return Role::Other;
}
bool attn_v_like(Role r) { return r == Role::AttnQkv || r == Role::AttnV; }

// Dimensions that count: trailing extents of 1 do not (ggml_n_dims).
int n_dims(const std::vector<int64_t>& shape) {
  int n = int(shape.size());
  // torch order: the outermost extents come first, so "trailing" in ggml order is leading here.
  size_t i = 0;
  while (n > 1 && shape[i] == 1) --n, ++i;
  return n;
}

// Which tensors llama-quantize touches at all: 2-D/3-D weights other than norms, routers and
// conv taps. Everything else keeps its type (F32 for those in converter output).
bool allows_quantization(const MixTensor& t) {
  if (n_dims(t.shape) < 2) return false;
  const std::string& n = t.name;
  if (n.size() < 6 || n.compare(n.size() - 6, 6, "weight") != 0) return false;
  if (has(n, "_norm.weight") || has(n, "ffn_gate_inp.weight") || has(n, "ssm_conv1d")) return false;
  return true;
}

// Layers that get more bits in the _M mixes: the first and last eighth and every third between.
bool use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

int64_t block_of(const std::string& name) {
  int b = -1;
  if (std::sscanf(name.c_str(), "blk.%d.", &b) != 1) return -1;
  return b;
}

DType base_type(QuantMix m) {
  switch (m) {
    case QuantMix::F32: return DType::F32;
    case QuantMix::F16: return DType::F16;
    case QuantMix::BF16: return DType::BF16;
    case QuantMix::Q8_0: return DType::Q8_0;
    case QuantMix::Q6_K: return DType::Q6_K;
    case QuantMix::Q5_K_M:
    case QuantMix::Q5_K_S: return DType::Q5_K;
    case QuantMix::Q4_K_M:
    case QuantMix::Q4_K_S: return DType::Q4_K;
  }
  return DType::F32;
}

// A row length the block type cannot tile falls back to a 32-element type (then to F16).
DType shape_fallback(DType t, int64_t ncols) {
  if (ncols % dtype_block_elems(t) == 0) return t;
  DType f = t;
  switch (t) {
    case DType::Q4_K: f = DType::Q5_0; break;
    case DType::Q5_K: f = DType::Q5_1; break;
    case DType::Q6_K: f = DType::Q8_0; break;
    default:
      // llama-quantize refuses here (it defines no fallback for 32-element types); keeping
      // such a tensor in F16 is more useful and cannot clash with any llama.cpp-made file.
      return DType::F16;
  }
  return ncols % dtype_block_elems(f) == 0 ? f : DType::F16;
}

}  // namespace

std::optional<QuantMix> parse_quant_mix(std::string_view s) {
  std::string u(s);
  for (char& c : u) c = char(std::toupper(static_cast<unsigned char>(c)));
  for (QuantMix m : {QuantMix::F32, QuantMix::F16, QuantMix::BF16, QuantMix::Q8_0, QuantMix::Q6_K, QuantMix::Q5_K_M,
                     QuantMix::Q5_K_S, QuantMix::Q4_K_M, QuantMix::Q4_K_S})
    if (quant_mix_name(m) == u) return m;
  return std::nullopt;
}

std::string quant_mix_name(QuantMix m) {
  switch (m) {
    case QuantMix::F32: return "F32";
    case QuantMix::F16: return "F16";
    case QuantMix::BF16: return "BF16";
    case QuantMix::Q8_0: return "Q8_0";
    case QuantMix::Q6_K: return "Q6_K";
    case QuantMix::Q5_K_M: return "Q5_K_M";
    case QuantMix::Q5_K_S: return "Q5_K_S";
    case QuantMix::Q4_K_M: return "Q4_K_M";
    case QuantMix::Q4_K_S: return "Q4_K_S";
  }
  return "?";
}

uint32_t quant_mix_llama_ftype(QuantMix m) {
  switch (m) {
    case QuantMix::F32: return 0;
    case QuantMix::F16: return 1;
    case QuantMix::Q8_0: return 7;
    case QuantMix::Q4_K_S: return 14;
    case QuantMix::Q4_K_M: return 15;
    case QuantMix::Q5_K_S: return 16;
    case QuantMix::Q5_K_M: return 17;
    case QuantMix::Q6_K: return 18;
    case QuantMix::BF16: return 32;
  }
  return 0;
}

std::vector<DType> choose_tensor_types(QuantMix mix, const std::vector<MixTensor>& tensors, const MixModelInfo& info) {
  const DType base = base_type(mix);
  const bool quantized = dtype_is_quantized(base);
  const bool tied = std::none_of(tensors.begin(), tensors.end(), [](const MixTensor& t) { return t.name == "output.weight"; });
  const int64_t n_attn_v = std::count_if(tensors.begin(), tensors.end(), [](const MixTensor& t) {
    return allows_quantization(t) && attn_v_like(role_of(t.name));
  });
  // llama.cpp counts V-like tensors among all tensors, quantizable or not; in these models
  // they always are quantizable, so counting either way gives the same n.
  const int64_t n_layer = info.n_layer_all;
  int64_t i_attn_v = 0, i_ffn_down = 0;

  std::vector<DType> out;
  out.reserve(tensors.size());
  for (const MixTensor& t : tensors) {
    if (!allows_quantization(t)) {
      out.push_back(t.dtype);
      continue;
    }
    DType type = base;
    if (!quantized) {
      out.push_back(type);
      continue;
    }
    const Role role = role_of(t.name);
    const int64_t ncols = t.shape.back();
    if (role == Role::Output || (tied && role == Role::TokenEmbd)) {
      // The output projection gets Q6_K (Q8_0 stays Q8_0; rows Q6_K cannot tile get Q8_0).
      if (ncols % dtype_block_elems(type) != 0) type = DType::Q8_0;
      else if (type != DType::Q8_0) type = DType::Q6_K;
    } else if (attn_v_like(role)) {
      if ((mix == QuantMix::Q4_K_M || mix == QuantMix::Q5_K_M) && use_more_bits(i_attn_v, n_attn_v)) type = DType::Q6_K;
      else if (mix == QuantMix::Q4_K_S && i_attn_v < 4) type = DType::Q5_K;
      if (info.n_expert == 8) type = DType::Q8_0;  // llama.cpp's choice for 8-expert models
      ++i_attn_v;
    } else if (role == Role::AttnK) {
      if (info.n_expert == 8) type = DType::Q8_0;
    } else if (role == Role::FfnDown) {
      // Dense models count ffn_down tensors; MoE models read the block number from the name.
      int64_t layer = i_ffn_down;
      if (info.n_expert > 1) {
        layer = block_of(t.name);
        QWEN36_CHECK(layer >= 0 && layer < n_layer, "bad block {} in tensor {} (block_count {})", layer, t.name, n_layer);
      }
      if ((mix == QuantMix::Q4_K_M || mix == QuantMix::Q5_K_M) && use_more_bits(layer, n_layer)) type = DType::Q6_K;
      else if (mix == QuantMix::Q4_K_S && layer < n_layer / 8) type = DType::Q5_K;
      ++i_ffn_down;
    } else if (role == Role::AttnOutput) {
      if (info.n_expert == 8 && (mix == QuantMix::Q4_K_M || mix == QuantMix::Q4_K_S)) type = DType::Q5_K;
    }
    out.push_back(shape_fallback(type, ncols));
  }
  return out;
}

std::vector<size_t> order_like_llama_quantize(const std::vector<std::string>& names) {
  std::vector<size_t> idx(names.size());
  std::iota(idx.begin(), idx.end(), size_t(0));
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    const int64_t ba = block_of(names[a]), bb = block_of(names[b]);
    if (ba != bb) return ba < bb;
    return names[a] < names[b];
  });
  return idx;
}

}  // namespace qwen36
