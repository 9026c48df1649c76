// Tensor-parallel group. In each process the calling thread runs the process's first local
// rank and worker threads the others, each owning its backend, model shard and state mirrors
// for its whole life (a CUDA backend is bound to the thread that made it). Process 0's first
// rank is rank 0: its Model is the one the engine drives. A pass is sent to the other
// processes (tp_remote.h), posted to the local workers, and run by rank 0 meanwhile; the
// ranks synchronise only inside the all-reduces. A failure on any rank aborts the local
// communicators, so that no local rank waits forever for it, and leaves the group unusable.
#include "engine/tp_runner.h"

#include <fmt/format.h>
#include <poll.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>

#include "backend/comm.h"
#include "core/error.h"
#include "engine/tp_remote.h"

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
  DType state = DType::F32;  // the DeltaNet recurrent state's element type
  bool operator==(const StateShape&) const = default;
};

// Mirrors live as long as the group: the peers cannot see rank 0's state die, so the least
// recently used ones beyond kMaxMirrors are dropped (a dropped state that comes back fails
// loudly in mirror() rather than running on stale caches).
constexpr size_t kMaxMirrors = 2;

// One rank of this process: a worker thread, or (thread empty) the calling thread's rank.
struct Rank {
  int rank = 0;  // global rank
  std::thread thread;
  std::mutex m;
  std::condition_variable cv;
  std::function<void()> job;
  bool has_job = false, quit = false;
  std::exception_ptr error;
  // Used by the rank's own thread only (and by the group between passes).
  std::unique_ptr<Backend> own_backend;
  Backend* backend = nullptr;
  std::unique_ptr<Model> model;  // none for process 0's first rank: that Model is the caller's
  Comm* comm = nullptr;
  struct Mirror {
    uint64_t key = 0;  // rank 0's ModelState
    StateShape shape;
    std::unique_ptr<ModelState> state;
    std::vector<bool> started;  // [slot] a sequence began at position 0 through this model
    uint64_t used = 0;
  };
  std::vector<Mirror> mirrors;
  uint64_t clock = 0;

  ModelState& mirror(uint64_t key, const StateShape& shape, int32_t spec_tokens, std::span<const SeqRun> runs);
};

