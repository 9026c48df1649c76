// GgufWriter -> GgufFile round trips: every KV type, several tensor types, alignment, errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <numeric>

#include "core/error.h"
#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "gguf_test_util.h"

namespace qwen36 {
namespace {

using test::read_bytes;
using test::temp_path;

struct TempFile {
  std::string path;
  explicit TempFile(const std::string& stem) : path(temp_path(stem)) {}
  ~TempFile() { std::remove(path.c_str()); }
};

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(i * 131 + seed);
  return v;
}

TEST(GgufRoundTrip, EveryKvTypeAndSeveralTensorTypes) {
  TempFile tmp("roundtrip");
  const std::vector<std::string> strs = {"hello", "", "Ġt", std::string(300, 'x')};
  const std::vector<int32_t> i32s = {11, -11, 10, 0};
  const std::vector<float> f32s = {1.0f, -2.5f, 1e-6f};
  const std::vector<uint8_t> u8s = {0, 255};
  const std::vector<double> f64s = {3.25};
  const std::vector<int64_t> i64s = {-(1ll << 50), 7};
  const std::vector<uint32_t> u32s = {};
  // torch-order shapes and their byte sizes
  struct T {
    std::string name;
    DType dt;
    std::vector<int64_t> shape;
  };
  const std::vector<T> ts = {{"a.f32", DType::F32, {3, 5}},         {"b.f16", DType::F16, {7}},
                             {"c.bf16", DType::BF16, {2, 3, 4}},    {"d.q8_0", DType::Q8_0, {4, 64}},
                             {"e.q4_k", DType::Q4_K, {2, 256}},     {"f.q6_k", DType::Q6_K, {1, 1, 2, 256}},
                             {"g.q5_k", DType::Q5_K, {256}},        {"h.iq4_xs", DType::IQ4_XS, {3, 256}},
                             {"i.q4_0", DType::Q4_0, {32}},         {"j.q5_1", DType::Q5_1, {2, 32}}};
  std::vector<std::vector<uint8_t>> data;
  uint64_t expect_size = 0;
  {
    GgufWriter w(tmp.path);
    w.add_str("general.architecture", "qwen35");
    w.add_u8("k.u8", 250);
    w.add_i8("k.i8", -128);
    w.add_u16("k.u16", 65535);
    w.add_i16("k.i16", -32768);
    w.add_u32("k.u32", 4294967295u);
    w.add_i32("k.i32", -2147483647 - 1);
    w.add_u64("k.u64", ~0ull);
    w.add_i64("k.i64", -(1ll << 62));
    w.add_f32("k.f32", 1e-6f);
    w.add_f64("k.f64", 1e300);
    w.add_bool("k.bool_t", true);
    w.add_bool("k.bool_f", false);
    w.add_arr_str("k.arr_str", strs);
    w.add_arr_i32("k.arr_i32", i32s);
    w.add_arr_f32("k.arr_f32", f32s);
    w.add_arr_u8("k.arr_u8", u8s);
    w.add_arr_f64("k.arr_f64", f64s);
    w.add_arr_i64("k.arr_i64", i64s);
    w.add_arr_u32("k.arr_empty", u32s);
    for (size_t i = 0; i < ts.size(); ++i) {
      const uint64_t n = w.add_tensor(ts[i].name, ts[i].dt, ts[i].shape);
      data.push_back(pattern(size_t(n), uint8_t(i)));
    }
    expect_size = w.total_size();
    // Stream: the first tensor whole, the rest in odd-sized chunks that cross tensor boundaries.
    w.write_tensor(ts[0].name, data[0].data(), data[0].size());
    std::vector<uint8_t> rest;
    for (size_t i = 1; i < data.size(); ++i) rest.insert(rest.end(), data[i].begin(), data[i].end());
    for (size_t off = 0; off < rest.size(); off += 37) w.write_data(rest.data() + off, std::min<size_t>(37, rest.size() - off));
    w.finish();
  }
  const GgufFile f(tmp.path);
  EXPECT_EQ(f.file_size(), expect_size);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  EXPECT_FALSE(f.has("general.alignment"));  // default alignment is implied, as llama.cpp does
  EXPECT_EQ(f.get_str("general.architecture"), "qwen35");
  EXPECT_EQ(f.get_u8("k.u8"), 250);
  EXPECT_EQ(f.get_i8("k.i8"), -128);
  EXPECT_EQ(f.get_u16("k.u16"), 65535);
  EXPECT_EQ(f.get_i16("k.i16"), -32768);
  EXPECT_EQ(f.get_u32("k.u32"), 4294967295u);
  EXPECT_EQ(f.get_i32("k.i32"), -2147483647 - 1);
  EXPECT_EQ(f.get_u64("k.u64"), ~0ull);
  EXPECT_EQ(f.get_i64("k.i64"), -(1ll << 62));
  EXPECT_EQ(f.get_f32("k.f32"), 1e-6f);
  EXPECT_EQ(f.get_f64("k.f64"), 1e300);
  EXPECT_TRUE(f.get_bool("k.bool_t"));
  EXPECT_FALSE(f.get_bool("k.bool_f"));
  const auto& s = f.get_arr_str("k.arr_str");
  ASSERT_EQ(s.size(), strs.size());
  for (size_t i = 0; i < s.size(); ++i) EXPECT_EQ(s[i], strs[i]);
  EXPECT_EQ(f.get_arr_i32("k.arr_i32"), i32s);
  EXPECT_EQ(f.get_arr_f32("k.arr_f32"), f32s);
  EXPECT_EQ(f.get_arr_int("k.arr_u8"), (std::vector<int64_t>{0, 255}));
  EXPECT_EQ(f.get_arr_int("k.arr_i64"), i64s);
  EXPECT_EQ(f.get_arr_len("k.arr_f64"), 1u);
  EXPECT_EQ(f.get_arr_u32("k.arr_empty"), u32s);
  EXPECT_EQ(f.get_int("k.i16"), -32768);
  EXPECT_EQ(f.get_int("k.u32"), 4294967295ll);
  EXPECT_THROW(f.get_int("k.u64"), Error);  // does not fit int64
  EXPECT_DOUBLE_EQ(f.get_float("k.f32"), double(1e-6f));
  // KV order is kept.
  ASSERT_EQ(f.kvs().size(), 20u);
  EXPECT_EQ(f.kvs()[0].key, "general.architecture");
  EXPECT_EQ(f.kvs()[19].key, "k.arr_empty");

  ASSERT_EQ(f.tensors().size(), ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    const auto& ti = f.tensors()[i];
    SCOPED_TRACE(ts[i].name);
    EXPECT_EQ(ti.name, ts[i].name);
    EXPECT_EQ(ti.tensor.dtype, ts[i].dt);
    EXPECT_EQ(ti.ggml_type, dtype_to_ggml_type(ts[i].dt));
    ASSERT_EQ(ti.n_dims, int(ts[i].shape.size()));
    for (int d = 0; d < ti.n_dims; ++d) {
      EXPECT_EQ(ti.tensor.dim(d), ts[i].shape[size_t(d)]);
      EXPECT_EQ(ti.ne[size_t(d)], ts[i].shape[ts[i].shape.size() - 1 - size_t(d)]);  // ne is innermost first
    }
    EXPECT_EQ(ti.offset % 32, 0u);
    ASSERT_EQ(ti.nbytes, data[i].size());
    EXPECT_EQ(std::memcmp(ti.tensor.data, data[i].data(), data[i].size()), 0);
  }
  EXPECT_GT(test::exercise_gguf(f), 0u);
}

TEST(GgufRoundTrip, TypedGettersNameKeyAndTypes) {
  TempFile tmp("getters");
  {
    GgufWriter w(tmp.path);
    w.add_u32("n", 4);
    w.add_str("s", "x");
    w.add_arr_i32("a", std::vector<int32_t>{1});
    w.finish();
  }
  const GgufFile f(tmp.path);
  try {
    f.get_f32("n");
    FAIL() << "no throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'n'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("u32"), std::string::npos) << msg;
    EXPECT_NE(msg.find("f32"), std::string::npos) << msg;
  }
  EXPECT_THROW(f.get_u32("missing"), Error);
  EXPECT_THROW(f.get_str("n"), Error);
  EXPECT_THROW(f.get_arr_u32("a"), Error);  // array[i32], not array[u32]
  EXPECT_THROW(f.get_arr_str("s"), Error);
  EXPECT_THROW(f.get_arr_len("n"), Error);
  EXPECT_THROW(f.tensor("nope"), Error);
  EXPECT_EQ(f.tensors().size(), 0u);
}

TEST(GgufRoundTrip, WriterMatchesHandBuiltBytes) {
  // The hand-built reference file follows the GGUF spec field by field; the writer must produce
  // exactly the same bytes for the same content (explicit general.alignment included).
  test::GgufBuilder b;
  test::build_reference_gguf(b);
  TempFile tmp("exact");
  {
    GgufWriter w(tmp.path);
    w.add_str("general.architecture", "qwen35");
    w.add_u32("general.alignment", 32);
    w.add_u8("t.u8", 200);
    w.add_i8("t.i8", -100);
    w.add_u16("t.u16", 60000);
    w.add_i16("t.i16", -30000);
    w.add_u32("t.u32", 4000000000u);
    w.add_i32("t.i32", -2000000000);
    w.add_f32("t.f32", 1.5f);
    w.add_bool("t.bool", true);
    w.add_u64("t.u64", 1ull << 40);
    w.add_i64("t.i64", -(1ll << 40));
    w.add_f64("t.f64", 0.25);
    w.add_arr_i32("t.arr_i32", std::vector<int32_t>{11, 11, 10, 0});
    w.add_arr_str("t.arr_str", std::vector<std::string>{"a", "", "Ġe"});
    w.add_arr_f32("t.arr_f32", std::vector<float>{-1.0f, 2.0f});
    w.add_tensor("w.f32", DType::F32, {2, 8});
    w.add_tensor("w.q8", DType::Q8_0, {2, 32});
    w.add_tensor("w.q4k", DType::Q4_K, {256});
    const size_t data_at = b.field("data").offset;
    const uint64_t sizes[] = {64, 68, 144}, offsets[] = {0, 64, 160};
    for (int i = 0; i < 3; ++i) w.write_data(b.bytes.data() + data_at + offsets[i], sizes[i]);
    w.finish();
  }
  const auto got = read_bytes(tmp.path);
  ASSERT_EQ(got.size(), b.bytes.size());
  EXPECT_EQ(std::memcmp(got.data(), b.bytes.data(), got.size()), 0);
}

TEST(GgufRoundTrip, CustomAlignmentAndEmptyFile) {
  TempFile tmp("align");
  {
    GgufWriter w(tmp.path, 256);
    w.add_tensor("x", DType::F32, {3});
    w.add_tensor("y", DType::F32, {5});
    const float xs[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    w.write_data(xs, 8 * sizeof(float));
    w.finish();
  }
  const GgufFile f(tmp.path);
  EXPECT_EQ(f.alignment(), 256u);
  EXPECT_EQ(f.get_u32("general.alignment"), 256u);
  EXPECT_EQ(f.data_offset() % 256, 0u);
  EXPECT_EQ(f.tensor_info("y").offset, 256u);
  EXPECT_EQ(f.tensor("y").as<float>()[4], 8.0f);
  EXPECT_EQ(f.file_size(), f.data_offset() + 512);

  TempFile empty("empty");
  {
    GgufWriter w(empty.path);
    w.finish();
  }
  const GgufFile e(empty.path);
  EXPECT_EQ(e.kvs().size(), 0u);
  EXPECT_EQ(e.tensors().size(), 0u);
}

TEST(GgufRoundTrip, WriterRejectsMisuse) {
  TempFile tmp("misuse");
  GgufWriter w(tmp.path);
  w.add_u32("a", 1);
  EXPECT_THROW(w.add_u32("a", 2), Error);                                   // duplicate key
  EXPECT_THROW(w.add_tensor(std::string(64, 'n'), DType::F32, {1}), Error);  // name too long for llama.cpp
  EXPECT_THROW(w.add_tensor("q", DType::Q4_K, {100}), Error);               // not a multiple of 256
  EXPECT_THROW(w.add_tensor("z", DType::F32, {0}), Error);
  EXPECT_THROW(w.add_tensor("i", DType::I32, {4}), Error);  // no GGUF type in this engine
  w.add_tensor("t", DType::F32, {2});
  EXPECT_THROW(w.add_tensor("t", DType::F32, {2}), Error);
  const float v[3] = {};
  EXPECT_THROW(w.write_tensor("t", v, 12), Error);  // wrong size
  EXPECT_THROW(w.write_data(v, 12), Error);         // more than declared
  EXPECT_THROW(w.add_u32("late", 1), Error);        // after data started
  EXPECT_THROW(GgufWriter(temp_path("bad-align"), 48), Error);
}

TEST(GgufRoundTrip, UnfinishedWriterRemovesItsFile) {
  const std::string path = temp_path("unfinished");
  {
    GgufWriter w(path);
    w.add_tensor("t", DType::F32, {2});
  }
  EXPECT_THROW(GgufFile{path}, Error);  // gone: a half-written file is never left behind
}

TEST(GgufTypes, GgmlIdsMapBothWays) {
  const std::pair<uint32_t, DType> pairs[] = {
      {0, DType::F32},   {1, DType::F16},   {30, DType::BF16}, {2, DType::Q4_0},  {3, DType::Q4_1},
      {6, DType::Q5_0},  {7, DType::Q5_1},  {8, DType::Q8_0},  {12, DType::Q4_K}, {13, DType::Q5_K},
      {14, DType::Q6_K}, {15, DType::Q8_K}, {23, DType::IQ4_XS}};
  for (auto [id, dt] : pairs) {
    EXPECT_EQ(ggml_type_to_dtype(id), dt);
    EXPECT_EQ(dtype_to_ggml_type(dt), id);
  }
  try {
    ggml_type_to_dtype(16);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("iq2_xxs"), std::string::npos);
  }
  EXPECT_THROW(ggml_type_to_dtype(4), Error);  // removed q4_2
  EXPECT_THROW(ggml_type_to_dtype(1000), Error);
}

}  // namespace
}  // namespace qwen36
