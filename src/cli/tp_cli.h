#pragma once
// defines: TpCliOptions, add_tp_options (-tp/--tensor-parallel, --tensor-split,
//          --expert-parallel), load_tp_model (a tensor-parallel model), load_tp_bench_model
//          (`bench`, `bench-serve`), load_tp_command_model (`run` and `serve`: -m or the
//          built-in model)

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "backend/backend.h"
#include "cli/common.h"
#include "model/qwen36.h"

namespace qwen36::cli {

struct TpCliOptions {
  int ranks = 1;
  std::string split;  // "3,1": --tensor-split ratios
  bool expert_parallel = false;
};
void add_tp_options(CLI::App* cmd, TpCliOptions& o);

// Where a tensor-parallel model's weights come from: a checkpoint (loaded on the host and
// sharded), or a synthetic preset. A synthetic model is generated shard by shard on each
// rank's device (`per_rank_random`: bench, where only speed counts and a full-size model must
// not pass through one GPU), or generated whole on the host with `seed` and sharded (the same
// values as without -tp, so outputs can be compared).
struct TpWeightsSource {
  std::string model, synthetic, type = "bf16";
  int64_t layers = 0;
  bool per_rank_random = false;
  uint64_t seed = 42;
};

// Rank 0 on backend0 (made by the caller on device 0); the other ranks get backends named
// `backend` ("cpu": `threads` threads each; "cuda": device = rank). *name gets a description.
std::unique_ptr<Model> load_tp_model(const TpCliOptions& tp, const TpWeightsSource& src, Backend& backend0,
                                     const std::string& backend, int threads, std::string* name = nullptr);

// `bench` / `bench-serve` with -tp N > 1: each rank generates (synthetic) or loads its own
// shard; rank 0 on `backend`, which moves to this process's first device when that is not the
// one it was made on (device 0, where the bench measured its ceilings: a multi-process launch).
std::unique_ptr<Model> load_tp_bench_model(const TpCliOptions& tp, const TpWeightsSource& src,
                                           std::unique_ptr<Backend>& backend, const std::string& backend_name,
                                           int threads, std::string* name);

// `run` / `serve` with -tp N > 1: rank 0's backend on this process's first device and the
// tensor-parallel model of `model` (empty: the built-in model, or load_default_model's random
// one when none is shipped). Expert offload does not combine with it (refused).
LoadedModel load_tp_command_model(const TpCliOptions& tp, const std::string& model, const std::string& backend,
                                  int threads, const OffloadOptions& offload);

}  // namespace qwen36::cli
