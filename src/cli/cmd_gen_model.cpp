// qwen36 gen-model --preset P [--layers N] --type T --out FILE.gguf [--seed S]: a random model
// of a preset's exact shapes, written as GGUF without ever holding it in memory
// (model/random_quant_weights.h). For speed work only: the weights are random.
#include <spdlog/spdlog.h>

#include <memory>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "model/presets.h"
#include "model/random_quant_weights.h"

namespace qwen36::cli {

void register_gen_model(CLI::App& app) {
  struct Options {
    std::string preset, type = "Q4_K_M", out;
    int64_t layers = 0;
    uint64_t seed = 36;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("gen-model", "Write a RANDOM model of a preset's shapes as GGUF");
  cmd->add_option("--preset", o->preset, "qwen3.6-27b, qwen3.6-35b-a3b, cpu-0.5b, tiny-dense, tiny-moe")->required();
  cmd->add_option("--layers", o->layers, "override the layer count (keeps the 3:1 pattern)");
  cmd->add_option("--type", o->type, "bf16, f16, Q8_0, Q6_K, Q5_K_M, Q5_K_S, Q4_K_M, Q4_K_S")->capture_default_str();
  cmd->add_option("--out", o->out, "output .gguf file")->required();
  cmd->add_option("--seed", o->seed, "random seed")->capture_default_str();
  cmd->callback([o] {
    const auto mix = parse_quant_mix(o->type);
    QWEN36_CHECK(mix.has_value(), "unknown type \"{}\"", o->type);
    const ModelConfig c = model_preset(o->preset, o->layers);
    spdlog::info("gen-model {} ({}): {}", o->preset, quant_mix_name(*mix), c.summary());
    gen_model_file(c, *mix, o->out, o->seed);
  });
}

}  // namespace qwen36::cli
