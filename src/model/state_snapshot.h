#pragma once
// defines: StateSnapshot, snapshot_bytes, save_snapshot, restore_snapshot (a copy of one
//          slot's state after the first P positions of its sequence)
//
// Why: a Gated DeltaNet state cannot be rewound, so a prefix cache for this model family can
// only resume from a state that was saved when the sequence stood exactly at that prefix.
// A snapshot holds, for one slot: every DeltaNet layer's conv and recurrent state, and the
// attention K/V entries (the MTP head's included) of positions 0 .. P-1 — the fp8 cache's
// per-row scales too. Restoring it into any slot makes that slot's sequence continue as if
// it had just read those P tokens; the result is bit-identical to having prefilled them.
//
// Where it lives: device memory (fast to restore) or host RAM (the larger, slower tier);
// copies go through the Backend, so the CPU backend runs the same code.

#include <cstddef>
#include <cstdint>
#include <memory>

#include "backend/backend.h"
#include "core/tensor.h"
#include "model/state.h"

namespace qwen36 {

struct StateSnapshot {
  int64_t positions = 0;
  size_t bytes = 0;
  std::unique_ptr<DeviceBuffer> device;  // one of the two holds the bytes
  HostBuffer host;
  bool on_host() const { return device == nullptr; }
};

// Bytes of a snapshot of `positions` positions of `state`'s slots.
size_t snapshot_bytes(const ModelState& state, int64_t positions);

// Copies slot `slot`'s state after `positions` positions into a new snapshot, in device
// memory or in host RAM.
StateSnapshot save_snapshot(Backend& backend, ModelState& state, int32_t slot, int64_t positions, bool to_host);

// Overwrites slot `slot` with the snapshot: its sequence now stands at snap.positions.
void restore_snapshot(Backend& backend, const StateSnapshot& snap, ModelState& state, int32_t slot);

// The snapshot's snap.bytes bytes into host memory at `dst` (a file's copy of it).
void snapshot_to_host(Backend& backend, const StateSnapshot& snap, std::byte* dst);
// A snapshot of `positions` positions from the bytes snapshot_to_host wrote, kept in host RAM or
// copied into device memory.
StateSnapshot snapshot_from_host(Backend& backend, HostBuffer bytes, int64_t positions, bool to_host);

}  // namespace qwen36
