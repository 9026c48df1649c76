// defines: q4k_f16_matmul — an experiment, reached only through its test hook: the multi-token
// GEMM of a tiled Q4_K matrix (cuda_quant_mma.cu's layout) on f16 tensor cores, for the 9 to 32
// tokens of batched decode and speculative verify.
//
// Why: the int8 multi-token kernel applies each k32 group's scales in f32 per (row, token):
// ~19 instructions a lane per 16 weights and n8 tile of tokens, so at 16 tokens a Q4_K tile costs
// ~418 instructions a lane against ~200 at one token, and a 27B b16 step runs its GEMMs at ~44% of
// the copy bandwidth (bench/RESULTS.md, sessions 29-30). Here the sub-block scale goes into the
// weights instead: A = q · sc (integers ≤ 945, exact in f16), built from the tile's nibbles with
// the f16 magic-number trick — (w & 0x000F000F) | 0x64006400 is 1024 + q (low nibbles),
// (w & 0x00F000F0) | 0x54005400 is 64 + q (high nibbles), and fma((m + q), sc, −m · sc) = q · sc
// with one exact rounding — so a tile's 8 groups accumulate in one f32 C per n8 tile with no
// per-group epilogue: the per-lane cost no longer grows with the tokens but with the weights
// (~2 instructions a weight-pair). x is rounded to f16 once (relative 2^-11, finer than the
// int8 path's per-32 rounding); the min term Σ_j dmin·m_j·X_j (X_j: a group's sum of the f16 x)
// is one more m16n8k16 MMA per tile whose k-halves hold X_j's f16 high and low parts (~2^-22).
// Per tile: out += d · C − dmin · C_min.
//
// Work split: blocks of 8 warps; a block's unit is (row-block of 8 row-tiles, super-block s),
// each warp the tile of its row-tile, so the 8 warps read the same activations, staged in shared
// memory per super-block (cp.async, double-buffered). Blocks take balanced contiguous unit ranges
// (s fastest); a row-block split between blocks leaves a piece per block in a workspace and the
// last block to arrive (an acquire-release counter) adds them in block order: deterministic.
//
// Limits of the experiment: f16 activations overflow past 65504 (no per-token scaling yet); the
// entry point is a test hook on its own stream with its own scratch, not a backend op.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_ops.cuh"
#include "backend/cuda/cuda_quant_mma_frags.cuh"

