// Corrupted-GGUF suite: thousands of deterministic mutations of a valid file. Each must either
// be rejected with qwen36::Error or load into a consistent file (exercise_gguf touches every
// byte the reader points at, so ASan sees any bad view). A set of targeted mutations must be
// rejected outright.
#include <gtest/gtest.h>

#include <functional>
#include <limits>

#include "core/error.h"
#include "format/gguf.h"
#include "gguf_test_util.h"

namespace qwen36 {
namespace {

using test::GgufBuilder;

enum class Outcome { Rejected, Loaded };

// Parses a copy of exactly `bytes.size()` bytes on the heap, so ASan catches reads past the end.
Outcome try_load(const std::vector<std::byte>& bytes, std::string* error = nullptr) {
  std::vector<std::byte> copy(bytes);
  try {
    const GgufFile f(copy.data(), copy.size(), "mutant");
    test::exercise_gguf(f);
    return Outcome::Loaded;
  } catch (const Error& e) {
    if (error) *error = e.what();
    return Outcome::Rejected;
  }
}

template <typename T> void poke(std::vector<std::byte>& b, size_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof(T));
}

struct Stats {
  int total = 0, rejected = 0, loaded = 0;
  void add(Outcome o) {
    ++total;
    (o == Outcome::Rejected ? rejected : loaded)++;
  }
};

class GgufCorrupt : public ::testing::Test {
 protected:
  void SetUp() override { test::build_reference_gguf(ref_); }
  std::vector<std::byte> with(const std::string& field, const std::function<void(std::vector<std::byte>&, size_t)>& edit) {
    auto b = ref_.bytes;
    edit(b, ref_.field(field).offset);
    return b;
  }
  void expect_rejected(const std::string& what, const std::vector<std::byte>& b, const char* needle = nullptr) {
    std::string err;
    EXPECT_EQ(try_load(b, &err), Outcome::Rejected) << what;
    if (needle) {
      EXPECT_NE(err.find(needle), std::string::npos) << what << ": " << err;
    }
    ++targeted_;
  }
  GgufBuilder ref_;
  int targeted_ = 0;
};

TEST_F(GgufCorrupt, ReferenceFileLoads) {
  ASSERT_EQ(try_load(ref_.bytes), Outcome::Loaded);
  const GgufFile f(ref_.bytes.data(), ref_.bytes.size());
  EXPECT_EQ(f.kvs().size(), 16u);
  EXPECT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.get_arr_str("t.arr_str")[2], "Ġe");
}

TEST_F(GgufCorrupt, EveryTruncationIsRejected) {
  // Cutting the file anywhere before the end of the last tensor's bytes must fail; cutting in
  // the final padding may load (the tensor is still whole).
  const size_t last_tensor_end = ref_.field("data").offset + 160 + 144;
  Stats s;
  for (size_t n = 0; n < ref_.bytes.size(); ++n) {
    std::vector<std::byte> b(ref_.bytes.begin(), ref_.bytes.begin() + std::ptrdiff_t(n));
    const Outcome o = try_load(b);
    s.add(o);
    if (n < last_tensor_end) {
      EXPECT_EQ(o, Outcome::Rejected) << "truncated to " << n;
    }
  }
  EXPECT_GE(s.total, 600);
  std::printf("truncations: %d (rejected %d, loaded %d)\n", s.total, s.rejected, s.loaded);
}

TEST_F(GgufCorrupt, BitFlipsInHeaderAndMetadata) {
  // One flipped bit per header byte (bit chosen by position), and all 8 bits of the count,
  // length, type and offset fields; a flip may yield a different valid file but never a crash.
  Stats s;
  const size_t header_end = ref_.field("data").offset;
  for (size_t i = 0; i < header_end; ++i) {
    auto b = ref_.bytes;
    b[i] ^= std::byte(uint8_t(1u << (i % 8)));
    s.add(try_load(b));
  }
  for (const auto& f : ref_.fields) {
    if (f.name == "data" || f.name.find(".bytes") != std::string::npos) continue;
    for (size_t byte = 0; byte < f.size; ++byte) {
      for (int bit = 0; bit < 8; ++bit) {
        auto b = ref_.bytes;
        b[f.offset + byte] ^= std::byte(uint8_t(1u << bit));
        s.add(try_load(b));
      }
    }
  }
  EXPECT_GE(s.total, 1000);
  std::printf("bit flips: %d (rejected %d, loaded %d)\n", s.total, s.rejected, s.loaded);
}

