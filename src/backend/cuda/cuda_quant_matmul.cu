// out[T, N] = x[T, K] · w[N, K]ᵀ for GGUF block-quantized weights, and embedding rows of such
// tables. Types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS (layouts: quant/blocks.h).
// Every kernel reads blocks through the same per-type decoder (QType::decode, or decode2 for two
// slices of a super-block): 32 weights ("a slice") as int8 lanes q with
// y = scale · sc_h · (q − Z) + bias, h = which 16 of the 32.
//
//  - Decode (T ≤ 8, quant_gemv): memory-bound. One persistent block per SM owns a balanced range
//    of rows; its warps split the range's (row, segment) steps evenly, so a row may be shared by
//    two neighbouring warps whose partial sums meet in shared memory in a fixed order (no tail of
//    idle SMs: 17408 rows over 132 × 32 warps would otherwise leave 18% of the last round idle).
//    A segment is 2048 weights (8 super-blocks or 64 blocks); each warp streams its segments
//    into a private 3-stage shared-memory ring with 16-byte cp.async (2 segments in flight per
//    warp, ≥ 60 KB per SM). Loads never address the block stream lane by lane: Q6_K (210 B),
//    Q8_0 (34 B) and IQ4_XS (136 B) blocks are not 16-byte aligned, and the ring makes every
//    type stream with aligned 16-byte copies. Each lane then decodes two slices (sharing the
//    loads of one super-block's bytes) and dots them with int8 activations (dp4a). The
//    activations are quantized per 32 (scale amax/127, round to nearest even, like llama.cpp's
//    q8_1) into shared memory by every block, while its first weight segments load (launched
//    with programmatic dependent launch: those loads start before the previous kernel ends).
//    Why int8: at HBM speed a 4.5-bit type delivers ~29 weights per clock per SM; dequantising
//    to f32 costs ~4 instructions per weight and makes the kernel issue-bound at T = 1, the dp4a
//    path ~1. Accuracy: see tests/gpu/test_cuda_quant.cpp (≈ 0.4% of a dot's magnitude).
//    When T·K activations do not fit in shared memory next to the rings (T = 8 with K = 17408
//    on an H200), a separate kernel quantizes them to global memory once.
//  - Prefill (T > 8): weights dequantized to bf16 in row slices (≤ 96 Mi weights, 192 MiB), each
//    multiplied by cuBLAS with the activations rounded to bf16 once (matmul's bf16 path:
//    round_activations / gemm_half). With CudaOptions::exact_matmul, every T goes through f32
//    slices and cublasSgemm with f32 activations instead (reference checks).
//  - quant_random_fill: random valid blocks in device memory for synthetic models.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_ops.cuh"
#include "quant/blocks.h"

