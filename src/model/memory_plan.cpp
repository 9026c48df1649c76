#include "model/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "backend/backend.h"
#include "core/error.h"
#include "model/expert_placement.h"
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
  int64_t attn_layers = 0;
  for (LayerKind k : c.layer_kinds) attn_layers += k == LayerKind::FullAttention;
  const size_t kv_row = ModelState::kv_bytes_per_position(c, r.kv_type);  // K and V of one layer
  p.kv = kv_row * size_t(r.ctx) * size_t(r.slots) * size_t(attn_layers + (r.mtp ? 1 : 0));
  p.state = ModelState::state_bytes_per_slot(c, r.state_type) * size_t(r.slots);
  // Live f32 activations per token inside one layer (Model's Scratch frames): the residual
  // stream's two buffers, its pending FFN output and the normed input; the DeltaNet projections (b / a of a
  // shard padded) and gates, their q/k/v copies and output; the attention q|gate, k, v, output; the
  // MLP's gate and up (or the routed experts' rows). The largest block wins, the stream parts
  // always live.
  const int64_t H = c.hidden_size, Hvdv = c.linear_v_heads * c.linear_v_dim;
  const int64_t dn = 2 * c.conv_dim() + 3 * Hvdv + 2 * c.linear_v_heads + 2 * c.gate_rows();
  const int64_t attn = 4 * c.n_heads * c.head_dim + 3 * c.n_kv_heads * c.head_dim;
  const int64_t ffn = c.moe ? std::max<int64_t>(2 * c.n_experts_per_tok * c.moe_intermediate_size +
                                                    2 * c.shared_expert_intermediate_size + 2 * H,
                                                2 * c.intermediate_size)
                            : 2 * c.intermediate_size;
  const int64_t per_token = 4 * H + std::max({dn, attn, ffn});
  const size_t act = size_t(per_token) * size_t(r.batch_tokens) * sizeof(float) +
                     size_t(r.output_rows) * size_t(c.vocab_size + H) * sizeof(float);
  p.activations = act + act / 2;  // op temporaries (bf16 copies for GEMMs, chunk workspaces)
  return p;
}

namespace {
size_t g_device_budget = 0;
}  // namespace

void set_device_budget(size_t bytes_after_weights) { g_device_budget = bytes_after_weights; }
size_t device_budget() { return g_device_budget; }

void check_memory_plan(Backend& backend, const ModelConfig& c, const MemoryRequest& r, const MemoryFlags& flags) {
  size_t free_b = backend.free_memory();
  std::string where = backend.name();
  if (g_device_budget > 0 && (free_b == 0 || g_device_budget < free_b)) {
    free_b = g_device_budget;
    where += " (--gpu-mem)";
  }
  if (free_b > 0) check_memory_plan(free_b, where, c, r, flags);
}

size_t memory_for_weights(Backend& backend, ModelWeights& w) {
  const size_t free_b = backend.free_memory();
  return free_b > 0 ? free_b + backend.resident_bytes(w) : 0;
}

size_t expert_staging_bytes(const std::vector<size_t>& expert_bytes, const std::vector<bool>& host) {
  if (expert_stream_mode() == ExpertStreamMode::Never) return 0;
  size_t largest = 0;
  bool any = false;
  for (size_t i = 0; i < expert_bytes.size() && i < host.size(); ++i)
    if (host[i]) any = true, largest = std::max(largest, expert_bytes[i]);
  return any ? largest + kExpertStagingSlack : 0;
}

WeightSplit split_weights(size_t total, const std::vector<size_t>& expert_bytes, const std::vector<bool>& host) {
  WeightSplit s;
  for (size_t i = 0; i < expert_bytes.size() && i < host.size(); ++i)
    if (host[i]) s.host += expert_bytes[i];
  s.staging = expert_staging_bytes(expert_bytes, host);
  s.device = total - std::min(total, s.host) + s.staging;
  return s;
}

int32_t fit_n_cpu_moe(size_t budget, size_t total, const std::vector<size_t>& expert_bytes, size_t plan_bytes) {
  std::vector<bool> host(expert_bytes.size(), false);
  for (size_t n = 0;; ++n) {
    if (split_weights(total, expert_bytes, host).device + plan_bytes <= budget) return int32_t(n);
    if (n == expert_bytes.size()) return -1;
    host[n] = true;
  }
}

std::vector<size_t> estimate_expert_bytes(const ModelConfig& c, double bits_per_weight) {
  if (!c.moe) return std::vector<size_t>(size_t(c.n_layers), 0);
  const double params = 3.0 * double(c.n_local_experts()) * double(c.moe_intermediate_size) * double(c.hidden_size);
  return std::vector<size_t>(size_t(c.n_layers), size_t(params * bits_per_weight / 8.0));
}

size_t parse_byte_size(const std::string& s, const std::string& flag) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = s.substr(used);
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  double mul = 0;
  if (unit.empty() || unit == "b") mul = 1;
  else if (unit == "k" || unit == "kib" || unit == "kb") mul = 1024.0;
  else if (unit == "m" || unit == "mib" || unit == "mb") mul = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib" || unit == "gb") mul = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib" || unit == "tb") mul = 1024.0 * 1024 * 1024 * 1024;
  QWEN36_CHECK(used > 0 && mul > 0 && v > 0, "{} \"{}\": expected a size such as 24GiB, 16G or 512MiB", flag, s);
  return size_t(v * mul);
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
    help = fmt::format("the DeltaNet state grows with the sequences held at once ({}): lower {}{}", r.slots,
                       flags.slots,
                       r.state_type == DType::F32
                           ? fmt::format(", or halve its recurrent part with {} bf16", flags.state_type)
                           : "");
  else
    help = fmt::format("the activations grow with the tokens per forward pass ({}): lower {}", r.batch_tokens,
                       flags.batch);
  fail("not enough {} memory after the weights: this run needs {:.2f} GiB ({}) but {:.2f} GiB is free, {:.2f} GiB "
       "short; {}",
       where, gib(p.total()), p.describe(), gib(free_b), gib(short_by), help);
}

}  // namespace qwen36
