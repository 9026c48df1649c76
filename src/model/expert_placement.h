#pragma once
// defines: ExpertPlacement (per MoE layer: routed experts on the main backend or on the host),
//          PlacementOptions / resolve_expert_placement (--n-cpu-moe, --cpu-moe, -ot REGEX=DEV),
//          parse_override_tensor, expert_tensor_names, host_expert_tensors; the choice
//          between computing a host layer's experts on the host and streaming them to the
//          device (ExpertStreamMode, ExpertStreamCost, stream_experts_faster)
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

// ---- streaming a host layer's experts to the device (Model::host_moe_experts) ----
// For a large batch, uploading the experts some token routed to and running moe_experts on the
// main backend beats computing on the host: the host's cost grows with the tokens, the upload's
// is bounded by the layer's size. The choice is made per layer and pass.
enum class ExpertStreamMode : uint8_t {
  Auto,    // by stream_experts_faster (a device main backend only; never below min_tokens)
  Always,  // every pass, decode steps too (tests, benchmarks)
  Never,   // host compute only; no staging area is reserved
};
// QWEN36_MOE_STREAM = auto (unset) | always | never; an Error names a bad value.
ExpertStreamMode expert_stream_mode();

// The rates the auto choice compares, and how host experts are held and shared. Each can be
// overridden (QWEN36_MOE_HOST_GFLOPS, QWEN36_MOE_PCIE_GBS, QWEN36_MOE_PIN,
// QWEN36_MOE_DEVICE_SHARE; expert_stream_cost() reads them).
struct ExpertStreamCost {
  // Host routed-expert math (cpu::moe_experts, quantized dot products on all cores): measured
  // 0.22-0.26 TFLOP/s on the H200 machine's 16-core host (35B-A3B, 512-token passes).
  double host_flops = 0.3e12;
  // The device's moe_experts prefill path (dequantize to bf16 + grouped tensor-core GEMM): a
  // fraction of an H100/H200's ~990 TFLOP/s dense bf16, for the dequantization and grouping.
  double device_flops = 100e12;
  // Host → device copy rate: from page-locked memory 55 GB/s on the H200 machine (PCIe Gen5);
  // from pageable memory through the backend's page-locked ring that all cores fill (cuda
  // HostBounce) ~20 GB/s there (the driver's own pageable path: 6 GB/s).
  double pinned_bytes_per_s = 40e9;
  double pageable_bytes_per_s = 15e9;
  // Fewer tokens than this never stream: decode steps and small verify batches touch a few
  // experts, which the host computes sooner than PCIe delivers them.
  int64_t min_tokens = 32;
  // Copy the host experts into page-locked memory at load (model/host_expert_copy.h) when the
  // main backend is a device: QWEN36_MOE_PIN=1 (the default) or 0 (they stay in the model
  // file's pages, which a device reads only through a bounce buffer).
  bool pin = true;
  // Of each token's k routed experts in a one-token pass of a host layer, how many run on the
  // main backend (uploaded into the staging area, by DMA from the page-locked copy) while the
  // host computes the rest (QWEN36_MOE_DEVICE_SHARE = 0 .. k − 1; unset: 3). Both move the
  // weights out of host memory, the cores at their memory bandwidth, the copy engine at PCIe
  // rate. H200 + 16-core host, 35B-A3B Q4_K_M tg32 (t/s): --n-cpu-moe 20: 80.3 with 0, 92.0 with
  // 3; --n-cpu-moe 40: 53.6 / 52.1 / 53.9 / 53.9 with 0 / 2 / 3 / 4 (the host's fixed costs per
  // pass dominate there).
  int device_share = 3;
  // Decode passes of host layers through the pipeline (Model::HostPipeline: the host's experts
  // on a worker pool while the next layer is queued): QWEN36_HOST_PIPELINE=1 (the default) or 0
  // (each pass in place, the fallback).
  bool pipeline = true;
};
ExpertStreamCost expert_stream_cost();

// One host layer's pass: T tokens with k experts each, experts of intermediate size I on hidden
// size H; upload_bytes = the routed experts' bytes (B_touched); pinned: the host copy is pinned.
struct ExpertPassWork {
  int64_t tokens = 0, k = 0, intermediate = 0, hidden = 0;
  size_t upload_bytes = 0;
  bool pinned = true;
};
// Seconds on each path:   host   = 2·T·k·3·I·H / host_flops
//                         stream = upload_bytes / bandwidth + 2·T·k·3·I·H / device_flops
// (the [T, H] copies both ways and the routing ids are common to both or tiny).
double expert_host_seconds(const ExpertPassWork& w, const ExpertStreamCost& c);
double expert_stream_seconds(const ExpertPassWork& w, const ExpertStreamCost& c);
// stream < host, and tokens ≥ min_tokens.
bool stream_experts_faster(const ExpertPassWork& w, const ExpertStreamCost& c);
// The bytes of a layer's experts (layer_bytes over E experts) that T tokens with k distinct
// experts each touch when routing is uniform: B · (1 − (1 − k/E)^T). For planning and tests;
// the model counts the experts a pass really routed to.
size_t expected_touched_bytes(size_t layer_bytes, int64_t tokens, int64_t k, int64_t n_experts);

}  // namespace qwen36
