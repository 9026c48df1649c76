#include "model/random_quant_weights.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <unordered_map>

#include "core/error.h"
#include "core/rng.h"
#include "quant/blocks.h"
#include "quant/quant.h"
#include "quant/quantize_model.h"

namespace qwen36 {

namespace {

// Seeded per (seed, tensor, row): any row can be generated on its own.
using Rng = SplitMix64;

// How a tensor's values are distributed: normal(0, sigma) for matrices, mean ± spread
// (uniform) for the small f32 vectors.
struct Dist {
  float sigma = 0, mean = 0, spread = 0;
  float sample(Rng& r) const { return sigma > 0 ? r.normal() * sigma : mean + (r.uniform() * 2 - 1) * spread; }
};


// Random blocks whose values have standard deviation about sigma and mean about 0:
// y = d * sc * (q - centre), so d is sigma over (typical sc) x (std of uniform q).
void random_blocks(DType t, Rng& r, std::byte* dst, int64_t n, float sigma) {
  const int64_t nb = n / dtype_block_elems(t);
  switch (t) {
    case DType::Q8_0: {
      auto* b = reinterpret_cast<BlockQ8_0*>(dst);
      for (int64_t i = 0; i < nb; ++i) {
        b[i].d = f32_to_f16(sigma / 73.6f);  // std of uniform int8
        r.bytes(reinterpret_cast<uint8_t*>(b[i].qs), kQK);
        for (int8_t& q : b[i].qs) q = q == -128 ? int8_t(-127) : q;
      }
      break;
    }
    case DType::Q4_K:
    case DType::Q5_K: {
      const bool five = t == DType::Q5_K;
      const float qstd = five ? 9.23f : 4.61f, centre = five ? 15.5f : 7.5f;
      for (int64_t i = 0; i < nb; ++i) {
        uint8_t* scales = nullptr;
        uint16_t *d = nullptr, *dmin = nullptr;
        if (five) {
          auto* b = reinterpret_cast<BlockQ5_K*>(dst) + i;
          d = &b->d, dmin = &b->dmin, scales = b->scales;
          r.bytes(b->qh, sizeof b->qh);
          r.bytes(b->qs, sizeof b->qs);
        } else {
          auto* b = reinterpret_cast<BlockQ4_K*>(dst) + i;
          d = &b->d, dmin = &b->dmin, scales = b->scales;
          r.bytes(b->qs, sizeof b->qs);
        }
        const float dd = sigma / (qstd * 47.5f);
        *d = f32_to_f16(dd);
        *dmin = f32_to_f16(dd * centre);  // with m == sc, y = d*sc*(q - centre)
        std::memset(scales, 0, 12);
        const uint64_t bits = r.next();
        for (int j = 0; j < 8; ++j) {
          const uint8_t sc = uint8_t(32 + ((bits >> (5 * j)) & 31));
          pack_k_scale_min(scales, j, sc, sc);
        }
      }
      break;
    }
    case DType::Q6_K: {
      auto* b = reinterpret_cast<BlockQ6_K*>(dst);
      for (int64_t i = 0; i < nb; ++i) {
        r.bytes(b[i].ql, sizeof b[i].ql);
        r.bytes(b[i].qh, sizeof b[i].qh);
        const uint64_t bits = r.next();
        for (int j = 0; j < 16; ++j) b[i].scales[j] = int8_t(16 + ((bits >> (3 * j)) & 31) + ((bits >> 50) & 15));
        b[i].d = f32_to_f16(sigma / (18.5f * 39.5f));
      }
      break;
    }
    default: fail("internal: no direct random generator for {}", dtype_name(t));
  }
}

bool direct_type(DType t) { return t == DType::Q8_0 || t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K; }

uint64_t row_seed(uint64_t seed, uint64_t tensor, int64_t row) {
  Rng r{seed * 0x9e3779b97f4a7c15ull ^ (tensor << 40) ^ uint64_t(row)};
  return r.next();
}

void fill_rows(const Dist& dist, uint64_t seed, uint64_t tensor, int64_t cols, DType t, int64_t r0, int64_t n,
               std::byte* dst) {
  const size_t rb = dtype_row_bytes(t, cols);
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < n; ++k) {
    Rng r{row_seed(seed, tensor, r0 + k)};
    std::byte* out = dst + size_t(k) * rb;
    if (direct_type(t) && dist.sigma > 0) {
      random_blocks(t, r, out, cols, dist.sigma);
      continue;
    }
    std::vector<float> v(static_cast<size_t>(cols));
    for (float& x : v) x = dist.sample(r);
    quantize_row(t, v.data(), out, cols);  // F32/F16/BF16, or a rare shape fallback type
  }
}

class PlanBuilder {
 public:
  PlanBuilder(ModelPlan& p, const ModelConfig& c, uint64_t seed) : p_(p), c_(c), seed_(seed) {}

