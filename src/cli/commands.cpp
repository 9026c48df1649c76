#include "cli/commands.h"

namespace qwen36::cli {

// The order of `qwen36 --help`: using a model first, then measuring, then file tools.
void register_commands(CLI::App& app) {
  register_run(app);
  register_chat(app);
  register_serve(app);
  register_bench(app);
  register_bench_serve(app);
  register_perplexity(app);
  register_logits(app);
  register_convert(app);
  register_quantize(app);
  register_gen_model(app);
  register_info(app);
  register_tokenize(app);
  register_template(app);
}

}  // namespace qwen36::cli
