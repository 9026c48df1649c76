// Mixture of experts on the GPU. CPU twin: backend/cpu/cpu_moe.cpp.
//
//  - moe_route: one warp per token: softmax over the experts, top-k by repeated arg-max
//    (ties to the lower id, as the CPU), renormalised.
//  - moe_experts, few (token, expert) pairs (decode, batch decode: T·k ≤ 64; graph-captured,
//    so no host sync and no shape that depends on device data): two launches that read each
//    pair's expert from the routing ids through a device table of expert pointers, both
//    programmatically dependent. gate+up: a warp per (pair, intermediate row) streams the gate
//    and the up row together (16-byte loads, 4 per row in flight per lane: one wave of blocks)
//    and applies SwiGLU; down: a warp per (token, output row) loads the rows of all k experts at
//    once, before its wait, and sums them weighted in j order (no atomics). Each block copies
//    the activations it dots (x, the k act rows) into shared memory once. f32 activations, f32
//    accumulation.
//  - many pairs (prefill), bf16/f16 weights: the pairs are grouped by expert on the device
//    (one block: counts, scan, scatter = a counting sort; no host round trip), then two
//    grouped tensor-core GEMMs (mma.sync m16n8k16, cp.async 4-stage pipeline) whose 1-D grid
//    enumerates (m-tile of an expert, n-tile); a block finds its expert by binary search in
//    the device tile offsets and blocks past the last tile exit. The launch size is a bound
//    (P/128 + E m-tiles), so nothing waits on the host.
//      gate+up: A rows are gathered from x (rounded to bf16/f16 once) through the permutation,
//      B interleaves 8 gate rows and 8 up rows so each thread holds gate and up of the same
//      element and the epilogue writes silu(g)·u (bf16/f16) directly.
//      down: A = those rows, B = the expert's down matrix; f32 rows in expert order.
//    A last pass sums each token's k rows in j order, weighted (deterministic, no atomics).
//  - otherwise (f32 weights, CudaOptions::exact_matmul, shapes not multiple of 8, unaligned
//    weights): the same device grouping, the offsets come to the host once, and each expert
//    with rows runs matmul (cuBLAS / SIMT per matmul's rules) on its slice.
//  - block-quantized experts (GGUF Q4_K / Q6_K ...): decode by the int8 GEMV kernels of
//    cuda_quant_matmul.cu over the routed pairs (quant_moe_decode: gate+up+SwiGLU, then down
//    weighted, two launches); prefill by the grouped GEMM above on bf16 weights, the experts
//    that received pairs dequantized per pass into a bounded scratch (run_prefill_quant).
//    Experts in the device's tiled layout (CudaBackend::tile_weights; a layer's experts all or
//    none) decode on the int8 tensor cores per pair instead (quant_tiled_moe, cuda_quant_moe_mma.cu),
//    from kMinGroupedPairs pairs grouped by expert (the prefill's grouping below, in chunks of up
//    to 16 pairs of an expert: quant_tiled_moe_grouped, cuda_quant_moe_grouped.cu, then
//    combine_rows_kernel; bitwise the per-pair kernels), and dequantize from tiles for the
//    prefill (quant_dequant_tiled_experts).
//  - moe_experts_shared (Backend's), up to kMaxSharedFoldTokens tokens on tiled experts whose
//    down type the shared expert's down shares: the shared expert is one more pair of every
//    token in the tiled down kernel; on bf16 / f16 experts taking the decode kernels, one more
//    row of the down kernel's sums (its SwiGLU row computed there); otherwise the CUDA backend
//    composes the plain ops.
//  Ids outside [0, E) contribute nothing (the CPU twin throws; ids come from moe_route).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <type_traits>

#include "backend/cuda/cuda_moe_route.cuh"
#include "backend/cuda/cuda_ops.cuh"
#include "backend/cuda/cuda_quant_moe_grouped.cuh"
#include "backend/cuda/cuda_sm80.cuh"

namespace qwen36::cuda {

namespace {

constexpr int kMaxExperts = 1024;
constexpr int kMaxPairs = 64;     // T·k up to this: the decode kernels
constexpr int64_t kMaxPrefillPairs = 32768;  // pairs per prefill pass (bounds the temporaries)
// Block-quantized experts: the per-pair GEMVs read one expert matrix per pair, so their cost is
// linear in pairs, while a dequantizing prefill pass writes and re-reads every used expert in
// bf16 (35B-A3B, batch 16 = 128 pairs: 1.09 ms per layer on the H200, ~4x the GEMVs' bytes).
// Up to kMaxQuantDecodePairs pairs take the GEMVs, in token chunks of ≤ kQuantDecodeChunk pairs
// (the down GEMV keeps all its pairs' activations in shared memory). The bound is the tiled
// kernels' (below): both int8 forms up to the same pair count, so a pass of expert offload that
// streams a host layer's experts (GGUF layout) computes with the activations the resident
// model's tiled experts would (from 257 pairs on it was the dequantizing path's: activations
// rounded to bf16 instead of the same int8 codes). The GEMVs' time, H200, one 35B-A3B layer
// (CudaMoe.Time35BLayerTiled): 936 µs at 512 pairs, 1,873 at 1,024, linear from 468 at 256.
constexpr int64_t kMaxQuantDecodePairs = 1024;
constexpr int64_t kQuantDecodeChunk = 128;
// Tiled experts: the tensor-core kernels, also per pair (cost linear in pairs), up to this many
// pairs (35B-A3B: batch 128 at top-8). H200, 35B-A3B Q4_K_M: per layer 15 µs at 8 pairs, 114 at
// 128, 212 at 256 (CudaMoe.Time35BLayerTiled), while batch 64 (512 pairs, then over the bound
// of 256) on the dequantizing prefill path took ~1.8 ms per layer (bench b64 718 vs b32 2,040
// tok/s); linear in pairs, 1,024 pairs are ~0.85 ms. Above, the prefill path (its bf16 copies of
// the used experts amortize over many tokens per expert).
constexpr int64_t kMaxTiledMoePairs = 1024;
// The shared expert as one more pair of the tiled down kernel (moe_experts_shared) up to this
// many tokens. It saves three launches a layer, which is what a few tokens' step is bound by
// (H200, 35B-A3B Q4_K_M tg64: b1 375 → 404 tok/s, b4 890 → 899); with more tokens every token's
// blocks re-read the shared down matrix and take an extra unit, where one GEMM read it once
// for all (b8 1,350 → 1,304, b16 1,765 → 1,633).
constexpr int64_t kMaxSharedFoldTokens = 4;
// bf16 / f16 experts: the shared expert's SwiGLU row in the down kernel's shared memory, up to I = 12,288.
constexpr int64_t kMaxDecodeSharedBytes = 48 * 1024;

// One warp per token (route_token, cuda_moe_route.cuh: the values bit for bit of the earlier
// shared-memory form).
// Launched programmatically dependent (its launch overlaps the router GEMV's tail). When it lets
// its dependents start (RouteRelease), for one token: before the bf16 / f16 decode kernels at
// its start (Ctx::route_release_early: their blocks resident early gain, H200 35B-A3B bf16 b1
// 391.8 -> 395.9, session 37); before the tiled experts once its logits are in (the gate+up
// blocks resident while it routes; H100 35B-A3B Q4_K_M b1 496.7 -> 502.6, b4 even, session 59,
// where at its start measured 501.4 and, before the down kernel read ids ahead of its wait,
// -0.5 to -0.7% on the H200 in sessions 33-37). Several tokens: at its end, as measured in
// batches (bf16 b4 -3% at its start). The kernels after it read ids after their griddep_wait
// (the tiled down kernel: after the gate+up launch's, which triggers it after its own).
enum class RouteRelease { kAtEnd, kAtStart, kAfterWait };
template <int NE, RouteRelease R>
__global__ void route_kernel(const float* logits, int E, int k, bool renorm, float* weights, int32_t* ids) {
  if constexpr (R == RouteRelease::kAtStart) griddep_trigger();
  griddep_wait();  // the logits come from the kernel before
  if constexpr (R == RouteRelease::kAfterWait) griddep_trigger();
  const int64_t t = blockIdx.x;
  route_token<NE>(logits + t * E, E, k, renorm, weights + t * k, ids + t * k, int(threadIdx.x));
}

struct ExpertPtrs {
  const void* gate;
  const void* up;
  const void* down;
};

__device__ __forceinline__ bool valid_expert(int e, int E) { return e >= 0 && e < E; }

// ---------------------------------------------------------------------------------------------
// Decode
// ---------------------------------------------------------------------------------------------

// 8 consecutive weights (one 16-byte load for bf16/f16, two for f32), dotted with 8 f32 values.
template <typename W>
struct W8 {
  uint4 r{};
  __device__ __forceinline__ void load(const W* p) { r = __ldcs(reinterpret_cast<const uint4*>(p)); }
  __device__ __forceinline__ float dot(const float4& x0, const float4& x1) const {
    float f[8];
    const uint32_t u[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (std::is_same_v<W, __nv_bfloat16>) {
        f[2 * i] = __uint_as_float(u[i] << 16);
        f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
      } else {
        const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&u[i]));
        f[2 * i] = v.x;
        f[2 * i + 1] = v.y;
      }
    }
    return f[0] * x0.x + f[1] * x0.y + f[2] * x0.z + f[3] * x0.w + f[4] * x1.x + f[5] * x1.y + f[6] * x1.z +
           f[7] * x1.w;
  }
};
template <>
struct W8<float> {
  float4 a{}, b{};
  __device__ __forceinline__ void load(const float* p) {
    a = __ldcs(reinterpret_cast<const float4*>(p));
    b = __ldcs(reinterpret_cast<const float4*>(p) + 1);
  }
  __device__ __forceinline__ float dot(const float4& x0, const float4& x1) const {
    return a.x * x0.x + a.y * x0.y + a.z * x0.z + a.w * x0.w + b.x * x1.x + b.y * x1.y + b.z * x1.z + b.w * x1.w;
  }
};

