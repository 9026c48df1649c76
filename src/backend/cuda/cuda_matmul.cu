// out[T, N] = x[T, K] · w[N, K]ᵀ on the GPU for bf16 / f16 / f32 weights.
//
//  - T ≤ 8 (decode): a memory-bound GEMV. One warp per weight row; each lane streams 16-byte
//    weight vectors (8 bf16/f16) with several loads in flight, dots them with the f32
//    activations (L1-resident) and the warp reduces. f32 accumulation, activations stay f32.
//  - T > 8 (prefill): cuBLAS tensor-core GEMM. The f32 activations are ROUNDED to the weight
//    type (bf16 or f16) first, the product accumulates in f32 and is written in f32.
//    f32 weights use cublasSgemm. With CudaOptions::exact_matmul, a plain SIMT GEMM with f32
//    activations is used instead (reference checks).
#include <type_traits>

#include "backend/cuda/cuda_ops.cuh"

namespace qwen36::cuda {

namespace {

// 8 consecutive weights as f32, from one 16-byte (bf16/f16) or two (f32) loads.
template <typename W>
struct Vec8;
template <>
struct Vec8<__nv_bfloat16> {
  uint4 r;
  __device__ __forceinline__ void load(const __nv_bfloat16* p) { r = __ldcs(reinterpret_cast<const uint4*>(p)); }
  __device__ __forceinline__ void unpack(float* f) const {
    const uint32_t u[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(u[i] << 16);
      f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
  }
};
template <>
struct Vec8<__half> {
  uint4 r;
  __device__ __forceinline__ void load(const __half* p) { r = __ldcs(reinterpret_cast<const uint4*>(p)); }
  __device__ __forceinline__ void unpack(float* f) const {
    const uint32_t u[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __half2 h = *reinterpret_cast<const __half2*>(&u[i]);
      const float2 v = __half22float2(h);
      f[2 * i] = v.x;
      f[2 * i + 1] = v.y;
    }
  }
};
template <>
struct Vec8<float> {
  float4 a, b;
  __device__ __forceinline__ void load(const float* p) {
    a = __ldcs(reinterpret_cast<const float4*>(p));
    b = __ldcs(reinterpret_cast<const float4*>(p) + 1);
  }
  __device__ __forceinline__ void unpack(float* f) const {
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
  }
};

constexpr int kGemvWarps = 8;  // rows per block
constexpr int kUnroll = 4;     // 16-byte weight loads in flight per lane

// This lane's share of Σ_k w[k] · x[t, k] for the T activation rows (the caller reduces over
// the warp): 16-byte weight loads, kUnroll in flight per lane, activations from L1.
template <typename W, int T>
__device__ __forceinline__ void lane_dot(const W* __restrict__ wr, const float* __restrict__ x, int K, int lane,
                                         float (&acc)[T]) {
  auto fma8 = [&](const float (&f)[8], int c) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float4 x0 = __ldg(reinterpret_cast<const float4*>(x + size_t(t) * K + c));
      const float4 x1 = __ldg(reinterpret_cast<const float4*>(x + size_t(t) * K + c) + 1);
      acc[t] += f[0] * x0.x + f[1] * x0.y + f[2] * x0.z + f[3] * x0.w + f[4] * x1.x + f[5] * x1.y + f[6] * x1.z +
                f[7] * x1.w;
    }
  };
  if (K % 8 != 0) {
    griddep_wait();
    for (int c = lane; c < K; c += 32) {
      const float f = to_f32(wr[c]);
#pragma unroll
      for (int t = 0; t < T; ++t) acc[t] += f * x[size_t(t) * K + c];
    }
    return;
  }
  const int K8 = K / 8;
  int i = lane;
  // The weights do not depend on the kernel before this one: the first loads are issued,
  // then (under programmatic dependent launch) the wait for that kernel's results.
  Vec8<W> v[kUnroll];
  bool more = i + 32 * (kUnroll - 1) < K8;
  if (more) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u].load(wr + size_t(i + 32 * u) * 8);
  }
  griddep_wait();
  while (more) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float f[8];
      v[u].unpack(f);
      fma8(f, (i + 32 * u) * 8);
    }
    i += 32 * kUnroll;
    more = i + 32 * (kUnroll - 1) < K8;
    if (more) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u].load(wr + size_t(i + 32 * u) * 8);
    }
  }
  for (; i < K8; i += 32) {
    Vec8<W> v;
    v.load(wr + size_t(i) * 8);
    float f[8];
    v.unpack(f);
    fma8(f, i * 8);
  }
}

