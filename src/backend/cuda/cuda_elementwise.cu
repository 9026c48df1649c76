// Embedding, RMSNorm variants, elementwise ops, column/row copies, q/gate split and RoPE on
// the GPU. CPU twins: backend/cpu/cpu_elementwise.cpp and cpu_attention.cpp.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "backend/cuda/cuda_act_quant.cuh"
#include "backend/cuda/cuda_ops.cuh"

namespace qwen36::cuda {

namespace {

void check_f32(const Tensor& t, const char* what) {
  QWEN36_CHECK(t.dtype == DType::F32, "{}: expected f32, got {}", what, t.shape_str());
}
void check_same(const Tensor& a, const Tensor& b, const char* what) {
  QWEN36_CHECK(a.numel() == b.numel(), "{}: {} vs {}", what, a.shape_str(), b.shape_str());
}
int grid_for(int64_t n) { return int(std::min<int64_t>(blocks_for(n, 256), 65535 * 8)); }

#define QWEN36_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

// Four floats rounded to bf16 as one 8-byte word (the layout of 4 consecutive bf16).
__device__ __forceinline__ uint2 pack_bf16x4(float4 v) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
  return make_uint2(reinterpret_cast<const uint32_t&>(lo), reinterpret_cast<const uint32_t&>(hi));
}
// x ⊙ sigmoid(g), lane by lane (sigmoid_mul's float operations).
__device__ __forceinline__ float4 sigmoid_scaled(float4 x, float4 g) {
  return make_float4(x.x * sigmoid_f(g.x), x.y * sigmoid_f(g.y), x.z * sigmoid_f(g.z), x.w * sigmoid_f(g.w));
}

__global__ void embed_kernel(const void* table, DType dt, const int32_t* ids, float* out, int64_t D) {
  const int64_t row = ids[blockIdx.x];
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
    out[int64_t(blockIdx.x) * D + d] = load_any(table, row * D + d, dt);
}

// Block reduction of a sum (blockDim a multiple of 32, ≤ 1024).
__device__ float block_sum(float v) {
  __shared__ float part[32];
  v = warp_sum(v);
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) part[w] = v;
  __syncthreads();
  float s = lane < nw ? part[lane] : 0.0f;
  return warp_sum(s);
}

// A block per row. A thread's first kNormPer values of x (and of w, a weight, requested before
// griddep_wait) are loaded together into registers: in decode (one row: the first layer's and the
// final norm) the kernel is pure latency, and a loop of dependent loads, two passes over x, took
// ~8.5 µs on the H200. Each thread still adds its squares in index order (the zeros past D add
// nothing), so the values are those of that loop bitwise.
constexpr int kNormPer = 8;  // norm_threads: D / 8 threads, so every value up to D = 8192
template <bool Gated>
__global__ void rms_norm_kernel(const float* x, const float* z, const float* w, float eps, float* out, int64_t D) {
  griddep_trigger();  // the GEMV after a norm may start streaming its weights
  const int64_t nt = blockDim.x, tid = threadIdx.x;
  float wv[kNormPer], v[kNormPer];
#pragma unroll
  for (int r = 0; r < kNormPer; ++r) wv[r] = tid + r * nt < D ? w[tid + r * nt] : 0.0f;
  griddep_wait();  // inputs come from the kernel before (launch_pdl)
  const float* xr = x + int64_t(blockIdx.x) * D;
#pragma unroll
  for (int r = 0; r < kNormPer; ++r) v[r] = tid + r * nt < D ? xr[tid + r * nt] : 0.0f;
  float ss = 0;
#pragma unroll
  for (int r = 0; r < kNormPer; ++r) ss += v[r] * v[r];
  for (int64_t i = tid + kNormPer * nt; i < D; i += nt) ss += xr[i] * xr[i];  // rows past kNormPer · threads
  ss = block_sum(ss);
  const float inv = 1.0f / sqrtf(ss / float(D) + eps);
  float* o = out + int64_t(blockIdx.x) * D;
  const float* zr = Gated ? z + int64_t(blockIdx.x) * D : nullptr;
  auto put = [&](int64_t i, float xi, float wi) {
    if constexpr (Gated)
      o[i] = wi * (xi * inv) * silu_f(zr[i]);
    else
      o[i] = xi * inv * wi;
  };
#pragma unroll
  for (int r = 0; r < kNormPer; ++r)
    if (tid + r * nt < D) put(tid + r * nt, v[r], wv[r]);
  for (int64_t i = tid + kNormPer * nt; i < D; i += nt) put(i, xr[i], w[i]);
}

// Short rows (the per-head norms: q/k over head_dim, the DeltaNet output over dv; D ≤ 512):
// a warp per row, 8 rows per block. A block per row would be a 32-thread block each, ~200k
// of them in a 4096-token prefill, and the block scheduler, not memory, sets the pace.
constexpr int kRowsPerBlock = 8;
// O: float, or bf16 where the rows feed a prefill GEMM (gated_rms_norm_half).
template <bool Gated, typename O = float>
__global__ void rms_norm_rows_kernel(const float* x, const float* z, const float* w, float eps, O* out, int64_t D,
                                     int64_t R) {
  griddep_trigger();
  griddep_wait();  // inputs come from the kernel before (launch_pdl)
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= R) return;
  const float* xr = x + row * D;
  float ss = 0;
  for (int64_t i = lane; i < D; i += 32) ss += xr[i] * xr[i];
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / float(D) + eps);
  O* o = out + row * D;
  for (int64_t i = lane; i < D; i += 32) {
    float v;
    if constexpr (Gated)
      v = w[i] * (xr[i] * inv) * silu_f(z[row * D + i]);
    else
      v = xr[i] * inv * w[i];
    if constexpr (std::is_same_v<O, float>)
      o[i] = v;
    else
      o[i] = __float2bfloat16_rn(v);
  }
}