template <typename W>
__device__ __forceinline__ float dot8(const W8<W>& w, const float* x) {
  return w.dot(__ldca(reinterpret_cast<const float4*>(x)), __ldca(reinterpret_cast<const float4*>(x) + 1));
}

// Loads in flight per lane and row: 8 × 16 bytes for bf16/f16 (the register budget for f32).
template <typename W>
constexpr int kUnroll = sizeof(W) == 4 ? 4 : 8;

// This lane's part of row · x over n elements (vec: n % 8 == 0 and 16-byte aligned rows).
template <typename W>
__device__ __forceinline__ float lane_dot(const W* w, const float* x, int n, bool vec, int lane) {
  float acc = 0;
  if (!vec) {
    for (int i = lane; i < n; i += 32) acc += to_f32(w[i]) * x[i];
    return acc;
  }
  constexpr int U = kUnroll<W>;
  const int nch = n / 8;
  for (int c0 = lane; c0 < nch; c0 += 32 * U) {
    W8<W> r[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (c0 + 32 * u < nch) r[u].load(w + (c0 + 32 * u) * 8);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (c0 + 32 * u < nch) acc += dot8(r[u], x + (c0 + 32 * u) * 8);
  }
  return acc;
}

// A row of n floats (n % 8 == 0) staged in shared memory for lanes that each dot 8 consecutive
// weights (chunk c = elements 8c .. 8c + 7): the chunk's halves sit apart, at 4c and n/2 + 4c,
// so a warp's float4 reads of consecutive chunks are consecutive 16-byte words (no bank
// conflicts; read in place, lane l's two float4 lie 32 bytes apart: two-way conflicts).
// float4 number q of the row goes to staged_pos(q, n).
__device__ __forceinline__ int staged_pos(int q, int n) { return (q & 1) * (n / 2) + (q >> 1) * 4; }
__device__ __forceinline__ float4 staged_lo(const float* row, int c) {
  return *reinterpret_cast<const float4*>(row + 4 * c);
}
__device__ __forceinline__ float4 staged_hi(const float* row, int c, int n) {
  return *reinterpret_cast<const float4*>(row + n / 2 + 4 * c);
}
// The block's threads copy `rows` rows of n floats (16-byte aligned) from src into dst, staged.
__device__ __forceinline__ void stage_rows(const float* src, float* dst, int rows, int n) {
  const int q4 = n / 4;
  for (int q = int(threadIdx.x); q < rows * q4; q += int(blockDim.x)) {
    const int r = q / q4, qq = q - r * q4;
    *reinterpret_cast<float4*>(dst + r * n + staged_pos(qq, n)) = __ldcg(reinterpret_cast<const float4*>(src) + q);
  }
}

// grid (ceil(I / 8), P), 256 threads: warp per intermediate row i of pair p; the gate
// and up rows stream together so 2·U loads per lane are in flight. U is half of lane_dot's so
// that a thread needs at most 64 registers: 4 blocks a SM, and a 35B-A3B token's 512 blocks run
// in one wave (with 8 loads a row, 90 registers, 2 blocks a SM: two waves, ncu). Launched with
// launch_pdl, as decode_down_kernel: the rows to read depend on ids, so nothing starts before
// griddep_wait but the blocks themselves (resident while the kernel before drains), and x, an
// earlier kernel's result, is read through coherent loads. STAGE (vec rows): the token's x is
// copied into shared memory once a block, after the block's first row loads are issued, instead
// of every warp reading it through L1.
template <typename W>
constexpr int kGateUpUnroll = kUnroll<W> / 2;
template <typename W, bool STAGE>
__global__ void __launch_bounds__(256, 4) decode_gate_up_kernel(const float* x, const int32_t* ids,
                                                             const ExpertPtrs* table, float* act, int D, int I,
                                                             int k, int E, bool vec) {
  griddep_wait();
  griddep_trigger();  // after the wait: decode_down_kernel reads ids (and sh) before its own
  const int p = blockIdx.y, i = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
  const int e = ids[p];  // the block's pair: valid or not for all its threads
  if (!valid_expert(e, E)) {
    if (lane == 0 && i < I) act[int64_t(p) * I + i] = 0;
    return;
  }
  const bool row = i < I;  // the last block's spare warps still stage x
  const W* g = static_cast<const W*>(table[e].gate) + int64_t(row ? i : 0) * D;
  const W* u = static_cast<const W*>(table[e].up) + int64_t(row ? i : 0) * D;
  const float* xt = x + int64_t(p / k) * D;
  float ag = 0, au = 0;
  if (vec) {  // STAGE only with vec
    constexpr int U = kGateUpUnroll<W>;
    const int nch = D / 8;
    W8<W> rg[U], ru[U];
    auto load = [&](int c0) {
#pragma unroll
      for (int v = 0; v < U; ++v)
        if (row && c0 + 32 * v < nch) {
          rg[v].load(g + (c0 + 32 * v) * 8);
          ru[v].load(u + (c0 + 32 * v) * 8);
        }
    };
    load(lane);
    extern __shared__ float4 gate_up_smem[];
    float* xs = reinterpret_cast<float*>(gate_up_smem);
    if constexpr (STAGE) {
      stage_rows(xt, xs, 1, D);
      __syncthreads();
    }
    for (int c0 = lane; c0 < nch; c0 += 32 * U) {
      if (c0 != lane) load(c0);
#pragma unroll
      for (int v = 0; v < U; ++v)
        if (row && c0 + 32 * v < nch) {
          const int c = c0 + 32 * v;
          float4 x0, x1;
          if constexpr (STAGE) {
            x0 = staged_lo(xs, c), x1 = staged_hi(xs, c, D);
          } else {
            const float4* xv = reinterpret_cast<const float4*>(xt + c * 8);
            x0 = __ldca(xv), x1 = __ldca(xv + 1);
          }
          ag += rg[v].dot(x0, x1);
          au += ru[v].dot(x0, x1);
        }
    }
  } else if (row) {
    for (int d = lane; d < D; d += 32) {
      ag += to_f32(g[d]) * xt[d];
      au += to_f32(u[d]) * xt[d];
    }
  }
  ag = warp_sum(ag);
  au = warp_sum(au);
  if (lane == 0 && row) act[int64_t(p) * I + i] = silu_f(ag) * au;
}

// The shared expert as one more row of every token's down sum (Backend::moe_experts_shared at
// decode): out[t] += sigmoid(logit[t]) · down · (silu(gate[t]) ⊙ up[t]). w null: none.
struct DecodeShared {
  const void* w = nullptr;                     // down [D, I], the routed experts' dtype
  const float *gate = nullptr, *up = nullptr;  // [T, I]: its gate and up projections
  const float* logit = nullptr;                // [T]: its gate logit
};

// grid (ceil(D / 8), T), 256 threads: warp per output row d of token t; the block's warps own
// their rows, so the k experts are summed in registers (j order), no atomics. KMAX (8 or 16)
// bounds the k rows held in registers (16 costs ~150 registers, half the occupancy).
// bf16 / f16 rows (vec, k ≤ KMAX) start before griddep_wait: ids come from moe_route and the
// shared expert's inputs from the router GEMV, kernels before decode_gate_up_kernel, which lets
// this launch start only after its own griddep_wait (so they are complete; read through L2),
// and only act is its output. So every expert row's first loads, and the shared expert's
// SwiGLU row (in shared memory, I floats), overlap the gate + up kernel's tail. STAGE: the
// token's k act rows are copied into shared memory once a block after the wait (staged, with
// the shared expert's row), where every warp read them from L1 / L2 itself: after the wait the
// kernel was a chain of dependent act loads in each warp (ncu: 0.23 eligible warps a scheduler).
template <typename W, int KMAX, bool STAGE>
__global__ void __launch_bounds__(256) decode_down_kernel(const float* act, const int32_t* ids, const float* weights,
                                                          const ExpertPtrs* table, DecodeShared sh, float* out, int D,
                                                          int I, int k, int E, bool vec) {
  const int t = blockIdx.y, d = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* a = act + int64_t(t) * k * I;
  float acc = 0;
  if constexpr (sizeof(W) == 2) {
    if (vec && k <= KMAX) {
      // Every row's loads (U chunks of 8 a lane: I = 512 is all of it) are issued before any is
      // reduced (a row is short, 1 KB at I = 512: one expert after the other would leave the
      // memory system mostly idle). Row KMAX is the shared expert's.
      constexpr int R = KMAX + 1, U = KMAX <= 8 ? 2 : 1;
      extern __shared__ float4 down_smem[];
      float* sh_act = reinterpret_cast<float*>(down_smem);  // [I] with a shared expert (staged with STAGE)
      float* act_s = sh_act + I;                           // STAGE: [k, I] staged
      const W* rows[R];
#pragma unroll
      for (int j = 0; j < KMAX; ++j) {
        const int e = j < k ? __ldcg(ids + t * k + j) : -1;
        rows[j] = d < D && valid_expert(e, E) ? static_cast<const W*>(table[e].down) + int64_t(d) * I : nullptr;
      }
      rows[KMAX] = sh.w && d < D ? static_cast<const W*>(sh.w) + int64_t(d) * I : nullptr;
      const int nch = I / 8;
      W8<W> r[R][U];
      auto load = [&](int c0) {
#pragma unroll
        for (int j = 0; j < R; ++j)
#pragma unroll
          for (int u = 0; u < U; ++u)
            if (rows[j] && c0 + 32 * u < nch) r[j][u].load(rows[j] + (c0 + 32 * u) * 8);
      };
      load(lane);
      if (sh.w)
        for (int i = int(threadIdx.x); i < I; i += int(blockDim.x))
          sh_act[STAGE ? staged_pos(i / 4, I) + i % 4 : i] =
              silu_f(__ldcg(sh.gate + int64_t(t) * I + i)) * __ldcg(sh.up + int64_t(t) * I + i);
      griddep_wait();  // act
      griddep_trigger();
      if constexpr (STAGE) stage_rows(a, act_s, k, I);
      __syncthreads();  // sh_act, act_s
      float part[R] = {};
      for (int c0 = lane; c0 < nch; c0 += 32 * U) {
        if (c0 != lane) load(c0);
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int c = c0 + 32 * u;
          if (c >= nch) break;
#pragma unroll
          for (int j = 0; j < KMAX; ++j)
            if (rows[j]) {
              if constexpr (STAGE)
                part[j] += r[j][u].dot(staged_lo(act_s + j * I, c), staged_hi(act_s + j * I, c, I));
              else
                part[j] += dot8(r[j][u], a + j * I + c * 8);
            }
          if (rows[KMAX]) {
            if constexpr (STAGE) {
              part[KMAX] += r[KMAX][u].dot(staged_lo(sh_act, c), staged_hi(sh_act, c, I));
            } else {
              const float4* xs = reinterpret_cast<const float4*>(sh_act + c * 8);
              part[KMAX] += r[KMAX][u].dot(xs[0], xs[1]);
            }
          }
        }
      }
      // The lane's rows weighted, then one warp sum (not one per row).
#pragma unroll
      for (int j = 0; j < KMAX; ++j)
        if (rows[j]) acc += weights[t * k + j] * part[j];
      if (rows[KMAX]) acc += sigmoid_f(sh.logit[t]) * part[KMAX];
      acc = warp_sum(acc);
      if (lane == 0 && d < D) out[int64_t(t) * D + d] = acc;
      return;
    }
  }
  griddep_wait();
  griddep_trigger();
  if (d >= D) return;
  for (int j = 0; j < k; ++j) {
    const int e = ids[t * k + j];
    if (!valid_expert(e, E)) continue;
    const W* row = static_cast<const W*>(table[e].down) + int64_t(d) * I;
    acc += weights[t * k + j] * warp_sum(lane_dot(row, a + j * I, I, vec, lane));
  }
  if (lane == 0) out[int64_t(t) * D + d] = acc;
}

