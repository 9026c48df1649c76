#include "format/gguf_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace qwen36 {

namespace {
template <typename T> void append(std::vector<std::byte>& out, const T& v) {
  const auto* p = reinterpret_cast<const std::byte*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}
void append_str(std::vector<std::byte>& out, std::string_view s) {
  append(out, uint64_t(s.size()));
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  out.insert(out.end(), p, p + s.size());
}
uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
}  // namespace

GgufWriter::GgufWriter(std::string path, uint32_t alignment) : path_(std::move(path)), alignment_(alignment) {
  QWEN36_CHECK(alignment != 0 && (alignment & (alignment - 1)) == 0 && alignment <= kGgufMaxAlignment,
               "GGUF alignment {} is not a power of two in [1, {}]", alignment, kGgufMaxAlignment);
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) fail("cannot create {}: {}", path_, std::strerror(errno));
  std::setvbuf(file_, nullptr, _IOFBF, 1 << 20);
  // llama.cpp reads the alignment from this key; it is only needed when not the default.
  if (alignment_ != kGgufDefaultAlignment) add_u32("general.alignment", alignment_);
}

GgufWriter::~GgufWriter() {
  if (file_) {
    std::fclose(file_);
    if (!finished_) std::remove(path_.c_str());
  }
}

void GgufWriter::begin_kv(std::string_view key, GgufType type) {
  QWEN36_CHECK(!header_written_, "GGUF key '{}' added after tensor data was written", key);
  QWEN36_CHECK(!key.empty(), "empty GGUF key");
  QWEN36_CHECK(std::find(keys_.begin(), keys_.end(), key) == keys_.end(), "duplicate GGUF key '{}'", key);
  keys_.emplace_back(key);
  append_str(kv_bytes_, key);
  append(kv_bytes_, uint32_t(type));
  ++n_kv_;
}

void GgufWriter::add_kv(std::string_view key, GgufType type, const void* value, size_t n) {
  begin_kv(key, type);
  const auto* p = static_cast<const std::byte*>(value);
  kv_bytes_.insert(kv_bytes_.end(), p, p + n);
}

void GgufWriter::add_u8(std::string_view k, uint8_t v) { add_kv(k, GgufType::U8, &v, 1); }
void GgufWriter::add_i8(std::string_view k, int8_t v) { add_kv(k, GgufType::I8, &v, 1); }
void GgufWriter::add_u16(std::string_view k, uint16_t v) { add_kv(k, GgufType::U16, &v, 2); }
void GgufWriter::add_i16(std::string_view k, int16_t v) { add_kv(k, GgufType::I16, &v, 2); }
void GgufWriter::add_u32(std::string_view k, uint32_t v) { add_kv(k, GgufType::U32, &v, 4); }
void GgufWriter::add_i32(std::string_view k, int32_t v) { add_kv(k, GgufType::I32, &v, 4); }
void GgufWriter::add_u64(std::string_view k, uint64_t v) { add_kv(k, GgufType::U64, &v, 8); }
void GgufWriter::add_i64(std::string_view k, int64_t v) { add_kv(k, GgufType::I64, &v, 8); }
void GgufWriter::add_f32(std::string_view k, float v) { add_kv(k, GgufType::F32, &v, 4); }
void GgufWriter::add_f64(std::string_view k, double v) { add_kv(k, GgufType::F64, &v, 8); }
void GgufWriter::add_bool(std::string_view k, bool v) {
  const uint8_t b = v ? 1 : 0;
  add_kv(k, GgufType::BOOL, &b, 1);
}
void GgufWriter::add_str(std::string_view k, std::string_view v) {
  begin_kv(k, GgufType::STRING);
  append_str(kv_bytes_, v);
}

void GgufWriter::add_arr_str(std::string_view k, std::span<const std::string> v) {
  begin_kv(k, GgufType::ARRAY);
  append(kv_bytes_, uint32_t(GgufType::STRING));
  append(kv_bytes_, uint64_t(v.size()));
  for (const auto& s : v) append_str(kv_bytes_, s);
}

void GgufWriter::add_arr_str(std::string_view k, std::span<const std::string_view> v) {
  begin_kv(k, GgufType::ARRAY);
  append(kv_bytes_, uint32_t(GgufType::STRING));
  append(kv_bytes_, uint64_t(v.size()));
  for (const auto& s : v) append_str(kv_bytes_, s);
}

void GgufWriter::add_arr(std::string_view k, GgufType elem, const void* data, uint64_t count) {
  QWEN36_CHECK(elem != GgufType::STRING && elem != GgufType::ARRAY && uint32_t(elem) < kGgufTypeCount,
               "GGUF key '{}': add_arr takes numeric element types, not {}", k, gguf_type_name(elem));
  begin_kv(k, GgufType::ARRAY);
  append(kv_bytes_, uint32_t(elem));
  append(kv_bytes_, count);
  const auto* p = static_cast<const std::byte*>(data);
  kv_bytes_.insert(kv_bytes_.end(), p, p + count * gguf_scalar_size(elem));
}

