#include "backend/cpu/host_pool.h"

#include <chrono>

#include "core/error.h"

namespace qwen36::cpu {

namespace {
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}
}  // namespace

HostPool::HostPool(int workers) {
  QWEN36_CHECK(workers >= 1, "host pool: {} workers", workers);
  threads_.reserve(size_t(workers));
  for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { worker_loop(); });
}

HostPool::~HostPool() {
  join();
  stop_.store(true, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void HostPool::submit(MoePass& pass, std::atomic<uint64_t>* signal, uint64_t value) {
  QWEN36_CHECK(pass_ == nullptr, "host pool: a pass is in flight already");
  // The signal goes up with the last item of the last phase that has items (a pass of rows,
  // MoePass::make_rows, has no sums).
  last_phase_ = MoePass::kPhases - 1;
  while (last_phase_ >= 0 && pass.items(last_phase_) == 0) --last_phase_;
  QWEN36_CHECK(last_phase_ >= 0, "host pool: a pass without items");
  pass_ = &pass;
  signal_ = signal, value_ = value;
  for (int p = 0; p < MoePass::kPhases; ++p) {
    next_[p].store(0, std::memory_order_relaxed);
    done_[p].store(0, std::memory_order_relaxed);
  }
  left_.store(0, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);  // publishes the above
  generation_.notify_all();  // a system call only while some worker sleeps
}

void HostPool::work() {
  MoePass& pass = *pass_;
  for (int p = 0; p < MoePass::kPhases; ++p) {
    const int64_t n = pass.items(p);
    const bool last = p == last_phase_;
    for (int64_t it; (it = next_[p].fetch_add(1, std::memory_order_relaxed)) < n;) {
      pass.run(p, it);
      // The last item of the pass (acq_rel: every other item's writes are seen) raises the signal.
      if (done_[p].fetch_add(1, last ? std::memory_order_acq_rel : std::memory_order_release) + 1 == n && last &&
          signal_)
        signal_->store(value_, std::memory_order_release);
    }
    // The next phase reads what this one wrote (acquire: every item's writes are visible).
    while (done_[p].load(std::memory_order_acquire) < n) cpu_relax();
  }
}

void HostPool::join() {
  if (pass_ == nullptr) return;
  work();
  // Every worker must be out of this pass before its counters are reset for the next one. A
  // sleeping worker is woken by submit; the notify is repeated here now and then, so that a
  // missed wake-up could only cost time.
  for (uint32_t spins = 1; left_.load(std::memory_order_acquire) < workers(); ++spins) {
    cpu_relax();
    if (spins % 65536 == 0) generation_.notify_all();
  }
  pass_ = nullptr;
}

void HostPool::worker_loop() {
  using clock = std::chrono::steady_clock;
  const auto idle = std::chrono::duration<double, std::milli>(kIdleSpinMs);
  uint32_t seen = 0;  // workers start before any submit (the constructor)
  for (;;) {
    const clock::time_point since = clock::now();
    uint32_t g;
    for (uint32_t spins = 1; (g = generation_.load(std::memory_order_acquire)) == seen; ++spins) {
      cpu_relax();
      if (spins % 1024 == 0 && clock::now() - since > idle) generation_.wait(seen, std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load(std::memory_order_relaxed)) return;
    work();
    left_.fetch_add(1, std::memory_order_release);
  }
}

}  // namespace qwen36::cpu