// ---------------------------------------------------------------------------------------------
// Prefill: grouping by expert on the device
// ---------------------------------------------------------------------------------------------

constexpr int kGroupThreads = 1024;  // ≥ kMaxExperts: thread e owns expert e in the scan

// One block. Counting sort of the P pairs by expert: off[e] = first row of expert e,
// tile_off[e] = its first m-tile (bm rows each), row_pair[row] = pair, pair_row[pair] = row
// (-1 for an invalid id). Rows within an expert come in atomic order; that does not change
// any result (every row is computed on its own and read back through pair_row). With chunk
// (the tiled experts' grouped kernels, MoeGrouping::chunk): m-tile i's {expert, first row, rows,
// 0} for i < nchunk, rows 0 from tile_off[E] on.
__global__ void __launch_bounds__(kGroupThreads) group_kernel(const int32_t* ids, int P, int E, int bm, int32_t* off,
                                                              int32_t* tile_off, int32_t* row_pair, int32_t* pair_row,
                                                              int4* chunk, int nchunk) {
  __shared__ int cnt[kMaxExperts], cur[kMaxExperts], wc[kGroupThreads / 32], wm[kGroupThreads / 32], total;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  if (tid < E) cnt[tid] = 0;
  __syncthreads();
  for (int p = tid; p < P; p += kGroupThreads) {
    const int e = ids[p];
    if (valid_expert(e, E)) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  // Exclusive scans of the counts and of the m-tile counts: within warps by shuffles, then
  // each thread adds the totals of the warps before it.
  const int c = tid < E ? cnt[tid] : 0, m = (c + bm - 1) / bm;
  int ic = c, im = m;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int nc = __shfl_up_sync(0xffffffffu, ic, o), nm = __shfl_up_sync(0xffffffffu, im, o);
    if (lane >= o) ic += nc, im += nm;
  }
  if (lane == 31) wc[warp] = ic, wm[warp] = im;
  __syncthreads();
  for (int w = 0; w < warp; ++w) ic += wc[w], im += wm[w];
  if (tid < E) {
    off[tid] = ic - c;
    tile_off[tid] = im - m;
    cur[tid] = ic - c;
  }
  if (tid == E - 1) off[E] = ic, tile_off[E] = im, total = im;
  if (chunk && tid < E)
    for (int j = 0; j < m; ++j) chunk[im - m + j] = make_int4(tid, ic - c + bm * j, min(bm, c - bm * j), 0);
  __syncthreads();
  if (chunk)
    for (int i = total + tid; i < nchunk; i += kGroupThreads) chunk[i] = make_int4(0, 0, 0, 0);
  for (int p = tid; p < P; p += kGroupThreads) {
    const int e = ids[p];
    int r = -1;
    if (valid_expert(e, E)) {
      r = atomicAdd(&cur[e], 1);
      row_pair[r] = p;
    }
    pair_row[p] = r;
  }
}

// out[t] = Σ_j w[t, j] · y[pair_row[t·k + j]]  (j order; rows of invalid ids are skipped).
// combine4_kernel: a thread per 4 columns of a token (16-byte loads; tokens over grid.y, no
// division per element; the scalar form moved ~1.9 TB/s at 4096 tokens), the same sums.
__global__ void combine4_kernel(const float* __restrict__ y, const int32_t* __restrict__ pair_row,
                                const float* __restrict__ w, float* __restrict__ out, int64_t D, int k, int64_t T) {
  const int64_t D4 = D / 4;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y)
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < D4; c += int64_t(gridDim.x) * blockDim.x) {
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int j = 0; j < k; ++j) {
        const int64_t p = t * k + j;
        const int r = pair_row[p];
        if (r < 0) continue;
        const float wj = w[p];
        const float4 v = __ldcs(reinterpret_cast<const float4*>(y + int64_t(r) * D) + c);
        acc.x += wj * v.x;
        acc.y += wj * v.y;
        acc.z += wj * v.z;
        acc.w += wj * v.w;
      }
      reinterpret_cast<float4*>(out + t * D)[c] = acc;
    }
}
__global__ void combine_kernel(const float* y, const int32_t* pair_row, const float* w, float* out, int64_t D, int k,
                               int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / D, d = i % D;
    float acc = 0;
    for (int j = 0; j < k; ++j) {
      const int64_t p = t * k + j;
      const int r = pair_row[p];
      if (r >= 0) acc += w[p] * y[int64_t(r) * D + d];
    }
    out[i] = acc;
  }
}

// Expert offload's exact combination (moe_combine_rows): out[t] = Σ_j w[t, j] · rows[t·k + j] over
// ids in [0, E), FMAs in j order, then the shared expert's row weighted by its gate's sigmoid —
// what the tiled down kernel's block does with its rows (cuda_quant_moe_mma.cu), value for value.
__global__ void combine_rows_kernel(const float* rows, const float* w, const int32_t* ids, int E, const float* sh_row,
                                    const float* sh_logit, float* out, int64_t D, int k, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / D, d = i % D;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int64_t p = t * k + j;
      if (const int e = ids[p]; e >= 0 && e < E) acc = fmaf(w[p], rows[p * D + d], acc);
    }
    if (sh_row) acc = fmaf(sigmoid_f(sh_logit[t]), sh_row[t * D + d], acc);
    out[i] = acc;
  }
}

// xs[r] = x[row_pair[r] / k]   (the fallback path's f32 rows in expert order)
__global__ void gather_kernel(const float* x, const int32_t* row_pair, int k, int64_t D, float* xs, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    xs[i] = x[int64_t(row_pair[i / D] / k) * D + i % D];
}

int grid_stride_blocks(int64_t n) { return int(std::min<int64_t>(blocks_for(n, 256), 65535)); }

// ---------------------------------------------------------------------------------------------
// Prefill: grouped tensor-core GEMM
// ---------------------------------------------------------------------------------------------

