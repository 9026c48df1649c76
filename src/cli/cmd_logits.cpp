// qwen36 logits: the stable check interface. Reads raw little-endian int32 token ids, runs
// one forward pass over all of them from an empty cache, writes float32 logits
// [n_tokens × vocab] row-major, little-endian. Takes the expert offload options, so that a
// host-placed run's logits can be set beside the all-device run's.
#include <fstream>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "model/qwen36.h"

namespace qwen36::cli {

void register_logits(CLI::App& app) {
  auto* cmd = app.add_subcommand("logits", "Write the logits of one forward pass over a token file");
  struct Opts {
    std::string model, tokens_file, out, backend = "cpu";
    OffloadOptions offload;
    LoraOptions lora;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("-m,--model", o->model, "Model: Hugging Face directory or .gguf file")->required();
  cmd->add_option("--tokens-file", o->tokens_file, "Input token ids, raw int32 little-endian")->required();
  cmd->add_option("--out", o->out, "Output logits, raw float32 [n_tokens x vocab]")->required();
  cmd->add_option("--backend", o->backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  add_offload_options(cmd, o->offload);
  add_lora_options(cmd, o->lora);
  cmd->callback([o] {
    const std::vector<int32_t> tokens = read_i32_file(o->tokens_file);
    QWEN36_CHECK(!tokens.empty(), "{}: no tokens", o->tokens_file);
    o->offload.plan.ctx = o->offload.plan.batch_tokens = o->offload.plan.output_rows = int64_t(tokens.size());
    LoadedModel lm = load_model(o->model, o->backend, 0, o->offload, o->lora);
    const int64_t V = lm.model->config().vocab_size;
    for (int32_t t : tokens)
      QWEN36_CHECK(t >= 0 && t < V, "{}: token id {} is outside the vocabulary (0..{})", o->tokens_file, t, V - 1);
    ModelState state(*lm.backend, lm.model->config(), 1, int64_t(tokens.size()), false);
    std::vector<float> logits(tokens.size() * size_t(V));
    lm.model->forward(ForwardBatch::single(tokens, 0, 0, /*all_logits=*/true), state, logits.data());
    std::ofstream out(o->out, std::ios::binary);
    QWEN36_CHECK(out.good(), "cannot write {}", o->out);
    out.write(reinterpret_cast<const char*>(logits.data()), std::streamsize(logits.size() * sizeof(float)));
    QWEN36_CHECK(out.good(), "error writing {}", o->out);
  });
}

}  // namespace qwen36::cli
