#pragma once
// defines (file-local to each .cu that includes it): the GGUF block readers of the CUDA
// quantized path —
// QType<D> (block size, element count, per-block decoding), word loads of a
// given alignment, and with_quant_type (the runtime dtype → compile-time dispatch) — shared by
// the GEMV / dequantization kernels (cuda_quant_matmul.cu) and the synthetic-weight generator
// (cuda_quant_random.cu); and quantize_quad, the per-32 int8 activation quantizer of the GGUF
// GEMV and the tiled GEMMs; exact f16 / e4m3 → f32 bit conversions (h2f, e4m3_f32: the HF
// blocks' and the tiled NVFP4 scales). Included by .cu files only.

#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_ops.cuh"
#include "quant/blocks.h"

namespace qwen36::cuda {
namespace {

// ---- activations to int8, per 32 ----

// A thread's 4 weights of a 32-weight group held by 8 consecutive lanes (every lane of the warp
// takes part): the group's scale d = amax / 127, the 4 codes rounded to nearest even (the
// 1.5 · 2^23 trick) packed little-endian into a word, and the code sums of the thread's 16-half
// of the group (half) and of the other 16-half (other).
struct QuantQuad {
  float d;
  uint32_t packed;
  int half, other;
};
__device__ __forceinline__ QuantQuad quantize_quad(float4 v) {
  float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float d = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  const int q0 = __float_as_int(fmaf(v.x, inv, 12582912.0f)) - 0x4B400000;
  const int q1 = __float_as_int(fmaf(v.y, inv, 12582912.0f)) - 0x4B400000;
  const int q2 = __float_as_int(fmaf(v.z, inv, 12582912.0f)) - 0x4B400000;
  const int q3 = __float_as_int(fmaf(v.w, inv, 12582912.0f)) - 0x4B400000;
  int half = q0 + q1 + q2 + q3;
  half += __shfl_xor_sync(0xffffffffu, half, 1);
  half += __shfl_xor_sync(0xffffffffu, half, 2);
  const int other = __shfl_xor_sync(0xffffffffu, half, 4);
  return {d, (uint32_t(q0) & 255u) | (uint32_t(q1) & 255u) << 8 | (uint32_t(q2) & 255u) << 16 | uint32_t(q3) << 24,
          half, other};
}

// ---- reading blocks ----

__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ uint16_t ld_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
__device__ __forceinline__ float2 f16x2_to_f2(uint32_t h) {
  return __half22float2(__halves2half2(__ushort_as_half(uint16_t(h & 0xFFFFu)), __ushort_as_half(uint16_t(h >> 16))));
}
// e4m3 bytes in bits 8-15 and 24-31 → the f16 pair e4m3·2^-8 (exact, subnormals included: the
// exponent and mantissa bits shifted into the f16's; other bits ignored).
__device__ __forceinline__ uint32_t e4m3_to_f16x2(uint32_t x) { return (x & 0x80008000u) | ((x >> 1) & 0x3f803f80u); }
// One e4m3 byte as f32, exact.
__device__ __forceinline__ float e4m3_f32(uint32_t b) { return f16x2_to_f2(e4m3_to_f16x2(b << 8)).x * 256.0f; }

// n 32-bit little-endian words at p, which is known to be kAlign-byte aligned (16, 8, 4 or 2).
// kPad: the 4 bytes after the words may be read (ring slots have slack), so a 2-aligned p takes
// n + 1 aligned words and byte permutes, the same instructions for every lane.
template <int kAlign, bool kPad = false, int n>
__device__ __forceinline__ void load_words(const uint8_t* p, uint32_t (&w)[n]) {
  if constexpr (kAlign >= 16 && n % 4 == 0) {
#pragma unroll
    for (int k = 0; k < n; k += 4) {
      const uint4 v = *reinterpret_cast<const uint4*>(p + 4 * k);
      w[k] = v.x, w[k + 1] = v.y, w[k + 2] = v.z, w[k + 3] = v.w;
    }
  } else if constexpr (kAlign >= 8 && n % 2 == 0) {
#pragma unroll
    for (int k = 0; k < n; k += 2) {
      const uint2 v = *reinterpret_cast<const uint2*>(p + 4 * k);
      w[k] = v.x, w[k + 1] = v.y;
    }
  } else if constexpr (kAlign >= 4) {
#pragma unroll
    for (int k = 0; k < n; ++k) w[k] = reinterpret_cast<const uint32_t*>(p)[k];
  } else if constexpr (kPad) {
    const uint32_t* a = reinterpret_cast<const uint32_t*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(3));
    const uint32_t sel = (reinterpret_cast<uintptr_t>(p) & 2) ? 0x5432u : 0x3210u;
    uint32_t prev = a[0];
#pragma unroll
    for (int k = 0; k < n; ++k) {
      const uint32_t next = a[k + 1];
      w[k] = __byte_perm(prev, next, sel);
      prev = next;
    }
  } else if ((reinterpret_cast<uintptr_t>(p) & 2) == 0) {
#pragma unroll
    for (int k = 0; k < n; ++k) w[k] = reinterpret_cast<const uint32_t*>(p)[k];
  } else {
    // 2 mod 4: a half word, n − 1 aligned words, a half word; reads exactly the 4n bytes.
    const uint32_t* a = reinterpret_cast<const uint32_t*>(p + 2);
    uint32_t lo = ld_u16(p);
#pragma unroll
    for (int k = 0; k < n - 1; ++k) {
      const uint32_t v = a[k];
      w[k] = lo | (v << 16);
      lo = v >> 16;
    }
    w[n - 1] = lo | (uint32_t(ld_u16(p + 4 * n - 2)) << 16);
  }
}

// Bits 0..3 of x to bit 0 of bytes 0..3 (the partial products land in disjoint bit ranges).
__device__ __forceinline__ uint32_t spread4(uint32_t x) { return ((x & 15u) * 0x00204081u) & 0x01010101u; }

// 16 packed nibbles of a Q4_0-style run (weight j in the low nibble of byte j, weight 16 + j in
// its high nibble) as 8 words of bytes 0..15.
__device__ __forceinline__ void split_nibbles(const uint32_t (&v)[4], uint32_t (&q)[8]) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    q[k] = v[k] & 0x0F0F0F0Fu;
    q[k + 4] = (v[k] >> 4) & 0x0F0F0F0Fu;
  }
}

