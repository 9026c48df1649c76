#pragma once
// defines (file-local to cuda_deltanet_fused.cu, which launches them): a tree verify pass's
// fused DeltaNet kernels (Backend::deltanet_verify_tree), the chain verify's prep and state
// kernels over a tree: the prep per token, its conv window taken from its root path; the state
// kernel per leaf path. A token's arithmetic is the chain verify's over its root path, so each
// path's outputs are bitwise those of a chain verify pass of that path. Included by .cu only.

#include "backend/cuda/cuda_conv_window.cuh"
#include "backend/cuda/cuda_deltanet_fused.cuh"

namespace qwen36::cuda {
namespace {

// grid (count, Hk + ⌈Hv·dv/256⌉): block (j, y) is token j of the tree (runs[0]), row begin + j,
// and the chain prep kernel's channels of block y (key head y's q and k, or 256 v channels).
// A channel's window is the one j's root path leaves: the slot's conv state, then j's nearest
// K − 1 ancestors' raw inputs stepped root first (the window holds copies of inputs, so this is
// bitwise the chain's window after stepping the whole path). Outputs go to qkv, since mixed's
// raw rows are read by the descendants' blocks; j's raw inputs are saved for the commit (row j of
// the slot). Block (0, 0) zeroes the state kernel's counters of the count paths.
__global__ void __launch_bounds__(kDecPrepThreads) tree_prep_kernel(FusedArgs p) {
  griddep_trigger();  // the state kernel may start loading its state slices
  const int j = int(blockIdx.x), y = int(blockIdx.y), tid = int(threadIdx.x);
  const SeqRun r = p.runs[0];
  const int C = p.C, K = p.K, Hk = p.Hk, dk = p.dk;
  if (j == 0 && y == 0)
    for (int e = tid; e < r.count * p.Hv; e += kDecPrepThreads) p.counters[e] = 0;
  int anc[kMaxConvK];  // j's ancestors, nearest first (constant indices below: registers)
  int na = 0;
#pragma unroll
  for (int m = 0; m < kMaxConvK; ++m) {
    anc[m] = m >= K - 1 ? -1 : m == 0 ? p.parent[j] : anc[m - 1] >= 0 ? p.parent[anc[m - 1]] : -1;
    if (anc[m] >= 0) na = m + 1;
  }
  const int64_t row = int64_t(r.begin) + j;
  auto convolve = [&](int ch) {
    ConvWindow cw(p.conv_state + (int64_t(r.slot) * C + ch) * (K - 1), p.conv_w + int64_t(ch) * K, K);
#pragma unroll
    for (int m = kMaxConvK - 1; m >= 0; --m)
      if (m < na) cw.step(p.mixed[(int64_t(r.begin) + anc[m]) * C + ch]);
    const float xin = p.mixed[row * C + ch];
    p.conv_in[(int64_t(r.slot) * p.n_save + j) * C + ch] = xin;
    return cw.step(xin);
  };
  if (y >= Hk) {
    const int ch = 2 * Hk * dk + (y - Hk) * kDecPrepThreads + tid;
    if (ch < C) p.qkv[row * C + ch] = convolve(ch);
    return;
  }
  __shared__ float part[2][kDecPrepThreads / 32];  // [q, k][warp]
  const bool is_q = tid < dk, active = tid < 2 * dk;
  const int ch = is_q ? y * dk + tid : Hk * dk + y * dk + (tid - dk);
  const float val = active ? convolve(ch) : 0.0f;
  const float2 t = qk_block_totals(val, active, is_q, part);
  if (active) p.qkv[row * C + ch] = is_q ? q_hat(val, t.x, p.scale) : k_hat(val, t.y);
}

// grid (count, Hv, dv/32), 128 threads: the chain state kernel (fused_state_kernel, Verify) on
// leaf path i (paths[i]; an empty one, the table's padding, returns), its tokens' rows through
// the rows table, its state slice only read. A token on several paths is computed alike on each;
// only the path where it first occurs (first) stores its output, its Σo² and its saved g, β, and
// that path's last block of the head applies the gated RMSNorm to them.
template <int DK>
__global__ void __launch_bounds__(kDecThreads) tree_state_kernel(FusedArgs p) {
  static_assert(kDecThreads == 128 && DK % 16 == 0 && DK <= kDecThreads, "16 row groups of 8 threads");
  constexpr int R = DK / 16;
  const int i = int(blockIdx.x), h = int(blockIdx.y), slice = int(blockIdx.z), ns = int(gridDim.z);
  const SeqRun path = p.paths[i];
  if (path.count == 0) return;
  const SeqRun r = p.runs[0];
  const int tid = int(threadIdx.x), col = slice * kDecCols + 4 * (tid & 7), n = path.count;
  __shared__ float2 gts[kFusedMaxTokens];  // (g, β) of each token
  __shared__ int rws[kFusedMaxTokens];     // its row
  __shared__ bool own[kFusedMaxTokens];    // whether this path stores it
  __shared__ float qs[2][DK], ks[2][DK], red[2][kDecThreads / 32][kDecCols];
  float4 s[R];
  load_slice<DK>(p, r.slot, h, col, s);
  for (int t = tid; t < n; t += kDecThreads) {  // a and b come from before the prep kernel
    const int row = p.rows[path.begin + t], j = row - r.begin;
    const bool mine = p.first[j] == path.begin + t;
    rws[t] = row, own[t] = mine, gts[t] = gates_of(p, row, h);
    const int64_t si = (int64_t(r.slot) * p.n_save + j) * p.Hv + h;
    if (mine && slice == 0) p.g_in[si] = gts[t].x, p.beta_in[si] = gts[t].y;
  }
  __syncthreads();
  griddep_trigger();
  griddep_wait();

  step_slice<DK, true>(
      p, p.qkv, s, n, h, slice, gts, [&](int t) { return rws[t]; }, [&](int t) { return own[t]; }, qs, ks, red);
  if (!last_of_head(p.counters + int64_t(i) * p.Hv + h, ns)) return;
  for (int t = 0; t < n; ++t)
    if (own[t]) gated_norm_head(p, rws[t], h, ns);
}

}  // namespace
}  // namespace qwen36::cuda