namespace qwen36::cuda {

namespace {

// ---- reading blocks ----

__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ uint16_t ld_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }

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
// aligned tensor, the zero point Z, whether there is a bias (min) and two sub-scales per slice.
template <DType D>
struct QType;

template <>
struct QType<DType::Q4_0> {
  static constexpr int kElems = 32, kBytes = 18, kAlign = 2, kZ = 8;
  static constexpr bool kBias = false, kTwoScales = false;
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
  static constexpr bool kBias = true, kTwoScales = false;
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
  static constexpr bool kBias = false, kTwoScales = false;
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
  static constexpr bool kBias = true, kTwoScales = false;
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
  static constexpr bool kBias = false, kTwoScales = false;
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
  static constexpr bool kBias = true, kTwoScales = false;
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
  static constexpr bool kBias = true, kTwoScales = false;
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
  static constexpr bool kBias = false, kTwoScales = true;
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
  static constexpr bool kBias = false, kTwoScales = false;
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

// ---- activations as int8 per 32 ----

// Block b of 32 activations: x ≈ d · q (q = xq[32b, +32)); s = Σ x (f32, for the mins);
// i0 / i1 = Σ q over the first / second 16 (for the zero points).
struct __align__(16) XMeta {
  float d, s;
  int i0, i1;
};

constexpr int kXUnroll = 4;  // loads in flight per lane in the activation pass

// Quantizes the nb blocks of x: warp gw of ngw takes 4 blocks at a time, 8 lanes per block.
// Rounding x · 127/amax to the nearest even integer by adding 1.5 · 2^23 (one f32 FMA; the
// F2I unit runs at a quarter of the FMA rate).
__device__ __forceinline__ void quantize_x(const float* __restrict__ x, int nb, int8_t* xq, XMeta* xm, int gw, int ngw,
                                           int lane) {
  const int u = lane & 7, g = lane >> 3;
  const int stride = ngw * 4;
  for (int base = gw * 4; base < nb; base += stride * kXUnroll) {  // warp-uniform: shuffles below
    float4 v[kXUnroll];
#pragma unroll
    for (int r = 0; r < kXUnroll; ++r) {
      const int b = base + r * stride + g;
      v[r] = b < nb ? __ldg(reinterpret_cast<const float4*>(x) + size_t(b) * 8 + u) : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (int r = 0; r < kXUnroll; ++r) {
      const int b = base + r * stride + g;
      const float4 a = v[r];
      float amax = fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(a.z), fabsf(a.w)));
      float sum = (a.x + a.y) + (a.z + a.w);
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
      }
      const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
      const int q0 = __float_as_int(fmaf(a.x, id, 12582912.0f)) - 0x4B400000;
      const int q1 = __float_as_int(fmaf(a.y, id, 12582912.0f)) - 0x4B400000;
      const int q2 = __float_as_int(fmaf(a.z, id, 12582912.0f)) - 0x4B400000;
      const int q3 = __float_as_int(fmaf(a.w, id, 12582912.0f)) - 0x4B400000;
      int is = q0 + q1 + q2 + q3;
      is += __shfl_xor_sync(0xffffffffu, is, 1);
      is += __shfl_xor_sync(0xffffffffu, is, 2);
      const int is_hi = __shfl_sync(0xffffffffu, is, (lane & 24) | 4);
      if (b < nb) {
        reinterpret_cast<uint32_t*>(xq)[size_t(b) * 8 + u] =
            uint32_t(q0 & 255) | uint32_t(q1 & 255) << 8 | uint32_t(q2 & 255) << 16 | uint32_t(q3) << 24;
        if (u == 0) xm[b] = XMeta{d, sum, is, is_hi};
      }
    }
  }
}

__global__ void quantize_x_kernel(const float* __restrict__ x, int nb, int8_t* __restrict__ xq,
                                  XMeta* __restrict__ xm) {
  const int gw = int((blockIdx.x * blockDim.x + threadIdx.x) >> 5), ngw = int((gridDim.x * blockDim.x) >> 5);
  quantize_x(x, nb, xq, xm, gw, ngw, int(threadIdx.x & 31));
}

// Σ_i y_i x_i over one slice for activation block *mp (x words xa, xb). Only the fields the
// type needs are loaded (shared-memory bandwidth is the next limit after HBM at T = 1).
template <DType D>
__device__ __forceinline__ float slice_dot(const Slice& s, const int4& xa, const int4& xb, const XMeta* mp) {
  using Q = QType<D>;
  XMeta m;
  if constexpr (Q::kZ != 0) {
    m = *mp;
  } else if constexpr (Q::kBias) {
    const float2 v = *reinterpret_cast<const float2*>(mp);
    m.d = v.x, m.s = v.y, m.i0 = m.i1 = 0;
  } else {
    m.d = mp->d, m.s = 0, m.i0 = m.i1 = 0;
  }
  const int s0 = __dp4a(int(s.q[3]), xa.w, __dp4a(int(s.q[2]), xa.z, __dp4a(int(s.q[1]), xa.y, __dp4a(int(s.q[0]), xa.x, 0))));
  const int s1 = __dp4a(int(s.q[7]), xb.w, __dp4a(int(s.q[6]), xb.z, __dp4a(int(s.q[5]), xb.y, __dp4a(int(s.q[4]), xb.x, 0))));
  int acc;
  if constexpr (Q::kTwoScales)
    acc = s.sc0 * (s0 - Q::kZ * m.i0) + s.sc1 * (s1 - Q::kZ * m.i1);
  else
    acc = s.sc0 * (s0 + s1 - Q::kZ * (m.i0 + m.i1));
  float v = s.scale * m.d * float(acc);
  if constexpr (Q::kBias) v = fmaf(s.bias, m.s, v);
  return v;
}

// ---- decode GEMV ----