// Block tile 128 × 128 × 32, 8 warps as 2 (m) × 4 (n), warp tile 64 × 32 = 4 × 4 mma tiles.
// A and B tiles are [128 rows][32 k] in shared memory, 64-byte rows whose four 16-byte chunks
// are XOR-swizzled by (row / 2) % 4: the 8 rows an ldmatrix reads (and the 8 a cp.async
// quarter-warp writes) then fall in 8 distinct 16-byte bank groups.
constexpr int kBM = 128, kBN = 128, kBK = 32, kStages = 4, kGemmThreads = 256;
constexpr int kTileElems = kBM * kBK;  // = kBN · kBK
constexpr int kGemmSmem = kStages * 2 * kTileElems * 2;  // bytes: 64 KB

__device__ __forceinline__ int swz(int row, int chunk) { return row * kBK + ((chunk ^ ((row >> 1) & 3)) << 3); }

struct GemmArgs {
  const void* a;            // gate+up: x rounded [T, K] (rows via row_pair / k); down: act [P, K] by row
  const int32_t* row_pair;  // [P] row → pair
  const int32_t* off;       // [E + 1] first row of each expert
  const int32_t* tile_off;  // [E + 1] first m-tile of each expert
  const ExpertPtrs* table;
  void* out;                // gate+up: act [P, N] (T); down: y [P, N] (f32)
  int E, K, N, k, n_tiles;  // N: I (gate+up) or D (down); n_tiles per m-tile
  // Quantized experts, one pass: only experts [e0, e1) run, their weights dequantized at
  // scratch + (e - e0)·3·mat (gate, up, down at 0, mat, 2·mat). Without scratch: e0 = 0, e1 = E.
  const void* scratch;
  long long mat;
  int e0, e1;
};

