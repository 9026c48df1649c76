#pragma once
// defines: tree_ops::* — tree verification (DDTree) composed of a backend's own ops, so that
//          every backend verifies trees correctly before it has tree kernels: the Backend
//          defaults of rope_tree, attention_tree and the tree read-only DeltaNet ops (and the
//          checks of compact_rows, a tree commit's row moves).
//
// Each token of the tree is computed as a token of a root path run as a chain through the
// backend's chain ops on rows gathered with get_rows (correct, not fast). The read-only DeltaNet
// ops take every leaf's root path in one call, a run per path in the same slot (they start each
// run from the slot's state; Σ over leaves of depth + 1 rows); attention writes each path's K/V
// into the cache rows it reads, so it runs one token's path at a time. On the CPU backend this is
// the reference semantics
// (tests/unit/backend/cpu_tree_verify_test.cpp); a device backend replaces it with one-pass
// kernels tested against that.

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"

namespace qwen36::tree_ops {

void rope(Backend& b, Tensor& x, const SeqRun& run, std::span<const int32_t> parent, int64_t rotary_dim, float theta);
void attention(Backend& b, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache,
               const SeqRun& run, std::span<const int32_t> parent, float scale, Tensor& out);
void conv1d_silu_readonly(Backend& b, Tensor& x, const Tensor& w, const Tensor& conv_state, const SeqRun& run,
                          std::span<const int32_t> parent);
void delta_rule_readonly(Backend& b, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                         const Tensor& beta, const Tensor& state, const SeqRun& run, std::span<const int32_t> parent,
                         Tensor& out);
// The root paths of the tree's leaves, each a run of its own in the run's slot, the paths' rows
// one after another: a read-only chain op starts each run from the slot's state and writes an
// output for every row, so one call computes every token of the tree (each lies on some leaf's
// path) in Σ over leaves of (depth + 1) rows; `last[i]` is the row of token i's output (on the
// first leaf path through it). A chain is one path; a star of n tokens is n − 1 paths of 2.
// (A device backend's one-pass kernels read the rows through `rows` instead of gathering them.)
struct Paths {
  std::vector<int32_t> rows;  // source rows (run.begin + path index), path after path
  std::vector<SeqRun> runs;   // one per leaf, over those rows
  std::vector<int32_t> last;  // token i's row among them
};
Paths leaf_paths(const SeqRun& run, std::span<const int32_t> parent);
// A tree verify run's parents: one per token, the root first and alone, parents before children
// (refused with a message otherwise; every tree op checks them so).
void check_tree(const SeqRun& run, std::span<const int32_t> parent);
// Backend::compact_rows's conditions (every backend checks them the same way).
void check_compaction(std::span<const Tensor> ts, std::span<const int32_t> from);

}  // namespace qwen36::tree_ops
