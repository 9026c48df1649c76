#pragma once
// defines: exercise_gguf (touches everything a loaded GgufFile exposes), GgufBuilder (hand-made
//          GGUF bytes with the offset of every field recorded, for targeted corruption),
//          read_bytes, temp_path
//
// exercise_gguf is shared with the fuzz target, so it is header-only and needs no gtest.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "format/gguf.h"

namespace qwen36::test {

// Reads every value and every tensor byte of a file that loaded, and aborts if what the reader
// promised is inconsistent (a pointer outside the bytes, a size that does not add up). Under
// ASan any out-of-bounds view is reported here too. Returns a checksum so nothing is optimised
// away.
inline uint64_t exercise_gguf(const GgufFile& f) {
  uint64_t sum = 0;
  const std::byte* begin = f.file_data();
  const std::byte* end = begin + f.file_size();
  auto inside = [&](const void* p, uint64_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    return b >= begin && b <= end && n <= uint64_t(end - b);
  };
  for (const auto& kv : f.kvs()) {
    sum += kv.key.size();
    const auto& v = kv.value;
    if (v.type == GgufType::STRING) {
      if (!v.str.empty() && !inside(v.str.data(), v.str.size())) std::abort();
      for (char c : v.str) sum += uint8_t(c);
    } else if (v.type == GgufType::ARRAY && v.array_type == GgufType::STRING) {
      if (v.strs.size() != v.count) std::abort();
      for (auto s : v.strs) {
        if (!s.empty() && !inside(s.data(), s.size())) std::abort();
        for (char c : s) sum += uint8_t(c);
      }
    } else {
      const uint64_t n = v.count * gguf_scalar_size(v.is_array() ? v.array_type : v.type);
      if (n && !inside(v.raw, n)) std::abort();
      for (uint64_t i = 0; i < n; ++i) sum += uint8_t(v.raw[i]);
    }
    sum += GgufFile::value_to_string(v, 4).size();
  }
  for (const auto& t : f.tensors()) {
    if (t.tensor.nbytes() != t.nbytes) std::abort();
    if (t.tensor.ndim != t.n_dims) std::abort();
    for (int d = 0; d < t.n_dims; ++d)
      if (t.tensor.shape[size_t(d)] != t.ne[size_t(t.n_dims - 1 - d)]) std::abort();
    if (!inside(t.tensor.data, t.nbytes)) std::abort();
    const auto* p = static_cast<const std::byte*>(t.tensor.data);
    // First and last byte of every tensor, and a stride through it (keeps big files fast).
    for (uint64_t i = 0; i < t.nbytes; i += 4093) sum += uint8_t(p[i]);
    sum += uint8_t(p[t.nbytes - 1]);
  }
  return sum;
}

// Builds GGUF bytes field by field and remembers where each field lies.
class GgufBuilder {
 public:
  struct Field {
    std::string name;  // e.g. "kv3.key.len", "tensor1.ne0", "tensor2.offset"
    size_t offset;
    size_t size;
  };

  template <typename T> void put(const std::string& field, T v) {
    fields.push_back({field, bytes.size(), sizeof(T)});
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
  }
  void put_str(const std::string& field, const std::string& s) {
    put<uint64_t>(field + ".len", s.size());
    fields.push_back({field + ".bytes", bytes.size(), s.size()});
    for (char c : s) bytes.push_back(std::byte(c));
  }
  void pad(size_t alignment) {
    while (bytes.size() % alignment) bytes.push_back(std::byte{0});
  }
  const Field& field(const std::string& name) const;

  std::vector<std::byte> bytes;
  std::vector<Field> fields;
};

// The reference file of the corruption suite and the writer's byte-exactness test: every KV
// type, three tensors (f32, q8_0, q4_K), alignment 32. `b` receives the field map.
void build_reference_gguf(GgufBuilder& b);

std::vector<std::byte> read_bytes(const std::string& path);
std::string temp_path(const std::string& stem);  // unique per process, in the build's tmp dir

}  // namespace qwen36::test
