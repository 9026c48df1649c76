#include "model/random_weights.h"

#include <cmath>
#include <string>

#include "core/error.h"
#include "core/rng.h"
#include "model/random_layers.h"

namespace qwen36 {

namespace {

using Rng = SplitMix64;  // one stream per tensor block (core/rng.h)

class Builder {
 public:
  Builder(ModelWeights& w, DType dtype, uint64_t seed) : w_(w), dtype_(dtype), seed_(seed) {}

  // The name is the device builder's (it types quantized synthetic models by it); values here
  // depend only on the order of the calls.
  Tensor matrix(const std::string&, std::initializer_list<int64_t> shape, float std) {
    return make(dtype_, shape, [&](Rng& r) { return r.normal() * std; });
  }
  Tensor f32(std::initializer_list<int64_t> shape, float mean, float spread) {
    return make(DType::F32, shape, [&](Rng& r) { return mean + (r.uniform() * 2 - 1) * spread; });
  }
  void set_layer(int64_t) {}

 private:
  template <typename F>
  Tensor make(DType t, std::initializer_list<int64_t> shape, F gen) {
    return random_host_tensor(w_.storage, t, shape, seed_ * 1000003ull + counter_++, gen);
  }

  ModelWeights& w_;
  DType dtype_;
  uint64_t seed_;
  uint64_t counter_ = 0;
};

}  // namespace

ModelWeights make_random_weights(const ModelConfig& c, DType matrix_dtype, uint64_t seed, bool with_mtp) {
  QWEN36_CHECK(matrix_dtype == DType::F32 || matrix_dtype == DType::F16 || matrix_dtype == DType::BF16,
               "random weights: dtype {} is not supported here", dtype_name(matrix_dtype));
  c.validate();
  ModelWeights w;
  w.config = c;
  Builder b(w, matrix_dtype, seed);
  // Small embeddings (2/sqrt(H) per element): the residual stream is then dominated by what the
  // layers add rather than by the input token, so a tied head does not just repeat its input.
  random_model::tensors(b, w, c, 2.0f / std::sqrt(float(c.hidden_size)), with_mtp, /*gguf=*/false);
  validate_weights(w);
  return w;
}

}  // namespace qwen36
