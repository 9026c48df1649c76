#pragma once
// defines: GgufWriter (streams a GGUF v3 file: KVs, tensor infos, then tensor data in order)
//
// Use: add KVs and declare every tensor (name, dtype, torch-order shape), then write the
// tensors' bytes in declaration order, in as many chunks as convenient, then finish(). The
// header is written when the first data arrives, so the model never has to be in RAM at once.
// Layout matches llama.cpp's writer: alignment 32 (`general.alignment` is only written when
// it differs), each tensor's data padded with zeros to the alignment, offsets relative to the
// data section.

#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "format/gguf.h"

namespace qwen36 {

class GgufWriter {
 public:
  explicit GgufWriter(std::string path, uint32_t alignment = kGgufDefaultAlignment);
  ~GgufWriter();  // an unfinished file is closed and removed
  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;

  // KVs, in the order they will appear in the file. Keys must be unique.
  void add_u8(std::string_view key, uint8_t v);
  void add_i8(std::string_view key, int8_t v);
  void add_u16(std::string_view key, uint16_t v);
  void add_i16(std::string_view key, int16_t v);
  void add_u32(std::string_view key, uint32_t v);
  void add_i32(std::string_view key, int32_t v);
  void add_u64(std::string_view key, uint64_t v);
  void add_i64(std::string_view key, int64_t v);
  void add_f32(std::string_view key, float v);
  void add_f64(std::string_view key, double v);
  void add_bool(std::string_view key, bool v);
  void add_str(std::string_view key, std::string_view v);
  void add_arr_str(std::string_view key, std::span<const std::string> v);
  void add_arr_str(std::string_view key, std::span<const std::string_view> v);
  // A numeric array of element type `elem` (not STRING/ARRAY): `count` elements at `data`.
  void add_arr(std::string_view key, GgufType elem, const void* data, uint64_t count);
  void add_arr_u8(std::string_view key, std::span<const uint8_t> v) { add_arr(key, GgufType::U8, v.data(), v.size()); }
  void add_arr_i32(std::string_view key, std::span<const int32_t> v) { add_arr(key, GgufType::I32, v.data(), v.size()); }
  void add_arr_u32(std::string_view key, std::span<const uint32_t> v) { add_arr(key, GgufType::U32, v.data(), v.size()); }
  void add_arr_i64(std::string_view key, std::span<const int64_t> v) { add_arr(key, GgufType::I64, v.data(), v.size()); }
  void add_arr_f32(std::string_view key, std::span<const float> v) { add_arr(key, GgufType::F32, v.data(), v.size()); }
  void add_arr_f64(std::string_view key, std::span<const double> v) { add_arr(key, GgufType::F64, v.data(), v.size()); }

  // Declares a tensor; `shape` is in torch order (outermost first). Returns its byte size.
  uint64_t add_tensor(std::string_view name, DType dtype, std::span<const int64_t> shape);
  uint64_t add_tensor(std::string_view name, DType dtype, std::initializer_list<int64_t> shape) {
    return add_tensor(name, dtype, std::span<const int64_t>(shape.begin(), shape.size()));
  }

  // Appends bytes of the tensors, in declaration order; a chunk may span tensor boundaries.
  void write_data(const void* data, size_t n);
  // Writes the whole of the next tensor (must be exactly its byte size).
  void write_tensor(std::string_view name, const void* data, size_t n);
  // Writes the header (if no data came yet), checks every tensor was written, closes the file.
  void finish();

  uint64_t total_size() const;  // final file size, known once all tensors are declared

 private:
  struct PendingTensor {
    std::string name;
    uint32_t ggml_type;
    std::vector<int64_t> ne;  // GGUF order
    uint64_t offset;
    uint64_t nbytes;
  };
  void add_kv(std::string_view key, GgufType type, const void* value, size_t n);
  void begin_kv(std::string_view key, GgufType type);
  void write_header();
  void put(const void* p, size_t n);
  void pad_to_alignment();
  uint64_t header_size() const;

  std::string path_;
  std::FILE* file_ = nullptr;
  uint32_t alignment_;
  std::vector<std::byte> kv_bytes_;  // encoded KVs (metadata is small)
  uint64_t n_kv_ = 0;
  std::vector<std::string> keys_;
  std::vector<PendingTensor> tensors_;
  uint64_t data_size_ = 0;           // padded data section size
  bool header_written_ = false;
  bool finished_ = false;
  size_t cur_tensor_ = 0;            // tensor receiving data
  uint64_t cur_written_ = 0;         // bytes of it written so far
  uint64_t file_pos_ = 0;
};

}  // namespace qwen36
