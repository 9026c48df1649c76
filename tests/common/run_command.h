#pragma once
// defines: run_command (a shell command's stdout and exit status), for tests that drive the
// built qwen36 binary (QWEN36_BIN).

#include <cstdio>
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

}  // namespace qwen36::test
