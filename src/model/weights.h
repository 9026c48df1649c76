#pragma once
// defines: ModelWeights, the one canonical weight set every checkpoint format maps into
//
// Canonical layout (the forward pass never special-cases a format):
//  - matrices are torch-shaped {out, in} and keep their stored dtype (bf16, f16, f32 or a
//    GGUF block type); MoE experts are per-expert 2-D views into whatever storage holds them;
//  - every zero-centred RMSNorm weight is stored as the effective multiplier (1 + w) in f32,
//    the gated DeltaNet norm as its plain weight in f32;
//  - DeltaNet: `a_neg_exp` holds −exp(A_log) in f32; value heads are grouped by key head
//    (HF order: value head h reads key head h / (Hv/Hk)); GGUF's tiled order is undone at load;
//  - small vectors (norms, conv taps, dt_bias) are f32.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace qwen36 {

struct AttentionWeights {
  Tensor q_proj;  // (n_heads * head_dim * 2, hidden); per head rows [q (head_dim) | gate (head_dim)]
  Tensor k_proj;  // (n_kv_heads * head_dim, hidden)
  Tensor v_proj;  // (n_kv_heads * head_dim, hidden)
  Tensor o_proj;  // (hidden, n_heads * head_dim)
  Tensor q_norm;  // (head_dim) f32, 1 + w
  Tensor k_norm;  // (head_dim) f32, 1 + w
};

struct DeltaNetWeights {
  Tensor in_proj_qkv;  // (conv_dim, hidden); rows [q (Hk*dk) | k (Hk*dk) | v (Hv*dv)]
  Tensor in_proj_z;    // (Hv * dv, hidden)
  Tensor in_proj_b;    // (gate_rows, hidden): Hv rows, a shard's padded (ModelConfig::gate_rows)
  Tensor in_proj_a;    // (gate_rows, hidden)
  Tensor conv1d;       // (conv_dim, conv_kernel) f32
  Tensor dt_bias;      // (Hv) f32
  Tensor a_neg_exp;    // (Hv) f32, −exp(A_log)
  Tensor norm;         // (dv) f32, plain weight (no +1)
  Tensor out_proj;     // (hidden, Hv * dv)
  // Empty: out_proj's input columns follow the grouped head order above. Otherwise column
  // block p (dv columns) belongs to grouped head out_proj_heads[p] — GGUF files keep llama.cpp's
  // tiled order there, since a quantization block may straddle two heads' columns.
  std::vector<int32_t> out_proj_heads;
};
// llama.cpp's tiled order of Hv value heads over Hk key heads as out_proj_heads gives it:
// block p = j·Hk + i holds grouped head i·(Hv / Hk) + j (i: key head, j: its value head).
std::vector<int32_t> gguf_tiled_heads(int64_t Hk, int64_t Hv);

struct MlpWeights {
  Tensor gate_proj;  // (intermediate, hidden)
  Tensor up_proj;    // (intermediate, hidden)
  Tensor down_proj;  // (hidden, intermediate)
};

struct MoeWeights {
  Tensor router;                    // (n_experts, hidden)
  std::vector<MlpWeights> experts;  // [n_experts], each (moe_intermediate, hidden) / (hidden, moe_intermediate)
  MlpWeights shared;                // empty tensors when there is no shared expert
  Tensor shared_gate;               // (1, hidden)
};

struct LayerWeights {
  LayerKind kind = LayerKind::LinearAttention;
  Tensor input_norm;           // (hidden) f32, 1 + w
  Tensor post_attention_norm;  // (hidden) f32, 1 + w
  AttentionWeights attn;       // full-attention layers
  DeltaNetWeights deltanet;    // linear-attention layers
  MlpWeights mlp;              // dense models
  MoeWeights moe;              // MoE models
};

// Multi-token prediction head: x = fc([norm_e(embed(t+1)), norm_h(h_t)]) → one full-attention
// decoder layer → norm → the shared lm_head.
struct MtpWeights {
  Tensor fc;                     // (hidden, 2 * hidden)
  Tensor pre_fc_norm_embedding;  // (hidden) f32, 1 + w
  Tensor pre_fc_norm_hidden;     // (hidden) f32, 1 + w
  Tensor norm;                   // (hidden) f32, 1 + w
  LayerWeights layer;            // kind FullAttention
};

struct ModelWeights {
  ModelConfig config;
  Tensor embed_tokens;  // (vocab, hidden)
  Tensor final_norm;    // (hidden) f32, 1 + w
  Tensor lm_head;       // (vocab, hidden); the embedding itself when tied
  std::vector<LayerWeights> layers;
  std::optional<MtpWeights> mtp;

  // Whatever backs the views above: mapped files, converted buffers. Kept alive here.
  std::vector<std::shared_ptr<const void>> storage;

  // Total bytes of the weights (views counted once each, tied head counted once).
  size_t total_bytes() const;
};

// Checks every tensor of `w` against the shapes `w.config` implies; throws Error naming the
// first missing or mis-shaped tensor.
void validate_weights(const ModelWeights& w);

}  // namespace qwen36
