#pragma once
// defines: load_model_weights (any supported checkpoint path → ModelWeights)

#include <string>

#include "model/weights.h"

namespace qwen36 {

// A Hugging Face directory (config.json + safetensors) or a .gguf file.
ModelWeights load_model_weights(const std::string& path);

}  // namespace qwen36