// The IQ4_NL grid as 4 words of int8, for byte permutes.
constexpr uint32_t iq4_word(int i) {
  return uint32_t(uint8_t(kIQ4NLValues[i])) | uint32_t(uint8_t(kIQ4NLValues[i + 1])) << 8 |
         uint32_t(uint8_t(kIQ4NLValues[i + 2])) << 16 | uint32_t(uint8_t(kIQ4NLValues[i + 3])) << 24;
}
constexpr uint32_t kIq0 = iq4_word(0), kIq1 = iq4_word(4), kIq2 = iq4_word(8), kIq3 = iq4_word(12);

// Four indices 0..15 (one per byte) → their int8 grid values: the indices are packed into a
// 4-nibble byte_perm selector, looked up in both halves of the grid, and each result byte is
// picked from the half its index's bit 3 names.
__device__ __forceinline__ uint32_t iq4_lookup(uint32_t idx) {
  const uint32_t t = idx | (idx >> 4);         // byte 0 = i0 | i1 << 4, byte 2 = i2 | i3 << 4
  const uint32_t s = __byte_perm(t, 0, 0x4420);  // nibbles i0, i1, i2, i3
  const uint32_t lo = __byte_perm(kIq0, kIq1, s & 0x7777u), hi = __byte_perm(kIq2, kIq3, s & 0x7777u);
  return __byte_perm(lo, hi, 0x3210u | ((s >> 1) & 0x4444u));
}

