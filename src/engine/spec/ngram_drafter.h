#pragma once
// defines: NgramDrafter (prompt lookup: drafts by matching the latest n-gram earlier in the
//          sequence's own prompt + output)
//
// For n from max_n down to min_n, the most recent earlier occurrence of the last n tokens is
// looked up and the k tokens that followed it are proposed (past the end of the history, the
// continuation repeats itself: history + drafts is treated as one text). Deterministic, so its q
// is one-hot. Cheap and effective on code edits, tool calls and anything that repeats input.

#include "engine/spec/drafter.h"

namespace qwen36 {

struct NgramOptions {
  int32_t min_n = 1;
  int32_t max_n = 4;
};

// The drafts alone (exposed for tests): up to k tokens continuing `history`.
std::vector<int32_t> ngram_lookup(std::span<const int32_t> history, int32_t k, const NgramOptions& opts);

class NgramDrafter final : public Drafter {
 public:
  explicit NgramDrafter(NgramOptions opts = {});
  const char* name() const override { return "ngram"; }
  void propose(std::span<DraftRequest> requests) override;

 private:
  NgramOptions opts_;
};

}  // namespace qwen36
