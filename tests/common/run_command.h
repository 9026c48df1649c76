#pragma once
// defines: run_command (a shell command's stdout and exit status; with err, its stderr too),
// for tests that drive the built qwen36 binary (QWEN36_BIN).

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace qwen36::test {

inline std::string run_command(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  *status = pclose(p);
  return out;
}

// The same with cmd's stderr into *err (through a file of this process's own).
inline std::string run_command(const std::string& cmd, int* status, std::string* err) {
  const std::filesystem::path err_path =
      std::filesystem::temp_directory_path() / ("qwen36-test-" + std::to_string(::getpid()) + ".err");
  const std::string out = run_command(cmd + " 2>" + err_path.string(), status);
  std::stringstream ss;
  ss << std::ifstream(err_path).rdbuf();
  *err = ss.str();
  std::filesystem::remove(err_path);
  return out;
}

}  // namespace qwen36::test
