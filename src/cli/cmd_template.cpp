// qwen36 template: not yet implemented (text issue).
#include "cli/commands.h"

namespace qwen36::cli {

void register_template(CLI::App&) {}

}  // namespace qwen36::cli
