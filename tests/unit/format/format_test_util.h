#pragma once
// defines: helpers for the format tests: a small safetensors writer (independent of the
//          parser under test), a minimal reader for known-good fixture files, a temp dir,
//          file I/O, and exercise_safetensors (touches every byte a loaded file exposes).

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/safetensors.h"

namespace qwen36::test {

using Bytes = std::vector<uint8_t>;

struct StTensor {
  std::string name;
  std::string dtype;  // "F32", "BF16", "F16", "I32"
  std::vector<int64_t> shape;
  Bytes data;
};

// Bytes per element of a safetensors dtype string (0 if unknown).
size_t st_dtype_size(const std::string& dtype);
// A valid file: u64 header length, JSON header padded with spaces to a multiple of 8, data
// with every tensor 8-byte aligned, in the order given. No trailing bytes.
Bytes st_build(const std::vector<StTensor>& tensors, const nlohmann::json& metadata = nlohmann::json::object());
// The JSON header st_build writes (for targeted edits), and its data section.
nlohmann::json st_header(const std::vector<StTensor>& tensors, Bytes& data);
// u64 length + header text + data, exactly as given (no padding, no checks).
Bytes st_raw(const std::string& header, const Bytes& data);
// Reads a known-good file (a fixture) in data-offset order; the test's own minimal reader.
std::vector<StTensor> st_read(const std::string& path);

Bytes read_bytes(const std::string& path);
void write_bytes(const std::string& path, const Bytes& b);
void write_text(const std::string& path, const std::string& s);

// A fresh directory under the system temp dir, removed with everything in it.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Copies the regular files of src into dst (created if needed).
void copy_dir(const std::filesystem::path& src, const std::filesystem::path& dst);

// Reads every byte of every tensor of a file that loaded and checks that what the parser
// promised is consistent: sizes match shapes, no two tensors overlap, all of them fit in
// `file_size` bytes. Any inconsistency is a test failure; under ASan an out-of-bounds view is
// reported here. Returns a checksum so the reads are not optimised away.
uint64_t exercise_safetensors(const SafetensorsFile& f, size_t file_size);

std::string golden_dir(const std::string& name);

}  // namespace qwen36::test
