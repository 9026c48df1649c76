#pragma once
// defines: cpu::HostPool, worker threads that run a MoePass while the thread that submitted it
// goes on with other work (expert offload's decode pipeline: Model::host_moe_experts queues the
// device's work of the layer and of the next one while the host computes its experts).
//
// A decode pass is ~0.2 ms, so the workers spin between passes instead of sleeping (a futex
// wake-up of 15 threads would be a good part of that); after kIdleSpin without a pass they
// sleep until the next one. OpenMP cannot do this: a parallel region holds its caller.

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_moe_pass.h"

namespace qwen36::cpu {

class HostPool {
 public:
  explicit HostPool(int workers);  // workers ≥ 1; the submitting thread joins in at join()
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // Starts the pass on the workers and returns at once. The pass must stay alive and its
  // inputs unchanged until join() returns; one pass at a time. With a signal, whichever thread
  // finishes the pass's last item stores `value` there (release): the device may wait for it
  // (Backend::wait_host_signal) while the submitting thread is itself held by the device in a
  // driver call, so the pass completes and raises it without that thread.
  void submit(MoePass& pass, std::atomic<uint64_t>* signal = nullptr, uint64_t value = 0);
  // Takes items of the submitted pass too until it is done, and until every worker has left
  // it. No-op without a pass in flight.
  void join();
  bool busy() const { return pass_ != nullptr; }
  int workers() const { return int(threads_.size()); }

  static constexpr double kIdleSpinMs = 2.0;

 private:
  void worker_loop();
  void work();  // the submitted pass's phases, items taken one at a time

  std::vector<std::thread> threads_;
  MoePass* pass_ = nullptr;
  std::atomic<uint64_t>* signal_ = nullptr;
  int last_phase_ = 0;  // the pass's last phase with items: its last item raises the signal
  uint64_t value_ = 0;
  // Bumped by submit (the workers wait for a change) and by the destructor, with stop_ set.
  std::atomic<uint32_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> next_[MoePass::kPhases] = {}, done_[MoePass::kPhases] = {};
  std::atomic<int> left_{0};  // workers done with the current pass
};

}  // namespace qwen36::cpu