constexpr int kMaxWarps = 32, kStages = 3, kSegElems = 2048;
constexpr int kPartFloats = 2 * kMaxWarps * 8;  // head and tail partial sums per warp, T ≤ 8

// Warps per block: 32 keep enough segments in flight at T ≤ 2 within 64 registers; the
// T ≤ 8 kernels need more registers (accumulators, two slices) and run 16 warps.
template <int TM>
__host__ __device__ constexpr int gemv_warps() {
  return TM <= 2 ? 32 : 16;
}

template <DType D>
__host__ __device__ constexpr int seg_bytes() {
  return kSegElems / QType<D>::kElems * QType<D>::kBytes;
}
// A segment starting anywhere in a 16-byte chunk, rounded out to whole chunks, and 16 bytes of
// slack for the decoders' padded reads.
template <DType D>
__host__ __device__ constexpr int stage_bytes() {
  return (seg_bytes<D>() + 15 + 15) / 16 * 16 + 16;
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int n>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(n));
}

struct GemvParams {
  const uint8_t* w;
  unsigned long long w_bytes, row_bytes;
  const float* x;      // [T, K] f32, quantized by every block when x_smem
  const int8_t* xq;    // else: quantized by quantize_x_kernel
  const XMeta* xm;
  float* out;          // [T, N]
  int T, N, K, bpr, nseg, x_smem;
};

// Shared memory: the warps' rings | head and tail partials | activations (when x_smem).
template <DType D, int TM>
__global__ void __launch_bounds__(gemv_warps<TM>() * 32, 1) quant_gemv_kernel(const GemvParams p) {
  using Q = QType<D>;
  constexpr int kSeg = seg_bytes<D>(), kStage = stage_bytes<D>(), kG = kSegElems / Q::kElems;
  constexpr bool kSuper = Q::kElems == 256;
  extern __shared__ __align__(16) uint8_t smem[];
  griddep_trigger();
  const int nwarps = int(blockDim.x >> 5), warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31);
  uint8_t* ring = smem + warp * (kStages * kStage);
  float* part = reinterpret_cast<float*>(smem + nwarps * (kStages * kStage));  // [head|tail][warp][t]

  // This block's rows [r0, r1), its steps (row, segment) split among W warps, each ≥ nseg long.
  const int r0 = int((long long)blockIdx.x * p.N / gridDim.x), r1 = int((long long)(blockIdx.x + 1) * p.N / gridDim.x);
  const int rows = r1 - r0, W = min(nwarps, rows), S = rows * p.nseg;
  const int s_begin = warp < W ? int((long long)warp * S / W) : 0, s_end = warp < W ? int((long long)(warp + 1) * S / W) : 0;

  // A step's position: local row, segment, first byte. Positions advance one step at a time
  // (no divisions or 64-bit products in the loop).
  struct Pos {
    int lr, seg;
    unsigned long long start;
  };
  const int last_len = int(p.row_bytes - (unsigned long long)(p.nseg - 1) * kSeg);  // a row's last segment
  auto advance = [&](Pos& q) {
    if (++q.seg == p.nseg) {
      q.seg = 0, ++q.lr, q.start += unsigned(last_len);
    } else {
      q.start += kSeg;
    }
  };
  Pos cons{s_begin / p.nseg, s_begin % p.nseg, 0};
  cons.start = (unsigned long long)(r0 + cons.lr) * p.row_bytes + (unsigned long long)cons.seg * kSeg;
  Pos prod = cons;
  // The producer's segment → ring slot dst as whole 16-byte chunks (the tensor's last chunk is
  // zero-filled past its end).
  auto issue = [&](uint8_t* dst) {
    const int len = prod.seg == p.nseg - 1 ? last_len : kSeg;
    const unsigned long long c0 = prod.start & ~15ull;
    const int n = int((((prod.start + unsigned(len) + 15) & ~15ull) - c0) >> 4);
    for (int k = lane; k < n; k += 32) {
      const unsigned long long g = c0 + 16ull * unsigned(k);
      cp_async16(dst + 16 * k, p.w + g, int(min(16ull, p.w_bytes - g)));
    }
    advance(prod);
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (s_begin + i < s_end) issue(ring + i * kStage);
    cp_async_commit();
  }

  // The first segments depend on nothing before this kernel; the activations (and out, which
  // the kernel before may still read) do: under programmatic dependent launch, wait here.
  griddep_wait();
  const int8_t* xq = p.xq;
  const XMeta* xm = p.xm;
  if (p.x_smem) {
    int8_t* sq = reinterpret_cast<int8_t*>(part + kPartFloats);
    XMeta* sm = reinterpret_cast<XMeta*>(sq + size_t(p.T) * p.K);
    quantize_x(p.x, p.T * p.K / 32, sq, sm, warp, nwarps, lane);
    xq = sq, xm = sm;
  }
  __syncthreads();

  const int K32 = p.K / 32;
  // A lane's two slices: super-block types, pair lane % 4 of block lane / 4; else blocks
  // 2·lane and 2·lane + 1.
  const int blk = kSuper ? lane >> 2 : 2 * lane, pair = lane & 3;
  float acc[TM];