// y += delta, then out = rms_norm(y) · w: the residual add and the next layer's norm read
// the stream once.
__global__ void add_rms_norm_kernel(float* y, const float* delta, const float* w, float eps, float* out,
                                    int64_t D) {
  griddep_trigger();
  griddep_wait();  // inputs come from the kernel before (launch_pdl)
  float* yr = y + int64_t(blockIdx.x) * D;
  const float* dr = delta + int64_t(blockIdx.x) * D;
  float ss = 0;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    const float v = yr[i] + dr[i];
    yr[i] = v;
    ss += v * v;
  }
  ss = block_sum(ss);
  const float inv = 1.0f / sqrtf(ss / float(D) + eps);
  float* o = out + int64_t(blockIdx.x) * D;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) o[i] = yr[i] * inv * w[i];
}

// The same with each thread's share of the row held in registers as float4 (D % 4 == 0,
// D ≤ 4 · kVec · blockDim): one read of y and delta, one write of y_out (y itself, or the residual
// stream's other buffer) and out, no second pass over memory — in decode this kernel is pure
// latency, once per layer and half-layer. The sum of squares takes the fixed order of
// cuda_act_quant.cuh's row_ss: the one-token GEMMs that compute this norm themselves
// (cuda_quant_mma.cu, NormIn) get the same x bitwise.
constexpr int kVec = 4;
constexpr int kVecMaxGroups = 4 * kVec * 1024 / 32;  // k32 groups of the longest row
// With an ActOut, the normalised row is also quantized for the tiled int8 GEMM that reads it next
// (the codes and scales quantize_act would store from `out`: the same float values, quantized by
// the same quantize_quad): the row is token blockIdx.x of act.T.
// With kHalf, it is also written rounded to bf16 into xh (rows D apart) for a prefill GEMM.
struct ActOut {
  uint8_t* xb = nullptr;
  float* xf = nullptr;
  int* xi = nullptr;
  int T = 0, NT = 1;
  __nv_bfloat16* xh = nullptr;
  uint4* xhf = nullptr;  // beyond 16 tokens: the bf16 GEMM's B fragments too (ActLayout::o_xh)
  int np = 0;            // … or the warpgroup GEMM's slabs of np tokens (ActLayout::np)
};
template <bool kQuant, bool kHalf = false>
__global__ void add_rms_norm_vec_kernel(const float4* y, const float4* delta, float4* y_out, const float4* w, float eps,
                                        float4* out, int64_t D4, ActOut act) {
  __shared__ float gss[kVecMaxGroups];
  griddep_trigger();
  // The weight depends on no kernel: loaded before the wait, so no round trip follows the sum.
  float4 v[kVec], g[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int64_t i = threadIdx.x + int64_t(j) * blockDim.x;
    if (i < D4) g[j] = w[i];
  }
  griddep_wait();  // inputs come from the kernel before (launch_pdl)
  const float4* yr = y + int64_t(blockIdx.x) * D4;
  const float4* dr = delta + int64_t(blockIdx.x) * D4;
  float4* yo = y_out + int64_t(blockIdx.x) * D4;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int64_t i = threadIdx.x + int64_t(j) * blockDim.x;
    v[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < D4) {
      const float4 a = yr[i], b = dr[i];
      v[j] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
      yo[i] = v[j];
    }
    if (j * int64_t(blockDim.x) < D4) {  // block-uniform: every lane of a live octet shuffles
      const float s = group_ss(quad_ss(v[j]));
      if (i < D4 && (i & 7) == 0) gss[i >> 3] = s;
    }
  }
  __syncthreads();
  const float inv = 1.0f / sqrtf(row_ss(gss, int((D4 + 7) / 8)) / float(4 * D4) + eps);
  float4* o = out + int64_t(blockIdx.x) * D4;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int64_t i = threadIdx.x + int64_t(j) * blockDim.x;
    float4 r = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < D4) {
      r = make_float4(v[j].x * inv * g[j].x, v[j].y * inv * g[j].y, v[j].z * inv * g[j].z, v[j].w * inv * g[j].w);
      o[i] = r;
      if constexpr (kHalf) reinterpret_cast<uint2*>(act.xh + int64_t(blockIdx.x) * 4 * D4)[i] = pack_bf16x4(r);
    }
    if constexpr (kQuant) {  // every lane: quantize_quad reduces over 8 lanes (D4 % 8 == 0: whole groups)
      const QuantQuad qq = quantize_quad(r);
      if (i < D4) {
        store_act_quad(act.xb, act.xf, act.xi, act.NT, int(blockIdx.x), i >> 3, int(i & 7), qq);
        if (act.xhf) store_act_half(act.xhf, act.NT, act.np, int(blockIdx.x), i >> 3, int(i & 7), r);
      }
    }
  }
  // The padding tokens' zero codes, spread over the blocks (token T + blockIdx.x + k·T). At T = 1
  // none: the GEMM's T = 1 kernels read token 0 only, and any kernel's padding columns are never
  // stored, and the one block of a decode step's norm is on the step's critical path.
  if constexpr (kQuant) {
    if (act.T == 1) return;
    const QuantQuad zero{0.0f, 0u, 0, 0};
    for (int c = act.T + int(blockIdx.x); c < 8 * act.NT; c += act.T)
      for (int64_t i = threadIdx.x; i < D4; i += blockDim.x) {
        store_act_quad(act.xb, act.xf, act.xi, act.NT, c, i >> 3, int(i & 7), zero);
        if (act.xhf)
          store_act_half(act.xhf, act.NT, act.np, c, i >> 3, int(i & 7), make_float4(0.0f, 0.0f, 0.0f, 0.0f));
      }
  }
}