// Requires K % 8 == 0 and 16-byte aligned rows (chunks are all-in or all-out of K).
// gate+up: the block's 128 B rows are gate rows n0 + 8q .. +8 (even q) and up rows (odd q) for
// q = 0..15, n0 = 64 · n-tile; the warp's n8 tiles 2np (gate) and 2np+1 (up) hold the same
// intermediate elements in the same fragment slots.
template <typename T, bool kGateUp>
__global__ void __launch_bounds__(kGemmThreads, 2) grouped_gemm_kernel(const GemmArgs g) {
  extern __shared__ uint4 smem[];
  const uint32_t sA = smem_addr(smem);
  const uint32_t sB = sA + kStages * kTileElems * 2;

  const int mtile = blockIdx.x / g.n_tiles, ntile = blockIdx.x % g.n_tiles;
  if (mtile >= g.tile_off[g.E]) return;  // the grid is a bound on the m-tiles
  int lo = 0, hi = g.E;  // tile_off[lo] ≤ mtile < tile_off[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (g.tile_off[mid] <= mtile)
      lo = mid;
    else
      hi = mid;
  }
  const int e = lo;
  if (e < g.e0 || e >= g.e1) return;  // another pass's expert
  const int row0 = g.off[e] + (mtile - g.tile_off[e]) * kBM;
  const int rows = min(kBM, g.off[e + 1] - row0);
  const int n0 = ntile * (kGateUp ? kBN / 2 : kBN);
  ExpertPtrs ep;
  if (g.scratch) {
    const T* w = static_cast<const T*>(g.scratch) + (long long)(e - g.e0) * 3 * g.mat;
    ep = ExpertPtrs{w, w + g.mat, w + 2 * g.mat};
  } else {
    ep = g.table[e];
  }
  const T* A = static_cast<const T*>(g.a);

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, wm = warp / 4, wn = warp % 4;
  // Loader: thread → tile rows tid/4 and tid/4 + 64, 16-byte chunk tid % 4, for A and B.
  const int lr = tid / 4, kc = tid % 4;
  const T* a_src[2];
  const T* b_src[2];
  bool a_ok[2], b_ok[2];
  uint32_t s_off[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = lr + 64 * h;
    a_ok[h] = r < rows;
    int64_t arow = 0;
    if (a_ok[h]) arow = kGateUp ? g.row_pair[row0 + r] / g.k : row0 + r;
    a_src[h] = A + arow * g.K + kc * 8;
    int brow;
    const T* base;
    if constexpr (kGateUp) {
      const int q = r / 8;
      brow = n0 + (q / 2) * 8 + r % 8;
      base = static_cast<const T*>(q % 2 ? ep.up : ep.gate);
    } else {
      brow = n0 + r;
      base = static_cast<const T*>(ep.down);
    }
    b_ok[h] = brow < g.N;
    b_src[h] = base + int64_t(b_ok[h] ? brow : 0) * g.K + kc * 8;
    s_off[h] = uint32_t(swz(r, kc)) * 2;
  }
  auto load = [&](int stage, int kt) {
    const int k0 = kt * kBK;
    const bool k_ok = k0 + kc * 8 < g.K;
    const uint32_t st = uint32_t(stage * kTileElems * 2);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const bool av = a_ok[h] && k_ok, bv = b_ok[h] && k_ok;
      cp_async16_fill(sA + st + s_off[h], av ? a_src[h] + k0 : a_src[h], av ? 16 : 0);
      cp_async16_fill(sB + st + s_off[h], bv ? b_src[h] + k0 : b_src[h], bv ? 16 : 0);
    }
  };

  // m16 tiles of this warp that hold rows (a partial last tile of an expert skips the rest)
  const int mt_live = min(4, max(0, (rows - wm * 64 + 15) / 16));
  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[i][j][v] = 0;

  const int ktiles = (g.K + kBK - 1) / kBK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ktiles) load(s, s);
    cp_async_commit();  // empty groups keep the count uniform
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<kStages - 2>();  // tile kt has landed (this thread's part) ...
    __syncthreads();               // ... everyone's, and stage (kt - 1) % kStages is free again
    if (kt + kStages - 1 < ktiles) load((kt + kStages - 1) % kStages, kt + kStages - 1);
    cp_async_commit();
    const uint32_t st = uint32_t((kt % kStages) * kTileElems * 2);
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t b[4][2];
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        // matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
        const int n = wn * 32 + np * 16 + (lane % 8) + (lane / 16) * 8, ch = kk * 2 + (lane / 8) % 2;
        uint32_t r[4];
        ldsm_x4(r, sB + st + uint32_t(swz(n, ch)) * 2);
        b[2 * np][0] = r[0], b[2 * np][1] = r[1], b[2 * np + 1][0] = r[2], b[2 * np + 1][1] = r[3];
      }
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        if (mt < mt_live) {
          // matrices: (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15)
          const int row = wm * 64 + mt * 16 + lane % 16, ch = kk * 2 + lane / 16;
          uint32_t a[4];
          ldsm_x4(a, sA + st + uint32_t(swz(row, ch)) * 2);
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) mma16816<T>(acc[mt][nt], a, b[nt][0], b[nt][1]);
        }
      }
    }
  }
  cp_async_wait<0>();

  // Accumulator (mt, nt): rows lane/4 (+8 for v ≥ 2), columns 2·(lane%4) + v%2 of the n8 tile.
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
    if (mt >= mt_live) continue;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = wm * 64 + mt * 16 + lane / 4 + half * 8;
      if (r >= rows) continue;
      const int64_t orow = int64_t(row0 + r) * g.N;
      if constexpr (kGateUp) {
        T* act = static_cast<T*>(g.out);
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          const int i = n0 + (wn * 2 + np) * 8 + (lane % 4) * 2;
          if (i >= g.N) continue;
          const float* gt = acc[mt][2 * np] + half * 2;
          const float* up = acc[mt][2 * np + 1] + half * 2;
          *reinterpret_cast<uint32_t*>(act + orow + i) =
              pack2<T>(silu_f(gt[0]) * up[0], silu_f(gt[1]) * up[1]);
        }
      } else {
        float* y = static_cast<float*>(g.out);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int d = n0 + wn * 32 + nt * 8 + (lane % 4) * 2;
          if (d >= g.N) continue;
          *reinterpret_cast<float2*>(y + orow + d) = make_float2(acc[mt][nt][half * 2], acc[mt][nt][half * 2 + 1]);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------

const ExpertPtrs* expert_table(Ctx& c, std::span<const MlpWeights> experts) {
  std::vector<const void*> h;
  for (const MlpWeights& m : experts) h.insert(h.end(), {m.gate_proj.data, m.up_proj.data, m.down_proj.data});
  ExpertTable& t = c.expert_tables[experts.data()];
  if (t.dev && t.host == h) return static_cast<const ExpertPtrs*>(t.dev);
  if (!host_work_allowed(c)) return nullptr;
  if (t.dev) {
    CUDA_CHECK(cudaStreamSynchronize(c.stream));  // the old table may still be read
    CUDA_CHECK(cudaFree(t.dev));
    t.dev = nullptr;
  }
  CUDA_CHECK(cudaMalloc(&t.dev, h.size() * sizeof(void*)));
  CUDA_CHECK(cudaMemcpy(t.dev, h.data(), h.size() * sizeof(void*), cudaMemcpyHostToDevice));
  t.host = std::move(h);
  return static_cast<const ExpertPtrs*>(t.dev);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

struct MoeShape {
  int64_t T, D, I, E, k, P;
};

// The decode kernels stage their activations in shared memory (vec rows) up to these sizes
// (above: read through L1 by every warp). H200, 35B-A3B bf16 tg64: b1 382.5 -> 390.1, b4 619.7 ->
// 655.3 with both (gate + up alone 384.5, down alone 386.2).
constexpr int64_t kMaxStagedX = 48 * 1024;    // gate + up: the token's x
constexpr int64_t kMaxStagedAct = 48 * 1024;  // down: k act rows and the shared expert's

void run_decode(Ctx& c, const MoeShape& s, DType dt, bool vec, const Tensor& x, const Tensor& weights,
                const Tensor& ids, const ExpertPtrs* table, Tensor& out, const DecodeShared& sh = {}) {
  Temp<float> act(c, size_t(s.P * s.I));
  const dim3 g1(unsigned((s.I + 7) / 8), unsigned(s.P)), g2(unsigned((s.D + 7) / 8), unsigned(s.T));
  const int D = int(s.D), I = int(s.I), k = int(s.k), E = int(s.E);
  const bool stage_x = vec && s.D * int64_t(sizeof(float)) <= kMaxStagedX;
  const int64_t staged_act = (s.k + 1) * s.I * int64_t(sizeof(float));  // with the shared expert's row
  const bool stage_act = vec && dt != DType::F32 && staged_act <= kMaxStagedAct;
  const size_t smem_down = stage_act ? size_t(staged_act) : sh.w ? size_t(I) * sizeof(float) : 0;
  auto run = [&](auto tag) {
    using W = decltype(tag);
    launch_pdl(stage_x ? decode_gate_up_kernel<W, true> : decode_gate_up_kernel<W, false>, g1, dim3(256),
               stage_x ? size_t(D) * sizeof(float) : 0, c.stream, x.as<const float>(), ids.as<const int32_t>(), table,
               act.get(), D, I, k, E, vec);
    CUDA_LAUNCH_CHECK();
    auto down = k <= 8 ? decode_down_kernel<W, 8, false> : decode_down_kernel<W, 16, false>;
    if constexpr (sizeof(W) == 2)  // f32 rows take the plain loop, which stages nothing
      if (stage_act) down = k <= 8 ? decode_down_kernel<W, 8, true> : decode_down_kernel<W, 16, true>;
    launch_pdl(down, g2, dim3(256), smem_down, c.stream, act.get(), ids.as<const int32_t>(),
               weights.as<const float>(), table, sh, out.as<float>(), D, I, k, E, vec);
    CUDA_LAUNCH_CHECK();
  };
  if (dt == DType::BF16)
    run(__nv_bfloat16{});
  else if (dt == DType::F16)
    run(__half{});
  else
    run(float{});
}

// The grouping's device arrays: off [E+1] | tile_off [E+1] | row_pair [P] | pair_row [P], and
// with nchunk > 0 the m-tiles' records (group_kernel's chunk) in a buffer of their own (16-byte aligned).
struct Grouping {
  Temp<int32_t> buf;
  std::optional<Temp<int4>> records;
  int32_t *off, *tile_off, *row_pair, *pair_row;
  int4* chunk = nullptr;
  Grouping(Ctx& c, const MoeShape& s, const Tensor& ids, int bm, int64_t nchunk = 0)
      : buf(c, size_t(2 * (s.E + 1) + 2 * s.P)) {
    off = buf.get();
    tile_off = off + s.E + 1;
    row_pair = tile_off + s.E + 1;
    pair_row = row_pair + s.P;
    if (nchunk > 0) chunk = records.emplace(c, size_t(nchunk)).get();
    group_kernel<<<1, kGroupThreads, 0, c.stream>>>(ids.as<const int32_t>(), int(s.P), int(s.E), bm, off, tile_off,
                                                    row_pair, pair_row, chunk, int(nchunk));
    CUDA_LAUNCH_CHECK();
  }
};

void combine(Ctx& c, const MoeShape& s, const float* y, const Grouping& g, const Tensor& weights, Tensor& out) {
  const int64_t n = s.T * s.D;
  if (s.D % 4 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0 && reinterpret_cast<uintptr_t>(out.data) % 16 == 0) {
    const dim3 grid(unsigned(blocks_for(s.D / 4, 256)), unsigned(std::min<int64_t>(s.T, 65535)));
    combine4_kernel<<<grid, 256, 0, c.stream>>>(y, g.pair_row, weights.as<const float>(), out.as<float>(), s.D,
                                                int(s.k), s.T);
  } else {
    combine_kernel<<<grid_stride_blocks(n), 256, 0, c.stream>>>(y, g.pair_row, weights.as<const float>(),
                                                                out.as<float>(), s.D, int(s.k), n);
  }
  CUDA_LAUNCH_CHECK();
}

// The GEMM's 64 KB of shared memory needs an opt-in per kernel and device; done once (and
// so never while a graph is being recorded after a first plain call).
template <typename T, bool kGateUp>
void allow_gemm_smem() {
  static std::atomic<uint64_t> done{0};
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t(1) << (dev % 64);
  if (done.load() & bit) return;
  CUDA_CHECK(cudaFuncSetAttribute(grouped_gemm_kernel<T, kGateUp>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  kGemmSmem));
  done.fetch_or(bit);
}

template <typename T>
void run_prefill_mma(Ctx& c, const MoeShape& s, const Tensor& x, const Tensor& weights, const Tensor& ids,
                     const ExpertPtrs* table, Tensor& out) {
  const Grouping grp(c, s, ids, kBM);
  Temp<T> xb(c, size_t(s.T * s.D)), act(c, size_t(s.P * s.I));
  Temp<float> y(c, size_t(s.P * s.D));
  round_activations(c, x.as<const float>(), xb.get(), s.T * s.D, std::is_same_v<T, __nv_bfloat16>);
  // Every expert with n rows has ceil(n / kBM) ≤ n / kBM + 1 m-tiles, and at least one row each.
  const int64_t mtiles = std::min<int64_t>(s.P, s.P / kBM + s.E + 1);
  GemmArgs g{xb.get(), grp.row_pair, grp.off, grp.tile_off, table, act.get(),
             int(s.E), int(s.D), int(s.I), int(s.k), int((s.I + kBN / 2 - 1) / (kBN / 2)),
             nullptr, 0, 0, int(s.E)};
  QWEN36_CHECK(mtiles * std::max<int64_t>(g.n_tiles, (s.D + kBN - 1) / kBN) < (int64_t(1) << 31),
               "moe_experts: {} pairs are too many", s.P);
  allow_gemm_smem<T, true>();
  allow_gemm_smem<T, false>();
  grouped_gemm_kernel<T, true><<<unsigned(mtiles * g.n_tiles), kGemmThreads, kGemmSmem, c.stream>>>(g);
  CUDA_LAUNCH_CHECK();
  g.a = act.get();
  g.out = y.get();
  g.K = int(s.I);
  g.N = int(s.D);
  g.n_tiles = int((s.D + kBN - 1) / kBN);
  grouped_gemm_kernel<T, false><<<unsigned(mtiles * g.n_tiles), kGemmThreads, kGemmSmem, c.stream>>>(g);
  CUDA_LAUNCH_CHECK();
  combine(c, s, y.get(), grp, weights, out);
}

// Block-quantized experts, prefill: the tensor-core GEMMs above on bf16 weights, dequantized in
// passes of experts into a scratch of at most QWEN36_MOE_DEQUANT_MB (default 512) MiB; only the
// experts that received pairs are dequantized (the device grouping says which; no host sync),
// and each pass's GEMM blocks skip the other experts. (All 256 experts of the 35B in bf16 would
// take 1.5 GB.)
void run_prefill_quant(Ctx& c, const MoeShape& s, const Tensor& x, const Tensor& weights, const Tensor& ids,
                       const ExpertPtrs* table, DType gate_up, DType down, Tensor& out) {
  using T = __nv_bfloat16;
  const Grouping grp(c, s, ids, kBM);
  Temp<T> xb(c, size_t(s.T * s.D)), act(c, size_t(s.P * s.I));
  Temp<float> y(c, size_t(s.P * s.D));
  round_activations(c, x.as<const float>(), xb.get(), s.T * s.D, std::is_same_v<T, __nv_bfloat16>);
  const int64_t mat = s.I * s.D;
  int64_t budget_mb = 512;
  if (const char* v = std::getenv("QWEN36_MOE_DEQUANT_MB"); v && std::atoll(v) > 0) budget_mb = std::atoll(v);
  const int64_t per_pass = std::clamp<int64_t>((budget_mb << 20) / (3 * mat * int64_t(sizeof(T))), 1, s.E);
  Temp<T> scratch(c, size_t(per_pass * 3 * mat));
  const int64_t mtiles = std::min<int64_t>(s.P, s.P / kBM + s.E + 1);
  const int gu_tiles = int((s.I + kBN / 2 - 1) / (kBN / 2)), down_tiles = int((s.D + kBN - 1) / kBN);
  QWEN36_CHECK(mtiles * std::max(gu_tiles, down_tiles) < (int64_t(1) << 31), "moe_experts: {} pairs are too many", s.P);
  allow_gemm_smem<T, true>();
  allow_gemm_smem<T, false>();
  const void* const* qt = reinterpret_cast<const void* const*>(table);
  auto dequant = [&](DType t) { return dtype_is_tiled(t) ? quant_dequant_tiled_experts : quant_dequant_experts; };
  for (int64_t e0 = 0; e0 < s.E; e0 += per_pass) {
    const int ne = int(std::min(per_pass, s.E - e0));
    dequant(gate_up)(c, gate_up, qt, 0, 2, grp.off, int(e0), ne, s.I, s.D, scratch.get());
    dequant(down)(c, down, qt, 2, 1, grp.off, int(e0), ne, s.D, s.I, scratch.get());
    GemmArgs g{xb.get(), grp.row_pair, grp.off, grp.tile_off, table, act.get(),
               int(s.E), int(s.D), int(s.I), int(s.k), gu_tiles, scratch.get(), mat, int(e0), int(e0) + ne};
    grouped_gemm_kernel<T, true><<<unsigned(mtiles * g.n_tiles), kGemmThreads, kGemmSmem, c.stream>>>(g);
    CUDA_LAUNCH_CHECK();
    g.a = act.get();
    g.out = y.get();
    g.K = int(s.I);
    g.N = int(s.D);
    g.n_tiles = down_tiles;
    grouped_gemm_kernel<T, false><<<unsigned(mtiles * g.n_tiles), kGemmThreads, kGemmSmem, c.stream>>>(g);
    CUDA_LAUNCH_CHECK();
  }
  combine(c, s, y.get(), grp, weights, out);
}

// f32 weights, exact_matmul, odd shapes: per-expert matmul on the device-grouped rows (the
// offsets come to the host once).
void run_prefill_matmul(Ctx& c, const MoeShape& s, const Tensor& x, const Tensor& weights, const Tensor& ids,
                        std::span<const MlpWeights> experts, Tensor& out) {
  const Grouping grp(c, s, ids, 1);
  if (!host_work_allowed(c)) return;
  std::vector<int32_t> off(size_t(s.E) + 1);
  CUDA_CHECK(cudaMemcpyAsync(off.data(), grp.off, off.size() * 4, cudaMemcpyDeviceToHost, c.stream));
  CUDA_CHECK(cudaStreamSynchronize(c.stream));
  const int64_t R = off[size_t(s.E)];  // rows with a valid id
  Temp<float> xs(c, size_t(R * s.D)), gate(c, size_t(R * s.I)), up(c, size_t(R * s.I)), y(c, size_t(R * s.D));
  if (R > 0) {
    gather_kernel<<<grid_stride_blocks(R * s.D), 256, 0, c.stream>>>(x.as<const float>(), grp.row_pair, int(s.k),
                                                                     s.D, xs.get(), R * s.D);
    CUDA_LAUNCH_CHECK();
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t e = 0; e < s.E; ++e) {
        const int64_t o = off[size_t(e)], n = off[size_t(e) + 1] - o;
        if (n == 0) continue;
        const MlpWeights& m = experts[size_t(e)];
        Tensor tg(gate.get() + o * s.I, DType::F32, {n, s.I});
        if (pass == 0) {
          const Tensor tx(xs.get() + o * s.D, DType::F32, {n, s.D});
          Tensor tu(up.get() + o * s.I, DType::F32, {n, s.I});
          matmul(c, tx, m.gate_proj, tg);
          matmul(c, tx, m.up_proj, tu);
        } else {
          Tensor ty(y.get() + o * s.D, DType::F32, {n, s.D});
          matmul(c, tg, m.down_proj, ty);
        }
      }
      if (pass == 0) {
        Tensor tg(gate.get(), DType::F32, {R, s.I}), tu(up.get(), DType::F32, {R, s.I});
        swiglu(c, tg, tu, tg);
      }
    }
  }
  combine(c, s, y.get(), grp, weights, out);
}

