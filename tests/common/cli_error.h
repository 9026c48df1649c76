#pragma once
// defines: cli_error_mismatch, the CLI's error contract checked on the built qwen36 binary: a bad
// argument fails with a non-zero status, nothing on stdout and one line "error: …" on stderr that
// names the problem.

#include <algorithm>
#include <string>

#include "common/run_command.h"

namespace qwen36::test {

// "" when cmd fails so and its line holds `what`; else what went otherwise, with the output
// (EXPECT_EQ(cli_error_mismatch(cmd, what), "") << cmd).
inline std::string cli_error_mismatch(const std::string& cmd, const std::string& what) {
  int status = -1;
  std::string err;
  const std::string out = run_command(cmd, &status, &err);
  if (status == 0) return "exit status 0; stderr: " + err;
  if (!out.empty()) return "stdout not empty: " + out;
  if (std::count(err.begin(), err.end(), '\n') != 1 || err.rfind("error: ", 0) != 0)
    return "stderr is not one line \"error: …\": " + err;
  if (err.find(what) == std::string::npos) return "stderr lacks \"" + what + "\": " + err;
  return "";
}

}  // namespace qwen36::test
