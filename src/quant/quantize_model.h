#pragma once
// defines: plan_from_gguf, plan_from_path, mix_model_info, choose_plan_types, quantize_model
//
// `qwen36 quantize IN OUT TYPE`: IN is a GGUF file or an HF checkpoint directory (converted on
// the fly, as `convert` would write it). Tensors are visited in llama-quantize's order and get
// llama.cpp's per-tensor types for the mix (quant/mix_rules.h); each is dequantized to f32 row
// by row and requantized, so memory stays at a few MB beyond the mapped input.

#include <string>
#include <vector>

#include "format/gguf_plan.h"
#include "quant/mix_rules.h"

namespace qwen36 {

// Every KV and tensor of a GGUF file (tensors keep their stored type as natural type).
ModelPlan plan_from_gguf(const std::string& path);
// A .gguf file or an HF directory (matrices bf16).
ModelPlan plan_from_path(const std::string& path);

// n_expert and block_count from the plan's metadata.
MixModelInfo mix_model_info(const GgufMetadata& m);

// Puts plan.tensors in llama-quantize's order, sets general.file_type, and returns each
// tensor's type for the mix.
std::vector<DType> choose_plan_types(ModelPlan& plan, QuantMix mix);

// Returns the written file size.
uint64_t quantize_model(const std::string& in, const std::string& out, QuantMix mix, bool progress = true);

}  // namespace qwen36
