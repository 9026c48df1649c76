// qwen36: one binary, many subcommands. Errors surface as one line on stderr, exit code 1.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string_view>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"

namespace {

// llama.cpp's multi-letter single-dash flags, which CLI11 cannot declare (a single dash takes
// one letter), spelled as their long forms before parsing.
std::vector<char*> with_long_aliases(int argc, char** argv) {
  static char ctk[] = "--cache-type-k", ctv[] = "--cache-type-v", tp[] = "--tensor-parallel",
              ot[] = "--override-tensor", ncmoe[] = "--n-cpu-moe", cmoe[] = "--cpu-moe", ub[] = "--ubatch-size";
  std::vector<char*> out(argv, argv + argc);
  for (char*& a : out) {
    if (std::string_view(a) == "-ctk") a = ctk;
    if (std::string_view(a) == "-ctv") a = ctv;
    if (std::string_view(a) == "-tp") a = tp;
    if (std::string_view(a) == "-ot") a = ot;
    if (std::string_view(a) == "-ncmoe") a = ncmoe;
    if (std::string_view(a) == "-cmoe") a = cmoe;
    if (std::string_view(a) == "-ub") a = ub;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  qwen36::log_init();
  std::vector<char*> args = with_long_aliases(argc, argv);
  argv = args.data();
  CLI::App app{"qwen36: inference engine for the Qwen3.5/3.6 hybrid model family"};
  app.require_subcommand(1);
  qwen36::cli::register_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const qwen36::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
