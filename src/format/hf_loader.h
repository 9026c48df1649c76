#pragma once
// defines: load_hf_checkpoint (a Hugging Face directory → the canonical ModelWeights)

#include <string>

#include "model/weights.h"

namespace qwen36 {

// Reads config.json and the safetensors (single or sharded), maps every tensor name once
// into ModelWeights and validates all shapes. Throws Error naming the missing/bad tensor.
ModelWeights load_hf_checkpoint(const std::string& dir);

}  // namespace qwen36
