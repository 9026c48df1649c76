// Corrupted safetensors files: > 1,500 deterministic cases. Each must be rejected with
// qwen36::Error, or (where the mutation happens to leave a valid file) load consistently:
// every tensor inside the file, no overlaps, every byte readable. Anything else — a crash,
// an ASan report, another exception type escaping — fails the test.
//
// "Strict" cases are ones no valid reading exists for; they must be rejected.
#include <gtest/gtest.h>

#include <limits>

#include "core/error.h"
#include "format/safetensors.h"
#include "format_test_util.h"

namespace qwen36 {
namespace {

using test::Bytes;
using test::StTensor;
using json = nlohmann::json;

enum class Outcome { Rejected, Loaded, Crashed };

class FormatCorrupt : public ::testing::Test {
 protected:
  // Writes the bytes and opens them as a safetensors file.
  Outcome load(const Bytes& b, const std::string& what) {
    ++cases_;
    const std::string path = dir_ / "x.safetensors";
    test::write_bytes(path, b);
    try {
      SafetensorsFile f(path);
      test::exercise_safetensors(f, b.size());
      return Outcome::Loaded;
    } catch (const Error& e) {
      if (std::string(e.what()).empty()) ADD_FAILURE() << what << ": error without a message";
      return Outcome::Rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": escaped as a non-qwen36 exception: " << e.what();
      return Outcome::Crashed;
    }
  }
  void strict(const Bytes& b, const std::string& what) {
    EXPECT_EQ(load(b, what), Outcome::Rejected) << what << " was accepted";
  }
  void lenient(const Bytes& b, const std::string& what) {
    EXPECT_NE(load(b, what), Outcome::Crashed) << what;
  }

  // Base file: four tensors, no trailing bytes (the last tensor ends at the end of the file).
  static std::vector<StTensor> base_tensors() {
    auto fill = [](size_t n, uint8_t s) {
      Bytes b(n);
      for (size_t i = 0; i < n; ++i) b[i] = uint8_t(s * 7 + i * 13);
      return b;
    };
    return {{"a.f32", "F32", {3, 5}, fill(60, 1)},
            {"b.bf16", "BF16", {7}, fill(14, 2)},
            {"c.f16", "F16", {2, 3, 4}, fill(48, 3)},
            {"d.i32", "I32", {6}, fill(24, 4)}};
  }
  // The base header as JSON plus its data, for targeted edits.
  json base_header(Bytes& data) const { return test::st_header(base_tensors(), data); }
  static Bytes with_header(const json& h, const Bytes& data) {
    std::string text = h.dump();
    while ((8 + text.size()) % 8) text += ' ';
    return test::st_raw(text, data);
  }

