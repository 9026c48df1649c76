// The device's tiled layout of quantized matrices (cuda_quant_mma.cu's header describes it):
// repacking GGUF / HF rows into tiles (quant_tile, quant_tile_into: repack_kernel,
// repack_batch_kernel) and dequantizing tiles back to bf16 / f32 rows (dequant_tile, a warp per
// tile) for the prefill GEMMs through cuBLAS (quant_tiled_dequant_gemm), for exact_matmul, for
// callers that want rows (quant_tiled_dequant_rows) and for the routed experts' prefill
// (quant_dequant_tiled_experts). The tensor-core GEMM that reads the tiles is cuda_quant_mma.cu.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_quant_blocks.cuh"
#include "backend/cuda/cuda_quant_mma_frags.cuh"

namespace qwen36::cuda {

namespace {

// ================================================================================================
// Repacking (GGUF rows → tiles) and dequantization (tiles → rows)
// ================================================================================================

// The 4-bit code of weight k (0..255) of a Q4_K block; the 6-bit code of a Q6_K block.
__device__ __forceinline__ int q4k_code(const uint8_t* blk, int k) {
  return (blk[16 + 32 * (k >> 6) + (k & 31)] >> (4 * ((k >> 5) & 1))) & 15;
}
__device__ __forceinline__ int q6k_code(const uint8_t* blk, int k) {
  const int n = k >> 7, m = (k >> 5) & 3, l = k & 31;
  const int lo = (blk[64 * n + 32 * (m & 1) + l] >> (4 * (m >> 1))) & 15;
  const int hi = (blk[128 + 32 * n + l] >> (2 * m)) & 3;
  return lo | hi << 4;
}

// Byte `off` of tile (r, s), read from the GGUF matrix src (rows of rb bytes).
template <DType D>
__device__ uint8_t tile_byte(const uint8_t* __restrict__ src, size_t rb, int r, int s, int off) {
  // Position of a code byte: load i, lane L = 4g + t, word w (X/Y of rows g / g + 8), byte b.
  const int i = off >> 9, L = (off >> 4) & 31, w = (off >> 2) & 3, b = off & 3, g = L >> 2, t = L & 3;
  if constexpr (D == DType::Q4_K_T16) {
    if (off < 2048) {  // the low nibble of group 2i's weight, the high nibble of group 2i + 1's
      const int row = 16 * r + g + 8 * (w & 1), k = 64 * i + 16 * (w >> 1) + 4 * t + b;
      const uint8_t* blk = src + size_t(row) * rb + size_t(s) * 144;
      return uint8_t(q4k_code(blk, k) | q4k_code(blk, k + 32) << 4);
    }
    const int o = off - 2048;
    return src[size_t(16 * r + (o >> 4)) * rb + size_t(s) * 144 + (o & 15)];
  } else if constexpr (D == DType::Q6_K_T16) {
    if (off < 2048) {
      const int row = 16 * r + g + 8 * (w & 1), j = 2 * i + (w >> 1), k = 32 * j + 4 * t + b;
      const uint8_t* blk = src + size_t(row) * rb + size_t(s) * 210;
      return uint8_t((q6k_code(blk, k) & 15) | (q6k_code(blk, k + 16) & 15) << 4);
    }
    if (off < 3072) {
      const int j = 4 * (i - 4) + w, k = 32 * j + 4 * t + b;
      const uint8_t* b0 = src + size_t(16 * r + g) * rb + size_t(s) * 210;
      const uint8_t* b1 = b0 + 8 * rb;
      return uint8_t((q6k_code(b0, k) >> 4) | (q6k_code(b1, k) >> 4) << 2 | (q6k_code(b0, k + 16) >> 4) << 4 |
                     (q6k_code(b1, k + 16) >> 4) << 6);
    }
    if (off < 3328) {
      const int o = off - 3072;
      return src[size_t(16 * r + (o >> 4)) * rb + size_t(s) * 210 + 192 + (o & 15)];
    }
    const int o = off - 3328;
    return src[size_t(16 * r + (o >> 1)) * rb + size_t(s) * 210 + 208 + (o & 1)];
  } else if constexpr (D == DType::NVFP4_B64_T16) {
    // Super-block s of a row is its blocks 4s .. 4s + 3 (40 bytes: f32 g, 4 e4m3 scales, 32 code
    // bytes; element e in nibble e % 2 of code byte e / 2). Code byte b of a word holds the
    // selector nibbles of weights k0, k0 + 1 (TileLayout).
    if (off < 2048) {
      const int row = 16 * r + g + 8 * (w & 1), j = 2 * i + (w >> 1);
      const int k0 = 32 * j + (b < 2 ? 4 * t + 2 * b : 16 + 4 * t + 2 * (b - 2));
      const uint8_t* blk = src + size_t(row) * rb + size_t(4 * s + (k0 >> 6)) * 40 + 8;
      return blk[(k0 & 63) >> 1];  // k0 even: its pair of nibbles is one code byte, low first
    }
    const int o = off - 2048, row = o >> 5, half = (o >> 4) & 1, f = o & 15;
    const uint8_t* b0 = src + size_t(16 * r + row) * rb + size_t(4 * s + 2 * half) * 40;
    if (f < 8) return b0[40 * (f >> 2) + 4 + (f & 3)];  // 16-group 8·half + f: block 2·half + f / 4
    return b0[40 * ((f - 8) >> 2) + ((f - 8) & 3)];     // the two blocks' f32 g
  } else if constexpr (D == DType::W4_G32_T16) {
    // Super-block s of a row is its blocks 8s .. 8s + 7 (20 bytes: u16 s, u8 z, u8 kind, 16 code
    // bytes; element e < 16 in the low nibble of code byte e, e + 16 in its high one: the tile's
    // code byte as it stands).
    if (off < 2048) {
      const int row = 16 * r + g + 8 * (w & 1), j = 2 * i + (w >> 1);
      return src[size_t(row) * rb + size_t(8 * s + j) * 20 + 4 + 4 * t + b];
    }
    const int o = off - 2048, f = o & 15;
    const uint8_t* b0 = src + size_t(16 * r + (o >> 5)) * rb + size_t(8 * s + 4 * ((o >> 4) & 1)) * 20;
    if (f < 8) return b0[20 * (f >> 1) + (f & 1)];  // the 4 scales
    if (f < 12) return b0[20 * (f - 8) + 2];        // the 4 zeros
    if (f > 12) return 0;
    uint8_t kinds = 0;
    for (int q = 0; q < 4; ++q) kinds |= uint8_t((b0[20 * q + 3] & 1) << q);
    return kinds;
  } else if constexpr (D == DType::W4_G128_T16) {
    // Super-block s of a row is its blocks 2s, 2s + 1 (68 bytes: u16 s, u8 z, u8 kind, 64 code
    // bytes; element e < 64 in the low nibble of code byte e, e ≥ 64 in the high one of e − 64).
    if (off < 2048) {
      const int row = 16 * r + g + 8 * (w & 1), j = 2 * i + (w >> 1), k = 32 * j + 4 * t + b;
      const uint8_t* blk = src + size_t(row) * rb + size_t(2 * s + (k >> 7)) * 68 + 4;
      auto code = [&](int e) { return (blk[e & 63] >> (4 * (e >> 6))) & 15; };
      return uint8_t(code(k & 127) | code((k & 127) + 16) << 4);
    }
    const int o = off - 2048, f = o & 7;
    const uint8_t* b0 = src + size_t(16 * r + (o >> 3)) * rb + size_t(2 * s) * 68;
    if (f < 4) return b0[68 * (f >> 1) + (f & 1)];  // s0, s1
    if (f < 6) return b0[68 * (f - 4) + 2];          // z0, z1
    return f == 6 ? uint8_t((b0[3] & 1) | (b0[68 + 3] & 1) << 1) : uint8_t(0);
  } else {
    if (off < 4096) {
      const int row = 16 * r + g + 8 * (w & 1), kk = 4 * t + b + 16 * (w >> 1);
      return src[size_t(row) * rb + size_t(8 * s + i) * 34 + 2 + kk];
    }
    const int o = off - 4096;
    return src[size_t(16 * r + (o >> 4)) * rb + size_t(8 * s + ((o & 15) >> 1)) * 34 + (o & 1)];
  }
}

// dst (tiled, S super-blocks per row) from src (GGUF rows); one thread per byte.
template <DType D>
__global__ void repack_kernel(const uint8_t* __restrict__ src, size_t rb, int S, size_t total, uint8_t* __restrict__ dst) {
  constexpr int B = TileLayout<D>::kBytes;
  for (size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x; idx < total; idx += size_t(gridDim.x) * blockDim.x) {
    const size_t tile = idx / B;
    const int off = int(idx - tile * B);
    dst[idx] = tile_byte<D>(src, rb, int(tile / size_t(S)), int(tile % size_t(S)), off);
  }
}

// Several matrices repacked in one launch (quant_tile_into's batches: expert offload's device
// share, a few experts' gate, up and down per pass): grid.y a job, its dtype chosen per job.
struct RepackJob {
  const uint8_t* src;
  uint8_t* dst;
  size_t rb, total;
  int S;
  DType tiled;
};
constexpr int kMaxRepackJobs = 32;
struct RepackJobs {
  RepackJob j[kMaxRepackJobs];
};
template <DType D>
__device__ void repack_job(const RepackJob& j) {
  constexpr int B = TileLayout<D>::kBytes;
  const size_t step = size_t(gridDim.x) * blockDim.x;
  for (size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x; idx < j.total; idx += step) {
    const size_t tile = idx / B;
    const int off = int(idx - tile * B);
    j.dst[idx] = tile_byte<D>(j.src, j.rb, int(tile / size_t(j.S)), int(tile % size_t(j.S)), off);
  }
}
__global__ void repack_batch_kernel(const RepackJobs jobs) {
  const RepackJob& j = jobs.j[blockIdx.y];
  switch (j.tiled) {
    case DType::Q4_K_T16: return repack_job<DType::Q4_K_T16>(j);
    case DType::Q6_K_T16: return repack_job<DType::Q6_K_T16>(j);
    case DType::Q8_0_T16: return repack_job<DType::Q8_0_T16>(j);
    case DType::W4_G128_T16: return repack_job<DType::W4_G128_T16>(j);
    case DType::NVFP4_B64_T16: return repack_job<DType::NVFP4_B64_T16>(j);
    case DType::W4_G32_T16: return repack_job<DType::W4_G32_T16>(j);
    default: return;
  }
}

// The 16 × 256 weights of one tile to out (row-major, ld elements a row; out at the tile's row 0
// and first column), each rounded once as quant/dequantize.cpp. A warp per tile: lane L = 4g + t
// dequantizes rows g and g + 8, weights 4t .. 4t + 3 and 16 + 4t .. 16 + 4t + 3 of each k32
// group: exactly the code words its own loads bring (each 16-byte load of the warp is 512
// contiguous bytes of the tile, read once), and each store instruction of the warp writes 8 rows ×
// 32 contiguous bytes (bf16; 64 for f32): whole sectors. (A thread per k32 group, the first form,
// read each code word's sector from 4 warps and wrote half sectors: ~1.8 TB/s of traffic.)
template <typename O>
__device__ __forceinline__ void store4(O* o, float a, float b, float c, float d) {
  if constexpr (std::is_same_v<O, float>) {
    *reinterpret_cast<float4*>(o) = make_float4(a, b, c, d);
  } else {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(a, b), hi = __floats2bfloat162_rn(c, d);
    *reinterpret_cast<uint2*>(o) = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
  }
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

template <DType D, typename O>
__device__ __forceinline__ void dequant_tile(const uint8_t* __restrict__ tile, O* __restrict__ out, size_t ld, int lane) {
  const int g = lane >> 2, t = lane & 3;
  const uint4* v = reinterpret_cast<const uint4*>(tile) + lane;  // load i of this lane: v[32 i]
  if constexpr (nibble_tile(D) || D == DType::Q6_K_T16 || D == DType::NVFP4_B64_T16) {
    uint4 code[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) code[i] = __ldcs(v + 32 * i);
    if constexpr (D == DType::NVFP4_B64_T16) {
      using L = TileLayout<D>;
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        const uint4* hp = reinterpret_cast<const uint4*>(tile + L::kHeaders) + 2 * (g + 8 * hi);
        const uint4 hd[2] = {__ldg(hp), __ldg(hp + 1)};
        O* row = out + size_t(g + 8 * hi) * ld + 4 * t;
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          const uint4& h = hd[jj >> 2];
          const int i = jj & 3;
          const uint32_t sw = i < 2 ? h.x : h.y;  // the scale bytes 2i, 2i + 1 of the half
          const float sa = e4m3_f32((sw >> (16 * (i & 1))) & 255u), sb = e4m3_f32((sw >> (16 * (i & 1) + 8)) & 255u);
          const float gs = __uint_as_float(i < 2 ? h.z : h.w);
          const uint32_t x = word(code[jj >> 1], 2 * (jj & 1) + hi);
          const uint32_t lo = nvfp4_frag(x), hv = nvfp4_frag(x >> 16);
          // (e2m1 · e4m3(s)) · g, as quant/hf_blocks.cpp: the first product exact, one rounding
          auto q = [&](uint32_t w, int b, float s) { return ((float(sext8(w >> (8 * b))) * 0.5f) * s) * gs; };
          store4(row + 32 * jj, q(lo, 0, sa), q(lo, 1, sa), q(lo, 2, sa), q(lo, 3, sa));
          store4(row + 32 * jj + 16, q(hv, 0, sb), q(hv, 1, sb), q(hv, 2, sb), q(hv, 3, sb));
        }
      }
    } else if constexpr (D == DType::W4_G128_T16 || D == DType::W4_G32_T16) {
      using L = TileLayout<D>;
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        [[maybe_unused]] uint2 h;
        [[maybe_unused]] uint4 hh[2];
        if constexpr (D == DType::W4_G128_T16) {
          h = __ldg(reinterpret_cast<const uint2*>(tile + L::kHeaders) + g + 8 * hi);
        } else {
          const uint4* hp = reinterpret_cast<const uint4*>(tile + L::kHeaders) + 2 * (g + 8 * hi);
          hh[0] = __ldg(hp), hh[1] = __ldg(hp + 1);
        }
        O* row = out + size_t(g + 8 * hi) * ld + 4 * t;
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          float sc;
          int z;
          if constexpr (D == DType::W4_G128_T16) {
            sc = w4_scale(h, jj >> 2), z = int((h.y >> (8 * (jj >> 2))) & 255u);
          } else {
            sc = w4g32_scale(hh[jj >> 2], jj & 3), z = w4g32_zero(hh[jj >> 2], jj & 3);
          }
          const uint32_t x = word(code[jj >> 1], 2 * (jj & 1) + hi);
          // scale · float(q − z), as quant/hf_blocks.cpp: one rounding
          auto q = [&](int sh) { return sc * float(int((x >> sh) & 15u) - z); };
          store4(row + 32 * jj, q(0), q(8), q(16), q(24));
          store4(row + 32 * jj + 16, q(4), q(12), q(20), q(28));
        }
      }
    } else if constexpr (D == DType::Q4_K_T16) {
      using L = TileLayout<D>;
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        const uint4 h = __ldg(reinterpret_cast<const uint4*>(tile + L::kHeaders) + g + 8 * hi);
        const float d = h2f(uint16_t(h.x & 0xFFFFu)), dmin = h2f(uint16_t(h.x >> 16));
        O* row = out + size_t(g + 8 * hi) * ld + 4 * t;
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          int sc, m;
          k_scale_min(h, jj, sc, m);
          const float d0 = d * float(sc), mm = dmin * float(m);
          uint32_t cq[4];  // the group's first 16 in cq[hi], its second in cq[2 + hi]
          q4k_codes(code[jj >> 1], jj, cq);
          auto q = [&](uint32_t x, int sh) { return fmaf(d0, float((x >> sh) & 15u), -mm); };
          store4(row + 32 * jj, q(cq[hi], 0), q(cq[hi], 8), q(cq[hi], 16), q(cq[hi], 24));
          store4(row + 32 * jj + 16, q(cq[2 + hi], 0), q(cq[2 + hi], 8), q(cq[2 + hi], 16), q(cq[2 + hi], 24));
        }
      }
    } else {
      using L = TileLayout<D>;
      const uint4 high[2] = {__ldcs(v + L::kHigh / 16), __ldcs(v + L::kHigh / 16 + 32)};
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        const uint4 sv = __ldg(reinterpret_cast<const uint4*>(tile + L::kScales) + g + 8 * hi);
        const float d = h2f(ld_u16(tile + L::kD + 2 * (g + 8 * hi)));
        O* row = out + size_t(g + 8 * hi) * ld + 4 * t;
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          const uint32_t x = word(code[jj >> 1], 2 * (jj & 1) + hi), hb = word(high[jj >> 2], jj & 3);
          const uint32_t s2 = word(sv, jj >> 1) >> (16 * (jj & 1));
          const int sa = int(int8_t(s2 & 255u)), sb = int(int8_t((s2 >> 8) & 255u));
          // d · float(sc · (q − 32)), as quant/dequantize.cpp: the product is an exact integer.
          auto q = [&](int b, int nib, int s) {
            const int v6 = int((x >> (8 * b + 4 * nib)) & 15u) | int((hb >> (8 * b + 4 * nib + 2 * hi)) & 3u) << 4;
            return d * float(s * (v6 - 32));
          };
          store4(row + 32 * jj, q(0, 0, sa), q(1, 0, sa), q(2, 0, sa), q(3, 0, sa));
          store4(row + 32 * jj + 16, q(0, 1, sb), q(1, 1, sb), q(2, 1, sb), q(3, 1, sb));
        }
      }
    }
  } else {
    using L = TileLayout<D>;
    uint4 code[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) code[i] = __ldcs(v + 32 * i);
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const uint4 dv = __ldg(reinterpret_cast<const uint4*>(tile + L::kD) + g + 8 * hi);
      O* row = out + size_t(g + 8 * hi) * ld + 4 * t;
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        const float d = h2f(uint16_t(word(dv, jj >> 1) >> (16 * (jj & 1))));
        const uint32_t xa = word(code[jj], hi), xb = word(code[jj], hi + 2);
        auto q = [&](uint32_t x, int b) { return d * float(int(int8_t(x >> (8 * b)))); };
        store4(row + 32 * jj, q(xa, 0), q(xa, 1), q(xa, 2), q(xa, 3));
        store4(row + 32 * jj + 16, q(xb, 0), q(xb, 1), q(xb, 2), q(xb, 3));
      }
    }
  }
}

