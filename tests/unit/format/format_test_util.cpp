#include "format_test_util.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>

namespace qwen36::test {

size_t st_dtype_size(const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  return 0;
}

nlohmann::json st_header(const std::vector<StTensor>& tensors, Bytes& data) {
  nlohmann::json h = nlohmann::json::object();
  data.clear();
  for (const StTensor& t : tensors) {
    while (data.size() % 8) data.push_back(0);
    const size_t begin = data.size();
    data.resize(begin + t.data.size());
    if (!t.data.empty()) std::memcpy(data.data() + begin, t.data.data(), t.data.size());
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
  }
  return h;
}

Bytes st_raw(const std::string& header, const Bytes& data) {
  // One allocation and memcpy (vector::insert here trips GCC 12's -Warray-bounds falsely).
  Bytes out(8 + header.size() + data.size());
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[size_t(i)] = uint8_t(n >> (8 * i));  // little-endian by construction
  if (!header.empty()) std::memcpy(out.data() + 8, header.data(), header.size());
  if (!data.empty()) std::memcpy(out.data() + 8 + header.size(), data.data(), data.size());
  return out;
}

Bytes st_build(const std::vector<StTensor>& tensors, const nlohmann::json& metadata) {
  Bytes data;
  nlohmann::json h = st_header(tensors, data);
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::string text = h.dump();
  while ((8 + text.size()) % 8) text += ' ';  // data starts 8-aligned, as real writers do
  return st_raw(text, data);
}

std::vector<StTensor> st_read(const std::string& path) {
  const Bytes b = read_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b.at(size_t(i));
  const nlohmann::json h = nlohmann::json::parse(b.begin() + 8, b.begin() + 8 + std::ptrdiff_t(n));
  std::vector<std::pair<uint64_t, StTensor>> v;
  for (const auto& [name, e] : h.items()) {
    if (name == "__metadata__") continue;
    const uint64_t begin = e["data_offsets"][0], end = e["data_offsets"][1];
    StTensor t{name, e["dtype"], e["shape"].get<std::vector<int64_t>>(),
               Bytes(b.begin() + std::ptrdiff_t(8 + n + begin), b.begin() + std::ptrdiff_t(8 + n + end))};
    v.emplace_back(begin, std::move(t));
  }
  std::sort(v.begin(), v.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<StTensor> out;
  for (auto& [off, t] : v) out.push_back(std::move(t));
  return out;
}

Bytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const Bytes& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

void write_text(const std::string& path, const std::string& s) { write_bytes(path, Bytes(s.begin(), s.end())); }

TempDir::TempDir() {
  // Prefer memory-backed /dev/shm: the corrupt suite writes thousands of small files, which
  // costs ~3 ms each on a disk-backed /tmp and ~0.05 ms in memory. $TMPDIR still wins.
  std::filesystem::path base = std::filesystem::temp_directory_path();
  if (!std::getenv("TMPDIR") && access("/dev/shm", W_OK | X_OK) == 0) base = "/dev/shm";
  std::string tmpl = (base / "qwen36-format-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void copy_dir(const std::filesystem::path& src, const std::filesystem::path& dst) {
  std::filesystem::create_directories(dst);
  for (const auto& e : std::filesystem::directory_iterator(src))
    if (e.is_regular_file())
      std::filesystem::copy_file(e.path(), dst / e.path().filename(),
                                 std::filesystem::copy_options::overwrite_existing);
}

uint64_t exercise_safetensors(const SafetensorsFile& f, size_t file_size) {
  std::vector<std::pair<const uint8_t*, size_t>> spans;
  uint64_t sum = 0;
  for (const auto& [name, t] : f.tensors()) {
    EXPECT_TRUE(t.dtype == DType::F32 || t.dtype == DType::F16 || t.dtype == DType::BF16 || t.dtype == DType::I32)
        << name;
    EXPECT_LE(t.ndim, kMaxDims) << name;
    size_t numel = 1;
    for (int i = 0; i < t.ndim; ++i) {
      EXPECT_GE(t.shape[size_t(i)], 0) << name;
      numel *= size_t(t.shape[size_t(i)]);
    }
    const size_t bytes = numel * dtype_block_bytes(t.dtype);
    EXPECT_EQ(bytes, t.nbytes()) << name;
    EXPECT_LE(bytes, file_size) << name;
    if (bytes > file_size) return sum;  // reading it would fault; the failure is recorded
    spans.emplace_back(static_cast<const uint8_t*>(t.data), bytes);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    EXPECT_LE(spans[i - 1].first + spans[i - 1].second, spans[i].first) << "tensor data overlaps";
  if (!spans.empty()) {
    const uint8_t* lo = spans.front().first;
    const uint8_t* hi = lo;
    for (const auto& [p, n] : spans) hi = std::max(hi, p + n);
    EXPECT_LE(size_t(hi - lo), file_size) << "tensors span more bytes than the file holds";
    if (size_t(hi - lo) > file_size) return sum;
  }
  for (const auto& [p, n] : spans)
    for (size_t i = 0; i < n; ++i) sum += p[i];
  return sum;
}

std::string golden_dir(const std::string& name) { return std::string(QWEN36_TEST_DATA) + "/golden/" + name; }

}  // namespace qwen36::test