namespace qwen36::cuda {

namespace {

constexpr int kF16Warps = 8;             // warps a block: the row-tiles of a row-block
constexpr int kQ4kTile = 2304;           // TileLayout<Q4_K_T16>::kBytes
constexpr uint32_t kMagicLo = 0x64006400u;  // f16 1024: + q in mantissa bits 0-3
constexpr uint32_t kMagicHi = 0x54005400u;  // f16 64: + q in mantissa bits 4-7

__device__ __forceinline__ uint32_t hfma2u(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ uint32_t hsub2u(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ uint32_t hmul2u(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
__device__ __forceinline__ void hmma16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_h2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
// (v, v) as f16 for byte k of w (a 6-bit Q4_K scale or min): 1024 + v by the magic, minus 1024.
__device__ __forceinline__ uint32_t byte_h2(uint32_t w, int k) {
  const uint32_t s = uint32_t(k) | 0x40u | uint32_t(k) << 8 | 0x4000u;
  return hsub2u(prmt(w, 0x64646464u, s), kMagicLo);
}
// (byte k0, byte k1) of w as f16.
__device__ __forceinline__ uint32_t bytes_h2(uint32_t w, int k0, int k1) {
  const uint32_t s = uint32_t(k0) | 0x40u | uint32_t(k1) << 8 | 0x4000u;
  return hsub2u(prmt(w, 0x64646464u, s), kMagicLo);
}

// x [T, K] f32 → the B fragments of every (super-block s, group j, n8 tile n, lane): lane (g, t)
// holds token 8n + g's {x[4t], x[4t+2]}, {x[4t+1], x[4t+3]}, {x[16+4t], x[16+4t+2]},
// {x[16+4t+1], x[16+4t+3]} of the group (the k order a tile's nibble words give the A side), and
// per (s, n, lane) the min MMA's B: {hi(X_2t), hi(X_2t+1)}, {lo(X_2t), lo(X_2t+1)} of token 8n + g,
// X_j the f32 sum of group j's 32 f16 values. A warp per (s, j, n).
__global__ void f16_acts_kernel(const float* __restrict__ x, int T, int K, int NT, uint4* __restrict__ xh,
                                __half* __restrict__ xm) {
  griddep_trigger();
  griddep_wait();
  const int lane = int(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  const long long wid = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const long long groups = K / 32;
  if (wid >= groups * NT) return;
  const int n = int(wid % NT);
  const long long G = wid / NT;  // global group: super-block G / 8, group G % 8
  const int tok = 8 * n + g;
  float v[8] = {};
  if (tok < T) {
    const float* p = x + size_t(tok) * K + size_t(G) * 32;
    const float4 a = *reinterpret_cast<const float4*>(p + 4 * t), b = *reinterpret_cast<const float4*>(p + 16 + 4 * t);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
  float r[8], sum = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) sum += r[i] = __half2float(__float2half_rn(v[i]));
  xh[size_t(wid) * 32 + lane] = make_uint4(pack_h2(r[0], r[2]), pack_h2(r[1], r[3]), pack_h2(r[4], r[6]), pack_h2(r[5], r[7]));
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  if (t == 0) {
    const int j = int(G % 8);
    const __half hi = __float2half_rn(sum), lo = __float2half_rn(sum - __half2float(hi));
    __half* e = xm + ((size_t(G / 8) * NT + n) * 32 + g * 4 + j / 2) * 4;
    e[j & 1] = hi;
    e[2 + (j & 1)] = lo;
  }
}

struct F16Args {
  const uint8_t* w;
  const uint4* xh;
  const uint2* xm;
  float* out;
  float* part;  // [grid][2 slots][T][128]
  int* cnt;     // [row-blocks], zero
  int T, N, S, R, nblocks;
  long long units;
};

// The block holding unit u (the inverse of its range's start u0 = b·units / nblocks).
__device__ __forceinline__ int block_of(long long u, long long units, int nblocks) {
  return int(((u + 1) * nblocks - 1) / units);
}

template <int NT>
__global__ void __launch_bounds__(kF16Warps * 32, 2) q4k_f16_kernel(const F16Args a) {
  griddep_trigger();
  extern __shared__ uint4 f16_smem[];
  constexpr int kXs = 8 * NT * 32;  // uint4 per stage: the B fragments of a super-block
  constexpr int kMs = NT * 32;      // uint2 per stage: the min MMA's B
  uint4* xs[2] = {f16_smem, f16_smem + kXs};
  uint2* ms[2] = {reinterpret_cast<uint2*>(f16_smem + 2 * kXs), reinterpret_cast<uint2*>(f16_smem + 2 * kXs) + kMs};
  const int wib = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  const int b = int(blockIdx.x), S = a.S;
  const long long u0 = (long long)b * a.units / a.nblocks, u1 = (long long)(b + 1) * a.units / a.nblocks;
  if (u0 >= u1) return;

  auto tile_at = [&](long long u) -> const uint8_t* {
    const long long rb = u / S;
    const int rt = int(rb) * kF16Warps + wib;
    return rt < a.R ? a.w + (size_t(rt) * S + size_t(u - rb * S)) * kQ4kTile : nullptr;
  };
  auto load = [&](long long u, Raw<DType::Q4_K_T16>& r) {
    if (u >= u1) return;
    if (const uint8_t* p = tile_at(u)) load_tile<DType::Q4_K_T16, true>(p, lane, r);
  };
  auto stage = [&](long long u, int buf) {
    if (u < u1) {
      const long long s = u % S;
      const uint4* src = a.xh + size_t(s) * kXs;
      for (int i = int(threadIdx.x); i < kXs; i += kF16Warps * 32) cpa_16(xs[buf] + i, src + i);
      const uint4* msrc = reinterpret_cast<const uint4*>(a.xm + size_t(s) * kMs);
      for (int i = int(threadIdx.x); i < kMs / 2; i += kF16Warps * 32) cpa_16(reinterpret_cast<uint4*>(ms[buf]) + i, msrc + i);
    }
    cpa_commit();
  };

  Raw<DType::Q4_K_T16> A, B;
  load(u0, A);
  load(u0 + 1, B);
  griddep_wait();  // x's fragments come from the kernel before
  stage(u0, 0);

  float acc[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

  // One tile against the staged super-block.
  auto compute = [&](const Raw<DType::Q4_K_T16>& R, const uint4* __restrict__ xb, const uint2* __restrict__ mb) {
    uint4 hg, hg8;  // the headers of rows g and g + 8 (lane r holds row r % 16's)
    hg.x = __shfl_sync(0xffffffffu, R.h.x, g), hg8.x = __shfl_sync(0xffffffffu, R.h.x, g + 8);
    hg.y = __shfl_sync(0xffffffffu, R.h.y, g), hg8.y = __shfl_sync(0xffffffffu, R.h.y, g + 8);
    hg.z = __shfl_sync(0xffffffffu, R.h.z, g), hg8.z = __shfl_sync(0xffffffffu, R.h.z, g + 8);
    hg.w = __shfl_sync(0xffffffffu, R.h.w, g), hg8.w = __shfl_sync(0xffffffffu, R.h.w, g + 8);
    // 6-bit scales (groups 0-3, 4-7) and mins of both rows (Q4_K's 12 scale bytes)
    const uint32_t sc_lo = hg.y & 0x3F3F3F3Fu, sc_hi = (hg.w & 0x0F0F0F0Fu) | ((hg.y >> 2) & 0x30303030u);
    const uint32_t sc8_lo = hg8.y & 0x3F3F3F3Fu, sc8_hi = (hg8.w & 0x0F0F0F0Fu) | ((hg8.y >> 2) & 0x30303030u);
    const uint32_t m_lo = hg.z & 0x3F3F3F3Fu, m_hi = ((hg.w >> 4) & 0x0F0F0F0Fu) | ((hg.z >> 2) & 0x30303030u);
    const uint32_t m8_lo = hg8.z & 0x3F3F3F3Fu, m8_hi = ((hg8.w >> 4) & 0x0F0F0F0Fu) | ((hg8.z >> 2) & 0x30303030u);
    float C[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) C[n][0] = C[n][1] = C[n][2] = C[n][3] = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 q = R.q[i];
      const uint32_t X8 = q.x >> 8, Y8 = q.y >> 8, Z8 = q.z >> 8, W8 = q.w >> 8;
#pragma unroll
      for (int par = 0; par < 2; ++par) {
        const int j = 2 * i + par;
        const uint32_t mask = par ? 0x00F000F0u : 0x000F000Fu, magic = par ? kMagicHi : kMagicLo;
        const uint32_t neg = par ? 0xD400D400u : 0xE400E400u;  // −64, −1024
        const uint32_t sc = byte_h2(j < 4 ? sc_lo : sc_hi, j & 3), sc8 = byte_h2(j < 4 ? sc8_lo : sc8_hi, j & 3);
        const uint32_t bias = hmul2u(sc, neg), bias8 = hmul2u(sc8, neg);
        auto w0 = [&](uint32_t v) { return hfma2u((v & mask) | magic, sc, bias); };    // row g
        auto w1 = [&](uint32_t v) { return hfma2u((v & mask) | magic, sc8, bias8); };  // row g + 8
        const uint32_t a0 = w0(q.x), a1 = w1(q.y), a2 = w0(X8), a3 = w1(Y8);
        const uint32_t c0 = w0(q.z), c1 = w1(q.w), c2 = w0(Z8), c3 = w1(W8);
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          const uint4 bx = xb[(j * NT + n) * 32 + lane];
          hmma16(C[n], a0, a1, a2, a3, bx.x, bx.y);
          hmma16(C[n], c0, c1, c2, c3, bx.z, bx.w);
        }
      }
    }
    // The min term: A = m of groups 2t, 2t + 1 in both k halves, B = the groups' sums (hi, lo).
    const int k0 = (2 * t) & 3;
    const uint32_t am = bytes_h2(t < 2 ? m_lo : m_hi, k0, k0 + 1), am8 = bytes_h2(t < 2 ? m8_lo : m8_hi, k0, k0 + 1);
    const float d = h2f(uint16_t(hg.x & 0xFFFFu)), dmin = h2f(uint16_t(hg.x >> 16));
    const float d8 = h2f(uint16_t(hg8.x & 0xFFFFu)), dmin8 = h2f(uint16_t(hg8.x >> 16));
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      float cm[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      const uint2 mv = mb[n * 32 + lane];
      hmma16(cm, am, am8, am, am8, mv.x, mv.y);
      acc[n][0] = fmaf(d, C[n][0], fmaf(-dmin, cm[0], acc[n][0]));
      acc[n][1] = fmaf(d, C[n][1], fmaf(-dmin, cm[1], acc[n][1]));
      acc[n][2] = fmaf(d8, C[n][2], fmaf(-dmin8, cm[2], acc[n][2]));
      acc[n][3] = fmaf(d8, C[n][3], fmaf(-dmin8, cm[3], acc[n][3]));
    }
  };

  const long long rb_first = u0 / S;
  // A row-block's end in this block's range: written out whole, or as a piece (slot 0: the
  // block's first row-block, 1: its last) counted for the last arriver's sum.
  auto flush = [&](long long rb) {
    const int rt = int(rb) * kF16Warps + wib;
    const bool whole = rb * S >= u0 && rb * S + S <= u1;
    const int slot = rb == rb_first ? 0 : 1;
    float* piece = a.part + (size_t(b) * 2 + slot) * size_t(a.T) * 128;
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int tok = 8 * n + 2 * t + e;
        if (tok >= a.T || rt >= a.R) continue;
        if (whole) {
          a.out[size_t(tok) * a.N + size_t(rt) * 16 + g] = acc[n][e];
          a.out[size_t(tok) * a.N + size_t(rt) * 16 + g + 8] = acc[n][2 + e];
        } else {
          piece[tok * 128 + wib * 16 + g] = acc[n][e];
          piece[tok * 128 + wib * 16 + g + 8] = acc[n][2 + e];
        }
      }
#pragma unroll
    for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    if (whole) return;
    // Every thread's piece stores before thread 0's release; the last arriver sums in block order.
    __syncthreads();
    __shared__ int last;
    const int b0 = block_of(rb * S, a.units, a.nblocks), b1 = block_of(rb * S + S - 1, a.units, a.nblocks);
    if (threadIdx.x == 0) last = atomic_add_acq_rel(a.cnt + rb, 1) == b1 - b0;
    __syncthreads();
    if (!last) return;
    const int rows = min(a.R - int(rb) * kF16Warps, kF16Warps) * 16;
    for (int e = int(threadIdx.x); e < a.T * 128; e += kF16Warps * 32) {
      const int tok = e / 128, r = e % 128;
      if (r >= rows) continue;
      float s = 0.0f;
      for (int bb = b0; bb <= b1; ++bb) {
        const long long bu0 = (long long)bb * a.units / a.nblocks;
        const int sl = bu0 < rb * S ? 1 : 0;  // rb is that block's last row-block when it started before
        s += __ldcg(a.part + (size_t(bb) * 2 + sl) * size_t(a.T) * 128 + e);
      }
      a.out[size_t(tok) * a.N + size_t(rb) * 128 + r] = s;
    }
    if (threadIdx.x == 0) a.cnt[rb] = 0;
  };

  auto step = [&](Raw<DType::Q4_K_T16>& R, long long u, int buf) {
    stage(u + 1, buf ^ 1);
    cpa_wait<1>();
    __syncthreads();  // the super-block's activations are in
    const long long rb = u / S;
    if (tile_at(u)) compute(R, xs[buf], ms[buf]);
    load(u + 2, R);
    if (u % S == S - 1 || u == u1 - 1) flush(rb);
    __syncthreads();  // buffer buf is staged again two units on
  };
  for (long long u = u0; u < u1; u += 2) {
    step(A, u, 0);
    if (u + 1 < u1) step(B, u + 1, 1);
  }
}

}  // namespace

// out [T, N] f32 = x [T, K] f32 · wᵀ for a Q4_K_T16 w (device pointers); 1 ≤ T ≤ 32. False where
// it does not apply. A test hook: its own stream (the caller synchronizes the device around it)
// and scratch kept between calls.
bool q4k_f16_matmul(const float* x, int T, int K, const void* w, int N, float* out) {
  if (T < 1 || T > 32 || K % 256 != 0 || N % 16 != 0) return false;
  const int NT = T <= 16 ? 2 : 4;
  const int S = K / 256, R = N / 16, RB = (R + kF16Warps - 1) / kF16Warps;
  const long long units = (long long)RB * S;
  const int nblocks = int(std::min<long long>(units, (long long)dev_info().sms * 2));
  static cudaStream_t stream = [] {
    cudaStream_t st = nullptr;
    CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    return st;
  }();
  struct Buf {
    void* p = nullptr;
    size_t n = 0;
    void* need(size_t bytes, bool zero) {
      if (bytes > n) {
        if (p) CUDA_CHECK(cudaFree(p));
        CUDA_CHECK(cudaMalloc(&p, bytes));
        if (zero) CUDA_CHECK(cudaMemset(p, 0, bytes));  // the counters: each call leaves them zero
        n = bytes;
      }
      return p;
    }
  };
  static Buf xh_buf, xm_buf, part_buf, cnt_buf;
  auto* xh = static_cast<uint4*>(xh_buf.need(size_t(K / 32) * NT * 32 * sizeof(uint4), false));
  auto* xm = static_cast<__half*>(xm_buf.need(size_t(S) * NT * 32 * 4 * sizeof(__half), false));
  auto* part = static_cast<float*>(part_buf.need(size_t(nblocks) * 2 * T * 128 * sizeof(float), false));
  auto* cnt = static_cast<int*>(cnt_buf.need(size_t(RB) * sizeof(int), true));
  const long long warps = (long long)(K / 32) * NT;
  launch_pdl(f16_acts_kernel, dim3(unsigned((warps + 7) / 8)), dim3(256), 0, stream, x, T, K, NT, xh, xm);
  const F16Args a{static_cast<const uint8_t*>(w), xh, reinterpret_cast<const uint2*>(xm), out, part, cnt, T, N, S, R,
                  nblocks, units};
  const size_t smem = size_t(2) * (8 * NT * 32 * sizeof(uint4) + NT * 32 * sizeof(uint2));
  if (NT == 2)
    launch_pdl(q4k_f16_kernel<2>, dim3(unsigned(nblocks)), dim3(kF16Warps * 32), smem, stream, a);
  else
    launch_pdl(q4k_f16_kernel<4>, dim3(unsigned(nblocks)), dim3(kF16Warps * 32), smem, stream, a);
  CUDA_CHECK(cudaGetLastError());
  return true;
}

}  // namespace qwen36::cuda
