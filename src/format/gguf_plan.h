#pragma once
// defines: GgufMetadata (an ordered, editable list of GGUF KVs), TensorSource, ModelPlan,
//          write_model_plan
//
// The common back end of `qwen36 convert`, `quantize` and `gen-model`: a ModelPlan says what
// the output file holds (KVs, and per tensor its name, shape and how to produce its rows);
// write_model_plan streams it to disk one tensor at a time in the types the caller chose, so
// no tool ever holds more than a few MB of tensor data (the sources are mapped files or
// generators).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "format/gguf.h"

namespace qwen36 {

class GgufWriter;

class GgufMetadata {
 public:
  struct Entry {
    std::string key;
    GgufType type = GgufType::U32;  // ARRAY for arrays
    GgufType elem = GgufType::U8;   // element type of an array
    uint64_t count = 1;
    std::vector<std::byte> bytes;   // numeric scalar / array payload, little-endian
    std::vector<std::string> strs;  // STRING scalar (one) or array of strings
  };

  // Setters replace an existing key in place (keeping its position) or append.
  void set_u32(std::string_view key, uint32_t v) { set_num(key, GgufType::U32, &v, sizeof v); }
  void set_i32(std::string_view key, int32_t v) { set_num(key, GgufType::I32, &v, sizeof v); }
  void set_f32(std::string_view key, float v) { set_num(key, GgufType::F32, &v, sizeof v); }
  void set_bool(std::string_view key, bool v) {
    const uint8_t b = v ? 1 : 0;
    set_num(key, GgufType::BOOL, &b, 1);
  }
  void set_str(std::string_view key, std::string_view v);
  void set_arr_str(std::string_view key, std::vector<std::string> v);
  void set_arr(std::string_view key, GgufType elem, const void* data, uint64_t count);
  void erase(std::string_view key);

  const Entry* find(std::string_view key) const;
  const std::vector<Entry>& entries() const { return entries_; }

  // Every KV of a file, in its order.
  static GgufMetadata from_file(const GgufFile& f);
  void write_to(GgufWriter& w) const;

 private:
  Entry& slot(std::string_view key);
  void set_num(std::string_view key, GgufType t, const void* v, size_t n);
  std::vector<Entry> entries_;
};

// One output tensor. Exactly one way of producing its data must work for every target type
// the caller asks for: make_rows (any type), or row_f32 (quantized on the way), with `raw`
// as a byte-exact shortcut when the target type is the natural one.
struct TensorSource {
  std::string name;            // GGUF name
  std::vector<int64_t> shape;  // torch order (outermost first)
  DType dtype = DType::F32;    // natural type: what the tensor is when nothing converts it
  // Row r (rows over the flattened outer dimensions) as f32 into dst[shape.back()].
  std::function<void(int64_t r, float* dst)> row_f32;
  // The tensor's bytes in `dtype` (e.g. a mapped source file), or null.
  const void* raw = nullptr;
  // Rows [r0, r0 + n) directly in `target` (generators); preferred when set.
  std::function<void(DType target, int64_t r0, int64_t n, std::byte* dst)> make_rows;

  int64_t cols() const { return shape.empty() ? 1 : shape.back(); }
  int64_t rows() const;
};

struct ModelPlan {
  GgufMetadata meta;
  std::vector<TensorSource> tensors;
  std::vector<std::shared_ptr<const void>> keep_alive;  // whatever the sources point into
};

// Writes `plan` to `path`, tensor i in types[i] (in plan order). With progress, one line per
// tensor and a summary go to stderr. Returns the file size in bytes.
uint64_t write_model_plan(const ModelPlan& plan, const std::vector<DType>& types, const std::string& path,
                          bool progress = true);

}  // namespace qwen36
