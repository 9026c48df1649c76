#pragma once
// defines: TpProcessEnv / tp_process_env (the ranks of a multi-process launch, from the
//          launcher's environment), TpLink (process 0's TCP connections to the other
//          processes), TpMessage / encode_pass / decode_pass (a tensor-parallel pass as bytes)
//
// Several processes (one per host, or one per GPU) form one tensor-parallel group: process 0
// runs the engine and sends every pass of its Model (PeerPass) to the others, which replay
// it on their shards; NCCL carries the all-reduces between all ranks. The link carries only
// these small commands and, at start, the NCCL unique id. docs/multi-gpu.md has the launch
// recipes and the failure behaviour.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/qwen36.h"

namespace qwen36 {

struct TpProcessEnv {
  int rank = 0, world = 1, local_rank = 0;
  std::string master_addr;
  int master_port = 0;
};

// torchrun / torch.distributed (RANK, WORLD_SIZE, LOCAL_RANK), Open MPI
// (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK) or Slurm (SLURM_PROCID, SLURM_NTASKS,
// SLURM_LOCALID), first found wins; MASTER_ADDR and MASTER_PORT name process 0 (required
// when world > 1). Nothing set: a single process (world 1).
TpProcessEnv tp_process_env();

// Process 0 listens on master_port and accepts world − 1 connections; every other process
// connects to master_addr:master_port, retrying until `timeout`. Messages are length-framed.
class TpLink {
 public:
  static std::unique_ptr<TpLink> open(const TpProcessEnv& env, std::chrono::seconds timeout);
  ~TpLink();
  void send_all(const std::string& msg);  // process 0: to every other process, in order
  std::string recv();                     // others: the next message from process 0 (Error when closed)
  const std::vector<int>& fds() const { return fds_; }

 private:
  TpLink() = default;
  std::vector<int> fds_;
};

// A pass as process 0 sends it, with the shape of rank 0's state it runs on.
struct TpMessage {
  enum class Kind : uint8_t { Pass, Shutdown };
  Kind kind = Kind::Pass;
  uint64_t state_key = 0;  // identifies rank 0's ModelState (its address)
  int32_t slots = 0, spec_tokens = 0;
  int64_t capacity = 0;
  bool mtp = false;
  DType kv = DType::F32;
  DType state = DType::F32;  // the DeltaNet recurrent state's element type
  PeerPass::Kind pass = PeerPass::Kind::Forward;
  // Owned copies of what PeerPass points to.
  std::unique_ptr<ForwardBatch> batch;
  std::vector<float> hidden;
  std::vector<int32_t> next_tokens, output_rows;
  std::vector<SeqRun> runs;
  std::vector<SpecCommit> commits;
  PeerPass view() const;
};

std::string encode_pass(const PeerPass& p, const ModelState& state);
std::string encode_shutdown();
TpMessage decode_message(const std::string& bytes);

}  // namespace qwen36
