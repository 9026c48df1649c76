// safetensors parsing of valid files written by the test's own writer: dtypes, shapes
// (scalar, empty, 4-D), metadata, and sharded checkpoints with model.safetensors.index.json.
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "format/safetensors.h"
#include "format_test_util.h"

namespace qwen36 {
namespace {

using test::Bytes;
using test::StTensor;
using test::TempDir;

Bytes pattern(size_t n, uint8_t seed) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = uint8_t(seed + 31 * i + (i >> 8));
  return b;
}

std::vector<StTensor> sample_tensors() {
  return {
      {"a.f32", "F32", {3, 5}, pattern(3 * 5 * 4, 1)},
      {"b.bf16", "BF16", {7}, pattern(7 * 2, 2)},  // odd byte count: the next tensor is realigned
      {"c.f16", "F16", {2, 3, 4}, pattern(2 * 3 * 4 * 2, 3)},
      {"d.i32", "I32", {1, 2, 1, 3}, pattern(6 * 4, 4)},
      {"e.scalar", "F32", {}, pattern(4, 5)},
      {"f.empty", "BF16", {0, 4}, {}},
  };
}

void expect_tensor(const Tensor& t, const StTensor& want, DType dt) {
  EXPECT_EQ(t.dtype, dt) << want.name;
  ASSERT_EQ(t.ndim, int(want.shape.size())) << want.name;
  for (size_t i = 0; i < want.shape.size(); ++i) EXPECT_EQ(t.shape[i], want.shape[i]) << want.name;
  ASSERT_EQ(t.nbytes(), want.data.size()) << want.name;
  if (!want.data.empty()) {
    EXPECT_EQ(std::memcmp(t.data, want.data.data(), want.data.size()), 0) << want.name;
  }
}

TEST(FormatSafetensors, ValidFileAllDtypesAndShapes) {
  TempDir dir;
  const auto ts = sample_tensors();
  test::write_bytes(dir / "x.safetensors", test::st_build(ts, {{"format", "pt"}}));
  SafetensorsFile f(dir / "x.safetensors");
  ASSERT_EQ(f.tensors().size(), ts.size());  // __metadata__ is not a tensor
  const DType dts[] = {DType::F32, DType::BF16, DType::F16, DType::I32, DType::F32, DType::BF16};
  for (size_t i = 0; i < ts.size(); ++i) {
    auto it = f.tensors().find(ts[i].name);
    ASSERT_NE(it, f.tensors().end()) << ts[i].name;
    expect_tensor(it->second, ts[i], dts[i]);
  }
  EXPECT_EQ(f.tensors().at("e.scalar").numel(), 1);
  EXPECT_EQ(f.tensors().at("f.empty").numel(), 0);
}

TEST(FormatSafetensors, UnpaddedHeaderAndTightlyPackedData) {
  // No header padding, 2-byte tensors packed back to back: data alignment is only what each
  // dtype needs (the file is mapped at a page boundary).
  TempDir dir;
  const Bytes a = pattern(6, 9), b = pattern(4, 10);
  const std::string hdr =
      R"({"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]},"b":{"dtype":"F16","shape":[2],"data_offsets":[6,10]}} )";
  ASSERT_EQ(hdr.size() % 2, 0u) << "test bug: the data must start 2-aligned";
  Bytes data(a.size() + b.size());
  std::copy(a.begin(), a.end(), data.begin());
  std::copy(b.begin(), b.end(), data.begin() + std::ptrdiff_t(a.size()));
  test::write_bytes(dir / "x.safetensors", test::st_raw(hdr, data));
  SafetensorsFile f(dir / "x.safetensors");
  expect_tensor(f.tensors().at("a"), {"a", "BF16", {3}, a}, DType::BF16);
  expect_tensor(f.tensors().at("b"), {"b", "F16", {2}, b}, DType::F16);
}

TEST(FormatSafetensors, EmptyHeaderObjectHasNoTensors) {
  TempDir dir;
  test::write_bytes(dir / "x.safetensors", test::st_raw("{}", {}));
  SafetensorsFile f(dir / "x.safetensors");
  EXPECT_TRUE(f.tensors().empty());
}

TEST(FormatSafetensors, MissingFileOrDirectoryIsAnError) {
  TempDir dir;
  EXPECT_THROW(SafetensorsFile(dir / "absent.safetensors"), Error);
  EXPECT_THROW(SafetensorsFile(dir.path().string()), Error);  // a directory, not a file
  EXPECT_THROW(SafetensorsSet(dir.path().string()), Error);   // neither single file nor index
}