template <typename W, int T>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_kernel(const W* __restrict__ w, const float* __restrict__ x, float* __restrict__ out, int N, int K) {
  griddep_trigger();
  const int row = blockIdx.x * kGemvWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  float acc[T];
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = 0.0f;
  lane_dot<W, T>(w + size_t(row) * size_t(K), x, K, lane, acc);
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const float s = warp_sum(acc[t]);
    if (lane == 0) out[size_t(t) * N + row] = s;
  }
}

// Several weight matrices applied to the same activations in one launch (Backend::
// matmul_multi): the rows of all of them form one index space, a warp per row, so the small
// matrices (DeltaNet's 48-row a/b projections) ride along with the large ones instead of
// paying a launch and a tail of their own.
constexpr int kMaxMulti = 4;
struct MultiRows {
  const void* w[kMaxMulti];
  float* out[kMaxMulti];
  int end[kMaxMulti];  // exclusive prefix of the row counts
  int n;
  int total;  // end[n - 1], kept apart: indexing the arrays with a runtime value would copy
              // the parameters to each thread's stack
};
template <typename W, int T>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_multi_kernel(MultiRows m, const float* __restrict__ x, int K) {
  griddep_trigger();
  const int row = blockIdx.x * kGemvWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= m.total) return;
  // The row's matrix, chosen with compile-time indices only: a runtime index into the
  // parameter arrays would copy them to local memory in every thread.
  const void* wp = m.w[0];
  float* op = m.out[0];
  int r0 = 0, r1 = m.end[0];
#pragma unroll
  for (int i = 1; i < kMaxMulti; ++i)
    if (i < m.n && row >= m.end[i - 1]) wp = m.w[i], op = m.out[i], r0 = m.end[i - 1], r1 = m.end[i];
  const int N = r1 - r0, local = row - r0;
  float acc[T];
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = 0.0f;
  lane_dot<W, T>(static_cast<const W*>(wp) + size_t(local) * size_t(K), x, K, lane, acc);
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const float v = warp_sum(acc[t]);
    if (lane == 0) op[size_t(t) * N + local] = v;
  }
}

// out = silu(x · gateᵀ) * (x · upᵀ) (Backend::matmul_swiglu): a warp reads row i of both
// matrices, so the MLP's two projections and the SwiGLU are one launch.
template <typename W, int T>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_swiglu_kernel(const W* __restrict__ wg, const W* __restrict__ wu, const float* __restrict__ x,
                       float* __restrict__ out, int N, int K) {
  griddep_trigger();
  const int row = blockIdx.x * kGemvWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  float g[T], u[T];
#pragma unroll
  for (int t = 0; t < T; ++t) g[t] = u[t] = 0.0f;
  lane_dot<W, T>(wg + size_t(row) * size_t(K), x, K, lane, g);
  lane_dot<W, T>(wu + size_t(row) * size_t(K), x, K, lane, u);
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const float gs = warp_sum(g[t]), us = warp_sum(u[t]);
    if (lane == 0) out[size_t(t) * N + row] = silu_f(gs) * us;
  }
}

// Blocks for a warp-per-row GEMV over `rows` rows: one row per warp. (Fewer, fully resident
// warps looping over ⌈rows / warps⌉ rows each measured slower on the H200, 2680 vs 4070 GB/s
// at 17408×5120: more warps keep more loads in flight.)
int gemv_blocks(int64_t rows) { return int((rows + kGemvWarps - 1) / kGemvWarps); }

