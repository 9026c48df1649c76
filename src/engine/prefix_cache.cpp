#include "engine/prefix_cache.h"

#include <algorithm>

#include "core/error.h"

namespace qwen36 {

PrefixCache::PrefixCache(int32_t slots, bool enabled) : entries_(size_t(slots)), enabled_(enabled) {
  QWEN36_CHECK(slots > 0, "the prefix cache needs at least one slot");
}

PrefixCache::Grant PrefixCache::acquire(std::span<const int32_t> prompt) {
  int32_t best = -1, free_slot = -1, lru = -1;
  size_t best_len = 0;
  for (int32_t s = 0; s < slots(); ++s) {
    const Entry& e = entries_[size_t(s)];
    if (e.use == Use::Free && free_slot < 0) free_slot = s;
    if (e.use != Use::Cached) continue;
    if (lru < 0 || e.last_used < entries_[size_t(lru)].last_used) lru = s;
    // Proper prefix: at least one prompt token must still run to produce the next logits.
    const size_t n = e.history.size();
    if (n > best_len && n < prompt.size() && std::equal(e.history.begin(), e.history.end(), prompt.begin())) {
      best = s;
      best_len = n;
    }
  }
  Grant g;
  if (best >= 0) {
    g = {best, int32_t(best_len)};
  } else if (free_slot >= 0) {
    g.slot = free_slot;
  } else if (lru >= 0) {
    g.slot = lru;
  } else {
    return g;
  }
  Entry& e = entries_[size_t(g.slot)];
  e.use = Use::Busy;
  e.history.clear();
  e.last_used = ++clock_;
  return g;
}

void PrefixCache::release(int32_t slot, std::vector<int32_t> history) {
  QWEN36_CHECK(slot >= 0 && slot < slots() && entries_[size_t(slot)].use == Use::Busy, "slot {} is not in use",
               slot);
  Entry& e = entries_[size_t(slot)];
  e.use = enabled_ && !history.empty() ? Use::Cached : Use::Free;
  e.history = e.use == Use::Cached ? std::move(history) : std::vector<int32_t>{};
  e.last_used = ++clock_;
}

int32_t PrefixCache::busy() const {
  return int32_t(std::count_if(entries_.begin(), entries_.end(), [](const Entry& e) { return e.use == Use::Busy; }));
}

int32_t PrefixCache::cached() const {
  return int32_t(
      std::count_if(entries_.begin(), entries_.end(), [](const Entry& e) { return e.use == Use::Cached; }));
}

}  // namespace qwen36
