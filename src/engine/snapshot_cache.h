#pragma once
// defines: SnapshotCacheOptions, SnapshotCacheStats, SnapshotCache (saved slot states at
//          prefill checkpoints, found again by the token prefix they stand for)
//
// PrefixCache reuses a finished sequence's whole slot when a new prompt extends its whole
// history (the next turn of a chat). Requests that share only a beginning — one system
// prompt and tool list in front of many users' questions — need states saved part way:
// while a prompt is prefilled, the scheduler saves its slot's state every `interval`
// positions (model/state_snapshot.h), and a later prompt starting with the same tokens
// resumes from the longest such checkpoint instead of position 0.
//
// Entries are keyed by their exact token prefix (a 64-bit hash to filter, then a full
// comparison), live in device memory up to one budget and in host RAM up to another, and
// are evicted least recently used first. A snapshot of the 27B holds ~157 MiB of DeltaNet
// state plus 64 KiB of bf16 K/V per position, so the budgets, not the entry count, bound it.

#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "model/state_snapshot.h"

namespace qwen36 {

struct SnapshotCacheOptions {
  int64_t interval = 1024;   // positions between checkpoints (0: no snapshots)
  size_t device_bytes = 0;   // budget in device memory
  size_t host_bytes = 0;     // budget in host RAM (the second tier)
};

struct SnapshotCacheStats {
  int64_t entries = 0;
  size_t device_bytes = 0, host_bytes = 0;
  uint64_t lookups = 0, hits = 0, saved = 0, evicted = 0;
};

class SnapshotCache {
 public:
  explicit SnapshotCache(SnapshotCacheOptions opts);

  bool enabled() const { return opts_.interval > 0 && (opts_.device_bytes > 0 || opts_.host_bytes > 0); }
  int64_t interval() const { return opts_.interval; }

  // The snapshot with the longest token prefix that is a proper prefix of `prompt` and longer
  // than `at_least` positions (null if none); counts a lookup, and a hit when found.
  const StateSnapshot* find(std::span<const int32_t> prompt, int64_t at_least);

  // Whether the state after `prefix` should be saved now: its length is a positive multiple
  // of the interval and no entry holds it yet.
  bool wants(std::span<const int32_t> prefix) const;

  // Where a snapshot of `bytes` would go after evicting what it needs: the device tier first,
  // then host RAM; nullopt when it fits neither budget. Evicts nothing by itself.
  std::optional<bool> placement(size_t bytes) const;  // true: host RAM

  // Adds a saved snapshot of `prefix`, evicting least recently used entries of its tier until
  // it fits (the caller sized it with placement()).
  void insert(std::vector<int32_t> prefix, StateSnapshot snap);

  SnapshotCacheStats stats() const;

  // Every entry's prefix and snapshot, least recently used first: the order a file keeps them
  // in, so that inserting them back in it leaves the most recent ones when the budgets are smaller.
  std::vector<std::pair<std::span<const int32_t>, const StateSnapshot*>> by_use() const;

 private:
  struct Entry {
    std::vector<int32_t> prefix;
    uint64_t hash = 0;
    StateSnapshot snap;
    uint64_t last_used = 0;
  };
  size_t used(bool host) const;
  const Entry* lookup(std::span<const int32_t> prefix) const;

  SnapshotCacheOptions opts_;
  std::list<Entry> entries_;
  uint64_t clock_ = 0;
  SnapshotCacheStats stats_;
};

// FNV-1a over the token ids: the same prefix always gives the same key.
uint64_t token_prefix_hash(std::span<const int32_t> tokens);

}  // namespace qwen36
