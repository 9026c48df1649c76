// Expert offload on CUDA, streaming path (Model::host_moe_experts → stream_moe_experts):
// Backend::pin_host_memory / upload on plain and read-only mmapped host memory, and a tiny
// MoE (Q4_K_M GGUF, mmapped) whose every layer's experts are on the host and streamed to the
// GPU each pass (QWEN36_MOE_STREAM=always) against the same model resident on the GPU; the
// GPU's share of decode passes (QWEN36_MOE_DEVICE_SHARE), whose host part computes what the GPU
// would; and the decode pipeline.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/scoped_env.h"
#include "format/model_loader.h"
#include "gpu_test_util.h"
#include "model/expert_placement.h"
#include "model/presets.h"
#include "model/qwen36.h"
#include "model/random_quant_weights.h"

namespace qwen36::gputest {
namespace {

namespace fs = std::filesystem;

class CudaOffload : public CudaTest {};

// n floats in whole pages of their own (mmap), for host memory a test registers with the driver.
class PageFloats {
 public:
  PageFloats(size_t n, float v) : n_(n), bytes_((n * sizeof(float) + 4095) / 4096 * 4096) {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    p_ = static_cast<float*>(p);
    std::fill(p_, p_ + n_, v);
  }
  ~PageFloats() { munmap(p_, bytes_); }
  PageFloats(const PageFloats&) = delete;
  PageFloats& operator=(const PageFloats&) = delete;
  float* data() { return p_; }
  size_t size() const { return n_; }
  float* begin() { return p_; }
  float* end() { return p_ + n_; }
  float& operator[](size_t i) { return p_[i]; }