// out[n − r0, :] = row n, r0 ≤ n < r0 + nrows (row-major, K per row; r0, nrows multiples of 16):
// a warp per tile, grid-stride in tile order (a warp's neighbours write the same rows' next 512
// bytes).
template <DType D, typename O>
__global__ void __launch_bounds__(256) dequant_tiled_kernel(const uint8_t* __restrict__ w, int K, int r0, int nrows,
                                                            O* __restrict__ out) {
  const int S = K >> 8, lane = threadIdx.x & 31;
  const long long tiles = (long long)(nrows >> 4) * S, warps = (long long)gridDim.x * (blockDim.x >> 5);
  for (long long i = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5; i < tiles; i += warps) {
    const int rt = int(i / S), s = int(i - (long long)rt * S);
    dequant_tile<D>(w + (size_t(r0 >> 4) * S + size_t(i)) * TileLayout<D>::kBytes, out + size_t(rt) * 16 * K + size_t(s) * 256,
                    size_t(K), lane);
  }
}

// MoE prefill: matrices kind0 .. kind0 + nkind − 1 (0 gate, 1 up, 2 down; rows × K each, tiled)
// of experts e0 + es, es < ne, to bf16 slot es of scratch ([ne][3][rows·K], kind κ at κ·rows·K),
// the same values as cuda_quant_matmul.cu's dequant_experts_kernel gives for GGUF rows (both
// round once as quant/dequantize.cpp); experts without pairs (off[e + 1] == off[e]) are skipped.
template <DType D>
__global__ void __launch_bounds__(256) dequant_tiled_experts_kernel(const void* const* __restrict__ table, int kind0,
                                                                    int nkind, const int32_t* __restrict__ off, int e0,
                                                                    int ne, int rows, int K,
                                                                    __nv_bfloat16* __restrict__ scratch) {
  const int S = K >> 8, lane = threadIdx.x & 31;
  const long long per_mat = (long long)(rows >> 4) * S, n = per_mat * nkind * ne;
  const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
  const size_t mat_elems = size_t(rows) * K;
  for (long long i = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5; i < n; i += warps) {
    const long long m = i / per_mat, tile = i - m * per_mat;
    const int es = int(m / nkind), kind = kind0 + int(m - (long long)es * nkind), e = e0 + es;
    if (off[e + 1] == off[e]) continue;
    const int rt = int(tile / S), s = int(tile - (long long)rt * S);
    dequant_tile<D>(static_cast<const uint8_t*>(table[3 * e + kind]) + size_t(tile) * TileLayout<D>::kBytes,
                    scratch + (size_t(es) * 3 + size_t(kind)) * mat_elems + size_t(rt) * 16 * K + size_t(s) * 256,
                    size_t(K), lane);
  }
}