__global__ void add_kernel(float* y, const float* x, int64_t n) {
  QWEN36_GRID_STRIDE(i, n) y[i] += x[i];
}
__global__ void swiglu_kernel(const float* g, const float* u, float* o, int64_t n) {
  griddep_trigger();
  griddep_wait();
  QWEN36_GRID_STRIDE(i, n) o[i] = silu_f(g[i]) * u[i];
}
// late: the dependent launch is released after the work, not at the start (release_late_before;
// Backend::gated_matmul: the attention output projection after it).
__global__ void sigmoid_mul_kernel(float* x, const float* g, int64_t n, bool late) {
  if (!late) griddep_trigger();
  griddep_wait();
  QWEN36_GRID_STRIDE(i, n) x[i] *= sigmoid_f(g[i]);
  if (late) griddep_trigger();
}
// x ⊙ sigmoid(gate) rounded to bf16 into out (n4 float4s in, 4 bf16 each out): the attention
// gate of a prefill feeding its output projection's GEMM (gated_matmul_prefill), the float
// operations of sigmoid_mul's.
__global__ void sigmoid_mul_half4_kernel(const float4* x, const float4* g, uint2* out, int64_t n4) {
  griddep_trigger();
  griddep_wait();
  QWEN36_GRID_STRIDE(i, n4) out[i] = pack_bf16x4(sigmoid_scaled(x[i], g[i]));
}
// The same as float4s (n4 = n / 4 whole ones): a prefill's gate (27B, 4096 × 6144) at the
// copy bandwidth where the scalar form took 2.3 times as long.
__global__ void sigmoid_mul4_kernel(float4* x, const float4* g, int64_t n4, bool late) {
  if (!late) griddep_trigger();
  griddep_wait();
  QWEN36_GRID_STRIDE(i, n4) x[i] = sigmoid_scaled(x[i], g[i]);
  if (late) griddep_trigger();
}
// Row-wise kernels index (row, column) from a 2-D grid, not from a flat index: a 64-bit
// division per element made a prefill's column copies compute-bound (~80 µs for 4096 rows).
dim3 row_grid(int64_t rows, int64_t cols) {
  return dim3(unsigned(std::max(1, blocks_for(cols, 256))), unsigned(std::clamp<int64_t>(rows, 1, 65535)));
}
#define QWEN36_ROWS_COLS(r, c, rows, cols)                                         \
  for (int64_t r = blockIdx.y; r < (rows); r += gridDim.y)                         \
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < (cols); \
         c += int64_t(gridDim.x) * blockDim.x)

__global__ void add_sigmoid_scaled_kernel(float* y, const float* x, const float* s, int64_t D, int64_t rows) {
  griddep_trigger();
  griddep_wait();
  QWEN36_ROWS_COLS(r, c, rows, D) y[r * D + c] += sigmoid_f(s[r]) * x[r * D + c];
}
__global__ void copy_cols_kernel(const float* src, int64_t sc, int64_t s0, float* dst, int64_t dc, int64_t d0,
                                 int64_t width, int64_t rows) {
  QWEN36_ROWS_COLS(r, c, rows, width) dst[r * dc + d0 + c] = src[r * sc + s0 + c];
}
// The same in 16-byte units (every offset and stride a multiple of 4 floats), several rows
// per block: a prefill splits ~0.5 GB of projections into q/k/v/z this way per layer.
__global__ void copy_cols4_kernel(const float4* src, int64_t sc, int64_t s0, float4* dst, int64_t dc, int64_t d0,
                                  int64_t width, int64_t rows) {
  QWEN36_ROWS_COLS(r, c, rows, width) dst[r * dc + d0 + c] = src[r * sc + s0 + c];
}
// A row's three column blocks [0, w0), [w0, w0 + w1), [w0 + w1, sc) into d0, d1, d2 (16-byte units).
__global__ void split_cols3_kernel(const float4* src, int64_t sc, float4* d0, float4* d1, float4* d2, int64_t w0,
                                   int64_t w1, int64_t rows) {
  const int64_t w2 = sc - w0 - w1;
  QWEN36_ROWS_COLS(r, c, rows, sc) {
    const float4 v = src[r * sc + c];
    if (c < w0)
      d0[r * w0 + c] = v;
    else if (c < w0 + w1)
      d1[r * w1 + c - w0] = v;
    else
      d2[r * w2 + c - w0 - w1] = v;
  }
}
__global__ void get_rows_kernel(const float* src, int64_t D, const int32_t* rows, float* dst, int64_t n) {
  QWEN36_ROWS_COLS(r, c, n, D) dst[r * D + c] = src[int64_t(rows[r]) * D + c];
}
__global__ void split_q_gate_kernel(const float* qg, float* q, float* gate, int64_t hd, int64_t rows) {
  griddep_trigger();
  griddep_wait();
  QWEN36_ROWS_COLS(r, c, rows, hd) {
    q[r * hd + c] = qg[r * 2 * hd + c];
    gate[r * hd + c] = qg[r * 2 * hd + hd + c];
  }
}
// One thread per (token, head, pair i < half).
__global__ void rope_kernel(float* x, const int32_t* pos, const float* inv_freq, int64_t heads, int64_t hd,
                            int64_t half, int64_t n) {
  griddep_trigger();
  griddep_wait();
  QWEN36_GRID_STRIDE(idx, n) {
    const int64_t i = idx % half, th = idx / half, t = th / heads;
    const int32_t p = pos[t];
    if (p < 0) continue;
    const float f = float(p) * inv_freq[i];
    const float cs = cosf(f), sn = sinf(f);
    float* v = x + th * hd;
    const float a = v[i], b = v[i + half];
    v[i] = a * cs - b * sn;
    v[i + half] = b * cs + a * sn;
  }
}

