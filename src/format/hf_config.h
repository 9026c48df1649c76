#pragma once
// defines: parse_hf_config (config.json → ModelConfig)

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "model/config.h"

namespace qwen36 {

// Accepts Qwen3_5ForCausalLM (qwen3_5_text), Qwen3_5MoeForCausalLM (qwen3_5_moe_text) and
// the multimodal wrappers (qwen3_5 / qwen3_5_moe, text config under text_config).
// The result is validated.
ModelConfig parse_hf_config(const nlohmann::json& j);
// Reads dir/config.json (and eos ids from dir/generation_config.json when present).
ModelConfig load_hf_config(const std::string& dir);

}  // namespace qwen36
