#pragma once
// defines: DFlashConfig, DFlashLayer, DFlashWeights (a z-lab DFlash block-diffusion drafter),
//          DFlashOptions, DFlashModel (its caches and forward pass on any Backend),
//          synthetic_dflash_config / make_random_dflash_weights (a random drafter of the
//          published shape, for benchmarks)
//
// The drafter (z-lab `DFlashDraftModel`, model_type qwen3) is N Qwen3 decoder layers (q/k/v/o
// without the output gate, per-head q/k RMSNorm, SwiGLU MLP, pre-norm residuals) and a final
// norm. It has no embedding and no lm_head of its own: the target's are used. It conditions
// on the target: the outputs of target decoder layers `target_layer_ids` at every committed
// position are concatenated, mapped by `fc` (L·H → H) and `hidden_norm` into one context row
// per position, and every drafter layer projects those rows with its own k_proj / v_proj
// (+ k_norm, RoPE at the position) into its K/V cache — once, when the position is
// committed (add_context). Drafting a block [anchor, MASK × (B−1)] at positions s .. s+B−1
// is then one pass over B rows per sequence: queries from the block, keys/values from the
// cached context plus the block itself. The block's own K/V are written past the context and
// simply overwritten by the next block (the reference's cache crop).
//
// Block causality: the reference forward (z-lab dflash/model.py) runs every layer with
// is_causal = False, so every block row sees the whole block; that is the default here. vLLM
// instead treats sliding-window layers as causal; DFlashOptions::sliding_causal selects that.
// Sliding-window layers see keys at positions ≥ s + B − W (the window of the block's last
// row, shared by the whole block: rows before it see up to B − 1 extra old keys, a
// difference only past W tokens of context, and one that affects acceptance, never output);
// the window never cuts into the block itself (only matters for W < B, as in test fixtures).

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/weights.h"

namespace qwen36 {

class Model;

struct DFlashConfig {
  int64_t hidden_size = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;
  int64_t vocab_size = 0;  // informational: the target's vocabulary is the one used
  float rms_norm_eps = 1e-6f;
  float rope_theta = 1e6f;
  std::vector<bool> sliding;    // [n_layers]: sliding_attention (else full_attention)
  int64_t sliding_window = 0;   // keys a sliding layer sees (0: no sliding layers)
  std::vector<int32_t> target_layer_ids;  // target decoder layers whose outputs condition the drafter
  int32_t block_size = 16;      // anchor + block_size − 1 drafts
  int32_t mask_token_id = -1;   // the embedding row of the masked block positions

  void validate() const;        // throws Error naming the first bad field
  std::string summary() const;  // one line for logs
};

struct DFlashLayer {
  Tensor input_norm, post_attention_norm;  // (hidden) f32, plain Qwen3 weights (no +1)
  Tensor q_proj;                           // (n_heads·head_dim, hidden)
  Tensor k_proj, v_proj;                   // (n_kv_heads·head_dim, hidden)
  Tensor o_proj;                           // (hidden, n_heads·head_dim)
  Tensor q_norm, k_norm;                   // (head_dim) f32
  MlpWeights mlp;
};

struct DFlashWeights {
  DFlashConfig config;
  Tensor fc;           // (hidden, len(target_layer_ids)·hidden)
  Tensor hidden_norm;  // (hidden) f32
  Tensor norm;         // (hidden) f32, before the target's lm_head
  std::vector<DFlashLayer> layers;
  std::vector<std::shared_ptr<const void>> storage;  // mapped files, converted copies
};

struct DFlashOptions {
  int32_t block_size = 0;       // 0: the checkpoint's
  bool sliding_causal = false;  // sliding-window layers causal within the block (vLLM); default
                                // non-causal as the z-lab reference forward
};

// One sequence's block to draft: anchor token at position pos (the context holds 0 .. pos−1).
struct DFlashBlock {
  int32_t slot = 0;
  int32_t pos = 0;
  int32_t anchor = 0;
};

class DFlashModel {
 public:
  // Checks the drafter against the target (hidden size, layer ids, mask token) and makes K/V
  // caches for `slots` sequences of up to `capacity` positions (the block's included).
  DFlashModel(DFlashWeights w, const Model& target, Backend& backend, int32_t slots, int64_t capacity,
              DFlashOptions opts = {});

