// The prefix cache's checkpoints on disk (engine/snapshot_file.h).
#include "engine/snapshot_file.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace qwen36 {

namespace {

constexpr std::string_view kMagic = "QWEN36-CHECKPOINTS-1\n";
constexpr uint64_t kMaxHeader = uint64_t(64) << 20;

void write_all(std::ofstream& out, const void* p, size_t n, const std::string& path) {
  out.write(static_cast<const char*>(p), std::streamsize(n));
  QWEN36_CHECK(out.good(), "{}: write failed (disk full?)", path);
}

void read_all(std::ifstream& in, void* p, size_t n, const std::string& path) {
  in.read(static_cast<char*>(p), std::streamsize(n));
  QWEN36_CHECK(in.gcount() == std::streamsize(n), "{}: the file ends early (truncated)", path);
}

}  // namespace

size_t write_snapshot_file(const std::string& path, const std::string& fingerprint, Backend& backend,
                           const SnapshotCache& cache) {
  const auto entries = cache.by_use();
  nlohmann::json header = {{"fingerprint", fingerprint}, {"entries", nlohmann::json::array()}};
  for (const auto& [prefix, snap] : entries)
    header["entries"].push_back({{"tokens", prefix.size()}, {"positions", snap->positions}, {"bytes", snap->bytes}});
  const std::string text = header.dump();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    QWEN36_CHECK(out.good(), "cannot write {}", tmp);
    write_all(out, kMagic.data(), kMagic.size(), tmp);
    const uint64_t n = text.size();
    write_all(out, &n, sizeof n, tmp);
    write_all(out, text.data(), text.size(), tmp);
    std::vector<std::byte> bytes;
    for (const auto& [prefix, snap] : entries) {
      write_all(out, prefix.data(), prefix.size_bytes(), tmp);
      bytes.resize(snap->bytes);
      snapshot_to_host(backend, *snap, bytes.data());
      write_all(out, bytes.data(), bytes.size(), tmp);
    }
    out.close();
    QWEN36_CHECK(!out.fail(), "{}: closing failed", tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  QWEN36_CHECK(!ec, "cannot move {} to {}: {}", tmp, path, ec.message());
  return entries.size();
}

SnapshotFile read_snapshot_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  QWEN36_CHECK(in.good(), "cannot open {}", path);
  std::string magic(kMagic.size(), '\0');
  in.read(magic.data(), std::streamsize(magic.size()));
  QWEN36_CHECK(in.gcount() == std::streamsize(kMagic.size()) && magic == kMagic,
               "{} is not a qwen36 checkpoint file", path);
  uint64_t n = 0;
  read_all(in, &n, sizeof n, path);
  QWEN36_CHECK(n > 0 && n <= kMaxHeader, "{}: a header of {} bytes is not plausible", path, n);
  std::string text(n, '\0');
  read_all(in, text.data(), n, path);
  const nlohmann::json header = nlohmann::json::parse(text, nullptr, false);
  QWEN36_CHECK(header.is_object() && header.contains("fingerprint") && header["fingerprint"].is_string() &&
                   header.contains("entries") && header["entries"].is_array(),
               "{}: the header is not valid", path);
  SnapshotFile f;
  f.fingerprint = header["fingerprint"];
  const uintmax_t file_size = std::filesystem::file_size(path);
  for (const nlohmann::json& e : header["entries"]) {
    QWEN36_CHECK(e.is_object() && e.value("tokens", int64_t(-1)) > 0 && e.value("positions", int64_t(-1)) > 0 &&
                     e.value("bytes", int64_t(-1)) > 0,
                 "{}: an entry of the header is not valid", path);
    const uint64_t tokens = e["tokens"], bytes = e["bytes"];
    QWEN36_CHECK(tokens * 4 + bytes <= file_size, "{}: an entry larger than the file", path);
    SnapshotFile::Entry entry;
    entry.positions = e["positions"];
    entry.prefix.resize(tokens);
    read_all(in, entry.prefix.data(), tokens * 4, path);
    entry.bytes = HostBuffer(bytes);
    read_all(in, entry.bytes.data(), bytes, path);
    f.entries.push_back(std::move(entry));
  }
  char extra = 0;
  QWEN36_CHECK(!in.read(&extra, 1), "{}: bytes after the last entry", path);
  return f;
}

}  // namespace qwen36