// The (token, head) row of q (rows < T · nh) or k a warp of the q / k kernels below takes: its
// token, output o, input x (the q half of qg, or o in place) and norm weight w; live false past
// the rows.
struct QkRow {
  bool live, is_q;
  int64_t row, t;
  float* o;
  const float* x;
  const float* w;
  __device__ QkRow(const float* qg, float* q, float* k, const float* qw, const float* kw, int64_t T, int nh, int nkv,
                   int hd, bool gated) {
    row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
    const int64_t nq = T * nh;
    live = row < nq + T * nkv;
    is_q = row < nq;
    t = is_q ? row / nh : (row - nq) / nkv;
    o = is_q ? q + row * hd : k + (row - nq) * hd;
    x = is_q && gated ? qg + row * 2 * hd : o;
    w = is_q ? qw : kw;
  }
};

// Backend::qk_norm_rope in one launch: a warp per (token, head) row of q (the q halves of qg, or
// q in place) and then of k, kRowsPerBlock rows a block. The norm is rms_norm_rows_kernel's (the
// same lane order and warp sum), RoPE rope_kernel's on the row just written (the pair (i, i + half)
// of lane i lives in other lanes' stores: __syncwarp orders them), the gate halves copied as
// split_q_gate_kernel copies them: bitwise the composed ops where those take the rows kernel (more
// than one row). A decode step's attention layer: 1 launch instead of 5.
__global__ void qk_norm_rope_kernel(const float* qg, float* q, float* gate, float* k, const float* qw, const float* kw,
                                    float eps, const int32_t* pos, const float* inv_freq, int64_t T, int nh, int nkv,
                                    int hd, int half, bool gated) {
  griddep_trigger();
  griddep_wait();  // inputs come from the kernel before (launch_pdl)
  const QkRow r(qg, q, k, qw, kw, T, nh, nkv, hd, gated);
  const int lane = int(threadIdx.x & 31);
  if (!r.live) return;
  const int64_t row = r.row, t = r.t;
  const bool is_q = r.is_q;
  float* o = r.o;
  const float* x = r.x;
  const float* w = r.w;
  if (is_q && gated)
    for (int i = lane; i < hd; i += 32) gate[row * hd + i] = x[hd + i];
  float ss = 0;
  for (int i = lane; i < hd; i += 32) ss += x[i] * x[i];
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / float(hd) + eps);
  for (int i = lane; i < hd; i += 32) o[i] = x[i] * inv * w[i];
  const int32_t p = half > 0 ? pos[t] : -1;
  if (p < 0) return;
  __syncwarp();
  for (int i = lane; i < half; i += 32) {
    const float f = float(p) * inv_freq[i];
    const float cs = cosf(f), sn = sinf(f);
    const float a = o[i], b = o[i + half];
    o[i] = a * cs - b * sn;
    o[i + half] = b * cs + a * sn;
  }
}

// qk_norm_rope_kernel for head_dim HD and HALF rotated pairs (a multiple of 32; the Qwen3.6
// attention's 256 and 32): lane l holds its row's values l + 32 j in registers, and RoPE's pair
// (i, i + HALF) lies in one lane (j, j + HALF / 32), so x is loaded once and o stored once, with no
// store, __syncwarp and reload of o between the norm and the rotation (H200, a decode step's
// attention layer: qk_norm_rope_kernel 5.95 µs effective). The same float operations in the same
// order: bitwise that kernel's values.
template <int HD, int HALF>
__global__ void qk_norm_rope_regs_kernel(const float* qg, float* q, float* gate, float* k, const float* qw,
                                         const float* kw, float eps, const int32_t* pos, const float* inv_freq,
                                         int64_t T, int nh, int nkv, bool gated) {
  static_assert(HD % 32 == 0 && HALF % 32 == 0 && HALF > 0 && 2 * HALF <= HD, "pairs within a lane");
  constexpr int NV = HD / 32, HJ = HALF / 32;
  griddep_trigger();
  griddep_wait();  // inputs come from the kernel before (launch_pdl)
  const QkRow r(qg, q, k, qw, kw, T, nh, nkv, HD, gated);
  const int lane = int(threadIdx.x & 31);
  if (!r.live) return;
  const int64_t row = r.row;
  float* o = r.o;
  const float* x = r.x;
  const float* w = r.w;
  float v[NV];
#pragma unroll
  for (int j = 0; j < NV; ++j) v[j] = x[lane + 32 * j];
  if (r.is_q && gated) {
    float g[NV];
#pragma unroll
    for (int j = 0; j < NV; ++j) g[j] = x[HD + lane + 32 * j];
#pragma unroll
    for (int j = 0; j < NV; ++j) gate[row * HD + lane + 32 * j] = g[j];
  }
  const int32_t p = pos[r.t];
  float ss = 0;
#pragma unroll
  for (int j = 0; j < NV; ++j) ss += v[j] * v[j];
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / float(HD) + eps);
#pragma unroll
  for (int j = 0; j < NV; ++j) v[j] = v[j] * inv * w[lane + 32 * j];
  if (p >= 0) {
#pragma unroll
    for (int j = 0; j < HJ; ++j) {
      const float f = float(p) * inv_freq[lane + 32 * j];
      const float cs = cosf(f), sn = sinf(f);
      const float a = v[j], b = v[j + HJ];
      v[j] = a * cs - b * sn;
      v[j + HJ] = b * cs + a * sn;
    }
  }
#pragma unroll
  for (int j = 0; j < NV; ++j) o[lane + 32 * j] = v[j];
}

// About 8 elements per thread, up to 1024 threads: a decode step's few long rows (hidden
// size 5120) spread over a whole block instead of 256 threads looping.
int norm_threads(int64_t D) { return int(std::clamp<int64_t>((D / 8 + 31) / 32 * 32, 32, 1024)); }

}  // namespace