 private:
  size_t n_, bytes_;
  float* p_;
};

std::vector<uint8_t> to_host(Backend& b, void* dev, size_t n) {
  std::vector<uint8_t> v(n);
  b.copy_to_host(Tensor(dev, DType::U8, {int64_t(n)}), v.data());
  return v;
}

// Uploads from unaligned offsets of a malloc'd buffer (pinned twice over overlapping ranges:
// only the new pages are registered) and of a pageable buffer land byte-exact, in stream order
// with a following upload to the same place; unpin then pin again works.
TEST_F(CudaOffload, PinAndUpload) {
  std::vector<uint8_t> host((size_t(3) << 20) + 777), other(size_t(1) << 20);
  std::mt19937 rng(7);
  for (uint8_t& b : host) b = uint8_t(rng());
  for (uint8_t& b : other) b = uint8_t(rng());
  EXPECT_TRUE(gpu_->pin_host_memory(host.data() + 5, size_t(2) << 20));
  EXPECT_TRUE(gpu_->pin_host_memory(host.data() + 100000, host.size() - 100000));  // overlaps the first
  std::unique_ptr<DeviceBuffer> d = gpu_->alloc(host.size());
  auto* dp = static_cast<uint8_t*>(d->data());
  gpu_->upload(host.data() + 3, dp + 1, host.size() - 3);
  gpu_->upload(other.data(), dp + 4096, other.size());  // pageable; queued after the first, overwrites part of it
  std::vector<uint8_t> want(host.size(), 0);
  std::copy(host.begin() + 3, host.end(), want.begin() + 1);
  std::copy(other.begin(), other.end(), want.begin() + 4096);
  const std::vector<uint8_t> got = to_host(*gpu_, dp, host.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << "first wrong byte at " << first;
  gpu_->unpin_host_memory(host.data(), host.size());
  EXPECT_TRUE(gpu_->pin_host_memory(host.data(), host.size()));
  gpu_->unpin_host_memory(host.data(), host.size());
  // Pinned for the device to write too (Model's routing staging): copies land there and go back.
  std::vector<uint8_t> back(host.size(), 0);
  EXPECT_TRUE(gpu_->pin_host_memory(back.data(), back.size(), /*device_writes=*/true));
  gpu_->copy_to_host(Tensor(dp, DType::U8, {int64_t(back.size())}), back.data());
  EXPECT_TRUE(back == want);
  gpu_->upload(back.data() + 1, dp, back.size() - 1);
  EXPECT_TRUE(to_host(*gpu_, dp + 0, 4096) == std::vector<uint8_t>(want.begin() + 1, want.begin() + 4097));
  gpu_->unpin_host_memory(back.data(), back.size());
}

// Backend::wait_host_signal holds the ops queued after it (an upload from page-locked memory)
// until the host raises the signal, so they read what the host wrote after queuing them; and a
// thread held in a copy to the host (it waits for the stream) is let go when another raises it.
TEST_F(CudaOffload, HostSignalHoldsQueuedWork) {
  std::atomic<uint64_t>* signal = gpu_->host_signal();
  ASSERT_NE(signal, nullptr);
  // Whole pages of its own: registration is by page, and a heap vector's pages may hold other
  // allocations (the copies into `got` below then straddle registered and unregistered memory,
  // which CUDA refuses with cudaErrorInvalidValue: seen once, after other tests had shaped the heap).
  PageFloats host(4096, 1.0f);
  ASSERT_TRUE(gpu_->pin_host_memory(host.data(), host.size() * sizeof(float)));
  std::unique_ptr<DeviceBuffer> d = gpu_->alloc(host.size() * sizeof(float));
  uint64_t v = signal->load() + 1;
  gpu_->wait_host_signal(v);
  gpu_->upload(host.data(), d->data(), host.size() * sizeof(float));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::fill(host.begin(), host.end(), 2.0f);
  signal->store(v, std::memory_order_release);
  std::vector<float> got(host.size());
  gpu_->copy_to_host(Tensor(d->data(), DType::F32, {int64_t(got.size())}), got.data());
  EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](float x) { return x == 2.0f; }));
  v = signal->load() + 1;
  gpu_->wait_host_signal(v);
  gpu_->upload(host.data(), d->data(), sizeof(float));
  std::thread raiser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    host[0] = 3.0f;
    signal->store(v, std::memory_order_release);
  });
  gpu_->copy_to_host(Tensor(d->data(), DType::F32, {1}), got.data());
  raiser.join();
  EXPECT_EQ(got[0], 3.0f);
  gpu_->unpin_host_memory(host.data(), host.size() * sizeof(float));
}

// The tiny MoE written as a Q4_K_M GGUF (read-only private mapping when loaded).
std::string tiny_moe_gguf(ModelConfig* cfg) {
  ModelConfig c = model_preset("tiny-moe", 4);
  c.vocab_size = 4096;
  c.validate();
  *cfg = c;
  const std::string path = (std::filesystem::temp_directory_path() / "qwen36_test_cuda_offload_q4km.gguf").string();
  gen_model_file(c, QuantMix::Q4_K_M, path, 23, false);
  return path;
}

// Prefill logits of every row of an 80-token prompt, then 4 decode steps (greedy).
std::vector<float> run(Model& m, Backend& be, const ModelConfig& c) {
  const int64_t V = c.vocab_size, P = 80;
  std::vector<int32_t> prompt(static_cast<size_t>(P));
  std::mt19937 rng(11);
  for (int32_t& t : prompt) t = int32_t(rng() % uint32_t(V));
  ModelState st(be, c, 1, 128, false);
  std::vector<float> out(size_t(P * V));
  m.forward(ForwardBatch::single(prompt, 0, 0, true), st, out.data());
  std::vector<float> row(static_cast<size_t>(V));
  int32_t tok = int32_t(std::max_element(out.end() - V, out.end()) - (out.end() - V));
  for (int32_t i = 0; i < 4; ++i) {
    const int32_t one[1] = {tok};
    m.forward(ForwardBatch::single(one, int32_t(P) + i, 0), st, row.data());
    out.insert(out.end(), row.begin(), row.end());
    tok = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
  }
  return out;
}