// Calls f(std::integral_constant<int, T>) for the batch sizes the GEMV kernels are built for.
template <typename F>
void with_batch(int T, F&& f) {
  switch (T) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    case 8: return f(std::integral_constant<int, 8>{});
    default: fail("gemv: T = {} > 8", T);
  }
}

// Few rows (N ≤ Ctx::gemv_split_rows, K % 8 == 0): one block per weight row, its 8 warps split K, so
// that a small matrix (DeltaNet's a/b projections, k/v projections, MoE router and shared
// expert) still spreads over every SM with several loads in flight.
template <typename W, int T>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_split_kernel(const W* __restrict__ w, const float* __restrict__ x, float* __restrict__ out, int N, int K) {
  griddep_trigger();
  griddep_wait();
  const int row = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const W* wr = w + size_t(row) * size_t(K);
  float acc[T];
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = 0.0f;
  const int K8 = K / 8;
#pragma unroll 2
  for (int i = threadIdx.x; i < K8; i += kGemvWarps * 32) {
    Vec8<W> v;
    v.load(wr + size_t(i) * 8);
    float f[8];
    v.unpack(f);
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float4 x0 = __ldg(reinterpret_cast<const float4*>(x + size_t(t) * K + size_t(i) * 8));
      const float4 x1 = __ldg(reinterpret_cast<const float4*>(x + size_t(t) * K + size_t(i) * 8) + 1);
      acc[t] += f[0] * x0.x + f[1] * x0.y + f[2] * x0.z + f[3] * x0.w + f[4] * x1.x + f[5] * x1.y + f[6] * x1.z +
                f[7] * x1.w;
    }
  }
  __shared__ float part[kGemvWarps][T];
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const float s = warp_sum(acc[t]);
    if (lane == 0) part[warp][t] = s;
  }
  __syncthreads();
  if (threadIdx.x < T) {
    float s = 0;
#pragma unroll
    for (int j = 0; j < kGemvWarps; ++j) s += part[j][threadIdx.x];
    out[size_t(threadIdx.x) * N + row] = s;
  }
  (void)N;
}

template <typename W>
void launch_gemv(Ctx& c, const void* w, const float* x, float* out, int T, int N, int K) {
  const bool split = N <= c.gemv_split_rows && K % 8 == 0;
  const dim3 grid(unsigned(split ? N : gemv_blocks(N))), block(kGemvWarps * 32);
  const W* wp = static_cast<const W*>(w);
  with_batch(T, [&](auto tc) {
    if (split)
      launch_pdl(gemv_split_kernel<W, tc.value>, grid, block, 0, c.stream, wp, x, out, N, K);
    else
      launch_pdl(gemv_kernel<W, tc.value>, grid, block, 0, c.stream, wp, x, out, N, K);
  });
  CUDA_LAUNCH_CHECK();
}

// Plain tiled SIMT GEMM with f32 activations (exact_matmul).
constexpr int kTile = 16;
template <typename W>
__global__ void simt_gemm_kernel(const W* __restrict__ w, const float* __restrict__ x, float* __restrict__ out, int T,
                                 int N, int K) {
  __shared__ float xs[kTile][kTile + 1], ws[kTile][kTile + 1];
  const int t = blockIdx.y * kTile + threadIdx.y, n = blockIdx.x * kTile + threadIdx.x;
  const int wn = blockIdx.x * kTile + threadIdx.y;  // weight row this thread loads
  float acc = 0;
  for (int k0 = 0; k0 < K; k0 += kTile) {
    const int k = k0 + threadIdx.x;
    xs[threadIdx.y][threadIdx.x] = (t < T && k < K) ? x[size_t(t) * K + k] : 0.0f;
    ws[threadIdx.y][threadIdx.x] = (wn < N && k < K) ? to_f32(w[size_t(wn) * K + k]) : 0.0f;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kTile; ++j) acc += xs[threadIdx.y][j] * ws[threadIdx.x][j];
    __syncthreads();
  }
  if (t < T && n < N) out[size_t(t) * N + n] = acc;
}

