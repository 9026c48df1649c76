// The MoE router's top-k for one token, by one warp: the device function of route_kernel
// (cuda_moe.cu) and of the one-token norm GEMVs that route the logits they computed
// (route_when_last). CPU twin: backend/cpu/cpu_moe.cpp (moe_route).
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
// writes it. The logits are read with plain (coherent) loads: their writer may be a block of the
// same launch. (A shared-memory form with shuffled (value, index) pairs and lane 0 re-reading its
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

// A router's top-k computed by the launch that computes its logits (the one-token norm GEMVs:
// norm_gemv_block, cuda_quant_mma_kernels.cuh; gemv_multi_norm_kernel, cuda_matmul_norm.cu).
// ids null: no routing. *arrivals is zero before the launch, and left zero.
struct RouteArgs {
  float* weights;  // [k]
  int32_t* ids;    // [k]
  int* arrivals;
  int E, k;
  bool renorm;
};
// The most experts a launch routes (route_token<8>); more go to moe_route's launch.
constexpr int kRouteInLaunchMaxExperts = 256;

// The last of nblocks blocks to arrive routes the E logits at l, once every block has written its
// share: the arrival is an acquire-release atomic between two barriers (each block publishes its
// warps' stores; the last one's threads see every earlier block's). Every thread of every block
// calls it. The route's own launch and its dependency on the GEMV's end go from the chain (a
// 35B-A3B decode step: one of a layer's seven launches).
__device__ __forceinline__ void route_when_last(const RouteArgs r, const float* l, int nblocks) {
  __syncthreads();
  const bool last = threadIdx.x == 0 && atomic_add_acq_rel(r.arrivals, 1) == nblocks - 1;
  if (!__syncthreads_or(last)) return;
  if (threadIdx.x < 32)
    route_token<kRouteInLaunchMaxExperts / 32>(l, r.E, r.k, r.renorm, r.weights, r.ids, int(threadIdx.x));
  if (threadIdx.x == 0) *r.arrivals = 0;  // for the next launch: every block has arrived
}

}  // namespace qwen36::cuda