  test::TempDir dir_;
  int cases_ = 0;
};

TEST_F(FormatCorrupt, BaseFileLoads) {
  const Bytes b = test::st_build(base_tensors());
  EXPECT_EQ(load(b, "base"), Outcome::Loaded);
}

TEST_F(FormatCorrupt, TruncatedAtEveryOffset) {
  const Bytes full = test::st_build(base_tensors());
  for (size_t n = 0; n < full.size(); ++n)
    strict(Bytes(full.begin(), full.begin() + std::ptrdiff_t(n)), "truncated to " + std::to_string(n));
  EXPECT_GE(cases_, 400);
}

TEST_F(FormatCorrupt, HeaderLengthField) {
  const Bytes full = test::st_build(base_tensors());
  uint64_t real = 0;
  for (int i = 7; i >= 0; --i) real = (real << 8) | full[size_t(i)];
  const uint64_t size = full.size(), u64max = std::numeric_limits<uint64_t>::max();
  // Past the file or the cap: strict. Inside the file but wrong: the JSON no longer parses,
  // or its offsets no longer fit, so in practice rejected, but only consistency is required.
  for (uint64_t v : {size - 7, size, size + 1, uint64_t(1) << 32, (uint64_t(100) << 20) + 1, uint64_t(1) << 62,
                     uint64_t(1) << 63, u64max, u64max - 7, u64max - size + 9})
    strict([&] { Bytes b = full; for (int i = 0; i < 8; ++i) b[size_t(i)] = uint8_t(v >> (8 * i)); return b; }(),
           "header length " + std::to_string(v));
  for (uint64_t v : {uint64_t(0), uint64_t(1), uint64_t(2), real - 1, real - 8, real + 1, real + 8, size - 8, real / 2})
    lenient([&] { Bytes b = full; for (int i = 0; i < 8; ++i) b[size_t(i)] = uint8_t(v >> (8 * i)); return b; }(),
            "header length " + std::to_string(v));
  EXPECT_GE(cases_, 19);
}

TEST_F(FormatCorrupt, NotAJsonObject) {
  for (const char* h : {"", " ", "[]", "[{}]", "1", "-1", "\"str\"", "null", "true", "{", "}", "{\"a\":", "{\"a\" 1}",
                        "{'a': 1}", "\xff\xfe{}", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}",
                        "{}{}", "{\"a\":1,}", "NaN", "{\"a\":{}}\x01"})
    strict(test::st_raw(h, Bytes(4, 0)), std::string("header ") + h);
  EXPECT_GE(cases_, 20);
}

TEST_F(FormatCorrupt, HeaderTextTruncatedAtEveryCharacter) {
  Bytes data;
  const std::string text = base_header(data).dump();
  for (size_t n = 0; n < text.size(); ++n) strict(test::st_raw(text.substr(0, n), data), "header cut at " + std::to_string(n));
  EXPECT_GE(cases_, 240);
}

// Targeted edits of one entry; every one leaves no valid reading.
TEST_F(FormatCorrupt, EntryFieldsStrict) {
  Bytes data;
  const json base = base_header(data);
  const uint64_t dsize = data.size();
  const uint64_t c0 = base["c.f16"]["data_offsets"][0];
  const uint64_t big = uint64_t(1) << 41, u64max = std::numeric_limits<uint64_t>::max();
  auto edit = [&](const std::string& what, auto&& f) {
    json h = base;
    f(h);
    strict(with_header(h, data), what);
  };
  for (const json& v : {json(5), json("x"), json::array(), json(nullptr), json(true)})
    edit("entry " + v.dump(), [&](json& h) { h["a.f32"] = v; });
  for (const char* field : {"dtype", "shape", "data_offsets"})
    edit(std::string("no ") + field, [&](json& h) { h["a.f32"].erase(field); });
  // dtypes: unknown, misspelt, unsupported, wrong type, or known but of another size.
  for (const json& v : {json("F64"), json("f32"), json("BOOL"), json("I8"), json("U8"), json("I16"), json("U16"),
                        json("I64"), json("U64"), json("F8_E4M3"), json("F8_E5M2"), json(""), json("BF16 "),
                        json("Q4_K"), json("F 32"), json(5), json(nullptr), json::array({"F32"}), json("BF16"),
                        json("F16")})
    edit("dtype " + v.dump(), [&](json& h) { h["a.f32"]["dtype"] = v; });
  // shapes: negative, float, huge, wrong type, too many dims, element count off.
  for (const json& v :
       {json::array({-1, 5}), json::array({3, -5}), json::array({1.5, 5}), json::array({3, 5.0}),
        json::array({big, 5}), json::array({uint64_t(1) << 63, 5}), json::array({u64max, 1}),
        json::array({"3", 5}), json::array({nullptr, 5}), json::array({json::array({3}), 5}),
        json::array({true, 5}), json::object({{"0", 3}}), json("3,5"), json(15),
        json::array({3, 5, 1, 1, 1}), json::array({1, 1, 1, 1, 1, 1, 3, 5}), json::array({3, 4}),
        json::array({3, 5, 0}), json::array(), json::array({4294967296ll, 4294967296ll}),
        json::array({big, big, big, big}), json::array({1ll << 40, 1ll << 40, 1ll << 40, 16})})
    edit("shape " + v.dump(), [&](json& h) { h["a.f32"]["shape"] = v; });
  // data_offsets: wrong arity/type, negative, reversed, sizes off, out of range, overlapping.
  for (const json& v : {json::array({0}), json::array({0, 60, 60}), json::array(), json("0,60"), json(60),
                        json::array({-4, 56}), json::array({0, -60}), json::array({0.0, 60}), json::array({0, 60.5}),
                        json::array({60, 0}), json::array({0, 61}), json::array({0, 59}), json::array({0, big}),
                        json::array({big, big + 60}), json::array({u64max - 59, u64max}),
                        json::array({u64max, 59}), json::array({dsize - 59, dsize + 1}),
                        json::array({dsize, dsize + 60}), json::array({"0", "60"}), json::array({nullptr, 60})})
    edit("data_offsets " + v.dump(), [&](json& h) { h["a.f32"]["data_offsets"] = v; });
  // Misaligned: an F32 at offset 2, an F16 at an odd offset (both inside unused padding-free space).
  edit("f32 at offset 2", [&](json& h) { h["a.f32"]["data_offsets"] = {2, 62}; });
  edit("f16 at odd offset", [&](json& h) { h["c.f16"]["data_offsets"] = {c0 + 1, c0 + 49}; });
  edit("i32 at offset 2 mod 4", [&](json& h) {
    const uint64_t d0 = h["d.i32"]["data_offsets"][0];
    h["d.i32"]["data_offsets"] = {d0 - 6, d0 + 18};
  });
  // Overlaps: a tensor over its neighbour, two tensors over the same bytes, one inside another.
  edit("b over a", [&](json& h) { h["b.bf16"]["data_offsets"] = {50, 64}; });
  edit("b same as start of a", [&](json& h) { h["b.bf16"]["data_offsets"] = {0, 14}; });
  edit("duplicate range", [&](json& h) { h["z.f32"] = h["a.f32"]; });
  edit("inside c", [&](json& h) { h["z.bf16"] = {{"dtype", "BF16"}, {"shape", {4}}, {"data_offsets", {c0 + 8, c0 + 16}}}; });
  EXPECT_GE(cases_, 77);
}

// Edits that may leave a valid file (another valid reading of the same bytes): accepted or
// rejected, but consistent either way.
TEST_F(FormatCorrupt, EntryFieldsLenient) {
  Bytes data;
  const json base = base_header(data);
  auto edit = [&](const std::string& what, auto&& f) {
    json h = base;
    f(h);
    lenient(with_header(h, data), what);
  };
  edit("I32 for F32", [](json& h) { h["a.f32"]["dtype"] = "I32"; });
  edit("reshape [5,3]", [](json& h) { h["a.f32"]["shape"] = {5, 3}; });
  edit("reshape [15,1,1,1]", [](json& h) { h["a.f32"]["shape"] = {15, 1, 1, 1}; });
  for (const json& v : {json(1), json("x"), json::array(), json::object({{"k", {1, 2}}}), json(nullptr)})
    edit("metadata " + v.dump(), [&](json& h) { h["__metadata__"] = v; });
  edit("extra field", [](json& h) { h["a.f32"]["extra"] = {1, 2, 3}; });
  edit("zero-size tensor at end", [&](json& h) {
    h["z"] = {{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {data.size(), data.size()}}};
  });
  edit("empty name", [](json& h) { h[""] = h["d.i32"]; h.erase("d.i32"); });
  edit("unused gap", [](json& h) { h.erase("b.bf16"); });
  // Duplicate keys in the text (JSON parsers keep one).
  const std::string t = base.dump();
  const std::string dup = "{\"a.f32\":" + base["a.f32"].dump() + "," + t.substr(1);
  lenient(test::st_raw(dup, data), "duplicate key");
  EXPECT_GE(cases_, 13);
}

// Random byte flips in the length field and header, deterministic (fixed seed).
TEST_F(FormatCorrupt, RandomHeaderByteFlips) {
  const Bytes full = test::st_build(base_tensors());
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | full[size_t(i)];
  uint64_t s = 12345;
  auto rnd = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return s >> 33;
  };
  for (int c = 0; c < 600; ++c) {
    Bytes b = full;
    const int flips = 1 + int(rnd() % 3);
    for (int i = 0; i < flips; ++i) b[size_t(rnd() % (8 + hlen))] ^= uint8_t(1 + rnd() % 255);
    lenient(b, "byte flips, case " + std::to_string(c));
  }
  // Substitutions with JSON-significant characters reach deeper into the parser than noise.
  const std::string alphabet = "{}[]:,\"0123456789-.eE \\tfn";
  for (int c = 0; c < 400; ++c) {
    Bytes b = full;
    b[size_t(8 + rnd() % hlen)] = uint8_t(alphabet[rnd() % alphabet.size()]);
    lenient(b, "json substitution, case " + std::to_string(c));
  }
  EXPECT_EQ(cases_, 1000);
}

}  // namespace
}  // namespace qwen36