// ================================================================================================
// Host side
// ================================================================================================

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <DType D, typename O>
void launch_dequant_tiled(Ctx& c, const Tensor& w, int r0, int nrows, O* out) {
  const int K = int(w.cols());
  QWEN36_CHECK(r0 % 16 == 0 && nrows % 16 == 0, "dequantize: rows {} + {} of a tiled matrix", r0, nrows);
  const int64_t tiles = int64_t(nrows / 16) * (K / 256);
  if (tiles == 0) return;
  const int blocks = int(std::min<int64_t>(blocks_for(tiles, 8), int64_t(dev_info().sms) * 8));
  dequant_tiled_kernel<D, O><<<blocks, 256, 0, c.stream>>>(static_cast<const uint8_t*>(w.data), K, r0, nrows, out);
  CUDA_LAUNCH_CHECK();
}

}  // namespace

DType quant_tiled_type(DType t) {
  switch (t) {
    case DType::Q4_K: return DType::Q4_K_T16;
    case DType::Q6_K: return DType::Q6_K_T16;
    case DType::Q8_0: return DType::Q8_0_T16;
    case DType::W4_G128: return DType::W4_G128_T16;
    case DType::NVFP4_B64: return DType::NVFP4_B64_T16;
    case DType::W4_G32: return DType::W4_G32_T16;
    default: return DType::F32;
  }
}

