#include "model/state.h"

#include "backend/kv_cache.h"
#include "core/error.h"

namespace qwen36 {

bool ModelState::kv_dtype_supported(DType t) { return kv_cache_type_supported(t); }

size_t ModelState::kv_bytes_per_position(const ModelConfig& c, DType t) {
  return 2 * kv_cache_bytes(t, 1, 1, c.n_kv_heads, c.head_dim);
}

bool ModelState::state_dtype_supported(DType t) { return t == DType::F32 || t == DType::BF16; }

size_t ModelState::state_bytes_per_slot(const ModelConfig& c, DType state_dtype) {
  size_t n = 0;
  for (LayerKind k : c.layer_kinds)
    if (k != LayerKind::FullAttention)
      n += size_t(c.conv_dim() * (c.conv_kernel - 1)) * sizeof(float) +
           size_t(c.linear_v_heads * c.linear_k_dim * c.linear_v_dim) * dtype_block_bytes(state_dtype);
  return n;
}

ModelState::ModelState(Backend& backend, const ModelConfig& c, int32_t slots, int64_t capacity, bool with_mtp,
                       DType kv_dtype, DType state_dtype)
    : backend_(backend), slots_(slots), capacity_(capacity), kv_dtype_(kv_dtype), state_dtype_(state_dtype),
      config_(c) {
  QWEN36_CHECK(slots > 0 && capacity > 0, "state needs at least one slot and one position");
  QWEN36_CHECK(kv_dtype_supported(kv_dtype), "KV cache type {} is not supported (f32, bf16, f8_e4m3, q8_0, q4_0)",
               dtype_name(kv_dtype));
  QWEN36_CHECK(state_dtype_supported(state_dtype), "DeltaNet state type {} is not supported (f32, bf16)",
               dtype_name(state_dtype));
  QWEN36_CHECK(kv_cache_head_dim_ok(kv_dtype, c.head_dim), "a {} KV cache needs a power-of-two head_dim ≥ 32, not {}",
               dtype_name(kv_dtype), c.head_dim);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    cache_index_.push_back(int64_t(tensors_.size()));
    if (c.layer_kinds[size_t(l)] == LayerKind::FullAttention) {
      tensors_.push_back(make_kv_pair_());
    } else {
      tensors_.push_back(make_pair_({slots, c.conv_dim(), c.conv_kernel - 1},                     // conv (f32)
                                    {slots, c.linear_v_heads, c.linear_k_dim, c.linear_v_dim},  // S
                                    DType::F32, state_dtype));
    }
  }
  if (with_mtp) mtp_ = make_kv_pair_();
}

// K and V [slots, capacity, KVH, hd] of kv_dtype_, each buffer holding kv_cache_bytes (the
// tensors' nbytes() leave out the fp8 scales stored after the elements).
ModelState::Pair ModelState::make_kv_pair_() {
  const ModelConfig& c = config_;
  const size_t bytes = kv_cache_bytes(kv_dtype_, slots_, capacity_, c.n_kv_heads, c.head_dim);
  Pair p;
  for (Tensor* t : {&p.a, &p.b}) {
    *t = Tensor(nullptr, kv_dtype_, {slots_, capacity_, c.n_kv_heads, c.head_dim});
    buffers_.push_back(backend_.alloc(bytes));
    t->data = buffers_.back()->data();
  }
  p.is_kv = true;
  return p;
}

ModelState::Pair ModelState::make_pair_(std::initializer_list<int64_t> a, std::initializer_list<int64_t> b, DType dt_a,
                                       DType dt_b) {
  Pair p;
  Tensor ta(nullptr, dt_a, a), tb(nullptr, dt_b, b);
  buffers_.push_back(backend_.alloc(ta.nbytes()));
  ta.data = buffers_.back()->data();
  buffers_.push_back(backend_.alloc(tb.nbytes()));
  tb.data = buffers_.back()->data();
  p.a = ta;
  p.b = tb;
  return p;
}

void ModelState::enable_speculation(int32_t max_tokens) {
  QWEN36_CHECK(max_tokens > 0 && max_tokens <= 64, "speculation needs 1..64 verify tokens, not {}", max_tokens);
  if (max_tokens <= spec_max_tokens_) return;  // growing keeps the old buffers until the state goes
  const ModelConfig& c = config_;
  spec_.assign(tensors_.size(), Pair{});
  spec_beta_.assign(tensors_.size(), Tensor{});
  spec_bytes_per_slot_ = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].is_kv) continue;
    spec_[i] = make_pair_({slots_, max_tokens, c.conv_dim()}, {slots_, max_tokens, c.linear_v_heads});
    Tensor beta(nullptr, DType::F32, {slots_, max_tokens, c.linear_v_heads});
    buffers_.push_back(backend_.alloc(beta.nbytes()));
    beta.data = buffers_.back()->data();
    spec_beta_[i] = beta;
    spec_bytes_per_slot_ += size_t(max_tokens) * size_t(c.conv_dim() + 2 * c.linear_v_heads) * sizeof(float);
  }
  spec_max_tokens_ = max_tokens;
}

void ModelState::reset_slot(int32_t slot) {
  QWEN36_CHECK(slot >= 0 && slot < slots_, "slot {} out of range", slot);
  for (Pair& p : tensors_) {
    if (p.is_kv) continue;  // KV entries are rewritten before they are read
    for (Tensor* t : {&p.a, &p.b}) {
      const int64_t per = t->numel() / t->dim(0);
      Tensor s(static_cast<std::byte*>(t->data) + size_t(slot * per) * dtype_block_bytes(t->dtype), t->dtype, {per});
      backend_.fill_zero(s);
    }
  }
}

size_t ModelState::bytes() const {
  size_t n = 0;
  for (const auto& b : buffers_) n += b->size();
  return n;
}

size_t ModelState::kv_bytes() const {
  const ModelConfig& c = config_;
  const size_t pair = 2 * kv_cache_bytes(kv_dtype_, slots_, capacity_, c.n_kv_heads, c.head_dim);
  size_t n = 0;
  for (const Pair& p : tensors_)
    if (p.is_kv) n += pair;
  if (has_mtp()) n += pair;
  return n;
}

}  // namespace qwen36
