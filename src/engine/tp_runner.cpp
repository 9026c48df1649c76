// Tensor-parallel group of one process: rank 0 is the caller's thread, ranks 1..N-1 are
// worker threads that each own their backend, model shard and state mirrors for their whole
// life (a CUDA backend is bound to the thread that made it). A pass posts the same job to
// every worker and runs rank 0's part meanwhile; the ranks synchronise only inside the
// all-reduces. A failure on any rank aborts the communicators, so no rank waits forever for
// it, and leaves the group unusable (every later pass throws).
#include "engine/tp_runner.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <thread>

#include "backend/comm.h"
#include "core/error.h"
#include "core/log.h"

#ifdef QWEN36_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#ifdef QWEN36_HAVE_NCCL
#include "backend/cuda/comm_nccl.h"
#endif

namespace qwen36 {

namespace {

// What a mirror copies from rank 0's state.
struct StateShape {
  int32_t slots = 0;
  int64_t capacity = 0;
  bool mtp = false;
  DType kv = DType::F32;
  bool operator==(const StateShape&) const = default;
};

class TpGroup final : public ModelPeers {
 public:
  struct Worker {
    int rank = 0;
    std::thread thread;
    std::mutex m;
    std::condition_variable cv;
    std::function<void()> job;
    bool has_job = false, quit = false;
    std::exception_ptr error;
    // Used by the worker thread only (and by the leader between passes).
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Model> model;
    Comm* comm = nullptr;
    struct Mirror {
      const ModelState* leader = nullptr;
      StateShape shape;
      std::unique_ptr<ModelState> state;
      std::vector<bool> started;  // [slot] a sequence began at position 0 through this model
      uint64_t used = 0;
    };
    std::vector<Mirror> mirrors;
    uint64_t clock = 0;

    ModelState& mirror(const ModelState& lead, const StateShape& shape, int32_t spec_tokens,
                       std::span<const SeqRun> runs);
  };

  explicit TpGroup(int workers) {
    for (int r = 1; r <= workers; ++r) {
      auto w = std::make_unique<Worker>();
      w->rank = r;
      Worker* wp = w.get();
      w->thread = std::thread([wp] { loop(*wp); });
      workers_.push_back(std::move(w));
    }
  }
  ~TpGroup() override {
    for (auto& w : workers_) {
      {
        std::lock_guard lk(w->m);
        w->quit = true;
      }
      w->cv.notify_all();
      w->thread.join();
    }
  }

  std::vector<std::unique_ptr<Worker>>& workers() { return workers_; }
  std::vector<std::unique_ptr<Comm>> comms;  // [rank]

  // job(worker) on every worker while local() runs here; rethrows the first failure.
  void all(const std::function<void(Worker&)>& job, const std::function<void()>& local) {
    for (auto& w : workers_) {
      Worker* wp = w.get();
      std::lock_guard lk(wp->m);
      wp->job = [&job, wp] {
        try {
          job(*wp);
        } catch (...) {
          if (wp->comm) wp->comm->abort();  // rank 0 may be waiting in an all-reduce for this rank
          throw;
        }
      };
      wp->has_job = true;
      wp->error = nullptr;
      wp->cv.notify_all();
    }
    std::exception_ptr err;
    try {
      local();
    } catch (...) {
      err = std::current_exception();
      abort_comms();
    }
    for (auto& w : workers_) {
      std::unique_lock lk(w->m);
      w->cv.wait(lk, [&] { return !w->has_job; });
      if (w->error && !err) err = w->error;
    }
    if (err) {
      abort_comms();
      failed_ = true;
      std::rethrow_exception(err);
    }
  }

  void run(ModelState& state, const PeerPass& pass, const std::function<void()>& local) override {
    QWEN36_CHECK(!failed_, "tensor parallel: a rank failed in an earlier pass; the model cannot be used any more");
    const StateShape shape{state.slots(), state.capacity(), state.has_mtp(), state.kv_dtype()};
    const int32_t spec = state.spec_max_tokens();
    const std::span<const SeqRun> runs = pass.kind == PeerPass::Kind::Forward ? std::span<const SeqRun>(pass.batch->runs)
                                                                               : std::span<const SeqRun>();
    all([&](Worker& w) { w.model->run_pass(pass, w.mirror(state, shape, spec, runs)); }, local);
  }

 private:
  static void loop(Worker& w) {
    std::unique_lock lk(w.m);
    for (;;) {
      w.cv.wait(lk, [&] { return w.has_job || w.quit; });
      if (w.has_job) {
        std::function<void()> job = std::move(w.job);
        lk.unlock();
        std::exception_ptr err;
        try {
          job();
        } catch (...) {
          err = std::current_exception();
        }
        lk.lock();
        w.error = err;
        w.has_job = false;
        w.cv.notify_all();
      } else {
        break;
      }
    }
    lk.unlock();
    // Everything device-bound is released on the thread that made it.
    w.mirrors.clear();
    w.model.reset();
    w.backend.reset();
  }
  void abort_comms() {
    for (auto& c : comms)
      if (c) c->abort();
  }

