#pragma once
// defines: PassTiming, time_passes (the CPU dot product benchmarks' timing loop), gaussian (their
//          and the kernel tests' data)

#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

namespace qwen36::test {

// n values of N(0, scale²), reproducible from seed.
inline std::vector<float> gaussian(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

struct PassTiming {
  double per_second = 0;  // passes per second
  bool same = true;       // every pass returned the first pass's sum (bitwise)
  float first = 0;
};

// Repeats pass() (a sum over rows that stay in cache) for at least 50 ms.
template <typename Pass>
PassTiming time_passes(Pass pass) {
  PassTiming r;
  int reps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double secs = 0;
  while (secs < 0.05) {
    const float s = pass();
    if (reps == 0) r.first = s;
    r.same = r.same && s == r.first;
    ++reps;
    secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  r.per_second = reps / secs;
  return r;
}

}  // namespace qwen36::test
