#include "core/dtype.h"

#include <cmath>
#include <iterator>

#include "core/error.h"

namespace qwen36 {

namespace {
struct DTypeInfo {
  std::string_view name;
  size_t block_bytes;
  int64_t block_elems;
};

// Block sizes follow ggml's layouts (see quant/blocks.h for the structs).
constexpr DTypeInfo kInfo[] = {
    {"f32", 4, 1},      {"f16", 2, 1},     {"bf16", 2, 1},    {"i32", 4, 1},
    {"q4_0", 18, 32},   {"q4_1", 20, 32},  {"q5_0", 22, 32},  {"q5_1", 24, 32},
    {"q8_0", 34, 32},   {"q4_k", 144, 256}, {"q5_k", 176, 256}, {"q6_k", 210, 256},
    {"q8_k", 292, 256}, {"iq4_xs", 136, 256},
    {"f8_e4m3", 1, 1},
    {"u8", 1, 1},       {"i64", 8, 1},
    {"w4_g32", 20, 32}, {"w4_g128", 68, 128}, {"f8_b128", 132, 128}, {"nvfp4_b64", 40, 64},
    {"q4_k_t16", 144, 256}, {"q6_k_t16", 210, 256}, {"q8_0_t16", 34, 32},
    {"w4_g128_t16", 68, 128}, {"nvfp4_b64_t16", 40, 64}, {"w4_g32_t16", 20, 32},
};
// One row per DType, in enum order (a type added to dtype.h needs its row here).
static_assert(std::size(kInfo) == size_t(kLastDType) + 1);
const DTypeInfo& info(DType t) { return kInfo[static_cast<size_t>(t)]; }
}  // namespace

std::string_view dtype_name(DType t) { return info(t).name; }
size_t dtype_block_bytes(DType t) { return info(t).block_bytes; }
int64_t dtype_block_elems(DType t) { return info(t).block_elems; }

size_t dtype_row_bytes(DType t, int64_t n) {
  const auto& i = info(t);
  QWEN36_CHECK(n >= 0 && n % i.block_elems == 0, "row of {} elements is not a multiple of the {} block size {}",
               n, i.name, i.block_elems);
  return size_t(n / i.block_elems) * i.block_bytes;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | uint32_t(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  return std::bit_cast<float>(bits);
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000;
  const int32_t exp = int32_t((u >> 23) & 0xff) - 127 + 15;
  uint32_t mant = u & 0x7fffff;
  if (((u >> 23) & 0xff) == 0xff) return uint16_t(sign | 0x7c00 | (mant ? 0x200 : 0));
  if (exp >= 31) return uint16_t(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return uint16_t(sign);
    mant |= 0x800000;
    const int shift = 14 - exp;
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1))) ++half;
    return uint16_t(sign | half);
  }
  uint32_t half = sign | uint32_t(exp) << 10 | mant >> 13;
  const uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;  // may carry into the exponent: correct
  return uint16_t(half);
}

float f8_e4m3_to_f32(uint8_t b) {
  const uint32_t e = (b >> 3) & 15u, m = b & 7u;
  float v;
  if (e == 0)
    v = float(m) * 0.001953125f;  // subnormal: m · 2^-9
  else if (e == 15 && m == 7)
    v = std::bit_cast<float>(0x7fc00000u);  // NaN
  else
    v = std::bit_cast<float>((e + 120u) << 23 | m << 20);
  return (b & 0x80) ? -v : v;
}

uint8_t f32_to_f8_e4m3(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint8_t(sign | 0x7fu);  // NaN
  if (a >= 0x43e00000u) return uint8_t(sign | 0x7eu);  // ≥ 448 (infinity too): saturate
  if (a < 0x3c800000u)  // below 2^-6: subnormal steps of 2^-9 (8 rounds up to 2^-6, encoded 0x08)
    return uint8_t(sign | uint8_t(std::nearbyint(std::bit_cast<float>(a) * 512.0f)));
  // Normal: keep the exponent and the top 3 mantissa bits, rounding the other 20 to nearest
  // even (a carry moves into the exponent); below 448 nothing rounds past 0x7e.
  const uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
  return uint8_t(sign | (r - (120u << 3)));
}

}  // namespace qwen36