template <typename W>
void launch_simt(Ctx& c, const void* w, const float* x, float* out, int T, int N, int K) {
  const dim3 grid(unsigned((N + kTile - 1) / kTile), unsigned((T + kTile - 1) / kTile)), block(kTile, kTile);
  simt_gemm_kernel<W><<<grid, block, 0, c.stream>>>(static_cast<const W*>(w), x, out, T, N, K);
  CUDA_LAUNCH_CHECK();
}

template <typename H>
__global__ void round_kernel(const float* __restrict__ x, H* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    if constexpr (std::is_same_v<H, __nv_bfloat16>)
      y[i] = __float2bfloat16_rn(x[i]);
    else
      y[i] = __float2half_rn(x[i]);
  }
}

// The GEMV dtypes (the fused decode kernels handle these; anything else composes).
bool gemv_dtype(DType t) { return t == DType::BF16 || t == DType::F16 || t == DType::F32; }

template <typename F>
void with_weight_type(DType t, F&& f) {
  switch (t) {
    case DType::BF16: return f(__nv_bfloat16{});
    case DType::F16: return f(__half{});
    default: return f(float{});
  }
}

}  // namespace

bool matmul_multi(Ctx& c, const Tensor& x, std::span<const Tensor* const> ws, std::span<Tensor* const> outs) {
  if (ws.empty() || ws.size() > size_t(kMaxMulti) || ws.size() != outs.size() || x.dtype != DType::F32) return false;
  const int64_t K = ws[0]->cols(), T = x.numel() / std::max<int64_t>(K, 1);
  if (T < 1 || T > 8 || x.cols() != K || K % 8 != 0 || !gemv_dtype(ws[0]->dtype)) return false;
  MultiRows m{};
  int64_t rows = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    const Tensor& w = *ws[i];
    if (w.dtype != ws[0]->dtype || w.cols() != K || outs[i]->dtype != DType::F32 || outs[i]->numel() != T * w.rows())
      return false;
    rows += w.rows();
    if (rows >= (int64_t(1) << 31)) return false;
    m.w[i] = w.data;
    m.out[i] = outs[i]->as<float>();
    m.end[i] = int(rows);
  }
  m.n = int(ws.size());
  m.total = int(rows);
  const dim3 grid(unsigned(gemv_blocks(rows))), block(kGemvWarps * 32);
  with_weight_type(ws[0]->dtype, [&](auto wt) {
    using W = decltype(wt);
    with_batch(int(T), [&](auto tc) {
      launch_pdl(gemv_multi_kernel<W, tc.value>, grid, block, 0, c.stream, m, x.as<const float>(), int(K));
    });
  });
  CUDA_LAUNCH_CHECK();
  return true;
}

bool matmul_swiglu(Ctx& c, const Tensor& x, const Tensor& gate, const Tensor& up, Tensor& out) {
  const int64_t K = gate.cols(), N = gate.rows(), T = x.numel() / std::max<int64_t>(K, 1);
  if (T < 1 || T > 8 || x.dtype != DType::F32 || x.cols() != K || K % 8 != 0 || !gemv_dtype(gate.dtype) ||
      up.dtype != gate.dtype || up.rows() != N || up.cols() != K || out.dtype != DType::F32 || out.numel() != T * N ||
      N >= (int64_t(1) << 31))
    return false;
  const dim3 grid(unsigned(gemv_blocks(N))), block(kGemvWarps * 32);
  with_weight_type(gate.dtype, [&](auto wt) {
    using W = decltype(wt);
    with_batch(int(T), [&](auto tc) {
      launch_pdl(gemv_swiglu_kernel<W, tc.value>, grid, block, 0, c.stream, gate.as<const W>(), up.as<const W>(),
                 x.as<const float>(), out.as<float>(), int(N), int(K));
    });
  });
  CUDA_LAUNCH_CHECK();
  return true;
}

