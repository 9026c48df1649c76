#pragma once
// defines: make_random_weights (a complete ModelWeights of random values, built in memory)
//
// For speed measurements (speed does not depend on weight values) and the built-in random
// default model. Values are scaled so activations stay O(1) through any depth: matrices
// ~ N(0, 1/fan_in), norm multipliers near 1, DeltaNet decays in a realistic range.

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "core/rng.h"
#include "model/weights.h"

namespace qwen36 {

// A host tensor of dtype t (F32, BF16 or F16) filled with gen(rng): values come in blocks of
// 64 Ki elements, each block its own SplitMix64 stream derived from `stream`, so the fill runs
// in parallel and is the same for any thread count. The buffer joins `storage`.
template <typename F>
Tensor random_host_tensor(std::vector<std::shared_ptr<const void>>& storage, DType t,
                          std::initializer_list<int64_t> shape, uint64_t stream, F gen) {
  Tensor x(nullptr, t, shape);
  auto buf = std::make_shared<HostBuffer>(x.nbytes());
  x.data = buf->data();
  storage.push_back(buf);
  const int64_t n = x.numel();
  constexpr int64_t kBlock = 1 << 16;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < (n + kBlock - 1) / kBlock; ++b) {
    SplitMix64 r{stream * 0x100000001b3ull + uint64_t(b)};
    for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) {
      const float v = gen(r);
      if (t == DType::F32)
        x.as<float>()[i] = v;
      else if (t == DType::BF16)
        x.as<uint16_t>()[i] = f32_to_bf16(v);
      else
        x.as<uint16_t>()[i] = f32_to_f16(v);
    }
  }
  return x;
}

// matrix_dtype: F32, F16 or BF16 (quantized types come with the quant tools).
ModelWeights make_random_weights(const ModelConfig& config, DType matrix_dtype, uint64_t seed, bool with_mtp = true);

}  // namespace qwen36
