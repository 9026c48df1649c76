// out[T, N] = x[T, K] · w[N, K]ᵀ on the GPU for bf16 / f16 / f32 weights.
//
//  - T ≤ 8 (decode): a memory-bound GEMV. T = 1 (and f32 weights, and matrices of few rows):
//    one warp per weight row; each lane streams 16-byte weight vectors (8 bf16/f16) with
//    several loads in flight, dots them with the f32 activations (L1-resident) and the warp
//    reduces. 2 ≤ T ≤ 8 with bf16/f16 weights: the "tile" kernels, where a block's warps sweep
//    K together over chunks of x staged in shared memory and each warp dots 4 rows at once
//    (x read once per 4 rows, not once per row from L1). f32 accumulation, activations stay f32.
//  - T > 8 (prefill): cuBLAS tensor-core GEMM. The f32 activations are ROUNDED to the weight
//    type (bf16 or f16) first, the product accumulates in f32 and is written in f32.
//    f32 weights use cublasSgemm. With CudaOptions::exact_matmul, a plain SIMT GEMM with f32
//    activations is used instead (reference checks).
#include <algorithm>
#include <functional>
#include <cstdlib>
#include <type_traits>

#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_sm80.cuh"

namespace qwen36::cuda {

namespace {

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

// Chunks: tokens t0 + T·blockIdx.y onwards (a batch of more than 8 tokens over small matrices,
// matmul_multi); otherwise tokens 0..T-1 and t0 unused.
template <typename W, int T, int U = kUnroll, bool Chunks = false>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_multi_kernel(MultiRows m, const float* __restrict__ x, int K, int t0) {
  griddep_trigger();
  const int row = blockIdx.x * kGemvWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= m.total) return;
  MultiRow mr = multi_row(m, row);
  if constexpr (Chunks) {
    const int64_t first = t0 + int64_t(blockIdx.y) * T;
    x += first * K;
    mr.out += first * mr.N;
  }
  float acc[T];
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = 0.0f;
  lane_dot<W, T, U>(static_cast<const W*>(mr.w) + size_t(mr.local) * size_t(K), x, K, lane, acc);
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const float v = warp_sum(acc[t]);
    if (lane == 0) mr.out[size_t(t) * mr.N + mr.local] = v;
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
  float a[2][T];  // gate, up
#pragma unroll
  for (int t = 0; t < T; ++t) a[0][t] = a[1][t] = 0.0f;
  const W* const rows[2] = {wg + size_t(row) * size_t(K), wu + size_t(row) * size_t(K)};
  lane_dot<W, T, 2>(rows, x, K, lane, a);
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const float gs = warp_sum(a[0][t]), us = warp_sum(a[1][t]);
    if (lane == 0) out[size_t(t) * N + row] = silu_f(gs) * us;
  }
}

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

// ---- batched decode, 2 ≤ T ≤ 8, bf16 / f16 weights: activation chunks in shared memory ----
// Dotting every 16-byte weight vector with T activation rows straight from L1 (lane_dot) costs
// T·32 bytes of L1 reads per 16 weight bytes, and a row-per-warp grid re-reads all of x once
// per row: at T = 8 that bounds the kernel far below DRAM speed. Here the warps of a block
// sweep K together in chunks: a chunk of x (all T rows) is copied into shared memory once per
// block (cp.async, double-buffered, the next chunk in flight while this one is used), and each
// warp dots kTileRows weight rows with it, so each activation value read from shared memory
// serves kTileRows rows. The chunk is stored split into the low and high float4 of each 8-wide
// position, so a warp's read of one half is 512 contiguous bytes (no bank conflicts) while the
// weights keep their 16-byte loads. Weight loads run kTileAhead steps ahead in registers and
// are issued before griddep_wait(); the activations are read only after it.
constexpr int kTileRows = 4;       // weight rows per warp (the x reuse factor)
constexpr int kTileMaxWarps = 16;  // warps per block at most (128 registers a thread either way)
constexpr int kTileAutoWarps = 8;  // the most tile_warps picks by itself
constexpr int kTileAhead = 2;      // 32-lane steps of weight loads in flight per row