bool quant_tile_ok(const Tensor& w) {
  return quant_tiled_type(w.dtype) != DType::F32 && w.ndim == 2 && w.rows() > 0 && w.rows() % 16 == 0 &&
         w.cols() > 0 && w.cols() % 256 == 0 && w.rows() < (int64_t(1) << 30) && w.cols() < (int64_t(1) << 24) &&
         aligned16(w.data);
}

namespace {

void repack(Ctx& c, const Tensor& w, const void* src, void* dst) {
  const size_t bytes = w.nbytes();
  const int S = int(w.cols() / 256);
  with_tiled_dtype(quant_tiled_type(w.dtype), [&](auto dt) {
    constexpr DType D = decltype(dt)::value;
    const int blocks = int(std::min<size_t>((bytes + 255) / 256, size_t(dev_info().sms) * 64));
    repack_kernel<D><<<blocks, 256, 0, c.stream>>>(static_cast<const uint8_t*>(src), w.row_bytes(), S, bytes,
                                                   static_cast<uint8_t*>(dst));
    CUDA_LAUNCH_CHECK();
  });
}

}  // namespace

bool quant_tile(Ctx& c, Tensor& w) {
  if (!quant_tile_ok(w)) return false;
  Temp<uint8_t> src(c, w.nbytes());
  CUDA_CHECK(cudaMemcpyAsync(src.get(), w.data, w.nbytes(), cudaMemcpyDeviceToDevice, c.stream));
  repack(c, w, src.get(), w.data);
  w.dtype = quant_tiled_type(w.dtype);
  return true;
}

