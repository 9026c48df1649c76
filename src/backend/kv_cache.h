#pragma once
// defines: the attention KV-cache formats (kv_cache_type_supported, kv_cache_rotated,
//          kv_cache_head_dim_ok, kv_cache_bytes, kv_scale_offset) and the host reference of
//          their encoding (kv_hadamard, kv_encode_row, kv_decode_row). The CPU backend uses
//          these; the CUDA kernels reproduce them bit for bit (the GPU tests compare bytes).
//
// A cache tensor is [slots, capacity, KVH, hd] of its dtype. One (position, kv head) row of
// hd values is the unit of encoding:
//  - F32, BF16: plain elements (bf16 rounds to nearest even).
//  - F8_E4M3: hd e4m3 bytes, and a per-row f32 scale 2^e stored after all the elements of
//    the buffer, as [slots, KVH, capacity] (a run of positions is contiguous). e is the
//    smallest exponent with max|x| ≤ 448·2^e, clamped to [-15, 7]: no calibration, no
//    overflow below |x| = 57344 (beyond it values saturate), and every stored value
//    e4m3·2^e is exact in f16 (the GPU reads it into f16 tiles without rounding). A power of
//    two loses nothing: a floating format's relative precision does not depend on the scale.
//    The tensor's nbytes() covers the elements only; kv_cache_bytes() is the allocation.
//  - Q8_0, Q4_0: the GGUF blocks of 32 along hd (f16 d + 32 int8; f16 d + 16 bytes of
//    nibbles, element j low / j + 16 high), quantised as quant/quantize.cpp does, of the
//    row after the Walsh–Hadamard rotation below. A value reads back as f16(d·q), rounded to
//    f16 (the GPU's tiles are f16; relative 2^-12, far below the quantisation step).
//
// Rotation (Q8_0, Q4_0). H = the Sylvester–Hadamard matrix of order hd (a power of two)
// divided by √hd: symmetric and orthonormal, so H·H = I. Rows are stored as quant(H·k) and
// quant(H·v). Scores need no correction if q is rotated too: (H·q)·(H·k) = qᵀ·Hᵀ·H·k = q·k.
// The output over rotated values is Σ p_i·H·v_i = H·Σ p_i·v_i, so applying H once more
// (its own inverse) gives the true output. This is the "rotate q and K, rotate V and
// un-rotate the output" scheme of llama.cpp's quantised KV. Why: one large coordinate (K
// and V have a few outlier channels) would set the scale of its whole 32-block and crush
// the others to a few levels; after H every coordinate is a ±1/√hd mix of all of them, so
// the block maxima are close to the typical magnitude. fp8 needs no rotation (see above).

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "quant/blocks.h"

