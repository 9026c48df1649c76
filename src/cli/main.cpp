// qwen36: one binary, many subcommands. Errors surface as one line on stderr, exit code 1.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"

int main(int argc, char** argv) {
  qwen36::log_init();
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