// The per-pair quantized GEMVs over token chunks of ≤ kQuantDecodeChunk pairs; false (nothing
// launched) when a chunk's shape does not fit them.
bool quant_moe_decode_chunked(Ctx& c, const MoeShape& s, const Tensor& x, const Tensor& weights, const Tensor& ids,
                              const ExpertPtrs* table, DType gu, DType dn, Tensor& out) {
  const int64_t chunk = std::max<int64_t>(1, kQuantDecodeChunk / s.k);
  const auto table_ptrs = reinterpret_cast<const void* const*>(table);
  for (int64_t t0 = 0; t0 < s.T; t0 += chunk) {
    const int64_t n = std::min(chunk, s.T - t0);
    const Tensor xc(x.as<float>() + t0 * s.D, DType::F32, {n, s.D}),
        wc(weights.as<float>() + t0 * s.k, DType::F32, {n, s.k}), ic(ids.as<int32_t>() + t0 * s.k, DType::I32, {n, s.k});
    Tensor oc(out.as<float>() + t0 * s.D, DType::F32, {n, s.D});
    // Every chunk has the first one's shape or fewer tokens: if the first fits, all do.
    if (!quant_moe_decode(c, xc, wc, ic, table_ptrs, gu, dn, s.E, s.I, oc)) {
      QWEN36_CHECK(t0 == 0, "moe_experts: decode chunk at token {} did not fit after the first did", t0);
      return false;
    }
  }
  return true;
}

// Block-quantized experts' dtypes and shape (gate and up of one type, down of one type, e.g.
// Q4_K and Q6_K), checked across all experts; tiled: both types in the device's tiled layout.
struct QuantExperts {
  DType gu, dn;
  bool tiled;
  MoeShape s;
};
QuantExperts check_quant_experts(const Tensor& x, const Tensor& ids, std::span<const MlpWeights> experts) {
  const int64_t D = x.cols(), T = x.rows(), k = ids.cols(), E = int64_t(experts.size()),
                I = experts[0].gate_proj.rows();
  const DType gu = experts[0].gate_proj.dtype, dn = experts[0].down_proj.dtype;
  const bool tiled = dtype_is_tiled(gu) && dtype_is_tiled(dn);
  QWEN36_CHECK(tiled || (quant_supported(gu) && quant_supported(dn)),
               "moe_experts: weight dtypes {} / {} are not supported", dtype_name(gu), dtype_name(dn));
  QWEN36_CHECK(x.dtype == DType::F32 && aligned16(x.data), "moe_experts: x must be f32, 16-byte aligned");
  for (const MlpWeights& m : experts) {
    QWEN36_CHECK(m.gate_proj.dtype == gu && m.up_proj.dtype == gu && m.down_proj.dtype == dn &&
                     m.gate_proj.rows() == I && m.gate_proj.cols() == D && m.up_proj.rows() == I &&
                     m.up_proj.cols() == D && m.down_proj.rows() == D && m.down_proj.cols() == I,
                 "moe_experts: experts must share their dtypes and shapes");
    QWEN36_CHECK(aligned16(m.gate_proj.data) && aligned16(m.up_proj.data) && aligned16(m.down_proj.data),
                 "moe_experts: quantized expert weights must be 16-byte aligned");
  }
  QWEN36_CHECK(T * k < (int64_t(1) << 30) && D < (int64_t(1) << 30) && I < (int64_t(1) << 30),
               "moe_experts: x {} with top-{} is too large", x.shape_str(), k);
  return {gu, dn, tiled, MoeShape{T, D, I, E, k, T * k}};
}

// Tiled experts from kMinGroupedPairs pairs a call: grouped by expert (quant_tiled_moe_grouped),
// each expert read once per chunk of its pairs, rather than once per pair; fewer pairs share
// few experts, and the grouping, quantize and combine launches cost more than they save. H200,
// 35B-A3B Q4_K_M, one layer's experts (CudaMoe.Time35BLayerTiled), pairs / grouped (pipe form)
// µs: 8 pairs 14.9 / 27.9, 64 67.7 / 60.8, 128 124.5 / 94.4, 256 235.3 / 136.2, 512 455.9 /
// 189.6, 1,024 898.3 / 253.4; tg32 at batch 4 (32 pairs) the same either way, batch 8 +5%,
// batch 16 +15% grouped (session 47; the grid form lost up to 128 pairs and started at 192).
// QWEN36_MOE_GROUPED=on / off forces it either way (moe_grouped_select for tests).
constexpr int64_t kMinGroupedPairs = 64;
// and up to kMaxGroupedPairs (QWEN36_MOE_GROUPED_MAX_PAIRS another bound; 1024: the pair
// kernels' kMaxTiledMoePairs, as before session 47): a serving step's prefill chunk and a
// 512-token prefill take the grouped kernels instead of dequantizing every used expert to bf16
// each pass (H100, 35B-A3B Q4_K_M: pp512 5,755 -> 10,497 tok/s, bench-serve 64 streams output
// 552 -> 1,030 t/s, session 46). Expert offload then repacks the experts it streams into its
// tiled staging twin (Backend::moe_tiled_pairs), so that a streamed pass computes what the
// all-GPU run's resident experts compute (CudaOffload.ExactOffloadIsBitwiseAllGpu, 600 tokens).
constexpr int64_t kMaxGroupedPairs = 4096;
int64_t max_grouped_pairs() {
  static const int64_t n = [] {
    const char* v = std::getenv("QWEN36_MOE_GROUPED_MAX_PAIRS");
    return v && std::atoll(v) > 0 ? int64_t(std::atoll(v)) : kMaxGroupedPairs;
  }();
  return n;
}
std::atomic<int> g_grouped{-1};  // QWEN36_MOE_GROUPED (variant: on, off or auto; −1 not read yet)
bool grouped_pays(const QuantExperts& q) {
  const int mode = variant(g_grouped, "QWEN36_MOE_GROUPED", "on", "off");
  return q.tiled && (mode == kFirstForm || (mode == kAutoForm && q.s.P >= kMinGroupedPairs)) &&
         quant_tiled_moe_grouped_fits(q.gu, q.dn, q.s.D, q.s.I);
}
// rows [P, D] of the routed pairs by the grouped kernels (grouped_pays said yes).
void grouped_rows(Ctx& c, const QuantExperts& q, const Tensor& x, const Tensor& ids, const void* const* table,
                  Tensor& rows) {
  const MoeShape& s = q.s;
  // Σ_e ⌈n_e / bm⌉ ≤ ⌊P / bm⌋ + (experts with pairs)
  const int bm = moe_grouped_cols();
  const int64_t chunks = s.P / bm + std::min(s.E, s.P);
  const Grouping grp(c, s, ids, bm, chunks);
  quant_tiled_moe_grouped(c, x, ids, table, q.gu, q.dn, s.I, MoeGrouping{grp.row_pair, grp.chunk, chunks}, rows);
}

