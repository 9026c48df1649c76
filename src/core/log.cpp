#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace qwen36 {

void log_init() {
  static bool done = false;
  if (done) return;
  done = true;
  auto logger = spdlog::stderr_color_mt("qwen36");
  logger->set_pattern("%^%l%$: %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::info);
  if (const char* lv = std::getenv("QWEN36_LOG")) spdlog::set_level(spdlog::level::from_str(lv));
}

Progress::Progress(std::string what, uint64_t total)
    : what_(std::move(what)), total_(total), start_(std::chrono::steady_clock::now()), last_(start_) {}

void Progress::update(uint64_t done) {
  // Only worth a line when work takes long enough to wonder about; redraw at most 5×/s.
  const auto now = std::chrono::steady_clock::now();
  if (now - start_ < std::chrono::milliseconds(500) || now - last_ < std::chrono::milliseconds(200)) return;
  last_ = now;
  shown_ = true;
  const double pct = total_ ? 100.0 * double(done) / double(total_) : 100.0;
  std::fprintf(stderr, "\r%s: %5.1f%%", what_.c_str(), pct);
  std::fflush(stderr);
}

void Progress::finish() {
  if (!shown_) return;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::fprintf(stderr, "\r%s: 100.0%% (%.1f s)\n", what_.c_str(), s);
}

}  // namespace qwen36