uint64_t GgufWriter::add_tensor(std::string_view name, DType dtype, std::span<const int64_t> shape) {
  QWEN36_CHECK(!header_written_, "GGUF tensor '{}' declared after tensor data was written", name);
  // llama.cpp's GGML_MAX_NAME is 64 including the terminating NUL.
  QWEN36_CHECK(!name.empty() && name.size() < 64, "GGUF tensor name '{}' must have 1..63 characters", name);
  QWEN36_CHECK(!shape.empty() && shape.size() <= kGgufMaxDims, "GGUF tensor '{}' has {} dimensions (1..{})", name,
               shape.size(), kGgufMaxDims);
  for (const auto& t : tensors_) QWEN36_CHECK(t.name != name, "duplicate GGUF tensor '{}'", name);
  PendingTensor t;
  t.name = std::string(name);
  t.ggml_type = dtype_to_ggml_type(dtype);
  uint64_t numel = 1;
  for (auto it = shape.rbegin(); it != shape.rend(); ++it) {
    QWEN36_CHECK(*it > 0, "GGUF tensor '{}' has a dimension {}", name, *it);
    t.ne.push_back(*it);
    QWEN36_CHECK(!__builtin_mul_overflow(numel, uint64_t(*it), &numel), "GGUF tensor '{}' is too large", name);
  }
  QWEN36_CHECK(t.ne[0] % dtype_block_elems(dtype) == 0, "GGUF tensor '{}': row of {} is not a multiple of the {} block size {}",
               name, t.ne[0], dtype_name(dtype), dtype_block_elems(dtype));
  t.nbytes = numel / uint64_t(dtype_block_elems(dtype)) * dtype_block_bytes(dtype);
  t.offset = data_size_;
  data_size_ += align_up(t.nbytes, alignment_);
  tensors_.push_back(std::move(t));
  return tensors_.back().nbytes;
}

uint64_t GgufWriter::header_size() const {
  uint64_t n = 4 + 4 + 8 + 8 + kv_bytes_.size();
  for (const auto& t : tensors_) n += 8 + t.name.size() + 4 + 8 * t.ne.size() + 4 + 8;
  return align_up(n, alignment_);
}

uint64_t GgufWriter::total_size() const { return header_size() + data_size_; }

void GgufWriter::put(const void* p, size_t n) {
  if (n && std::fwrite(p, 1, n, file_) != n) fail("cannot write {}: {}", path_, std::strerror(errno));
  file_pos_ += n;
}

void GgufWriter::pad_to_alignment() {
  static constexpr std::byte kZeros[256] = {};
  uint64_t pad = (alignment_ - file_pos_ % alignment_) % alignment_;
  while (pad) {
    const size_t n = size_t(std::min<uint64_t>(pad, sizeof(kZeros)));
    put(kZeros, n);
    pad -= n;
  }
}

void GgufWriter::write_header() {
  std::vector<std::byte> h;
  append(h, kGgufMagic);
  append(h, uint32_t(3));
  append(h, uint64_t(tensors_.size()));
  append(h, n_kv_);
  h.insert(h.end(), kv_bytes_.begin(), kv_bytes_.end());
  for (const auto& t : tensors_) {
    append_str(h, t.name);
    append(h, uint32_t(t.ne.size()));
    for (int64_t d : t.ne) append(h, d);
    append(h, t.ggml_type);
    append(h, t.offset);
  }
  put(h.data(), h.size());
  pad_to_alignment();
  header_written_ = true;
}

void GgufWriter::write_data(const void* data, size_t n) {
  QWEN36_CHECK(!finished_, "{}: data written after finish()", path_);
  if (!header_written_) write_header();
  const auto* p = static_cast<const std::byte*>(data);
  while (n > 0) {
    QWEN36_CHECK(cur_tensor_ < tensors_.size(), "{}: more tensor data written than declared", path_);
    const auto& t = tensors_[cur_tensor_];
    const size_t k = size_t(std::min<uint64_t>(n, t.nbytes - cur_written_));
    put(p, k);
    p += k;
    n -= k;
    cur_written_ += k;
    if (cur_written_ == t.nbytes) {
      pad_to_alignment();
      ++cur_tensor_;
      cur_written_ = 0;
    }
  }
}

void GgufWriter::write_tensor(std::string_view name, const void* data, size_t n) {
  QWEN36_CHECK(cur_tensor_ < tensors_.size() && cur_written_ == 0, "{}: tensor '{}' written out of order", path_,
               name);
  const auto& t = tensors_[cur_tensor_];
  QWEN36_CHECK(t.name == name, "{}: tensor '{}' written where '{}' is next", path_, name, t.name);
  QWEN36_CHECK(t.nbytes == n, "{}: tensor '{}' takes {} bytes, got {}", path_, name, t.nbytes, n);
  write_data(data, n);
}

void GgufWriter::finish() {
  QWEN36_CHECK(!finished_, "{}: finish() called twice", path_);
  if (!header_written_) write_header();
  QWEN36_CHECK(cur_tensor_ == tensors_.size(), "{}: only {} of {} tensors were written", path_, cur_tensor_,
               tensors_.size());
  finished_ = true;
  const bool ok = std::fflush(file_) == 0;
  const int close_rc = std::fclose(file_);
  file_ = nullptr;
  if (!ok || close_rc != 0) fail("cannot write {}: {}", path_, std::strerror(errno));
}

}  // namespace qwen36
