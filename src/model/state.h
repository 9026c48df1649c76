#pragma once
// defines: ModelState (per-sequence caches: attention KV, DeltaNet conv and recurrent state)
//
// A state holds `slots` sequences of up to `capacity` positions each. Slot s of every cache
// belongs to one sequence; SeqRun::slot picks it. The MTP head, when present, has its own
// attention cache.

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"

namespace qwen36 {

class ModelState {
 public:
  ModelState(Backend& backend, const ModelConfig& config, int32_t slots, int64_t capacity, bool with_mtp);

  int32_t slots() const { return slots_; }
  int64_t capacity() const { return capacity_; }
  // Caches of model layer `layer` (which must be of the matching kind).
  Tensor& k_cache(int64_t layer) { return tensors_[size_t(cache_index_.at(size_t(layer)))].a; }
  Tensor& v_cache(int64_t layer) { return tensors_[size_t(cache_index_.at(size_t(layer)))].b; }
  Tensor& conv_state(int64_t layer) { return tensors_[size_t(cache_index_.at(size_t(layer)))].a; }
  Tensor& recurrent_state(int64_t layer) { return tensors_[size_t(cache_index_.at(size_t(layer)))].b; }
  Tensor& mtp_k_cache() { return mtp_.a; }
  Tensor& mtp_v_cache() { return mtp_.b; }
  bool has_mtp() const { return !mtp_.a.empty(); }

  // Forget slot's sequence: zero its recurrent and conv state (KV entries are overwritten
  // as positions are written again).
  void reset_slot(int32_t slot);
  size_t bytes() const;  // device memory held

 private:
  struct Pair {
    Tensor a, b;
    bool is_kv = false;  // attention K/V (else DeltaNet conv/recurrent state)
  };
  Pair make_pair_(std::initializer_list<int64_t> a, std::initializer_list<int64_t> b);

  Backend& backend_;
  int32_t slots_;
  int64_t capacity_;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;
  std::vector<Pair> tensors_;      // one per layer
  std::vector<int64_t> cache_index_;  // layer → tensors_ index
  Pair mtp_;
};

}  // namespace qwen36