void embed(Ctx& c, const Tensor& table, std::span<const int32_t> ids, Tensor& out) {
  for (int32_t id : ids)
    QWEN36_CHECK(id >= 0 && id < table.rows(), "token id {} is outside the vocabulary (0..{})", id, table.rows() - 1);
  if (ids.empty()) return embed_rows(c, table, nullptr, 0, out);
  Temp<int32_t> tmp(c, 0);
  const int32_t* dids = dev_i32(c, ids, tmp);
  if (!dids) return;  // recording a graph that needed an upload: the recording is dropped
  embed_rows(c, table, dids, int64_t(ids.size()), out);
}

void embed_rows(Ctx& c, const Tensor& table, const int32_t* ids, int64_t n, Tensor& out) {
  if (dtype_is_quantized(table.dtype)) return quant_embed_rows(c, table, ids, n, out);  // cuda_quant_matmul.cu
  check_weight_dtype(table, "embed");
  const int64_t D = table.cols();
  check_f32(out, "embed");
  QWEN36_CHECK(out.numel() == n * D, "embed: out {} for {} ids of width {}", out.shape_str(), n, D);
  if (n == 0) return;
  embed_kernel<<<unsigned(n), 256, 0, c.stream>>>(table.data, table.dtype, ids, out.as<float>(), D);
  CUDA_LAUNCH_CHECK();
}

void rms_norm(Ctx& c, const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  const int64_t D = w.numel(), R = x.numel() / D;
  check_f32(x, "rms_norm");
  check_f32(w, "rms_norm weight");
  check_same(x, out, "rms_norm");
  QWEN36_CHECK(x.numel() % D == 0, "rms_norm: {} is not rows of {}", x.shape_str(), D);
  if (R == 0) return;
  if (D <= 512 && R > 1)
    launch_pdl(rms_norm_rows_kernel<false>, dim3(unsigned((R + kRowsPerBlock - 1) / kRowsPerBlock)), dim3(32 * kRowsPerBlock), 0,
               c.stream, x.as<const float>(), nullptr, w.as<const float>(), eps, out.as<float>(), D, R);
  else
    launch_pdl(rms_norm_kernel<false>, dim3(unsigned(R)), dim3(unsigned(norm_threads(D))), 0, c.stream, x.as<const float>(),
               nullptr, w.as<const float>(), eps, out.as<float>(), D);
  CUDA_LAUNCH_CHECK();
}

void gated_rms_norm(Ctx& c, const Tensor& x, const Tensor& z, const Tensor& w, float eps, Tensor& out) {
  const int64_t D = w.numel(), R = x.numel() / D;
  check_f32(x, "gated_rms_norm");
  check_same(x, z, "gated_rms_norm gate");
  check_same(x, out, "gated_rms_norm");
  if (R == 0) return;
  if (D <= 512 && R > 1)
    launch_pdl(rms_norm_rows_kernel<true>, dim3(unsigned((R + kRowsPerBlock - 1) / kRowsPerBlock)), dim3(32 * kRowsPerBlock), 0,
               c.stream, x.as<const float>(), z.as<const float>(), w.as<const float>(), eps, out.as<float>(), D, R);
  else
    launch_pdl(rms_norm_kernel<true>, dim3(unsigned(R)), dim3(unsigned(norm_threads(D))), 0, c.stream, x.as<const float>(),
               z.as<const float>(), w.as<const float>(), eps, out.as<float>(), D);
  CUDA_LAUNCH_CHECK();
}

bool gated_rms_norm_half(Ctx& c, const Tensor& x, const Tensor& z, const Tensor& w, float eps, __nv_bfloat16* out) {
  const int64_t D = w.numel(), R = D ? x.numel() / D : 0;
  check_f32(x, "gated_rms_norm");
  check_same(x, z, "gated_rms_norm gate");
  if (D > 512 || R < 2 || x.numel() != R * D) return false;  // the rows kernel's shapes
  launch_pdl(rms_norm_rows_kernel<true, __nv_bfloat16>, dim3(unsigned((R + kRowsPerBlock - 1) / kRowsPerBlock)),
             dim3(32 * kRowsPerBlock), 0, c.stream, x.as<const float>(), z.as<const float>(), w.as<const float>(), eps,
             out, D, R);
  CUDA_LAUNCH_CHECK();
  return true;
}

bool sigmoid_mul_half(Ctx& c, const Tensor& x, const Tensor& gate, __nv_bfloat16* out) {
  check_same(x, gate, "sigmoid_mul");
  const int64_t n = x.numel();
  if (n % 4 != 0 || (reinterpret_cast<uintptr_t>(x.data) | reinterpret_cast<uintptr_t>(gate.data) |
                     reinterpret_cast<uintptr_t>(out)) % 16 != 0)
    return false;
  if (n == 0) return true;
  launch_pdl(sigmoid_mul_half4_kernel, dim3(grid_for(n / 4)), dim3(256), 0, c.stream, x.as<const float4>(),
             gate.as<const float4>(), reinterpret_cast<uint2*>(out), n / 4);
  CUDA_LAUNCH_CHECK();
  return true;
}

void add_rms_norm(Ctx& c, Tensor& y, const Tensor& delta, const Tensor& w, float eps, Tensor& out) {
  add_rms_norm_quant(c, y, delta, y, w, eps, out, nullptr);
}

