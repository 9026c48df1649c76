#include "cli/commands.h"

namespace qwen36::cli {

void register_logits(CLI::App&) {}

}  // namespace qwen36::cli
