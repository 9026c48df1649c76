#include "model/state_snapshot.h"

#include <cstring>
#include <vector>

#include "backend/kv_cache.h"
#include "core/error.h"

namespace qwen36 {

namespace {

// A run of bytes of the state that belongs to one slot's first P positions.
struct Range {
  std::byte* ptr;
  size_t bytes;
};

// The slot's bytes in a fixed order (layers in order, then the MTP cache): what a snapshot
// holds, back to back.
std::vector<Range> slot_ranges(ModelState& st, int32_t slot, int64_t positions) {
  const ModelConfig& c = st.config();
  QWEN36_CHECK(slot >= 0 && slot < st.slots(), "snapshot: slot {} out of range (0..{})", slot, st.slots() - 1);
  QWEN36_CHECK(positions >= 0 && positions <= st.capacity(), "snapshot: {} positions do not fit a slot of {}",
               positions, st.capacity());
  std::vector<Range> out;
  auto slot_row = [&](Tensor& t) {  // [slots, ...] f32: the slot's whole row
    const size_t per = t.nbytes() / size_t(st.slots());
    out.push_back({static_cast<std::byte*>(t.data) + size_t(slot) * per, per});
  };
  auto kv = [&](Tensor& t) {  // [slots, capacity, KVH, hd]: positions 0..P-1 of the slot
    const DType dt = t.dtype;
    const size_t per_pos = size_t(c.n_kv_heads) * dtype_row_bytes(dt, c.head_dim);
    auto* base = static_cast<std::byte*>(t.data);
    out.push_back({base + size_t(slot) * size_t(st.capacity()) * per_pos, size_t(positions) * per_pos});
    if (dt == DType::F8_E4M3) {  // per-row f32 scales after the elements, [slots, KVH, capacity]
      std::byte* scales = base + kv_scale_offset(dt, st.slots(), st.capacity(), c.n_kv_heads, c.head_dim);
      for (int64_t h = 0; h < c.n_kv_heads; ++h)
        out.push_back({scales + size_t((int64_t(slot) * c.n_kv_heads + h) * st.capacity()) * 4, size_t(positions) * 4});
    }
  };
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (c.layer_kinds[size_t(l)] == LayerKind::FullAttention) {
      kv(st.k_cache(l));
      kv(st.v_cache(l));
    } else {
      slot_row(st.conv_state(l));
      slot_row(st.recurrent_state(l));
    }
  }
  if (st.has_mtp()) {
    kv(st.mtp_k_cache());
    kv(st.mtp_v_cache());
  }
  std::erase_if(out, [](const Range& r) { return r.bytes == 0; });
  return out;
}

// A byte view the backends copy as raw bytes (a 1-byte element type).
Tensor bytes_view(void* p, size_t n) { return Tensor(p, DType::F8_E4M3, {int64_t(n)}); }

}  // namespace

size_t snapshot_bytes(const ModelState& state, int64_t positions) {
  // The ranges only read pointers and sizes; slot 0 stands for any slot.
  size_t n = 0;
  for (const Range& r : slot_ranges(const_cast<ModelState&>(state), 0, positions)) n += r.bytes;
  return n;
}

StateSnapshot save_snapshot(Backend& backend, ModelState& state, int32_t slot, int64_t positions, bool to_host) {
  const std::vector<Range> ranges = slot_ranges(state, slot, positions);
  StateSnapshot s;
  s.positions = positions;
  for (const Range& r : ranges) s.bytes += r.bytes;
  std::byte* dst = nullptr;
  if (to_host) {
    s.host = HostBuffer(s.bytes);
    dst = s.host.data();
  } else {
    s.device = backend.alloc(s.bytes);
    dst = static_cast<std::byte*>(s.device->data());
  }
  for (const Range& r : ranges) {
    const Tensor src = bytes_view(r.ptr, r.bytes);
    if (to_host) {
      backend.copy_to_host(src, dst);
    } else {
      Tensor d = bytes_view(dst, r.bytes);
      backend.copy(src, d);
    }
    dst += r.bytes;
  }
  return s;
}

void restore_snapshot(Backend& backend, const StateSnapshot& snap, ModelState& state, int32_t slot) {
  const std::vector<Range> ranges = slot_ranges(state, slot, snap.positions);
  size_t total = 0;
  for (const Range& r : ranges) total += r.bytes;
  QWEN36_CHECK(total == snap.bytes, "snapshot of {} bytes does not match this state ({} bytes for {} positions)",
               snap.bytes, total, snap.positions);
  const std::byte* src = snap.on_host() ? snap.host.data() : static_cast<const std::byte*>(snap.device->data());
  for (const Range& r : ranges) {
    Tensor d = bytes_view(r.ptr, r.bytes);
    if (snap.on_host())
      backend.copy_from_host(src, d);
    else
      backend.copy(bytes_view(const_cast<std::byte*>(src), r.bytes), d);
    src += r.bytes;
  }
}

void snapshot_to_host(Backend& backend, const StateSnapshot& snap, std::byte* dst) {
  if (snap.on_host())
    std::memcpy(dst, snap.host.data(), snap.bytes);
  else if (snap.bytes)
    backend.copy_to_host(bytes_view(snap.device->data(), snap.bytes), dst);
}

StateSnapshot snapshot_from_host(Backend& backend, HostBuffer bytes, int64_t positions, bool to_host) {
  StateSnapshot s;
  s.positions = positions;
  s.bytes = bytes.size();
  if (to_host) {
    s.host = std::move(bytes);
  } else {
    s.device = backend.alloc(s.bytes);
    Tensor d = bytes_view(s.device->data(), s.bytes);
    if (s.bytes) backend.copy_from_host(bytes.data(), d);
  }
  return s;
}

}  // namespace qwen36