void round_activations(Ctx& c, const float* x, void* xh, int64_t n, bool to_bf16) {
  const int blocks = int(std::min<int64_t>(blocks_for(n, 256), 65535));
  if (to_bf16)
    round_kernel<<<blocks, 256, 0, c.stream>>>(x, static_cast<__nv_bfloat16*>(xh), n);
  else
    round_kernel<<<blocks, 256, 0, c.stream>>>(x, static_cast<__half*>(xh), n);
  CUDA_LAUNCH_CHECK();
}

void gemm_half(Ctx& c, const void* w, const void* xh, bool bf16, int T, int N, int K, float* out, int ldo) {
  // Row-major out[T, N] = x[T, K] · w[N, K]ᵀ is column-major out(N×T) = wᵀ(N×K) · x(K×T).
  const float one = 1.0f, zero = 0.0f;
  const cudaDataType_t dt = bf16 ? CUDA_R_16BF : CUDA_R_16F;
  CUBLAS_CHECK(cublasGemmEx(c.cublas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, w, dt, K, xh, dt, K, &zero, out,
                            CUDA_R_32F, ldo, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void matmul(Ctx& c, const Tensor& x, const Tensor& w, Tensor& out) {
  if (dtype_is_quantized(w.dtype)) return quant_matmul(c, x, w, out);  // cuda_quant_matmul.cu
  check_weight_dtype(w, "matmul");
  const int64_t K = w.cols(), N = w.rows(), T = x.numel() / K;
  QWEN36_CHECK(x.dtype == DType::F32 && out.dtype == DType::F32, "matmul: activations must be f32");
  QWEN36_CHECK(x.cols() == K && out.numel() == T * N, "matmul: x {} · w {} → out {}", x.shape_str(), w.shape_str(),
               out.shape_str());
  QWEN36_CHECK(N < (int64_t(1) << 31) && K < (int64_t(1) << 31), "matmul: {} is too large", w.shape_str());
  if (T == 0) return;
  const float* xp = x.as<const float>();
  float* op = out.as<float>();
  const int iT = int(T), iN = int(N), iK = int(K);
  if (T <= 8) {
    switch (w.dtype) {
      case DType::BF16: return launch_gemv<__nv_bfloat16>(c, w.data, xp, op, iT, iN, iK);
      case DType::F16: return launch_gemv<__half>(c, w.data, xp, op, iT, iN, iK);
      default: return launch_gemv<float>(c, w.data, xp, op, iT, iN, iK);
    }
  }
  if (c.exact_matmul) {
    switch (w.dtype) {
      case DType::BF16: return launch_simt<__nv_bfloat16>(c, w.data, xp, op, iT, iN, iK);
      case DType::F16: return launch_simt<__half>(c, w.data, xp, op, iT, iN, iK);
      default: return launch_simt<float>(c, w.data, xp, op, iT, iN, iK);
    }
  }
  // Row-major out[T, N] = x[T, K] · w[N, K]ᵀ is column-major out(N×T) = wᵀ(N×K) · x(K×T).
  const float one = 1.0f, zero = 0.0f;
  if (w.dtype == DType::F32) {
    CUBLAS_CHECK(cublasSgemm(c.cublas, CUBLAS_OP_T, CUBLAS_OP_N, iN, iT, iK, &one, w.as<const float>(), iK, xp, iK,
                             &zero, op, iN));
    return;
  }
  const bool bf = w.dtype == DType::BF16;
  Temp<uint16_t> xh(c, size_t(T * K));
  round_activations(c, xp, xh.get(), T * K, bf);
  gemm_half(c, w.data, xh.get(), bf, iT, iN, iK, op, iN);
}

}  // namespace qwen36::cuda
