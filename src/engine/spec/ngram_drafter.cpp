#include "engine/spec/ngram_drafter.h"

#include <algorithm>

#include "core/error.h"

namespace qwen36 {

std::vector<int32_t> ngram_lookup(std::span<const int32_t> history, int32_t k, const NgramOptions& opts) {
  const int64_t L = int64_t(history.size());
  for (int64_t n = std::min<int64_t>(opts.max_n, L - 1); n >= opts.min_n && k > 0; --n) {
    const auto suffix = history.last(size_t(n));
    // Latest start s < L - n with history[s .. s + n) == suffix; recent text predicts best.
    for (int64_t s = L - n - 1; s >= 0; --s) {
      if (!std::equal(suffix.begin(), suffix.end(), history.begin() + s)) continue;
      // The continuation may run past the end of the history; it then continues from its own
      // proposals (history + drafts), so a repeating pattern is drafted k deep, not just to the end.
      std::vector<int32_t> out;
      for (int64_t i = s + n; int64_t(out.size()) < k; ++i)
        out.push_back(i < L ? history[size_t(i)] : out[size_t(i - L)]);
      return out;
    }
  }
  return {};
}

NgramDrafter::NgramDrafter(NgramOptions opts) : opts_(opts) {
  QWEN36_CHECK(opts.min_n >= 1 && opts.max_n >= opts.min_n, "n-gram sizes {}..{} are invalid", opts.min_n, opts.max_n);
}

void NgramDrafter::propose(std::span<DraftRequest> requests) {
  for (DraftRequest& r : requests) {
    r.tokens = ngram_lookup(r.history, r.k, opts_);
    r.q.clear();  // deterministic: one-hot
  }
}

}  // namespace qwen36