bool quant_tile_into(Ctx& c, std::span<const Tensor> ws, std::span<void* const> dsts, std::span<Tensor> tiled) {
  if (ws.size() != dsts.size() || ws.size() != tiled.size()) return false;
  for (size_t i = 0; i < ws.size(); ++i)
    if (!quant_tile_ok(ws[i]) || !aligned16(dsts[i])) return false;
  for (size_t i0 = 0; i0 < ws.size(); i0 += kMaxRepackJobs) {
    RepackJobs jobs{};
    const size_t n = std::min<size_t>(kMaxRepackJobs, ws.size() - i0);
    size_t most = 0;  // this launch's largest matrix sizes its grid (not an earlier batch's)
    for (size_t i = 0; i < n; ++i) {
      const Tensor& w = ws[i0 + i];
      jobs.j[i] = {static_cast<const uint8_t*>(w.data), static_cast<uint8_t*>(dsts[i0 + i]), w.row_bytes(), w.nbytes(),
                   int(w.cols() / 256), quant_tiled_type(w.dtype)};
      most = std::max(most, w.nbytes());
    }
    const unsigned blocks = unsigned(std::min<size_t>((most + 255) / 256, size_t(dev_info().sms) * 8));
    repack_batch_kernel<<<dim3(blocks, unsigned(n)), 256, 0, c.stream>>>(jobs);
    CUDA_LAUNCH_CHECK();
  }
  for (size_t i = 0; i < ws.size(); ++i) {
    tiled[i] = ws[i];
    tiled[i].data = dsts[i];
    tiled[i].dtype = quant_tiled_type(ws[i].dtype);
  }
  return true;
}

