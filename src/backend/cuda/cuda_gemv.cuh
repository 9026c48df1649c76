#pragma once
// defines (file-local to each .cu that includes it): the one-token and few-token GEMV's pieces
// for 16-bit and f32 weights — 8 weights a 16-byte load (Vec8), a lane's share of a row's dot
// (lane_dot, lane_dot_x with the activations from global memory or staged in shared memory),
// the index space of several matrices in one launch (MultiRows) and the weight-type dispatch.
// The kernels are in cuda_matmul.cu (and, computing their layer norm, cuda_matmul_norm.cu).
// Included by .cu only.

#include <cstdint>
#include <span>
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
// One-token GEMVs of at most two blocks a SM: a lane's whole row of K = 2048 (bf16) in one round.
constexpr int kWholeRowUnroll = 2 * kUnroll;

// Where lane_dot reads the activations. XRows: x [T, K] in global memory, through L1 (__ldca).
// XStaged (T = 1): one row a kernel staged in its shared memory, each 8-element chunk's halves
// apart (lo[c] = x[8c .. 8c + 3], hi[c] = x[8c + 4 .. 8c + 7]), so that a warp's reads of
// consecutive chunks are consecutive 16-byte words (no bank conflicts); K % 8 == 0.
struct XRows {
  static constexpr bool kAnyK = true;  // also rows of K % 8 != 0 (at())
  const float* x;
  int K;
  __device__ __forceinline__ void chunk(int t, int c, float4& a, float4& b) const {
    const float4* p = reinterpret_cast<const float4*>(x + size_t(t) * K + c);
    a = __ldca(p);
    b = __ldca(p + 1);
  }
  __device__ __forceinline__ float at(int t, int c) const { return x[size_t(t) * K + c]; }
};
struct XStaged {
  static constexpr bool kAnyK = false;
  const float4* lo;
  const float4* hi;
  __device__ __forceinline__ void chunk(int, int c, float4& a, float4& b) const {
    a = lo[c >> 3];
    b = hi[c >> 3];
  }
};

// This lane's share of Σ_k w_r[k] · x[t, k] for R weight rows w_r (R = 1, or the MLP's gate and
// up rows: 2) and the T activation rows (the caller reduces over the warp): 16-byte weight
// loads, U per row in flight per lane (kUnroll, or kWholeRowUnroll), activations from xs. The
// chunks are summed in the same order whatever U and wherever x is read from, so the results
// depend on neither. The R rows stream together: one after the other a warp had a bubble between
// them and half the loads in flight (the 27B bf16 gate + up GEMV ran at 89% of the copy
// bandwidth, the single-row ones at 93–94%); each row's sum keeps its order, so the results are
// those of R calls. The weights do not depend on the kernel before this one: the first loads are
// issued, then wait() runs (every thread calls it once): griddep_wait under programmatic
// dependent launch, and whatever a kernel must do before x can be read (stage it).
template <typename W, int T, int R, int U, typename XS, typename Wait>
__device__ __forceinline__ void lane_dot_x(const W* const (&wr)[R], const XS& xs, int K, int lane, float (&acc)[R][T],
                                           const Wait& wait) {
  auto fma8 = [&](const float (&f)[8], int c, float (&a)[T]) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float4 x0, x1;
      xs.chunk(t, c, x0, x1);
      a[t] += f[0] * x0.x + f[1] * x0.y + f[2] * x0.z + f[3] * x0.w + f[4] * x1.x + f[5] * x1.y + f[6] * x1.z +
              f[7] * x1.w;
    }
  };
  if constexpr (XS::kAnyK) {
    if (K % 8 != 0) {
      wait();
#pragma unroll
      for (int r = 0; r < R; ++r)
        for (int c = lane; c < K; c += 32) {
          const float f = to_f32(wr[r][c]);
#pragma unroll
          for (int t = 0; t < T; ++t) acc[r][t] += f * xs.at(t, c);
        }
      return;
    }
  }
  const int K8 = K / 8;
  int i = lane;
  Vec8<W> v[R][U];
  auto load = [&]() {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int u = 0; u < U; ++u) v[r][u].load(wr[r] + size_t(i + 32 * u) * 8);
  };
  bool more = i + 32 * (U - 1) < K8;
  if (more) load();
  wait();
  while (more) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float f[8];
        v[r][u].unpack(f);
        fma8(f, (i + 32 * u) * 8, acc[r]);
      }
    i += 32 * U;
    more = i + 32 * (U - 1) < K8;
    if (more) load();
  }
  for (; i < K8; i += 32)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      Vec8<W> w1;
      w1.load(wr[r] + size_t(i) * 8);
      float f[8];
      w1.unpack(f);
      fma8(f, i * 8, acc[r]);
    }
}
template <typename W, int T, int R, int U = kUnroll>
__device__ __forceinline__ void lane_dot(const W* const (&wr)[R], const float* __restrict__ x, int K, int lane,
                                         float (&acc)[R][T]) {
  lane_dot_x<W, T, R, U>(wr, XRows{x, K}, K, lane, acc, [] { griddep_wait(); });
}
template <typename W, int T, int U = kUnroll>
__device__ __forceinline__ void lane_dot(const W* __restrict__ wr, const float* __restrict__ x, int K, int lane,
                                         float (&acc)[T]) {
  const W* const rows[1] = {wr};
  float a[1][T];
#pragma unroll
  for (int t = 0; t < T; ++t) a[0][t] = acc[t];
  lane_dot<W, T, 1, U>(rows, x, K, lane, a);
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = a[0][t];
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
// m for matrices ws (one type, K columns each) writing outs ([T, rows] f32 each): false where
// they do not fit one index space.
inline bool multi_rows(std::span<const Tensor* const> ws, std::span<Tensor* const> outs, int64_t K, int64_t T,
                       MultiRows& m) {
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
  return true;
}

// A row of a MultiRows index space: its matrix's weights and output, row count and local row
// (compile-time indices only, as in gemv_multi_kernel).
struct MultiRow {
  const void* w;
  float* out;
  int N, local;
};
__device__ __forceinline__ MultiRow multi_row(const MultiRows& m, int row) {
  MultiRow r{m.w[0], m.out[0], m.end[0], row};
#pragma unroll
  for (int i = 1; i < kMaxMulti; ++i)
    if (i < m.n && row >= m.end[i - 1]) r = MultiRow{m.w[i], m.out[i], m.end[i] - m.end[i - 1], row - m.end[i - 1]};
  return r;
}

// Blocks for a warp-per-row GEMV over `rows` rows: one row per warp. (Fewer, fully resident
// warps looping over ⌈rows / warps⌉ rows each measured slower on the H200, 2680 vs 4070 GB/s
// at 17408×5120: more warps keep more loads in flight.)
int gemv_blocks(int64_t rows) { return int((rows + kGemvWarps - 1) / kGemvWarps); }

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
}  // namespace qwen36::cuda
