#pragma once
// defines: what the attention kernels share (cuda_attention.cu, cuda_attention_decode.cu,
//          cuda_flash_attention.cu): the KV-cache kinds and their row sizes, the
//          dequantisation of cached rows into f16 (formats: backend/kv_cache.h), the decode
//          kernel's stage layout and its mma fragments built straight from raw quantised rows
//          (DecodeStage, DecodeFrag), the warp Walsh–Hadamard transform, and the entry points
//          of the two attention kernel files.
//
// Element types of the tensor-core tiles: bf16 for f32 and bf16 caches; f16 for fp8, q8_0 and
// q4_0, whose values are exact in f16 (fp8) or defined as f16(d·q) (kv_cache.h), so the tiles
// hold exactly the values the CPU twin reads.

#include <climits>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_ops.cuh"
#include "backend/cuda/cuda_sm80.cuh"

namespace qwen36::cuda {

enum class KvKind : int { F32, BF16, F8, Q8, Q4 };

inline KvKind kv_kind(DType t) {
  switch (t) {
    case DType::BF16: return KvKind::BF16;
    case DType::F8_E4M3: return KvKind::F8;
    case DType::Q8_0: return KvKind::Q8;
    case DType::Q4_0: return KvKind::Q4;
    default: return KvKind::F32;
  }
}
__host__ __device__ constexpr bool kv_quantized(KvKind k) { return k == KvKind::F8 || k == KvKind::Q8 || k == KvKind::Q4; }
__host__ __device__ constexpr bool kv_rotated(KvKind k) { return k == KvKind::Q8 || k == KvKind::Q4; }
// Bytes of one (position, kv head) row of D values.
__host__ __device__ constexpr int kv_row_bytes(KvKind k, int D) {
  return k == KvKind::F32 ? 4 * D : k == KvKind::BF16 ? 2 * D : k == KvKind::F8 ? D : k == KvKind::Q8 ? 34 * (D / 32) : 18 * (D / 32);
}

template <typename E>
__device__ __forceinline__ void store4(E* dst, float4 x) {  // 4 values, 8-byte aligned
  uint2 u;
  u.x = pack2<E>(x.x, x.y);
  u.y = pack2<E>(x.z, x.w);
  *reinterpret_cast<uint2*>(dst) = u;
}

// ---- dequantisation (formats: backend/kv_cache.h) ----
__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }

// Values 8c .. 8c + 7 of one cached row (global or shared memory) as 8 f16 in a uint4.
// fp8: the exponent/mantissa bits shifted into an f16 give e4m3·2^-8 exactly (subnormals
// included), times f16 2^(e+8) (`s2`: both halves) gives e4m3·2^e exactly.
// q8_0 / q4_0: integers through the f16 magic 1024 + u (exact), then d·q rounded once.
template <KvKind K>
__device__ __forceinline__ uint4 dequant8(const uint8_t* row, int c, __half2 s2) {
  uint32_t h[4];
  if constexpr (K == KvKind::F8) {
    const uint2 w = *reinterpret_cast<const uint2*>(row + 8 * c);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t x = __byte_perm(i < 2 ? w.x : w.y, 0, (i & 1) ? 0x3424 : 0x1404);  // bytes 2i, 2i+1 → bits 8-15, 24-31
      h[i] = (x & 0x80008000u) | ((x >> 1) & 0x3f803f80u);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      __half2 v = __hmul2(*reinterpret_cast<const __half2*>(&h[i]), s2);
      h[i] = *reinterpret_cast<const uint32_t*>(&v);
    }
  } else {
    constexpr int BB = K == KvKind::Q8 ? 34 : 18;  // block bytes
    const uint8_t* blk = row + (c >> 2) * BB;
    const __half d = __ushort_as_half(static_cast<unsigned short>(ld_u16(blk)));
    const __half2 d2 = __halves2half2(d, d);
    const int j0 = (c & 3) * 8;  // first element of the chunk within its block
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t x;
      __half2 off;
      if constexpr (K == KvKind::Q8) {
        x = __byte_perm(ld_u16(blk + 2 + j0 + 2 * i) ^ 0x8080u, 0x6464u, 0x5140);  // 1024 + q + 128
        off = __float2half2_rn(1152.0f);
      } else {
        const uint32_t w = ld_u16(blk + 2 + (j0 & 15) + 2 * i);
        x = __byte_perm(j0 < 16 ? (w & 0x0f0fu) : ((w >> 4) & 0x0f0fu), 0x6464u, 0x5140);  // 1024 + nibble
        off = __float2half2_rn(1032.0f);
      }
      const __half2 v = __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&x), off), d2);
      h[i] = *reinterpret_cast<const uint32_t*>(&v);
    }
  }
  return make_uint4(h[0], h[1], h[2], h[3]);
}
// The f16 multiplier of a row's fp8 values (its f32 scale 2^e, e in [-15, 7], times 256).
__device__ __forceinline__ __half2 fp8_row_mult(float scale) { return __float2half2_rn(scale * 256.0f); }

