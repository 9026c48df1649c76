#pragma once
// defines: BenchDevice / make_bench_device (the backend a measuring command runs on, and its
//          name for report headers) and BenchWeights / load_bench_weights (-m MODEL, or
//          --synthetic PRESET --type T: random weights generated where they will run, so a
//          full-size synthetic model on --backend cuda never passes through host memory),
//          shared by `qwen36 bench` and `qwen36 bench-serve`; load_bench_dflash (a DFlash
//          drafter checkpoint, or a random drafter of the published shape for the target).
//
// Two steps rather than one because `bench` measures its ceilings (copy bandwidth, GEMM peak)
// on the bare device before the weights take its memory.

#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "engine/spec/dflash_drafter.h"
#include "model/weights.h"

namespace qwen36::cli {

struct BenchDevice {
  std::unique_ptr<Backend> backend;
  std::string name;  // "NVIDIA H200" or "CPU, 16 threads"
  bool cuda = false;
};
// backend: "cpu" or "cuda"; `command` prefixes errors ("bench: ...").
BenchDevice make_bench_device(const std::string& backend, int threads, const std::string& command);

struct BenchWeightsOptions {
  std::string model;      // a Hugging Face directory or .gguf, or
  std::string synthetic;  // a preset name (model/presets.h)
  std::string type = "bf16";  // synthetic matrices: bf16, f16, f32, a quant mix, or (cuda) one block type
  int64_t layers = 0;     // override the preset's layer count (0: keep)
  bool with_mtp = false;  // synthetic: give the model a random MTP head (its preset has one)
};
struct BenchWeights {
  ModelWeights weights;
  std::string name;   // the path, or "<preset> <type> (synthetic, random)"
  size_t bytes = 0;   // weights.total_bytes() before they move into a Model
};
BenchWeights load_bench_weights(const BenchWeightsOptions& o, bool cuda, const std::string& command);

// `path` empty: random bf16 weights of synthetic_dflash_config(target, block) generated on the
// host (OpenMP; the 27B drafter's 3.46 GB take seconds) and uploaded by the drafter to the
// target's backend; else the checkpoint. Caches for `slots` sequences of `capacity` positions.
// `label` says which, for report lines.
struct BenchDFlash {
  std::unique_ptr<DFlashDrafter> drafter;
  std::string label;
};
// top_k: per block position, the candidates kept for tree drafting (0: chain drafting).
BenchDFlash load_bench_dflash(const std::string& path, const Model& target, Backend& backend, int32_t slots,
                              int64_t capacity, int32_t block_size, int32_t top_k = 0);

}  // namespace qwen36::cli