TEST(FormatSafetensors, SingleFileSet) {
  TempDir dir;
  const auto ts = sample_tensors();
  test::write_bytes(dir / "model.safetensors", test::st_build(ts));
  SafetensorsSet set(dir.path().string());
  EXPECT_EQ(set.names().size(), ts.size());
  for (const auto& t : ts) ASSERT_NE(set.find(t.name), nullptr) << t.name;
  EXPECT_EQ(set.find("nope"), nullptr);
  size_t total = 0;
  for (const auto& t : ts) total += t.data.size();
  EXPECT_EQ(set.total_bytes(), total);
}

// Three shards and an index; the index lists each shard several times.
void write_sharded(const TempDir& dir, const std::vector<StTensor>& ts) {
  nlohmann::json wm = nlohmann::json::object();
  std::vector<std::vector<StTensor>> shards(3);
  for (size_t i = 0; i < ts.size(); ++i) {
    shards[i % 3].push_back(ts[i]);
    wm[ts[i].name] = "model-0000" + std::to_string(i % 3 + 1) + "-of-00003.safetensors";
  }
  for (size_t s = 0; s < 3; ++s)
    test::write_bytes(dir / ("model-0000" + std::to_string(s + 1) + "-of-00003.safetensors"), test::st_build(shards[s]));
  test::write_text(dir / "model.safetensors.index.json",
                   nlohmann::json{{"metadata", {{"total_size", 1}}}, {"weight_map", wm}}.dump(1));
}

TEST(FormatSafetensors, ShardedSetWithIndex) {
  TempDir dir;
  const auto ts = sample_tensors();
  write_sharded(dir, ts);
  SafetensorsSet set(dir.path().string());
  ASSERT_EQ(set.names().size(), ts.size());
  const DType dts[] = {DType::F32, DType::BF16, DType::F16, DType::I32, DType::F32, DType::BF16};
  for (size_t i = 0; i < ts.size(); ++i) {
    const Tensor* t = set.find(ts[i].name);
    ASSERT_NE(t, nullptr) << ts[i].name;
    expect_tensor(*t, ts[i], dts[i]);
  }
}

TEST(FormatSafetensors, IndexTakesPrecedenceOverSingleFile) {
  TempDir dir;
  const auto ts = sample_tensors();
  write_sharded(dir, ts);
  test::write_bytes(dir / "model.safetensors", test::st_build({{"other", "F32", {1}, pattern(4, 0)}}));
  SafetensorsSet set(dir.path().string());
  EXPECT_EQ(set.find("other"), nullptr);
  EXPECT_NE(set.find(ts[0].name), nullptr);
}

TEST(FormatSafetensors, BrokenIndexesAreErrors) {
  const auto ts = sample_tensors();
  const std::string shard = "model-00001-of-00003.safetensors";
  const std::vector<std::string> bad_indexes = {
      "",
      "{",
      "[]",
      "null",
      R"({"metadata": {}})",                          // no weight_map
      R"({"weight_map": []})",                        // not an object
      R"({"weight_map": {"a.f32": 5}})",              // file name not a string
      R"({"weight_map": {"a.f32": ""}})",             // empty name
      R"({"weight_map": {"a.f32": "../model.safetensors"}})",  // path escape
      R"({"weight_map": {"a.f32": "sub/x.safetensors"}})",
      R"({"weight_map": {"a.f32": ".."}})",
      R"({"weight_map": {"a.f32": "."}})",             // the directory itself
      R"({"weight_map": {"a.f32": "absent.safetensors"}})",
      R"({"weight_map": {"a.f32": "model.safetensors.index.json"}})",  // not a safetensors file
  };
  for (const std::string& idx : bad_indexes) {
    TempDir dir;
    write_sharded(dir, ts);
    test::write_text(dir / "model.safetensors.index.json", idx);
    EXPECT_THROW(SafetensorsSet(dir.path().string()), Error) << idx;
  }
}

TEST(FormatSafetensors, TensorInTwoShardsIsAnError) {
  TempDir dir;
  test::write_bytes(dir / "s1.safetensors", test::st_build({{"w", "F32", {1}, pattern(4, 0)}}));
  test::write_bytes(dir / "s2.safetensors", test::st_build({{"w", "F32", {1}, pattern(4, 1)}}));
  test::write_text(dir / "model.safetensors.index.json",
                   R"({"weight_map": {"w": "s1.safetensors", "v": "s2.safetensors"}})");
  try {
    SafetensorsSet set(dir.path().string());
    ADD_FAILURE() << "a duplicated tensor was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("w"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace qwen36