#pragma unroll
  for (int t = 0; t < TM; ++t) acc[t] = 0.0f;
  const int last_nblk = p.bpr - (p.nseg - 1) * kG;
  for (int s = s_begin; s < s_end; ++s) {
    const int i = s - s_begin;
    if (s + kStages - 1 < s_end) issue(ring + ((i + kStages - 1) % kStages) * kStage);
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    __syncwarp();
    const int lr = cons.lr, seg = cons.seg;
    const int nblk = seg == p.nseg - 1 ? last_nblk : kG;
    if (blk < nblk) {
      const uint8_t* bp = ring + (i % kStages) * kStage + int(cons.start & 15) + blk * Q::kBytes;
      Slice a, b;
      int ea, eb;  // the slices' K indices, in 32s
      bool has_b = true;
      if constexpr (kSuper) {
        Q::template decode2<true>(bp, pair, a, b);
        ea = seg * 64 + blk * 8 + Q::slice_a(pair), eb = seg * 64 + blk * 8 + Q::slice_b(pair);
      } else {
        has_b = blk + 1 < nblk;
        Q::template decode<true>(bp, 0, a);
        if (has_b) Q::template decode<true>(bp + Q::kBytes, 0, b);
        ea = seg * 64 + blk, eb = ea + 1;
      }
#pragma unroll
      for (int t = 0; t < TM; ++t) {
        if (t < p.T) {
          const int4* xa = reinterpret_cast<const int4*>(xq + size_t(t) * p.K + size_t(ea) * 32);
          float v = slice_dot<D>(a, xa[0], xa[1], xm + t * K32 + ea);
          if (has_b) {
            const int4* xb = reinterpret_cast<const int4*>(xq + size_t(t) * p.K + size_t(eb) * 32);
            v += slice_dot<D>(b, xb[0], xb[1], xm + t * K32 + eb);
          }
          acc[t] += v;
        }
      }
    }
    __syncwarp();  // every lane is done with slot i before it is refilled
    advance(cons);
    if (seg == p.nseg - 1 || s == s_end - 1) {
      // A row this warp shares with its predecessor (head) or successor (tail) meets its other
      // part below; a row it owns is written now.
      const bool head = lr * p.nseg < s_begin, tail = (lr + 1) * p.nseg > s_end;
#pragma unroll
      for (int t = 0; t < TM; ++t) {
        const float v = warp_sum(acc[t]);
        acc[t] = 0.0f;
        if (lane == 0 && t < p.T) {
          if (head)
            part[warp * 8 + t] = v;
          else if (tail)
            part[kMaxWarps * 8 + warp * 8 + t] = v;
          else
            p.out[size_t(t) * p.N + r0 + lr] = v;
        }
      }
    }
  }
  __syncthreads();
  // Warp w's first step s_begin(w) splits a row iff it is not a row start: predecessor's tail +
  // w's head, in that order (deterministic).
  for (int i = int(threadIdx.x); i < (W - 1) * TM; i += int(blockDim.x)) {
    const int w = 1 + i / TM, t = i % TM;
    const int sb = int((long long)w * S / W);
    if (t < p.T && sb % p.nseg != 0)
      p.out[size_t(t) * p.N + r0 + sb / p.nseg] = part[kMaxWarps * 8 + (w - 1) * 8 + t] + part[w * 8 + t];
  }
}

