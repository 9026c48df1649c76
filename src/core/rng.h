#pragma once
// defines: SplitMix64 (a tiny, fast, well-mixed random generator for synthetic weights)
//
// One generator per independent stream (a tensor, a block of a tensor, a row) keeps
// generation parallel and reproducible: the same seed gives the same values whatever the
// thread count or the order in which streams are generated.

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace qwen36 {

struct SplitMix64 {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return float(next() >> 40) * (1.0f / 16777216.0f); }  // [0, 1)
  // Sum of 4 uniforms, rescaled to unit variance: close enough to normal for weights, and cheap.
  float normal() { return (uniform() + uniform() + uniform() + uniform() - 2.0f) * 1.7320508f; }
  void bytes(uint8_t* p, size_t n) {
    for (size_t i = 0; i < n; i += 8) {
      const uint64_t v = next();
      std::memcpy(p + i, &v, std::min<size_t>(8, n - i));
    }
  }
};

}  // namespace qwen36
