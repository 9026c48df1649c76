#pragma once
// defines: Model::Workspace, Model::Scratch (the forward passes' activation memory),
//          RecordingKey (what a recorded step bakes in), check_runs (a pass's runs against its
//          tokens and state)
//
// Internal to the model's .cpp files (qwen36.cpp, mtp.cpp): the private members they share.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "model/qwen36.h"

namespace qwen36 {

// Reusable activation memory of the forward passes: one backend buffer used as a stack.
// Scratch frames take from its top and give back on destruction (a layer's activations are
// released before the next layer). What does not fit comes from a separate allocation and
// the buffer is grown to the high-water mark at the next forward, so a repeated batch shape
// reuses the same addresses (a condition of replaying a recorded decode step).
struct Model::Workspace {
  std::unique_ptr<DeviceBuffer> buf;
  size_t top = 0, high = 0;
  bool overflowed = false;                 // this forward needed memory outside buf
  std::unordered_map<uint64_t, int> seen;  // decode-step key → forwards seen (recorded at the 2nd)
  void begin(Backend& b) {
    top = 0;
    overflowed = false;
    if (high > (buf ? buf->size() : 0)) {
      buf.reset();
      buf = b.alloc(high + high / 8);
      seen.clear();
    }
  }
};

class Model::Scratch {
 public:
  explicit Scratch(Backend& b) : backend_(b) {}
  Scratch(Backend& b, Workspace& ws) : backend_(b), ws_(&ws), mark_(ws.top) {}
  ~Scratch() {
    if (ws_) ws_->top = mark_;
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  Tensor f32(std::initializer_list<int64_t> shape) { return make(DType::F32, shape); }
  Tensor i32(std::initializer_list<int64_t> shape) { return make(DType::I32, shape); }

 private:
  Tensor make(DType t, std::initializer_list<int64_t> shape) {
    Tensor x(nullptr, t, shape);
    const size_t n = (x.nbytes() + 255) / 256 * 256;
    if (ws_) {
      ws_->high = std::max(ws_->high, ws_->top + n);
      if (ws_->buf && ws_->top + n <= ws_->buf->size()) {
        x.data = static_cast<std::byte*>(ws_->buf->data()) + ws_->top;
        ws_->top += n;
        return x;
      }
      ws_->top += n;  // counted, so that the next forward's buffer holds it
      ws_->overflowed = true;
    }
    buffers_.push_back(backend_.alloc(x.nbytes()));
    x.data = buffers_.back()->data();
    return x;
  }
  Backend& backend_;
  Workspace* ws_ = nullptr;
  size_t mark_ = 0;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;
};

// A recording's key (FNV-1a over 64-bit words): everything the recorded ops bake in. A tensor
// counts by its address and shape: a state freed and another allocated in its place may share
// some addresses and not others.
struct RecordingKey {
  uint64_t value;
  explicit RecordingKey(uint64_t seed) : value(seed) {}
  void mix(uint64_t v) { value = (value ^ v) * 1099511628211ull; }
  void mix(const Tensor& t) {
    mix(reinterpret_cast<uintptr_t>(t.data));
    for (int d = 0; d < t.ndim; ++d) mix(uint64_t(t.dim(d)));
  }
};

// The runs cover `tokens` rows in order without gaps, name slots of `state`, and stay inside
// its context with `ahead` positions more (chained drafting steps past the last row); throws
// Error naming what does not hold (qwen36.cpp).
void check_runs(std::span<const SeqRun> runs, int64_t tokens, const ModelState& state, int32_t ahead = 0);

}  // namespace qwen36