struct DevInfo {
  int sms = 0, smem_optin = 0;
};
DevInfo dev_info() {
  static DevInfo cache[16];
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  DevInfo& d = cache[dev & 15];
  if (d.sms == 0) {
    CUDA_CHECK(cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev));
  }
  return d;
}

template <DType D, int TM>
void launch_gemv(Ctx& c, GemvParams p) {
  const DevInfo di = dev_info();
  const int grid = std::min(p.N, di.sms);
  const int rows_max = (p.N + grid - 1) / grid;
  // At least 8 warps: the activation pass of a block with a single row still needs the threads.
  int warps = std::min(gemv_warps<TM>(), std::max(8, rows_max));
  const size_t ring = size_t(kStages) * stage_bytes<D>(), fixed = kPartFloats * sizeof(float);
  const size_t x_bytes = size_t(p.T) * p.K + size_t(p.T) * (p.K / 32) * sizeof(XMeta), optin = size_t(di.smem_optin);
  // Activations in shared memory while at least 16 warps' rings fit next to them.
  p.x_smem = fixed + x_bytes + size_t(std::min(warps, 16)) * ring <= optin;
  if (p.x_smem)
    warps = std::min<int>(warps, int((optin - fixed - x_bytes) / ring));
  else
    warps = std::min<int>(warps, int((optin - fixed) / ring));
  QWEN36_CHECK(warps >= 1, "quant matmul: {} bytes of shared memory are too few", optin);
  const size_t smem = fixed + size_t(warps) * ring + (p.x_smem ? x_bytes : 0);
  Temp<int8_t> gq(c, p.x_smem ? 0 : size_t(p.T) * p.K);
  Temp<XMeta> gm(c, p.x_smem ? 0 : size_t(p.T) * (p.K / 32));
  if (!p.x_smem) {
    const int nb = p.T * (p.K / 32);
    quantize_x_kernel<<<blocks_for(int64_t(nb) * 8, 256), 256, 0, c.stream>>>(p.x, nb, gq.get(), gm.get());
    CUDA_LAUNCH_CHECK();
    p.xq = gq.get();
    p.xm = gm.get();
  }
  static const bool attr_set = [] {
    CUDA_CHECK(cudaFuncSetAttribute(quant_gemv_kernel<D, TM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    dev_info().smem_optin));
    return true;
  }();
  (void)attr_set;
  launch_pdl(quant_gemv_kernel<D, TM>, dim3(unsigned(grid)), dim3(unsigned(warps * 32)), smem, c.stream, p);
}

template <DType D>
void quant_gemv(Ctx& c, const Tensor& w, const float* x, float* out, int T, int N, int K) {
  using Q = QType<D>;
  // The decoder's loads assume blocks start kAlign-aligned (ring slots keep the tensor's
  // alignment mod 16): kAlign must be exactly the power of two in kBytes, capped at 16.
  static_assert(Q::kBytes % Q::kAlign == 0 && (Q::kAlign == 16 || Q::kBytes % (2 * Q::kAlign) != 0));
  GemvParams p{};
  p.w = static_cast<const uint8_t*>(w.data);
  p.w_bytes = w.nbytes();
  p.row_bytes = w.row_bytes();
  p.x = x;
  p.out = out;
  p.T = T, p.N = N, p.K = K;
  p.bpr = K / Q::kElems;
  p.nseg = (p.bpr + kSegElems / Q::kElems - 1) / (kSegElems / Q::kElems);
  if (T == 1)
    launch_gemv<D, 1>(c, p);
  else if (T == 2)
    launch_gemv<D, 2>(c, p);
  else if (T <= 4)
    launch_gemv<D, 4>(c, p);
  else
    launch_gemv<D, 8>(c, p);
}

// ---- dequantization (prefill slices, embedding rows) ----

__device__ __forceinline__ void store32(float* o, const float (&y)[32]) {
#pragma unroll
  for (int k = 0; k < 8; ++k) reinterpret_cast<float4*>(o)[k] = make_float4(y[4 * k], y[4 * k + 1], y[4 * k + 2], y[4 * k + 3]);
}
__device__ __forceinline__ void store32(__nv_bfloat16* o, const float (&y)[32]) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    uint32_t u[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(y[8 * k + 2 * j], y[8 * k + 2 * j + 1]);
      u[j] = *reinterpret_cast<const uint32_t*>(&h);
    }
    reinterpret_cast<uint4*>(o)[k] = make_uint4(u[0], u[1], u[2], u[3]);
  }
}