// The tiny MoE file and the placement of every layer's routed experts on the host.
struct HostPlaced {
  ModelConfig c;
  std::string path;
  ExpertPlacement all;
};
HostPlaced host_placed() {
  HostPlaced h;
  h.path = tiny_moe_gguf(&h.c);
  PlacementOptions o;
  o.cpu_moe = true;
  h.all = resolve_expert_placement(h.c, o);
  return h;
}

// run() on the model at `path` on a fresh CUDA backend, its routed experts placed by `place`
// (null: all on the GPU).
std::vector<float> run_placed(const std::string& path, const ModelConfig& c, const ExpertPlacement* place) {
  std::unique_ptr<Backend> be = make_cuda_backend();
  Model m(load_model_weights(path), *be, place ? *place : ExpertPlacement{});
  return run(m, *be, c);
}

// Every layer's experts on the host, streamed each pass (prefill T = 80 and decode T = 1)
// (the other path, QWEN36_MOE_EXACT=0: the exact path streams only passes above the tiled
// kernels' pair bound)
// into the staging area, against the model resident on the GPU. Both untiled
// (QWEN36_NO_TILE=1), so the very same moe_experts kernels read the very same expert bytes,
// only at other addresses: the logits should agree to f32 summation-order noise (1e-4 of the
// largest logit allows for any atomics-ordered sum; garbage or stale staging bytes are O(1)).
TEST_F(CudaOffload, StreamedExpertsMatchDeviceResident) {
  ScopedEnv no_tile("QWEN36_NO_TILE", "1"), other_path("QWEN36_MOE_EXACT", "0");
  const auto [c, path, all] = host_placed();
  const std::vector<float> want = run_placed(path, c, nullptr);
  std::vector<float> streamed;
  {
    ScopedEnv mode("QWEN36_MOE_STREAM", "always");
    streamed = run_placed(path, c, &all);
  }
  const int64_t V = c.vocab_size;
  const std::vector<float> want_pre(want.begin(), want.begin() + 80 * V), got_pre(streamed.begin(), streamed.begin() + 80 * V);
  const std::vector<float> want_dec(want.begin() + 80 * V, want.end()), got_dec(streamed.begin() + 80 * V, streamed.end());
  const double e_pre = rel_err(got_pre, want_pre), e_dec = rel_err(got_dec, want_dec);
  std::printf("[ offload ] tiny-moe Q4_K_M, all experts streamed vs resident: prefill %.3g, decode %.3g "
              "(relative to the largest logit)\n",
              e_pre, e_dec);
  EXPECT_LE(e_pre, 1e-4);
  EXPECT_LE(e_dec, 1e-4);
}

