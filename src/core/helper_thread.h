#pragma once
// defines: HelperThread (posted jobs, one at a time, on a thread of its own)

#include <atomic>
#include <exception>
#include <functional>
#include <thread>

namespace qwen36 {

// Runs posted jobs one at a time on a thread of its own, which sleeps between them (it never
// spins: while a job runs, the posting thread may be running an OpenMP team that wants every
// core). Expert offload uses it to queue the device's share of a decode pass (uploads and
// kernel launches, ~50 µs of driver calls) while the calling thread computes the host's share.
class HelperThread {
 public:
  // `init` runs first, on the new thread (e.g. selecting a device: CUDA's current device is
  // per thread); what it throws comes out of the first wait().
  explicit HelperThread(std::function<void()> init = {});
  ~HelperThread();
  HelperThread(const HelperThread&) = delete;
  HelperThread& operator=(const HelperThread&) = delete;

  // Starts `job`; the previous one must have been waited for.
  void post(std::function<void()> job);
  // Returns once the posted job (if any) has returned; rethrows what it threw.
  void wait();

 private:
  enum State : int { kIdle, kPosted, kDone, kStop };
  void loop(const std::function<void()>& init);

  std::function<void()> job_;
  std::exception_ptr error_;
  std::atomic<int> state_{kIdle};
  std::thread thread_;
};

}  // namespace qwen36