  std::vector<std::unique_ptr<Worker>> workers_;
  bool failed_ = false;
};

// Mirrors live as long as the group: the peers cannot see rank 0's state die, so the least
// recently used ones beyond kMaxMirrors are dropped (a dropped state that comes back fails
// loudly below rather than running on stale caches).
constexpr size_t kMaxMirrors = 2;

ModelState& TpGroup::Worker::mirror(const ModelState& lead, const StateShape& shape, int32_t spec_tokens,
                                    std::span<const SeqRun> runs) {
  auto it = std::find_if(mirrors.begin(), mirrors.end(), [&](const Mirror& x) { return x.leader == &lead; });
  if (it != mirrors.end() && !(it->shape == shape)) {  // a new state at the address of a dead one
    mirrors.erase(it);
    it = mirrors.end();
  }
  if (it == mirrors.end()) {
    if (mirrors.size() >= kMaxMirrors)
      mirrors.erase(std::min_element(mirrors.begin(), mirrors.end(),
                                     [](const Mirror& a, const Mirror& b) { return a.used < b.used; }));
    Mirror x;
    x.leader = &lead;
    x.shape = shape;
    x.state = std::make_unique<ModelState>(*backend, model->config(), shape.slots, shape.capacity, shape.mtp, shape.kv);
    x.started.assign(size_t(shape.slots), false);
    mirrors.push_back(std::move(x));
    it = mirrors.end() - 1;
  }
  it->used = ++clock;
  ModelState& s = *it->state;
  if (spec_tokens > s.spec_max_tokens()) s.enable_speculation(spec_tokens);
  for (const SeqRun& r : runs) {
    if (r.slot < 0 || r.slot >= shape.slots) continue;  // Model::forward reports it
    if (r.pos0 == 0) {
      s.reset_slot(r.slot);
      it->started[size_t(r.slot)] = true;
    }
    QWEN36_CHECK(it->started[size_t(r.slot)],
                 "tensor parallel: slot {} continues at position {} but its sequence did not start at position 0 "
                 "through this model (a restored state snapshot is not supported with tensor parallelism)",
                 r.slot, r.pos0);
  }
  return s;
}

}  // namespace

std::vector<double> parse_tensor_split(const std::string& s) {
  std::vector<double> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    QWEN36_CHECK(!item.empty() && end && *end == '\0' && v > 0 && v < 1e6,
                 "--tensor-split: \"{}\" is not a positive number", item);
    out.push_back(v);
  }
  QWEN36_CHECK(!out.empty(), "--tensor-split: no ratios in \"{}\"", s);
  return out;
}

std::unique_ptr<Backend> make_rank_backend(const std::string& name, [[maybe_unused]] int rank, int threads) {
  if (name == "cpu") return make_cpu_backend(threads);
#ifdef QWEN36_HAVE_CUDA
  if (name == "cuda") {
    CudaOptions o;
    o.device = rank;
    return make_cuda_backend(o);
  }
#endif
  fail("tensor parallel: no backend \"{}\" in this build", name);
}

std::unique_ptr<Model> make_tp_model(const ModelConfig& config, const TpOptions& opts, int64_t col_block,
                                     Backend& backend0, const BackendFactory& make_backend,
                                     const ShardFactory& shard_weights) {
  const std::vector<TpShard> plan = plan_tensor_parallel(config, opts.ranks, opts.split, col_block);
  const int n = opts.ranks;
  if (n == 1) return std::make_unique<Model>(shard_weights(plan[0], config), backend0);
  const bool cuda = backend0.name() == "cuda";
#ifndef QWEN36_HAVE_NCCL
  QWEN36_CHECK(!cuda, "tensor parallelism on CUDA needs NCCL, which this build lacks");
#endif

  auto group = std::make_shared<TpGroup>(n - 1);
  std::unique_ptr<Model> model0;
  // Phase 1: every rank's backend and shard (where a failure is likeliest: memory, weights).
  group->all(
      [&](TpGroup::Worker& w) {
        w.backend = make_backend(w.rank);
        const TpShard& s = plan[size_t(w.rank)];
        w.model = std::make_unique<Model>(shard_weights(s, shard_config(config, s)), *w.backend);
      },
      [&] { model0 = std::make_unique<Model>(shard_weights(plan[0], shard_config(config, plan[0])), backend0); });
  // Phase 2: the communicators, every rank joining at once.
  group->comms.resize(size_t(n));
  if (!cuda) {
    group->comms = make_host_comms(n);
  } else {
#ifdef QWEN36_HAVE_NCCL
    const std::string id = nccl_unique_id();
    group->all([&](TpGroup::Worker& w) { group->comms[size_t(w.rank)] = make_nccl_comm(id, w.rank, n); },
               [&] { group->comms[0] = make_nccl_comm(id, 0, n); });
#endif
  }
  for (auto& w : group->workers()) {
    w->comm = group->comms[size_t(w->rank)].get();
    w->model->set_comm(w->comm);
  }
  model0->set_comm(group->comms[0].get());
  model0->set_peers(group);
  spdlog::info("tensor parallel: {} ranks ({} backend); rank 0 holds {}", n, backend0.name(), model0->config().summary());
  return model0;
}

std::unique_ptr<Model> make_tp_model(const ModelWeights& full, const TpOptions& opts, Backend& backend0,
                                     const BackendFactory& make_backend) {
  return make_tp_model(full.config, opts, column_block(full), backend0, make_backend,
                       [&](const TpShard& s, const ModelConfig&) { return shard_weights(full, s); });
}

}  // namespace qwen36
