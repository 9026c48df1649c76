// qwen36 quantize IN OUT TYPE: a GGUF file or HF checkpoint → Q8_0 / Q6_K / Q5_K_M / Q5_K_S /
// Q4_K_M / Q4_K_S (or bf16/f16/f32) with llama.cpp's per-tensor type choices, streamed.
#include <memory>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "quant/quantize_model.h"

namespace qwen36::cli {

void register_quantize(CLI::App& app) {
  struct Options {
    std::string in, out, type;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("quantize", "Quantize a GGUF file or HF checkpoint (llama.cpp's mixes)");
  cmd->add_option("in", o->in, "input .gguf file or HF checkpoint directory")->required();
  cmd->add_option("out", o->out, "output .gguf file")->required();
  cmd->add_option("type", o->type, "Q8_0, Q6_K, Q5_K_M, Q5_K_S, Q4_K_M, Q4_K_S, BF16, F16 or F32")->required();
  cmd->callback([o] {
    const auto mix = parse_quant_mix(o->type);
    QWEN36_CHECK(mix.has_value(), "unknown type \"{}\" (Q8_0, Q6_K, Q5_K_M, Q5_K_S, Q4_K_M, Q4_K_S, BF16, F16, F32)",
                 o->type);
    QWEN36_CHECK(o->in != o->out, "input and output are the same file");
    quantize_model(o->in, o->out, *mix);
  });
}

}  // namespace qwen36::cli
