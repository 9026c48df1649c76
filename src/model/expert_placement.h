#pragma once
// defines: ExpertPlacement (per MoE layer: routed experts on the main backend or on the host),
//          PlacementOptions / resolve_expert_placement (--n-cpu-moe, --cpu-moe, -ot REGEX=DEV),
//          parse_override_tensor, expert_tensor_names, host_expert_tensors
//
// Expert offload (issue 11): a 35B-A3B's routed experts are ~90% of its weights but only 8 of
// 256 run per token, so keeping some layers' experts in host RAM and computing them there
// frees device memory for batch and context at a bounded decode cost. The unit of placement
// is a layer's whole routed-expert set (gate, up and down of every expert): Backend::moe_experts
// reads all three, so splitting them across memories would need a second op. The router and
// the shared expert always stay on the main backend (small, and read by every token).

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace qwen36 {

struct ExpertPlacement {
  std::vector<bool> host;  // [n_layers]: routed experts of layer i live and run on the host
  bool any() const;
  int32_t count() const;
  std::string describe() const;  // "routed experts of 20 of 40 layers on the host (layers 0-19)"
};

// One --override-tensor rule: tensors whose name contains a match of `pattern` (a POSIX
// extended regular expression) go to `host` (cpu) or the main backend (cuda/gpu).
struct TensorOverride {
  std::string pattern;
  bool host = true;
};
// "REGEX=DEVICE" (DEVICE: cpu, cuda, gpu, any case; llama.cpp's CUDA0 too); several rules may
// be joined with ','. Throws Error with a one-line message for a missing '=', a bad regex or
// an unknown device.
std::vector<TensorOverride> parse_override_tensor(const std::string& spec);

struct PlacementOptions {
  int32_t n_cpu_moe = 0;  // routed experts of the first N MoE layers on the host
  bool cpu_moe = false;   // all layers
  std::vector<std::string> override_tensor;  // -ot specs, in order
  bool empty() const { return n_cpu_moe == 0 && !cpu_moe && override_tensor.empty(); }
};

// The names a layer's routed-expert tensors go by, which -ot patterns are matched against:
// GGUF "blk.{i}.ffn_{gate,up,down}_exps.weight" and Hugging Face
// "model.layers.{i}.mlp.experts.{gate,up,down}_proj.weight" (the per-expert index left out).
std::vector<std::string> expert_tensor_names(int32_t layer);

// Rules apply in order, the first rule matching any of a layer's expert tensor names decides
// that layer; layers no rule matches follow --cpu-moe / --n-cpu-moe. A dense model gets an
// empty placement (and an Error when a flag asked for one).
ExpertPlacement resolve_expert_placement(const ModelConfig& c, const PlacementOptions& o);

// The expert tensors (addresses inside `w`) that stay on the host: what
// Backend::prepare_weights_except leaves alone.
std::set<const Tensor*> host_expert_tensors(const ModelWeights& w, const ExpertPlacement& p);

// Bytes of layer i's routed experts (views into shared storage counted once each).
std::vector<size_t> expert_bytes_per_layer(const ModelWeights& w);

}  // namespace qwen36