TEST_F(GgufCorrupt, ExtremeValuesInEveryNumericField) {
  const uint64_t size = ref_.bytes.size();
  const uint64_t u64s[] = {0, 1, 2, 7, 31, 33, 255, 65535, 65536, 1ull << 31, 1ull << 32, (1ull << 32) + 1,
                           size - 1, size, size + 1, 1ull << 40, 1ull << 62, 1ull << 63, ~0ull - 31, ~0ull - 1, ~0ull};
  const uint32_t u32s[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 16, 30, 31, 32, 33, 64, 99, 1u << 16, (1u << 16) + 1,
                           1u << 31, ~0u};
  Stats s;
  for (const auto& f : ref_.fields) {
    if (f.name == "data" || f.name.find(".bytes") != std::string::npos) continue;
    if (f.size == 8) {
      for (uint64_t v : u64s) {
        auto b = ref_.bytes;
        poke(b, f.offset, v);
        s.add(try_load(b));
      }
    } else if (f.size == 4) {
      for (uint32_t v : u32s) {
        auto b = ref_.bytes;
        poke(b, f.offset, v);
        s.add(try_load(b));
      }
    } else {
      for (int v = 0; v < 256; v += 17) {
        auto b = ref_.bytes;
        b[f.offset] = std::byte(uint8_t(v));
        s.add(try_load(b));
      }
    }
  }
  EXPECT_GE(s.total, 1000);
  std::printf("extreme values: %d (rejected %d, loaded %d)\n", s.total, s.rejected, s.loaded);
}