ModelState& Rank::mirror(uint64_t key, const StateShape& shape, int32_t spec_tokens, std::span<const SeqRun> runs) {
  auto it = std::find_if(mirrors.begin(), mirrors.end(), [&](const Mirror& x) { return x.key == key; });
  if (it != mirrors.end() && !(it->shape == shape)) {  // a new state at the address of a dead one
    mirrors.erase(it);
    it = mirrors.end();
  }
  if (it == mirrors.end()) {
    if (mirrors.size() >= kMaxMirrors)
      mirrors.erase(std::min_element(mirrors.begin(), mirrors.end(),
                                     [](const Mirror& a, const Mirror& b) { return a.used < b.used; }));
    Mirror x;
    x.key = key;
    x.shape = shape;
    x.state = std::make_unique<ModelState>(*backend, model->config(), shape.slots, shape.capacity, shape.mtp, shape.kv,
                                           shape.state);
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

class TpGroup final : public ModelPeers {
 public:
  // The ranks of this process: `first` (the calling thread's) and `count - 1` worker threads.
  TpGroup(int first, int count) {
    for (int i = 0; i < count; ++i) {
      auto r = std::make_unique<Rank>();
      r->rank = first + i;
      if (i > 0) {
        Rank* rp = r.get();
        r->thread = std::thread([rp] { loop(*rp); });
      }
      ranks_.push_back(std::move(r));
    }
  }
  ~TpGroup() override {
    stop_watchdog();
    if (link_ && leader_) {
      try {
        link_->send_all(encode_shutdown());
      } catch (const std::exception& e) {
        spdlog::warn("tensor parallel: {}", e.what());
      }
    }
    for (auto& r : ranks_) {
      if (!r->thread.joinable()) continue;
      {
        std::lock_guard lk(r->m);
        r->quit = true;
      }
      r->cv.notify_all();
      r->thread.join();
    }
    ranks_[0]->mirrors.clear();  // the calling thread's rank
    ranks_[0]->model.reset();
    // The worker ranks' backends are gone (and their recordings with them); the calling thread's
    // backend outlives the group, and its recorded decode steps hold the communicators, whose
    // destruction (next) would otherwise wait for them forever.
    if (ranks_[0]->backend) ranks_[0]->backend->drop_recordings();
  }

  Rank& self() { return *ranks_[0]; }
  std::vector<std::unique_ptr<Rank>>& ranks() { return ranks_; }
  std::vector<std::unique_ptr<Comm>> comms;  // this process's ranks, in ranks() order

  // Process 0 with other processes: every pass goes to them first; a watchdog aborts the
  // local communicators when one of them drops its connection mid-run.
  void attach_link(std::unique_ptr<TpLink> link, bool leader) {
    link_ = std::move(link);
    leader_ = leader;
  }
  TpLink* link() { return link_.get(); }
  void start_watchdog(std::vector<int> fds) {
    watchdog_ = std::thread([this, fds] {
      std::vector<pollfd> p;
      for (int fd : fds) p.push_back({fd, POLLRDHUP, 0});
      while (!stop_.load()) {
        if (::poll(p.data(), p.size(), 200) > 0) {
          spdlog::error("tensor parallel: another process closed its connection; aborting the collectives");
          abort_comms();
          return;
        }
      }
    });
  }

  // job(rank) on every worker while local() runs here; rethrows the first failure.
  void all(const std::function<void(Rank&)>& job, const std::function<void()>& local) {
    for (size_t i = 1; i < ranks_.size(); ++i) {
      Rank* rp = ranks_[i].get();
      std::lock_guard lk(rp->m);
      rp->job = [&job, rp] {
        try {
          job(*rp);
        } catch (...) {
          if (rp->comm) rp->comm->abort();  // the other ranks may be waiting for this one in an all-reduce
          throw;
        }
      };
      rp->has_job = true;
      rp->error = nullptr;
      rp->cv.notify_all();
    }
    std::exception_ptr err;
    try {
      local();
    } catch (...) {
      err = std::current_exception();
      abort_comms();
    }
    for (size_t i = 1; i < ranks_.size(); ++i) {
      Rank& r = *ranks_[i];
      std::unique_lock lk(r.m);
      r.cv.wait(lk, [&] { return !r.has_job; });
      if (r.error && !err) err = r.error;
    }
    if (err) {
      abort_comms();
      failed_ = true;
      std::rethrow_exception(err);
    }
  }

  void run(ModelState& state, const PeerPass& pass, const std::function<void()>& local) override {
    QWEN36_CHECK(!failed_, "tensor parallel: a rank failed in an earlier pass; the model cannot be used any more");
    if (link_) link_->send_all(encode_pass(pass, state));
    run_keyed(reinterpret_cast<uintptr_t>(&state),
              {state.slots(), state.capacity(), state.has_mtp(), state.kv_dtype(), state.state_dtype()},
              state.spec_max_tokens(), pass, local);
  }

  // A pass on this process's ranks; local() is the calling thread's part.
  void run_keyed(uint64_t key, const StateShape& shape, int32_t spec, const PeerPass& pass,
                 const std::function<void()>& local) {
    const std::span<const SeqRun> runs =
        pass.kind == PeerPass::Kind::Forward ? std::span<const SeqRun>(pass.batch->runs) : std::span<const SeqRun>();
    all([&](Rank& r) { r.model->run_pass(pass, r.mirror(key, shape, spec, runs)); }, local);
  }

  void abort_comms() {
    for (auto& c : comms)
      if (c) c->abort();
  }

 private:
  static void loop(Rank& r) {
    std::unique_lock lk(r.m);
    for (;;) {
      r.cv.wait(lk, [&] { return r.has_job || r.quit; });
      if (!r.has_job) break;
      std::function<void()> job = std::move(r.job);
      lk.unlock();
      std::exception_ptr err;
      try {
        job();
      } catch (...) {
        err = std::current_exception();
      }
      lk.lock();
      r.error = err;
      r.has_job = false;
      r.cv.notify_all();
    }
    lk.unlock();
    // Everything device-bound is released on the thread that made it.
    r.mirrors.clear();
    r.model.reset();
    r.own_backend.reset();
  }
  void stop_watchdog() {
    stop_.store(true);
    if (watchdog_.joinable()) watchdog_.join();
  }

  std::vector<std::unique_ptr<Rank>> ranks_;
  std::unique_ptr<TpLink> link_;
  bool leader_ = false;
  bool failed_ = false;
  std::thread watchdog_;
  std::atomic<bool> stop_{false};
};

// Everything processes of one group must agree on, hashed (FNV-1a).
uint64_t group_fingerprint(const ModelConfig& c, const TpOptions& o, int64_t col_block) {
  std::string s = fmt::format("{}|{}|{}|{}", c.summary(), o.ranks, col_block, o.expert_parallel);
  for (double r : o.split) s += fmt::format("|{}", r);
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

// A follower process: replays process 0's passes until it shuts the group down.
void follow(TpGroup& g, TpLink& link, Model& model) {
  for (;;) {
    std::string bytes;
    try {
      bytes = link.recv();
    } catch (...) {
      g.abort_comms();  // this process's ranks may still be waiting in a collective for process 0
      throw;
    }
    const TpMessage msg = decode_message(bytes);
    if (msg.kind == TpMessage::Kind::Shutdown) return;
    const PeerPass pass = msg.view();
    const StateShape shape{msg.slots, msg.capacity, msg.mtp, msg.kv, msg.state};
    Rank& self = g.self();
    const std::span<const SeqRun> runs =
        pass.kind == PeerPass::Kind::Forward ? std::span<const SeqRun>(pass.batch->runs) : std::span<const SeqRun>();
    g.run_keyed(msg.state_key, shape, msg.spec_tokens, pass,
                [&] { model.run_pass(pass, self.mirror(msg.state_key, shape, msg.spec_tokens, runs)); });
  }
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

std::unique_ptr<Backend> make_rank_backend(const std::string& name, [[maybe_unused]] int device, int threads) {
  if (name == "cpu") return make_cpu_backend(threads);
#ifdef QWEN36_HAVE_CUDA
  if (name == "cuda") {
    CudaOptions o;
    o.device = device;
    return make_cuda_backend(o);
  }
#endif
  fail("tensor parallel: no backend \"{}\" in this build", name);
}

int tp_first_local_device(int ranks) {
  const TpProcessEnv env = tp_process_env();
  return env.world > 1 && ranks % env.world == 0 ? env.local_rank * (ranks / env.world) : 0;
}

std::unique_ptr<Model> make_tp_model(const ModelConfig& config, const TpOptions& opts, int64_t col_block,
                                     Backend& backend0, const BackendFactory& make_backend,
                                     const ShardFactory& shard_weights) {
  const std::vector<TpShard> plan =
      plan_tensor_parallel(config, opts.ranks, opts.split, col_block, opts.expert_parallel);
  const int n = opts.ranks;
  const TpProcessEnv env = tp_process_env();
  if (n == 1 && env.world == 1) return std::make_unique<Model>(shard_weights(plan[0], config), backend0);
  const bool cuda = backend0.name() == "cuda";
#ifndef QWEN36_HAVE_NCCL
  QWEN36_CHECK(!cuda, "tensor parallelism on CUDA needs NCCL, which this build lacks");
#endif
  QWEN36_CHECK(env.world == 1 || cuda,
               "a multi-process launch (world size {}) needs the CUDA backend: the processes' ranks meet in NCCL",
               env.world);
  QWEN36_CHECK(n % env.world == 0, "-tp {} over {} processes: every process must drive the same number of ranks", n,
               env.world);
  const int local = n / env.world, first = env.rank * local, dev0 = env.local_rank * local;
  const bool leader = env.rank == 0;

  auto group = std::make_shared<TpGroup>(first, local);
  std::string nccl_id;
  if (env.world > 1) {
    const char* t = std::getenv("QWEN36_TP_TIMEOUT");
    const int timeout = t && *t ? std::atoi(t) : 600;
    spdlog::info("tensor parallel: process {} of {}, ranks {}..{} on devices {}..{}; {} {}:{}", env.rank, env.world,
                 first, first + local - 1, dev0, dev0 + local - 1, leader ? "listening on" : "connecting to",
                 leader ? "*" : env.master_addr, env.master_port);
    auto link = TpLink::open(env, std::chrono::seconds(timeout > 0 ? timeout : 600));
    const uint64_t fp = group_fingerprint(config, opts, col_block);
#ifdef QWEN36_HAVE_NCCL
    if (leader) nccl_id = nccl_unique_id();
#endif
    if (leader) {
      link->send_all(std::string(reinterpret_cast<const char*>(&fp), sizeof(fp)) + nccl_id);
    } else {
      const std::string hello = link->recv();
      QWEN36_CHECK(hello.size() > sizeof(fp) && std::memcmp(hello.data(), &fp, sizeof(fp)) == 0,
                   "tensor parallel: process {} was started with another model, -tp or --tensor-split than process 0",
                   env.rank);
      nccl_id = hello.substr(sizeof(fp));
    }
    group->attach_link(std::move(link), leader);
  }

  std::unique_ptr<Model> model0;  // the calling thread's rank
  group->self().backend = &backend0;
  // Phase 1: every rank's backend and shard (where a failure is likeliest: memory, weights).
  group->all(
      [&](Rank& r) {
        r.own_backend = make_backend(dev0 + (r.rank - first));
        r.backend = r.own_backend.get();
        const TpShard& s = plan[size_t(r.rank)];
        r.model = std::make_unique<Model>(shard_weights(s, shard_config(config, s)), *r.backend);
      },
      [&] {
        const TpShard& s = plan[size_t(first)];
        model0 = std::make_unique<Model>(shard_weights(s, shard_config(config, s)), backend0);
      });
  // Phase 2: the communicators, every rank joining at once.
  if (!cuda) {
    group->comms = make_host_comms(n);
  } else {
#ifdef QWEN36_HAVE_NCCL
    if (nccl_id.empty()) nccl_id = nccl_unique_id();
    group->comms.resize(size_t(local));
    group->all([&](Rank& r) { group->comms[size_t(r.rank - first)] = make_nccl_comm(nccl_id, r.rank, n); },
               [&] { group->comms[0] = make_nccl_comm(nccl_id, first, n); });
#endif
  }
  for (auto& r : group->ranks()) {
    r->comm = group->comms[size_t(r->rank - first)].get();
    if (r->model) r->model->set_comm(r->comm);
  }
  model0->set_comm(group->comms[0].get());
  spdlog::info("tensor parallel: {} ranks ({} backend); rank {} holds {}", n, backend0.name(), first,
               model0->config().summary());
  if (!leader) {  // serve process 0's passes, then hand back nothing to run
    group->self().model = std::move(model0);
    follow(*group, *group->link(), *group->self().model);
    return nullptr;
  }
  if (group->link()) group->start_watchdog(group->link()->fds());
  model0->set_peers(group);
  return model0;
}

std::unique_ptr<Model> make_tp_model(const ModelWeights& full, const TpOptions& opts, Backend& backend0,
                                     const BackendFactory& make_backend) {
  return make_tp_model(full.config, opts, column_block(full), backend0, make_backend,
                       [&](const TpShard& s, const ModelConfig&) { return shard_weights(full, s); });
}

}  // namespace qwen36