namespace {
// add_rms_norm_quant and add_rms_norm_half: out also quantized into act, or rounded into xh.
bool add_rms_norm_with(Ctx& c, const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w, float eps,
                       Tensor& out, void* act, __nv_bfloat16* xh) {
  const int64_t D = w.numel(), R = y.numel() / std::max<int64_t>(D, 1);
  check_f32(y, "add_rms_norm");
  check_f32(delta, "add_rms_norm delta");
  check_f32(w, "add_rms_norm weight");
  check_same(y, delta, "add_rms_norm");
  check_same(y, out, "add_rms_norm");
  check_same(y, y_out, "add_rms_norm");
  QWEN36_CHECK(y.numel() == R * D, "add_rms_norm: {} is not rows of {}", y.shape_str(), D);
  const bool aligned = (reinterpret_cast<uintptr_t>(y.data) | reinterpret_cast<uintptr_t>(delta.data) |
                        reinterpret_cast<uintptr_t>(y_out.data) | reinterpret_cast<uintptr_t>(w.data) |
                        reinterpret_cast<uintptr_t>(out.data)) % 16 == 0;
  const int64_t D4 = D / 4;
  const int threads = int(std::clamp<int64_t>((D4 + kVec - 1) / kVec + 31, 32, 1024) / 32 * 32);
  const bool vec = D % 4 == 0 && aligned && D4 <= int64_t(threads) * kVec;
  if (act && (!vec || D % 32 != 0 || R < 1 || R > kTiledMaxT)) return false;  // the quantizing form: whole k32 groups
  if (xh && (!vec || reinterpret_cast<uintptr_t>(xh) % 8 != 0)) return false;
  if (R == 0) return true;
  if (act) {
    const ActLayout L(R, D);
    uint8_t* base = static_cast<uint8_t*>(act);
    const ActOut q{base + L.o_xb, reinterpret_cast<float*>(base + L.o_xf), reinterpret_cast<int*>(base + L.o_xi),
                   int(R), L.NT, nullptr, L.o_xh ? reinterpret_cast<uint4*>(base + L.o_xh) : nullptr, L.np};
    launch_pdl(add_rms_norm_vec_kernel<true>, dim3(unsigned(R)), dim3(unsigned(threads)), 0, c.stream,
               y.as<const float4>(), delta.as<const float4>(), y_out.as<float4>(), w.as<const float4>(), eps,
               out.as<float4>(), D4, q);
  } else if (xh) {
    ActOut h;
    h.xh = xh;
    launch_pdl(add_rms_norm_vec_kernel<false, true>, dim3(unsigned(R)), dim3(unsigned(threads)), 0, c.stream,
               y.as<const float4>(), delta.as<const float4>(), y_out.as<float4>(), w.as<const float4>(), eps,
               out.as<float4>(), D4, h);
  } else if (vec) {
    launch_pdl(add_rms_norm_vec_kernel<false>, dim3(unsigned(R)), dim3(unsigned(threads)), 0, c.stream,
               y.as<const float4>(), delta.as<const float4>(), y_out.as<float4>(), w.as<const float4>(), eps,
               out.as<float4>(), D4, ActOut{});
  } else {
    if (y_out.data != y.data)
      CUDA_CHECK(cudaMemcpyAsync(y_out.data, y.data, y.nbytes(), cudaMemcpyDeviceToDevice, c.stream));
    launch_pdl(add_rms_norm_kernel, dim3(unsigned(R)), dim3(unsigned(norm_threads(D))), 0, c.stream,
               y_out.as<float>(), delta.as<const float>(), w.as<const float>(), eps, out.as<float>(), D);
  }
  CUDA_LAUNCH_CHECK();
  return true;
}

}  // namespace

bool add_rms_norm_quant(Ctx& c, const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w, float eps,
                        Tensor& out, void* act) {
  return add_rms_norm_with(c, y, delta, y_out, w, eps, out, act, nullptr);
}

bool add_rms_norm_half(Ctx& c, const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w, float eps,
                       Tensor& out, __nv_bfloat16* xh) {
  return add_rms_norm_with(c, y, delta, y_out, w, eps, out, nullptr, xh);
}

void add(Ctx& c, Tensor& y, const Tensor& x) {
  check_same(y, x, "add");
  const int64_t n = y.numel();
  if (!n) return;
  add_kernel<<<grid_for(n), 256, 0, c.stream>>>(y.as<float>(), x.as<const float>(), n);
  CUDA_LAUNCH_CHECK();
}

void swiglu(Ctx& c, const Tensor& gate, const Tensor& up, Tensor& out) {
  check_same(gate, up, "swiglu");
  check_same(gate, out, "swiglu");
  const int64_t n = out.numel();
  if (!n) return;
  launch_pdl(swiglu_kernel, dim3(grid_for(n)), dim3(256), 0, c.stream, gate.as<const float>(), up.as<const float>(),
             out.as<float>(), n);
  CUDA_LAUNCH_CHECK();
}

void sigmoid_mul(Ctx& c, Tensor& x, const Tensor& gate, bool release_late) {
  check_same(x, gate, "sigmoid_mul");
  const int64_t n = x.numel();
  if (!n) return;
  // Decode-sized gates (a row or a few) keep the scalar kernel: its 24 blocks a row are part of
  // the release timing session 35 tuned before the output projection.
  if (n >= (int64_t(1) << 16) && n % 4 == 0 &&
      (reinterpret_cast<uintptr_t>(x.data) | reinterpret_cast<uintptr_t>(gate.data)) % 16 == 0)
    launch_pdl(sigmoid_mul4_kernel, dim3(grid_for(n / 4)), dim3(256), 0, c.stream, x.as<float4>(), gate.as<const float4>(),
               n / 4, release_late);
  else
    launch_pdl(sigmoid_mul_kernel, dim3(grid_for(n)), dim3(256), 0, c.stream, x.as<float>(), gate.as<const float>(), n,
               release_late);
  CUDA_LAUNCH_CHECK();
}

