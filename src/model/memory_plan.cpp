#include "model/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "backend/backend.h"
#include "core/error.h"
#include "model/state.h"

namespace qwen36 {

namespace {

double gib(size_t b) { return double(b) / double(size_t(1) << 30); }

}  // namespace

std::string MemoryPlan::describe() const {
  return fmt::format("KV cache {:.2f} GiB + DeltaNet state {:.2f} GiB + activations {:.2f} GiB", gib(kv), gib(state),
                     gib(activations));
}

MemoryPlan plan_memory(const ModelConfig& c, const MemoryRequest& r) {
  MemoryPlan p;
  int64_t attn_layers = 0, dn_layers = 0;
  for (LayerKind k : c.layer_kinds) (k == LayerKind::FullAttention ? attn_layers : dn_layers) += 1;
  const size_t kv_row = ModelState::kv_bytes_per_position(c, r.kv_type);  // K and V of one layer
  p.kv = kv_row * size_t(r.ctx) * size_t(r.slots) * size_t(attn_layers + (r.mtp ? 1 : 0));
  const size_t per_dn = (size_t(c.conv_dim() * (c.conv_kernel - 1)) +
                         size_t(c.linear_v_heads * c.linear_k_dim * c.linear_v_dim)) * sizeof(float);
  p.state = per_dn * size_t(dn_layers) * size_t(r.slots);
  // Live f32 activations per token inside one layer (Model's Scratch frames): the residual
  // stream, its pending FFN output and the normed input; the DeltaNet projections, their
  // q/k/v copies and output; the attention q|gate, k, v, output; the MLP's gate and up (or
  // the routed experts' rows). The largest block wins, the stream parts always live.
  const int64_t H = c.hidden_size, Hvdv = c.linear_v_heads * c.linear_v_dim;
  const int64_t dn = 2 * c.conv_dim() + 3 * Hvdv + 4 * c.linear_v_heads;
  const int64_t attn = 4 * c.n_heads * c.head_dim + 3 * c.n_kv_heads * c.head_dim;
  const int64_t ffn = c.moe ? std::max<int64_t>(2 * c.n_experts_per_tok * c.moe_intermediate_size +
                                                    2 * c.shared_expert_intermediate_size + 2 * H,
                                                2 * c.intermediate_size)
                            : 2 * c.intermediate_size;
  const int64_t per_token = 3 * H + std::max({dn, attn, ffn});
  const size_t act = size_t(per_token) * size_t(r.batch_tokens) * sizeof(float) +
                     size_t(r.output_rows) * size_t(c.vocab_size + H) * sizeof(float);
  p.activations = act + act / 2;  // op temporaries (bf16 copies for GEMMs, chunk workspaces)
  return p;
}

void check_memory_plan(Backend& backend, const ModelConfig& c, const MemoryRequest& r, const MemoryFlags& flags) {
  const size_t free_b = backend.free_memory();
  if (free_b > 0) check_memory_plan(free_b, backend.name(), c, r, flags);
}

void check_memory_plan(size_t free_b, const std::string& where, const ModelConfig& c, const MemoryRequest& r,
                       const MemoryFlags& flags) {
  const MemoryPlan p = plan_memory(c, r);
  if (p.total() <= free_b) return;
  const size_t short_by = p.total() - free_b;
  std::string help;
  if (p.kv >= p.activations && p.kv >= p.state)
    help = fmt::format("the KV cache is the largest part ({} positions × {} sequences): lower {} or {}, or store it "
                       "in a smaller type with {}",
                       r.ctx, r.slots, flags.ctx, flags.slots, flags.kv_type);
  else if (p.state >= p.activations)
    help = fmt::format("the DeltaNet state grows with the sequences held at once ({}): lower {}", r.slots, flags.slots);
  else
    help = fmt::format("the activations grow with the tokens per forward pass ({}): lower {}", r.batch_tokens,
                       flags.batch);
  fail("not enough {} memory after the weights: this run needs {:.2f} GiB ({}) but {:.2f} GiB is free, {:.2f} GiB "
       "short; {}",
       where, gib(p.total()), p.describe(), gib(free_b), gib(short_by), help);
}

}  // namespace qwen36