  void add(std::string name, std::vector<int64_t> shape, DType natural, Dist dist) {
    TensorSource s;
    s.name = std::move(name);
    s.shape = std::move(shape);
    s.dtype = natural;
    const int64_t cols = s.cols();
    const uint64_t id = uint64_t(p_.tensors.size()) + 1, seed = seed_;
    s.make_rows = [dist, seed, id, cols](DType t, int64_t r0, int64_t n, std::byte* dst) {
      fill_rows(dist, seed, id, cols, t, r0, n, dst);
    };
    p_.tensors.push_back(std::move(s));
  }
  void matrix(const std::string& name, std::vector<int64_t> shape, float sigma = 0) {
    const float s = sigma > 0 ? sigma : 1.0f / std::sqrt(float(shape.back()));
    add(name, std::move(shape), DType::BF16, {s, 0, 0});
  }
  void vec(const std::string& name, std::vector<int64_t> shape, float mean, float spread) {
    add(name, std::move(shape), DType::F32, {0, mean, spread});
  }

  void layer(int64_t i, LayerKind kind) {
    const std::string b = fmt::format("blk.{}.", i);
    const int64_t H = c_.hidden_size;
    vec(b + "attn_norm.weight", {H}, 1.0f, 0.1f);
    if (kind == LayerKind::LinearAttention) {
      const int64_t Hv = c_.linear_v_heads, vd = c_.linear_value_dim();
      vec(b + "ssm_a", {Hv}, -1.0f, 0.5f);  // −exp(A_log) with A_log near 0
      vec(b + "ssm_conv1d.weight", {c_.conv_dim(), c_.conv_kernel}, 0.0f, 0.5f);
      vec(b + "ssm_dt.bias", {Hv}, 0.0f, 0.5f);
      matrix(b + "ssm_alpha.weight", {c_.gate_rows(), H});
      matrix(b + "ssm_beta.weight", {c_.gate_rows(), H});
      matrix(b + "attn_qkv.weight", {c_.conv_dim(), H});
      matrix(b + "attn_gate.weight", {vd, H});
      vec(b + "ssm_norm.weight", {c_.linear_v_dim}, 1.0f, 0.1f);
      matrix(b + "ssm_out.weight", {H, vd});
    }
    if (c_.moe) {
      const int64_t E = c_.n_experts, held = c_.n_local_experts(), I = c_.moe_intermediate_size;
      matrix(b + "ffn_down_exps.weight", {held, H, I});
      matrix(b + "ffn_gate_exps.weight", {held, I, H});
      matrix(b + "ffn_up_exps.weight", {held, I, H});
      add(b + "ffn_gate_inp.weight", {E, H}, DType::F32, {1.0f / std::sqrt(float(H)), 0, 0});
      if (const int64_t S = c_.shared_expert_intermediate_size; S > 0) {
        matrix(b + "ffn_down_shexp.weight", {H, S});
        matrix(b + "ffn_gate_shexp.weight", {S, H});
        matrix(b + "ffn_up_shexp.weight", {S, H});
        add(b + "ffn_gate_inp_shexp.weight", {1, H}, DType::F32, {1.0f / std::sqrt(float(H)), 0, 0});
      }
    } else {
      matrix(b + "ffn_down.weight", {H, c_.intermediate_size});
      matrix(b + "ffn_gate.weight", {c_.intermediate_size, H});
      matrix(b + "ffn_up.weight", {c_.intermediate_size, H});
    }
    vec(b + "post_attention_norm.weight", {H}, 1.0f, 0.1f);
    if (kind == LayerKind::FullAttention) {
      const int64_t kvd = c_.n_kv_heads * c_.head_dim;
      vec(b + "attn_k_norm.weight", {c_.head_dim}, 1.0f, 0.1f);
      matrix(b + "attn_k.weight", {kvd, H});
      matrix(b + "attn_output.weight", {H, c_.n_heads * c_.head_dim});
      vec(b + "attn_q_norm.weight", {c_.head_dim}, 1.0f, 0.1f);
      matrix(b + "attn_q.weight", {c_.q_proj_rows(), H});
      matrix(b + "attn_v.weight", {kvd, H});
    }
  }

