#pragma once
// defines: write_snapshot_file, read_snapshot_file, SnapshotFile (the prefix cache's checkpoints
//          on disk: `serve --prefix-cache-file`)
//
// Why: a checkpoint of a long shared prompt beginning (a system prompt, an agent's tool list)
// costs a full prefill to make; kept in a file, a restarted server resumes from it at once.
// A state is only meaningful to the very model, cache element types and state layout that
// wrote it, so the file carries a fingerprint of all three (Scheduler::checkpoint_fingerprint)
// and a file with another one is ignored.
//
// Layout: "QWEN36-CHECKPOINTS-1\n", u64 little-endian length of a JSON header {"fingerprint",
// "entries": [{"tokens", "positions", "bytes"}, ...]}, then per entry its tokens (int32 LE)
// and its snapshot's bytes (model/state_snapshot.h order), least recently used first.

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "engine/snapshot_cache.h"

namespace qwen36 {

struct SnapshotFile {
  struct Entry {
    std::vector<int32_t> prefix;
    int64_t positions = 0;
    HostBuffer bytes;
  };
  std::string fingerprint;
  std::vector<Entry> entries;
};

// Writes every entry of `cache` (device ones copied to the host first) to `path`, through a
// temporary file renamed over it, so a crash never leaves half a file. Returns the entries written.
size_t write_snapshot_file(const std::string& path, const std::string& fingerprint, Backend& backend,
                           const SnapshotCache& cache);

// Reads a whole file; throws Error naming the problem for anything malformed or truncated.
SnapshotFile read_snapshot_file(const std::string& path);

}  // namespace qwen36
