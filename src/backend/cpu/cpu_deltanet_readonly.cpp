// Read-only DeltaNet ops for the speculative verify pass (see backend.h). On the CPU each run
// works on a private copy of its sequence's state and calls the plain op on it, so verify
// outputs are the plain ops' outputs by construction (bit for bit) and the state is never
// written. A device backend would keep the running state in registers instead of copying.
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"

namespace qwen36::cpu {

namespace {

// One slot of a [slots, ...] state, copied into `buf` (its own element type: a bf16 state's
// copy is rounded per token by the recurrent op as the state itself) and viewed as a 1-slot
// tensor.
Tensor private_copy(const Tensor& state, int32_t slot, std::vector<float>& buf) {
  QWEN36_CHECK(slot >= 0 && slot < state.dim(0), "read-only DeltaNet op: slot {} out of range", slot);
  const size_t bytes = state.nbytes() / size_t(state.dim(0));
  buf.resize((bytes + sizeof(float) - 1) / sizeof(float));
  std::memcpy(buf.data(), static_cast<const std::byte*>(state.data) + size_t(slot) * bytes, bytes);
  Tensor t = state;
  t.data = buf.data();
  t.shape[0] = 1;
  return t;
}

}  // namespace

void causal_conv1d_silu_readonly(Tensor& x, const Tensor& w, const Tensor& conv_state, std::span<const SeqRun> runs) {
  QWEN36_CHECK(conv_state.ndim == 3, "conv1d (read-only): state {} must be [slots, C, K-1]", conv_state.shape_str());
  std::vector<float> buf;
  for (const SeqRun& r : runs) {
    Tensor one = private_copy(conv_state, r.slot, buf);
    const SeqRun local{0, r.pos0, r.begin, r.count};
    causal_conv1d_silu(x, w, one, std::span(&local, 1));
  }
}

void gated_delta_rule_readonly(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                               const Tensor& state, std::span<const SeqRun> runs, Tensor& out) {
  QWEN36_CHECK(state.ndim == 4, "gated_delta_rule (read-only): state {} must be [slots, Hv, dk, dv]",
               state.shape_str());
  std::vector<float> buf;
  for (const SeqRun& r : runs) {
    Tensor one = private_copy(state, r.slot, buf);
    const SeqRun local{0, r.pos0, r.begin, r.count};
    gated_delta_rule(q, k, v, g, beta, one, std::span(&local, 1), out, DeltaRuleMode::Recurrent);
  }
}

}  // namespace qwen36::cpu
