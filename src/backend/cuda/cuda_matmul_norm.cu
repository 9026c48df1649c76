// A layer's residual add and RMS norm computed inside the one-token GEMVs of 16-bit weights that
// read its output (Backend::add_rms_norm_matmul_multi / add_rms_norm_mlp on CUDA at T = 1): the
// quantized weights' GEMMs have done so since session 12 (cuda_quant_norm.cu); bf16 / f16 weights
// kept a norm launch before the projections of every mixer and every MoE block or MLP (79 a
// 35B-A3B decode step, ~2.7 µs each on its timeline: a latency chain, bench/RESULTS.md session 38).
//
// Every block computes x = rms_norm(y + delta) · w for itself, as add_rms_norm_vec_kernel does
// (cuda_elementwise.cu: the same float operations, the sum of squares in cuda_act_quant.cuh's
// fixed order), so x is bitwise the norm launch's, and stages it in shared memory for its warps'
// dots (lane_dot_x, XStaged: the dot's order unchanged, so the outputs are bitwise those of
// the norm launch followed by matmul_multi / matmul_swiglu). Block 0 also stores y_out and x for
// the later readers (the routed experts, the residual stream). The other blocks still read y while
// it does: y_out must be another buffer (the model's residual stream alternates two).
//
// QWEN36_NORM_GEMV16 = on (default) | small | multi | off: on takes it for every one-token bf16
// GEMV that reads a norm (the mixers' input projections, the MoE router + shared expert, the
// MLP's gate + up); small for grids of at most two blocks a SM only (the 35B-A3B's router +
// shared expert GEMV: H200, 35B-A3B bf16 tg64 b1 396.1 → 407.3), multi for every matmul_multi
// (409.3); off composes. With 8-warp blocks on cost the 27B (b1 74.5 → 71.8: every block of a
// 17408-row GEMV reading y, delta and w, 60 KB of L2 a block, at fewer resident blocks); the
// GEMVs that do not take whole rows run blocks of 16 warps (QWEN36_NORM_GEMV16_WARPS = 16, the
// default, or 8: half the blocks recompute the norm), and on is the fastest form on both models:
// H200, session 45, small / 8 → on / 16, rounds alternating, 35B-A3B bf16 tg64 b1 408.91 /
// 407.17 → 422.77 / 422.51 (+3.6%), 27B bf16 73.59 / 73.58 → 74.05 / 74.05 (+0.6%).
// bench/RESULTS.md, sessions 43-46.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_act_quant.cuh"
#include "backend/cuda/cuda_gemv.cuh"

