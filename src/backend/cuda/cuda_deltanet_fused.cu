// The Gated DeltaNet's fused decode step, chain verify pass and commit (Backend::deltanet_decode,
// deltanet_verify, deltanet_commit) on the GPU; the plain ops they fuse are in cuda_deltanet.cu.
// CPU twins: Backend::deltanet_decode's composition; for deltanet_verify, the composition in
// Model::deltanet_block.
//
// Fused decode (one token per run): a decode step moves ~3 MB of recurrent state per layer
// (27B) and does little arithmetic, so what costs is launches, latency and too few blocks. On
// sm_90, within one wave of blocks, one kernel (fused_decode_kernel): a block per (token, value
// head) in clusters of the value heads that share a key head, conv + SiLU of its channels, q̂ /
// k̂ normalised, the state in registers (16-byte loads; a thread owns 4 columns × dk/16 rows of a
// 32-column slice, u = Sᵀk̂ and o = Sᵀq̂ reduced across the slice's threads), the update and the
// head's gated RMSNorm; before a dense out projection, where they fit one wave, a block per
// 32-column slice instead (fused_decode_slice_kernel, clusters of a key head's slices; the
// head's norm over DSMEM). Elsewhere (larger batches, older GPUs, QWEN36_DELTANET_DECODE=two), two
// kernels: (1) per token, conv + SiLU of every channel in place, q̂/k̂ L2-normalised by key head;
// (2) per (token, value head, slice): gates, the slice's update and the gated RMSNorm of the
// head, which spans the slices: the last of a head's blocks to finish (counter per head)
// normalises all dv columns. (2) is launched programmatically dependent: it loads its state
// slice while (1) finishes. All forms do the same float operations in the same order (the
// shared device functions below and slice_token, cuda_deltanet_slices.cuh), bit for bit.
//
// Fused chain verify (Backend::deltanet_verify): the two kernels (the one kernel stepping
// through k + 1 tokens measured slower: bench/RESULTS.md, session 33), each block stepping
// through its run's k + 1 tokens with the conv window and the state slice in registers, not
// written back for a verify run, whose raw inputs, g and β go to the commit's buffers as they
// are read — instead of ~10 launches a layer (saving copies, conv, q/k/v column copies, gates,
// L2 norm, delta rule, gated norm).
// Fused tree verify (Backend::deltanet_verify_tree, a DDTree pass's one tree run): the same
// two kernels over the tree (cuda_deltanet_tree_kernels.cuh): the prep per token, its window
// from its root path; the state kernel per leaf path, each token stored by the path where it
// first occurs — instead of ~10 launches and copies a layer of the tree ops' composition.
// (QWEN36_TREE_FUSED=off: the composition instead, for A / B.)
// Fused chain commit (Backend::deltanet_commit): the same kernels again, reading each run's
// saved raw inputs, g and β instead of the pass's, advancing the conv window and the state
// through the kept tokens and storing them once; no outputs. The arithmetic is a decode step's
// throughout, so a verify pass and its commit leave the state a decode step would, bit for bit.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string_view>
#include <type_traits>
#include <vector>

#include "backend/cuda/cuda_conv_window.cuh"
#include "backend/cuda/cuda_deltanet_fused.cuh"
#include "backend/cuda/cuda_deltanet_tree_kernels.cuh"
#include "backend/cuda/cuda_ops.cuh"
#include "backend/cuda/cuda_state_ref.cuh"
#include "backend/tree_ops.h"