template <int T>
struct TileChunk {
  // Activations per chunk: T · KC = 4096 floats at most (16 KB a buffer, two buffers).
  static constexpr int KC = T <= 2 ? 2048 : T <= 4 ? 1024 : 512;
  static constexpr int PC = KC / 8;        // 8-wide positions per chunk
  static constexpr int J = PC / 32;        // warp steps per chunk
  static constexpr int kBuf = T * 2 * PC;  // float4s per buffer: [t][half][position]
  static_assert(J % kTileAhead == 0, "a chunk must hold whole rounds of the weight ring");
};


// Chunk c of x[T, K] into buf (all threads of the block): float4 v of row t, elements
// c·KC + 4v .. +3, goes to buf[(t·2 + v % 2)·PC + v / 2]. Positions past K are left unwritten
// (tile_dot never reads them).
template <int T>
__device__ __forceinline__ void tile_fill(float4* buf, const float* __restrict__ x, int K, int c) {
  using C = TileChunk<T>;
  constexpr int per_t = C::KC / 4;
  const int e0 = c * C::KC;
  for (int q = threadIdx.x; q < T * per_t; q += blockDim.x) {
    const int t = q / per_t, v = q % per_t, e = e0 + 4 * v;
    if (e < K) cp_async16(buf + (t * 2 + (v & 1)) * C::PC + (v >> 1), x + size_t(t) * K + e);
  }
}

// 4 consecutive weights (two 32-bit words of a 16-byte vector) as f32.
template <typename W>
__device__ __forceinline__ void tile_unpack4(uint32_t a, uint32_t b, float (&f)[4]) {
  if constexpr (std::is_same_v<W, __nv_bfloat16>) {
    f[0] = __uint_as_float(a << 16), f[1] = __uint_as_float(a & 0xffff0000u);
    f[2] = __uint_as_float(b << 16), f[3] = __uint_as_float(b & 0xffff0000u);
  } else {
    const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&a));
    const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&b));
    f[0] = lo.x, f[1] = lo.y, f[2] = hi.x, f[3] = hi.y;
  }
}

// This lane's share of Σ_k w_r[k] · x[t, k] for the warp's RR weight rows wr[r] (valid row
// pointers; the caller reduces over the warp). Called by every thread of the block (it
// synchronises the block once per chunk); K % 8 == 0, x 16-byte aligned.
template <typename W, int T, int RR>
__device__ __forceinline__ void tile_dot(const W* const (&wr)[RR], const float* __restrict__ x, int K, float4* xs,
                                         float (&acc)[RR][T]) {
  using C = TileChunk<T>;
  const int lane = threadIdx.x & 31, K8 = K / 8, chunks = (K8 + C::PC - 1) / C::PC;
  uint4 wv[kTileAhead][RR] = {};
#pragma unroll
  for (int u = 0; u < kTileAhead; ++u)
    if (u * 32 + lane < K8) {
#pragma unroll
      for (int r = 0; r < RR; ++r) wv[u][r] = __ldcs(reinterpret_cast<const uint4*>(wr[r] + size_t(u * 32 + lane) * 8));
    }
  griddep_wait();
  tile_fill<T>(xs, x, K, 0);
  cp_async_commit();
  for (int c = 0; c < chunks; ++c) {
    // Chunk c has landed for everyone, and everyone is done with chunk c - 1's buffer.
    cp_async_wait<0>();
    __syncthreads();
    if (c + 1 < chunks) tile_fill<T>(xs + ((c + 1) & 1) * C::kBuf, x, K, c + 1);
    cp_async_commit();
    const float4* xb = xs + (c & 1) * C::kBuf;
#pragma unroll
    for (int j = 0; j < C::J; ++j) {
      uint4(&v)[RR] = wv[j % kTileAhead];  // global step c·J + j; J is a multiple of kTileAhead
      const int p = (c * C::J + j) * 32 + lane;
      if (p < K8) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float f[RR][4];
#pragma unroll
          for (int r = 0; r < RR; ++r) tile_unpack4<W>(h ? v[r].z : v[r].x, h ? v[r].w : v[r].y, f[r]);
#pragma unroll
          for (int t = 0; t < T; ++t) {
            const float4 xv = xb[(t * 2 + h) * C::PC + j * 32 + lane];
#pragma unroll
            for (int r = 0; r < RR; ++r)
              acc[r][t] = fmaf(f[r][3], xv.w, fmaf(f[r][2], xv.z, fmaf(f[r][1], xv.y, fmaf(f[r][0], xv.x, acc[r][t]))));
          }
        }
      }
      const int pn = p + 32 * kTileAhead;
      if (pn < K8) {
#pragma unroll
        for (int r = 0; r < RR; ++r) v[r] = __ldcs(reinterpret_cast<const uint4*>(wr[r] + size_t(pn) * 8));
      }
    }
  }
}

