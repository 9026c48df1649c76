#include "model/config.h"

#include <fmt/format.h>

#include "core/error.h"

namespace qwen36 {

int64_t ModelConfig::n_full_attention_layers() const {
  int64_t n = 0;
  for (LayerKind k : layer_kinds) n += k == LayerKind::FullAttention;
  return n;
}

void ModelConfig::validate() const {
  // Upper bounds keep corrupt configs from asking for absurd allocations; they are far above
  // any model of the family (the 397B has hidden 4096..8192, vocab 248320).
  constexpr int64_t kMaxDim = 1 << 20, kMaxLayers = 1024, kMaxVocab = 1 << 24;
  auto positive = [](const char* name, int64_t v, int64_t max) {
    QWEN36_CHECK(v > 0 && v <= max, "config: {} = {} is out of range (1..{})", name, v, max);
  };
  positive("vocab_size", vocab_size, kMaxVocab);
  positive("hidden_size", hidden_size, kMaxDim);
  positive("num_hidden_layers", n_layers, kMaxLayers);
  QWEN36_CHECK(int64_t(layer_kinds.size()) == n_layers, "config: layer_types has {} entries, num_hidden_layers is {}",
               layer_kinds.size(), n_layers);
  QWEN36_CHECK(rms_norm_eps > 0 && rms_norm_eps < 1, "config: rms_norm_eps = {} is out of range", rms_norm_eps);
  QWEN36_CHECK(rope_theta > 0, "config: rope_theta = {} must be positive", rope_theta);
  if (n_full_attention_layers() > 0 || mtp_layers > 0) {
    positive("num_attention_heads", n_heads, 4096);
    positive("num_key_value_heads", n_kv_heads, 4096);
    positive("head_dim", head_dim, 4096);
    QWEN36_CHECK(n_heads % n_kv_heads == 0, "config: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                 n_heads, n_kv_heads);
    QWEN36_CHECK(rotary_dim >= 0 && rotary_dim <= head_dim && rotary_dim % 2 == 0,
                 "config: rotary dimension {} must be even and at most head_dim {}", rotary_dim, head_dim);
  }
  if (n_linear_layers() > 0) {
    positive("linear_num_key_heads", linear_k_heads, 4096);
    positive("linear_num_value_heads", linear_v_heads, 4096);
    positive("linear_key_head_dim", linear_k_dim, 4096);
    positive("linear_value_head_dim", linear_v_dim, 4096);
    positive("linear_conv_kernel_dim", conv_kernel, 64);
    QWEN36_CHECK(linear_v_heads % linear_k_heads == 0,
                 "config: linear_num_value_heads {} is not a multiple of linear_num_key_heads {}", linear_v_heads,
                 linear_k_heads);
  }
  if (moe) {
    positive("num_experts", n_experts, 1 << 16);
    positive("num_experts_per_tok", n_experts_per_tok, n_experts);
    positive("moe_intermediate_size", moe_intermediate_size, kMaxDim);
    QWEN36_CHECK(shared_expert_intermediate_size >= 0 && shared_expert_intermediate_size <= kMaxDim,
                 "config: shared_expert_intermediate_size = {} is out of range", shared_expert_intermediate_size);
    QWEN36_CHECK(local_experts >= 0 && expert0 >= 0 && expert0 + n_local_experts() <= n_experts,
                 "config: experts {}..{} held of {}", expert0, expert0 + n_local_experts() - 1, n_experts);
  } else {
    positive("intermediate_size", intermediate_size, kMaxDim);
  }
  QWEN36_CHECK(mtp_layers >= 0 && mtp_layers <= 16, "config: mtp_num_hidden_layers = {} is out of range", mtp_layers);
  for (int32_t id : eos_token_ids)
    QWEN36_CHECK(id >= 0 && id < vocab_size, "config: eos_token_id {} is outside the vocabulary ({})", id, vocab_size);
}

std::string ModelConfig::summary() const {
  std::string s = fmt::format("{} layers ({} full attention), hidden {}, vocab {}", n_layers,
                              n_full_attention_layers(), hidden_size, vocab_size);
  s += fmt::format(", attention {}q/{}kv x {}", n_heads, n_kv_heads, head_dim);
  s += fmt::format(", deltanet {}k/{}v x {}/{}", linear_k_heads, linear_v_heads, linear_k_dim, linear_v_dim);
  if (moe) {
    s += fmt::format(", {} experts top-{} x {} (+shared {})", n_experts, n_experts_per_tok, moe_intermediate_size,
                     shared_expert_intermediate_size);
    if (local_experts) s += fmt::format(", holding experts {}..{}", expert0, expert0 + local_experts - 1);
  } else {
    s += fmt::format(", mlp {}", intermediate_size);
  }
  if (mtp_layers) s += fmt::format(", mtp {}", mtp_layers);
  return s;
}

}  // namespace qwen36