namespace qwen36::cuda {
namespace {

// grid (runs, Hk + ⌈Hv·dv/256⌉). Block (i, y < Hk): key head y's q and k channels, one per
// thread, conv + SiLU, then L2-normalised (q̂ also scaled by 1/√dk) in place; block
// (i, y ≥ Hk): 256 v channels, conv + SiLU in place; token by token through run i. Block (i, 0)
// also zeroes the run's head counters for the state kernel. A plain launch: launched
// programmatically dependent (waiting, then letting the state kernel start) it cost the 27B
// Q4_K_M 2% at batch 16 (tg64 1,252 → 1,226 tok/s on the H200; no gain at batch 1).
template <Fused M>
__global__ void __launch_bounds__(kDecPrepThreads) fused_prep_kernel(FusedArgs p) {
  griddep_trigger();  // the state kernel may start loading its state slices
  const int i = int(blockIdx.x), y = int(blockIdx.y), tid = int(threadIdx.x);
  const SeqRun r = p.runs[i];
  const bool ro = M == Fused::Verify && (p.readonly >> i & 1);
  const int n = M == Fused::Decode ? 1 : r.count;
  const int C = p.C, K = p.K, Hk = p.Hk, dk = p.dk;
  float* x = p.mixed + int64_t(r.begin) * C;
  float* st = p.conv_state + int64_t(r.slot) * C * (K - 1);
  float* saved = M == Fused::Decode ? nullptr : p.conv_in + int64_t(r.slot) * p.n_save * C;
  // token j's raw input of channel ch (a commit's, saved by its verify pass), saved as read when read-only
  auto input = [&](int j, int ch) {
    const float xin = M == Fused::Commit ? saved[int64_t(j) * C + ch] : x[int64_t(j) * C + ch];
    if (ro) saved[int64_t(j) * C + ch] = xin;
    return xin;
  };
  if (M != Fused::Commit && y == 0)  // the state kernel's head counters of the run (at its first row)
    for (int e = tid; e < p.Hv; e += kDecPrepThreads) p.counters[int64_t(r.begin) * p.Hv + e] = 0;
  // The inputs of up to kPrepChunk tokens are requested together: one memory round trip per
  // chunk, not per token (a verify pass's and a commit's runs step through k + 1 tokens).
  if (y >= Hk) {
    const int ch = 2 * Hk * dk + (y - Hk) * kDecPrepThreads + tid;
    if (ch >= C) return;
    ConvWindow cw(st + int64_t(ch) * (K - 1), p.conv_w + int64_t(ch) * K, K);
    for (int j0 = 0; j0 < n; j0 += kPrepChunk) {
      float xin[kPrepChunk];
#pragma unroll
      for (int u = 0; u < kPrepChunk; ++u)
        if (j0 + u < n) xin[u] = input(j0 + u, ch);
#pragma unroll
      for (int u = 0; u < kPrepChunk; ++u)
        if (j0 + u < n) x[int64_t(j0 + u) * C + ch] = cw.step(xin[u]);
    }
    if (!ro) cw.store(st + int64_t(ch) * (K - 1));
    return;
  }
  __shared__ float part[2][2][kDecPrepThreads / 32];  // [token parity][q, k][warp]
  const bool is_q = tid < dk, active = tid < 2 * dk;
  const int ch = is_q ? y * dk + tid : Hk * dk + y * dk + (tid - dk);
  ConvWindow cw(st + int64_t(active ? ch : 0) * (K - 1), p.conv_w + int64_t(active ? ch : 0) * K, K);
  float xin[kPrepChunk];
  for (int j = 0; j < n; ++j) {
    if (j % kPrepChunk == 0)  // block-uniform
#pragma unroll
      for (int u = 0; u < kPrepChunk; ++u)
        if (active && j + u < n) xin[u] = input(j + u, ch);
    float* xj = x + int64_t(j) * C;
    float xj_in = xin[0];
#pragma unroll
    for (int u = 1; u < kPrepChunk; ++u)
      if (j % kPrepChunk == u) xj_in = xin[u];  // (a register array indexed by constants only)
    const float val = active ? cw.step(xj_in) : 0.0f;
    // (part[j & 1] is written again two tokens on, past a barrier)
    const float2 t = qk_block_totals(val, active, is_q, part[j & 1]);
    if (active) xj[ch] = is_q ? q_hat(val, t.x, p.scale) : k_hat(val, t.y);
  }
  if (active && !ro) cw.store(st + int64_t(ch) * (K - 1));
}

// grid (runs, Hv, dv/32), 128 threads. Thread (cg = tid % 8, rg = tid / 8) owns columns
// col0 + 4cg .. +3 of rows rg + 16i (i < DK/16) of the head's state: a warp's 16-byte loads
// cover 4 rows × 128 contiguous bytes. The slice stays in registers through the run's tokens.
// A token's chain is its two reductions: its gates are loaded for all tokens before the wait,
// the next token's q̂, k̂, v are requested while this one computes, and the gated RMSNorm of the
// head (which spans the slices) is done once for all the run's tokens, by the head's last block
// to finish (one acquire-release count per block; the prep kernel zeroed the counter).
template <int DK, Fused M>
__global__ void __launch_bounds__(kDecThreads) fused_state_kernel(FusedArgs p) {
  static_assert(kDecThreads == 128 && DK % 16 == 0 && DK <= kDecThreads, "16 row groups of 8 threads");
  constexpr int R = DK / 16;
  constexpr bool kOut = M != Fused::Commit;  // a pass's outputs (a commit has none)
  const int i = int(blockIdx.x), h = int(blockIdx.y), slice = int(blockIdx.z), ns = int(gridDim.z);
  const int tid = int(threadIdx.x), cg = tid & 7, rg = tid >> 3;
  const int dv = p.dv, col = slice * kDecCols + 4 * cg;
  const SeqRun r = p.runs[i];
  const bool ro = M == Fused::Verify && (p.readonly >> i & 1);
  const int n = M == Fused::Decode ? 1 : r.count;
  __shared__ float2 gts[kFusedMaxTokens];  // (g, β) of each token
  __shared__ float qs[2][DK], ks[2][DK], red[2][kDecThreads / 32][kDecCols];
  // Before the prep kernel's results: the state slice and the gates (a, b or the saved g, β
  // come from before it); a verify run's gates are saved for its commit.
  const int64_t S = (int64_t(r.slot) * p.Hv + h) * DK * dv + col;  // in elements
  float4 s[R];
  load_slice<DK>(p, r.slot, h, col, s);
  for (int j = tid; j < n; j += kDecThreads) {
    const int64_t si = (int64_t(r.slot) * p.n_save + j) * p.Hv + h;  // (Verify, Commit) token j in g_in, beta_in
    if constexpr (M == Fused::Commit) {
      gts[j] = make_float2(p.g_in[si], p.beta_in[si]);
    } else {
      gts[j] = gates_of(p, int64_t(r.begin) + j, h);
      if (ro && slice == 0) p.g_in[si] = gts[j].x, p.beta_in[si] = gts[j].y;
    }
  }
  griddep_trigger();
  griddep_wait();

  step_slice<DK, kOut>(
      p, p.mixed, s, n, h, slice, gts, [&](int j) { return r.begin + j; }, [](int) { return true; }, qs, ks, red);
  if (!ro) {
#pragma unroll
    for (int k = 0; k < R; ++k) p.state.store4(S + int64_t(rg + 16 * k) * dv, s[k]);
  }
  if constexpr (!kOut) return;
  // The gated RMSNorm spans the head's dv/32 slices: the last of its blocks to finish (an
  // acquire-release count on the run's first token's counter) normalises all the run's rows.
  if (!last_of_head(p.counters + int64_t(r.begin) * p.Hv + h, ns)) return;
  for (int j = 0; j < n; ++j) gated_norm_head(p, int64_t(r.begin) + j, h, ns);
}
// Thread block cluster barrier halves (sm_90; fused_decode_kernel runs only there): arrive
// releases this thread's earlier memory operations to the cluster, wait acquires the others'.
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#endif
}
// An arrive that orders no memory: for a barrier that only says every block has started.
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}

