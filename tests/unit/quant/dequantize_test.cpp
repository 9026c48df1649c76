// Dequantization of hand-built blocks: every expected value is computed by hand from the
// block layout (ggml-common.h), independent of the code under test.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/error.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace qwen36 {
namespace {

constexpr uint16_t kHalf = 0x3800, kOne = 0x3C00, kTwo = 0x4000, kQuarter = 0x3400, kMinusOne = 0xBC00;

template <typename Block> std::vector<float> deq(DType t, const Block& b, int n) {
  std::vector<float> y(size_t(n), -999.0f);
  dequantize_row(t, &b, y.data(), n);
  return y;
}

TEST(Dequantize, Q4_0) {
  BlockQ4_0 b{};
  b.d = kHalf;
  for (int j = 0; j < 16; ++j) b.qs[j] = uint8_t(j | ((15 - j) << 4));
  const auto y = deq(DType::Q4_0, b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[size_t(j)], 0.5f * float(j - 8));       // low nibbles: first half
    EXPECT_EQ(y[size_t(j + 16)], 0.5f * float(7 - j));  // high nibbles: second half
  }
}

TEST(Dequantize, Q4_1) {
  BlockQ4_1 b{};
  b.d = kTwo;
  b.m = kMinusOne;
  std::memset(b.qs, 0x51, sizeof b.qs);
  const auto y = deq(DType::Q4_1, b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[size_t(j)], 1.0f);        // 2*1 - 1
    EXPECT_EQ(y[size_t(j + 16)], 9.0f);   // 2*5 - 1
  }
}

TEST(Dequantize, Q5_0AndQ5_1HighBits) {
  BlockQ5_0 b{};
  b.d = kOne;
  const uint32_t qh = 0x80000001u;  // 5th bit of elements 0 and 31
  std::memcpy(b.qh, &qh, 4);
  b.qs[15] = 0x30;  // element 31 low nibble 3
  const auto y = deq(DType::Q5_0, b, 32);
  EXPECT_EQ(y[0], 0.0f);    // 16 - 16
  EXPECT_EQ(y[1], -16.0f);  // 0 - 16
  EXPECT_EQ(y[31], 3.0f);   // 19 - 16

  BlockQ5_1 c{};
  c.d = kTwo;
  c.m = kHalf;
  const uint32_t qh1 = 1u << 16;  // element 16
  std::memcpy(c.qh, &qh1, 4);
  c.qs[0] = 0x21;  // element 0: 1, element 16: 2 (+16)
  const auto z = deq(DType::Q5_1, c, 32);
  EXPECT_EQ(z[0], 2.5f);    // 2*1 + 0.5
  EXPECT_EQ(z[16], 36.5f);  // 2*18 + 0.5
  EXPECT_EQ(z[5], 0.5f);
}

TEST(Dequantize, Q8_0AndQ8_K) {
  BlockQ8_0 b{};
  b.d = kQuarter;
  for (int j = 0; j < 32; ++j) b.qs[j] = int8_t(j - 16);
  const auto y = deq(DType::Q8_0, b, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[size_t(j)], 0.25f * float(j - 16));

  BlockQ8_K k{};
  k.d = 0.5f;
  for (int j = 0; j < 256; ++j) k.qs[j] = int8_t(j - 128);
  const auto z = deq(DType::Q8_K, k, 256);
  for (int j = 0; j < 256; ++j) EXPECT_EQ(z[size_t(j)], 0.5f * float(j - 128));
}

TEST(Dequantize, KScaleMinUnpack) {
  // sc = {1,2,3,4,20,37,50,63}, m = {0,5,10,63,17,33,2,48}, packed by hand (6-bit fields).
  const uint8_t q[12] = {0x41, 0x82, 0xc3, 0xc4, 0x40, 0x85, 0x0a, 0xff, 0x14, 0x15, 0x22, 0x0f};
  const int sc[8] = {1, 2, 3, 4, 20, 37, 50, 63}, m[8] = {0, 5, 10, 63, 17, 33, 2, 48};
  for (int j = 0; j < 8; ++j) {
    uint8_t s, mm;
    unpack_k_scale_min(j, q, s, mm);
    EXPECT_EQ(s, sc[j]) << j;
    EXPECT_EQ(mm, m[j]) << j;
  }
}

