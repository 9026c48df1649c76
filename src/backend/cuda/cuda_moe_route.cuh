// The MoE router's top-k for one token, by one warp: route_kernel's (cuda_moe.cu). CPU twin:
// backend/cpu/cpu_moe.cpp (moe_route).
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_ops.cuh"

namespace qwen36::cuda {

// Softmax over the E logits l (E ≤ 32 · NE), top-k, optionally renormalised: weights[0, k) and
// ids[0, k), written by lanes 0..k-1. Lane l holds experts l + 32 i (i < NE) in registers. Each of
// the k rounds takes the lane's first largest, then the warp's largest value and among the lanes
// holding it the lowest expert (two redux.sync, exact: the values compare as unsigned integers once
// non-negative, 1 + their bits, a taken expert 0); the round's expert is kept by lane j, which
// writes it. (A shared-memory form with shuffled (value, index) pairs and lane 0 re-reading its
// stores took 5.4 µs a 35B-A3B layer.)
template <int NE>
__device__ __forceinline__ void route_token(const float* l, int E, int k, bool renorm, float* weights, int32_t* ids,
                                            int lane) {
  float p[NE];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < NE; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < E ? l[e] : -INFINITY;
    mx = fmaxf(mx, p[i]);
  }
  mx = warp_max(mx);
  float sum = 0;
#pragma unroll
  for (int i = 0; i < NE; ++i)
    if (lane + 32 * i < E) {
      p[i] = expf(p[i] - mx);
      sum += p[i];
    }
  sum = warp_sum(sum);
  uint32_t key[NE];  // 1 + bits of p (non-negative: ordered as unsigned); 0: taken or no expert
#pragma unroll
  for (int i = 0; i < NE; ++i) {
    p[i] /= sum;
    key[i] = lane + 32 * i < E ? __float_as_uint(p[i]) + 1u : 0u;
  }
  float mine = 0.0f, top = 0.0f;
  int mine_id = 0;
  for (int j = 0; j < k; ++j) {
    uint32_t best = 0;
    int bi = 0;
#pragma unroll
    for (int i = 0; i < NE; ++i)
      if (key[i] > best) best = key[i], bi = i;  // ascending i: the lane's first (lowest) max
    const uint32_t wbest = __reduce_max_sync(0xffffffffu, best);
    const int e = __reduce_min_sync(0xffffffffu, best == wbest ? uint32_t(lane + 32 * bi) : 0xffffffffu);
    const float val = __uint_as_float(wbest - 1u);
    if (lane == j) mine = val, mine_id = e;
    top += val;  // every lane: the same sum in the same order
#pragma unroll
    for (int i = 0; i < NE; ++i)
      if (lane + 32 * i == e) key[i] = 0u;  // taken
  }
  if (lane < k) {
    ids[lane] = mine_id;
    weights[lane] = renorm ? mine / top : mine;
  }
}

}  // namespace qwen36::cuda
