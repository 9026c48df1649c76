// The form of a tree verify run (cpu_ops.h: tree_depths). The tree ops themselves are the
// Backend defaults (backend/tree_ops.h), which the CPU backend uses as they are.
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"

namespace qwen36::cpu {

std::vector<int32_t> tree_depths(std::span<const int32_t> parent) {
  std::vector<int32_t> depth(parent.size(), 0);
  for (size_t i = 0; i < parent.size(); ++i) {
    const int32_t p = parent[i];
    if (i == 0) {
      QWEN36_CHECK(p == -1, "tree verify: token 0 is the root (parent −1), not a child of {}", p);
      continue;
    }
    QWEN36_CHECK(p >= 0 && size_t(p) < i, "tree verify: token {}'s parent {} is not an earlier token", i, p);
    depth[i] = depth[size_t(p)] + 1;
  }
  return depth;
}

}  // namespace qwen36::cpu