// Both one-kernel decode forms' update of a block's slice (held in s, stored at S + rows · dv):
// q̂ and k̂ normalised from the key head's raw conv outputs by the warps' sums of squares
// (ssq, added in warp order as the prep kernel adds them), v4 the thread's 4 columns of v. (dv
// is the kernel's copy of p.dv: with p.dv read here the per-head kernel compiled otherwise, 98
// registers against 115, and traced at 7.38 µs a layer against 6.55 on another H100, session 60.)
template <int R, int W>
__device__ __forceinline__ void decode_slice(const FusedArgs& p, float4 (&s)[R], int rg, int64_t S,
                                             const float (&raw)[2][16 * R], const float (&ssq)[2][W], const float* v4,
                                             const float2& gt, float (*red)[kDecThreads / 32][kDecCols], int dv,
                                             float (&o)[4]) {
  float tq = 0.0f, tk = 0.0f;
#pragma unroll
  for (int w = 0; w < W; ++w) tq += ssq[0][w], tk += ssq[1][w];
  slice_token<R, true>(
      s, rg, [&](int e) { return k_hat(raw[1][e], tk); }, [&](int e) { return q_hat(raw[0][e], tq, p.scale); },
      *reinterpret_cast<const float4*>(v4), expf(gt.x), gt.y, red, p.state, false, o);
#pragma unroll
  for (int k = 0; k < R; ++k) p.state.store4(S + int64_t(rg + 16 * k) * dv, s[k]);
}

// Both one-kernel forms' gated RMSNorm of a thread's 4 columns o of a head, from the head's
// slices' Σo² (added in slice order, as the state kernel's last block), into dst.
__device__ __forceinline__ void gated_norm_cols(const FusedArgs& p, const float* sso, int ns, const float (&o)[4],
                                                float4 nw, float4 z4, float* dst) {
  float ss = 0;
  for (int e = 0; e < ns; ++e) ss += sso[e];
  const float inv = 1.0f / sqrtf(ss / float(p.dv) + p.eps);
  *reinterpret_cast<float4*>(dst) =
      make_float4(nw.x * (o[0] * inv) * silu_f(z4.x), nw.y * (o[1] * inv) * silu_f(z4.y),
                  nw.z * (o[2] * inv) * silu_f(z4.z), nw.w * (o[3] * inv) * silu_f(z4.w));
}

// The decode step in one kernel (sm_90; launch_fused takes it for Decode where the shapes
// allow): grid (runs, Hv) in clusters of the g = Hv / Hk value heads that read one key head,
// kDecThreads threads per 32-column slice of the head (ns = dv / 32 of them: the state kernel's
// blocks of a head in one). Block (i, h): conv + SiLU of the key head's q and k channels by
// threads < 2·dk (the prep kernel's block: the same warps, so the same sums) and of the head's
// v channels by the next dv threads; the gates; each slice's update with q̂, k̂ normalised from
// the raw conv outputs in shared memory as they are read; the gated RMSNorm over the slices in
// the block. So no prep launch, no q̂ / k̂ / v round trip through global memory, and no arrival
// counter, fence and last block for the norm. The q and k conv windows are the cluster's shared
// input: every block reads them (before the wait: only this kernel writes conv states, a step
// earlier), and the cluster barrier orders those reads before the first block (h % g == 0)
// stores the advanced windows; a block's v windows are its own.
template <int DK>
__global__ void __launch_bounds__(kDecMaxSlices* kDecThreads) fused_decode_kernel(FusedArgs p) {
  static_assert(DK % 16 == 0 && 2 * DK <= kDecMaxSlices * kDecThreads, "q and k channels a thread");
  constexpr int R = DK / 16, kQkWarps = 2 * DK / 32;
  const int i = int(blockIdx.x), h = int(blockIdx.y), tid = int(threadIdx.x);
  const int sl = tid / kDecThreads, t7 = tid % kDecThreads, cg = t7 & 7, rg = t7 >> 3;
  const int dv = p.dv, ns = dv / kDecCols, col = sl * kDecCols + 4 * cg;
  const int C = p.C, K = p.K, Hk = p.Hk, g = p.Hv / Hk, kh = h / g;
  const SeqRun r = p.runs[i];
  __shared__ float raw[2][DK];                      // q, k of the key head after conv + SiLU
  __shared__ __align__(16) float vs[kDecMaxSlices * kDecCols];  // v of the head after conv + SiLU
  __shared__ float ssq[2][kQkWarps];                // [q, k][warp]: the warps' sums of squares
  __shared__ float red[kDecMaxSlices][2][kDecThreads / 32][kDecCols];
  __shared__ float sso[kDecMaxSlices];              // Σo² of each slice
  __shared__ float2 gt;                             // (g, β)
  // Before the wait: the state slice, the conv window, the norm's weights.
  const int64_t S = (int64_t(r.slot) * p.Hv + h) * DK * dv + col;  // in elements
  float4 s[R];
#pragma unroll
  for (int k = 0; k < R; ++k) s[k] = p.state.load4(S + int64_t(rg + 16 * k) * dv);
  const bool is_qk = tid < 2 * DK, is_q = tid < DK;
  const int ch = is_q ? kh * DK + tid
                 : is_qk ? (Hk + kh) * DK + tid - DK
                 : tid < 2 * DK + dv ? 2 * Hk * DK + h * dv + tid - 2 * DK : -1;
  float* const st = p.conv_state + (int64_t(r.slot) * C + max(ch, 0)) * (K - 1);
  ConvWindow cw(st, p.conv_w + int64_t(max(ch, 0)) * K, K);
  const float4 nw = *reinterpret_cast<const float4*>(p.norm + col);
  if (!p.late_trigger) griddep_trigger();
  griddep_wait();  // mixed, z, a and b come from the projections before
  const int64_t row = r.begin, hs = row * p.Hv + h;
  const float xin = ch >= 0 ? p.mixed[row * C + ch] : 0.0f;
  const float4 z4 = *reinterpret_cast<const float4*>(p.z + hs * dv + col);
  if (tid == 0) gt = gates_of(p, row, h);
  const float val = ch >= 0 ? cw.step(xin) : 0.0f;
  // This block's reads of the key head's windows are done (their values used). Not before the
  // wait: the arrive's release is a GPU-scope fence, which there waited for the state slice's
  // loads in flight (ncu, 27B: 8% of the stall samples).
  cluster_arrive();
  if (is_qk) {  // whole warps (2·DK a multiple of 32)
    const float2 ss = qk_warp_ss(val, true, is_q);
    if ((tid & 31) == 0) ssq[0][tid >> 5] = ss.x, ssq[1][tid >> 5] = ss.y;
    raw[is_q ? 0 : 1][is_q ? tid : tid - DK] = val;
  } else if (ch >= 0) {
    vs[tid - 2 * DK] = val;
  }
  cluster_wait();  // every block of the key head has read its q and k windows
  if (ch >= 0 && (!is_qk || h % g == 0)) cw.store(st);
  __syncthreads();
  float o[4];
  decode_slice(p, s, rg, S, raw, ssq, vs + col, gt, red[sl], dv, o);
  if (t7 < 32) {
    const float ss = slice_ss(o);
    if (t7 == 0) sso[sl] = ss;
  }
  __syncthreads();
  if (p.late_trigger) griddep_trigger();
  if (t7 >= 8) return;
  gated_norm_cols(p, sso, ns, o, nw, z4, p.out + out_at(p, row, h) + col);
}