// Slice s as 32 values: y = fma(scale · sc, q − Z, bias) rounds once, as quant/dequantize.cpp.
template <DType D>
__device__ __forceinline__ void slice_values(const Slice& s, float (&y)[32]) {
  const float a0 = s.scale * float(s.sc0), a1 = s.scale * float(s.sc1);
#pragma unroll
  for (int k = 0; k < 8; ++k)
#pragma unroll
    for (int j = 0; j < 4; ++j)
      y[4 * k + j] = fmaf(k < 4 ? a0 : a1, float(int(int8_t(s.q[k] >> (8 * j))) - QType<D>::kZ), s.bias);
}

// out[r, :] = weight row rows[r] (or r0 + r without a row list) as f32 / bf16, r < nrows. One
// thread per decode unit: a slice pair of a super-block, or one 32-weight block.
template <DType D, typename O>
__global__ void dequant_kernel(const uint8_t* __restrict__ w, size_t row_bytes, const int32_t* __restrict__ rows, int r0,
                               int nrows, int K, O* __restrict__ out) {
  using Q = QType<D>;
  constexpr bool kSuper = Q::kElems == 256;
  constexpr int kUnitElems = kSuper ? 64 : 32;
  const int units = K / kUnitElems;
  const long long n = (long long)nrows * units;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const int r = int(i / units), u = int(i - (long long)r * units);
    const long long row = rows ? rows[r] : r0 + r;
    const uint8_t* wr = w + size_t(row) * row_bytes;
    O* o = out + size_t(r) * K;
    float y[32];
    if constexpr (kSuper) {
      Slice a, b;
      const int blk = u >> 2, pair = u & 3;
      Q::template decode2<false>(wr + size_t(blk) * Q::kBytes, pair, a, b);
      slice_values<D>(a, y);
      store32(o + size_t(blk) * 256 + 32 * Q::slice_a(pair), y);
      slice_values<D>(b, y);
      store32(o + size_t(blk) * 256 + 32 * Q::slice_b(pair), y);
    } else {
      Slice a;
      Q::template decode<false>(wr + size_t(u) * Q::kBytes, 0, a);
      slice_values<D>(a, y);
      store32(o + size_t(u) * 32, y);
    }
  }
}

template <DType D, typename O>
void launch_dequant(Ctx& c, const Tensor& w, const int32_t* rows, int r0, int nrows, O* out) {
  const int K = int(w.cols());
  const int64_t n = int64_t(nrows) * (K / (QType<D>::kElems == 256 ? 64 : 32));
  const int blocks = int(std::min<int64_t>(blocks_for(n, 256), int64_t(dev_info().sms) * 32));
  dequant_kernel<D, O><<<blocks, 256, 0, c.stream>>>(static_cast<const uint8_t*>(w.data), w.row_bytes(), rows, r0,
                                                     nrows, K, out);
  CUDA_LAUNCH_CHECK();
}

// Prefill: bf16 (or f32 with exact_matmul) slices of rows, one GEMM each into out's columns.
template <DType D>
void quant_gemm(Ctx& c, const Tensor& w, const float* x, float* out, int T, int N, int K) {
  const bool exact = c.exact_matmul;
  const int64_t budget = exact ? (int64_t(48) << 20) : (int64_t(96) << 20);  // weights per slice
  const int slice = int(std::clamp<int64_t>(budget / K, 1, N));
  Temp<uint8_t> scratch(c, size_t(slice) * size_t(K) * (exact ? 4 : 2));
  Temp<uint16_t> xh(c, exact ? 0 : size_t(T) * K);
  if (!exact) round_activations(c, x, xh.get(), int64_t(T) * K, true);
  const float one = 1.0f, zero = 0.0f;
  for (int n0 = 0; n0 < N; n0 += slice) {
    const int ns = std::min(slice, N - n0);
    if (exact) {
      float* ws = reinterpret_cast<float*>(scratch.get());
      launch_dequant<D>(c, w, nullptr, n0, ns, ws);
      CUBLAS_CHECK(cublasSgemm(c.cublas, CUBLAS_OP_T, CUBLAS_OP_N, ns, T, K, &one, ws, K, x, K, &zero, out + n0, N));
    } else {
      __nv_bfloat16* ws = reinterpret_cast<__nv_bfloat16*>(scratch.get());
      launch_dequant<D>(c, w, nullptr, n0, ns, ws);
      gemm_half(c, ws, xh.get(), true, T, ns, K, out + n0, N);
    }
  }
}

