// qwen36 convert HF_DIR OUT.gguf [--type bf16|f16|f32]: a Hugging Face checkpoint as a GGUF
// file laid out like llama.cpp's converter writes it (format/gguf_convert.h), streamed.
#include <memory>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "format/gguf_convert.h"
#include "quant/mix_rules.h"

namespace qwen36::cli {

void register_convert(CLI::App& app) {
  struct Options {
    std::string in, out, type = "bf16";
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("convert", "Convert a Hugging Face checkpoint to GGUF (llama.cpp layout)");
  cmd->add_option("hf_dir", o->in, "checkpoint directory (config.json + safetensors)")->required();
  cmd->add_option("out", o->out, "output .gguf file")->required();
  cmd->add_option("--type", o->type, "matrix type: bf16, f16 or f32")->capture_default_str();
  cmd->callback([o] {
    const auto mix = parse_quant_mix(o->type);
    QWEN36_CHECK(mix == QuantMix::BF16 || mix == QuantMix::F16 || mix == QuantMix::F32,
                 "--type {}: convert writes bf16, f16 or f32 (use `qwen36 quantize` for block types)", o->type);
    const DType t = *mix == QuantMix::BF16 ? DType::BF16 : *mix == QuantMix::F16 ? DType::F16 : DType::F32;
    convert_hf_to_gguf(o->in, o->out, t);
  });
}

}  // namespace qwen36::cli
