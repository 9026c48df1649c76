#pragma once
// defines: make_random_weights (a complete ModelWeights of random values, built in memory)
//
// For speed measurements (speed does not depend on weight values) and the built-in random
// default model. Values are scaled so activations stay O(1) through any depth: matrices
// ~ N(0, 1/fan_in), norm multipliers near 1, DeltaNet decays in a realistic range.

#include <cstdint>

#include "model/weights.h"

namespace qwen36 {

// matrix_dtype: F32, F16 or BF16 (quantized types come with the quant tools).
ModelWeights make_random_weights(const ModelConfig& config, DType matrix_dtype, uint64_t seed, bool with_mtp = true);

}  // namespace qwen36