// out[T, N] = x · wᵀ, kTileRows consecutive rows per warp.
template <typename W, int T>
__global__ void __launch_bounds__(kTileMaxWarps * 32, 1)
    gemv_tile_kernel(const W* __restrict__ w, const float* __restrict__ x, float* __restrict__ out, int N, int K) {
  __shared__ float4 xs[2 * TileChunk<T>::kBuf];
  griddep_trigger();
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * kTileRows;
  const W* wr[kTileRows];
#pragma unroll
  for (int r = 0; r < kTileRows; ++r) wr[r] = w + size_t(min(row0 + r, N - 1)) * size_t(K);  // past N: a dummy
  float acc[kTileRows][T] = {};
  tile_dot<W, T, kTileRows>(wr, x, K, xs, acc);
#pragma unroll
  for (int r = 0; r < kTileRows; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float s = warp_sum(acc[r][t]);
      if (lane == 0 && row0 + r < N) out[size_t(t) * N + row0 + r] = s;
    }
}

template <typename W, int T>
__global__ void __launch_bounds__(kTileMaxWarps * 32, 1)
    gemv_multi_tile_kernel(MultiRows m, const float* __restrict__ x, int K) {
  __shared__ float4 xs[2 * TileChunk<T>::kBuf];
  griddep_trigger();
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * kTileRows;
  const W* wr[kTileRows];
#pragma unroll
  for (int r = 0; r < kTileRows; ++r) {
    const MultiRow mr = multi_row(m, min(row0 + r, m.total - 1));
    wr[r] = static_cast<const W*>(mr.w) + size_t(mr.local) * size_t(K);
  }
  float acc[kTileRows][T] = {};
  tile_dot<W, T, kTileRows>(wr, x, K, xs, acc);
#pragma unroll
  for (int r = 0; r < kTileRows; ++r) {
    const MultiRow mr = multi_row(m, row0 + r);
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float s = warp_sum(acc[r][t]);
      if (lane == 0 && row0 + r < m.total) mr.out[size_t(t) * mr.N + mr.local] = s;
    }
  }
}

// SwiGLU: kTileRows / 2 output rows per warp, each a gate and an up row.
template <typename W, int T>
__global__ void __launch_bounds__(kTileMaxWarps * 32, 1)
    gemv_swiglu_tile_kernel(const W* __restrict__ wg, const W* __restrict__ wu, const float* __restrict__ x,
                            float* __restrict__ out, int N, int K) {
  constexpr int R = kTileRows / 2;
  __shared__ float4 xs[2 * TileChunk<T>::kBuf];
  griddep_trigger();
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;
  const W* wr[kTileRows];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const size_t off = size_t(min(row0 + r, N - 1)) * size_t(K);
    wr[2 * r] = wg + off, wr[2 * r + 1] = wu + off;
  }
  float acc[kTileRows][T] = {};
  tile_dot<W, T, kTileRows>(wr, x, K, xs, acc);
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float g = warp_sum(acc[2 * r][t]), u = warp_sum(acc[2 * r + 1][t]);
      if (lane == 0 && row0 + r < N) out[size_t(t) * N + row0 + r] = silu_f(g) * u;
    }
}

// The tile kernels take bf16 / f16 weights, 2 ≤ T ≤ 8 and K % 8 == 0 (f32 weights and T = 1
// stay on the warp-per-row kernels).
template <typename W>
constexpr bool tile_weight() {
  return std::is_same_v<W, __nv_bfloat16> || std::is_same_v<W, __half>;
}

// Warps per block for `tasks` warp tasks (kTileRows weight rows each). More warps per block
// share each chunk of x among more rows (less L2 traffic for the copies, fewer barriers per
// row); but a block sweeps K as one, so a matrix too small for two 8-warp blocks per SM gets
// smaller blocks, about two per SM, rather than leaving SMs idle. QWEN36_GEMV_TILE_WARPS=1..16
// overrides (tuning; read per launch, so a test can sweep it).
int tile_warps(int64_t tasks) {
  if (const char* e = std::getenv("QWEN36_GEMV_TILE_WARPS"); e && *e)
    return std::clamp(std::atoi(e), 1, kTileMaxWarps);
  const int64_t two_per_sm = 2 * int64_t(dev_info().sms);
  return int(std::clamp<int64_t>((tasks + two_per_sm - 1) / two_per_sm, 1, kTileAutoWarps));
}

