#include "core/helper_thread.h"

#include <utility>

#include "core/error.h"

namespace qwen36 {

namespace {
// A spin-wait's pause (it frees the core's shared resources for a sibling thread).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

HelperThread::HelperThread(std::function<void()> init) : thread_([this, init = std::move(init)] { loop(init); }) {}

HelperThread::~HelperThread() {
  try {
    wait();
  } catch (...) {  // a job's failure that nobody waited for: nothing left to report it to
  }
  state_.store(kStop, std::memory_order_release);
  state_.notify_all();
  thread_.join();
}

void HelperThread::loop(const std::function<void()>& init) {
  if (init) {
    try {
      init();
    } catch (...) {
      error_ = std::current_exception();
    }
  }
  for (;;) {
    int s = state_.load(std::memory_order_acquire);
    while (s == kIdle || s == kDone) {
      state_.wait(s, std::memory_order_acquire);
      s = state_.load(std::memory_order_acquire);
    }
    if (s == kStop) return;
    if (!error_) {  // after a failed init, no job runs: the first wait() reports it
      try {
        job_();
      } catch (...) {
        error_ = std::current_exception();
      }
    }
    state_.store(kDone, std::memory_order_release);
    state_.notify_all();
  }
}

void HelperThread::post(std::function<void()> job) {
  QWEN36_CHECK(state_.load(std::memory_order_acquire) == kIdle, "HelperThread: a job was posted before the last "
               "one was waited for");
  job_ = std::move(job);
  state_.store(kPosted, std::memory_order_release);
  state_.notify_one();
}

void HelperThread::wait() {
  int s = state_.load(std::memory_order_acquire);
  if (s == kIdle || s == kStop) return;
  // The job is usually done by now; a short spin saves a sleep and a wake-up when it is not.
  for (int i = 0; i < 2000 && s != kDone; ++i) {
    cpu_relax();
    s = state_.load(std::memory_order_acquire);
  }
  while (s != kDone) {
    state_.wait(s, std::memory_order_acquire);
    s = state_.load(std::memory_order_acquire);
  }
  state_.store(kIdle, std::memory_order_relaxed);
  job_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

}  // namespace qwen36
