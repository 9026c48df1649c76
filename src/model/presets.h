#pragma once
// defines: model_preset (named configs of real and synthetic family members)

#include <string>
#include <vector>

#include "model/config.h"

namespace qwen36 {

// "qwen3.6-27b", "qwen3.6-35b-a3b" (the published shapes), "cpu-0.5b" (a ~0.5B dense member
// for CPU speed checks), "tiny-dense", "tiny-moe" (small, for tests and the random default).
// layers > 0 overrides the layer count (keeping the 3:1 DeltaNet/attention pattern).
ModelConfig model_preset(const std::string& name, int64_t layers = 0);
std::vector<std::string> model_preset_names();

}  // namespace qwen36
