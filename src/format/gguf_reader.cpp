// GGUF reader: every number read from the file is validated before it is used.
#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/mapped_file.h"
#include "format/gguf.h"

namespace qwen36 {

namespace {

// Bounds-checked little-endian cursor over the file bytes. Every read first checks that the
// bytes exist; lengths are compared with what is left, never added to the position first.
class Cursor {
 public:
  Cursor(const std::byte* data, size_t size) : data_(data), size_(size) {}
  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }

  template <typename T> T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  const std::byte* take(uint64_t n, const char* what) {
    need(n, what);
    const std::byte* p = data_ + pos_;
    pos_ += size_t(n);
    return p;
  }
  std::string_view read_string(uint64_t max_len, const char* what) {
    const uint64_t len = read<uint64_t>(what);
    QWEN36_CHECK(len <= max_len, "{} at offset {} has length {} (limit {})", what, pos_ - 8, len, max_len);
    const std::byte* p = take(len, what);
    return {reinterpret_cast<const char*>(p), size_t(len)};
  }

 private:
  void need(uint64_t n, const char* what) const {
    QWEN36_CHECK(n <= left(), "truncated file: {} at offset {} needs {} bytes, {} left", what, pos_, n, left());
  }
  const std::byte* data_;
  size_t size_;
  size_t pos_ = 0;
};

bool valid_type(uint32_t t) { return t < kGgufTypeCount; }

// Checked arithmetic: the file's numbers must not wrap.
uint64_t mul_checked(uint64_t a, uint64_t b, const char* what) {
  uint64_t r;
  QWEN36_CHECK(!__builtin_mul_overflow(a, b, &r), "{} overflows ({} * {})", what, a, b);
  return r;
}
uint64_t add_checked(uint64_t a, uint64_t b, const char* what) {
  uint64_t r;
  QWEN36_CHECK(!__builtin_add_overflow(a, b, &r), "{} overflows ({} + {})", what, a, b);
  return r;
}

GgufValue read_value(Cursor& c, GgufType type) {
  GgufValue v;
  v.type = type;
  switch (type) {
    case GgufType::STRING:
      v.str = c.read_string(kGgufMaxStringLength, "string value");
      break;
    case GgufType::ARRAY: {
      const uint32_t et = c.read<uint32_t>("array element type");
      QWEN36_CHECK(valid_type(et), "array element type {} is not a GGUF type", et);
      v.array_type = GgufType(et);
      QWEN36_CHECK(v.array_type != GgufType::ARRAY, "arrays of arrays are not supported");
      v.count = c.read<uint64_t>("array length");
      QWEN36_CHECK(v.count <= kGgufMaxArrayLength, "array of {} elements (limit {})", v.count,
                   kGgufMaxArrayLength);
      if (v.array_type == GgufType::STRING) {
        // Each string needs at least its 8-byte length: bound the count before reserving.
        QWEN36_CHECK(v.count <= c.left() / 8, "array of {} strings cannot fit in the {} bytes left", v.count,
                     c.left());
        v.strs.reserve(size_t(v.count));
        for (uint64_t i = 0; i < v.count; ++i) v.strs.push_back(c.read_string(kGgufMaxStringLength, "string"));
      } else {
        const uint64_t bytes = mul_checked(v.count, gguf_scalar_size(v.array_type), "array size");
        v.raw = c.take(bytes, "array data");
        if (v.array_type == GgufType::BOOL) {
          for (uint64_t i = 0; i < v.count; ++i)
            QWEN36_CHECK(uint8_t(v.raw[i]) <= 1, "bool array element {} has value {}", i, uint8_t(v.raw[i]));
        }
      }
      break;
    }
    default:
      v.raw = c.take(gguf_scalar_size(type), "value");
      if (type == GgufType::BOOL)
        QWEN36_CHECK(uint8_t(v.raw[0]) <= 1, "bool value is {} (must be 0 or 1)", uint8_t(v.raw[0]));
      break;
  }
  return v;
}

template <typename T> T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

int64_t int_at(GgufType t, const std::byte* p) {
  switch (t) {
    case GgufType::U8: return load<uint8_t>(p);
    case GgufType::I8: return load<int8_t>(p);
    case GgufType::U16: return load<uint16_t>(p);
    case GgufType::I16: return load<int16_t>(p);
    case GgufType::U32: return load<uint32_t>(p);
    case GgufType::I32: return load<int32_t>(p);
    case GgufType::I64: return load<int64_t>(p);
    case GgufType::U64: {
      const uint64_t u = load<uint64_t>(p);
      QWEN36_CHECK(u <= uint64_t(std::numeric_limits<int64_t>::max()), "u64 value {} does not fit int64", u);
      return int64_t(u);
    }
    default: fail("{} is not an integer type", gguf_type_name(t));
  }
}

bool is_int_type(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::U16: case GgufType::I16:
    case GgufType::U32: case GgufType::I32: case GgufType::U64: case GgufType::I64:
      return true;
    default:
      return false;
  }
}

}  // namespace

