#pragma once
// defines: ModelState (per-sequence caches: attention KV, DeltaNet conv and recurrent state)
//
// A state holds `slots` sequences of up to `capacity` positions each. Slot s of every cache
// belongs to one sequence; SeqRun::slot picks it. The MTP head, when present, has its own
// attention cache.
//
// The attention K/V caches (the MTP head's too) hold `kv_dtype` elements: F32 (exact), BF16
// (rounded to nearest on append, half the memory and bandwidth), or the quantised formats of
// backend/kv_cache.h: F8_E4M3 (1 byte + a per-(position, kv head) power-of-two scale), Q8_0
// (8.5 bits) and Q4_0 (4.5 bits), both after a Hadamard rotation along head_dim.
//
// The DeltaNet recurrent state [slots, Hv, dk, dv] holds `state_dtype` elements: F32 (the
// default) or BF16 (--state-type bf16: half the memory and half the bytes a decode step moves
// per sequence). Every op computes in f32; a BF16 state is widened exactly when an op reads it
// and rounded to nearest even when the op writes it back: the recurrent (token by token) form
// rounds it after every token, as a decode step stores it, so a speculative verify or commit
// (also token by token) reproduces the decode steps bit for bit; the chunked prefill form
// rounds it once, at the end of its call. The conv state stays f32 (it is small).

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"

namespace qwen36 {

class ModelState {
 public:
  ModelState(Backend& backend, const ModelConfig& config, int32_t slots, int64_t capacity, bool with_mtp,
             DType kv_dtype = DType::F32, DType state_dtype = DType::F32);
  // Whether the attention K/V caches can be held in `t` (F32, BF16, F8_E4M3, Q8_0, Q4_0).
  static bool kv_dtype_supported(DType t);
  // Bytes of one layer's K and V caches together per position and slot (fp8 scales included).
  static size_t kv_bytes_per_position(const ModelConfig& config, DType t);
  // Whether the DeltaNet recurrent state can be held in `t` (F32, BF16).
  static bool state_dtype_supported(DType t);
  // Bytes of one sequence's DeltaNet conv and recurrent state over all layers.
  static size_t state_bytes_per_slot(const ModelConfig& config, DType state_dtype);

  int32_t slots() const { return slots_; }
  int64_t capacity() const { return capacity_; }
  DType kv_dtype() const { return kv_dtype_; }
  DType state_dtype() const { return state_dtype_; }
  const ModelConfig& config() const { return config_; }
  // Caches of model layer `layer` (which must be of the matching kind).
  Tensor& k_cache(int64_t layer) { return tensors_[size_t(cache_index_.at(size_t(layer)))].a; }
  Tensor& v_cache(int64_t layer) { return tensors_[size_t(cache_index_.at(size_t(layer)))].b; }
  Tensor& conv_state(int64_t layer) { return tensors_[size_t(cache_index_.at(size_t(layer)))].a; }
  Tensor& recurrent_state(int64_t layer) { return tensors_[size_t(cache_index_.at(size_t(layer)))].b; }
  Tensor& mtp_k_cache() { return mtp_.a; }
  Tensor& mtp_v_cache() { return mtp_.b; }
  bool has_mtp() const { return !mtp_.a.empty(); }

  // Speculative decoding (Model::commit_speculative): per DeltaNet layer and slot, room for
  // the conv inputs and gates of up to `max_tokens` verify tokens, so the state can be
  // advanced by the accepted prefix after verification. This is the whole cost of GDN
  // rollback: (conv_dim + 2·Hv) floats per token per DeltaNet layer, e.g. for 27B at k = 5
  // (6 verify tokens) 48 · 6 · (10240 + 96) · 4 B = 11.4 MiB per sequence, 7.6 % of its
  // 150 MiB recurrent + conv state (per-position state snapshots would need 6 × 150 MiB).
  void enable_speculation(int32_t max_tokens);
  int32_t spec_max_tokens() const { return spec_max_tokens_; }
  Tensor& spec_conv_input(int64_t layer) { return spec_.at(size_t(cache_index_.at(size_t(layer)))).a; }  // [slots, n, conv_dim]
  Tensor& spec_g(int64_t layer) { return spec_.at(size_t(cache_index_.at(size_t(layer)))).b; }           // [slots, n, Hv]
  Tensor& spec_beta(int64_t layer) { return spec_beta_.at(size_t(cache_index_.at(size_t(layer)))); }     // [slots, n, Hv]
  size_t spec_bytes_per_slot() const { return spec_bytes_per_slot_; }

  // Forget slot's sequence: zero its recurrent and conv state (KV entries are overwritten
  // as positions are written again).
  void reset_slot(int32_t slot);
  size_t bytes() const;     // device memory held (every buffer at its dtype's size)
  size_t kv_bytes() const;  // of which attention K/V caches (MTP's included)

 private:
  struct Pair {
    Tensor a, b;
    bool is_kv = false;  // attention K/V (else DeltaNet conv/recurrent state)
  };
  Pair make_pair_(std::initializer_list<int64_t> a, std::initializer_list<int64_t> b, DType dt_a = DType::F32,
                  DType dt_b = DType::F32);
  Pair make_kv_pair_();

  Backend& backend_;
  int32_t slots_;
  int64_t capacity_;
  DType kv_dtype_;
  DType state_dtype_;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;
  std::vector<Pair> tensors_;      // one per layer
  std::vector<int64_t> cache_index_;  // layer → tensors_ index
  Pair mtp_;
  const ModelConfig config_;
  int32_t spec_max_tokens_ = 0;
  std::vector<Pair> spec_;          // per layer (empty for attention layers): conv input, g
  std::vector<Tensor> spec_beta_;   // per layer: beta
  size_t spec_bytes_per_slot_ = 0;
};

}  // namespace qwen36
