#pragma once
// defines: PrefixCache (who owns each state slot; finished sequences stay as reusable
//          "cached" slots keyed by their token history, evicted least recently used first)
//
// Why whole slots: a Gated DeltaNet state is the state after exactly its history — it cannot
// be truncated to an earlier position the way a KV cache can. So a finished sequence's slot
// is reusable only by a prompt that starts with that WHOLE history (a multi-turn chat: the
// next turn's prompt extends the previous prompt + answer). The new request then keeps the
// slot's conv + recurrent state and KV entries and prefills only its new tokens.
// A shorter shared beginning is served by SnapshotCache (states saved at prefill checkpoints).

#include <cstdint>
#include <span>
#include <vector>

namespace qwen36 {

class PrefixCache {
 public:
  explicit PrefixCache(int32_t slots, bool enabled = true);

  struct Grant {
    int32_t slot = -1;    // -1: no slot is available
    int32_t reused = 0;   // leading prompt tokens whose state the slot already holds
  };
  // Takes a slot for `prompt`: the cached slot holding the longest history that is a proper
  // prefix of it, else a free slot, else the least recently used cached slot (evicted).
  // With reused == 0 the caller must reset the slot's state.
  Grant acquire(std::span<const int32_t> prompt);
  // The sequence in `slot` ended; its state is the state after `history`.
  void release(int32_t slot, std::vector<int32_t> history);

  int32_t busy() const;
  int32_t cached() const;
  int32_t slots() const { return int32_t(entries_.size()); }

 private:
  enum class Use { Free, Busy, Cached };
  struct Entry {
    Use use = Use::Free;
    std::vector<int32_t> history;  // Cached: tokens whose state the slot holds
    uint64_t last_used = 0;
  };
  std::vector<Entry> entries_;
  uint64_t clock_ = 0;
  bool enabled_;
};

}  // namespace qwen36
