#include "engine/spec/dflash_drafter.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "core/error.h"
#include "format/dflash_loader.h"
#include "model/qwen36.h"

namespace qwen36 {

DFlashDrafter::DFlashDrafter(const Model& target, DFlashWeights weights, Backend& backend, int32_t slots,
                             int64_t capacity, DFlashOptions opts, int32_t top_k)
    // a block is written past the last committed position: room for the largest block (17)
    : m_(std::move(weights), target, backend, slots, capacity + 17, opts),
      top_k_(top_k),
      ctx_len_(size_t(slots), 0),
      topk_(size_t(slots)) {
  QWEN36_CHECK(top_k >= 0, "DFlash: top-k {} must be >= 0", top_k);
}

void DFlashDrafter::reset(int32_t slot) {
  ctx_len_.at(size_t(slot)) = 0;
  topk_.at(size_t(slot)).clear();
}

void DFlashDrafter::resume(int32_t slot, int32_t reused, int32_t) {
  int32_t& len = ctx_len_.at(size_t(slot));
  len = std::min(len, reused);
  topk_.at(size_t(slot)).clear();
}

void DFlashDrafter::observe(int32_t slot, int32_t pos0, std::span<const float> features, std::span<const int32_t>) {
  int32_t& len = ctx_len_.at(size_t(slot));
  // Positions must arrive in order; after a gap (a sequence resumed without its features)
  // this slot drafts nothing until it is reset: acceptance is lost, never correctness.
  if (pos0 > len) return;
  const int32_t n = int32_t(int64_t(features.size()) / m_.feature_width());
  m_.add_context(slot, pos0, features);
  len = pos0 + n;
}

void DFlashDrafter::propose(std::span<DraftRequest> requests) {
  std::vector<DFlashBlock> blocks;
  std::vector<DraftRequest*> drafting;
  for (DraftRequest& r : requests) {
    r.tokens.clear();
    r.q.clear();
    const int32_t pos = int32_t(r.history.size()) - 1;  // the pending token's position
    if (r.k <= 0 || r.history.empty() || ctx_len_.at(size_t(r.slot)) != pos) continue;
    blocks.push_back({r.slot, pos, r.history.back()});
    drafting.push_back(&r);
  }
  if (blocks.empty()) return;
  const int64_t B = m_.block_size(), Vt = m_.vocab_size();
  if (top_k_ == 0) {  // chain drafting: the argmax of each prediction is all that is needed
    std::vector<int32_t> best(blocks.size() * size_t(B - 1));
    m_.draft_argmax(blocks, best.data());
    for (size_t i = 0; i < drafting.size(); ++i) {
      DraftRequest& r = *drafting[i];
      topk_.at(size_t(r.slot)).clear();
      for (int64_t j = 0; j < B - 1 && j < r.k; ++j) r.tokens.push_back(best[i * size_t(B - 1) + size_t(j)]);
    }
    return;
  }
  // Tree drafting: each prediction's top-K from the backend (its logits stay there), the most
  // likely first, so the chain's drafts are the candidates' heads.
  const size_t K = size_t(std::min<int64_t>(top_k_, Vt)), P = size_t(B - 1);
  std::vector<int32_t> ids(blocks.size() * P * K);
  std::vector<float> probs(ids.size());
  m_.draft_topk(blocks, int32_t(K), ids.data(), probs.data());
  for (size_t i = 0; i < drafting.size(); ++i) {
    DraftRequest& r = *drafting[i];
    std::vector<Dist>& topk = topk_.at(size_t(r.slot));
    topk.clear();
    for (size_t j = 0; j < P; ++j) {
      const size_t at = (i * P + j) * K;
      if (int64_t(j) < r.k) r.tokens.push_back(ids[at]);
      Dist d;
      for (size_t t = 0; t < K; ++t) d.emplace_back(ids[at + t], probs[at + t]);
      topk.push_back(std::move(d));
    }
  }
}

std::unique_ptr<DFlashDrafter> load_dflash_drafter(const std::string& path, const Model& target, Backend& backend,
                                                   int32_t slots, int64_t capacity, DFlashOptions opts,
                                                   int32_t top_k) {
  DFlashWeights w = load_dflash_checkpoint(path);
  spdlog::info("{}", w.config.summary());
  return std::make_unique<DFlashDrafter>(target, std::move(w), backend, slots, capacity, opts, top_k);
}

}  // namespace qwen36
