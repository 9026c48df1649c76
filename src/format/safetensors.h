#pragma once
// defines: SafetensorsFile (one memory-mapped .safetensors file), SafetensorsSet (a checkpoint
// directory: one file or shards listed by model.safetensors.index.json)
//
// Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape,
// data_offsets: [begin, end]}, "__metadata__": {...}}, then the data. Everything in the
// header is validated against the file before any tensor is exposed.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "core/tensor.h"

namespace qwen36 {

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // throws Error naming path and problem

  const std::map<std::string, Tensor>& tensors() const { return tensors_; }
  const std::string& path() const { return file_.path(); }

 private:
  MappedFile file_;
  std::map<std::string, Tensor> tensors_;
};

class SafetensorsSet {
 public:
  // dir holds model.safetensors, or model.safetensors.index.json and its shards.
  explicit SafetensorsSet(const std::string& dir);

  // nullptr when absent.
  const Tensor* find(const std::string& name) const;
  std::vector<std::string> names() const;
  size_t total_bytes() const { return total_bytes_; }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const Tensor*> index_;
  size_t total_bytes_ = 0;
};

}  // namespace qwen36