void add_sigmoid_scaled(Ctx& c, Tensor& y, const Tensor& x, const Tensor& s) {
  check_same(y, x, "add_sigmoid_scaled");
  const int64_t T = s.numel(), D = T ? y.numel() / T : 0;
  QWEN36_CHECK(D * T == y.numel(), "add_sigmoid_scaled: {} rows vs {}", T, y.shape_str());
  const int64_t n = y.numel();
  if (!n) return;
  launch_pdl(add_sigmoid_scaled_kernel, row_grid(n / D, D), dim3(256), 0, c.stream, y.as<float>(), x.as<const float>(),
             s.as<const float>(), D, n / D);
  CUDA_LAUNCH_CHECK();
}

void copy_cols(Ctx& c, const Tensor& src, int64_t src_col0, Tensor& dst, int64_t dst_col0, int64_t width) {
  const int64_t R = src.rows();
  QWEN36_CHECK(dst.rows() == R && src_col0 >= 0 && dst_col0 >= 0 && src_col0 + width <= src.cols() &&
                   dst_col0 + width <= dst.cols(),
               "copy_cols: {}[:, {}:+{}] → {}[:, {}:]", src.shape_str(), src_col0, width, dst.shape_str(), dst_col0);
  const int64_t n = R * width;
  if (!n) return;
  const bool vec = (src.cols() | dst.cols() | src_col0 | dst_col0 | width) % 4 == 0 &&
                   reinterpret_cast<uintptr_t>(src.data) % 16 == 0 && reinterpret_cast<uintptr_t>(dst.data) % 16 == 0;
  if (vec) {
    const int64_t w4 = width / 4;
    const dim3 grid(unsigned(blocks_for(w4, 256)), unsigned(std::clamp<int64_t>(R / 4, 1, 65535)));
    copy_cols4_kernel<<<grid, 256, 0, c.stream>>>(src.as<const float4>(), src.cols() / 4, src_col0 / 4,
                                                  dst.as<float4>(), dst.cols() / 4, dst_col0 / 4, w4, R);
  } else {
    copy_cols_kernel<<<row_grid(R, width), 256, 0, c.stream>>>(src.as<const float>(), src.cols(), src_col0,
                                                               dst.as<float>(), dst.cols(), dst_col0, width, R);
  }
  CUDA_LAUNCH_CHECK();
}

bool copy_column_blocks(Ctx& c, const Tensor& x, Tensor& q, Tensor& k, Tensor& v) {
  const int64_t R = x.rows(), C = x.cols();
  const int64_t nq = R ? q.numel() / R : 0, nk = R ? k.numel() / R : 0, nv = R ? v.numel() / R : 0;
  const bool shapes = x.dtype == DType::F32 && q.dtype == DType::F32 && k.dtype == DType::F32 &&
                      v.dtype == DType::F32 && q.numel() == R * nq && k.numel() == R * nk && v.numel() == R * nv &&
                      nq + nk + nv == C;
  auto a16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = (nq | nk | nv) % 4 == 0 && a16(x.data) && a16(q.data) && a16(k.data) && a16(v.data);
  if (!shapes || !vec) return false;
  if (R * C == 0) return true;
  const int64_t c4 = C / 4;
  const dim3 grid(unsigned(blocks_for(c4, 256)), unsigned(std::clamp<int64_t>(R, 1, 65535)));
  split_cols3_kernel<<<grid, 256, 0, c.stream>>>(x.as<const float4>(), c4, q.as<float4>(), k.as<float4>(),
                                                 v.as<float4>(), nq / 4, nk / 4, R);
  CUDA_LAUNCH_CHECK();
  return true;
}

void get_rows_dev(Ctx& c, const float* src, int64_t D, const int32_t* rows, int64_t n, float* dst) {
  if (n * D == 0) return;
  get_rows_kernel<<<row_grid(n, D), 256, 0, c.stream>>>(src, D, rows, dst, n);
  CUDA_LAUNCH_CHECK();
}

void get_rows(Ctx& c, const Tensor& src, std::span<const int32_t> rows, Tensor& dst) {
  const int64_t D = src.cols();
  QWEN36_CHECK(dst.numel() == int64_t(rows.size()) * D, "get_rows: {} rows of {} into {}", rows.size(),
               src.shape_str(), dst.shape_str());
  for (int32_t r : rows) QWEN36_CHECK(r >= 0 && r < src.rows(), "get_rows: row {} out of range", r);
  Temp<int32_t> tmp(c, 0);
  const int32_t* d = dev_i32(c, rows, tmp, /*constant=*/true);
  get_rows_dev(c, src.as<const float>(), D, d, int64_t(rows.size()), dst.as<float>());
}

void split_q_gate(Ctx& c, const Tensor& qg, Tensor& q, Tensor& gate) {
  const int64_t hd = q.cols();
  QWEN36_CHECK(qg.numel() == 2 * q.numel() && gate.numel() == q.numel(), "split_q_gate: {} → {} + {}",
               qg.shape_str(), q.shape_str(), gate.shape_str());
  const int64_t n = q.numel();
  if (!n) return;
  launch_pdl(split_q_gate_kernel, row_grid(n / hd, hd), dim3(256), 0, c.stream, qg.as<const float>(), q.as<float>(),
             gate.as<float>(), hd, n / hd);
  CUDA_LAUNCH_CHECK();
}