// ---- type tables ---------------------------------------------------------------------------

std::string_view gguf_type_name(GgufType t) {
  static constexpr std::string_view kNames[] = {"u8",  "i8",     "u16",   "i16", "u32", "i32", "f32",
                                                "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = uint32_t(t);
  return i < kGgufTypeCount ? kNames[i] : "invalid";
}

size_t gguf_scalar_size(GgufType t) {
  static constexpr size_t kSizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
  const auto i = uint32_t(t);
  return i < kGgufTypeCount ? kSizes[i] : 0;
}

namespace {
struct GgmlTypeEntry {
  uint32_t id;
  const char* name;
  bool supported;
  DType dtype;
};
// ggml's type ids (ggml.h enum ggml_type). Unsupported ones are listed so errors name them.
constexpr GgmlTypeEntry kGgmlTypes[] = {
    {0, "f32", true, DType::F32},        {1, "f16", true, DType::F16},
    {2, "q4_0", true, DType::Q4_0},      {3, "q4_1", true, DType::Q4_1},
    {6, "q5_0", true, DType::Q5_0},      {7, "q5_1", true, DType::Q5_1},
    {8, "q8_0", true, DType::Q8_0},      {9, "q8_1", false, DType::F32},
    {10, "q2_K", false, DType::F32},     {11, "q3_K", false, DType::F32},
    {12, "q4_K", true, DType::Q4_K},     {13, "q5_K", true, DType::Q5_K},
    {14, "q6_K", true, DType::Q6_K},     {15, "q8_K", true, DType::Q8_K},
    {16, "iq2_xxs", false, DType::F32},  {17, "iq2_xs", false, DType::F32},
    {18, "iq3_xxs", false, DType::F32},  {19, "iq1_s", false, DType::F32},
    {20, "iq4_nl", false, DType::F32},   {21, "iq3_s", false, DType::F32},
    {22, "iq2_s", false, DType::F32},    {23, "iq4_xs", true, DType::IQ4_XS},
    {24, "i8", false, DType::F32},       {25, "i16", false, DType::F32},
    {26, "i32", false, DType::F32},      {27, "i64", false, DType::F32},
    {28, "f64", false, DType::F32},      {29, "iq1_m", false, DType::F32},
    {30, "bf16", true, DType::BF16},     {34, "tq1_0", false, DType::F32},
    {35, "tq2_0", false, DType::F32},    {39, "mxfp4", false, DType::F32},
};
}  // namespace

std::string ggml_type_name(uint32_t ggml_type) {
  for (const auto& e : kGgmlTypes)
    if (e.id == ggml_type) return e.name;
  return fmt::format("type{}", ggml_type);
}

DType ggml_type_to_dtype(uint32_t ggml_type) {
  for (const auto& e : kGgmlTypes) {
    if (e.id != ggml_type) continue;
    QWEN36_CHECK(e.supported, "ggml type {} ({}) is not supported", e.name, ggml_type);
    return e.dtype;
  }
  fail("unknown ggml type id {}", ggml_type);
}

uint32_t dtype_to_ggml_type(DType t) {
  for (const auto& e : kGgmlTypes)
    if (e.supported && e.dtype == t) return e.id;
  fail("dtype {} has no GGUF type", dtype_name(t));
}

std::string GgufValue::type_str() const {
  if (type != GgufType::ARRAY) return std::string(gguf_type_name(type));
  return fmt::format("array[{}]", gguf_type_name(array_type));
}

// ---- parsing -------------------------------------------------------------------------------

GgufFile::GgufFile(const std::string& path) : map_(std::make_unique<MappedFile>(path)), name_(path) {
  data_ = map_->data();
  size_ = map_->size();
  with_context(path, [&] { parse(); });
}

GgufFile::GgufFile(const std::byte* data, size_t size, std::string name)
    : name_(std::move(name)), data_(data), size_(size) {
  with_context(name_, [&] { parse(); });
}

GgufFile::~GgufFile() = default;

void GgufFile::parse() {
  Cursor c(data_, size_);
  const uint32_t magic = c.read<uint32_t>("magic");
  QWEN36_CHECK(magic == kGgufMagic, "not a GGUF file (magic {:#010x})", magic);
  version_ = c.read<uint32_t>("version");
  QWEN36_CHECK(version_ != 1, "GGUF version 1 is not supported (re-convert the file)");
  QWEN36_CHECK((version_ & 0xffff) != 0 || version_ == 0, "big-endian GGUF files are not supported");
  QWEN36_CHECK(version_ == 2 || version_ == 3, "unsupported GGUF version {}", version_);

  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("KV count");
  QWEN36_CHECK(n_tensors <= kGgufMaxTensors, "tensor count {} exceeds the limit {}", n_tensors, kGgufMaxTensors);
  QWEN36_CHECK(n_kv <= kGgufMaxKVs, "KV count {} exceeds the limit {}", n_kv, kGgufMaxKVs);
  // Smallest possible encodings: a KV is 8+1 (key) + 4 (type) + 1 (u8 value) bytes and a tensor
  // info 8+1 (name) + 4 (n_dims) + 8 (ne0) + 4 (type) + 8 (offset); so the counts are bounded by
  // the file size before anything is reserved.
  QWEN36_CHECK(n_kv <= c.left() / 14, "KV count {} cannot fit in the {} bytes left", n_kv, c.left());

  kvs_.reserve(size_t(n_kv));
  for (uint64_t i = 0; i < n_kv; ++i) {
    with_context(fmt::format("KV {}", i), [&] {
      GgufKV kv;
      kv.key = c.read_string(kGgufMaxKeyLength, "key");
      QWEN36_CHECK(!kv.key.empty(), "empty key");
      const uint32_t t = c.read<uint32_t>("value type");
      QWEN36_CHECK(valid_type(t), "key '{}' has invalid value type {}", kv.key, t);
      kv.value = with_context(fmt::format("key '{}'", kv.key), [&] { return read_value(c, GgufType(t)); });
      const bool fresh = kv_index_.emplace(kv.key, kvs_.size()).second;
      QWEN36_CHECK(fresh, "duplicate key '{}'", kv.key);
      kvs_.push_back(std::move(kv));
    });
  }

  if (const GgufValue* a = find("general.alignment")) {
    QWEN36_CHECK(a->type == GgufType::U32, "general.alignment has type {}, expected u32", a->type_str());
    const uint32_t al = load<uint32_t>(a->raw);
    QWEN36_CHECK(al != 0 && (al & (al - 1)) == 0 && al <= kGgufMaxAlignment,
                 "general.alignment {} is not a power of two in [1, {}]", al, kGgufMaxAlignment);
    alignment_ = al;
  }

  QWEN36_CHECK(n_tensors <= c.left() / 33, "tensor count {} cannot fit in the {} bytes left", n_tensors, c.left());
  tensors_.reserve(size_t(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo ti;
    ti.name = c.read_string(kGgufMaxTensorNameLength, "tensor name");
    with_context(fmt::format("tensor {} '{}'", i, ti.name), [&] {
      QWEN36_CHECK(!ti.name.empty(), "empty tensor name");
      const uint32_t nd = c.read<uint32_t>("n_dims");
      QWEN36_CHECK(nd >= 1 && nd <= kGgufMaxDims, "n_dims {} (must be 1..{})", nd, kGgufMaxDims);
      ti.n_dims = int(nd);
      uint64_t numel = 1;
      for (uint32_t d = 0; d < nd; ++d) {
        const int64_t ne = c.read<int64_t>("dimension");
        QWEN36_CHECK(ne > 0, "dimension {} is {} (must be > 0)", d, ne);
        ti.ne[d] = ne;
        numel = mul_checked(numel, uint64_t(ne), "element count");
        QWEN36_CHECK(numel <= uint64_t(std::numeric_limits<int64_t>::max()), "element count overflows int64");
      }
      ti.ggml_type = c.read<uint32_t>("tensor type");
      const DType dt = ggml_type_to_dtype(ti.ggml_type);
      const uint64_t blk = uint64_t(dtype_block_elems(dt));
      QWEN36_CHECK(uint64_t(ti.ne[0]) % blk == 0, "row length {} is not a multiple of the {} block size {}",
                   ti.ne[0], dtype_name(dt), blk);
      ti.nbytes = mul_checked(numel / blk, dtype_block_bytes(dt), "tensor byte size");
      ti.offset = c.read<uint64_t>("tensor data offset");
      QWEN36_CHECK(ti.offset % alignment_ == 0, "data offset {} is not a multiple of the alignment {}", ti.offset,
                   alignment_);
      // torch order: reverse of ne.
      int64_t shape[kMaxDims];
      for (int d = 0; d < ti.n_dims; ++d) shape[d] = ti.ne[size_t(ti.n_dims - 1 - d)];
      ti.tensor = Tensor(nullptr, dt, shape, ti.n_dims);
      const bool fresh = tensor_index_.emplace(ti.name, tensors_.size()).second;
      QWEN36_CHECK(fresh, "duplicate tensor name");
    });
    tensors_.push_back(ti);
  }

  // The data section starts at the next multiple of the alignment after the tensor infos.
  const uint64_t end_of_infos = c.pos();
  data_offset_ = add_checked(end_of_infos, (alignment_ - end_of_infos % alignment_) % alignment_, "data offset");
  if (tensors_.empty()) return;  // a file with only metadata may end without padding
  QWEN36_CHECK(data_offset_ <= size_, "data section starts at {} beyond the end of the file ({} bytes)",
               data_offset_, size_);
  const uint64_t data_size = size_ - data_offset_;

  // Every tensor's bytes must lie inside the file and no two tensors may overlap.
  std::vector<size_t> order(tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (auto& ti : tensors_) {
    QWEN36_CHECK(ti.offset <= data_size && ti.nbytes <= data_size - ti.offset,
                 "tensor '{}' data [{}, +{}) lies outside the {}-byte data section", ti.name, ti.offset, ti.nbytes,
                 data_size);
    ti.tensor.data = const_cast<std::byte*>(data_ + data_offset_ + ti.offset);  // read-only map: views only
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const auto& prev = tensors_[order[k - 1]];
    const auto& cur = tensors_[order[k]];
    QWEN36_CHECK(prev.offset + prev.nbytes <= cur.offset, "tensors '{}' and '{}' overlap in the data section",
                 prev.name, cur.name);
  }
}

// ---- lookups -------------------------------------------------------------------------------

const GgufValue* GgufFile::find(std::string_view key) const {
  const auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

const GgufValue& GgufFile::get(std::string_view key) const {
  const GgufValue* v = find(key);
  QWEN36_CHECK(v, "{}: GGUF key '{}' is missing", name_, key);
  return *v;
}

namespace {
const GgufValue& expect(const GgufFile& f, std::string_view key, GgufType t) {
  const GgufValue& v = f.get(key);
  QWEN36_CHECK(v.type == t, "{}: GGUF key '{}' has type {}, expected {}", f.name(), key, v.type_str(),
               gguf_type_name(t));
  return v;
}
const GgufValue& expect_arr(const GgufFile& f, std::string_view key, GgufType et) {
  const GgufValue& v = f.get(key);
  QWEN36_CHECK(v.type == GgufType::ARRAY && v.array_type == et, "{}: GGUF key '{}' has type {}, expected array[{}]",
               f.name(), key, v.type_str(), gguf_type_name(et));
  return v;
}
template <typename T> std::vector<T> copy_array(const GgufValue& v) {
  std::vector<T> out(size_t(v.count));
  if (v.count) std::memcpy(out.data(), v.raw, out.size() * sizeof(T));
  return out;
}
}  // namespace

uint8_t GgufFile::get_u8(std::string_view k) const { return load<uint8_t>(expect(*this, k, GgufType::U8).raw); }
int8_t GgufFile::get_i8(std::string_view k) const { return load<int8_t>(expect(*this, k, GgufType::I8).raw); }
uint16_t GgufFile::get_u16(std::string_view k) const { return load<uint16_t>(expect(*this, k, GgufType::U16).raw); }
int16_t GgufFile::get_i16(std::string_view k) const { return load<int16_t>(expect(*this, k, GgufType::I16).raw); }
uint32_t GgufFile::get_u32(std::string_view k) const { return load<uint32_t>(expect(*this, k, GgufType::U32).raw); }
int32_t GgufFile::get_i32(std::string_view k) const { return load<int32_t>(expect(*this, k, GgufType::I32).raw); }
uint64_t GgufFile::get_u64(std::string_view k) const { return load<uint64_t>(expect(*this, k, GgufType::U64).raw); }
int64_t GgufFile::get_i64(std::string_view k) const { return load<int64_t>(expect(*this, k, GgufType::I64).raw); }
float GgufFile::get_f32(std::string_view k) const { return load<float>(expect(*this, k, GgufType::F32).raw); }
double GgufFile::get_f64(std::string_view k) const { return load<double>(expect(*this, k, GgufType::F64).raw); }
bool GgufFile::get_bool(std::string_view k) const { return load<uint8_t>(expect(*this, k, GgufType::BOOL).raw) != 0; }
std::string_view GgufFile::get_str(std::string_view k) const { return expect(*this, k, GgufType::STRING).str; }

int64_t GgufFile::get_int(std::string_view key) const {
  const GgufValue& v = get(key);
  QWEN36_CHECK(is_int_type(v.type), "{}: GGUF key '{}' has type {}, expected an integer", name_, key, v.type_str());
  return with_context(fmt::format("{}: GGUF key '{}'", name_, key), [&] { return int_at(v.type, v.raw); });
}

double GgufFile::get_float(std::string_view key) const {
  const GgufValue& v = get(key);
  if (v.type == GgufType::F32) return load<float>(v.raw);
  if (v.type == GgufType::F64) return load<double>(v.raw);
  fail("{}: GGUF key '{}' has type {}, expected f32 or f64", name_, key, v.type_str());
}

const std::vector<std::string_view>& GgufFile::get_arr_str(std::string_view k) const {
  return expect_arr(*this, k, GgufType::STRING).strs;
}
std::vector<int32_t> GgufFile::get_arr_i32(std::string_view k) const {
  return copy_array<int32_t>(expect_arr(*this, k, GgufType::I32));
}
std::vector<uint32_t> GgufFile::get_arr_u32(std::string_view k) const {
  return copy_array<uint32_t>(expect_arr(*this, k, GgufType::U32));
}
std::vector<float> GgufFile::get_arr_f32(std::string_view k) const {
  return copy_array<float>(expect_arr(*this, k, GgufType::F32));
}

std::vector<int64_t> GgufFile::get_arr_int(std::string_view key) const {
  const GgufValue& v = get(key);
  QWEN36_CHECK(v.type == GgufType::ARRAY && is_int_type(v.array_type),
               "{}: GGUF key '{}' has type {}, expected an integer array", name_, key, v.type_str());
  std::vector<int64_t> out(size_t(v.count));
  const size_t es = gguf_scalar_size(v.array_type);
  with_context(fmt::format("{}: GGUF key '{}'", name_, key), [&] {
    for (size_t i = 0; i < out.size(); ++i) out[i] = int_at(v.array_type, v.raw + i * es);
  });
  return out;
}

uint64_t GgufFile::get_arr_len(std::string_view key) const {
  const GgufValue& v = get(key);
  QWEN36_CHECK(v.type == GgufType::ARRAY, "{}: GGUF key '{}' has type {}, expected an array", name_, key,
               v.type_str());
  return v.count;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensorInfo& GgufFile::tensor_info(std::string_view name) const {
  const GgufTensorInfo* t = find_tensor(name);
  QWEN36_CHECK(t, "{}: GGUF tensor '{}' is missing", name_, name);
  return *t;
}

// ---- rendering -----------------------------------------------------------------------------

namespace {
std::string scalar_to_string(GgufType t, const std::byte* p) {
  switch (t) {
    case GgufType::F32: return fmt::format("{}", load<float>(p));
    case GgufType::F64: return fmt::format("{}", load<double>(p));
    case GgufType::BOOL: return load<uint8_t>(p) ? "true" : "false";
    case GgufType::U64: return fmt::format("{}", load<uint64_t>(p));
    default: return fmt::format("{}", int_at(t, p));
  }
}
std::string quoted(std::string_view s, size_t max_chars = 200) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < max_chars; ++i) {
    const unsigned char ch = static_cast<unsigned char>(s[i]);
    if (ch == '"' || ch == '\\') out += fmt::format("\\{}", char(ch));
    else if (ch < 0x20 || ch == 0x7f) out += fmt::format("\\x{:02x}", ch);
    else out += char(ch);
  }
  if (s.size() > max_chars) out += fmt::format("...(+{} bytes)", s.size() - max_chars);
  return out + "\"";
}
}  // namespace

std::string GgufFile::value_to_string(const GgufValue& v, size_t max_items) {
  if (v.type == GgufType::STRING) return quoted(v.str);
  if (v.type != GgufType::ARRAY) return scalar_to_string(v.type, v.raw);
  std::string out = "[";
  const size_t n = size_t(std::min<uint64_t>(v.count, max_items));
  const size_t es = gguf_scalar_size(v.array_type);
  for (size_t i = 0; i < n; ++i) {
    if (i) out += ", ";
    out += v.array_type == GgufType::STRING ? quoted(v.strs[i], 40) : scalar_to_string(v.array_type, v.raw + i * es);
  }
  if (v.count > n) out += fmt::format(", ... {} more", v.count - n);
  return out + "]";
}

}  // namespace qwen36