bool quant_tiled_dequant_rows(Ctx& c, const Tensor& w, int64_t r0, int64_t n, __nv_bfloat16* out) {
  QWEN36_CHECK(r0 >= 0 && n >= 0 && r0 + n <= w.rows() && w.rows() < (int64_t(1) << 31), "dequantize: rows {} + {} of {}",
               r0, n, w.shape_str());
  return with_tiled_dtype(w.dtype, [&](auto dt) { launch_dequant_tiled<decltype(dt)::value>(c, w, int(r0), int(n), out); });
}

void quant_dequant_tiled_experts(Ctx& c, DType t, const void* const* table, int kind0, int nkind, const int32_t* off,
                                 int e0, int ne, int64_t rows, int64_t K, __nv_bfloat16* scratch) {
  QWEN36_CHECK(rows % 16 == 0 && K % 256 == 0, "moe_experts: tiled experts of {} × {}", rows, K);
  const bool ok = with_tiled_dtype(t, [&](auto dt) {
    constexpr DType D = decltype(dt)::value;
    const int64_t tiles = int64_t(ne) * nkind * (rows / 16) * (K / 256);
    if (tiles == 0) return;
    const int blocks = int(std::min<int64_t>(blocks_for(tiles, 8), int64_t(dev_info().sms) * 8));
    dequant_tiled_experts_kernel<D><<<blocks, 256, 0, c.stream>>>(table, kind0, nkind, off, e0, ne, int(rows), int(K),
                                                                  scratch);
    CUDA_LAUNCH_CHECK();
  });
  QWEN36_CHECK(ok, "moe_experts: {} is not a tiled weight type", dtype_name(t));
}

void quant_tiled_dequant_gemm(Ctx& c, const Tensor& w, const float* x, float* out, int T, int N, int K, const void* xh) {
  const bool ok = with_tiled_dtype(w.dtype, [&](auto dt) {
    sliced_dequant_gemm(
        c, x, out, T, N, K, 16,
        [&](int n0, int ns, auto* dst) { launch_dequant_tiled<decltype(dt)::value>(c, w, n0, ns, dst); }, xh);
  });
  QWEN36_CHECK(ok, "matmul: {} is not a tiled weight type", dtype_name(w.dtype));
}

}  // namespace qwen36::cuda

namespace qwen36 {

bool cuda_tile_matrix(Tensor& w) {
  cuda::Ctx c;  // the legacy default stream; synchronous
  const bool ok = cuda::quant_tile(c, w);
  CUDA_CHECK(cudaDeviceSynchronize());
  return ok;
}

}  // namespace qwen36
