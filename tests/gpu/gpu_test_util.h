#pragma once
// Helpers of the GPU tests: random host tensors, upload/download through a Backend, error
// measures, and the skip-when-no-GPU fixture.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"

namespace qwen36::gputest {

// A host tensor with its own storage.
struct HostT {
  std::vector<uint8_t> bytes;
  Tensor t;
  HostT() = default;
  HostT(DType dt, std::initializer_list<int64_t> shape) {
    t = Tensor(nullptr, dt, shape);
    bytes.resize(t.nbytes());
    t.data = bytes.data();
  }
  HostT(const HostT& o) : bytes(o.bytes), t(o.t) { t.data = bytes.data(); }
  HostT& operator=(const HostT& o) {
    bytes = o.bytes;
    t = o.t;
    t.data = bytes.data();
    return *this;
  }
  float* f() { return t.as<float>(); }
  std::vector<float> floats() const {
    return std::vector<float>(t.as<const float>(), t.as<const float>() + t.numel());
  }
};

inline HostT random_t(std::mt19937& rng, DType dt, std::initializer_list<int64_t> shape, float lo = -1.0f,
                      float hi = 1.0f) {
  HostT h(dt, shape);
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < h.t.numel(); ++i) {
    const float v = u(rng);
    if (dt == DType::F32) h.t.as<float>()[i] = v;
    if (dt == DType::BF16) h.t.as<uint16_t>()[i] = f32_to_bf16(v);
    if (dt == DType::F16) h.t.as<uint16_t>()[i] = f32_to_f16(v);
  }
  return h;
}

// Seconds per replay of what run() issues, recorded once as the graph `key` and replayed reps
// times; where it could not be recorded (*kept false) run() is timed eagerly instead, so that a
// failed recording still reports a time beside the test's failure.
inline double seconds_per_replay(Backend& gpu, uint64_t key, int reps, const std::function<void()>& run,
                                 bool* kept = nullptr) {
  const bool ok = gpu.begin_capture() && (run(), gpu.end_capture(key, true));
  if (kept != nullptr) *kept = ok;
  cuda_synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r)
    if (!ok || !gpu.replay(key)) run();
  cuda_synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

// A device tensor (a backend buffer) with the shape of a host tensor.
struct DevT {
  std::unique_ptr<DeviceBuffer> buf;
  Tensor t;
};
inline DevT upload(Backend& b, const HostT& h) {
  DevT d;
  d.buf = b.alloc(h.t.nbytes());
  d.t = h.t;
  d.t.data = d.buf->data();
  b.copy_from_host(h.t.data, d.t);
  return d;
}
inline std::vector<float> download(Backend& b, const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  b.copy_to_host(t, v.data());
  return v;
}

// Backend::matmul_multi of x [T, K] over the device matrices ws (each [N_i, K]): each [T, N_i]
// output, downloaded.
inline std::vector<std::vector<float>> matmul_multi_outputs(Backend& b, const Tensor& x,
                                                           const std::vector<const Tensor*>& ws) {
  std::vector<DevT> out;
  std::vector<Tensor*> outs;
  for (const Tensor* w : ws) out.push_back(upload(b, HostT(DType::F32, {x.rows(), w->dim(0)})));
  for (DevT& o : out) outs.push_back(&o.t);
  b.matmul_multi(x, ws, outs);
  std::vector<std::vector<float>> got;
  for (const DevT& o : out) got.push_back(download(b, o.t));
  return got;
}

// The largest |got − want|, where it is, and max(1, max |want|), for reports of logits rows.
struct WorstDiff {
  double worst = 0, scale = 1;
  size_t at = 0;
};
inline WorstDiff worst_diff(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  WorstDiff w;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    w.scale = std::max(w.scale, double(std::abs(want[i])));
    if (std::abs(double(want[i]) - got[i]) > w.worst) w.worst = std::abs(double(want[i]) - got[i]), w.at = i;
  }
  return w;
}

// Rows of V logits: each row whose top two logits of `want` differ by more than `margin` has
// the same argmax in `got` (greedy picks away from near-ties).
inline void expect_same_argmax_away_from_ties(const std::vector<float>& got, const std::vector<float>& want,
                                              size_t V, double margin) {
  for (size_t r = 0; r < want.size() / V && r < got.size() / V; ++r) {
    const float* a = want.data() + r * V;
    const float* b = got.data() + r * V;
    std::vector<float> top(a, a + V);
    std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
    if (top[0] - top[1] > margin) {
      EXPECT_EQ(std::max_element(a, a + V) - a, std::max_element(b, b + V) - b) << "row " << r;
    }
  }
}

// max |got − want| / max(1, max |want|)
inline double rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0, scale = 1;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    scale = std::max(scale, double(std::abs(want[i])));
    const double d = std::abs(double(got[i]) - double(want[i]));
    worst = std::max(worst, std::isnan(d) ? 1e30 : d);
  }
  return worst / scale;
}

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_available(&why)) GTEST_SKIP() << "no CUDA device, CUDA tests skipped: " << why;
    gpu_ = make_cuda_backend();
  }
  std::unique_ptr<Backend> gpu_;
  std::mt19937 rng_{1234};
};

}  // namespace qwen36::gputest