// ---- random blocks (synthetic models) ----

__device__ __forceinline__ uint64_t hash64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ void put_f16(uint8_t* p, float v) {
  *reinterpret_cast<uint16_t*>(p) = __half_as_ushort(__float2half_rn(v));
}
// Inverse of k_scale_min for a zeroed scales[12], sub-blocks set in order 0..7.
__device__ __forceinline__ void k_pack_scale_min(uint8_t* q, int j, int sc, int m) {
  if (j < 4) {
    q[j] = uint8_t((q[j] & 0xC0) | sc);
    q[j + 4] = uint8_t((q[j + 4] & 0xC0) | m);
  } else {
    q[j + 4] = uint8_t((sc & 15) | ((m & 15) << 4));
    q[j - 4] = uint8_t((q[j - 4] & 63) | ((sc >> 4) << 6));
    q[j] = uint8_t((q[j] & 63) | ((m >> 4) << 6));
  }
}

// Random quants, then scales chosen so values have standard deviation ≈ sigma and mean ≈ 0
// (the choices of model/random_quant_weights.cpp, which has no IQ4_XS or 32-block generators):
// y = d · sc · (q − centre), d = sigma / (std of q · mean sc).
template <DType D>
__global__ void random_blocks_kernel(uint8_t* __restrict__ dst, int64_t nb, float sigma, uint64_t seed) {
  using Q = QType<D>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < nb; i += int64_t(gridDim.x) * blockDim.x) {
    uint8_t* p = dst + size_t(i) * Q::kBytes;
    const uint64_t key = seed + uint64_t(i) * 0x9e3779b97f4a7c15ull;
    uint16_t* h = reinterpret_cast<uint16_t*>(p);  // blocks are 2-byte aligned
    for (int j = 0; j < Q::kBytes / 2; j += 4) {
      const uint64_t r = hash64(key + uint64_t(j));
      for (int k = 0; k < 4 && j + k < Q::kBytes / 2; ++k) h[j + k] = uint16_t(r >> (16 * k));
    }
    const uint64_t r = hash64(key ^ 0x5851f42d4c957f2dull);
    if constexpr (D == DType::Q8_0) {
      for (int j = 2; j < 34; ++j) p[j] = p[j] == 0x80 ? uint8_t(0x81) : p[j];  // no −128
      put_f16(p, sigma / 73.6f);
    } else if constexpr (D == DType::Q4_0 || D == DType::Q5_0) {
      put_f16(p, sigma / (D == DType::Q4_0 ? 4.61f : 9.23f));
    } else if constexpr (D == DType::Q4_1 || D == DType::Q5_1) {
      const float d = sigma / (D == DType::Q4_1 ? 4.61f : 9.23f);
      put_f16(p, d);
      put_f16(p + 2, -d * (D == DType::Q4_1 ? 7.5f : 15.5f));
    } else if constexpr (D == DType::Q4_K || D == DType::Q5_K) {
      const bool five = D == DType::Q5_K;
      const float dd = sigma / ((five ? 9.23f : 4.61f) * 47.5f);
      put_f16(p, dd);
      put_f16(p + 2, dd * (five ? 15.5f : 7.5f));  // with m == sc: y = dd · sc · (q − centre)
      for (int j = 4; j < 16; ++j) p[j] = 0;
      for (int j = 0; j < 8; ++j) {
        const int sc = 32 + int((r >> (5 * j)) & 31);
        k_pack_scale_min(p + 4, j, sc, sc);
      }
    } else if constexpr (D == DType::Q6_K) {
      for (int j = 0; j < 16; ++j) p[192 + j] = uint8_t(16 + ((r >> (3 * j)) & 31) + ((r >> 50) & 15));
      put_f16(p + 208, sigma / (18.5f * 39.5f));
    } else {  // IQ4_XS: ls − 32 in 8..31, the grid's standard deviation is 67.2
      uint32_t lo = 0, hi = 0;
      for (int ib = 0; ib < 8; ++ib) {
        const int ls = 40 + int(((r >> (5 * ib)) & 31) % 24);
        lo |= uint32_t(ls & 15) << (4 * ib);
        hi |= uint32_t(ls >> 4) << (2 * ib);
      }
      put_f16(p, sigma / (67.2f * 19.5f));
      *reinterpret_cast<uint16_t*>(p + 2) = uint16_t(hi);
      *reinterpret_cast<uint16_t*>(p + 4) = uint16_t(lo);
      *reinterpret_cast<uint16_t*>(p + 6) = uint16_t(lo >> 16);
    }
  }
}

}  // namespace