// The other path (QWEN36_MOE_EXACT=0). Host experts copied into page-locked memory at load (the default with a CUDA main backend);
// with QWEN36_MOE_DEVICE_SHARE = k − 1 each decode pass's first k − 1 routed experts are
// uploaded from there and run on the GPU, the last on the CPU. The GPU's share is the resident
// model's arithmetic, the CPU's the host path's (the same per-32 int8 activations, cpu_dot_g32.h,
// another summation order), so the host-only run's decode logits are the resident model's to
// float-order noise (3e-7 of the largest logit on the H200; with the CPU's Q8_K activations,
// before session 20, 0.05), and the shared run's lie within 1.5× that distance from both, plus 1e-4
// (stale or misplaced expert bytes are O(1) off). Prefill passes (80 tokens: streamed, the auto
// choice on both runs) equal the host-only run's. The
// exact composition is checked on the CPU (offload_test, bitwise against one backend). Prefill
// (not split; streamed or not by the same auto choice in both runs) equals the host-only run's.
TEST_F(CudaOffload, DeviceShareOfDecodePassesMatches) {
  ScopedEnv no_tile("QWEN36_NO_TILE", "1"), other_path("QWEN36_MOE_EXACT", "0");
  const auto [c, path, all] = host_placed();
  const std::vector<float> want = run_placed(path, c, nullptr);
  std::vector<float> host, shared;
  {
    ScopedEnv none("QWEN36_MOE_DEVICE_SHARE", "0");
    host = run_placed(path, c, &all);
  }
  {
    ScopedEnv share("QWEN36_MOE_DEVICE_SHARE", std::to_string(c.n_experts_per_tok - 1).c_str());
    shared = run_placed(path, c, &all);
  }
  const int64_t V = c.vocab_size;
  auto part = [&](const std::vector<float>& v, bool decode) {
    return decode ? std::vector<float>(v.begin() + 80 * V, v.end()) : std::vector<float>(v.begin(), v.begin() + 80 * V);
  };
  const double e_host = rel_err(part(host, true), part(want, true)), e_share = rel_err(part(shared, true), part(want, true));
  std::printf("[ offload ] tiny-moe Q4_K_M decode, relative to the resident model: host experts %.3g, %d of %d "
              "uploaded to the GPU %.3g\n",
              e_host, int(c.n_experts_per_tok - 1), int(c.n_experts_per_tok), e_share);
  EXPECT_TRUE(part(shared, false) == part(host, false)) << "prefill passes are not split";
  EXPECT_LE(e_host, 1e-4);
  EXPECT_LE(e_share, 1.5 * e_host + 1e-4);
  EXPECT_LE(rel_err(part(shared, true), part(host, true)), 1.5 * e_host + 1e-4);
}

// The decode pipeline (host experts on the pool's workers while the next layer is queued behind
// a device-side wait) computes what the passes in place compute: the same kernels and host
// arithmetic on the same inputs, so bitwise the same logits, with and without a device share.
// Its passes must have run (a pass count), else the comparison would be vacuous.
TEST_F(CudaOffload, PipelinedDecodeIsBitwiseInPlace) {
  const auto [c, path, all] = host_placed();
  for (const char* exact_share_c : {"10", "11", "00", "01"}) {
    const std::string exact_share = exact_share_c;  // QWEN36_MOE_EXACT, QWEN36_MOE_DEVICE_SHARE
    const std::string exact = exact_share.substr(0, 1), share = exact_share.substr(1);
    SCOPED_TRACE("QWEN36_MOE_EXACT=" + exact);
    ScopedEnv s("QWEN36_MOE_DEVICE_SHARE", share.c_str()), e("QWEN36_MOE_EXACT", exact.c_str());
    std::vector<float> in_place, piped;
    int64_t passes = 0;
    {
      ScopedEnv off("QWEN36_HOST_PIPELINE", "0");
      std::unique_ptr<Backend> be = make_cuda_backend();
      Model m(load_model_weights(path), *be, all);
      in_place = run(m, *be, c);
      EXPECT_EQ(m.pipelined_host_passes(), 0);
    }
    {
      std::unique_ptr<Backend> be = make_cuda_backend();
      Model m(load_model_weights(path), *be, all);
      piped = run(m, *be, c);
      passes = m.pipelined_host_passes();
    }
    EXPECT_EQ(passes, 4 * c.n_layers) << "share " << share;  // 4 decode steps, every layer's experts on the host
    EXPECT_TRUE(piped == in_place) << "share " << share;
  }
}