// Stores v at `local`'s place in the shared memory of the cluster's block `rank` (sm_90).
__device__ __forceinline__ void store_to_cluster_block(float* local, unsigned rank, float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned a = unsigned(__cvta_generic_to_shared(local));
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(a), "r"(rank));
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(remote), "f"(v) : "memory");
#endif
}

constexpr int kMaxSliceCluster = 16;  // the largest (non-portable) cluster sm_90 launches

// The decode step in one kernel, a block per 32-column slice (sm_90): grid (runs, Hv, ns) of
// kDecThreads threads in clusters (1, g, ns) — every slice of the g value heads that read one
// key head — so a head's state moves through ns SMs, not one (faster alone; where that pays in
// a step, decode_form says). Each block convolves the key head's q and
// k channels itself (thread t: q channel t and k channel t; the warps' sums added in the prep
// kernel's order, so q̂ and k̂ are bitwise the other forms') and its slice's v channels, then
// runs its slice as fused_state_kernel does. The head's Σo² spans its ns blocks: each pushes its
// slice's into the shared memory of all of them (DSMEM), once a first (relaxed) cluster barrier
// says they have all started. A second orders those pushes, and every block's reads of the q /
// k windows, before the cluster's first block stores the advanced windows and each block
// normalises its columns.
template <int DK>
__global__ void __launch_bounds__(kDecThreads) fused_decode_slice_kernel(FusedArgs p) {
  static_assert(DK % 16 == 0 && DK <= kDecThreads, "a thread per q / k channel pair");
  constexpr int R = DK / 16, kQkWarps = (DK + 31) / 32;
  const int i = int(blockIdx.x), h = int(blockIdx.y), sl = int(blockIdx.z), ns = int(gridDim.z);
  const int tid = int(threadIdx.x), cg = tid & 7, rg = tid >> 3;
  const int dv = p.dv, col = sl * kDecCols + 4 * cg;
  const int C = p.C, K = p.K, Hk = p.Hk, g = p.Hv / Hk, kh = h / g;
  cluster_arrive_relaxed();  // this block has started: the others may push into its shared memory
  const SeqRun r = p.runs[i];
  __shared__ float raw[2][DK];                   // q, k of the key head after conv + SiLU
  __shared__ __align__(16) float vs[kDecCols];   // v of the slice after conv + SiLU
  __shared__ float ssq[2][kQkWarps];             // [q, k][warp]: the warps' sums of squares
  __shared__ float red[2][kDecThreads / 32][kDecCols];
  __shared__ float sso[kMaxSliceCluster];        // Σo² of the head's slices, pushed by their blocks
  __shared__ float2 gt;                          // (g, β)
  // Before the wait: the state slice, the conv windows, the norm's weights.
  const int64_t S = (int64_t(r.slot) * p.Hv + h) * DK * dv + col;  // in elements
  float4 s[R];
#pragma unroll
  for (int k = 0; k < R; ++k) s[k] = p.state.load4(S + int64_t(rg + 16 * k) * dv);
  const bool has_qk = tid < DK, has_v = tid < kDecCols;
  const int64_t chq = int64_t(kh) * DK + (has_qk ? tid : 0), chk = chq + int64_t(Hk) * DK;
  const int64_t chv = 2 * int64_t(Hk) * DK + int64_t(h) * dv + sl * kDecCols + (has_v ? tid : 0);
  float* const conv = p.conv_state + int64_t(r.slot) * C * (K - 1);
  ConvWindow cq(conv + chq * (K - 1), p.conv_w + chq * K, K), ck(conv + chk * (K - 1), p.conv_w + chk * K, K);
  ConvWindow cv(conv + chv * (K - 1), p.conv_w + chv * K, K);
  const float4 nw = *reinterpret_cast<const float4*>(p.norm + col);
  if (!p.late_trigger) griddep_trigger();
  griddep_wait();  // mixed, z, a and b come from the projections before
  const int64_t row = r.begin, hs = row * p.Hv + h;
  const float* xr = p.mixed + row * C;
  const float xq = xr[chq], xk = xr[chk], xv = xr[chv];
  const float4 z4 = *reinterpret_cast<const float4*>(p.z + hs * dv + col);
  if (tid == 0) gt = gates_of(p, row, h);
  const float vq = cq.step(xq), vk = ck.step(xk), vv = cv.step(xv);
  if (has_v) {  // the slice's own v channels: no other block reads their windows
    vs[tid] = vv;
    cv.store(conv + chv * (K - 1));
  }
  if (has_qk) raw[0][tid] = vq, raw[1][tid] = vk;
  if (tid < 32 * kQkWarps) {  // whole warps: lanes past DK hold zeros
    const float sq = warp_sum(has_qk ? vq * vq : 0.0f), sk = warp_sum(has_qk ? vk * vk : 0.0f);
    if ((tid & 31) == 0) ssq[0][tid >> 5] = sq, ssq[1][tid >> 5] = sk;
  }
  __syncthreads();
  float o[4];
  decode_slice(p, s, rg, S, raw, ssq, vs + 4 * cg, gt, red, dv, o);
  cluster_wait();  // every block of the cluster has started
  if (tid < 32) {
    const float ss = slice_ss(o);  // every lane of warp 0 holds it
    if (tid < ns) store_to_cluster_block(&sso[sl], unsigned(h % g + g * tid), ss);  // rank of block (h, slice tid)
  }
  cluster_arrive();
  cluster_wait();  // the head's Σo² are in; every block of the key head has read its q and k windows
  if (has_qk && h % g == 0 && sl == 0) {
    cq.store(conv + chq * (K - 1));
    ck.store(conv + chk * (K - 1));
  }
  if (p.late_trigger) griddep_trigger();
  if (tid >= 8) return;
  gated_norm_cols(p, sso, ns, o, nw, z4, p.out + out_at(p, row, h) + col);
}

}  // namespace