TEST(Dequantize, Q4_K) {
  BlockQ4_K b{};
  b.d = kOne;
  b.dmin = kHalf;
  const uint8_t q[12] = {0x41, 0x82, 0xc3, 0xc4, 0x40, 0x85, 0x0a, 0xff, 0x14, 0x15, 0x22, 0x0f};
  std::memcpy(b.scales, q, 12);
  std::memset(b.qs, 0x21, sizeof b.qs);  // low nibble 1 (sub-block 2c), high nibble 2 (2c+1)
  const int sc[8] = {1, 2, 3, 4, 20, 37, 50, 63}, m[8] = {0, 5, 10, 63, 17, 33, 2, 48};
  const auto y = deq(DType::Q4_K, b, 256);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      EXPECT_EQ(y[size_t(64 * c + l)], float(sc[2 * c]) * 1 - 0.5f * float(m[2 * c]));
      EXPECT_EQ(y[size_t(64 * c + 32 + l)], float(sc[2 * c + 1]) * 2 - 0.5f * float(m[2 * c + 1]));
    }
  }
}

TEST(Dequantize, Q5_K) {
  BlockQ5_K b{};
  b.d = kOne;
  b.dmin = kOne;
  // Every scale 1, every min 0: bytes 0..3 = 1, 4..7 = 0, 8..11 low nibble 1.
  const uint8_t q[12] = {1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1};
  std::memcpy(b.scales, q, 12);
  b.qs[3] = 0x72;         // element 3: 2, element 35: 7
  b.qh[3] = 0b00000101;   // bit 0: element 3 (+16); bit 2: element 64+3 (+16)
  b.qh[4] = 0b10000000;   // bit 7: sub-block 7, element 224+4
  const auto y = deq(DType::Q5_K, b, 256);
  EXPECT_EQ(y[3], 18.0f);
  EXPECT_EQ(y[35], 7.0f);
  EXPECT_EQ(y[67], 16.0f);
  EXPECT_EQ(y[228], 16.0f);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[255], 0.0f);
}

TEST(Dequantize, Q6_K) {
  BlockQ6_K b{};
  b.d = kHalf;
  for (int k = 0; k < 16; ++k) b.scales[k] = int8_t(k - 8);
  b.ql[0] = 0x3A;   // element 0 low bits 10, element 64 low bits 3
  b.ql[32] = 0xC5;  // element 32 low bits 5, element 96 low bits 12
  b.qh[0] = 0x9C;   // 2-bit groups (LSB first): e0 0, e32 3, e64 1, e96 2
  b.ql[64] = 0x0F;  // element 128 low bits 15
  b.qh[32] = 0x02;  // e128 high bits 2
  const auto y = deq(DType::Q6_K, b, 256);
  auto sc = [](int e) { return float(e / 16 - 8); };
  EXPECT_EQ(y[0], 0.5f * sc(0) * float(10 - 32));
  EXPECT_EQ(y[32], 0.5f * sc(32) * float(53 - 32));
  EXPECT_EQ(y[64], 0.5f * sc(64) * float(19 - 32));
  EXPECT_EQ(y[96], 0.5f * sc(96) * float(44 - 32));
  EXPECT_EQ(y[128], 0.5f * sc(128) * float(47 - 32));
  for (int e : {1, 31, 33, 100, 129, 200, 255}) EXPECT_EQ(y[size_t(e)], 0.5f * sc(e) * -32.0f) << e;
}

TEST(Dequantize, IQ4_XS) {
  BlockIQ4_XS b{};
  b.d = kOne;
  b.scales_l[0] = 0xE1;  // ib0 low 1, ib1 low 14
  b.scales_h = 0x0006;   // ib0 high 2 -> ls 33 (dl 1); ib1 high 1 -> ls 30 (dl -2); others ls 0 (dl -32)
  b.qs[0] = 0xF8;        // y[0] = K[8] = 1, y[16] = K[15] = 113
  b.qs[16] = 0x10;       // y[32] = -2*K[0] = 254, y[48] = -2*K[1] = 208
  const auto y = deq(DType::IQ4_XS, b, 256);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[16], 113.0f);
  EXPECT_EQ(y[1], -127.0f);
  EXPECT_EQ(y[32], 254.0f);
  EXPECT_EQ(y[48], 208.0f);
  EXPECT_EQ(y[64], -32.0f * -127.0f);
}

TEST(Dequantize, PlainTypesAndErrors) {
  const uint16_t h[2] = {kOne, kMinusOne};
  float y[2];
  dequantize_row(DType::F16, h, y, 2);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -1.0f);
  const uint16_t bf[1] = {0x4040};  // 3.0 in bf16
  dequantize_row(DType::BF16, bf, y, 1);
  EXPECT_EQ(y[0], 3.0f);
  BlockQ8_0 b{};
  float z[32];
  EXPECT_THROW(dequantize_row(DType::Q8_0, &b, z, 31), Error);
}

}  // namespace
}  // namespace qwen36