TEST_F(GgufCorrupt, TargetedMutationsAreRejected) {
  auto u32_at = [&](const std::string& field, uint32_t v) { return with(field, [&](auto& b, size_t o) { poke(b, o, v); }); };
  auto u64_at = [&](const std::string& field, uint64_t v) { return with(field, [&](auto& b, size_t o) { poke(b, o, v); }); };
  auto i64_at = [&](const std::string& field, int64_t v) { return with(field, [&](auto& b, size_t o) { poke(b, o, v); }); };

  expect_rejected("bad magic", u32_at("magic", 0x46554746), "not a GGUF");
  expect_rejected("version 1", u32_at("version", 1), "version 1");
  expect_rejected("version 4", u32_at("version", 4), "version");
  expect_rejected("big-endian", u32_at("version", 0x03000000), "big-endian");
  expect_rejected("huge tensor count", u64_at("n_tensors", ~0ull), "tensor count");
  expect_rejected("tensor count beyond file", u64_at("n_tensors", 1u << 19), "cannot fit");
  expect_rejected("huge KV count", u64_at("n_kv", 1ull << 40), "KV count");
  expect_rejected("KV count beyond file", u64_at("n_kv", 100000), "cannot fit");
  expect_rejected("huge key length", u64_at("kv0.key.len", ~0ull), "length");
  expect_rejected("key length past end", u64_at("kv0.key.len", 60000), "truncated");
  expect_rejected("empty key", with("kv2.key.len", [](auto& b, size_t o) {
                    // Make key "t.u8" empty by turning its length into 0 and its 4 bytes into the type
                    // field of a different layout: simplest is a zero length, which leaves garbage after.
                    poke<uint64_t>(b, o, 0);
                  }));
  expect_rejected("bad value type", u32_at("kv2.type", 13), "invalid value type");
  expect_rejected("huge string", u64_at("kv0.value.len", 1ull << 62), "length");
  expect_rejected("array of arrays", u32_at("kv13.etype", uint32_t(GgufType::ARRAY)), "arrays of arrays");
  expect_rejected("bad array type", u32_at("kv13.etype", 77), "element type");
  expect_rejected("huge array", u64_at("kv13.count", 1ull << 60), "array of");
  expect_rejected("array past end", u64_at("kv13.count", 1u << 20), "truncated");
  expect_rejected("string array count", u64_at("kv14.count", 1u << 27), "cannot fit");
  expect_rejected("string in array too long", u64_at("kv14.s0.len", 1ull << 40), "length");
  expect_rejected("bool 2", with("kv9.value", [](auto& b, size_t o) { b[o] = std::byte{2}; }), "bool");
  expect_rejected("alignment 0", u32_at("kv1.value", 0), "alignment");
  expect_rejected("alignment 3", u32_at("kv1.value", 3), "alignment");
  expect_rejected("alignment 48", u32_at("kv1.value", 48), "alignment");
  expect_rejected("alignment 2^20", u32_at("kv1.value", 1u << 20), "alignment");
  expect_rejected("alignment of wrong type", u32_at("kv1.type", uint32_t(GgufType::I32)), "general.alignment");
  expect_rejected("alignment 64 breaks offsets", u32_at("kv1.value", 64), "alignment");
  expect_rejected("duplicate key", with("kv3.key.bytes", [](auto& b, size_t o) {
                    // "t.i8" -> "t.u8" duplicates kv2 (same length).
                    b[o + 2] = std::byte{'u'};
                  }), "duplicate key");
  expect_rejected("duplicate tensor", with("tensor2.name.bytes", [](auto& b, size_t o) {
                    // "w.q4k" -> "w.f32" duplicates tensor0 (same length).
                    b[o + 2] = std::byte{'f'};
                    b[o + 3] = std::byte{'3'};
                    b[o + 4] = std::byte{'2'};
                  }), "duplicate tensor");
  expect_rejected("ndims 0", u32_at("tensor0.ndims", 0), "n_dims");
  expect_rejected("ndims 5", u32_at("tensor0.ndims", 5), "n_dims");
  expect_rejected("ndims huge", u32_at("tensor0.ndims", ~0u), "n_dims");
  expect_rejected("zero dim", i64_at("tensor0.ne1", 0), "dimension");
  expect_rejected("negative dim", i64_at("tensor0.ne0", -8), "dimension");
  expect_rejected("overflowing dims", with("tensor0.ne0", [](auto& b, size_t o) {
                    poke<int64_t>(b, o, int64_t(1) << 40);
                    poke<int64_t>(b, o + 8, int64_t(1) << 40);
                  }), "overflow");
  expect_rejected("numel too big for data", i64_at("tensor0.ne1", int64_t(1) << 40), "outside");
  expect_rejected("bytes overflow", i64_at("tensor2.ne0", std::numeric_limits<int64_t>::max() / 256 * 256), nullptr);
  expect_rejected("row not multiple of block", i64_at("tensor2.ne0", 128), "multiple");
  expect_rejected("unknown tensor type", u32_at("tensor0.type", 99), "unknown ggml type");
  expect_rejected("unsupported tensor type", u32_at("tensor0.type", 16), "iq2_xxs");
  expect_rejected("removed tensor type", u32_at("tensor0.type", 4), "ggml type");
  expect_rejected("misaligned offset", u64_at("tensor1.offset", 65), "alignment");
  expect_rejected("overlapping tensors", u64_at("tensor1.offset", 32), "overlap");
  expect_rejected("same offset", u64_at("tensor2.offset", 64), "overlap");
  expect_rejected("offset past end", u64_at("tensor2.offset", 320), "outside");
  expect_rejected("offset near 2^64", u64_at("tensor2.offset", ~0ull - 31), "outside");
  expect_rejected("tensor name too long", u64_at("tensor0.name.len", 5000), "length");
  expect_rejected("empty tensor name", u64_at("tensor0.name.len", 0), nullptr);
  EXPECT_GE(targeted_, 45);
}

TEST_F(GgufCorrupt, LlamaCppFileMutations) {
  // A real file: mutate the first 4 KiB (header, KVs, token arrays) at deterministic positions
  // with a small xorshift generator; none may crash.
  auto base = test::read_bytes(std::string(QWEN36_TEST_DATA) + "/llamacpp-gguf/dense-a/model-q4_k_m.gguf");
  ASSERT_EQ(try_load(base), Outcome::Loaded);
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  Stats s;
  for (int i = 0; i < 400; ++i) {
    auto b = base;
    const int edits = 1 + int(next() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = size_t(next() % 4096);
      switch (next() % 3) {
        case 0: b[pos] ^= std::byte(uint8_t(1u << (next() % 8))); break;
        case 1: b[pos] = std::byte(uint8_t(next())); break;
        default: std::memset(b.data() + pos, 0xff, std::min<size_t>(8, b.size() - pos)); break;
      }
    }
    s.add(try_load(b));
  }
  EXPECT_EQ(s.total, 400);
  std::printf("llama.cpp file mutations: %d (rejected %d, loaded %d)\n", s.total, s.rejected, s.loaded);
}

}  // namespace
}  // namespace qwen36