// One call of the fused kernels: its mode and, beyond deltanet_decode's, the verify runs and
// the saved-input buffers; the pass's tensors (z, a, b, out: null for a commit).
struct FusedCall {
  Fused mode;
  Tensor& mixed;
  const Tensor *z, *a, *b;
  Tensor* out;
  std::span<const SeqRun> runs, verify;
  Tensor *conv_in, *g_in, *beta_in;  // written by a verify pass, read by a commit
  std::span<const int32_t> parent = {};  // a tree verify pass: its one run's parents
};

// cuda_ops.cuh's launch_pdl in thread block clusters of `cluster` blocks (sm_90; the grid a
// multiple of it).
template <typename... KArgs, typename... Args>
static void launch_pdl_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, dim3 cluster, size_t smem,
                               cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster.x, attr[0].val.clusterDim.y = cluster.y, attr[0].val.clusterDim.z = cluster.z;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_allowed(reinterpret_cast<const void*>(kernel)) ? 2 : 1;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// How a decode step runs its DeltaNet layer: the prep and state kernels (kTwo), or one kernel
// in thread block clusters (sm_90) — a block per value head (kHead, fused_decode_kernel: a
// thread for each of the key head's q and k channels and the head's v channels, dv ≤ 128,
// clusters of the g = Hv / Hk value heads of a key head, ≤ 8) or a block per 32-column slice
// of a head (kSlice, fused_decode_slice_kernel: clusters of the g heads' ns slices, ≤ 16).
// A one-kernel form within one wave of head blocks (a block of up to 512 threads, ~114
// registers each, fills an SM); past it the state kernel's smaller blocks hide latency better.
// H200 (bench/RESULTS.md, session 33), kHead against kTwo: 27B Q4_K_M b1 +1.9% (48 blocks), b4
// −2.0% (192), b16 −5%; 35B-A3B b1 +2.9%, b4 +1.6% (128 blocks), b16 −0.9%.
// kSlice only where its blocks are one wave at one an SM and the out projection after it is
// dense (session 60, H100): alone it is ~1.2 µs faster at one token (35B-A3B: 8.4 against 9.6
// µs, ncu), but its blocks take nearly every SM, where a tiled GEMM's blocks (each a whole SM)
// become resident early to request their first tiles: 35B-A3B Q4_K_M b1 −0.5%, b4 −1.6%; before
// the 35B-A3B bf16's split-K GEMV, b1 +0.8%; 27B bf16 even.
// QWEN36_DELTANET_DECODE=two|head|slice forces a form wherever its shapes allow (A / B;
// deltanet_decode_select for tests).
enum class DecodeForm { kAuto, kTwo, kHead, kSlice };
static DecodeForm parse_decode_form(const char* v) {
  const std::string_view f = v ? v : "";
  return f == "two" ? DecodeForm::kTwo : f == "head" ? DecodeForm::kHead : f == "slice" ? DecodeForm::kSlice
                                                                                        : DecodeForm::kAuto;
}
static std::atomic<int> g_decode_form{-1};  // −1: not read yet; else a DecodeForm
static DecodeForm decode_form_choice() {
  int x = g_decode_form.load(std::memory_order_relaxed);
  if (x < 0) {
    x = int(parse_decode_form(std::getenv("QWEN36_DELTANET_DECODE")));
    g_decode_form.store(x, std::memory_order_relaxed);
  }
  return DecodeForm(x);
}
static DecodeForm decode_form(int64_t runs, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, bool dense_out) {
  static const bool clusters = [] {
    int dev = 0, on = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&on, cudaDevAttrClusterLaunch, dev) == cudaSuccess && on != 0;
  }();
  const int64_t ns = dv / kDecCols, g = Hv / Hk;
  const bool head = clusters && g <= 8 && dv % kDecCols == 0 && ns <= kDecMaxSlices && 2 * dk + dv <= ns * kDecThreads;
  const bool slice = clusters && dv % kDecCols == 0 && g * ns <= kMaxSliceCluster && dk <= kDecThreads;
  switch (decode_form_choice()) {
    case DecodeForm::kTwo: return DecodeForm::kTwo;
    case DecodeForm::kHead: return head ? DecodeForm::kHead : DecodeForm::kTwo;
    case DecodeForm::kSlice: return slice ? DecodeForm::kSlice : DecodeForm::kTwo;
    case DecodeForm::kAuto: break;
  }
  const int64_t sms = dev_info().sms;
  if (slice && dense_out && runs * Hv * ns <= sms) return DecodeForm::kSlice;
  return head && runs * Hv <= sms ? DecodeForm::kHead : DecodeForm::kTwo;
}