// Few rows (N ≤ Ctx::gemv_split_rows, K % 8 == 0): one block per weight row, its 8 warps split K, so
// that a small matrix (DeltaNet's a/b projections, k/v projections, MoE router and shared
// expert) still spreads over every SM with several loads in flight. A thread's first kSplitAhead
// weight vectors (all of a row of K ≤ 8192) are requested before griddep_wait, so they stream
// while the kernel before drains (an out_proj's 16 MB at the 35B-A3B's decode).
constexpr int kSplitAhead = 4;
template <typename W, int T>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_split_kernel(const W* __restrict__ w, const float* __restrict__ x, float* __restrict__ out, int N, int K) {
  griddep_trigger();
  const int row = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const W* wr = w + size_t(row) * size_t(K);
  float acc[T];
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = 0.0f;
  constexpr int kStep = kGemvWarps * 32;
  const int K8 = K / 8;
  Vec8<W> v[kSplitAhead];
  auto load = [&](int i0) {
#pragma unroll
    for (int u = 0; u < kSplitAhead; ++u)
      if (i0 + u * kStep < K8) v[u].load(wr + size_t(i0 + u * kStep) * 8);
  };
  load(int(threadIdx.x));
  griddep_wait();
  for (int i0 = int(threadIdx.x); i0 < K8; i0 += kSplitAhead * kStep) {
    if (i0 != int(threadIdx.x)) load(i0);
#pragma unroll
    for (int u = 0; u < kSplitAhead; ++u) {
      const int i = i0 + u * kStep;
      if (i >= K8) break;
      float f[8];
      v[u].unpack(f);
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const float4 x0 = __ldca(reinterpret_cast<const float4*>(x + size_t(t) * K + size_t(i) * 8));
        const float4 x1 = __ldca(reinterpret_cast<const float4*>(x + size_t(t) * K + size_t(i) * 8) + 1);
        acc[t] += f[0] * x0.x + f[1] * x0.y + f[2] * x0.z + f[3] * x0.w + f[4] * x1.x + f[5] * x1.y + f[6] * x1.z +
                  f[7] * x1.w;
      }
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
  const bool split = gemv_split_k(c, N, K);
  const dim3 grid(unsigned(split ? N : gemv_blocks(N))), block(kGemvWarps * 32);
  const W* wp = static_cast<const W*>(w);
  if constexpr (tile_weight<W>()) {
    if (T >= 2 && !split && K % 8 == 0) {
      const int64_t tasks = (int64_t(N) + kTileRows - 1) / kTileRows;
      const int warps = tile_warps(tasks);
      const dim3 tgrid(unsigned((tasks + warps - 1) / warps)), tblock(unsigned(warps * 32));
      with_batch(T, [&](auto tc) {
        if constexpr (tc.value >= 2)
          launch_pdl(gemv_tile_kernel<W, tc.value>, tgrid, tblock, 0, c.stream, wp, x, out, N, K);
      });
      CUDA_LAUNCH_CHECK();
      return;
    }
  }
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
__device__ __forceinline__ H round_to(float v) {
  if constexpr (std::is_same_v<H, __nv_bfloat16>)
    return __float2bfloat16_rn(v);
  else
    return __float2half_rn(v);
}

// y = x rounded to H, four values a thread-step (16-byte loads, 8-byte stores: the one-value
// form ran at half the copy bandwidth) for the first n4 · 4 (n4 = 0 when the pointers are not
// so aligned), the rest one at a time.
template <typename H>
__global__ void round_kernel(const float* __restrict__ x, H* __restrict__ y, int64_t n, int64_t n4) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (int64_t i = first; i < n4; i += stride) {
    const float4 v = __ldcs(reinterpret_cast<const float4*>(x) + i);
    H h[4] = {round_to<H>(v.x), round_to<H>(v.y), round_to<H>(v.z), round_to<H>(v.w)};
    reinterpret_cast<uint2*>(y)[i] = *reinterpret_cast<const uint2*>(h);
  }
  for (int64_t i = 4 * n4 + first; i < n; i += stride) y[i] = round_to<H>(x[i]);
}

}  // namespace

bool gemv_split_k(const Ctx& c, int64_t N, int64_t K) { return N <= c.gemv_split_rows && K % 8 == 0; }