namespace qwen36 {

inline bool kv_cache_type_supported(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F8_E4M3 || t == DType::Q8_0 || t == DType::Q4_0;
}
inline bool kv_cache_rotated(DType t) { return t == DType::Q8_0 || t == DType::Q4_0; }
inline bool kv_cache_quantized(DType t) { return t == DType::F8_E4M3 || kv_cache_rotated(t); }
// Q8_0/Q4_0 need whole blocks and a power-of-two rotation: hd a power of two ≥ 32.
inline bool kv_cache_head_dim_ok(DType t, int64_t hd) {
  if (hd <= 0) return false;
  if (kv_cache_rotated(t)) return hd >= 32 && (hd & (hd - 1)) == 0;
  return true;
}

// Bytes of the per-row fp8 scales' start: right after the elements.
inline size_t kv_scale_offset(DType t, int64_t slots, int64_t cap, int64_t kvh, int64_t hd) {
  return size_t(slots * cap * kvh) * dtype_row_bytes(t, hd);
}
// Bytes a cache needs (elements, and the fp8 scales).
inline size_t kv_cache_bytes(DType t, int64_t slots, int64_t cap, int64_t kvh, int64_t hd) {
  return kv_scale_offset(t, slots, cap, kvh, hd) + (t == DType::F8_E4M3 ? size_t(slots * cap * kvh) * 4 : 0);
}

// 1/√n in f32 (the CUDA kernels are handed this same value).
inline float kv_hadamard_scale(int64_t n) { return 1.0f / std::sqrt(float(n)); }

// x ← H·x (n a power of two): butterflies of span 1, 2, 4, … then one scaling. The CUDA
// kernels do the same additions in the same order (span < hd/32 within a lane, the rest
// across lanes), so rotated values agree bit for bit.
inline void kv_hadamard(float* x, int64_t n) {
  for (int64_t h = 1; h < n; h <<= 1)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  const float s = kv_hadamard_scale(n);
  for (int64_t j = 0; j < n; ++j) x[j] *= s;
}

// The fp8 row scale exponent: smallest e with amax ≤ 448·2^e (448 = 1.75·2^8), in [-15, 7].
inline int kv_fp8_exponent(float amax) {
  const uint32_t u = std::bit_cast<uint32_t>(amax) & 0x7fffffffu;
  const int E = int(u >> 23) - 127;
  const int e = E - 8 + ((u & 0x7fffffu) > 0x600000u ? 1 : 0);
  return std::clamp(e, -15, 7);
}
inline float kv_pow2(int e) { return std::bit_cast<float>(uint32_t(127 + e) << 23); }

// Encodes one row x[hd] (F8_E4M3, Q8_0, Q4_0) into dst (dtype_row_bytes(t, hd) bytes);
// *scale receives the fp8 row scale. Q8_0/Q4_0 rotate a copy of x in tmp[hd] first.
inline void kv_encode_row(DType t, const float* x, int64_t hd, void* dst, float* scale, float* tmp) {
  if (t == DType::F8_E4M3) {
    float amax = 0;
    for (int64_t i = 0; i < hd; ++i) amax = std::max(amax, std::fabs(x[i]));
    const int e = kv_fp8_exponent(amax);
    const float inv = kv_pow2(-e);
    auto* b = static_cast<uint8_t*>(dst);
    for (int64_t i = 0; i < hd; ++i) b[i] = f32_to_f8_e4m3(x[i] * inv);
    *scale = kv_pow2(e);
    return;
  }
  std::memcpy(tmp, x, size_t(hd) * sizeof(float));
  kv_hadamard(tmp, hd);
  for (int64_t b0 = 0; b0 < hd; b0 += kQK) {
    const float* xb = tmp + b0;
    if (t == DType::Q8_0) {
      BlockQ8_0& blk = static_cast<BlockQ8_0*>(dst)[b0 / kQK];
      float amax = 0;
      for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(xb[j]));
      const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
      blk.d = f32_to_f16(d);
      for (int j = 0; j < kQK; ++j) blk.qs[j] = int8_t(std::clamp(int(std::nearbyint(xb[j] * id)), -127, 127));
    } else {  // Q4_0: the value of largest magnitude (the first, on ties) maps to -8
      BlockQ4_0& blk = static_cast<BlockQ4_0*>(dst)[b0 / kQK];
      float amax = 0, vmax = 0;
      for (int j = 0; j < kQK; ++j)
        if (std::fabs(xb[j]) > amax) amax = std::fabs(xb[j]), vmax = xb[j];
      blk.d = f32_to_f16(vmax / -8.0f);
      const float s = f16_to_f32(blk.d), is = s != 0 ? 1.0f / s : 0.0f;
      int q[kQK];
      for (int j = 0; j < kQK; ++j) q[j] = std::clamp(int(std::nearbyint(xb[j] * is)), -8, 7);
      for (int j = 0; j < kQK / 2; ++j) blk.qs[j] = uint8_t((q[j] + 8) | ((q[j + kQK / 2] + 8) << 4));
    }
  }
}

// The values one row reads back as (F8_E4M3, Q8_0, Q4_0), still rotated for Q8_0/Q4_0.
inline void kv_decode_row(DType t, const void* src, float scale, int64_t hd, float* dst) {
  auto f16r = [](float x) { return f16_to_f32(f32_to_f16(x)); };
  if (t == DType::F8_E4M3) {
    const auto* b = static_cast<const uint8_t*>(src);
    for (int64_t i = 0; i < hd; ++i) dst[i] = f8_e4m3_to_f32(b[i]) * scale;
  } else if (t == DType::Q8_0) {
    for (int64_t b0 = 0; b0 < hd; b0 += kQK) {
      const BlockQ8_0& blk = static_cast<const BlockQ8_0*>(src)[b0 / kQK];
      const float d = f16_to_f32(blk.d);
      for (int j = 0; j < kQK; ++j) dst[b0 + j] = f16r(d * float(blk.qs[j]));
    }
  } else {
    for (int64_t b0 = 0; b0 < hd; b0 += kQK) {
      const BlockQ4_0& blk = static_cast<const BlockQ4_0*>(src)[b0 / kQK];
      const float d = f16_to_f32(blk.d);
      for (int j = 0; j < kQK / 2; ++j) {
        dst[b0 + j] = f16r(d * float((blk.qs[j] & 15) - 8));
        dst[b0 + j + kQK / 2] = f16r(d * float((blk.qs[j] >> 4) - 8));
      }
    }
  }
}

}  // namespace qwen36
