#include "gguf_test_util.h"

#include <fstream>
#include <iterator>
#include <stdexcept>
#include <unistd.h>

namespace qwen36::test {

const GgufBuilder::Field& GgufBuilder::field(const std::string& name) const {
  for (const auto& f : fields)
    if (f.name == name) return f;
  throw std::logic_error("no field " + name);
}

void build_reference_gguf(GgufBuilder& b) {
  b.put<uint32_t>("magic", kGgufMagic);
  b.put<uint32_t>("version", 3);
  b.put<uint64_t>("n_tensors", 3);
  b.put<uint64_t>("n_kv", 16);
  int k = 0;
  auto key = [&](const std::string& name, GgufType t) {
    const std::string f = "kv" + std::to_string(k++);
    b.put_str(f + ".key", name);
    b.put<uint32_t>(f + ".type", uint32_t(t));
    return f;
  };
  b.put_str(key("general.architecture", GgufType::STRING) + ".value", "qwen35");
  b.put<uint32_t>(key("general.alignment", GgufType::U32) + ".value", 32);
  b.put<uint8_t>(key("t.u8", GgufType::U8) + ".value", 200);
  b.put<int8_t>(key("t.i8", GgufType::I8) + ".value", -100);
  b.put<uint16_t>(key("t.u16", GgufType::U16) + ".value", 60000);
  b.put<int16_t>(key("t.i16", GgufType::I16) + ".value", -30000);
  b.put<uint32_t>(key("t.u32", GgufType::U32) + ".value", 4000000000u);
  b.put<int32_t>(key("t.i32", GgufType::I32) + ".value", -2000000000);
  b.put<float>(key("t.f32", GgufType::F32) + ".value", 1.5f);
  b.put<uint8_t>(key("t.bool", GgufType::BOOL) + ".value", 1);
  b.put<uint64_t>(key("t.u64", GgufType::U64) + ".value", 1ull << 40);
  b.put<int64_t>(key("t.i64", GgufType::I64) + ".value", -(1ll << 40));
  b.put<double>(key("t.f64", GgufType::F64) + ".value", 0.25);
  {
    const std::string f = key("t.arr_i32", GgufType::ARRAY);
    b.put<uint32_t>(f + ".etype", uint32_t(GgufType::I32));
    b.put<uint64_t>(f + ".count", 4);
    for (int32_t v : {11, 11, 10, 0}) b.put<int32_t>(f + ".elem", v);
  }
  {
    const std::string f = key("t.arr_str", GgufType::ARRAY);
    b.put<uint32_t>(f + ".etype", uint32_t(GgufType::STRING));
    b.put<uint64_t>(f + ".count", 3);
    b.put_str(f + ".s0", "a");
    b.put_str(f + ".s1", "");
    b.put_str(f + ".s2", "Ġe");
  }
  {
    const std::string f = key("t.arr_f32", GgufType::ARRAY);
    b.put<uint32_t>(f + ".etype", uint32_t(GgufType::F32));
    b.put<uint64_t>(f + ".count", 2);
    b.put<float>(f + ".elem", -1.0f);
    b.put<float>(f + ".elem", 2.0f);
  }
  // Tensors: "w.f32" [2, 8] f32 (64 B), "w.q8" [2, 32] q8_0 (68 B), "w.q4k" [256] q4_K (144 B).
  struct T {
    const char* name;
    uint32_t type;
    std::vector<int64_t> ne;
    uint64_t offset;
    uint64_t nbytes;
  };
  const T ts[] = {{"w.f32", 0, {8, 2}, 0, 64}, {"w.q8", 8, {32, 2}, 64, 68}, {"w.q4k", 12, {256}, 160, 144}};
  for (int i = 0; i < 3; ++i) {
    const std::string f = "tensor" + std::to_string(i);
    b.put_str(f + ".name", ts[i].name);
    b.put<uint32_t>(f + ".ndims", uint32_t(ts[i].ne.size()));
    for (size_t d = 0; d < ts[i].ne.size(); ++d) b.put<int64_t>(f + ".ne" + std::to_string(d), ts[i].ne[d]);
    b.put<uint32_t>(f + ".type", ts[i].type);
    b.put<uint64_t>(f + ".offset", ts[i].offset);
  }
  b.pad(32);
  b.fields.push_back({"data", b.bytes.size(), 320});
  for (int i = 0; i < 3; ++i) {
    for (uint64_t j = 0; j < ts[i].nbytes; ++j) b.bytes.push_back(std::byte(uint8_t(j * 7 + uint64_t(i))));
    b.pad(32);
  }
}

std::vector<std::byte> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  std::memcpy(out.data(), c.data(), c.size());
  return out;
}

std::string temp_path(const std::string& stem) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir && *dir ? dir : "/tmp") + "/qwen36-" + stem + "-" + std::to_string(::getpid()) + ".gguf";
}

}  // namespace qwen36::test