 private:
  ModelPlan& p_;
  const ModelConfig& c_;
  uint64_t seed_;
};

// GPT-2's printable spelling of a byte, as UTF-8.
std::string byte_token(uint8_t b) {
  auto printable = [](int x) { return (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255); };
  char32_t cp = b;
  if (!printable(b)) {
    int n = 0;
    for (int x = 0; x < b; ++x) n += printable(x) ? 0 : 1;
    cp = char32_t(256 + n);
  }
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 63));
  }
  return s;
}

}  // namespace

GgufVocab synthetic_vocab(int64_t vocab_size) {
  GgufVocab v;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(byte_token(uint8_t(b)));
  const char* merges[][2] = {{"Ġ", "t"}, {"Ġ", "a"}, {"h", "e"}, {"i", "n"}, {"r", "e"}, {"o", "n"}, {"Ġt", "he"}, {"e", "r"}};
  for (const auto& m : merges) {
    v.merges.push_back(std::string(m[0]) + " " + m[1]);
    v.tokens.push_back(std::string(m[0]) + m[1]);
  }
  v.token_types.assign(v.tokens.size(), 1);
  for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    v.tokens.push_back(s);
    v.token_types.push_back(3);
  }
  QWEN36_CHECK(int64_t(v.tokens.size()) <= vocab_size, "vocab_size {} is smaller than the synthetic vocabulary ({})",
               vocab_size, v.tokens.size());
  v.bos = v.pad = 264;
  v.eos = 266;
  while (int64_t(v.tokens.size()) < vocab_size) {
    v.tokens.push_back(fmt::format("[PAD{}]", v.tokens.size()));
    v.token_types.push_back(5);
  }
  v.pre = "qwen35";
  return v;
}

ModelPlan random_model_plan(const ModelConfig& c, uint64_t seed, const std::string& name) {
  c.validate();
  ModelPlan p;
  p.meta = gguf_metadata_for_config(c, name, quant_mix_llama_ftype(QuantMix::BF16));
  p.meta.set_str("general.description",
                 fmt::format("qwen36 gen-model: RANDOM weights (seed {}), not a trained model. Tokenizer: synthetic "
                             "byte-level BPE (256 byte tokens, 8 merges, 3 control tokens), padded with unused [PAD] "
                             "tokens to vocab_size",
                             seed));
  set_tokenizer_metadata(p.meta, synthetic_vocab(c.vocab_size));
  PlanBuilder b(p, c, seed);
  const int64_t H = c.hidden_size;
  b.matrix("token_embd.weight", {c.vocab_size, H}, c.tie_word_embeddings ? 1.0f / std::sqrt(float(H)) : 1.0f);
  for (int64_t i = 0; i < c.n_layers; ++i) b.layer(i, c.layer_kinds[size_t(i)]);
  b.vec("output_norm.weight", {H}, 1.0f, 0.1f);
  if (!c.tie_word_embeddings) b.matrix("output.weight", {c.vocab_size, H});
  if (c.mtp_layers > 0) {
    const std::string m = fmt::format("blk.{}.", c.n_layers);
    b.layer(c.n_layers, LayerKind::FullAttention);
    b.matrix(m + "nextn.eh_proj.weight", {H, 2 * H});
    b.vec(m + "nextn.enorm.weight", {H}, 1.0f, 0.1f);
    b.vec(m + "nextn.hnorm.weight", {H}, 1.0f, 0.1f);
    b.vec(m + "nextn.shared_head_norm.weight", {H}, 1.0f, 0.1f);
  }
  return p;
}

uint64_t gen_model_file(const ModelConfig& c, QuantMix mix, const std::string& path, uint64_t seed, bool progress) {
  ModelPlan p = random_model_plan(c, seed, "qwen36-random");
  const std::vector<DType> types = choose_plan_types(p, mix);
  return write_model_plan(p, types, path, progress);
}

