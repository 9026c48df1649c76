#include "format/gguf_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "format/gguf_writer.h"
#include "quant/quant.h"

namespace qwen36 {

GgufMetadata::Entry& GgufMetadata::slot(std::string_view key) {
  for (Entry& e : entries_)
    if (e.key == key) {
      e = Entry{};
      e.key = std::string(key);
      return e;
    }
  entries_.push_back(Entry{});
  entries_.back().key = std::string(key);
  return entries_.back();
}

void GgufMetadata::set_num(std::string_view key, GgufType t, const void* v, size_t n) {
  Entry& e = slot(key);
  e.type = t;
  e.bytes.resize(n);
  std::memcpy(e.bytes.data(), v, n);
}

void GgufMetadata::set_str(std::string_view key, std::string_view v) {
  Entry& e = slot(key);
  e.type = GgufType::STRING;
  e.strs = {std::string(v)};
}

void GgufMetadata::set_arr_str(std::string_view key, std::vector<std::string> v) {
  Entry& e = slot(key);
  e.type = GgufType::ARRAY;
  e.elem = GgufType::STRING;
  e.count = v.size();
  e.strs = std::move(v);
}

void GgufMetadata::set_arr(std::string_view key, GgufType elem, const void* data, uint64_t count) {
  Entry& e = slot(key);
  e.type = GgufType::ARRAY;
  e.elem = elem;
  e.count = count;
  e.bytes.resize(size_t(count) * gguf_scalar_size(elem));
  if (!e.bytes.empty()) std::memcpy(e.bytes.data(), data, e.bytes.size());
}

void GgufMetadata::erase(std::string_view key) {
  std::erase_if(entries_, [&](const Entry& e) { return e.key == key; });
}

const GgufMetadata::Entry* GgufMetadata::find(std::string_view key) const {
  for (const Entry& e : entries_)
    if (e.key == key) return &e;
  return nullptr;
}

GgufMetadata GgufMetadata::from_file(const GgufFile& f) {
  GgufMetadata m;
  for (const GgufKV& kv : f.kvs()) {
    const GgufValue& v = kv.value;
    Entry e;
    e.key = std::string(kv.key);
    e.type = v.type;
    if (v.type == GgufType::STRING) {
      e.strs = {std::string(v.str)};
    } else if (v.type == GgufType::ARRAY) {
      e.elem = v.array_type;
      e.count = v.count;
      if (v.array_type == GgufType::STRING) {
        for (std::string_view s : v.strs) e.strs.emplace_back(s);
      } else {
        QWEN36_CHECK(v.array_type != GgufType::ARRAY, "{}: nested arrays are not supported", kv.key);
        e.bytes.assign(v.raw, v.raw + size_t(v.count) * gguf_scalar_size(v.array_type));
      }
    } else {
      e.bytes.assign(v.raw, v.raw + gguf_scalar_size(v.type));
    }
    m.entries_.push_back(std::move(e));
  }
  return m;
}

void GgufMetadata::write_to(GgufWriter& w) const {
  for (const Entry& e : entries_) {
    const void* p = e.bytes.data();
    switch (e.type) {
      case GgufType::STRING: w.add_str(e.key, e.strs.at(0)); break;
      case GgufType::ARRAY:
        if (e.elem == GgufType::STRING) w.add_arr_str(e.key, std::span<const std::string>(e.strs));
        else w.add_arr(e.key, e.elem, p, e.count);
        break;
      case GgufType::U8: w.add_u8(e.key, *static_cast<const uint8_t*>(p)); break;
      case GgufType::I8: w.add_i8(e.key, *static_cast<const int8_t*>(p)); break;
      case GgufType::BOOL: w.add_bool(e.key, *static_cast<const uint8_t*>(p) != 0); break;
      default: {
        // Wider scalars: copy out (the byte vector gives no alignment guarantee).
        uint64_t buf = 0;
        std::memcpy(&buf, p, e.bytes.size());
        const auto* b = reinterpret_cast<const std::byte*>(&buf);
        auto get = [&]<typename T>(T) {
          T x;
          std::memcpy(&x, b, sizeof x);
          return x;
        };
        switch (e.type) {
          case GgufType::U16: w.add_u16(e.key, get(uint16_t{})); break;
          case GgufType::I16: w.add_i16(e.key, get(int16_t{})); break;
          case GgufType::U32: w.add_u32(e.key, get(uint32_t{})); break;
          case GgufType::I32: w.add_i32(e.key, get(int32_t{})); break;
          case GgufType::F32: w.add_f32(e.key, get(float{})); break;
          case GgufType::U64: w.add_u64(e.key, get(uint64_t{})); break;
          case GgufType::I64: w.add_i64(e.key, get(int64_t{})); break;
          case GgufType::F64: w.add_f64(e.key, get(double{})); break;
          default: fail("metadata key {}: unsupported type", e.key);
        }
      }
    }
  }
}

int64_t TensorSource::rows() const {
  int64_t n = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) n *= shape[i];
  return n;
}