// ---- decode: mma fragments straight from raw cached rows ----
// The decode kernel (cuda_attention_decode.cu) copies each warp step's 16 K and 16 V rows raw
// into a stage and builds the mma operands from those bytes in registers: no f16 tile is
// written and read back (a third of the shared-memory traffic, and no ldmatrix). Two freedoms
// make the loads cheap and conflict-free:
//  - S = Q·Kᵀ sums over dims in any order, so the dims behind each k index of a k-step are
//    chosen per format (q_dims): a thread's B values are bytes it can load in one piece, and
//    q is placed to match once, when its fragments are built.
//  - Oᵀ = Vᵀ·Pᵀ has dims as its m index, so the dims behind each fragment row are chosen too
//    (v_dim): a thread's V values are a contiguous run of each of its 4 key rows; the output
//    is written back through the same map.
// Integers enter f16 through the magic 1024 + u; fp8 bytes through the bit shift of dequant8
// (f16 e4m3·2^-8). Values are those of dequant8 (the CPU twin's), bit for bit. These are
// __host__ __device__ so that a host program can check the layouts against kv_decode_row.
#ifdef __CUDA_ARCH__
#define KV_UNROLL _Pragma("unroll")
#else
#define KV_UNROLL
#endif
__host__ __device__ __forceinline__ uint32_t bperm(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
  return __byte_perm(x, y, s);
#else
  const uint64_t v = (uint64_t(y) << 32) | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= uint32_t((v >> (8 * ((s >> (4 * i)) & 7))) & 0xffu) << (8 * i);
  return r;
#endif
}
__host__ __device__ __forceinline__ uint32_t h2bits(__half2 h) {
  const __half2_raw r = h;
  return uint32_t(r.x) | uint32_t(r.y) << 16;
}
__host__ __device__ __forceinline__ __half2 bits_h2(uint32_t u) {
  __half2_raw r;
  r.x = static_cast<unsigned short>(u & 0xffffu);
  r.y = static_cast<unsigned short>(u >> 16);
  return __half2(r);
}
// (x − off)·m on f16 pairs: the magic-number integer (exact), then one rounding of d·q.
__host__ __device__ __forceinline__ uint32_t h2_sub_mul(uint32_t x, uint32_t off, uint32_t m) {
  return h2bits(__hmul2(__hsub2(bits_h2(x), bits_h2(off)), bits_h2(m)));
}
// e4m3 bytes in bits 8-15 and 24-31 → the f16 pair e4m3·2^-8 (exact; other bits ignored).
__host__ __device__ __forceinline__ uint32_t e4m3_f16x2(uint32_t x) {
  return (x & 0x80008000u) | ((x >> 1) & 0x3f803f80u);
}
__host__ __device__ __forceinline__ uint32_t ld16(const unsigned char* p) {
  return *reinterpret_cast<const uint16_t*>(p);
}
__host__ __device__ __forceinline__ uint32_t ld32(const unsigned char* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
constexpr uint32_t kMagicQ8 = 0x64806480u;  // f16 1152 = 1024 + 128 (q8 bytes enter as q + 128)
constexpr uint32_t kMagicQ4 = 0x64086408u;  // f16 1032 = 1024 + 8 (q4 nibbles are q + 8)

// One warp step's stage: K rows 0-15, V rows 16-31 (SRB bytes apart), then for fp8 the 16 K
// and 16 V row scales (f32). Rows are copied in CW-byte chunks. fp8 rows are read in 16-byte
// pieces by 8 rows at once, so their chunks are XOR-swizzled by row (chunk_off): for the K
// reads (rows gid, chunks 4c + tig) and the V reads (rows 2·tig + {0, 1, 8, 9}, chunks of
// gid) every quarter warp then touches 8 distinct 16-byte bank groups. q8_0 / q4_0 rows are
// read in 2- and 4-byte pieces whose banks already differ (row strides of 68 / 36 words).
template <int D, KvKind K>
struct DecodeStage {
  static constexpr int kRows = 16;                                  // keys per step
  static constexpr int RB = kv_row_bytes(K, D);                     // bytes of a cached row
  static constexpr int SRB = K == KvKind::BF16 ? 2 * (D + 8) : RB;  // stage row stride (bf16: ldmatrix tiles)
  static constexpr int CW = RB % 16 == 0 ? 16 : RB % 8 == 0 ? 8 : 4;  // cp.async width (rows are CW-aligned)
  static constexpr int CPR = RB / CW;                                 // chunks per row
  static constexpr int kScaleOff = 2 * kRows * SRB;
  static constexpr int kBytes = (kScaleOff + (K == KvKind::F8 ? 2 * kRows * 4 : 0) + 15) / 16 * 16;
  __host__ __device__ static constexpr int swizzle(int r) {  // r: key 0-15
    return K != KvKind::F8 ? 0
           : D == 256      ? (((r >> 1) & 1) | (((r ^ (r >> 2)) & 1) << 2))
           : D == 128      ? ((((r >> 1) & 1) << 1) | (((r ^ (r >> 2)) & 1) << 2))
                           : 0;
  }
  // Byte offset of chunk cc of stage row r (0-31).
  __host__ __device__ static constexpr int chunk_off(int r, int cc) { return r * SRB + (cc ^ swizzle(r & 15)) * CW; }
};

// Fragments for the quantised kinds (fp8, q8_0, q4_0); q_dims and v_dim also for bf16, whose
// tiles are read by ldmatrix in the natural order. gid = lane / 4, tig = lane % 4.
template <int D, KvKind K>
struct DecodeFrag {
  using St = DecodeStage<D, K>;
  static constexpr int KS = D / 16;                          // k-steps of S; m-tiles of Oᵀ
  static constexpr int KU = K == KvKind::F8 ? 4 : 2;         // k-steps per k_unit call
  static constexpr int VU = K == KvKind::F8 && KS < 8 ? KS : K == KvKind::F8 ? 8 : 4;  // m-tiles per v_unit
  static constexpr int NV = D / 8;                           // V dims per thread and key

  // The q dims of this thread's A fragment at k-step kk: a0 = (d[0], d[1]), a2 = (d[2], d[3]).
  // fp8: a k-step reads one 4-byte word w = dims b .. b + 3 of a key; b0 = (w bytes 0, 2),
  // b1 = (bytes 1, 3) (e4m3_f16x2 of w << 8 and of w). q8_0/q4_0: block kk/2, elements
  // 16·(kk % 2) + 4·tig .. + 3 (q4_0: the low nibbles of 4 bytes, then their high nibbles).
  __host__ __device__ static void q_dims(int kk, int tig, int (&d)[4]) {
    if constexpr (K == KvKind::BF16) {
      const int b = 16 * kk + 2 * tig;
      d[0] = b, d[1] = b + 1, d[2] = b + 8, d[3] = b + 9;
    } else if constexpr (K == KvKind::F8) {
      const int b = 64 * (kk >> 2) + 16 * tig + 4 * (kk & 3);
      d[0] = b, d[1] = b + 2, d[2] = b + 1, d[3] = b + 3;
    } else {
      const int b = 32 * (kk >> 1) + 16 * (kk & 1) + 4 * tig;
      d[0] = b, d[1] = b + 1, d[2] = b + 2, d[3] = b + 3;
    }
  }
  // The dim of fragment row `row` (0-15) of m-tile mt. Quantised: thread gid owns NV dims of
  // every key (fp8, q8_0: gid·NV + 2·mt + row / 8; q4_0: NV/2 bytes of one block, whose low
  // nibbles give m-tiles 0 .. NV/4 − 1 and high nibbles the rest).
  __host__ __device__ static int v_dim(int mt, int row) {
    const int gid = row & 7, hi = row >> 3;
    if constexpr (K == KvKind::BF16) {
      return 16 * mt + row;
    } else if constexpr (K == KvKind::Q4) {
      constexpr int H4 = NV / 4, TPB = 32 / NV;  // byte pairs per thread, threads per block
      const int byte0 = (gid % TPB) * (NV / 2);
      return 32 * (gid / TPB) + (mt < H4 ? byte0 + 2 * mt : 16 + byte0 + 2 * (mt - H4)) + hi;
    } else {
      return NV * gid + 2 * mt + hi;
    }
  }
  // The m-tile of slot j of V unit u (q4_0: byte pairs 2u, 2u + 1, low nibbles then high).
  __host__ __device__ static constexpr int unit_mt(int u, int j) {
    return K == KvKind::Q4 ? (j < 2 ? 2 * u + j : NV / 4 + 2 * u + j - 2) : VU * u + j;
  }

  // B fragments of k-steps KU·u .. KU·u + KU − 1: b[j][t] for stage K row gid + 8t (key n).
  __host__ __device__ static void k_unit(const unsigned char* st, int lane, int u, uint32_t (&b)[KU][2][2]) {
    const int gid = lane >> 2, tig = lane & 3;
KV_UNROLL
    for (int t = 0; t < 2; ++t) {
      const int r = gid + 8 * t;
      const unsigned char* row = st + r * St::SRB;
      if constexpr (K == KvKind::F8) {
        const uint4 w = *reinterpret_cast<const uint4*>(st + St::chunk_off(r, 4 * u + tig));
        const uint32_t x[4] = {w.x, w.y, w.z, w.w};
KV_UNROLL
        for (int j = 0; j < 4; ++j) {
          b[j][t][0] = e4m3_f16x2(x[j] << 8);
          b[j][t][1] = e4m3_f16x2(x[j]);
        }
      } else if constexpr (K == KvKind::Q8) {
        const uint32_t d = ld16(row + 34 * u), d2 = bperm(d, d, 0x1010);
KV_UNROLL
        for (int h = 0; h < 2; ++h) {
          const int off = 34 * u + 2 + 16 * h + 4 * tig;  // 4-aligned for odd blocks, 2 mod 4 for even
          const uint32_t w = (u & 1) ? ld32(row + off) : bperm(ld32(row + off - 2), ld32(row + off + 2), 0x5432);
          const uint32_t q = w ^ 0x80808080u;
          b[h][t][0] = h2_sub_mul(bperm(q, 0x64646464u, 0x4140), kMagicQ8, d2);
          b[h][t][1] = h2_sub_mul(bperm(q, 0x64646464u, 0x4342), kMagicQ8, d2);
        }
      } else {
        const uint32_t d = ld16(row + 18 * u), d2 = bperm(d, d, 0x1010);
        const int off = 18 * u + 2 + 4 * tig;  // 4-aligned for odd blocks, 2 mod 4 for even
        // Bytes q0 q1 q2 q3 interleaved as q0 q2 q1 q3: a 0x000f000f mask then picks a pair.
        const uint32_t x = (u & 1) ? bperm(ld32(row + off), 0, 0x3120)
                                   : bperm(ld32(row + off - 2), ld32(row + off + 2), 0x5342);
        b[0][t][0] = h2_sub_mul((x & 0x000f000fu) | 0x64006400u, kMagicQ4, d2);
        b[0][t][1] = h2_sub_mul(((x >> 8) & 0x000f000fu) | 0x64006400u, kMagicQ4, d2);
        b[1][t][0] = h2_sub_mul(((x >> 4) & 0x000f000fu) | 0x64006400u, kMagicQ4, d2);
        b[1][t][1] = h2_sub_mul(((x >> 12) & 0x000f000fu) | 0x64006400u, kMagicQ4, d2);
      }
    }
  }
  // fp8: this thread's score factors, 256·(row scale) of keys 2·tig, 2·tig + 1, 2·tig + 8,
  // 2·tig + 9 (the K values above are e4m3·2^-8; a power of two scales the f32 score exactly).
  __host__ __device__ static void k_score_mult(const unsigned char* st, int lane, float (&f)[4]) {
    const float* s = reinterpret_cast<const float*>(st + St::kScaleOff);
    const int k0 = 2 * (lane & 3);
KV_UNROLL
    for (int i = 0; i < 4; ++i) f[i] = K == KvKind::F8 ? s[k0 + (i >> 1) * 8 + (i & 1)] * 256.0f : 1.0f;
  }
  // Per-step V multipliers: m[0] for keys (2·tig, 2·tig + 1), m[1] for (2·tig + 8, + 9), low
  // half first: fp8 256·scale (f16, exact: 2^-7 .. 2^15), q8_0/q4_0 the d of this thread's block.
  __host__ __device__ static void v_mult(const unsigned char* st, int lane, uint32_t (&m)[2]) {
    const int gid = lane >> 2, k0 = 2 * (lane & 3);
KV_UNROLL
    for (int p = 0; p < 2; ++p) {
      const int ka = k0 + 8 * p;
      if constexpr (K == KvKind::F8) {
        const float* s = reinterpret_cast<const float*>(st + St::kScaleOff) + St::kRows;
        m[p] = h2bits(__floats2half2_rn(s[ka] * 256.0f, s[ka + 1] * 256.0f));
      } else {
        const int dofs = K == KvKind::Q8 ? 34 * (gid * NV / 32) : 18 * (gid / (32 / NV));
        const unsigned char* ra = st + (St::kRows + ka) * St::SRB + dofs;
        m[p] = bperm(ld16(ra), ld16(ra + St::SRB), 0x5410);
      }
    }
  }
  // A fragments (Vᵀ: rows = dims per v_dim, k = keys 2·tig, + 1 | 2·tig + 8, + 9) of the m-tiles
  // unit_mt(u, 0 .. VU − 1).
  __host__ __device__ static void v_unit(const unsigned char* st, int lane, int u, const uint32_t (&m)[2],
                                         uint32_t (&a)[VU][4]) {
    const int gid = lane >> 2, k0 = 2 * (lane & 3);
    const int keys[4] = {k0, k0 + 1, k0 + 8, k0 + 9};
    if constexpr (K == KvKind::F8) {
      uint32_t w[4][4];  // per key: 16 bytes of the thread's NV (8 for D = 64)
KV_UNROLL
      for (int k = 0; k < 4; ++k) {
        const int r = St::kRows + keys[k];
        if constexpr (D == 64) {
          const uint2 x = *reinterpret_cast<const uint2*>(st + r * St::SRB + 8 * gid);
          w[k][0] = x.x, w[k][1] = x.y, w[k][2] = w[k][3] = 0;
        } else {
          const uint4 x = *reinterpret_cast<const uint4*>(st + St::chunk_off(r, (NV / 16) * gid + u));
          w[k][0] = x.x, w[k][1] = x.y, w[k][2] = x.z, w[k][3] = x.w;
        }
      }
KV_UNROLL
      for (int j = 0; j < VU; ++j) {  // m-tile VU·u + j: bytes 2j, 2j + 1 of the unit's piece
        const int wd = j >> 1, i = 2 * (j & 1);
        const uint32_t s0 = 0x4400u + 0x1111u * i, s1 = s0 + 0x1111u;  // [·, x.b(i), ·, y.b(i)]
        a[j][0] = h2bits(__hmul2(bits_h2(e4m3_f16x2(bperm(w[0][wd], w[1][wd], s0))), bits_h2(m[0])));
        a[j][1] = h2bits(__hmul2(bits_h2(e4m3_f16x2(bperm(w[0][wd], w[1][wd], s1))), bits_h2(m[0])));
        a[j][2] = h2bits(__hmul2(bits_h2(e4m3_f16x2(bperm(w[2][wd], w[3][wd], s0))), bits_h2(m[1])));
        a[j][3] = h2bits(__hmul2(bits_h2(e4m3_f16x2(bperm(w[2][wd], w[3][wd], s1))), bits_h2(m[1])));
      }
    } else if constexpr (K == KvKind::Q8) {
      const int off = 34 * (gid * NV / 32) + 2 + (gid * NV) % 32;  // the thread's first element
KV_UNROLL
      for (int j = 0; j < VU; ++j) {
        const int mt = VU * u + j;
KV_UNROLL
        for (int p = 0; p < 2; ++p) {
          const unsigned char* ra = st + (St::kRows + keys[2 * p]) * St::SRB + off + 2 * mt;
          const uint32_t q = bperm(ld16(ra), ld16(ra + St::SRB), 0x5410) ^ 0x80808080u;  // xa xa' xb xb'
          a[j][2 * p] = h2_sub_mul(bperm(q, 0x64646464u, 0x4240), kMagicQ8, m[p]);
          a[j][2 * p + 1] = h2_sub_mul(bperm(q, 0x64646464u, 0x4341), kMagicQ8, m[p]);
        }
      }
    } else {
      constexpr int TPB = 32 / NV;  // threads per block
      const int off = 18 * (gid / TPB) + 2 + (gid % TPB) * (NV / 2);
KV_UNROLL
      for (int i = 0; i < 2; ++i) {  // byte pair 2u + i: m-tiles 2u + i (low nibbles), NV/4 + 2u + i (high)
KV_UNROLL
        for (int p = 0; p < 2; ++p) {
          const unsigned char* ra = st + (St::kRows + keys[2 * p]) * St::SRB + off + 2 * (2 * u + i);
          const uint32_t x = bperm(ld16(ra), ld16(ra + St::SRB), 0x5410);  // xa xa' xb xb'
          a[i][2 * p] = h2_sub_mul((x & 0x000f000fu) | 0x64006400u, kMagicQ4, m[p]);
          a[i][2 * p + 1] = h2_sub_mul(((x >> 8) & 0x000f000fu) | 0x64006400u, kMagicQ4, m[p]);
          a[2 + i][2 * p] = h2_sub_mul(((x >> 4) & 0x000f000fu) | 0x64006400u, kMagicQ4, m[p]);
          a[2 + i][2 * p + 1] = h2_sub_mul(((x >> 12) & 0x000f000fu) | 0x64006400u, kMagicQ4, m[p]);
        }
      }
    }
  }
};
#undef KV_UNROLL

// ---- Walsh–Hadamard rotation (kv_cache.h) ----
// The warp holds one row of 32·NPL values, lane l the NPL consecutive values from l·NPL:
// spans < NPL inside the lane, larger ones across lanes, in increasing order, then the
// scale: the same additions as kv_hadamard on the CPU, so the results agree bit for bit.
template <int NPL>
__device__ __forceinline__ void warp_hadamard(float (&r)[NPL], int lane, float scale) {
#pragma unroll
  for (int h = 1; h < NPL; h <<= 1)
#pragma unroll
    for (int e = 0; e < NPL; ++e)
      if ((e & h) == 0) {
        const float a = r[e], b = r[e + h];
        r[e] = a + b;
        r[e + h] = a - b;
      }
#pragma unroll
  for (int m = 1; m < 32; m <<= 1)
#pragma unroll
    for (int e = 0; e < NPL; ++e) {
      const float p = __shfl_xor_sync(0xffffffffu, r[e], m);
      r[e] = (lane & m) ? p - r[e] : r[e] + p;
    }
#pragma unroll
  for (int e = 0; e < NPL; ++e) r[e] *= scale;
}

// ---- entry points ----
// cuda_flash_attention.cu: runs of kFlashMinTokens or more. tiles: n_tiles × {run, row0} and
// the runs on the device; q (rotated already for q8_0/q4_0), out [T, H, hd] f32; caches
// [slots, cap, KVH, hd] holding this batch's keys; ksc/vsc: fp8 row scales (else null).
int flash_attention_tile_rows();
bool flash_attention_supported(Ctx& c, int64_t hd);
void flash_attention(Ctx& c, const float* q, const void* kc, const void* vc, const float* ksc, const float* vsc,
                     KvKind kind, const int32_t* tiles, const SeqRun* runs, int n_tiles, int H, int KVH, int hd,
                     int64_t cap, float scale, float* out);
// cuda_attention_decode.cu: tensor-core decode of n_tok single-token rows (tlist: their
// batch rows, or null for rows 0 .. n_tok − 1) over bf16 / fp8 / q8_0 / q4_0 caches; rotates
// q and the output itself. Capturable (positions from tslot/tpos on the device). early_rows > 0:
// the launch before it releases it only after its own wait and appended at most early_rows rows
// a token (the kernel stages q and requests older rows before its wait); 0: it waits first.
bool attention_decode_tc_supported(KvKind kind, int64_t hd, int64_t G);
void attention_decode_tc(Ctx& c, const float* q, const void* kc, const void* vc, const float* ksc, const float* vsc,
                         KvKind kind, const int32_t* tslot, const int32_t* tpos, const int32_t* tlist, int64_t n_tok,
                         int H, int KVH, int hd, int64_t cap, float scale, float hscale, float* out, TreeMask tree,
                         int early_rows);

// Token t's (its row of the call) part of a TreeMask, read once per kernel, and whether it sees
// cache position p.
struct TreeView {
  uint64_t bits = 0;
  int32_t base = INT_MAX;  // no tree: every position is context
};
__device__ __forceinline__ TreeView tree_view(const TreeMask& tm, int t) {
  TreeView v;
  if (tm.mask) v.bits = tm.mask[t], v.base = tm.base[t];
  return v;
}
__device__ __forceinline__ bool tree_visible(const TreeView& v, int p) {
  return p < v.base || ((v.bits >> (p - v.base)) & 1u);
}

}  // namespace qwen36::cuda