bool release_late_before(const Ctx& c, const Tensor& w) {
  const DType t = w.dtype;
  return (t == DType::BF16 || t == DType::F16 || t == DType::F32) && !gemv_split_k(c, w.rows(), w.cols());
}

// Small f32 matrices at 8 < T ≤ kTiledMaxT (the MoE router and shared-expert gate of a batch
// step): the GEMV over chunks of 8 tokens in the grid's y, the matrices re-read from L2 once per
// chunk. One or two launches (the chunks, the T % 8 left), against cuBLAS's SIMT SGEMM with its
// split-K reduce plus a GEMV for the one-row gate (~17 µs a layer at 64 tokens on the H100).
// QWEN36_F32_CHUNKS=off: cuBLAS as before (the A / B of bench/RESULTS.md, session 49).
constexpr size_t kChunkedF32MaxBytes = size_t(4) << 20;

bool small_f32_in_chunks(const Ctx& c, std::span<const Tensor* const> ws, int64_t T) {
  static const bool on = parse_variant(std::getenv("QWEN36_F32_CHUNKS"), "on", "off") != kSecondForm;
  if (!on || c.exact_matmul || T <= 8 || T > kTiledMaxT || ws[0]->dtype != DType::F32) return false;
  size_t bytes = 0;
  for (const Tensor* w : ws) bytes += w->nbytes();
  return bytes <= kChunkedF32MaxBytes;
}

void launch_f32_chunks(Ctx& c, const MultiRows& m, const float* x, int T, int K) {
  const dim3 block(kGemvWarps * 32);
  const unsigned blocks = unsigned(gemv_blocks(m.total)), chunks = unsigned(T / 8);
  launch_pdl(gemv_multi_kernel<float, 8, kUnroll, true>, dim3(blocks, chunks), block, 0, c.stream, m, x, K, 0);
  if (T % 8)
    with_batch(T % 8, [&](auto tc) {
      launch_pdl(gemv_multi_kernel<float, tc.value, kUnroll, true>, dim3(blocks), block, 0, c.stream, m, x, K,
                 int(chunks * 8));
    });
  CUDA_LAUNCH_CHECK();
}

