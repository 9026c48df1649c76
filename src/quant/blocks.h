#pragma once
// defines: BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ4_K, BlockQ5_K,
//          BlockQ6_K, BlockQ8_K, BlockIQ4_XS, kIQ4NLValues, unpack_k_scale_min, pack_k_scale_min
//
// Byte-for-byte the block layouts of ggml (ggml-common.h), so GGUF tensor data is used in place.
// Scales `d`/`dmin`/`m` are IEEE half stored as uint16_t (core/dtype.h converts), except Q8_K
// whose `d` is a float. Blocks are read straight from the file map: GGUF data offsets are
// 32-aligned and every block size is even, so the uint16 fields are always 2-byte aligned.

#include <cstdint>

namespace qwen36 {

inline constexpr int kQK = 32;    // elements per block of the classic types
inline constexpr int kQK_K = 256;  // elements per super-block of the K-quants and IQ4_XS

// y[j] = d * ((qs[j] & 15) - 8), y[j+16] = d * ((qs[j] >> 4) - 8), j < 16.
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
// y = d * q + m, nibbles as in Q4_0.
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQK / 2];
};
// 5-bit: the low nibbles as Q4_0, bit j of qh (a little-endian u32) is the 5th bit of element j.
// y = d * (q - 16).
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
// y = d * q + m.
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
// y = d * qs.
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
// 8 sub-blocks of 32 with 6-bit scales and mins packed in `scales` (see unpack_k_scale_min).
// Chunk c (64 values, bytes qs[32c..32c+32)): low nibbles are sub-block 2c, high nibbles 2c+1.
// y = d * sc * q - dmin * m.
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[kQK_K / 2];
};
// Q4_K plus a 5th bit: bit 2c of qh[l] for element l of sub-block 2c, bit 2c+1 for sub-block 2c+1.
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
// 16 sub-blocks of 16 with int8 scales; 6-bit values (4 low bits in ql, 2 high in qh) minus 32.
// Note `d` comes last.
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;
};
// The activation type of K-quant dot products: y = d * qs; bsums[i] = sum of qs[16i..16i+16).
struct BlockQ8_K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];
};
// 8 sub-blocks of 32; 6-bit sub-block scale ls (low 4 bits in scales_l, high 2 in scales_h),
// dl = d * (ls - 32); y = dl * kIQ4NLValues[nibble], nibbles as in Q4_0.
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[kQK_K / 64];
  uint8_t qs[kQK_K / 2];
};

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 &&
              sizeof(BlockQ8_K) == 292 && sizeof(BlockIQ4_XS) == 136);

// The non-linear 4-bit grid of IQ4_NL / IQ4_XS.
inline constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes of Q4_K / Q5_K:
// j < 4: low 6 bits of bytes j and j+4; else 4 bits from byte j+4 and the top 2 bits of j-4 / j.
inline void unpack_k_scale_min(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// The inverse: sets sub-block j's scale sc and min m (6 bits each) in the 12 packed bytes, which
// start zeroed and are filled in order j = 0..7. Used by the CPU and the device generators of
// synthetic K-quant weights, hence callable from CUDA code too.
#ifdef __CUDACC__
__host__ __device__
#endif
inline void pack_k_scale_min(uint8_t* q, int j, int sc, int m) {
  if (j < 4) {
    q[j] = uint8_t((q[j] & 0xC0) | sc);
    q[j + 4] = uint8_t((q[j + 4] & 0xC0) | m);
  } else {
    q[j + 4] = uint8_t((sc & 15) | ((m & 15) << 4));
    q[j - 4] = uint8_t((q[j - 4] & 63) | ((sc >> 4) << 6));
    q[j] = uint8_t((q[j] & 63) | ((m >> 4) << 6));
  }
}

}  // namespace qwen36