  const DFlashConfig& config() const { return w_.config; }
  int32_t block_size() const { return block_; }
  int64_t vocab_size() const;  // the target's: logits are the target lm_head's
  // Width of one captured context row: len(target_layer_ids) · hidden.
  int64_t feature_width() const { return int64_t(w_.config.target_layer_ids.size()) * w_.config.hidden_size; }
  size_t cache_bytes() const;

  // Projects context rows (host [n, feature_width()], the captured target layer outputs at
  // positions pos0 .. pos0 + n − 1 of `slot`) into every layer's K/V cache.
  void add_context(int32_t slot, int32_t pos0, std::span<const float> features);
  // One pass over every block; logits: host [blocks · (B − 1), target vocab], the predictions
  // for block positions 1 .. B − 1 in order.
  void draft(std::span<const DFlashBlock> blocks, float* logits);
  // The same pass, keeping only each prediction's most likely token (ties to the lower id) in
  // best [blocks · (B − 1)]: the logits stay on the backend (sample_candidates, k = 1), so a
  // round moves 4 bytes per prediction to the host instead of a vocabulary row (15 MB a block
  // for a 248k vocabulary).
  void draft_argmax(std::span<const DFlashBlock> blocks, int32_t* best);
  // The same pass, keeping each prediction's k most likely tokens (ids [blocks · (B − 1), k],
  // probability descending, ties to the lower id) and their probabilities under the full
  // softmax (probs, same shape): DDTree's per-position top-K, k · 8 bytes per prediction moved.
  void draft_topk(std::span<const DFlashBlock> blocks, int32_t k, int32_t* ids, float* probs);

 private:
  // The pass of draft(); take(logits) receives the predictions' logits [blocks · (B − 1), V] in
  // backend memory.
  void pass(std::span<const DFlashBlock> blocks, const std::function<void(Tensor&)>& take);
  void attend(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, std::span<const DFlashBlock> blocks,
              Tensor& out);
  void write_kv(int64_t layer, const Tensor& k, const Tensor& v, int32_t slot, int32_t pos0, int64_t row0, int64_t n);

  DFlashWeights w_;
  const Model& target_;
  Backend& b_;
  DFlashOptions opts_;
  int32_t block_ = 16;
  int32_t slots_ = 0;
  int64_t capacity_ = 0;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;  // caches and uploaded weights
  std::vector<Tensor> k_cache_, v_cache_;               // per layer [slots, capacity, kv heads, head_dim] f32
};

// The drafter shape z-lab publishes for a target like `target` (shared/docs/spec-and-quant.md
// A1): Qwen3.6-27B (hidden 5120, 64 layers) → 5 layers (4 sliding, window 2048, + 1 full),
// 32 heads / 8 kv × 128, ffn 17408, target layers [1,16,31,46,61], mask 248070 (1.73 B
// parameters); Qwen3.6-35B-A3B (hidden 2048, 40 layers) → the April revision: 8 full layers,
// 32 / 4 × 128, ffn 6144, [1,10,19,28,37]. Any other target gets the 27B layout (4 sliding +
// 1 full) at its own attention geometry and ffn, 5 target layers spread over 1 .. L−3 as the
// reference's default (fewer for targets under 8 layers). mask_token_id: 248070 when the
// vocabulary has it, else the last id.
DFlashConfig synthetic_dflash_config(const ModelConfig& target, int32_t block_size = 16);
// Random weights for `c` in host memory: matrices ~ N(0, 1/fan_in) in matrix_dtype (bf16 as
// the published checkpoints), norms near 1 in f32. Generated in parallel (OpenMP), one stream
// per 64 K values, reproducible for a seed; the 27B drafter is 3.46 GB of bf16.
DFlashWeights make_random_dflash_weights(const DFlashConfig& c, DType matrix_dtype, uint64_t seed);

}  // namespace qwen36
