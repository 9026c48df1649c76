#pragma once
// defines: helpers that canonicalise small weight vectors at load time (to f32, +1 norms,
// −exp(A_log)), storing the converted copy in ModelWeights::storage.

#include <functional>

#include "model/weights.h"

namespace qwen36 {

// Element i of a float-typed tensor (f32/f16/bf16) as f32.
float tensor_get_f32(const Tensor& t, int64_t i);

// A new f32 tensor with the same shape (or `shape` when given) holding f(x_i).
Tensor convert_f32(ModelWeights& w, const Tensor& src, const std::function<float(float)>& f,
                   std::initializer_list<int64_t> shape = {});

inline Tensor to_f32(ModelWeights& w, const Tensor& t, std::initializer_list<int64_t> shape = {}) {
  return convert_f32(w, t, [](float x) { return x; }, shape);
}
inline Tensor norm_plus_one(ModelWeights& w, const Tensor& t) {
  return convert_f32(w, t, [](float x) { return 1.0f + x; });
}

}  // namespace qwen36
