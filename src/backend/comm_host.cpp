// Host communicator: the ranks are threads of one process meeting at a barrier. An all-reduce
// is three phases — every rank stages its tensor; rank r sums column chunk r over the ranks in
// order 0..n-1 into a shared result; every rank copies the result back — each ended by the
// barrier. The order of the additions is fixed, so every rank gets the same bits, run to run.
#include <algorithm>
#include <condition_variable>
#include <mutex>

#include "backend/comm.h"
#include "core/error.h"

namespace qwen36 {

namespace {

struct HostGroup {
  explicit HostGroup(int ranks) : n(ranks), staged(size_t(ranks)), sizes(size_t(ranks)) {}
  const int n;
  std::mutex m;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  bool aborted = false;
  std::vector<std::vector<float>> staged;  // [rank] the rank's input
  std::vector<int64_t> sizes;              // [rank] element count of its input
  std::vector<float> result;

  // Returns when all n ranks have arrived; throws once any rank has aborted.
  void barrier() {
    std::unique_lock lk(m);
    QWEN36_CHECK(!aborted, "tensor parallel: another rank failed");
    const uint64_t gen = generation;
    if (++arrived == n) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    cv.wait(lk, [&] { return generation != gen || aborted; });
    QWEN36_CHECK(generation != gen, "tensor parallel: another rank failed");
  }
  void abort() {
    std::lock_guard lk(m);
    aborted = true;
    cv.notify_all();
  }
};

class HostComm final : public Comm {
 public:
  HostComm(std::shared_ptr<HostGroup> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->n; }
  void abort() override { g_->abort(); }

  void all_reduce_sum(Backend& b, Tensor& x) override {
    QWEN36_CHECK(x.dtype == DType::F32, "all_reduce_sum: {} is not f32", x.shape_str());
    HostGroup& g = *g_;
    const int64_t n = x.numel();
    std::vector<float>& mine = g.staged[size_t(rank_)];
    mine.resize(size_t(n));
    b.copy_to_host(x, mine.data());
    g.sizes[size_t(rank_)] = n;
    if (rank_ == 0) g.result.resize(size_t(n));  // nobody reads it before the barrier
    g.barrier();
    for (int r = 0; r < g.n; ++r)
      QWEN36_CHECK(g.sizes[size_t(r)] == n, "all_reduce_sum: rank {} has {} elements, rank {} has {}", r,
                   g.sizes[size_t(r)], rank_, n);
    const int64_t chunk = (n + g.n - 1) / g.n, lo = std::min(n, rank_ * chunk), hi = std::min(n, lo + chunk);
    float* out = g.result.data();
    std::copy(g.staged[0].begin() + lo, g.staged[0].begin() + hi, out + lo);
    for (int r = 1; r < g.n; ++r) {
      const float* in = g.staged[size_t(r)].data();
      for (int64_t i = lo; i < hi; ++i) out[i] += in[i];
    }
    g.barrier();
    b.copy_from_host(out, x);
    g.barrier();  // the staging and result buffers are free for the next call
  }

 private:
  std::shared_ptr<HostGroup> g_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Comm>> make_host_comms(int n) {
  QWEN36_CHECK(n >= 1, "a communicator group needs at least one rank, not {}", n);
  auto g = std::make_shared<HostGroup>(n);
  std::vector<std::unique_ptr<Comm>> comms;
  for (int r = 0; r < n; ++r) comms.push_back(std::make_unique<HostComm>(g, r));
  return comms;
}

}  // namespace qwen36