uint64_t write_model_plan(const ModelPlan& plan, const std::vector<DType>& types, const std::string& path,
                          bool progress) {
  QWEN36_CHECK(types.size() == plan.tensors.size(), "internal: {} types for {} tensors", types.size(),
               plan.tensors.size());
  const auto t0 = std::chrono::steady_clock::now();
  GgufWriter w(path);
  plan.meta.write_to(w);
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const TensorSource& t = plan.tensors[i];
    QWEN36_CHECK(t.cols() % dtype_block_elems(types[i]) == 0, "tensor {}: rows of {} elements do not fit {} blocks",
                 t.name, t.cols(), dtype_name(types[i]));
    w.add_tensor(t.name, types[i], std::span<const int64_t>(t.shape));
  }
  const uint64_t total = w.total_size();

  // Rows are produced in chunks of about 8 MB of output: big enough for fast I/O, small
  // enough that even a 27B model's largest tensor never sits in memory.
  constexpr size_t kChunkBytes = size_t(8) << 20;
  std::vector<std::byte> out;
  std::vector<float> f32;
  uint64_t done = 0;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const TensorSource& t = plan.tensors[i];
    const DType target = types[i];
    const int64_t rows = t.rows(), cols = t.cols();
    const size_t row_bytes = dtype_row_bytes(target, cols);
    const uint64_t nbytes = uint64_t(rows) * row_bytes;
    if (t.raw && !t.make_rows && target == t.dtype) {
      w.write_data(t.raw, size_t(nbytes));  // byte-exact copy from a mapped file
    } else {
      QWEN36_CHECK(t.make_rows || t.row_f32, "internal: tensor {} has no data source", t.name);
      const int64_t chunk_rows = std::max<int64_t>(1, int64_t(kChunkBytes / std::max<size_t>(row_bytes, 1)));
      out.resize(size_t(std::min(chunk_rows, rows)) * row_bytes);
      for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
        const int64_t n = std::min(chunk_rows, rows - r0);
        if (t.make_rows) {
          t.make_rows(target, r0, n, out.data());
        } else {
          f32.resize(size_t(cols));
          for (int64_t r = 0; r < n; ++r) {
            t.row_f32(r0 + r, f32.data());
            quantize_row(target, f32.data(), out.data() + size_t(r) * row_bytes, cols);
          }
        }
        w.write_data(out.data(), size_t(n) * row_bytes);
      }
    }
    done += nbytes;
    if (progress) {
      std::string shape;
      for (int64_t d : t.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
      std::fprintf(stderr, "[%4zu/%4zu] %-36s %-5s -> %-5s [%s] %8.2f MiB (%5.1f%%)\n", i + 1, plan.tensors.size(),
                   t.name.c_str(), std::string(dtype_name(t.dtype)).c_str(), std::string(dtype_name(target)).c_str(),
                   shape.c_str(), double(nbytes) / (1 << 20), total ? 100.0 * double(done) / double(total) : 100.0);
    }
  }
  w.finish();
  if (progress) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "wrote %s: %zu tensors, %llu bytes (%.2f GiB) in %.1f s\n", path.c_str(),
                 plan.tensors.size(), (unsigned long long)total, double(total) / (1ull << 30), s);
  }
  return total;
}

}  // namespace qwen36
