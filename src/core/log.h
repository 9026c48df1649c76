#pragma once
// defines: log_init, Progress (a single updating line on stderr for long work)

#include <spdlog/spdlog.h>

#include <chrono>
#include <string>

namespace qwen36 {

// Level from QWEN36_LOG (trace|debug|info|warn|error|off), default info. Logs go to stderr
// so stdout stays clean for outputs that checks read.
void log_init();

class Progress {
 public:
  Progress(std::string what, uint64_t total);
  void update(uint64_t done);
  void finish();

 private:
  std::string what_;
  uint64_t total_;
  std::chrono::steady_clock::time_point start_, last_;
  bool shown_ = false;
};

}  // namespace qwen36
