#pragma once
// defines: cli_error_mismatch, the CLI's error contract checked on the built qwen36 binary: a bad
// argument fails with a non-zero status, nothing on stdout and one line "error: …" on stderr that
// names the problem.

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "common/run_command.h"

namespace qwen36::test {

// "" when cmd fails so and its line holds `what`; else what went otherwise, with the output
// (EXPECT_EQ(cli_error_mismatch(cmd, what), "") << cmd).
inline std::string cli_error_mismatch(const std::string& cmd, const std::string& what) {
  const std::filesystem::path err_path =
      std::filesystem::temp_directory_path() / ("qwen36-cli-error-" + std::to_string(::getpid()) + ".err");
  int status = -1;
  const std::string out = run_command(cmd + " 2>" + err_path.string(), &status);
  std::stringstream ss;
  ss << std::ifstream(err_path).rdbuf();
  const std::string err = ss.str();
  std::filesystem::remove(err_path);
  if (status == 0) return "exit status 0; stderr: " + err;
  if (!out.empty()) return "stdout not empty: " + out;
  if (std::count(err.begin(), err.end(), '\n') != 1 || err.rfind("error: ", 0) != 0)
    return "stderr is not one line \"error: …\": " + err;
  if (err.find(what) == std::string::npos) return "stderr lacks \"" + what + "\": " + err;
  return "";
}

}  // namespace qwen36::test
