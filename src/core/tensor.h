#pragma once
// defines: Tensor (a typed view: pointer, dtype, shape), HostBuffer (64-byte aligned bytes)
//
// Shapes are written outermost first, as in PyTorch: a weight of nn.Linear(in, out) is
// {out, in}. Tensors are always contiguous row-major; a view never owns its memory.

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "core/dtype.h"

namespace qwen36 {

inline constexpr int kMaxDims = 4;

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};

  Tensor() = default;
  Tensor(void* d, DType t, std::initializer_list<int64_t> dims);
  Tensor(void* d, DType t, const int64_t* dims, int n);

  bool empty() const { return data == nullptr; }
  int64_t dim(int i) const { return shape[size_t(i < 0 ? ndim + i : i)]; }
  int64_t numel() const;
  // Innermost extent and the number of rows (product of the outer extents).
  int64_t cols() const { return ndim ? shape[size_t(ndim - 1)] : 1; }
  int64_t rows() const { return cols() ? numel() / cols() : 0; }
  size_t row_bytes() const { return dtype_row_bytes(dtype, cols()); }
  size_t nbytes() const { return size_t(rows()) * row_bytes(); }
  std::string shape_str() const;  // "[4, 256] bf16"

  template <typename T> T* as() const { return static_cast<T*>(data); }
  // Pointer to row r (over the flattened outer dimensions).
  const std::byte* row(int64_t r) const { return static_cast<const std::byte*>(data) + size_t(r) * row_bytes(); }
};

// Owned, 64-byte aligned host memory (a whole number of cache lines, zero-initialised).
class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(size_t bytes);
  std::byte* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, Free> data_;
  size_t size_ = 0;
};

}  // namespace qwen36
