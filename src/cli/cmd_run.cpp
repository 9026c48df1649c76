#include "cli/commands.h"

namespace qwen36::cli {

void register_run(CLI::App&) {}

}  // namespace qwen36::cli
