#pragma once
// defines: MemoryPlan (what the caches and activations of a run need in backend memory) and
//          check_memory_plan (refuses, before anything is allocated, a run that cannot fit,
//          naming the part that is too large, by how much, and the flag that shrinks it)
//
// The weights are already resident when this runs (Model's constructor uploads them and
// fails with its own message when they do not fit), so the plan compares the rest with the
// memory still free.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"

namespace qwen36 {

class Backend;
struct ModelWeights;

struct MemoryRequest {
  int32_t slots = 1;            // sequences held at once (--parallel)
  int64_t ctx = 0;              // positions per sequence (-c)
  int64_t batch_tokens = 512;   // tokens of the largest forward pass (prefill chunk or step budget)
  int64_t output_rows = 1;      // rows of logits that pass returns
  DType kv_type = DType::F32;   // attention cache element type
  DType state_type = DType::F32;  // DeltaNet recurrent state element type (--state-type)
  bool mtp = false;             // the MTP head's cache too
};

struct MemoryPlan {
  size_t kv = 0;          // attention K and V caches (and the MTP head's)
  size_t state = 0;       // DeltaNet conv + recurrent state
  size_t activations = 0; // the largest forward pass's activations, with headroom for op temporaries
  size_t total() const { return kv + state + activations; }
  std::string describe() const;  // "KV cache 12.0 GiB + DeltaNet state 0.6 GiB + activations 1.1 GiB"
};

MemoryPlan plan_memory(const ModelConfig& c, const MemoryRequest& r);

// Throws qwen36::Error when the plan needs more than the backend has free (a backend that
// does not report free memory, the CPU, is not checked). `flags` names the options of the
// calling command that shrink each part, e.g. "-c/--ctx-size", "--parallel".
struct MemoryFlags {
  std::string ctx = "-c/--ctx-size", slots = "--parallel", batch = "-b/--batch-size",
              kv_type = "--cache-type-k/--cache-type-v", state_type = "--state-type";
};
void check_memory_plan(Backend& backend, const ModelConfig& c, const MemoryRequest& r, const MemoryFlags& flags = {});
// The same against a given number of free bytes of memory called `where` (tests).
void check_memory_plan(size_t free_bytes, const std::string& where, const ModelConfig& c, const MemoryRequest& r,
                       const MemoryFlags& flags = {});

// ---- expert offload (model/expert_placement.h) ----
// Routed experts placed on the host count in host memory: the device holds the rest, plus,
// when any layer is on the host, the staging area that a large batch streams one host layer's
// experts through (expert_staging_bytes; Model::host_moe_experts).
struct WeightSplit {
  size_t device = 0, host = 0;  // device includes staging
  size_t staging = 0;
};
// The backend memory a model's device weights and plan may take: what the backend has free plus
// what w holds there already (Backend::resident_bytes: random weights made on the device, which
// free memory no longer counts); 0 where the backend reports no free memory (host).
size_t memory_for_weights(Backend& backend, ModelWeights& w);
// total: every weight byte; expert_bytes[i]: layer i's routed experts; host[i]: placed on the host.
WeightSplit split_weights(size_t total, const std::vector<size_t>& expert_bytes, const std::vector<bool>& host);
// The device staging area for streaming host-placed experts: the largest host layer's routed
// experts plus alignment padding (kExpertStagingSlack); 0 when no layer is on the host or
// QWEN36_MOE_STREAM=never (model/expert_placement.h).
constexpr size_t kExpertStagingSlack = size_t(1) << 20;  // ≥ 256 B per expert tensor: 3 × 256 experts = 192 KiB
size_t expert_staging_bytes(const std::vector<size_t>& expert_bytes, const std::vector<bool>& host);
// The smallest N such that, with the routed experts of the first N layers on the host, the
// device weights (with the staging area when N > 0) plus `plan_bytes` (caches and activations)
// fit in `budget`; -1 when even all layers on the host do not fit. (First layers, as llama.cpp's
// --n-cpu-moe: all MoE layers of Qwen3.6 have the same size, so which ones matters for nothing
// but naming them.)
int32_t fit_n_cpu_moe(size_t budget, size_t total, const std::vector<size_t>& expert_bytes, size_t plan_bytes);
// Per-layer routed-expert bytes of `c` at `bits_per_weight` (planning without the weights).
std::vector<size_t> estimate_expert_bytes(const ModelConfig& c, double bits_per_weight);
// "--gpu-mem 24GiB", "16G", "512MiB", "1e9": bytes; an Error names a bad value.
size_t parse_byte_size(const std::string& s, const std::string& flag);
// --gpu-mem: device memory left for caches and activations once the weights are resident;
// check_memory_plan(Backend&, ...) uses it when it is smaller than what the backend reports
// (or the backend reports nothing), so a smaller card can be emulated. 0: no cap. Set once
// at load by the command line (process-wide, like the log level).
void set_device_budget(size_t bytes_after_weights);
size_t device_budget();

}  // namespace qwen36