// The 6-bit scale and min of sub-block j of a Q4_K / Q5_K block whose first 16 bytes are h
// (d | dmin, then scales bytes 0..3, 4..7, 8..11 in h.y, h.z, h.w; quant/blocks.h
// unpack_k_scale_min).
__device__ __forceinline__ void k_scale_min(const uint4& h, int j, int& sc, int& m) {
  const int sh = 8 * (j & 3);
  const int a = int((h.y >> sh) & 255), b = int((h.z >> sh) & 255), c = int((h.w >> sh) & 255);
  if (j < 4) {
    sc = a & 63;
    m = b & 63;
  } else {
    sc = (c & 15) | ((a >> 6) << 4);
    m = (c >> 4) | ((b >> 6) << 4);
  }
}

// One slice: y_i = scale · sc_h · (q_i − Z) + bias for i < 32, h = i / 16, q_i = byte i % 4 of
// q[i / 4] (as int8).
struct Slice {
  uint32_t q[8];
  float scale;
  int sc0, sc1;
  float bias;
};

// Per type: weights per block, bytes per block, the alignment of a block start in a 16-byte
// aligned tensor, the zero point Z.
template <DType D>
struct QType;

template <>
struct QType<DType::Q4_0> {
  static constexpr int kElems = 32, kBytes = 18, kAlign = 2, kZ = 8;
  template <bool kPad>
  __device__ static void decode(const uint8_t* p, int, Slice& s) {
    uint32_t v[4];
    load_words<2, kPad>(p + 2, v);
    split_nibbles(v, s.q);
    s.scale = h2f(ld_u16(p)), s.sc0 = s.sc1 = 1, s.bias = 0;
  }
};
template <>
struct QType<DType::Q4_1> {
  static constexpr int kElems = 32, kBytes = 20, kAlign = 4, kZ = 0;
  template <bool kPad>
  __device__ static void decode(const uint8_t* p, int, Slice& s) {
    uint32_t v[4];
    load_words<4>(p + 4, v);
    split_nibbles(v, s.q);
    s.scale = h2f(ld_u16(p)), s.sc0 = s.sc1 = 1, s.bias = h2f(ld_u16(p + 2));
  }
};
template <>
struct QType<DType::Q5_0> {
  static constexpr int kElems = 32, kBytes = 22, kAlign = 2, kZ = 16;
  template <bool kPad>
  __device__ static void decode(const uint8_t* p, int, Slice& s) {
    uint32_t h[1], v[4];
    load_words<2, kPad>(p + 2, h);
    load_words<2, kPad>(p + 6, v);
    split_nibbles(v, s.q);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      s.q[k] |= spread4(h[0] >> (4 * k)) << 4;
      s.q[k + 4] |= spread4(h[0] >> (16 + 4 * k)) << 4;
    }
    s.scale = h2f(ld_u16(p)), s.sc0 = s.sc1 = 1, s.bias = 0;
  }
};
template <>
struct QType<DType::Q5_1> {
  static constexpr int kElems = 32, kBytes = 24, kAlign = 8, kZ = 0;
  template <bool kPad>
  __device__ static void decode(const uint8_t* p, int, Slice& s) {
    uint32_t h[1], v[4];
    load_words<4>(p + 4, h);
    load_words<8>(p + 8, v);
    split_nibbles(v, s.q);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      s.q[k] |= spread4(h[0] >> (4 * k)) << 4;
      s.q[k + 4] |= spread4(h[0] >> (16 + 4 * k)) << 4;
    }
    s.scale = h2f(ld_u16(p)), s.sc0 = s.sc1 = 1, s.bias = h2f(ld_u16(p + 2));
  }
};
template <>
struct QType<DType::Q8_0> {
  static constexpr int kElems = 32, kBytes = 34, kAlign = 2, kZ = 0;
  template <bool kPad>
  __device__ static void decode(const uint8_t* p, int, Slice& s) {
    load_words<2, kPad>(p + 2, s.q);
    s.scale = h2f(ld_u16(p)), s.sc0 = s.sc1 = 1, s.bias = 0;
  }
};
// Super-block types decode two slices at once (decode2), sharing their loads: `pair` 0..3
// names slices slice_a(pair) and slice_b(pair) of the block (slice j = weights 32j..32j+31).
//
// Q4_K: pair c = sub-blocks 2c, 2c+1: the low and high nibbles of qs[32c, +32).
template <>
struct QType<DType::Q4_K> {
  static constexpr int kElems = 256, kBytes = 144, kAlign = 16, kZ = 0;
  __device__ static int slice_a(int c) { return 2 * c; }
  __device__ static int slice_b(int c) { return 2 * c + 1; }
  template <bool kPad>
  __device__ static void decode2(const uint8_t* p, int c, Slice& a, Slice& b) {
    uint32_t v[8];
    load_words<16>(p + 16 + 32 * c, v);
#pragma unroll
    for (int k = 0; k < 8; ++k) a.q[k] = v[k] & 0x0F0F0F0Fu, b.q[k] = (v[k] >> 4) & 0x0F0F0F0Fu;
    header(p, c, a, b);
  }
  __device__ static void header(const uint8_t* p, int c, Slice& a, Slice& b) {
    const uint4 h = *reinterpret_cast<const uint4*>(p);
    const float d = h2f(uint16_t(h.x & 0xFFFF)), dmin = h2f(uint16_t(h.x >> 16));
    int sc, m;
    k_scale_min(h, 2 * c, sc, m);
    a.scale = d, a.sc0 = a.sc1 = sc, a.bias = -dmin * float(m);
    k_scale_min(h, 2 * c + 1, sc, m);
    b.scale = d, b.sc0 = b.sc1 = sc, b.bias = -dmin * float(m);
  }
};
// As Q4_K; the 5th bit of weight l of sub-block j is bit j of qh[l].
template <>
struct QType<DType::Q5_K> {
  static constexpr int kElems = 256, kBytes = 176, kAlign = 16, kZ = 0;
  __device__ static int slice_a(int c) { return 2 * c; }
  __device__ static int slice_b(int c) { return 2 * c + 1; }
  template <bool kPad>
  __device__ static void decode2(const uint8_t* p, int c, Slice& a, Slice& b) {
    uint32_t v[8], h[8];
    load_words<16>(p + 48 + 32 * c, v);
    load_words<16>(p + 16, h);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t hb = h[k] >> (2 * c);
      a.q[k] = (v[k] & 0x0F0F0F0Fu) | ((hb & 0x01010101u) << 4);
      b.q[k] = ((v[k] >> 4) & 0x0F0F0F0Fu) | ((hb & 0x02020202u) << 3);
    }
    QType<DType::Q4_K>::header(p, c, a, b);
  }
};
// Q6_K: slice j = 4n + m (weights 128n + 32m + l) takes its low 4 bits from the low (m < 2) or
// high nibbles of ql[64n + 32(m & 1) + l], bits 4..5 from bits 2m..2m+1 of qh[32n + l], int8
// scale scales[8n + 2m + l / 16]; values − 32. Pair (n, h) = slices 4n + h and 4n + h + 2, which
// share their ql and qh bytes.
template <>
struct QType<DType::Q6_K> {
  static constexpr int kElems = 256, kBytes = 210, kAlign = 2, kZ = 32;
  __device__ static int slice_a(int pair) { return 4 * (pair >> 1) + (pair & 1); }
  __device__ static int slice_b(int pair) { return 4 * (pair >> 1) + (pair & 1) + 2; }
  template <bool kPad>
  __device__ static void decode2(const uint8_t* p, int pair, Slice& a, Slice& b) {
    const int n = pair >> 1, h = pair & 1;
    uint32_t l[8], hi[8];
    load_words<2, kPad>(p + 64 * n + 32 * h, l);
    load_words<2, kPad>(p + 128 + 32 * n, hi);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t hb = hi[k] >> (2 * h);
      a.q[k] = (l[k] & 0x0F0F0F0Fu) | ((hb & 0x03030303u) << 4);
      b.q[k] = ((l[k] >> 4) & 0x0F0F0F0Fu) | (hb & 0x30303030u);
    }
    const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192 + 8 * n + 2 * h);
    const float d = h2f(ld_u16(p + 208));
    a.scale = d, a.sc0 = sc[0], a.sc1 = sc[1], a.bias = 0;
    b.scale = d, b.sc0 = sc[4], b.sc1 = sc[5], b.bias = 0;
  }
};
// IQ4_XS: pair c = sub-blocks 2c, 2c+1 = qs[32c, +32); each sub-block's nibbles as in Q4_0,
// mapped through the IQ4_NL grid; 6-bit scale ls (4 bits in scales_l[c], 2 in scales_h),
// dl = d · (ls − 32).
template <>
struct QType<DType::IQ4_XS> {
  static constexpr int kElems = 256, kBytes = 136, kAlign = 8, kZ = 0;
  __device__ static int slice_a(int c) { return 2 * c; }
  __device__ static int slice_b(int c) { return 2 * c + 1; }
  template <bool kPad>
  __device__ static void decode2(const uint8_t* p, int c, Slice& a, Slice& b) {
    uint32_t v[8];
    load_words<8>(p + 8 + 32 * c, v);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      a.q[k] = iq4_lookup(v[k] & 0x0F0F0F0Fu);
      a.q[k + 4] = iq4_lookup((v[k] >> 4) & 0x0F0F0F0Fu);
      b.q[k] = iq4_lookup(v[k + 4] & 0x0F0F0F0Fu);
      b.q[k + 4] = iq4_lookup((v[k + 4] >> 4) & 0x0F0F0F0Fu);
    }
    const int lo = p[4 + c], hs = ld_u16(p + 2) >> (4 * c);
    const float d = h2f(ld_u16(p));
    a.scale = d, a.sc0 = a.sc1 = ((lo & 15) | ((hs & 3) << 4)) - 32, a.bias = 0;
    b.scale = d, b.sc0 = b.sc1 = ((lo >> 4) | (((hs >> 2) & 3) << 4)) - 32, b.bias = 0;
  }
};

