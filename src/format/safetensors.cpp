#include "format/safetensors.h"

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "core/error.h"
#include "core/log.h"

namespace qwen36 {

namespace {

// Caps that no real checkpoint approaches; they bound what a corrupt header can make us do.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

DType parse_dtype(const std::string& s) {
  if (s == "F32") return DType::F32;
  if (s == "F16") return DType::F16;
  if (s == "BF16") return DType::BF16;
  if (s == "I32") return DType::I32;
  // The integer and FP8 tensors of quantized checkpoints (format/hf_quant.h).
  if (s == "F8_E4M3") return DType::F8_E4M3;
  if (s == "U8") return DType::U8;
  if (s == "I64") return DType::I64;
  fail("unsupported dtype \"{}\" (supported: F32, F16, BF16, I32, I64, U8, F8_E4M3)", s);
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  with_context(path, [&] {
    const size_t size = file_.size();
    QWEN36_CHECK(size >= 8, "file of {} bytes is too small for a safetensors header", size);
    uint64_t header_len = 0;
    std::memcpy(&header_len, file_.data(), 8);
    QWEN36_CHECK(header_len <= kMaxHeaderBytes && header_len <= size - 8,
                 "header length {} exceeds the file ({} bytes) or the {} MiB cap", header_len, size, kMaxHeaderBytes >> 20);
    const char* hdr = reinterpret_cast<const char*>(file_.data() + 8);
    nlohmann::json j = nlohmann::json::parse(hdr, hdr + header_len, nullptr, /*allow_exceptions=*/false);
    QWEN36_CHECK(j.is_object(), "header is not a JSON object");

    const size_t data_start = 8 + size_t(header_len);
    const size_t data_size = size - data_start;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (auto& item : j.items()) {
      // Plain names rather than a structured binding: the lambdas below capture them.
      const std::string& name = item.key();
      const nlohmann::json& v = item.value();
      if (name == "__metadata__") continue;
      auto ctx = [&](std::string_view f, auto&&... a) {
        fail("tensor {}: {}", name, fmt::vformat(f, fmt::make_format_args(a...)));
      };
      if (!v.is_object()) ctx("entry is not an object");
      if (!v.contains("dtype") || !v["dtype"].is_string()) ctx("missing string dtype");
      if (!v.contains("shape") || !v["shape"].is_array()) ctx("missing shape array");
      if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
        ctx("data_offsets must be [begin, end]");
      DType dt = with_context("tensor " + name, [&] { return parse_dtype(v["dtype"].get<std::string>()); });
      const auto& shp = v["shape"];
      if (shp.size() > size_t(kMaxDims)) ctx("{} dimensions (max {})", shp.size(), kMaxDims);
      int64_t dims[kMaxDims];
      uint64_t numel = 1;
      for (size_t i = 0; i < shp.size(); ++i) {
        if (!shp[i].is_number_unsigned()) ctx("shape entry {} is not a non-negative integer", i);
        const uint64_t d = shp[i].get<uint64_t>();
        if (d > (uint64_t(1) << 40) || (d && numel > std::numeric_limits<uint64_t>::max() / d))
          ctx("shape overflows");
        numel *= d;
        dims[i] = int64_t(d);
      }
      const auto& off = v["data_offsets"];
      if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) ctx("data_offsets are not integers");
      const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
      if (b > e || e > data_size) ctx("data_offsets [{}, {}] outside the data section ({} bytes)", b, e, data_size);
      if (numel > (std::numeric_limits<uint64_t>::max() / 8) || e - b != numel * dtype_block_bytes(dt))
        ctx("{} bytes of data for {} elements of {}", e - b, numel, dtype_name(dt));
      if (dt == DType::F32 || dt == DType::I32 || dt == DType::I64) {  // i64 is read with memcpy
        if ((data_start + b) % 4 != 0) ctx("data is not 4-byte aligned");
      } else if (dtype_block_bytes(dt) > 1 && (data_start + b) % 2 != 0) {
        ctx("data is not 2-byte aligned");
      }
      if (e > b) ranges.emplace_back(b, e);
      tensors_.emplace(name, Tensor(const_cast<std::byte*>(file_.data() + data_start + b), dt, dims, int(shp.size())));
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i)
      QWEN36_CHECK(ranges[i].first >= ranges[i - 1].second, "tensor data ranges overlap at byte {}", ranges[i].first);
  });
}

SafetensorsSet::SafetensorsSet(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> shard_names;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (fs::exists(index)) {
    // A directory would open and then throw std::ios_base::failure on the first read.
    QWEN36_CHECK(fs::is_regular_file(index), "{}: not a regular file", index.string());
    std::ifstream in(index);
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    QWEN36_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
                 "{}: not a JSON object with a weight_map", index.string());
    std::set<std::string> seen;
    for (auto& [name, file] : j["weight_map"].items()) {
      QWEN36_CHECK(file.is_string(), "{}: weight_map entry for {} is not a file name", index.string(), name);
      const std::string f = file.get<std::string>();
      QWEN36_CHECK(f.find('/') == std::string::npos && f != ".." && !f.empty(),
                   "{}: shard name \"{}\" must be a plain file name", index.string(), f);
      if (seen.insert(f).second) shard_names.push_back(f);
    }
  } else if (fs::exists(single)) {
    shard_names.push_back("model.safetensors");
  } else {
    fail("{}: no model.safetensors or model.safetensors.index.json", dir);
  }
  Progress progress("loading " + dir, shard_names.size());
  for (size_t i = 0; i < shard_names.size(); ++i) {
    files_.push_back(std::make_unique<SafetensorsFile>((fs::path(dir) / shard_names[i]).string()));
    for (const auto& [name, t] : files_.back()->tensors()) {
      QWEN36_CHECK(index_.emplace(name, &t).second, "tensor {} appears in more than one shard", name);
      total_bytes_ += t.nbytes();
    }
    progress.update(i + 1);
  }
  progress.finish();
}

const Tensor* SafetensorsSet::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

std::vector<std::string> SafetensorsSet::names() const {
  std::vector<std::string> v;
  for (const auto& [n, t] : index_) v.push_back(n);
  return v;
}

}  // namespace qwen36