namespace {
// RoPE's device inputs: the frequencies (computed on the host exactly as the CPU reference does)
// and each token's position; false when recording could not upload them (nothing may run).
struct RopeInputs {
  Temp<float> ftmp;
  Temp<int32_t> stmp, ptmp;
  const float* freq = nullptr;
  const int32_t* pos = nullptr;
  explicit RopeInputs(Ctx& c) : ftmp(c, 0), stmp(c, 0), ptmp(c, 0) {}
  bool load_freq(Ctx& c, int64_t rotary_dim, float theta) {
    const int64_t half = rotary_dim / 2;
    std::vector<float> inv_freq(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i) inv_freq[size_t(i)] = 1.0f / std::pow(theta, float(2 * i) / float(rotary_dim));
    freq = dev_const_f32(c, std::span<const float>(inv_freq.data(), inv_freq.size()));
    if (!freq) {
      if (!host_work_allowed(c)) return false;
      freq = ftmp.assign(std::span<const float>(inv_freq.data(), inv_freq.size()));
    }
    return true;
  }
  bool load(Ctx& c, std::span<const SeqRun> runs, int64_t T, int64_t rotary_dim, float theta) {
    if (!load_freq(c, rotary_dim, theta)) return false;
    const int32_t* slot = nullptr;
    dev_token_map(c, runs, T, stmp, ptmp, &slot, &pos);
    return true;
  }
};
}  // namespace

void rope(Ctx& c, Tensor& x, std::span<const SeqRun> runs, int64_t rotary_dim, float theta) {
  QWEN36_CHECK(x.ndim == 3, "rope: expected [T, heads, head_dim], got {}", x.shape_str());
  const int64_t T = x.dim(0), heads = x.dim(1), hd = x.dim(2), half = rotary_dim / 2;
  QWEN36_CHECK(rotary_dim % 2 == 0 && rotary_dim <= hd, "rope: rotary_dim {} vs head_dim {}", rotary_dim, hd);
  if (half == 0 || T == 0) return;
  RopeInputs in(c);
  if (!in.load(c, runs, T, rotary_dim, theta)) return;
  const int64_t n = T * heads * half;
  launch_pdl(rope_kernel, dim3(grid_for(n)), dim3(256), 0, c.stream, x.as<float>(), in.pos, in.freq, heads, hd, half,
             n);
  CUDA_LAUNCH_CHECK();
}

void rope_at(Ctx& c, Tensor& x, const int32_t* pos, int64_t rotary_dim, float theta) {
  QWEN36_CHECK(x.ndim == 3, "rope: expected [T, heads, head_dim], got {}", x.shape_str());
  const int64_t T = x.dim(0), heads = x.dim(1), hd = x.dim(2), half = rotary_dim / 2;
  QWEN36_CHECK(rotary_dim % 2 == 0 && rotary_dim <= hd, "rope: rotary_dim {} vs head_dim {}", rotary_dim, hd);
  if (half == 0 || T == 0) return;
  RopeInputs in(c);
  if (!in.load_freq(c, rotary_dim, theta)) return;
  const int64_t n = T * heads * half;
  launch_pdl(rope_kernel, dim3(grid_for(n)), dim3(256), 0, c.stream, x.as<float>(), pos, in.freq, heads, hd, half, n);
  CUDA_LAUNCH_CHECK();
}

bool qk_norm_rope(Ctx& c, const Tensor& qg, Tensor& q, Tensor* gate, Tensor& k, const Tensor& q_norm,
                  const Tensor& k_norm, float eps, std::span<const SeqRun> runs, int64_t rotary_dim, float theta) {
  // QWEN36_QK_NORM_ROPE=composed: the five launches; =rows: qk_norm_rope_kernel for every shape
  // (A/B switches)
  static const char* const mode = [] {
    const char* v = std::getenv("QWEN36_QK_NORM_ROPE");
    return v ? v : "";
  }();
  const bool composed = std::strcmp(mode, "composed") == 0;
  if (composed || q.ndim != 3 || k.ndim != 3) return false;
  const int64_t T = q.dim(0), nh = q.dim(1), hd = q.dim(2), nkv = k.dim(1);
  // The composed ops' rows kernel: head rows of ≤ 512, more than one row of each (else a block a row).
  if (hd > 512 || T * nkv < 2 || T * nh < 2 || k.dim(0) != T || k.dim(2) != hd || q_norm.numel() != hd ||
      k_norm.numel() != hd || rotary_dim % 2 != 0 || rotary_dim > hd || (gate && gate->numel() != q.numel()) ||
      qg.numel() != (gate ? 2 : 1) * q.numel() || (!gate && qg.data != q.data))
    return false;
  if (qg.dtype != DType::F32 || q.dtype != DType::F32 || k.dtype != DType::F32 || q_norm.dtype != DType::F32 ||
      k_norm.dtype != DType::F32 || (gate && gate->dtype != DType::F32))
    return false;
  RopeInputs in(c);
  if (rotary_dim > 0 && !in.load(c, runs, T, rotary_dim, theta)) return true;  // recording failed: nothing runs
  const int64_t rows = T * (nh + nkv);
  if (hd == 256 && rotary_dim == 64 && std::strcmp(mode, "rows") != 0) {
    launch_pdl(qk_norm_rope_regs_kernel<256, 32>, dim3(unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock)),
               dim3(32 * kRowsPerBlock), 0, c.stream, qg.as<const float>(), q.as<float>(),
               gate ? gate->as<float>() : nullptr, k.as<float>(), q_norm.as<const float>(), k_norm.as<const float>(),
               eps, in.pos, in.freq, T, int(nh), int(nkv), gate != nullptr);
    CUDA_LAUNCH_CHECK();
    return true;
  }
  launch_pdl(qk_norm_rope_kernel, dim3(unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock)), dim3(32 * kRowsPerBlock),
             0, c.stream, qg.as<const float>(), q.as<float>(), gate ? gate->as<float>() : nullptr, k.as<float>(),
             q_norm.as<const float>(), k_norm.as<const float>(), eps, in.pos, in.freq, T, int(nh), int(nkv), int(hd),
             int(rotary_dim / 2), gate != nullptr);
  CUDA_LAUNCH_CHECK();
  return true;
}

}  // namespace qwen36::cuda
