#include "engine/snapshot_cache.h"

#include <algorithm>

#include "core/error.h"

namespace qwen36 {

namespace {
constexpr uint64_t kFnvOffset = 1469598103934665603ull;
// One FNV-1a step: find() extends a running hash token by token with it.
uint64_t fnv_step(uint64_t h, int32_t t) { return (h ^ uint64_t(uint32_t(t))) * 1099511628211ull; }
}  // namespace

uint64_t token_prefix_hash(std::span<const int32_t> tokens) {
  uint64_t h = kFnvOffset;
  for (int32_t t : tokens) h = fnv_step(h, t);
  return h;
}

SnapshotCache::SnapshotCache(SnapshotCacheOptions opts) : opts_(opts) {
  QWEN36_CHECK(opts_.interval >= 0, "snapshot interval {} must be >= 0", opts_.interval);
}

const SnapshotCache::Entry* SnapshotCache::lookup(std::span<const int32_t> prefix) const {
  const uint64_t h = token_prefix_hash(prefix);
  for (const Entry& e : entries_)
    if (e.hash == h && std::ranges::equal(e.prefix, prefix)) return &e;
  return nullptr;
}

const StateSnapshot* SnapshotCache::find(std::span<const int32_t> prompt, int64_t at_least) {
  if (!enabled()) return nullptr;
  ++stats_.lookups;
  // Candidates are multiples of the interval: hash the prompt once, reading the running hash
  // at each multiple (proper prefixes only: one token must remain to produce logits).
  std::vector<std::pair<int64_t, uint64_t>> marks;
  uint64_t h = kFnvOffset;
  for (size_t i = 0; i + 1 < prompt.size(); ++i) {
    h = fnv_step(h, prompt[i]);
    if (int64_t(i + 1) % opts_.interval == 0) marks.emplace_back(int64_t(i + 1), h);
  }
  Entry* best = nullptr;
  for (Entry& e : entries_) {
    const int64_t n = int64_t(e.prefix.size());
    if (n <= at_least || (best && n <= int64_t(best->prefix.size()))) continue;
    const bool candidate = std::ranges::any_of(marks, [&](const auto& m) { return m.first == n && m.second == e.hash; });
    if (candidate && std::equal(e.prefix.begin(), e.prefix.end(), prompt.begin())) best = &e;
  }
  if (!best) return nullptr;
  ++stats_.hits;
  best->last_used = ++clock_;
  return &best->snap;
}

bool SnapshotCache::wants(std::span<const int32_t> prefix) const {
  const int64_t n = int64_t(prefix.size());
  return enabled() && n > 0 && n % opts_.interval == 0 && lookup(prefix) == nullptr;
}

size_t SnapshotCache::used(bool host) const {
  size_t n = 0;
  for (const Entry& e : entries_)
    if (e.snap.on_host() == host) n += e.snap.bytes;
  return n;
}

std::optional<bool> SnapshotCache::placement(size_t bytes) const {
  if (bytes <= opts_.device_bytes) return false;
  if (bytes <= opts_.host_bytes) return true;
  return std::nullopt;
}

void SnapshotCache::insert(std::vector<int32_t> prefix, StateSnapshot snap) {
  const bool host = snap.on_host();
  const size_t budget = host ? opts_.host_bytes : opts_.device_bytes;
  QWEN36_CHECK(snap.bytes <= budget, "a snapshot of {} bytes does not fit its tier's budget of {} bytes", snap.bytes,
               budget);
  size_t in_use = used(host);
  while (in_use + snap.bytes > budget) {  // the tier's least recently used entry goes first
    auto lru = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (it->snap.on_host() == host && (lru == entries_.end() || it->last_used < lru->last_used)) lru = it;
    in_use -= lru->snap.bytes;
    entries_.erase(lru);
    ++stats_.evicted;
  }
  Entry e;
  e.hash = token_prefix_hash(prefix);
  e.prefix = std::move(prefix);
  e.snap = std::move(snap);
  e.last_used = ++clock_;
  entries_.push_back(std::move(e));
  ++stats_.saved;
}

std::vector<std::pair<std::span<const int32_t>, const StateSnapshot*>> SnapshotCache::by_use() const {
  std::vector<const Entry*> order;
  for (const Entry& e : entries_) order.push_back(&e);
  std::ranges::sort(order, {}, &Entry::last_used);
  std::vector<std::pair<std::span<const int32_t>, const StateSnapshot*>> out;
  for (const Entry* e : order) out.emplace_back(std::span<const int32_t>(e->prefix), &e->snap);
  return out;
}

SnapshotCacheStats SnapshotCache::stats() const {
  SnapshotCacheStats s = stats_;
  s.entries = int64_t(entries_.size());
  s.device_bytes = used(false);
  s.host_bytes = used(true);
  return s;
}

}  // namespace qwen36
