#include "format/weight_convert.h"

#include <cstring>

#include "core/error.h"

namespace qwen36 {

float tensor_get_f32(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::F32: return t.as<const float>()[i];
    case DType::BF16: return bf16_to_f32(t.as<const uint16_t>()[i]);
    case DType::F16: return f16_to_f32(t.as<const uint16_t>()[i]);
    default: fail("expected a float tensor, got {}", dtype_name(t.dtype));
  }
}

Tensor convert_f32(ModelWeights& w, const Tensor& src, const std::function<float(float)>& f,
                   std::initializer_list<int64_t> shape) {
  const int64_t n = src.numel();
  auto buf = std::make_shared<HostBuffer>(size_t(n) * sizeof(float));
  float* out = reinterpret_cast<float*>(buf->data());
  for (int64_t i = 0; i < n; ++i) out[i] = f(tensor_get_f32(src, i));
  Tensor t = shape.size() ? Tensor(out, DType::F32, shape) : Tensor(out, DType::F32, src.shape.data(), src.ndim);
  QWEN36_CHECK(t.numel() == n, "reshape of {} to {} elements", src.shape_str(), t.numel());
  w.storage.push_back(buf);
  return t;
}

}  // namespace qwen36