// When the one-kernel decode step releases the launch after it (in the model's step, the out
// projection): at its start, so that launch's blocks become resident and request their weights
// while this kernel runs, unless release_late_before says after the state update. Released early
// before a dense GEMV, its blocks all landed on the SMs this kernel's blocks do not fill (each
// holds a whole SM): H200, 27B bf16, 48 of 132 SMs; the out_proj 18 → 22 µs and the layers' down
// projections after it 44 → 67 µs, tg64 b1 65.8 t/s against 72.0 released late, while late
// release costs the 35B-A3B bf16 (split-K out_proj of 2048 blocks) 0.9% and the Q4_K_M models
// (tiled GEMMs) 1.6-2.8%. QWEN36_FUSED_TRIGGER=early|late overrides.
static bool late_release(const Ctx& c, const DeltaNetWeights& w) {
  static const char* force = std::getenv("QWEN36_FUSED_TRIGGER");
  if (force && std::string_view(force) == "early") return false;
  if (force && std::string_view(force) == "late") return true;
  return release_late_before(c, w.out_proj);
}

// A tree verify pass's two launches (tree_prep_kernel, tree_state_kernel) for p as launch_fused
// fills it: the tree's parents, leaf paths and first occurrences from its set_batch_trees table
// (then the grid, count paths, does not depend on the tree's shape), or uploaded.
static void launch_tree(Ctx& c, FusedArgs& p, const TreeTable* t, const SeqRun& run, std::span<const int32_t> parent,
                        int64_t T, int ns) {
  tree_ops::Paths tp;
  if (!t) tp = tree_ops::leaf_paths(run, parent);
  Temp<int32_t> up_parent(c, t ? std::span<const int32_t>() : parent), up_rows(c, std::span<const int32_t>(tp.rows)),
      up_first(c, std::span<const int32_t>(tp.last));
  Temp<SeqRun> up_paths(c, std::span<const SeqRun>(tp.runs));
  p.parent = t ? c.trees.dev + t->off : up_parent.get();
  p.paths = t ? reinterpret_cast<const SeqRun*>(c.trees.dev + t->off_paths) : up_paths.get();
  p.rows = t ? c.trees.dev + t->off_rows : up_rows.get();
  p.first = t ? c.trees.dev + t->off_first : up_first.get();
  Temp<float> qkv(c, size_t(T) * size_t(p.C));
  p.qkv = qkv.get();
  const unsigned np = t ? unsigned(run.count) : unsigned(tp.runs.size());
  const dim3 pgrid{unsigned(run.count), unsigned(p.Hk + blocks_for(int64_t(p.Hv) * p.dv, kDecPrepThreads))};
  const dim3 sgrid{np, unsigned(p.Hv), unsigned(ns)};
  tree_prep_kernel<<<pgrid, kDecPrepThreads, 0, c.stream>>>(p);
  CUDA_LAUNCH_CHECK();
  with_key_dim(p.dk, [&](auto d) {  // (launch_fused checked dk)
    launch_pdl(tree_state_kernel<decltype(d)::value>, sgrid, dim3(kDecThreads), 0, c.stream, p);
  });
  CUDA_LAUNCH_CHECK();
}

