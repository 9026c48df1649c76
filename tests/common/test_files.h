#pragma once
// defines: read_raw (a whole binary file as a vector of T), for tests reading fixtures such as
// tokens.i32 and logits.f32 (little-endian, no header).

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <vector>

namespace qwen36::test {

template <typename T>
std::vector<T> read_raw(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary | std::ios::ate);
  EXPECT_TRUE(in.good()) << "cannot open " << p;
  if (!in.good()) return {};
  std::vector<T> v(size_t(in.tellg()) / sizeof(T));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * sizeof(T)));
  return v;
}

}  // namespace qwen36::test