namespace qwen36::cuda {

namespace {

enum class NormGemvMode { kOff, kSmall, kMulti, kOn };
NormGemvMode parse_mode(const char* v) {
  if (v && std::strcmp(v, "off") == 0) return NormGemvMode::kOff;
  if (v && std::strcmp(v, "multi") == 0) return NormGemvMode::kMulti;
  if (v && std::strcmp(v, "small") == 0) return NormGemvMode::kSmall;
  return NormGemvMode::kOn;
}
std::atomic<int> g_mode{-1};                  // norm_gemv_select's choice; -1: the environment's
std::atomic<long long> g_launches{0};         // norm-computing GEMV launches so far (tests)
NormGemvMode norm_gemv_mode() {
  static const NormGemvMode env = parse_mode(std::getenv("QWEN36_NORM_GEMV16"));
  const int m = g_mode.load(std::memory_order_relaxed);
  return m < 0 ? env : NormGemvMode(m);
}

// Blocks of NW warps (kGemvWarps, or 16: half the blocks recomputing the norm, QWEN36_NORM_GEMV16_WARPS;
// norm_gemv_select_warps for tests)
// hold the row in quads of 4 values, NQ a thread: K ≤ kNormMaxK (the 27B's hidden size).
constexpr int kNormMaxK = 5120;
template <int NW>
__host__ __device__ constexpr int norm_quads() { return (kNormMaxK / 4 + NW * 32 - 1) / (NW * 32); }
std::atomic<int> g_warps{0};  // norm_gemv_select_warps's choice; 0: the environment's
int norm_warps() {
  static const int w = [] {
    const char* v = std::getenv("QWEN36_NORM_GEMV16_WARPS");
    return v && std::strcmp(v, "8") == 0 ? kGemvWarps : 16;
  }();
  const int s = g_warps.load(std::memory_order_relaxed);
  return s > 0 ? s : w;
}

// Shared memory of a block: x's chunk halves (K / 8 float4 each), then the K / 32 group sums.
size_t norm_stage_bytes(int K) { return size_t(K) * sizeof(float) + size_t(K / 32) * sizeof(float); }

// This thread's quads of the norm's weight (a weight: requested before griddep_wait).
template <int NW, int NQ>
__device__ __forceinline__ void load_norm_w(const NormIn& n, int K4, float4 (&g)[NQ]) {
#pragma unroll
  for (int r = 0; r < NQ; ++r)
    if (const int id = int(threadIdx.x) + r * NW * 32; id < K4) g[r] = reinterpret_cast<const float4*>(n.w)[id];
}

// x = rms_norm(y + delta) · w into the block's shared memory (lo / hi: XStaged's halves), all
// threads of the block; `writer` also stores y_out and x. The float operations and their order
// are add_rms_norm_vec_kernel's: v = y + delta per element, each k32 group's sum of squares by
// group_ss over its octet of lanes, row_ss over the groups, then v · inv · w.
template <int NW, int NQ>
__device__ __forceinline__ void stage_norm(const NormIn& n, int K4, const float4 (&g)[NQ], float4* lo, float4* hi,
                                           float* gss, bool writer) {
  constexpr int kThreads = NW * 32;
  const float4* y = reinterpret_cast<const float4*>(n.y);
  const float4* d = reinterpret_cast<const float4*>(n.delta);
  float4 v[NQ];
#pragma unroll
  for (int r = 0; r < NQ; ++r) {
    const int id = int(threadIdx.x) + r * kThreads;
    v[r] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (id < K4) {
      const float4 a = __ldcg(y + id), b = __ldcg(d + id);
      v[r] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
      if (writer) reinterpret_cast<float4*>(n.y_out)[id] = v[r];
    }
    if (r * kThreads < K4) {  // block-uniform: every lane of a live octet shuffles
      const float s = group_ss(quad_ss(v[r]));
      if (id < K4 && (id & 7) == 0) gss[id >> 3] = s;
    }
  }
  __syncthreads();
  const float inv = 1.0f / sqrtf(row_ss(gss, K4 / 8) / float(4 * K4) + n.eps);
#pragma unroll
  for (int r = 0; r < NQ; ++r) {
    const int id = int(threadIdx.x) + r * kThreads;
    if (id >= K4) break;
    const float4 x = make_float4(v[r].x * inv * g[r].x, v[r].y * inv * g[r].y, v[r].z * inv * g[r].z,
                                 v[r].w * inv * g[r].w);
    if (writer) reinterpret_cast<float4*>(n.x)[id] = x;
    ((id & 1) ? hi : lo)[id >> 1] = x;
  }
  __syncthreads();
}

// The block's staging area and the wait its lane_dot_x runs after its first weight loads.
struct NormStage {
  float4* lo;
  float4* hi;
  float* gss;
  __device__ __forceinline__ NormStage(float4* smem, int K)
      : lo(smem), hi(smem + K / 8), gss(reinterpret_cast<float*>(smem + K / 4)) {}
  __device__ __forceinline__ XStaged x() const { return {lo, hi}; }
};

// gemv_multi_kernel at T = 1 (U loads a row in flight per lane) with the norm staged first.
// Every warp joins the norm's barriers: a warp past the last row dots the last row again and
// stores nothing.
template <typename W, int U, int NW>
__global__ void __launch_bounds__(NW * 32, NW == 16 ? 2 : 0) gemv_multi_norm_kernel(MultiRows m, NormIn n, int K) {
  extern __shared__ float4 smem[];
  griddep_trigger();
  const NormStage st(smem, K);
  const int row = int(blockIdx.x) * NW + int(threadIdx.x >> 5), lane = int(threadIdx.x & 31);
  const MultiRow mr = multi_row(m, min(row, m.total - 1));
  float4 g[norm_quads<NW>()];
  load_norm_w<NW>(n, K / 4, g);
  const W* const rows[1] = {static_cast<const W*>(mr.w) + size_t(mr.local) * size_t(K)};
  float acc[1][1] = {{0.0f}};
  lane_dot_x<W, 1, 1, U>(rows, st.x(), K, lane, acc, [&] {
    griddep_wait();
    stage_norm<NW>(n, K / 4, g, st.lo, st.hi, st.gss, blockIdx.x == 0);
  });
  const float s = warp_sum(acc[0][0]);
  if (lane == 0 && row < m.total) mr.out[mr.local] = s;
}

// gemv_swiglu_kernel at T = 1 with the norm staged first: out = silu(x · gateᵀ) * (x · upᵀ).
template <typename W, int NW>
__global__ void __launch_bounds__(NW * 32, NW == 16 ? 2 : 0)
    gemv_swiglu_norm_kernel(const W* __restrict__ wg, const W* __restrict__ wu, NormIn n, float* __restrict__ out,
                            int N, int K) {
  extern __shared__ float4 smem[];
  griddep_trigger();
  const NormStage st(smem, K);
  const int row = int(blockIdx.x) * NW + int(threadIdx.x >> 5), lane = int(threadIdx.x & 31);
  const int r = min(row, N - 1);
  float4 g[norm_quads<NW>()];
  load_norm_w<NW>(n, K / 4, g);
  const W* const rows[2] = {wg + size_t(r) * size_t(K), wu + size_t(r) * size_t(K)};
  float a[2][1] = {{0.0f}, {0.0f}};  // gate, up
  lane_dot_x<W, 1, 2, kUnroll>(rows, st.x(), K, lane, a, [&] {
    griddep_wait();
    stage_norm<NW>(n, K / 4, g, st.lo, st.hi, st.gss, blockIdx.x == 0);
  });
  const float gs = warp_sum(a[0][0]), us = warp_sum(a[1][0]);
  if (lane == 0 && row < N) out[row] = silu_f(gs) * us;
}

// The shapes every form here needs: one token, f32 rows of K for y, delta, y_out (another buffer
// than y), w and x, K a whole number of k32 groups up to kNormMaxK, 16-byte
// aligned rows.
bool norm_gemv_shapes(const Tensor& y, const Tensor& delta, const Tensor& y_out, const Tensor& w, const Tensor& x) {
  const int64_t K = x.cols();
  const Tensor* const ts[] = {&y, &delta, &y_out, &w, &x};
  for (const Tensor* t : ts)
    if (t->dtype != DType::F32 || t->numel() != K || reinterpret_cast<uintptr_t>(t->data) % 16 != 0) return false;
  return x.rows() == 1 && y_out.data != y.data && K % 32 == 0 && K <= kNormMaxK;
}

bool half_weight(DType t) { return t == DType::BF16 || t == DType::F16; }

}  // namespace

bool norm_gemv_multi(Ctx& c, const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w, float eps,
                     Tensor& x, std::span<const Tensor* const> ws, std::span<Tensor* const> outs) {
  if (norm_gemv_mode() == NormGemvMode::kOff || c.exact_matmul || ws.empty() || ws.size() > size_t(kMaxMulti) ||
      ws.size() != outs.size() || !norm_gemv_shapes(y, delta, y_out, w, x) || !half_weight(ws[0]->dtype))
    return false;
  const int64_t K = x.cols();
  MultiRows m{};
  if (!multi_rows(ws, outs, K, 1, m)) return false;
  const int64_t rows = m.total;
  // matmul_multi's choice: a grid of at most two blocks a SM takes whole rows a round.
  const bool whole_rows =
      gemv_blocks(rows) <= 2 * dev_info().sms && K % (8 * 32 * kWholeRowUnroll) == 0;
  if (!whole_rows && norm_gemv_mode() == NormGemvMode::kSmall) return false;
  g_launches.fetch_add(1, std::memory_order_relaxed);
  const int nw = whole_rows ? kGemvWarps : norm_warps();
  const dim3 grid(unsigned((rows + nw - 1) / nw)), block(unsigned(nw * 32));
  const size_t smem = norm_stage_bytes(int(K));
  const NormIn n = norm_in(y, delta, y_out, w, eps, x);
  auto launch = [&](auto wt) {
    using W = decltype(wt);
    if (whole_rows)
      launch_pdl(gemv_multi_norm_kernel<W, kWholeRowUnroll, kGemvWarps>, grid, block, smem, c.stream, m, n, int(K));
    else if (nw == 16)
      launch_pdl(gemv_multi_norm_kernel<W, kUnroll, 16>, grid, block, smem, c.stream, m, n, int(K));
    else
      launch_pdl(gemv_multi_norm_kernel<W, kUnroll, kGemvWarps>, grid, block, smem, c.stream, m, n, int(K));
  };
  if (ws[0]->dtype == DType::BF16)
    launch(__nv_bfloat16{});
  else
    launch(__half{});
  CUDA_LAUNCH_CHECK();
  return true;
}

bool norm_gemv_mlp(Ctx& c, const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w, float eps, Tensor& x,
                   const MlpWeights& mw, Tensor& gate_out, Tensor& out) {
  const Tensor &gate = mw.gate_proj, &up = mw.up_proj;
  const int64_t K = x.cols(), N = gate.rows();
  if (norm_gemv_mode() != NormGemvMode::kOn || c.exact_matmul || !norm_gemv_shapes(y, delta, y_out, w, x) ||
      !half_weight(gate.dtype) || up.dtype != gate.dtype || gate.cols() != K || up.rows() != N || up.cols() != K ||
      gate_out.dtype != DType::F32 || gate_out.numel() != N || N >= (int64_t(1) << 31))
    return false;
  const int nw = norm_warps();
  const dim3 grid(unsigned((N + nw - 1) / nw)), block(unsigned(nw * 32));
  const size_t smem = norm_stage_bytes(int(K));
  const NormIn n = norm_in(y, delta, y_out, w, eps, x);
  g_launches.fetch_add(1, std::memory_order_relaxed);
  auto launch = [&](auto wt) {
    using W = decltype(wt);
    const W *g = gate.as<const W>(), *u = up.as<const W>();
    if (nw == 16)
      launch_pdl(gemv_swiglu_norm_kernel<W, 16>, grid, block, smem, c.stream, g, u, n, gate_out.as<float>(), int(N),
                 int(K));
    else
      launch_pdl(gemv_swiglu_norm_kernel<W, kGemvWarps>, grid, block, smem, c.stream, g, u, n, gate_out.as<float>(),
                 int(N), int(K));
  };
  if (gate.dtype == DType::BF16)
    launch(__nv_bfloat16{});
  else
    launch(__half{});
  CUDA_LAUNCH_CHECK();
  matmul(c, gate_out, mw.down_proj, out);
  return true;
}

// Tests: QWEN36_NORM_GEMV16's choice for this process ("off" | "small" | "multi" | "on"; null:
// the environment's again), and the norm-computing launches made so far.
void norm_gemv_select(const char* mode) { g_mode.store(mode ? int(parse_mode(mode)) : -1); }
// The same for QWEN36_NORM_GEMV16_WARPS (8 or 16; 0: the environment's again).
void norm_gemv_select_warps(int warps) { g_warps.store(warps == 8 || warps == 16 ? warps : 0); }
long long norm_gemv_launches() { return g_launches.load(); }

}  // namespace qwen36::cuda