// Launches a FusedCall; false: shapes, dtypes or runs the kernels do not handle, nothing launched.
static bool launch_fused(Ctx& c, const FusedCall& f, const DeltaNetWeights& w, float eps, Tensor& conv_state,
                         Tensor& ssm_state) {
  static constexpr const char* kOps[] = {"deltanet_decode", "deltanet_verify", "deltanet_commit"};
  const char* op = kOps[int(f.mode)];
  const bool pass = f.mode != Fused::Commit, saves = f.mode != Fused::Decode, tree = !f.parent.empty();
  Tensor& mixed = f.mixed;
  const std::span<const SeqRun> runs = f.runs;
  if (ssm_state.ndim != 4 || conv_state.ndim != 3 || mixed.ndim != 2 || runs.empty() || runs.size() > 65535)
    return false;
  const int64_t T = mixed.rows(), C = mixed.cols(), K = w.conv1d.cols();
  const int64_t Hv = ssm_state.dim(1), dk = ssm_state.dim(2), dv = ssm_state.dim(3), Hk = (C - Hv * dv) / (2 * dk);
  const bool dk_ok = dk == 16 || dk == 32 || dk == 64 || dk == 128;  // 2·dk ≤ the prep kernel's 256 threads
  if (!dk_ok || dv % kDecCols != 0 || dv / kDecCols > 64 || K < 1 || K > kMaxConvK || Hk <= 0 || Hv % Hk != 0 ||
      2 * Hk * dk + Hv * dv != C || T == 0 || (pass && f.out->ndim != 3))
    return false;
  std::vector<const Tensor*> f32s{&mixed, &conv_state, &w.conv1d, &w.a_neg_exp, &w.dt_bias, &w.norm};
  if (pass) f32s.insert(f32s.end(), {f.z, f.a, f.b, f.out});
  if (saves) f32s.insert(f32s.end(), {f.conv_in, f.g_in, f.beta_in});
  for (const Tensor* t : f32s)
    if (t->dtype != DType::F32) return false;
  if (ssm_state.dtype != DType::F32 && ssm_state.dtype != DType::BF16) return false;
  const int64_t G = pass ? f.a->numel() / T : Hv;  // a's and b's row length: Hv or more (Backend::deltanet_decode)
  if (pass)
    QWEN36_CHECK(f.z->numel() == T * Hv * dv && G >= Hv && f.a->numel() == T * G && f.b->numel() == T * G &&
                     f.out->dim(0) == T && f.out->dim(1) == Hv && f.out->dim(2) == dv,
                 "{}: z {} a {} b {} out {} for {} tokens", op, f.z->shape_str(), f.a->shape_str(), f.b->shape_str(),
                 f.out->shape_str(), T);
  QWEN36_CHECK(conv_state.dim(1) == C && conv_state.dim(2) == K - 1, "{}: states {} {} for {} channels, {} heads of {}",
               op, conv_state.shape_str(), ssm_state.shape_str(), C, Hv, dv);
  QWEN36_CHECK(w.conv1d.rows() == C && w.a_neg_exp.numel() == Hv && w.dt_bias.numel() == Hv && w.norm.numel() == dv,
               "{}: weights conv {} a {} dt {} norm {}", op, w.conv1d.shape_str(), w.a_neg_exp.shape_str(),
               w.dt_bias.shape_str(), w.norm.shape_str());
  int64_t n_save = 0;
  if (saves) {
    const Tensor &ci = *f.conv_in, &gi = *f.g_in, &bi = *f.beta_in;
    n_save = ci.ndim == 3 ? ci.dim(1) : 0;
    QWEN36_CHECK(n_save > 0 && ci.dim(2) == C && gi.ndim == 3 && bi.ndim == 3 && gi.dim(1) == n_save &&
                     gi.dim(2) == Hv && bi.dim(1) == n_save && bi.dim(2) == Hv && gi.dim(0) == ci.dim(0) &&
                     bi.dim(0) == ci.dim(0),
                 "{}: saved inputs {} / {} / {} for {} channels, {} heads", op, ci.shape_str(), gi.shape_str(),
                 bi.shape_str(), C, Hv);
  }
  // Which runs only read their state: the verify runs, found in `runs` by their first row.
  uint64_t readonly = 0;
  if (f.mode == Fused::Verify) {
    if (runs.size() > size_t(kVerifyMaxRuns)) return false;
    for (const SeqRun& v : f.verify) {
      const auto it = std::find_if(runs.begin(), runs.end(), [&](const SeqRun& r) { return r.begin == v.begin; });
      QWEN36_CHECK(it != runs.end() && it->slot == v.slot && it->count == v.count,
                   "{}: verify run (slot {}, begin {}, {} tokens) is not one of the batch's runs", op, v.slot, v.begin,
                   v.count);
      readonly |= uint64_t(1) << (it - runs.begin());
    }
  }
  int64_t rows = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const SeqRun& r = runs[i];
    const bool many = f.mode == Fused::Commit || (readonly >> i & 1);  // runs of several tokens allowed
    if ((r.count != 1 && !many) || r.count > kFusedMaxTokens) return false;  // e.g. a prefill's run: not fused
    QWEN36_CHECK(r.count >= 1 && r.begin >= 0 && r.begin + r.count <= T && r.slot >= 0 &&
                     r.slot < conv_state.dim(0) && r.slot < ssm_state.dim(0) &&
                     (!saves || (r.count <= n_save && r.slot < f.conv_in->dim(0))),
                 "{}: run (slot {}, begin {}, {} tokens) in a batch of {}", op, r.slot, r.begin, r.count, T);
    rows += r.count;
  }
  QWEN36_CHECK(rows == T, "{}: runs of {} tokens in a batch of {}", op, rows, T);
  TreeTake tt{false, nullptr};
  if (tree) {  // one tree verify run, the pass's only run
    if (runs.size() != 1 || readonly != 1) return false;
    tt = tree_kernels_take(c, runs[0], f.parent, T);
    if (!tt.take) return false;
  }
  Temp<SeqRun> tmp(c, 0);
  const SeqRun* dr = dev_runs(c, runs, tmp);
  if (!dr) return true;  // recording could not upload the runs: marked failed, nothing runs
  const int32_t* out_pos = nullptr;  // out's heads in out_proj's order (Backend::deltanet_decode)
  Temp<int32_t> pos_tmp(c, 0);
  if (pass && !w.out_proj_heads.empty()) {
    QWEN36_CHECK(int64_t(w.out_proj_heads.size()) == Hv, "{}: out_proj's order of {} heads for {}", op,
                 w.out_proj_heads.size(), Hv);
    std::vector<int32_t> pos(size_t(Hv), -1);
    for (size_t q = 0; q < pos.size(); ++q) {
      const int32_t h = w.out_proj_heads[q];
      QWEN36_CHECK(h >= 0 && h < Hv && pos[size_t(h)] < 0, "{}: out_proj's head order is not a permutation", op);
      pos[size_t(h)] = int32_t(q);
    }
    out_pos = dev_constant_i32(c, pos);
    if (!out_pos && c.capturing) return true;  // (as dev_runs above)
    if (!out_pos) out_pos = pos_tmp.assign(pos);  // the constants' cache is full
  }
  const int ns = int(dv / kDecCols);
  const DecodeForm form =
      f.mode == Fused::Decode ? decode_form(int64_t(runs.size()), Hk, Hv, dk, dv, !dtype_is_quantized(w.out_proj.dtype))
                                  : DecodeForm::kTwo;
  const bool one = form != DecodeForm::kTwo;
  Temp<float> scratch(c, pass && !one ? size_t(T * Hv * (1 + ns)) : 0);  // head counters (int), then the slices' Σo²
  FusedArgs p{};
  p.mixed = mixed.as<float>();
  if (pass) p.z = f.z->as<const float>(), p.a = f.a->as<const float>(), p.b = f.b->as<const float>();
  if (pass) p.out = f.out->as<float>(), p.out_pos = out_pos;
  p.conv_w = w.conv1d.as<const float>(), p.a_neg_exp = w.a_neg_exp.as<const float>();
  p.dt_bias = w.dt_bias.as<const float>(), p.norm = w.norm.as<const float>();
  p.conv_state = conv_state.as<float>(), p.state = state_ref(ssm_state), p.runs = dr;
  p.counters = reinterpret_cast<int*>(scratch.get()), p.partials = pass ? scratch.get() + T * Hv : nullptr;
  if (saves) p.conv_in = f.conv_in->as<float>(), p.g_in = f.g_in->as<float>(), p.beta_in = f.beta_in->as<float>();
  p.readonly = readonly, p.n_save = int(n_save);
  p.C = int(C), p.K = int(K), p.Hk = int(Hk), p.dk = int(dk), p.Hv = int(Hv), p.dv = int(dv), p.gs = int(G);
  p.scale = 1.0f / std::sqrt(float(dk)), p.eps = eps;
  p.late_trigger = late_release(c, w);
  if (tree) {
    launch_tree(c, p, tt.table, runs[0], f.parent, T, ns);
    return true;
  }
  const unsigned nr = unsigned(runs.size());
  if (form == DecodeForm::kHead) {
    const dim3 grid{nr, unsigned(Hv)}, block(unsigned(ns * kDecThreads)), cluster{1, unsigned(Hv / Hk), 1};
    with_key_dim(dk, [&](auto d) {
      launch_pdl_cluster(fused_decode_kernel<decltype(d)::value>, grid, block, cluster, 0, c.stream, p);
    });
    CUDA_LAUNCH_CHECK();
    return true;
  }
  if (form == DecodeForm::kSlice) {
    const dim3 grid{nr, unsigned(Hv), unsigned(ns)}, cluster{1, unsigned(Hv / Hk), unsigned(ns)};
    with_key_dim(dk, [&](auto d) {
      constexpr int DK = decltype(d)::value;
      static std::atomic<uint64_t> wide;  // clusters past 8 blocks allowed, per device
      once_per_device(wide, [] {
        CUDA_CHECK(cudaFuncSetAttribute(fused_decode_slice_kernel<DK>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
      });
      launch_pdl_cluster(fused_decode_slice_kernel<DK>, grid, dim3(kDecThreads), cluster, 0, c.stream, p);
    });
    CUDA_LAUNCH_CHECK();
    return true;
  }
  const dim3 pgrid{nr, unsigned(Hk + blocks_for(Hv * dv, kDecPrepThreads))}, sgrid{nr, unsigned(Hv), unsigned(ns)};
  auto launch = [&](auto mode) {
    constexpr Fused M = decltype(mode)::value;
    fused_prep_kernel<M><<<pgrid, kDecPrepThreads, 0, c.stream>>>(p);
    CUDA_LAUNCH_CHECK();
    with_key_dim(dk, [&](auto d) {
      launch_pdl(fused_state_kernel<decltype(d)::value, M>, sgrid, dim3(kDecThreads), 0, c.stream, p);
    });
    CUDA_LAUNCH_CHECK();
  };
  switch (f.mode) {
    case Fused::Decode: launch(std::integral_constant<Fused, Fused::Decode>{}); break;
    case Fused::Verify: launch(std::integral_constant<Fused, Fused::Verify>{}); break;
    case Fused::Commit: launch(std::integral_constant<Fused, Fused::Commit>{}); break;
  }
  return true;
}

// Test hook: forces the decode step's form ("two", "head", "slice"), or null for the environment's.
void deltanet_decode_select(const char* mode) { g_decode_form.store(mode ? int(parse_decode_form(mode)) : -1); }

bool deltanet_decode(Ctx& c, Tensor& mixed, const Tensor& z, const Tensor& a, const Tensor& b,
                     const DeltaNetWeights& w, float eps, Tensor& conv_state, Tensor& ssm_state,
                     std::span<const SeqRun> runs, Tensor& out) {
  if (int64_t(runs.size()) != mixed.rows()) return false;
  const FusedCall f{Fused::Decode, mixed, &z, &a, &b, &out, runs, {}, nullptr, nullptr, nullptr};
  return launch_fused(c, f, w, eps, conv_state, ssm_state);
}

bool deltanet_verify(Ctx& c, Tensor& mixed, const Tensor& z, const Tensor& a, const Tensor& b,
                     const DeltaNetWeights& w, float eps, Tensor& conv_state, Tensor& ssm_state,
                     std::span<const SeqRun> runs, std::span<const SeqRun> verify, Tensor& conv_in, Tensor& g_in,
                     Tensor& beta_in, Tensor& out) {
  const FusedCall f{Fused::Verify, mixed, &z, &a, &b, &out, runs, verify, &conv_in, &g_in, &beta_in};
  return launch_fused(c, f, w, eps, conv_state, ssm_state);
}

bool deltanet_verify_tree(Ctx& c, Tensor& mixed, const Tensor& z, const Tensor& a, const Tensor& b,
                          const DeltaNetWeights& w, float eps, Tensor& conv_state, Tensor& ssm_state, const SeqRun& run,
                          std::span<const int32_t> parent, Tensor& conv_in, Tensor& g_in, Tensor& beta_in, Tensor& out) {
  if (parent.empty()) return false;
  const SeqRun one[] = {run};
  const FusedCall f{Fused::Verify, mixed, &z, &a, &b, &out, one, one, &conv_in, &g_in, &beta_in, parent};
  return launch_fused(c, f, w, eps, conv_state, ssm_state);
}

bool deltanet_commit(Ctx& c, const DeltaNetWeights& w, Tensor& conv_state, Tensor& ssm_state,
                     std::span<const SeqRun> runs, const Tensor& conv_in, const Tensor& g_in, const Tensor& beta_in,
                     Tensor& mixed) {
  // (a commit's kernels only read the saved inputs)
  const FusedCall f{Fused::Commit, mixed,  nullptr,  nullptr, nullptr, nullptr, runs, {}, const_cast<Tensor*>(&conv_in),
                    const_cast<Tensor*>(&g_in), const_cast<Tensor*>(&beta_in)};
  return launch_fused(c, f, w, 0.0f, conv_state, ssm_state);
}

}  // namespace qwen36::cuda
