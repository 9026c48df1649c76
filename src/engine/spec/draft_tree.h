#pragma once
// defines: DraftTree, build_draft_tree, follow_draft_tree (DDTree drafting: a tree of drafts
//          from a block drafter's per-position distributions, and the greedy walk of a
//          verified tree)
//
// A block drafter (DFlash) predicts every position of the next block at once, each from the
// same context, so position d's distribution does not depend on which tokens were drafted at
// positions before it. DDTree (Ringel & Romano, arXiv 2604.12989) spends a verification budget
// on a tree instead of one chain: a node at depth d is one of position d's top-K tokens, its
// path probability is the product of its path's per-position probabilities, and the tree holds
// the `budget` most probable nodes (a node's ancestors are always more probable, so the set is
// a tree). The target verifies every node in one pass, each attending only to its ancestors;
// the greedy walk then follows the target's own choice from the root as long as a child
// drafted it.

#include <cstdint>
#include <span>
#include <vector>

#include "engine/spec/drafter.h"

namespace qwen36 {

// Candidates kept per block position for a tree (DFlashDrafter's top-K), and the most drafts a
// tree may hold (a commit names the accepted path as a 64-bit set of the run's tokens).
constexpr int32_t kTreeTopK = 8;
constexpr int32_t kMaxTreeBudget = 63;

// Node 0 is the root: the pending token (already chosen, not yet in the target). Nodes
// 1 .. size() − 1 are drafts in decreasing path probability (ties: the earlier candidate), so
// every node comes after its parent and any prefix of the nodes is itself a tree.
struct DraftTree {
  std::vector<int32_t> token;   // the node's token (root: the pending token)
  std::vector<int32_t> parent;  // the parent node (root: −1)
  std::vector<int32_t> depth;   // root 0; a node at depth d drafts block position d
  std::vector<float> logp;      // log of the path probability (root 0)

  int32_t size() const { return int32_t(token.size()); }
  int32_t max_depth() const;  // the deepest node's depth (the round's drafted positions)
  // Node a is node n or one of its ancestors: n's row of the verification mask.
  bool on_path(int32_t a, int32_t n) const;
  // The tokens of n's path below the root (the drafts a verify row of node n follows).
  std::vector<int32_t> path_tokens(int32_t n) const;
};

// The tree of the `budget` most probable drafts below `root_token`. positions[d] is the
// distribution of block position d + 1 (as DFlashDrafter::last_topk keeps them), sorted by
// decreasing probability; zero-probability entries are never drafted. Best-first over a heap
// of candidates: after taking a node, its first child and its next sibling become candidates,
// which enumerates the nodes of the full K-ary tree in decreasing path probability.
DraftTree build_draft_tree(int32_t root_token, std::span<const Dist> positions, int32_t budget);

// Benchmarks with simulated acceptance (SpecOptions::simulated_confidence): the drafter's
// positions with their tokens kept and their probabilities replaced by those of a drafter
// calibrated to the simulated rates — position d's first entry conf[d] (the last value beyond
// the list), the others an equal share of the rest, never above it. A random drafter's flat
// distributions would spread the budget over siblings the simulated walk never takes (it goes
// down the most probable child while the simulated acceptance says so), so a tree round would
// be timed on a shape no trained drafter gives.
std::vector<Dist> calibrated_positions(std::span<const Dist> positions, std::span<const double> conf);

// The walk of a verified tree: target_next[n] is the target's token after node n's path (root
// included; its argmax, or its draw when sampling). From the root, the child whose token is the
// target's is accepted, as long as there is one; `bonus` is the target's token after the last
// accepted node.
struct TreeWalk {
  std::vector<int32_t> accepted;  // accepted nodes, root excluded, in path order
  int32_t bonus = -1;
  // The root and the accepted nodes, in path order; the tokens the round emits (the accepted
  // nodes', then the bonus) — token i follows node path()[i]'s path.
  std::vector<int32_t> path() const;
  std::vector<int32_t> tokens(const DraftTree& tree) const;
};
TreeWalk follow_draft_tree(const DraftTree& tree, std::span<const int32_t> target_next);

}  // namespace qwen36
