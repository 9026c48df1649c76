#include "model/presets.h"

#include "core/error.h"

namespace qwen36 {

namespace {

// Every fourth layer is full attention, as in the published checkpoints.
void set_layers(ModelConfig& c, int64_t n, int64_t interval = 4) {
  c.n_layers = n;
  c.layer_kinds.clear();
  for (int64_t i = 0; i < n; ++i)
    c.layer_kinds.push_back((i + 1) % interval == 0 ? LayerKind::FullAttention : LayerKind::LinearAttention);
}

ModelConfig base(int64_t hidden, int64_t vocab) {
  ModelConfig c;
  c.architecture = "Qwen3_5ForCausalLM";
  c.hidden_size = hidden;
  c.vocab_size = vocab;
  c.rms_norm_eps = 1e-6f;
  c.rope_theta = 1e7f;
  c.max_position_embeddings = 262144;
  c.attn_output_gate = true;
  c.conv_kernel = 4;
  return c;
}

}  // namespace

std::vector<std::string> model_preset_names() {
  return {"qwen3.6-27b", "qwen3.6-35b-a3b", "cpu-0.5b", "tiny-dense", "tiny-moe"};
}

ModelConfig model_preset(const std::string& name, int64_t layers) {
  ModelConfig c;
  if (name == "qwen3.6-27b") {
    c = base(5120, 248320);
    set_layers(c, 64);
    c.n_heads = 24, c.n_kv_heads = 4, c.head_dim = 256, c.rotary_dim = 64;
    c.linear_k_heads = 16, c.linear_v_heads = 48, c.linear_k_dim = 128, c.linear_v_dim = 128;
    c.intermediate_size = 17408;
    c.mtp_layers = 1;
    c.eos_token_ids = {248046, 248044};
  } else if (name == "qwen3.6-35b-a3b") {
    c = base(2048, 248320);
    c.architecture = "Qwen3_5MoeForCausalLM";
    set_layers(c, 40);
    c.moe = true;
    c.n_heads = 16, c.n_kv_heads = 2, c.head_dim = 256, c.rotary_dim = 64;
    c.linear_k_heads = 16, c.linear_v_heads = 32, c.linear_k_dim = 128, c.linear_v_dim = 128;
    c.n_experts = 256, c.n_experts_per_tok = 8, c.moe_intermediate_size = 512, c.shared_expert_intermediate_size = 512;
    c.mtp_layers = 1;
    c.eos_token_ids = {248046, 248044};
  } else if (name == "cpu-0.5b") {
    // ~0.52B parameters with the Qwen3 vocabulary and tied embeddings (like small Qwen3s).
    c = base(1024, 151936);
    c.tie_word_embeddings = true;
    set_layers(c, 20);
    c.n_heads = 8, c.n_kv_heads = 2, c.head_dim = 128, c.rotary_dim = 32;
    c.linear_k_heads = 8, c.linear_v_heads = 16, c.linear_k_dim = 128, c.linear_v_dim = 128;
    c.intermediate_size = 3584;
  } else if (name == "tiny-dense") {
    c = base(256, 151936);
    c.tie_word_embeddings = true;
    set_layers(c, 8);
    c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 64, c.rotary_dim = 16;
    c.linear_k_heads = 2, c.linear_v_heads = 4, c.linear_k_dim = 64, c.linear_v_dim = 64;
    c.intermediate_size = 768;
    c.mtp_layers = 1;
  } else if (name == "tiny-moe") {
    c = base(256, 151936);
    c.architecture = "Qwen3_5MoeForCausalLM";
    c.tie_word_embeddings = true;
    set_layers(c, 8);
    c.moe = true;
    c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 64, c.rotary_dim = 16;
    c.linear_k_heads = 2, c.linear_v_heads = 4, c.linear_k_dim = 64, c.linear_v_dim = 64;
    c.n_experts = 8, c.n_experts_per_tok = 2, c.moe_intermediate_size = 256, c.shared_expert_intermediate_size = 256;
    c.mtp_layers = 1;
  } else {
    fail("unknown model preset \"{}\"", name);
  }
  if (layers > 0) set_layers(c, layers);
  c.validate();
  return c;
}

}  // namespace qwen36
