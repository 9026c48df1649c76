#pragma once
// defines: DFlashDrafter (DFlash block-diffusion drafting through the Drafter interface:
//          chain verification of the whole block as one path)
//
// observe() receives the target's captured layer outputs for committed positions (every
// prefill chunk, then the accepted rows of each verify) and projects them at once into the
// drafter's K/V caches (DFlashModel::add_context); no feature rows are kept after that, so
// the only per-sequence memory is the drafter's K/V cache (DFlashModel::cache_bytes).
// propose() drafts one block [pending token, MASK × (B−1)] per sequence whose context is
// complete up to the pending token, in one drafter pass for all sequences, and proposes the
// greedy argmax of positions 1 .. min(k, B−1) — the reference drafts greedily even when the
// target samples, so q is one-hot (empty). The top-K distribution of every block position is
// kept per slot for tree drafting (last_topk).

#include <memory>

#include "engine/spec/drafter.h"
#include "model/dflash.h"

namespace qwen36 {

class Model;

class DFlashDrafter final : public Drafter {
 public:
  // Caches for `slots` sequences of the target state's `capacity` positions.
  DFlashDrafter(const Model& target, DFlashWeights weights, Backend& backend, int32_t slots, int64_t capacity,
                DFlashOptions opts = {}, int32_t top_k = 8);

  const char* name() const override { return "dflash"; }
  std::vector<int32_t> capture_layers() const override { return m_.config().target_layer_ids; }
  void reset(int32_t slot) override;
  // A prefix-cache hit in the same slot: the drafter's K/V rows 0 .. reused − 1 of `slot` are
  // still the projections of the previous sequence's committed positions, the same tokens
  // (blocks are only ever written past the committed context), so the context is cut back to
  // `reused` and kept. This is valid only while the target's state of the slot is that
  // slot's own history: the scheduler turns off checkpoints (snapshots restored into another
  // slot) for dflash.
  void resume(int32_t slot, int32_t reused, int32_t next_token) override;
  void observe(int32_t slot, int32_t pos0, std::span<const float> features, std::span<const int32_t> next) override;
  void propose(std::span<DraftRequest> requests) override;

  int32_t block_size() const { return m_.block_size(); }
  const DFlashModel& model() const { return m_; }
  // Positions of `slot` projected into the drafter's caches so far.
  int32_t context_len(int32_t slot) const { return ctx_len_.at(size_t(slot)); }
  // Per block position 1 .. B−1 of slot's last drafted block: the top-K of softmax(logits).
  const std::vector<Dist>& last_topk(int32_t slot) const { return topk_.at(size_t(slot)); }

 private:
  DFlashModel m_;
  int32_t top_k_;
  std::vector<int32_t> ctx_len_;
  std::vector<std::vector<Dist>> topk_;
};

// Loads the drafter checkpoint at `path` (format/dflash_loader.h) for `target`. top_k: per
// block position, the distribution kept for tree drafting (0: none; chain drafting needs
// only the argmax, and a top-K over a 248 K vocabulary costs host time every round).
std::unique_ptr<DFlashDrafter> load_dflash_drafter(const std::string& path, const Model& target, Backend& backend,
                                                   int32_t slots, int64_t capacity, DFlashOptions opts = {},
                                                   int32_t top_k = 0);

}  // namespace qwen36
