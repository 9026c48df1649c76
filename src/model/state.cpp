#include "model/state.h"

#include "core/error.h"

namespace qwen36 {

ModelState::ModelState(Backend& backend, const ModelConfig& c, int32_t slots, int64_t capacity, bool with_mtp)
    : backend_(backend), slots_(slots), capacity_(capacity) {
  QWEN36_CHECK(slots > 0 && capacity > 0, "state needs at least one slot and one position");
  for (int64_t l = 0; l < c.n_layers; ++l) {
    cache_index_.push_back(int64_t(tensors_.size()));
    if (c.layer_kinds[size_t(l)] == LayerKind::FullAttention) {
      tensors_.push_back(make_pair_({slots, capacity, c.n_kv_heads, c.head_dim},    // K
                                    {slots, capacity, c.n_kv_heads, c.head_dim}));  // V
      tensors_.back().is_kv = true;
    } else {
      tensors_.push_back(make_pair_({slots, c.conv_dim(), c.conv_kernel - 1},                      // conv
                                    {slots, c.linear_v_heads, c.linear_k_dim, c.linear_v_dim}));  // S
    }
  }
  if (with_mtp)
    mtp_ = make_pair_({slots, capacity, c.n_kv_heads, c.head_dim}, {slots, capacity, c.n_kv_heads, c.head_dim});
}

ModelState::Pair ModelState::make_pair_(std::initializer_list<int64_t> a, std::initializer_list<int64_t> b) {
  Pair p;
  Tensor ta(nullptr, DType::F32, a), tb(nullptr, DType::F32, b);
  buffers_.push_back(backend_.alloc(ta.nbytes()));
  ta.data = buffers_.back()->data();
  buffers_.push_back(backend_.alloc(tb.nbytes()));
  tb.data = buffers_.back()->data();
  p.a = ta;
  p.b = tb;
  return p;
}

void ModelState::reset_slot(int32_t slot) {
  QWEN36_CHECK(slot >= 0 && slot < slots_, "slot {} out of range", slot);
  for (Pair& p : tensors_) {
    if (p.is_kv) continue;  // KV entries are rewritten before they are read
    for (Tensor* t : {&p.a, &p.b}) {
      const int64_t per = t->numel() / t->dim(0);
      Tensor s(static_cast<float*>(t->data) + slot * per, DType::F32, {per});
      backend_.fill_zero(s);
    }
  }
}

size_t ModelState::bytes() const {
  size_t n = 0;
  for (const auto& b : buffers_) n += b->size();
  return n;
}

}  // namespace qwen36