void quant_random_fill(DType t, void* dst, int64_t n, float sigma, uint64_t seed) {
  const bool ok = with_quant_type(t, [&](auto dt) {
    constexpr DType D = decltype(dt)::value;
    const int64_t nb = n / QType<D>::kElems;
    if (nb == 0) return;
    const int blocks = int(std::min<int64_t>(blocks_for(nb, 256), int64_t(dev_info().sms) * 16));
    random_blocks_kernel<D><<<blocks, 256>>>(static_cast<uint8_t*>(dst), nb, sigma, seed);
    CUDA_LAUNCH_CHECK();
  });
  QWEN36_CHECK(ok, "random weights: no device generator for {}", dtype_name(t));
}

bool quant_supported(DType t) {
  return with_quant_type(t, [](auto) {});
}

void quant_matmul(Ctx& c, const Tensor& x, const Tensor& w, Tensor& out) {
  const int64_t K = w.cols(), N = w.rows(), T = x.numel() / std::max<int64_t>(K, 1);
  QWEN36_CHECK(quant_supported(w.dtype), "matmul: weight dtype {} is not supported by the CUDA backend",
               dtype_name(w.dtype));
  QWEN36_CHECK(x.dtype == DType::F32 && out.dtype == DType::F32, "matmul: activations must be f32");
  QWEN36_CHECK(x.cols() == K && out.numel() == T * N, "matmul: x {} · w {} → out {}", x.shape_str(), w.shape_str(),
               out.shape_str());
  QWEN36_CHECK(N < (int64_t(1) << 31) && T * K < (int64_t(1) << 31), "matmul: {} is too large", w.shape_str());
  QWEN36_CHECK(reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && reinterpret_cast<uintptr_t>(x.data) % 16 == 0,
               "matmul: quantized weights and activations must be 16-byte aligned");
  if (T == 0 || N == 0) return;
  const float* xp = x.as<const float>();
  float* op = out.as<float>();
  with_quant_type(w.dtype, [&](auto dt) {
    constexpr DType D = decltype(dt)::value;
    if (T <= 8 && !c.exact_matmul)
      quant_gemv<D>(c, w, xp, op, int(T), int(N), int(K));
    else
      quant_gemm<D>(c, w, xp, op, int(T), int(N), int(K));
  });
}

void quant_embed(Ctx& c, const Tensor& table, std::span<const int32_t> ids, Tensor& out) {
  const int64_t D = table.cols(), V = table.rows();
  QWEN36_CHECK(quant_supported(table.dtype), "embed: table dtype {} is not supported by the CUDA backend",
               dtype_name(table.dtype));
  QWEN36_CHECK(out.dtype == DType::F32 && out.numel() == int64_t(ids.size()) * D, "embed: out {} for {} ids of width {}",
               out.shape_str(), ids.size(), D);
  QWEN36_CHECK(reinterpret_cast<uintptr_t>(table.data) % 16 == 0, "embed: quantized tables must be 16-byte aligned");
  for (int32_t id : ids) QWEN36_CHECK(id >= 0 && id < V, "token id {} is outside the vocabulary (0..{})", id, V - 1);
  if (ids.empty()) return;
  Temp<int32_t> tmp(c, 0);
  const int32_t* dids = dev_i32(c, ids, tmp);
  if (!dids) return;  // recording a graph that needed an upload: the recording is dropped
  with_quant_type(table.dtype, [&](auto dt) {
    launch_dequant<decltype(dt)::value>(c, table, dids, 0, int(ids.size()), out.as<float>());
  });
}

}  // namespace qwen36::cuda