bool matmul_multi(Ctx& c, const Tensor& x, std::span<const Tensor* const> ws, std::span<Tensor* const> outs) {
  if (ws.empty() || ws.size() > size_t(kMaxMulti) || ws.size() != outs.size() || x.dtype != DType::F32) return false;
  const int64_t K = ws[0]->cols(), T = x.numel() / std::max<int64_t>(K, 1);
  const bool chunked = small_f32_in_chunks(c, ws, T);
  if (T < 1 || (T > 8 && !chunked) || x.cols() != K || K % 8 != 0 || !gemv_dtype(ws[0]->dtype)) return false;
  MultiRows m{};
  if (!multi_rows(ws, outs, K, T, m)) return false;
  if (chunked) {
    launch_f32_chunks(c, m, x.as<const float>(), int(T), int(K));
    return true;
  }
  const int64_t rows = m.total;
  const dim3 grid(unsigned(gemv_blocks(rows))), block(kGemvWarps * 32);
  with_weight_type(ws[0]->dtype, [&](auto wt) {
    using W = decltype(wt);
    if constexpr (tile_weight<W>()) {
      if (T >= 2) {
        const int64_t tasks = (rows + kTileRows - 1) / kTileRows;
        const int warps = tile_warps(tasks);
        const dim3 tgrid(unsigned((tasks + warps - 1) / warps)), tblock(unsigned(warps * 32));
        with_batch(int(T), [&](auto tc) {
          if constexpr (tc.value >= 2)
            launch_pdl(gemv_multi_tile_kernel<W, tc.value>, tgrid, tblock, 0, c.stream, m, x.as<const float>(), int(K));
        });
        return;
      }
    }
    // One token over a grid of at most two blocks a SM (the 35B-A3B's router + shared expert
    // GEMV, 161 blocks) whose rows are whole rounds of kWholeRowUnroll loads: all of a row (K =
    // 2048) requested before griddep_wait, no second round trip after it (35B-A3B bf16 b1 390.4
    // -> 391.8, session 37). Larger grids keep kUnroll: more registers, fewer resident warps.
    if constexpr (sizeof(W) == 2) {
      if (T == 1 && grid.x <= unsigned(2 * dev_info().sms) && K % (8 * 32 * kWholeRowUnroll) == 0) {
        launch_pdl(gemv_multi_kernel<W, 1, kWholeRowUnroll>, grid, block, 0, c.stream, m, x.as<const float>(),
                   int(K), 0);
        return;
      }
    }
    with_batch(int(T), [&](auto tc) {
      launch_pdl(gemv_multi_kernel<W, tc.value>, grid, block, 0, c.stream, m, x.as<const float>(), int(K), 0);
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
    if constexpr (tile_weight<W>()) {
      if (T >= 2) {
        const int64_t tasks = (N + kTileRows / 2 - 1) / (kTileRows / 2);
        const int warps = tile_warps(tasks);
        const dim3 tgrid(unsigned((tasks + warps - 1) / warps)), tblock(unsigned(warps * 32));
        with_batch(int(T), [&](auto tc) {
          if constexpr (tc.value >= 2)
            launch_pdl(gemv_swiglu_tile_kernel<W, tc.value>, tgrid, tblock, 0, c.stream, gate.as<const W>(),
                       up.as<const W>(), x.as<const float>(), out.as<float>(), int(N), int(K));
        });
        return;
      }
    }
    with_batch(int(T), [&](auto tc) {
      launch_pdl(gemv_swiglu_kernel<W, tc.value>, grid, block, 0, c.stream, gate.as<const W>(), up.as<const W>(),
                 x.as<const float>(), out.as<float>(), int(N), int(K));
    });
  });
  CUDA_LAUNCH_CHECK();
  return true;
}

void round_activations(Ctx& c, const float* x, void* xh, int64_t n, bool to_bf16) {
  if (n <= 0) return;
  const bool vec = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(xh) % 8 == 0;
  const int64_t n4 = vec ? n / 4 : 0;
  const int blocks = int(std::min<int64_t>(blocks_for(std::max<int64_t>(n4, n - 4 * n4), 256), 65535));
  if (to_bf16)
    round_kernel<<<blocks, 256, 0, c.stream>>>(x, static_cast<__nv_bfloat16*>(xh), n, n4);
  else
    round_kernel<<<blocks, 256, 0, c.stream>>>(x, static_cast<__half*>(xh), n, n4);
  CUDA_LAUNCH_CHECK();
}

void gemm_half(Ctx& c, const void* w, const void* xh, bool bf16, int T, int N, int K, float* out, int ldo) {
  // Row-major out[T, N] = x[T, K] · w[N, K]ᵀ is column-major out(N×T) = wᵀ(N×K) · x(K×T).
  const float one = 1.0f, zero = 0.0f;
  const cudaDataType_t dt = bf16 ? CUDA_R_16BF : CUDA_R_16F;
  CUBLAS_CHECK(cublasGemmEx(c.cublas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, w, dt, K, xh, dt, K, &zero, out,
                            CUDA_R_32F, ldo, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void sliced_dequant_gemm_erased(Ctx& c, const float* x, float* out, int T, int N, int K, int row_align,
                                const std::function<void(int n0, int ns, void* dst, bool f32)>& dequant,
                                const void* xh_given) {
  const bool exact = c.exact_matmul;
  const int64_t budget = exact ? (int64_t(48) << 20) : (int64_t(96) << 20);  // weights per slice
  const int slice = int(std::clamp<int64_t>(budget / K / row_align * row_align, row_align, N));
  Temp<uint8_t> scratch(c, size_t(slice) * size_t(K) * (exact ? 4 : 2));
  Temp<uint16_t> xh_own(c, exact || xh_given ? 0 : size_t(T) * K);
  if (!exact && !xh_given) round_activations(c, x, xh_own.get(), int64_t(T) * K, true);
  const void* xh = xh_given ? xh_given : xh_own.get();
  const float one = 1.0f, zero = 0.0f;
  for (int n0 = 0; n0 < N; n0 += slice) {
    const int ns = std::min(slice, N - n0);
    dequant(n0, ns, scratch.get(), exact);
    if (exact) {
      const float* ws = reinterpret_cast<const float*>(scratch.get());
      CUBLAS_CHECK(cublasSgemm(c.cublas, CUBLAS_OP_T, CUBLAS_OP_N, ns, T, K, &one, ws, K, x, K, &zero, out + n0, N));
    } else {
      gemm_half(c, scratch.get(), xh, true, T, ns, K, out + n0, N);
    }
  }
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
