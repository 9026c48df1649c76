#pragma once
// defines: GgufType, GgufValue, GgufTensorInfo, GgufFile (hardened GGUF v2/v3 reader),
//          ggml_type_to_dtype, dtype_to_ggml_type, GGUF limits
//
// A GGUF file is: header (magic "GGUF", version, tensor count, KV count), the KVs, the tensor
// infos, padding to `general.alignment`, then the tensor data. Every number in the header is
// untrusted: the reader checks each count, length, offset and size against the bytes that are
// actually left (llama.cpp learned this through CVE-2024-21802, CVE-2025-53630, CVE-2026-27940),
// so a corrupt file gives one clear Error and never an out-of-bounds read or a huge allocation.
//
// Values are views into the file bytes (no copies); they stay valid as long as the GgufFile.
// Tensor shapes: GGUF stores `ne` innermost first; GgufTensorInfo::tensor uses torch order
// (outermost first, like the rest of the engine) and `ne` keeps the file's order.

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace qwen36 {

class MappedFile;

// Value types of GGUF KVs (the numbers are the on-disk ids).
enum class GgufType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};
inline constexpr uint32_t kGgufTypeCount = 13;
std::string_view gguf_type_name(GgufType t);
// Bytes of one scalar of type t on disk (0 for STRING and ARRAY, whose size varies).
size_t gguf_scalar_size(GgufType t);

// Limits the reader enforces (generous for real models, small enough to stop abuse).
inline constexpr uint32_t kGgufMagic = 0x46554747;         // "GGUF" read as little-endian u32
inline constexpr uint32_t kGgufDefaultAlignment = 32;
inline constexpr uint32_t kGgufMaxAlignment = 1u << 16;     // must also be a power of two
inline constexpr uint64_t kGgufMaxTensors = 1u << 20;
inline constexpr uint64_t kGgufMaxKVs = 1u << 20;
inline constexpr uint64_t kGgufMaxKeyLength = 1u << 16;
inline constexpr uint64_t kGgufMaxStringLength = 1u << 30;
inline constexpr uint64_t kGgufMaxArrayLength = 1u << 28;
inline constexpr uint64_t kGgufMaxTensorNameLength = 1024;  // llama.cpp itself allows only 63
inline constexpr uint32_t kGgufMaxDims = 4;

// GGML tensor type ids <-> DType. Unknown or unsupported ids throw an Error naming the id.
DType ggml_type_to_dtype(uint32_t ggml_type);
uint32_t dtype_to_ggml_type(DType t);
// Name of a ggml type id ("q4_K", "iq2_xxs", ...) for error messages; "type<id>" if unknown.
std::string ggml_type_name(uint32_t ggml_type);

// One KV value: a view into the file's bytes.
struct GgufValue {
  GgufType type = GgufType::U8;
  GgufType array_type = GgufType::U8;  // element type when type == ARRAY
  uint64_t count = 1;                  // array length (1 for scalars)
  const std::byte* raw = nullptr;      // scalar bytes, or the first element of a numeric array
  std::string_view str;                // type == STRING
  std::vector<std::string_view> strs;  // array of STRING

  bool is_array() const { return type == GgufType::ARRAY; }
  std::string type_str() const;  // "u32", "array[string]" ...
};

struct GgufKV {
  std::string_view key;
  GgufValue value;
};

struct GgufTensorInfo {
  std::string_view name;
  uint32_t ggml_type = 0;
  int n_dims = 0;
  std::array<int64_t, kMaxDims> ne{};  // GGUF order: ne[0] is the innermost (contiguous) extent
  uint64_t offset = 0;                 // from the start of the data section
  uint64_t nbytes = 0;
  Tensor tensor;                       // view into the file, shape in torch order (outermost first)
};

class GgufFile {
 public:
  explicit GgufFile(const std::string& path);  // maps and parses; throws Error naming the path
  // Parses bytes owned by the caller (tests, fuzzing); they must outlive this object.
  GgufFile(const std::byte* data, size_t size, std::string name = "<memory>");
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& name() const { return name_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // absolute file offset of the data section
  size_t file_size() const { return size_; }
  const std::byte* file_data() const { return data_; }

  // KVs in file order.
  const std::vector<GgufKV>& kvs() const { return kvs_; }
  bool has(std::string_view key) const { return find(key) != nullptr; }
  const GgufValue* find(std::string_view key) const;
  // The value of `key`; throws when it is missing.
  const GgufValue& get(std::string_view key) const;

  // Typed getters: throw an Error naming the key and both types when the stored type differs.
  uint8_t get_u8(std::string_view key) const;
  int8_t get_i8(std::string_view key) const;
  uint16_t get_u16(std::string_view key) const;
  int16_t get_i16(std::string_view key) const;
  uint32_t get_u32(std::string_view key) const;
  int32_t get_i32(std::string_view key) const;
  uint64_t get_u64(std::string_view key) const;
  int64_t get_i64(std::string_view key) const;
  float get_f32(std::string_view key) const;
  double get_f64(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  std::string_view get_str(std::string_view key) const;
  // Any integer scalar type, as int64 (u64 values above INT64_MAX throw). Converters disagree
  // on u32 vs i32 for some keys; the model loader uses this where either is fine.
  int64_t get_int(std::string_view key) const;
  // f32 or f64.
  double get_float(std::string_view key) const;

  // Arrays: the element type must match exactly (get_arr_int accepts any integer elements).
  const std::vector<std::string_view>& get_arr_str(std::string_view key) const;
  std::vector<int32_t> get_arr_i32(std::string_view key) const;
  std::vector<uint32_t> get_arr_u32(std::string_view key) const;
  std::vector<float> get_arr_f32(std::string_view key) const;
  std::vector<int64_t> get_arr_int(std::string_view key) const;
  uint64_t get_arr_len(std::string_view key) const;  // any array

  // Tensors in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  const GgufTensorInfo& tensor_info(std::string_view name) const;  // throws when missing
  const Tensor& tensor(std::string_view name) const { return tensor_info(name).tensor; }

  // One-line rendering of a value for `qwen36 info` (arrays longer than max_items summarised).
  static std::string value_to_string(const GgufValue& v, size_t max_items = 16);

 private:
  void parse();

  std::unique_ptr<MappedFile> map_;
  std::string name_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
  uint32_t version_ = 0;
  uint32_t alignment_ = kGgufDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<GgufKV> kvs_;
  std::unordered_map<std::string_view, size_t> kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string_view, size_t> tensor_index_;
};

}  // namespace qwen36