// Block-quantized experts: up to 1,024 pairs by the quantized GEMVs over the routed pairs
// (cuda_quant_matmul.cu) or, tiled, the tensor-core pair kernels (cuda_quant_moe_mma.cu), else
// the grouped GEMM on experts dequantized per pass; exact_matmul and shapes the GEMM cannot tile
// take the per-expert matmul (matmul takes tiled weights too).
void moe_experts_quant(Ctx& c, const Tensor& x, const Tensor& weights, const Tensor& ids,
                       std::span<const MlpWeights> experts, Tensor& out) {
  const QuantExperts q = check_quant_experts(x, ids, experts);
  const MoeShape& s = q.s;
  if (s.T == 0) return;
  if (c.exact_matmul) return run_prefill_matmul(c, s, x, weights, ids, experts, out);
  const ExpertPtrs* table = expert_table(c, experts);
  if (!table) return;  // recording, and the table is new: the recording is dropped anyway
  if (q.tiled) {
    const auto* tab = reinterpret_cast<const void* const*>(table);
    if (s.P <= moe_tiled_pairs() && grouped_pays(q)) {
      Temp<float> rows(c, size_t(s.P * s.D));
      Tensor rt(rows.get(), DType::F32, {s.P, s.D});
      grouped_rows(c, q, x, ids, tab, rt);
      return moe_combine_rows(c, rt, weights, ids, s.E, nullptr, nullptr, out);
    }
    if (s.P <= kMaxTiledMoePairs && quant_tiled_moe(c, x, weights, ids, tab, q.gu, q.dn, s.E, s.I, out)) return;
  } else if (s.P <= kMaxQuantDecodePairs && quant_moe_decode_chunked(c, s, x, weights, ids, table, q.gu, q.dn, out)) {
    return;
  }
  if (s.D % 8 != 0 || s.I % 8 != 0) return run_prefill_matmul(c, s, x, weights, ids, experts, out);
  const int64_t chunk = std::max<int64_t>(1, kMaxPrefillPairs / s.k);
  for (int64_t t0 = 0; t0 < s.T; t0 += chunk) {
    const int64_t n = std::min(chunk, s.T - t0);
    const MoeShape sc{n, s.D, s.I, s.E, s.k, n * s.k};
    const Tensor xc(x.as<float>() + t0 * s.D, DType::F32, {n, s.D}),
        wc(weights.as<float>() + t0 * s.k, DType::F32, {n, s.k}), ic(ids.as<int32_t>() + t0 * s.k, DType::I32, {n, s.k});
    Tensor oc(out.as<float>() + t0 * s.D, DType::F32, {n, s.D});
    run_prefill_quant(c, sc, xc, wc, ic, table, q.gu, q.dn, oc);
  }
}

}  // namespace

void moe_route(Ctx& c, const Tensor& logits, int64_t k, bool renorm, Tensor& weights, Tensor& ids) {
  const int64_t E = logits.cols(), T = logits.rows();
  QWEN36_CHECK(k > 0 && k <= E && weights.numel() == T * k && ids.numel() == T * k && ids.dtype == DType::I32,
               "moe_route: logits {} top-{} into {} / {}", logits.shape_str(), k, weights.shape_str(), ids.shape_str());
  QWEN36_CHECK(E <= kMaxExperts && k <= 32, "moe_route: top-{} of {} experts (CUDA supports ≤ {}, top-k ≤ 32)", k,
               E, kMaxExperts);
  if (T == 0) return;
  // The release goes with the experts' kernels (Ctx::route_release_early), whatever the expert count.
  using enum RouteRelease;
  const RouteRelease release = T > 1 ? kAtEnd : c.route_release_early ? kAtStart : kAfterWait;
  auto launch = [&](auto ne) {
    constexpr int NE = decltype(ne)::value;
    launch_pdl(release == kAtStart     ? route_kernel<NE, kAtStart>
               : release == kAfterWait ? route_kernel<NE, kAfterWait>
                                       : route_kernel<NE, kAtEnd>,
               dim3(unsigned(T)), dim3(32), 0, c.stream,
               logits.as<const float>(), int(E), int(k), renorm, weights.as<float>(), ids.as<int32_t>());
  };
  if (E <= 128)
    launch(std::integral_constant<int, 4>{});
  else if (E <= 256)
    launch(std::integral_constant<int, 8>{});
  else if (E <= 512)
    launch(std::integral_constant<int, 16>{});
  else
    launch(std::integral_constant<int, 32>{});
  CUDA_LAUNCH_CHECK();
  c.routed_ids = release == kAtStart ? nullptr : ids.data;
}

namespace {
// A plain launch: it starts once moe_route's kernel has ended (whatever that one releases) and
// lets no kernel after it start early, so the experts read the rewritten ids.
__global__ void local_ids_kernel(int32_t* ids, int64_t n, int e0, int count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int e = ids[i];
    ids[i] = e >= e0 && e < e0 + count ? e - e0 : -1;
  }
}
}  // namespace

void moe_local_ids(Ctx& c, Tensor& ids, int64_t e0, int64_t n) {
  QWEN36_CHECK(ids.dtype == DType::I32 && e0 >= 0 && n >= 1 && e0 + n <= kMaxExperts, "moe_local_ids: {} experts {}..+{}",
               ids.shape_str(), e0, n);
  const int64_t m = ids.numel();
  if (m == 0) return;
  local_ids_kernel<<<unsigned(std::min<int64_t>((m + 255) / 256, 1024)), 256, 0, c.stream>>>(ids.as<int32_t>(), m,
                                                                                            int(e0), int(n));
  CUDA_LAUNCH_CHECK();
}

namespace {
void check_moe_call(const Tensor& x, const Tensor& weights, const Tensor& ids, std::span<const MlpWeights> experts,
                    const Tensor& out) {
  const int64_t D = x.cols(), T = x.rows(), k = ids.cols();
  QWEN36_CHECK(out.numel() == T * D && ids.rows() == T && ids.dtype == DType::I32 && weights.numel() == T * k,
               "moe_experts: x {} weights {} ids {} out {}", x.shape_str(), weights.shape_str(), ids.shape_str(),
               out.shape_str());
  QWEN36_CHECK(!experts.empty(), "moe_experts: no experts");
  QWEN36_CHECK(int64_t(experts.size()) <= kMaxExperts, "moe_experts: {} experts (CUDA supports ≤ {})", experts.size(),
               kMaxExperts);
}

// bf16 / f16 / f32 experts (one dtype and shape, checked) and whether the 16-byte kernels take
// them (vec: x and every matrix 16-byte aligned, D and I multiples of 8).
struct DenseExperts {
  DType dt;
  MoeShape s;
  bool vec;
};
DenseExperts check_dense_experts(const Tensor& x, const Tensor& ids, std::span<const MlpWeights> experts) {
  const int64_t D = x.cols(), T = x.rows(), k = ids.cols();
  const int64_t E = int64_t(experts.size()), I = experts[0].gate_proj.rows();
  const DType dt = experts[0].gate_proj.dtype;
  check_weight_dtype(experts[0].gate_proj, "moe_experts");
  bool aligned = aligned16(x.data);
  for (const MlpWeights& m : experts) {
    QWEN36_CHECK(m.gate_proj.dtype == dt && m.up_proj.dtype == dt && m.down_proj.dtype == dt &&
                     m.gate_proj.rows() == I && m.gate_proj.cols() == D && m.up_proj.rows() == I &&
                     m.up_proj.cols() == D && m.down_proj.rows() == D && m.down_proj.cols() == I,
                 "moe_experts: experts must share one dtype and shape");
    aligned = aligned && aligned16(m.gate_proj.data) && aligned16(m.up_proj.data) && aligned16(m.down_proj.data);
  }
  QWEN36_CHECK(T * k < (int64_t(1) << 30) && D < (int64_t(1) << 30) && I < (int64_t(1) << 30),
               "moe_experts: x {} with top-{} is too large", x.shape_str(), k);
  return {dt, {T, D, I, E, k, T * k}, aligned && D % 8 == 0 && I % 8 == 0};
}

// moe_experts_shared on bf16 / f16 experts at decode: the shared expert as one more row of the
// down kernel's sums (DecodeShared), when the kernel's 16-byte path takes the routed experts
// and the shared down matrix has their dtype and shape; false (nothing launched) otherwise.
bool dense_decode_shared(Ctx& c, const Tensor& x, const Tensor& weights, const Tensor& ids,
                         std::span<const MlpWeights> experts, const SharedDown& sh, Tensor& out) {
  const DenseExperts de = check_dense_experts(x, ids, experts);
  const MoeShape& s = de.s;
  const bool shapes = sh.down.dtype == de.dt && sh.down.rows() == s.D && sh.down.cols() == s.I &&
                      aligned16(sh.down.data) && sh.gate.dtype == DType::F32 && sh.up.dtype == DType::F32 &&
                      sh.logit.dtype == DType::F32 && sh.gate.numel() == s.T * s.I && sh.up.numel() == s.T * s.I &&
                      sh.logit.numel() == s.T;
  if ((de.dt != DType::BF16 && de.dt != DType::F16) || !de.vec || !shapes || s.k > 16 || s.P > kMaxPairs ||
      s.I * int64_t(sizeof(float)) > kMaxDecodeSharedBytes)
    return false;
  if (s.T == 0) return true;
  const ExpertPtrs* table = expert_table(c, experts);
  if (!table) return true;  // recording, and the table is new: the recording is dropped anyway
  run_decode(c, s, de.dt, de.vec, x, weights, ids, table, out,
             {sh.down.data, sh.gate.as<const float>(), sh.up.as<const float>(), sh.logit.as<const float>()});
  return true;
}
}  // namespace

