// qwen36 tokenize: not yet implemented (text issue).
#include "cli/commands.h"

namespace qwen36::cli {

void register_tokenize(CLI::App&) {}

}  // namespace qwen36::cli
