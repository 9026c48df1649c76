#pragma once
// defines: ModelConfig (typed, validated hyper-parameters of one Qwen3.5/3.6 text decoder)
//
// Every dimension the engine uses comes from here, and every field here comes from the
// checkpoint (config.json or GGUF metadata). Nothing about a particular model size is
// hard-coded anywhere else.

#include <cstdint>
#include <string>
#include <vector>

namespace qwen36 {

enum class LayerKind : uint8_t { LinearAttention, FullAttention };

struct ModelConfig {
  std::string architecture;  // e.g. Qwen3_5ForCausalLM; informational
  bool moe = false;

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t n_layers = 0;
  std::vector<LayerKind> layer_kinds;  // [n_layers]
  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 0;

  // Gated full attention.
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;  // leading dims of each head that RoPE rotates (NeoX pairing)
  float rope_theta = 1e7f;
  bool attn_output_gate = true;  // q_proj rows are per-head [q | gate]

  // Gated DeltaNet (linear attention).
  int64_t linear_k_heads = 0;
  int64_t linear_v_heads = 0;
  int64_t linear_k_dim = 0;
  int64_t linear_v_dim = 0;
  int64_t conv_kernel = 0;
  // Rows of in_proj_b / in_proj_a; 0: linear_v_heads. A tensor-parallel shard pads them to whole
  // 16-row tiles (the CUDA int8 GEMM's unit; a 27B shard's 24 heads are not) and ignores the
  // extra rows' outputs.
  int64_t linear_gate_rows = 0;

  // Dense MLP.
  int64_t intermediate_size = 0;

  // Sparse MoE (every layer when moe).
  int64_t n_experts = 0;
  int64_t n_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;  // 0: no shared expert
  // Expert parallelism (model/tp_shard.h): this model holds the routed experts [expert0,
  // expert0 + local_experts) of the n_experts its router chooses from; 0: all of them.
  int64_t expert0 = 0;
  int64_t local_experts = 0;

  // Multi-token prediction head (mtp.*): number of layers, 0 if absent.
  int64_t mtp_layers = 0;

  // Token ids that end generation (may be empty for tiny random checkpoints).
  std::vector<int32_t> eos_token_ids;

  // Derived sizes.
  int64_t n_local_experts() const { return local_experts ? local_experts : n_experts; }
  int64_t linear_key_dim() const { return linear_k_heads * linear_k_dim; }     // q and k widths
  int64_t linear_value_dim() const { return linear_v_heads * linear_v_dim; }   // v and z widths
  int64_t gate_rows() const { return linear_gate_rows ? linear_gate_rows : linear_v_heads; }
  int64_t conv_dim() const { return 2 * linear_key_dim() + linear_value_dim(); }
  int64_t q_proj_rows() const { return n_heads * head_dim * (attn_output_gate ? 2 : 1); }
  int64_t n_full_attention_layers() const;
  int64_t n_linear_layers() const { return n_layers - n_full_attention_layers(); }

  // Throws Error naming the first inconsistent field.
  void validate() const;
  std::string summary() const;  // one line for logs
};

}  // namespace qwen36
