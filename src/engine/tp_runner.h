#pragma once
// defines: TpOptions, make_tp_model (tensor parallelism over N local devices, one process,
//          one thread per rank), parse_tensor_split, make_rank_backend
//
// The returned Model is rank 0's shard on the caller's backend, with ModelPeers attached:
// its forward / mtp_forward / commit_speculative run the same call on every rank at once
// (ranks 1..N-1 on threads of their own, each with its own Backend, shard and mirror of the
// caller's ModelState) and return rank 0's logits. So the engine (generate, scheduler, spec)
// drives a tensor-parallel model exactly like a single-device one. Ranks meet in the
// all-reduces of Model::reduce: NCCL on CUDA devices, the host communicator on the CPU.
// Layout of the shards: model/tp_shard.h. Running across hosts: docs/multi-gpu.md.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/qwen36.h"
#include "model/tp_shard.h"

namespace qwen36 {

struct TpOptions {
  int ranks = 1;
  std::vector<double> split;  // --tensor-split: one ratio per rank; empty: even
  bool expert_parallel = false;  // --expert-parallel: routed experts apportioned whole (model/tp_shard.h)
};

// "3,1" → {3, 1}. Throws on anything but positive numbers.
std::vector<double> parse_tensor_split(const std::string& s);

// A backend on local device `device`: "cpu" (`threads` threads; 0 = all cores) or "cuda".
// Called on the rank's own thread (a CUDA backend binds that thread's device).
std::unique_ptr<Backend> make_rank_backend(const std::string& name, int device, int threads = 0);

// The device of this process's first rank for `ranks` ranks in all: 0, or with several
// processes (engine/tp_remote.h) LOCAL_RANK × ranks per process. The caller makes backend0 there.
int tp_first_local_device(int ranks);

using BackendFactory = std::function<std::unique_ptr<Backend>(int device)>;
// One rank's weights; called on that rank's thread after its backend exists.
using ShardFactory = std::function<ModelWeights(const TpShard& shard, const ModelConfig& shard_config)>;

// Rank 0's model on backend0 (this thread), ranks 1..n-1 on backends from make_backend. With
// one rank: the ordinary model. col_block: see plan_tensor_parallel.
// Several processes (RANK / WORLD_SIZE / MASTER_ADDR in the environment, tp_remote.h): each
// drives ranks/world ranks; process 0 gets rank 0's model as above, while in every other
// process this serves process 0's passes until it shuts the group down and returns nullptr.
std::unique_ptr<Model> make_tp_model(const ModelConfig& config, const TpOptions& opts, int64_t col_block,
                                     Backend& backend0, const BackendFactory& make_backend,
                                     const ShardFactory& shard_weights);
// The same, sharding full host weights (views and copies of `full`; it may be dropped after).
std::unique_ptr<Model> make_tp_model(const ModelWeights& full, const TpOptions& opts, Backend& backend0,
                                     const BackendFactory& make_backend);

}  // namespace qwen36
