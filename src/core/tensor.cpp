#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <new>

#include "core/error.h"

namespace qwen36 {

Tensor::Tensor(void* d, DType t, std::initializer_list<int64_t> dims) : data(d), dtype(t) {
  QWEN36_CHECK(dims.size() <= size_t(kMaxDims), "tensor of {} dimensions (max {})", dims.size(), kMaxDims);
  for (int64_t x : dims) shape[size_t(ndim++)] = x;
}

Tensor::Tensor(void* d, DType t, const int64_t* dims, int n) : data(d), dtype(t) {
  QWEN36_CHECK(n >= 0 && n <= kMaxDims, "tensor of {} dimensions (max {})", n, kMaxDims);
  for (int i = 0; i < n; ++i) shape[size_t(ndim++)] = dims[i];
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[size_t(i)];
  return n;
}

std::string Tensor::shape_str() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += fmt::format("{}{}", i ? ", " : "", shape[size_t(i)]);
  return s + "] " + std::string(dtype_name(dtype));
}

HostBuffer::HostBuffer(size_t bytes) : size_(bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded == 0) return;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(64, rounded));
  if (!p) fail("out of host memory allocating {} bytes", bytes);
  std::memset(p, 0, rounded);
  data_.reset(p);
}

void HostBuffer::Free::operator()(std::byte* p) const { std::free(p); }

}  // namespace qwen36
