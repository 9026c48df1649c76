#include "engine/spec/draft_tree.h"

#include <algorithm>
#include <cmath>
#include <queue>

#include "core/error.h"

namespace qwen36 {

int32_t DraftTree::max_depth() const { return depth.empty() ? 0 : *std::max_element(depth.begin(), depth.end()); }

std::vector<int32_t> TreeWalk::path() const {
  std::vector<int32_t> p{0};
  p.insert(p.end(), accepted.begin(), accepted.end());
  return p;
}

std::vector<int32_t> TreeWalk::tokens(const DraftTree& tree) const {
  std::vector<int32_t> t;
  for (int32_t n : accepted) t.push_back(tree.token[size_t(n)]);
  t.push_back(bonus);
  return t;
}

std::vector<int32_t> DraftTree::path_tokens(int32_t n) const {
  std::vector<int32_t> out;
  for (int32_t a = n; a > 0; a = parent[size_t(a)]) out.push_back(token[size_t(a)]);
  std::reverse(out.begin(), out.end());
  return out;
}

bool DraftTree::on_path(int32_t a, int32_t n) const {
  for (int32_t i = n; i >= 0; i = parent[size_t(i)])
    if (i == a) return true;
  return false;
}

namespace {

// A node not yet in the tree: entry `rank` of positions[pos] below node `parent`.
struct Candidate {
  float logp;
  int64_t order;  // insertion order: among equal probabilities the earlier candidate wins
  int32_t parent, pos, rank;
  bool operator<(const Candidate& o) const {  // std::priority_queue pops the largest
    return logp != o.logp ? logp < o.logp : order > o.order;
  }
};

}  // namespace

DraftTree build_draft_tree(int32_t root_token, std::span<const Dist> positions, int32_t budget) {
  QWEN36_CHECK(budget >= 0, "draft tree: budget {} is negative", budget);
  for (size_t d = 0; d < positions.size(); ++d)
    for (size_t k = 0; k < positions[d].size(); ++k) {
      const float p = positions[d][k].second;
      QWEN36_CHECK(p >= 0.0f && p <= 1.0f + 1e-5f, "draft tree: position {} entry {} has probability {}", d + 1, k, p);
      QWEN36_CHECK(k == 0 || p <= positions[d][k - 1].second,
                   "draft tree: position {}'s distribution is not sorted by decreasing probability", d + 1);
    }
  DraftTree t;
  t.token = {root_token};
  t.parent = {-1};
  t.depth = {0};
  t.logp = {0.0f};
  std::priority_queue<Candidate> heap;
  int64_t order = 0;
  auto offer = [&](int32_t parent, int32_t pos, int32_t rank) {
    if (size_t(pos) >= positions.size() || size_t(rank) >= positions[size_t(pos)].size()) return;
    const float p = positions[size_t(pos)][size_t(rank)].second;
    if (p <= 0.0f) return;  // sorted: the rest of the position is zero too
    heap.push({t.logp[size_t(parent)] + std::log(p), order++, parent, pos, rank});
  };
  offer(0, 0, 0);
  while (t.size() <= budget && !heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int32_t n = t.size();
    t.token.push_back(positions[size_t(c.pos)][size_t(c.rank)].first);
    t.parent.push_back(c.parent);
    t.depth.push_back(c.pos + 1);
    t.logp.push_back(c.logp);
    offer(c.parent, c.pos, c.rank + 1);  // the next sibling
    offer(n, c.pos + 1, 0);              // the first child
  }
  return t;
}

std::vector<Dist> calibrated_positions(std::span<const Dist> positions, std::span<const double> conf) {
  QWEN36_CHECK(!conf.empty(), "calibrated draft positions: no simulated rates");
  std::vector<Dist> out(positions.begin(), positions.end());
  for (size_t d = 0; d < out.size(); ++d) {
    Dist& pos = out[d];
    if (pos.empty()) continue;
    const double p = std::clamp(conf[std::min(d, conf.size() - 1)], 0.0, 1.0);
    const double rest = pos.size() > 1 ? std::min(p, (1.0 - p) / double(pos.size() - 1)) : 0.0;
    for (size_t k = 0; k < pos.size(); ++k) pos[k].second = float(k == 0 ? p : rest);
  }
  return out;
}

TreeWalk follow_draft_tree(const DraftTree& tree, std::span<const int32_t> target_next) {
  QWEN36_CHECK(int64_t(target_next.size()) == tree.size(), "draft tree walk: {} target tokens for {} nodes",
               target_next.size(), tree.size());
  TreeWalk w;
  int32_t cur = 0;
  for (;;) {
    const int32_t want = target_next[size_t(cur)];
    int32_t next = -1;
    for (int32_t n = cur + 1; n < tree.size() && next < 0; ++n)  // children come after their parent
      if (tree.parent[size_t(n)] == cur && tree.token[size_t(n)] == want) next = n;
    if (next < 0) break;
    w.accepted.push_back(next);
    cur = next;
  }
  w.bonus = target_next[size_t(cur)];
  return w;
}

}  // namespace qwen36
