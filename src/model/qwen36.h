#pragma once
// defines: ForwardBatch, Model (the Qwen3.5/3.6 decoder, dense and MoE, plus its MTP head)

#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/state.h"
#include "model/weights.h"

namespace qwen36 {

// Everything one forward pass needs. Prefill chunks and decode tokens of many sequences
// can share a batch: each SeqRun names a contiguous slice of `tokens`.
struct ForwardBatch {
  std::vector<int32_t> tokens;       // [T]
  std::vector<SeqRun> runs;          // covers tokens exactly
  std::vector<int32_t> output_rows;  // batch rows whose logits (and hidden) are returned, in order
  DeltaRuleMode deltanet_mode = DeltaRuleMode::Auto;

  // A single sequence's tokens at positions pos0.. in `slot`, returning the last row's logits
  // (or every row's when all_logits).
  static ForwardBatch single(std::span<const int32_t> tokens, int32_t pos0, int32_t slot = 0, bool all_logits = false);
};

class Model {
 public:
  Model(ModelWeights weights, Backend& backend);

  const ModelConfig& config() const { return w_.config; }
  const ModelWeights& weights() const { return w_; }
  Backend& backend() { return backend_; }
  bool has_mtp() const { return w_.mtp.has_value(); }

  // Runs the batch, updating `state`. logits: host [output_rows, vocab]. hidden (optional):
  // host [output_rows, hidden], the final-normed hidden state that feeds lm_head and MTP.
  void forward(const ForwardBatch& batch, ModelState& state, float* logits, float* hidden = nullptr);

  // MTP head: for each row i, predicts the token after next from the target's post-norm
  // hidden[i] (host [n, hidden]) and the following token next_tokens[i]; runs use the MTP's
  // own KV cache in `state`. logits: host [n, vocab]; mtp_hidden (optional) gets the MTP's
  // normalised output, the hidden input of the next draft step.
  void mtp_forward(std::span<const float> hidden, std::span<const int32_t> next_tokens, std::span<const SeqRun> runs,
                   ModelState& state, float* logits, float* mtp_hidden = nullptr);

 private:
  class Scratch;
  Tensor attention_block(Scratch& s, const LayerWeights& l, const Tensor& x, Tensor& k_cache, Tensor& v_cache,
                         std::span<const SeqRun> runs);
  Tensor deltanet_block(Scratch& s, const LayerWeights& l, const Tensor& x, Tensor& conv_state, Tensor& ssm_state,
                        std::span<const SeqRun> runs, DeltaRuleMode mode);
  Tensor mlp_block(Scratch& s, const MlpWeights& m, const Tensor& x);
  Tensor moe_block(Scratch& s, const MoeWeights& m, const Tensor& x);
  // One decoder layer: h += mixer(norm(h)); h += ffn(norm(h)).
  void decoder_layer(Scratch& s, const LayerWeights& l, Tensor& h, Tensor& cache_a, Tensor& cache_b,
                     std::span<const SeqRun> runs, DeltaRuleMode mode);
  void head(Scratch& s, const Tensor& h, const Tensor& norm, std::span<const int32_t> rows, float* logits,
            float* hidden);

  ModelWeights w_;
  Backend& backend_;
};

}  // namespace qwen36