bool moe_experts_shared(Ctx& c, const Tensor& x, const Tensor& weights, const Tensor& ids,
                        std::span<const MlpWeights> experts, const SharedDown& sh, Tensor& out) {
  check_moe_call(x, weights, ids, experts, out);
  if (x.rows() > kMaxSharedFoldTokens) return false;
  if (!dtype_is_quantized(experts[0].gate_proj.dtype)) return dense_decode_shared(c, x, weights, ids, experts, sh, out);
  const QuantExperts q = check_quant_experts(x, ids, experts);
  if (q.s.T == 0) return true;
  if (c.exact_matmul || !q.tiled || q.s.P > kMaxTiledMoePairs) return false;
  const ExpertPtrs* table = expert_table(c, experts);
  if (!table) return true;  // recording, and the table is new: the recording is dropped anyway
  return quant_tiled_moe(c, x, weights, ids, reinterpret_cast<const void* const*>(table), q.gu, q.dn, q.s.E, q.s.I,
                         out, &sh);
}

// ---- expert offload's exact combination (Backend::moe_expert_rows, moe_shared_row, moe_combine_rows) ----

int64_t moe_row_pairs() { return kMaxTiledMoePairs; }

int64_t moe_tiled_pairs() { return std::max(kMaxTiledMoePairs, max_grouped_pairs()); }

void moe_grouped_select(const char* mode) { g_grouped.store(mode ? parse_variant(mode, "on", "off") : -1); }

bool moe_expert_rows(Ctx& c, const Tensor& x, const Tensor& ids, std::span<const MlpWeights> experts, Tensor& rows) {
  if (experts.empty() || !dtype_is_tiled(experts[0].gate_proj.dtype)) return false;
  const QuantExperts q = check_quant_experts(x, ids, experts);
  if (c.exact_matmul || !q.tiled || q.s.P > kMaxTiledMoePairs) return false;
  if (q.s.T == 0) return true;
  const ExpertPtrs* table = expert_table(c, experts);
  if (!table) return true;  // recording, and the table is new: the recording is dropped anyway
  const auto* tab = reinterpret_cast<const void* const*>(table);
  if (grouped_pays(q)) {
    QWEN36_CHECK(rows.dtype == DType::F32 && rows.numel() == q.s.P * q.s.D, "moe_expert_rows: rows {} for {} pairs of {}",
                 rows.shape_str(), q.s.P, q.s.D);
    Tensor rt(rows.data, DType::F32, {q.s.P, q.s.D});
    grouped_rows(c, q, x, ids, tab, rt);
    return true;
  }
  return quant_tiled_moe_rows(c, q.s.T, q.s.D, &x, ids, tab, q.gu, q.dn, q.s.E, q.s.I, &rows, nullptr, nullptr);
}

namespace {
// A routed matrix's type as the device holds it once tiled (tile_weights): itself if tiled
// already, its tiled type if it tiles, else F32 (none).
DType as_tiled(const Tensor& w) {
  if (dtype_is_tiled(w.dtype)) return w.dtype;
  return w.rows() % 16 == 0 && w.cols() % 256 == 0 ? quant_tiled_type(w.dtype) : DType::F32;
}
}  // namespace

// moe_experts_shared folds the shared expert for tiled experts up to kMaxSharedFoldTokens tokens
// when quant_tiled_moe takes the call: the same conditions, judged on the experts as tile_weights
// would hold them (expert offload's host experts are GGUF blocks in host memory).
bool moe_shared_row(Ctx& c, std::span<const MlpWeights> experts, int64_t k, const Tensor& sh_gate, const Tensor& sh_up,
                    const Tensor& down, Tensor& sh_row) {
  const int64_t T = sh_gate.rows();
  if (experts.empty() || T < 1 || T > kMaxSharedFoldTokens || T * k > kMaxTiledMoePairs || c.exact_matmul) return false;
  const MlpWeights& m = experts[0];
  const DType gu = as_tiled(m.gate_proj), dn = as_tiled(m.down_proj);
  const int64_t D = m.down_proj.rows(), I = m.down_proj.cols();
  if (!dtype_is_tiled(gu) || as_tiled(m.up_proj) != gu || dn != down.dtype || !quant_tiled_moe_fits(D, I, k + 1))
    return false;
  const Tensor none;
  const SharedDown sh{sh_gate, sh_up, down, none};
  return quant_tiled_moe_rows(c, T, D, nullptr, none, nullptr, gu, dn, int64_t(experts.size()), I, nullptr, &sh,
                              &sh_row);
}

void moe_combine_rows(Ctx& c, const Tensor& rows, const Tensor& weights, const Tensor& ids, int64_t E,
                      const Tensor* sh_row, const Tensor* s, Tensor& out) {
  const int64_t T = ids.rows(), k = ids.cols(), D = out.cols(), n = T * D;
  QWEN36_CHECK(rows.dtype == DType::F32 && rows.numel() == T * k * D && weights.numel() == T * k &&
                   ids.dtype == DType::I32 && out.numel() == n && (!sh_row || (s && sh_row->numel() == n && s->numel() == T)),
               "moe_combine_rows: rows {} weights {} ids {} out {}", rows.shape_str(), weights.shape_str(),
               ids.shape_str(), out.shape_str());
  if (n == 0) return;
  combine_rows_kernel<<<grid_stride_blocks(n), 256, 0, c.stream>>>(
      rows.as<const float>(), weights.as<const float>(), ids.as<const int32_t>(), int(E),
      sh_row ? sh_row->as<const float>() : nullptr, sh_row ? s->as<const float>() : nullptr, out.as<float>(), D,
      int(k), n);
  CUDA_LAUNCH_CHECK();
}

void moe_experts(Ctx& c, const Tensor& x, const Tensor& weights, const Tensor& ids, std::span<const MlpWeights> experts,
                 Tensor& out) {
  check_moe_call(x, weights, ids, experts, out);
  if (dtype_is_quantized(experts[0].gate_proj.dtype)) return moe_experts_quant(c, x, weights, ids, experts, out);
  const DenseExperts de = check_dense_experts(x, ids, experts);
  const MoeShape& s = de.s;
  const int64_t D = s.D, T = s.T, k = s.k, E = s.E, I = s.I;
  const DType dt = de.dt;
  const bool vec = de.vec;
  if (T == 0) return;
  if (s.P <= kMaxPairs) {
    const ExpertPtrs* table = expert_table(c, experts);
    if (!table) return;  // recording, and the table is new: the recording is dropped anyway
    return run_decode(c, s, dt, vec, x, weights, ids, table, out);
  }
  const bool tensor_cores = vec && !c.exact_matmul && dt != DType::F32;
  const ExpertPtrs* table = tensor_cores ? expert_table(c, experts) : nullptr;
  if (tensor_cores && !table) return;
  // Chunks of ≤ kMaxPrefillPairs pairs bound the temporaries (the f32 rows: 256 MB at the
  // 35B's 2048 columns); a chunk that large still reads each expert's weights for ~128 rows.
  const int64_t chunk = std::max<int64_t>(1, kMaxPrefillPairs / k);
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t n = std::min(chunk, T - t0);
    const MoeShape sc{n, D, I, E, k, n * k};
    const Tensor xc(x.as<float>() + t0 * D, DType::F32, {n, D}), wc(weights.as<float>() + t0 * k, DType::F32, {n, k}),
        ic(ids.as<int32_t>() + t0 * k, DType::I32, {n, k});
    Tensor oc(out.as<float>() + t0 * D, DType::F32, {n, D});
    if (!tensor_cores)
      run_prefill_matmul(c, sc, xc, wc, ic, experts, oc);
    else if (dt == DType::BF16)
      run_prefill_mma<__nv_bfloat16>(c, sc, xc, wc, ic, table, oc);
    else
      run_prefill_mma<__half>(c, sc, xc, wc, ic, table, oc);
  }
}

}  // namespace qwen36::cuda
