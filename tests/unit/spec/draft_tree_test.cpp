// DDTree drafting (engine/spec/draft_tree.h): the tree holds exactly the most probable drafts
// (against brute-force enumeration), is well formed, and the greedy walk accepts the target's
// path through it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "core/error.h"
#include "engine/spec/draft_tree.h"

namespace qwen36 {
namespace {

// L positions of K entries each, sorted, with distinct probabilities (no ties to break).
std::vector<Dist> random_positions(std::mt19937& rng, int L, int K) {
  std::uniform_real_distribution<float> u(0.05f, 1.0f);
  std::vector<Dist> pos(static_cast<size_t>(L));
  for (int d = 0; d < L; ++d) {
    std::vector<float> w(static_cast<size_t>(K));
    float s = 0;
    for (float& x : w) s += x = u(rng);
    std::sort(w.begin(), w.end(), std::greater<>());
    for (int k = 0; k < K; ++k) pos[size_t(d)].emplace_back(100 * (d + 1) + k, w[size_t(k)] / (s * 1.25f));
  }
  return pos;
}

// A node's path as its tokens from depth 1.
std::vector<int32_t> path_of(const DraftTree& t, int32_t n) {
  std::vector<int32_t> p;
  for (; n > 0; n = t.parent[size_t(n)]) p.push_back(t.token[size_t(n)]);
  std::reverse(p.begin(), p.end());
  return p;
}

TEST(DraftTree, HoldsExactlyTheMostProbableDrafts) {
  std::mt19937 rng(7);
  const int L = 4, K = 3;
  for (int trial = 0; trial < 5; ++trial) {
    const std::vector<Dist> pos = random_positions(rng, L, K);
    // Every node of the full tree with its path log-probability (summed as the builder does).
    std::vector<std::pair<float, std::vector<int32_t>>> all;
    std::vector<std::pair<float, std::vector<int32_t>>> frontier{{0.0f, {}}};
    for (int d = 0; d < L; ++d) {
      std::vector<std::pair<float, std::vector<int32_t>>> next;
      for (const auto& [lp, path] : frontier)
        for (const auto& [tok, p] : pos[size_t(d)]) {
          std::vector<int32_t> q = path;
          q.push_back(tok);
          next.emplace_back(lp + std::log(p), q);
        }
      all.insert(all.end(), next.begin(), next.end());
      frontier = next;
    }
    std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    for (int budget : {0, 1, 2, 5, 9, 22, 60, 120, 200}) {
      const DraftTree t = build_draft_tree(42, pos, budget);
      const int expect = std::min<int>(budget, int(all.size()));
      ASSERT_EQ(t.size(), expect + 1) << "budget " << budget;
      EXPECT_EQ(t.token[0], 42);
      EXPECT_EQ(t.parent[0], -1);
      for (int32_t n = 1; n < t.size(); ++n) {
        EXPECT_EQ(path_of(t, n), all[size_t(n - 1)].second) << "budget " << budget << " node " << n;
        EXPECT_NEAR(t.logp[size_t(n)], all[size_t(n - 1)].first, 1e-5f);
        EXPECT_LT(t.parent[size_t(n)], n) << "a node comes after its parent";
        EXPECT_EQ(t.depth[size_t(n)], t.depth[size_t(t.parent[size_t(n)])] + 1);
        EXPECT_LE(t.logp[size_t(n)], t.logp[size_t(t.parent[size_t(n)])]);
      }
    }
  }
}

TEST(DraftTree, ConfidentDrafterGivesTheChain) {
  std::vector<Dist> pos;
  for (int d = 0; d < 6; ++d) pos.push_back({{10 + d, 0.97f}, {50 + d, 0.02f}, {90 + d, 0.01f}});
  const DraftTree t = build_draft_tree(1, pos, 6);
  ASSERT_EQ(t.size(), 7);
  for (int32_t n = 1; n < 7; ++n) {
    EXPECT_EQ(t.token[size_t(n)], 10 + n - 1);
    EXPECT_EQ(t.parent[size_t(n)], n - 1);
  }
  // A bigger budget than the positions allow stops at the full tree; zero probabilities are
  // never drafted.
  const std::vector<Dist> two = {{{5, 0.6f}, {6, 0.4f}, {7, 0.0f}}, {{8, 1.0f}}};
  EXPECT_EQ(build_draft_tree(1, two, 100).size(), 1 + 2 + 2);
}

// The simulated drafter confidence of tree benchmarks: tokens kept, position d's first entry the
// simulated rate, the others an equal share of the rest never above it (sorted, as
// build_draft_tree requires); at issue 9's simulated rate the budget goes down the chain.
TEST(DraftTree, CalibratedPositionsGiveTheSimulatedChain) {
  std::vector<Dist> flat;
  for (int d = 0; d < 15; ++d) {
    Dist pos;
    for (int k = 0; k < kTreeTopK; ++k) pos.push_back({100 * d + k, 0.126f - 0.001f * float(k)});
    flat.push_back(pos);
  }
  const std::vector<double> conf = {0.9164};
  const std::vector<Dist> cal = calibrated_positions(flat, conf);
  ASSERT_EQ(cal.size(), flat.size());
  for (size_t d = 0; d < cal.size(); ++d)
    for (size_t k = 0; k < cal[d].size(); ++k) {
      EXPECT_EQ(cal[d][k].first, flat[d][k].first);
      EXPECT_FLOAT_EQ(cal[d][k].second, k == 0 ? 0.9164f : float(0.0836 / (kTreeTopK - 1)));
    }
  EXPECT_EQ(build_draft_tree(1, flat, 22).max_depth(), 2);  // the flat drafter: a bush
  const DraftTree t = build_draft_tree(1, cal, 22);
  EXPECT_EQ(t.max_depth(), 15);  // the calibrated one: the whole chain, then the best siblings
  for (int32_t n = 1; n <= 15; ++n) EXPECT_EQ(t.parent[size_t(n)], n - 1);
  // A low rate keeps the first entry on top; rates past the list repeat the last.
  const std::vector<double> low = {0.9, 0.2};
  const std::vector<Dist> c2 = calibrated_positions(flat, low);
  EXPECT_FLOAT_EQ(c2[0][0].second, 0.9f);
  for (size_t d = 1; d < c2.size(); ++d) EXPECT_GE(c2[d][0].second, c2[d][1].second);
  EXPECT_FLOAT_EQ(c2[14][0].second, 0.2f);
  EXPECT_THROW(calibrated_positions(flat, std::vector<double>{}), Error);
}

TEST(DraftTree, AncestorMask) {
  // root → a (0.6) → c (0.9); root → b (0.4) → d (0.9)
  const std::vector<Dist> pos = {{{11, 0.6f}, {12, 0.4f}}, {{21, 0.9f}, {22, 0.1f}}};
  const DraftTree t = build_draft_tree(3, pos, 4);  // 11 (0.6), 11·21 (0.54), 12 (0.4), 12·21 (0.36)
  ASSERT_EQ(t.size(), 5);
  EXPECT_EQ(t.token, (std::vector<int32_t>{3, 11, 21, 12, 21}));
  EXPECT_EQ(t.parent, (std::vector<int32_t>{-1, 0, 1, 0, 3}));
  EXPECT_TRUE(t.on_path(0, 4) && t.on_path(3, 4) && t.on_path(4, 4));
  EXPECT_FALSE(t.on_path(1, 4) || t.on_path(2, 4) || t.on_path(2, 1));
}

TEST(DraftTree, GreedyWalkFollowsTheTarget) {
  const std::vector<Dist> pos = {{{11, 0.6f}, {12, 0.4f}}, {{21, 0.9f}, {22, 0.1f}}, {{31, 1.0f}}};
  const DraftTree t = build_draft_tree(3, pos, 20);
  // The target takes 12, then 21, then 31 (all drafted), then 40: the path 12 → 21 → 31.
  std::vector<int32_t> next(size_t(t.size()), -7);
  auto node = [&](std::vector<int32_t> path) {
    for (int32_t n = 1; n < t.size(); ++n)
      if (path_of(t, n) == path) return n;
    return -1;
  };
  next[0] = 12;
  next[size_t(node({12}))] = 21;
  next[size_t(node({12, 21}))] = 31;
  next[size_t(node({12, 21, 31}))] = 40;
  TreeWalk w = follow_draft_tree(t, next);
  EXPECT_EQ(w.accepted, (std::vector<int32_t>{node({12}), node({12, 21}), node({12, 21, 31})}));
  EXPECT_EQ(w.bonus, 40);
  // A target token no child drafted: nothing accepted, the bonus is the target's.
  next[0] = 99;
  w = follow_draft_tree(t, next);
  EXPECT_TRUE(w.accepted.empty());
  EXPECT_EQ(w.bonus, 99);
  EXPECT_THROW(follow_draft_tree(t, std::span<const int32_t>(next).first(2)), Error);
}

TEST(DraftTree, RejectsBadDistributions) {
  const std::vector<Dist> unsorted = {{{1, 0.2f}, {2, 0.7f}}};
  EXPECT_THROW(build_draft_tree(0, unsorted, 4), Error);
  const std::vector<Dist> negative = {{{1, -0.1f}}};
  EXPECT_THROW(build_draft_tree(0, negative, 4), Error);
  EXPECT_THROW(build_draft_tree(0, {}, -1), Error);
}

}  // namespace
}  // namespace qwen36