// Issue 11's bar: expert offload's outputs identical to all-GPU execution. The tiny MoE (Q4_K_M,
// its experts tiled when resident) with every layer's routed experts on the host, by the exact
// path (expert_offload.cpp: the host's rows by the tiled kernels' arithmetic, summed on the GPU
// in routing order, the shared expert folded as moe_experts_shared folds it): the prefill and
// decode logits of run() are bitwise the resident model's, with no device share, with k − 1 of
// k experts on the GPU, in place and pipelined; a 600-token prompt (1,200 pairs, above the tiled
// kernels' bound) streams its experts and takes the resident model's dequantizing path.
TEST_F(CudaOffload, ExactOffloadIsBitwiseAllGpu) {
  const auto [c, path, all] = host_placed();
  const std::vector<float> want = run_placed(path, c, nullptr);
  const int64_t V = c.vocab_size;
  for (const char* pipeline : {"1", "0"})
    for (const std::string& share : {std::string("0"), std::to_string(c.n_experts_per_tok - 1)}) {
      ScopedEnv p("QWEN36_HOST_PIPELINE", pipeline), s("QWEN36_MOE_DEVICE_SHARE", share.c_str());
      const std::vector<float> got = run_placed(path, c, &all);
      ASSERT_EQ(got.size(), want.size());
      int64_t differ = 0, first = -1;
      for (size_t i = 0; i < got.size(); ++i)
        if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && differ++ == 0) first = int64_t(i);
      std::printf("[ offload ] exact path, pipeline %s, device share %s: %lld of %zu logits differ from all-GPU\n",
                  pipeline, share.c_str(), (long long)differ, got.size());
      EXPECT_EQ(differ, 0) << "pipeline " << pipeline << " share " << share << ": first at row " << first / V
                           << " (rows 0-79 prefill, then decode)";
    }
  // Long prompt: logits of its last row and 4 decode steps.
  auto long_run = [&](const ExpertPlacement* place) {
    std::unique_ptr<Backend> be = make_cuda_backend();
    Model m(load_model_weights(path), *be, place ? *place : ExpertPlacement{});
    std::vector<int32_t> prompt(600);
    std::mt19937 rng(5);
    for (int32_t& t : prompt) t = int32_t(rng() % uint32_t(V));
    ModelState st(*be, c, 1, 640, false);
    std::vector<float> out(static_cast<size_t>(V));
    m.forward(ForwardBatch::single(prompt, 0, 0), st, out.data());
    std::vector<float> row(out);
    for (int32_t i = 0; i < 4; ++i) {
      const int32_t one[1] = {int32_t(std::max_element(row.begin(), row.end()) - row.begin())};
      m.forward(ForwardBatch::single(one, 600 + i, 0), st, row.data());
      out.insert(out.end(), row.begin(), row.end());
    }
    return out;
  };
  const std::vector<float> long_want = long_run(nullptr);
  ScopedEnv always("QWEN36_MOE_STREAM", "always");
  EXPECT_TRUE(long_run(&all) == long_want) << "600-token prompt, experts streamed";
}

// The same bar on the llama.cpp-written fixture files of the tiny MoE (tests/data/llamacpp-gguf/
// moe-a: 4 experts, top-2, a shared expert), Q8_0 / Q6_K / Q4_K_M: every routed expert on the host,
// run()'s prefill and greedy decode logits bitwise the all-GPU run's. (The bf16 files are not
// covered: bf16 experts take the host's f32 matmuls, not a twin of the GPU's bf16 kernels.)
TEST_F(CudaOffload, ExactOffloadIsBitwiseAllGpuOnFixtures) {
  const fs::path dir = fs::path(QWEN36_TEST_DATA) / "llamacpp-gguf" / "moe-a";
  for (const char* type : {"q8_0", "q6_k", "q4_k_m"}) {
    const std::string path = (dir / ("model-" + std::string(type) + ".gguf")).string();
    const ModelConfig c = load_model_weights(path).config;
    PlacementOptions o;
    o.cpu_moe = true;
    const ExpertPlacement all = resolve_expert_placement(c, o);
    ASSERT_GT(all.count(), 0) << type;
    const std::vector<float> want = run_placed(path, c, nullptr), got = run_placed(path, c, &all);
    ASSERT_EQ(got.size(), want.size()) << type;
    int64_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
    std::printf("[ offload ] moe-a %s, all experts on the host: %lld of %zu logits differ from all-GPU\n", type,
                (long long)differ, got.size());
    EXPECT_EQ(differ, 0) << type;
  }
}

}  // namespace
}  // namespace qwen36::gputest