// The decoders hard-code ggml's field offsets; check them against quant/blocks.h.
static_assert(offsetof(BlockQ4_1, qs) == 4 && offsetof(BlockQ5_0, qh) == 2 && offsetof(BlockQ5_0, qs) == 6 &&
              offsetof(BlockQ5_1, qh) == 4 && offsetof(BlockQ5_1, qs) == 8 && offsetof(BlockQ8_0, qs) == 2);
static_assert(offsetof(BlockQ4_K, scales) == 4 && offsetof(BlockQ4_K, qs) == 16 && offsetof(BlockQ5_K, qh) == 16 &&
              offsetof(BlockQ5_K, qs) == 48 && offsetof(BlockQ6_K, qh) == 128 && offsetof(BlockQ6_K, scales) == 192 &&
              offsetof(BlockQ6_K, d) == 208 && offsetof(BlockIQ4_XS, scales_h) == 2 &&
              offsetof(BlockIQ4_XS, scales_l) == 4 && offsetof(BlockIQ4_XS, qs) == 8);
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 && sizeof(BlockIQ4_XS) == 136);

// Calls f(std::integral_constant<DType, D>) for the types above; false for any other type.
template <typename F>
bool with_quant_type(DType t, F&& f) {
  switch (t) {
    case DType::Q4_0: f(std::integral_constant<DType, DType::Q4_0>{}); return true;
    case DType::Q4_1: f(std::integral_constant<DType, DType::Q4_1>{}); return true;
    case DType::Q5_0: f(std::integral_constant<DType, DType::Q5_0>{}); return true;
    case DType::Q5_1: f(std::integral_constant<DType, DType::Q5_1>{}); return true;
    case DType::Q8_0: f(std::integral_constant<DType, DType::Q8_0>{}); return true;
    case DType::Q4_K: f(std::integral_constant<DType, DType::Q4_K>{}); return true;
    case DType::Q5_K: f(std::integral_constant<DType, DType::Q5_K>{}); return true;
    case DType::Q6_K: f(std::integral_constant<DType, DType::Q6_K>{}); return true;
    case DType::IQ4_XS: f(std::integral_constant<DType, DType::IQ4_XS>{}); return true;
    default: return false;
  }
}

}  // namespace
}  // namespace qwen36::cuda