ModelWeights make_random_quant_weights(const ModelConfig& c, QuantMix mix, uint64_t seed) {
  ModelPlan p = random_model_plan(c, seed, "qwen36-random");
  const std::vector<DType> types = choose_plan_types(p, mix);
  ModelWeights w;
  w.config = c;
  std::unordered_map<std::string, Tensor> by_name;
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    const TensorSource& s = p.tensors[i];
    Tensor t(nullptr, types[i], s.shape.data(), int(s.shape.size()));
    auto buf = std::make_shared<HostBuffer>(t.nbytes());
    t.data = buf->data();
    w.storage.push_back(buf);
    s.make_rows(types[i], 0, s.rows(), buf->data());
    by_name.emplace(s.name, t);
  }
  auto get = [&](const std::string& n) -> Tensor {
    auto it = by_name.find(n);
    QWEN36_CHECK(it != by_name.end(), "internal: random model has no tensor {}", n);
    return it->second;
  };
  auto read_layer = [&](int64_t i, LayerKind kind) {
    const std::string b = fmt::format("blk.{}.", i);
    LayerWeights l;
    l.kind = kind;
    l.input_norm = get(b + "attn_norm.weight");
    l.post_attention_norm = get(b + "post_attention_norm.weight");
    if (kind == LayerKind::FullAttention) {
      l.attn = {get(b + "attn_q.weight"), get(b + "attn_k.weight"), get(b + "attn_v.weight"),
                get(b + "attn_output.weight"), get(b + "attn_q_norm.weight"), get(b + "attn_k_norm.weight")};
    } else {
      auto& d = l.deltanet;
      d.in_proj_qkv = get(b + "attn_qkv.weight");
      d.in_proj_z = get(b + "attn_gate.weight");
      d.in_proj_b = get(b + "ssm_beta.weight");
      d.in_proj_a = get(b + "ssm_alpha.weight");
      d.conv1d = get(b + "ssm_conv1d.weight");
      d.dt_bias = get(b + "ssm_dt.bias");
      d.a_neg_exp = get(b + "ssm_a");
      d.norm = get(b + "ssm_norm.weight");
      d.out_proj = get(b + "ssm_out.weight");
    }
    if (c.moe) {
      l.moe.router = get(b + "ffn_gate_inp.weight");
      const Tensor g = get(b + "ffn_gate_exps.weight"), u = get(b + "ffn_up_exps.weight"),
                   dn = get(b + "ffn_down_exps.weight");
      auto expert = [](const Tensor& t, int64_t e) {
        Tensor v(nullptr, t.dtype, {t.dim(1), t.dim(2)});
        v.data = static_cast<std::byte*>(t.data) + size_t(e) * v.nbytes();
        return v;
      };
      for (int64_t e = 0; e < c.n_local_experts(); ++e) l.moe.experts.push_back({expert(g, e), expert(u, e), expert(dn, e)});
      if (c.shared_expert_intermediate_size > 0) {
        l.moe.shared = {get(b + "ffn_gate_shexp.weight"), get(b + "ffn_up_shexp.weight"),
                        get(b + "ffn_down_shexp.weight")};
        const Tensor g1 = get(b + "ffn_gate_inp_shexp.weight");  // stored as ne {H}, canonical (1, H)
        l.moe.shared_gate = Tensor(g1.data, g1.dtype, {1, c.hidden_size});
      }
    } else {
      l.mlp = {get(b + "ffn_gate.weight"), get(b + "ffn_up.weight"), get(b + "ffn_down.weight")};
    }
    return l;
  };
  w.embed_tokens = get("token_embd.weight");
  w.final_norm = get("output_norm.weight");
  w.lm_head = c.tie_word_embeddings ? w.embed_tokens : get("output.weight");
  for (int64_t i = 0; i < c.n_layers; ++i) w.layers.push_back(read_layer(i, c.layer_kinds[size_t(i)]));
  if (c.mtp_layers > 0) {
    const std::string b = fmt::format("blk.{}.", c.n_layers);
    MtpWeights m;
    m.fc = get(b + "nextn.eh_proj.weight");
    m.pre_fc_norm_embedding = get(b + "nextn.enorm.weight");
    m.pre_fc_norm_hidden = get(b + "nextn.hnorm.weight");
    m.norm = get(b + "nextn.shared_head_norm.weight");
    m.layer = read_layer(c.n_layers, LayerKind::FullAttention);
    w.mtp = std::move(m);
  }
  validate_weights(w);
  return w;
}

}  // namespace qwen36
