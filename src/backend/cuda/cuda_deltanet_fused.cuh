#pragma once
// defines (file-local to each .cu that includes it: cuda_deltanet_fused.cu's decode, verify and
// commit kernels, cuda_deltanet_tree_fused.cu's tree verify kernels): the fused DeltaNet
// kernels' arguments and the arithmetic they share (the L2 norms of q and k, the gates, the
// gated RMSNorm of a head), so that every fused form computes a token alike. Included by .cu only.

#include <cstdint>

#include "backend/cuda/cuda_deltanet_slices.cuh"
#include "backend/cuda/cuda_ops.cuh"
#include "backend/cuda/cuda_state_ref.cuh"

namespace qwen36::cuda {
namespace {

constexpr int kDecPrepThreads = 256;  // prep kernel: a key head's q and k channels (2·dk ≤ 256), or 256 v channels
constexpr int kDecMaxSlices = 4;      // fused_decode_kernel: a head's 32-column slices (dv ≤ 128)
constexpr int kVerifyMaxRuns = 64;    // a verify pass's runs: bits of FusedArgs::readonly
constexpr int kPrepChunk = 8;         // prep kernel: tokens whose inputs a thread requests at once
constexpr int kFusedMaxTokens = 64;   // a run's tokens in a verify pass or a commit (the state kernel's gates)

// Both kernels take a block's run from blockIdx.x and step through its tokens. Decode: one
// token per run, advancing its state. Verify: runs of k + 1 tokens that only read their state
// (bit i of `readonly`), their raw inputs, g and β saved for the commit, beside plain one-token
// runs. Commit: runs of the kept tokens, from those saved inputs, advancing the state; no
// outputs (mixed is the kernels' scratch).
enum class Fused { Decode, Verify, Commit };

struct FusedArgs {
  float* mixed;                                // [T, C]: raw inputs; after prep, [q̂ | k̂ | v] per row
  const float *z, *a, *b;                      // [T, Hv, dv], [T, gs], [T, gs] (not Commit)
  const float *conv_w, *a_neg_exp, *dt_bias, *norm;  // the layer's small weights
  float* conv_state;                           // [slots, C, K − 1]
  StateRef state;                              // [slots, Hv, dk, dv]
  float* out;                                  // [T, Hv, dv] (not Commit), heads in out_proj's order:
  const int32_t* out_pos;                      // head h at block out_pos[h] of its row (null: h)
  const SeqRun* runs;
  int* counters;    // [T, Hv]: at (a run's first row, head), the head's slices finished (not Commit)
  float* partials;  // [T, Hv, dv/32]: Σ o² of each slice
  // Verify: the read-only runs' inputs, saved; Commit: read. Rows [0, count) of the run's slot.
  float *conv_in, *g_in, *beta_in;  // [slots, n_save, C], [slots, n_save, Hv] ×2
  uint64_t readonly;
  int n_save;
  bool late_trigger;  // fused_decode_kernel: release dependents after the update, not at the start
  int C, K, Hk, dk, Hv, dv;
  int gs;  // a's and b's row length (Hv, or a shard's padded gate rows)
  float scale, eps;
  // A tree verify pass (deltanet_verify_tree: runs[0] the tree, the pass's only run). The state
  // kernel's runs are the tree's leaf paths: path i's token t is batch row rows[paths[i].begin + t].
  const int32_t* parent;  // [count]: a token's parent in the run (−1: the root)
  const SeqRun* paths;    // [count]: the leaf paths, padded with empty runs
  const int32_t* rows;
  const int32_t* first;   // [count]: where token j first occurs in rows (that path stores its outputs)
  float* qkv;             // [T, C]: the tree prep's [q̂ | k̂ | v] rows (mixed keeps the raw inputs paths share)
};

// A key head's q / k channel's share of the sums of squares of its q and k: the warp's sums
// (active: the thread holds a channel; is_q: of q). As l2norm_qk_kernel, q̂ = q / ‖q‖ · scale,
// k̂ = k / ‖k‖ from the head's totals tq, tk. Both fused decode forms' arithmetic, in one order.
__device__ __forceinline__ float2 qk_warp_ss(float val, bool active, bool is_q) {
  return make_float2(warp_sum(active && is_q ? val * val : 0.0f), warp_sum(active && !is_q ? val * val : 0.0f));
}
__device__ __forceinline__ float q_hat(float val, float tq, float scale) { return (val * (1.0f / sqrtf(tq + 1e-6f))) * scale; }
__device__ __forceinline__ float k_hat(float val, float tk) { return val * (1.0f / sqrtf(tk + 1e-6f)); }
// A prep block's totals (tq, tk) of one token: the warps' sums (qk_warp_ss) through part, then
// added in warp order. part is not read again before the next barrier.
__device__ __forceinline__ float2 qk_block_totals(float val, bool active, bool is_q,
                                                  float (*part)[kDecPrepThreads / 32]) {
  const float2 ss = qk_warp_ss(val, active, is_q);
  const int tid = int(threadIdx.x);
  if ((tid & 31) == 0) {
    part[0][tid >> 5] = ss.x;
    part[1][tid >> 5] = ss.y;
  }
  __syncthreads();
  float tq = 0, tk = 0;
#pragma unroll
  for (int w = 0; w < kDecPrepThreads / 32; ++w) {
    tq += part[0][w];
    tk += part[1][w];
  }
  return make_float2(tq, tk);
}

// The gates of (token row, head h), as deltanet_gates: g = a_neg_exp · softplus(a + dt_bias), β = σ(b).
__device__ __forceinline__ float2 gates_of(const FusedArgs& p, int64_t row, int h) {
  const int64_t i = row * p.gs + h;
  const float ga = p.a[i] + p.dt_bias[h];
  return make_float2(p.a_neg_exp[h] * (ga > 20.0f ? ga : log1pf(expf(ga))), sigmoid_f(p.b[i]));
}

// Σo² of a slice's 32 columns, in the first 8 lanes of its first warp (each holds 4 columns' o).
__device__ __forceinline__ float slice_ss(const float (&o)[4]) {
  float ss = o[0] * o[0] + o[1] * o[1] + o[2] * o[2] + o[3] * o[3];
  ss += __shfl_xor_sync(0xffffffffu, ss, 1);  // over the 8 column groups
  ss += __shfl_xor_sync(0xffffffffu, ss, 2);
  ss += __shfl_xor_sync(0xffffffffu, ss, 4);
  return ss;
}


// Where head h of row `row` goes in out (Backend::deltanet_decode: in out_proj's order), in floats.
__device__ __forceinline__ int64_t out_at(const FusedArgs& p, int64_t row, int h) {
  return (row * p.Hv + (p.out_pos ? p.out_pos[h] : h)) * p.dv;
}

// A state kernel's block's slice of head h's state in slot `slot`: its thread's 4 columns
// (col) of rows rg + 16k.
template <int DK>
__device__ __forceinline__ void load_slice(const FusedArgs& p, int slot, int h, int col, float4 (&s)[DK / 16]) {
  const int64_t S = (int64_t(slot) * p.Hv + h) * DK * p.dv + col;  // in elements
  const int rg = int(threadIdx.x) >> 3;
#pragma unroll
  for (int k = 0; k < DK / 16; ++k) s[k] = p.state.load4(S + int64_t(rg + 16 * k) * p.dv);
}

// After a state kernel's block has stored its slice's outputs: whether it is the last of its
// head's ns blocks to finish (an acquire-release count on *counter, which the prep kernel
// zeroed), the one that applies the head's gated RMSNorm.
__device__ __forceinline__ bool last_of_head(int* counter, int ns) {
  __shared__ int last;
  __syncthreads();  // the block's stores come before thread 0's release
  if (threadIdx.x == 0) last = atomic_add_acq_rel(counter, 1) == ns - 1;
  __syncthreads();  // and thread 0's acquire before the block's reads of the other slices
  return last;
}

// A state kernel's block stepping its slice s through n tokens (row(t): token t's row, whose
// [q̂ | k̂ | v] src holds; gts[t]: its (g, β)): the next token's q̂, k̂, v requested while one
// computes, q̂ and k̂ through the double buffers qs, ks. kOut: where stores(t), the token's raw
// o and Σo² go to out (at out_at) and partials, for the head's gated RMSNorm once it is whole.
// Both state kernels' token loop (fused_state_kernel, tree_state_kernel), in one order.
template <int DK, bool kOut, typename Row, typename Stores>
__device__ __forceinline__ void step_slice(const FusedArgs& p, const float* __restrict__ src, float4 (&s)[DK / 16],
                                           int n, int h, int slice, const float2* gts, Row row, Stores stores,
                                           float (&qs)[2][DK], float (&ks)[2][DK],
                                           float (*red)[kDecThreads / 32][kDecCols]) {
  const int tid = int(threadIdx.x), rg = tid >> 3, ns = int(gridDim.z), col = slice * kDecCols + 4 * (tid & 7);
  const int kh = h / (p.Hv / p.Hk);
  const int64_t q_off = int64_t(kh) * DK, k_off = int64_t(p.Hk + kh) * DK, v_off = 2 * int64_t(p.Hk) * DK + h * p.dv + col;
  auto fetch = [&](int t, float& q, float& k, float4& v) {  // token t's q̂, k̂ element (tid < DK) and v columns
    const float* xr = src + int64_t(row(t)) * p.C;
    if (tid < DK) q = xr[q_off + tid], k = xr[k_off + tid];
    v = *reinterpret_cast<const float4*>(xr + v_off);
  };
  float nq = 0.0f, nk = 0.0f;
  float4 v4;
  fetch(0, nq, nk, v4);
  if (tid < DK) qs[0][tid] = nq, ks[0][tid] = nk;
  for (int t = 0; t < n; ++t) {
    const float* q_s = qs[t & 1];
    const float* k_s = ks[t & 1];
    __syncthreads();  // token t's q̂, k̂ (and gts) are in; the previous token's reads of the other buffer are done
    const float4 vj = v4;
    if (t + 1 < n) fetch(t + 1, nq, nk, v4);  // in flight while token t computes
    float o[4];
    slice_token<DK / 16, kOut>(
        s, rg, [&](int e) { return k_s[e]; }, [&](int e) { return q_s[e]; }, vj, expf(gts[t].x), gts[t].y, red,
        p.state, p.state.bf16 && n > 1, o);
    if constexpr (kOut) {
      if (tid < 32 && stores(t)) {  // (stores: block-uniform)
        const int64_t rw = row(t);
        const float ss = slice_ss(o);
        if (tid < 8) *reinterpret_cast<float4*>(p.out + out_at(p, rw, h) + col) = make_float4(o[0], o[1], o[2], o[3]);
        if (tid == 0) p.partials[(rw * p.Hv + h) * ns + slice] = ss;
      }
    }
    if (t + 1 < n && tid < DK) qs[(t + 1) & 1][tid] = nq, ks[(t + 1) & 1][tid] = nk;
  }
}

// The gated RMSNorm of (row, head h) over its dv columns, once the head's ns slices have stored
// their raw o (at out_at) and Σo² (the state kernels' last block of the head), in place.
__device__ __forceinline__ void gated_norm_head(const FusedArgs& p, int64_t row, int h, int ns) {
  const int64_t hs = row * p.Hv + h;
  float ss = 0;
  for (int e = 0; e < ns; ++e) ss += __ldcg(p.partials + hs * ns + e);
  const float inv = 1.0f / sqrtf(ss / float(p.dv) + p.eps);
  float* orow = p.out + out_at(p, row, h);
  const float* zr = p.z + hs * p.dv;
  for (int e = int(threadIdx.x); e < p.dv; e += int(blockDim.x)) orow[e] = p.norm[e] * (__ldcg(orow + e) * inv) * silu_f(zr[e]);
}

}  // namespace
}  // namespace qwen36::cuda
