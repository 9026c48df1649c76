#pragma once
// defines: ForwardBatch, Model (the Qwen3.5/3.6 decoder, dense and MoE, plus its MTP head)

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/expert_placement.h"
#include "model/state.h"
#include "model/weights.h"

namespace qwen36 {

class Comm;
class HostExpertCopy;
struct ForwardBatch;
struct SpecCommit;

// One public pass of a tensor-parallel model, as its other ranks replay it (Model::run_pass):
// plain data, so that it can also be sent to ranks in other processes.
struct PeerPass {
  enum class Kind : uint8_t { Forward, Mtp, Commit };
  Kind kind = Kind::Forward;
  const ForwardBatch* batch = nullptr;  // Forward
  std::span<const float> hidden;        // Mtp: hidden, next_tokens, runs, output_rows
  std::span<const int32_t> next_tokens, output_rows;
  std::span<const SeqRun> runs;
  std::span<const SpecCommit> commits;  // Commit
};

// Tensor parallelism (engine/tp_runner.h): the other ranks of a model whose Model is rank 0.
// run() replays `pass` on every other rank (each on its own thread, with its shard and its
// mirror of `state`, made on first use) while local() runs on the calling thread, and
// returns when all are done, rethrowing the first failure. A forward run at position 0
// starts its slot afresh on the mirrors (they do not see ModelState::reset_slot).
class ModelPeers {
 public:
  virtual ~ModelPeers() = default;
  virtual void run(ModelState& state, const PeerPass& pass, const std::function<void()>& local) = 0;
};

// Everything one forward pass needs. Prefill chunks and decode tokens of many sequences
// can share a batch: each SeqRun names a contiguous slice of `tokens`.
struct ForwardBatch {
  std::vector<int32_t> tokens;       // [T]
  std::vector<SeqRun> runs;          // covers tokens exactly
  std::vector<int32_t> output_rows;  // batch rows whose logits (and hidden) are returned, in order
  DeltaRuleMode deltanet_mode = DeltaRuleMode::Auto;
  // Speculative verify: indices into `runs` whose DeltaNet conv/recurrent state is only read
  // (their conv inputs and gates are saved in the state's speculation buffers, which must hold
  // the run); Model::commit_speculative then advances each by its accepted prefix. Their
  // attention KV is written as usual: rejected positions are overwritten later.
  std::vector<int32_t> verify_runs;
  // Tree verification (DDTree): per entry of verify_runs, the parent of each of the run's
  // tokens within the run (−1: token 0, the root), or empty for a chain. A tree's token i is
  // at position pos0 + depth(i), sees the context and its root path, and its logits are those
  // of decoding that path (Backend's tree ops); its K/V sit in cache row pos0 + i until the
  // commit (SpecCommit::path) moves the accepted path's rows into place.
  std::vector<std::vector<int32_t>> verify_trees;
  // Rows whose post-norm hidden state forward() returns; empty: output_rows. (MTP drafting
  // wants every prompt row's hidden state but only the last row's logits.)
  std::vector<int32_t> hidden_rows;
  // Target layers (0-based) whose outputs (the residual stream after the layer, before the
  // final norm) forward() returns for the hidden rows (or output_rows), concatenated in this
  // order per row: the context features of a DFlash drafter (model/dflash.h).
  std::vector<int32_t> capture_layers;

  // A single sequence's tokens at positions pos0.. in `slot`, returning the last row's logits
  // (or every row's when all_logits).
  static ForwardBatch single(std::span<const int32_t> tokens, int32_t pos0, int32_t slot = 0, bool all_logits = false);
};

// A tree verify run of a batch and its tokens' parents (ForwardBatch::verify_trees).
struct TreeRun {
  SeqRun run;
  std::span<const int32_t> parent;
};

// Output rows sampled on the backend (Model::forward_sample): their candidates come to the
// host instead of their logits (engine/sampler.h: Sampler::add_candidate_row and
// sample_from_candidates fill and read it).
struct SampleRequest {
  std::vector<SampleRowParams> rows;  // one per output row
  std::vector<PenaltyEntry> penalties;
  int32_t k = kSampleCandidates;  // candidates per row (at most the vocabulary)
  // Called for each output row, in order, once its candidates are on the host; false: they do
  // not suffice, and that row's full logits (penalties applied) are copied to
  // full_logits + row · vocab.
  std::function<bool(int32_t row, const SampleCandidates&)> take;
  float* full_logits = nullptr;  // host [output rows, vocab]: only refused rows are written
};

// Advance `slot`'s DeltaNet state by the first `keep` tokens of its last verify run — or, for
// a tree verify run, by the accepted path: `path` has bit i set for each of its tokens i (in the
// run; token 0, the root, always; each the parent of the next; keep bits in all), whose K/V rows
// are also moved from pos0 + i to pos0 + depth (pos0: the run's first position; any KV cache
// type). A bit set keeps this a plain value, as tensor-parallel messages copy it.
struct SpecCommit {
  int32_t slot = 0;
  int32_t keep = 0;
  int32_t pos0 = 0;
  uint64_t path = 0;  // 0: a chain (the first keep tokens)
  // The path's tokens, root first (empty for a chain).
  std::vector<int32_t> path_tokens() const;
};

class Model {
 public:
  // `placement`: layers whose routed experts stay in host memory and run on a CPU backend the
  // model owns (`host_threads`, 0: all cores) — expert offload, model/expert_placement.h.
  Model(ModelWeights weights, Backend& backend, const ExpertPlacement& placement = {}, int host_threads = 0);

  const ModelConfig& config() const { return w_.config; }
  const ModelWeights& weights() const { return w_; }
  Backend& backend() { return backend_; }
  bool has_mtp() const { return w_.mtp.has_value(); }
  const ExpertPlacement& expert_placement() const { return placement_; }
  // One-token host-expert passes that went through the decode pipeline so far (tests, logs).
  int64_t pipelined_host_passes() const;

  // Tensor parallelism (model/tp_shard.h). With a communicator, this model is one rank's
  // shard: the partial outputs of its row-parallel projections are summed over the ranks
  // before each residual add. With peers (rank 0 only), forward, mtp_forward and
  // commit_speculative run on every rank, and the results are rank 0's.
  void set_comm(Comm* comm) { comm_ = comm; }
  void set_peers(std::shared_ptr<ModelPeers> peers) { peers_ = std::move(peers); }
  ModelPeers* peers() const { return peers_.get(); }
  // A peer rank's part of rank 0's pass: the same call without logits or hidden outputs.
  void run_pass(const PeerPass& pass, ModelState& state);

  // Runs the batch, updating `state`. logits: host [output_rows, vocab]. hidden (optional):
  // host [output_rows, hidden], the final-normed hidden state that feeds lm_head and MTP.
  // captured (with batch.capture_layers): host [hidden_rows or output_rows, layers · hidden].
  void forward(const ForwardBatch& batch, ModelState& state, float* logits, float* hidden = nullptr,
               float* captured = nullptr);
  // forward() with the output rows sampled on the backend (Backend::sample_candidates): a
  // decode step moves a few hundred bytes per row to the host instead of the vocabulary's
  // logits. With tensor-parallel peers the logits come to the host and the candidates are
  // made there (the same values). Chain and tree verify runs and captured layers as forward().
  void forward_sample(const ForwardBatch& batch, ModelState& state, SampleRequest& req, float* hidden = nullptr,
                      float* captured = nullptr);

  // After a forward with verify_runs: replays the saved conv inputs and gates of each commit's
  // first `keep` verify tokens through the plain DeltaNet ops (token by token, as decode),
  // leaving the state where running only those tokens would have. No matmuls; the cost is
  // one pass of the recurrence over the kept tokens per DeltaNet layer.
  void commit_speculative(ModelState& state, std::span<const SpecCommit> commits);

  // MTP head: for each row i, predicts the token after next from the target's post-norm
  // hidden[i] (host [n, hidden]) and the following token next_tokens[i]; runs use the MTP's
  // own KV cache in `state`. logits: host [rows, vocab]; mtp_hidden (optional) gets the MTP's
  // normalised output, the hidden input of the next draft step. Every row runs (the MTP's KV
  // cache needs them all); only `output_rows` (all rows when empty) get logits and hidden —
  // a drafter catching up over a long prompt wants just the last row's.
  void mtp_forward(std::span<const float> hidden, std::span<const int32_t> next_tokens, std::span<const SeqRun> runs,
                   ModelState& state, float* logits, float* mtp_hidden = nullptr,
                   std::span<const int32_t> output_rows = {});
  // Greedy MTP drafting for chains that take every draft as the argmax (temperature 0, no
  // penalties): run i of `runs` is chain i's pending rows, as mtp_forward's (its last row gives
  // draft 1); steps 2..`steps` chain on the backend (the previous draft and MTP output, one
  // position on). drafts: host [steps, runs] (chain i's draft j + 1 at j · runs + i), the argmax
  // (lowest id on ties) of the logits mtp_forward would return at each step. One wait for the
  // host per call; each step recorded like a decode step. Not with tensor-parallel peers.
  void mtp_draft_greedy(std::span<const float> hidden, std::span<const int32_t> next_tokens,
                        std::span<const SeqRun> runs, ModelState& state, int32_t steps, int32_t* drafts);

  // Greedy decoding (every token the argmax, lowest id on ties: temperature 0, no penalties) of
  // a batch of one-token runs for `steps` steps: step j runs `runs` at pos0 + j, step 0 on
  // `tokens` (one per run, in run order), a later step on the previous step's tokens. On a
  // backend that records decode steps the tokens stay on the backend from step to step, and
  // step j + 1 is queued before the host reads step j's: on_step(j, tokens) is called for
  // every step in order, one step behind the backend, and returning false ends the call with
  // at most that one step more run (its cache rows and state written). Without recordings
  // (a host backend, tensor-parallel peers, host experts) each step waits for its tokens.
  void decode_greedy(std::span<const int32_t> tokens, std::span<const SeqRun> runs, ModelState& state,
                     int64_t steps, const std::function<bool(int64_t, std::span<const int32_t>)>& on_step);

 private:
  class Scratch;
  // A verify batch's runs, split, and where a DeltaNet layer saves its verify runs' inputs
  // (conv_input null: an attention layer, or no verify runs).
  struct VerifySave {
    std::span<const SeqRun> plain, verify;  // plain runs; chain verify runs
    std::span<const TreeRun> trees;         // tree verify runs
    std::span<const SeqRun> untreed;        // plain and chain verify runs: the batch ops' runs
    std::span<const SeqRun> saved;          // chain and tree verify runs: whose inputs are kept
    Tensor *conv_input, *g, *beta;          // the layer's speculation buffers
  };
  // A block's input x = rms_norm(h + delta) · norm. With a delta, the block's first op computes
  // the add (into h_out: the residual stream alternates between two buffers, Residual) and the
  // norm together with the matrix products that read x (project, or the MLP's
  // Backend::add_rms_norm_mlp), so a backend can prepare x for them in the norm's pass; without
  // one (a pass's first layer) x is already normalised.
  struct LayerInput {
    const Tensor& h;
    const Tensor* delta;
    Tensor& h_out;
    const Tensor& norm;
    Tensor& x;
  };
  // outs[i] = x · ws[i]ᵀ, the norm first when `in` has a delta.
  void project(const LayerInput& in, std::span<const Tensor* const> ws, std::span<Tensor* const> outs);
  Tensor attention_block(Scratch& s, const LayerWeights& l, const LayerInput& in, Tensor& k_cache, Tensor& v_cache,
                         std::span<const SeqRun> runs, const VerifySave* save = nullptr);
  Tensor deltanet_block(Scratch& s, const LayerWeights& l, const LayerInput& in, Tensor& conv_state, Tensor& ssm_state,
                        std::span<const SeqRun> runs, DeltaRuleMode mode, const VerifySave* save = nullptr);
  // The FFN blocks write their output into y [T, hidden].
  void mlp_block(Scratch& s, const MlpWeights& m, const LayerInput& in, Tensor& y);
  void moe_block(Scratch& s, const MoeWeights& m, const LayerInput& in, Tensor& y, bool host_experts = false);
  // moe_experts of a host-placed layer: inputs to the host, `device_work` queued on the main
  // backend, the experts on the CPU backend, the sum back into y — or, for a large batch, the
  // routed experts streamed to the main backend and computed there (stream_moe_experts).
  // `pack` holds the routing (HostPack's layout), written by moe_route.
  // `spare` ([T, hidden], main backend): room for the host's sum when the main backend computes
  // a share of the pass (device_share_).
  void host_moe_experts(const Tensor& x, Tensor& pack, std::span<const MlpWeights> experts, Tensor& y,
                        Tensor& spare, const std::function<void()>& device_work);
  // The exact path of a host-placed layer (expert_offload.cpp: the logits bitwise those of
  // all-GPU execution): whether it takes T tokens of these experts, then the pass. rows
  // [T·k, hidden] (main backend) receive every pair's row, y the sum; with a shared expert (sh:
  // its gate / up projections, down matrix, gate logit, and row [T, hidden] as room), its row
  // is folded into the sum where the main backend's moe_experts_shared would fold it (returns
  // true); else device_work computes it and the caller adds it, gated.
  struct HostShared {
    const Tensor &gate, &up, &down, &logit;
    Tensor& row;
  };
  bool host_rows_exact(std::span<const MlpWeights> experts, int64_t T) const;
  bool host_moe_rows(const Tensor& x, Tensor& pack, std::span<const MlpWeights> experts, Tensor& y, Tensor& rows,
                     const HostShared* sh, const std::function<void()>& device_work);
  // The exact path's device share: slots for its repacked experts (init_offload), and its rows.
  void init_share_slots();
  void share_rows(const Tensor& x, std::span<const int32_t> host_ids, std::span<const MlpWeights> experts, Tensor& rows);
  // views[experts[j]] (a layer's experts in the staging area) repacked into slot j, one launch;
  // false when the main backend does not repack them.
  bool tile_share(std::span<const MlpWeights> views, std::span<const int32_t> experts);
  // A host-placed MoE layer's [weights | ids | x] in one buffer of f32 words (the same layout on
  // the device and in HostStaging::pack), 256-byte aligned parts: one copy takes a decode
  // step's routing and input to the host.
  struct HostPack {
    int64_t T, K, D;
    HostPack(int64_t t, int64_t k, int64_t d) : T(t), K(k), D(d) {}
    int64_t ids_offset() const { return (T * K + 63) / 64 * 64; }
    int64_t x_offset() const { return 2 * ids_offset(); }
    int64_t floats() const { return x_offset() + T * D; }
    Tensor weights(void* base) const { return Tensor(base, DType::F32, {T, K}); }
    Tensor ids(void* base) const { return Tensor(static_cast<float*>(base) + ids_offset(), DType::I32, {T, K}); }
    Tensor x(void* base) const { return Tensor(static_cast<float*>(base) + x_offset(), DType::F32, {T, D}); }
  };
  // The staging area of streamed experts (stream_), when QWEN36_MOE_STREAM and the backend allow.
  void init_expert_stream();
  // Its tiled twin (ExpertStream::tiled), where the main backend's tiled experts compute more
  // pairs on its int8 kernels than its exact rows take (Backend::moe_tiled_pairs).
  void init_tiled_stream(size_t bytes);
  // Uploads the experts that host_ids (ids, on the host) route to into the staging area, runs
  // moe_experts on the main backend into y, then device_work; false (nothing done): the host
  // computes this pass (ExpertStreamMode, stream_experts_faster in model/expert_placement.h;
  // decide = false skips that choice: a decode pass's device share).
  // A pass of `tokens` tokens might stream (stream_moe_experts decides): the host copies its
  // routing before its input.
  bool may_stream_experts(int64_t tokens) const;
  // This layer's experts have a staging area on the main backend (a decode pass may share).
  bool streams_layer(std::span<const MlpWeights> experts) const;
  bool stream_moe_experts(const Tensor& x, const Tensor& weights, const Tensor& ids, std::span<const int32_t> host_ids,
                          std::span<const MlpWeights> experts, Tensor& y, const std::function<void()>& device_work,
                          bool decide = true);
  // The residual stream h and the last layer's FFN output, not yet added: each layer adds it
  // in the same pass as its input norm (LayerInput), and finish() adds the last. Those adds write
  // h + delta to `spare`, which then becomes h (advance): the ops that compute them may read h
  // in many places at once (Backend::add_rms_norm_matmul_multi).
  struct Residual {
    Tensor h, pending, spare;
    bool has_pending = false;
    void advance() { std::swap(h, spare); }
  };
  Residual residual(Scratch& s, int64_t T);
  void finish(Residual& r);
  // One decoder layer: h += mixer(norm(h)); h += ffn(norm(h)) (the second add left pending).
  void decoder_layer(Scratch& s, const LayerWeights& l, Residual& r, Tensor& cache_a, Tensor& cache_b,
                     std::span<const SeqRun> runs, DeltaRuleMode mode, const VerifySave* save = nullptr);
  // The MTP layer over e (next tokens' embeddings) and hin (hidden rows), both [n, H] and normed
  // in place: fc over [e | hin], one decoder layer on the MTP's KV cache → the residual stream.
  Tensor mtp_layer(Scratch& s, Tensor& e, Tensor& hin, std::span<const SeqRun> runs, ModelState& state);
  void head(Scratch& s, const Tensor& h, const Tensor& norm, std::span<const int32_t> rows, float* logits,
            float* hidden, SampleRequest* sample = nullptr);
  // The candidates of logits [rows, vocab] (backend memory, or host memory when on_host) for
  // req; refused rows' logits to req.full_logits.
  void sample_rows(Tensor& logits, SampleRequest& req, bool on_host);

  // chain (decode_greedy): the step's tokens are read from chain (I32, backend memory), and
  // its output rows' argmax ids written back there; the step runs even at its first sight.
  // captured: the output rows' batch.capture_layers outputs (a DFlash verify pass), as forward.
  bool decode_step(const ForwardBatch& batch, ModelState& state, float* logits, float* hidden,
                   SampleRequest* sample = nullptr, const VerifySave* verify = nullptr, Tensor* chain = nullptr,
                   float* captured = nullptr);
  // Layer i's outputs at `rows` into cap's column block j for each capture layer j equal to i.
  void capture_layer(Scratch& s, const Residual& r, std::span<const int32_t> layers, int64_t i,
                     std::span<const int32_t> rows, Tensor& cap);
  void replay_or_record(uint64_t key, int seen, const std::function<void()>& run);
  // Every run's rows are its slot's first `keep` (a tree's path compacted there first).
  void commit_layers(ModelState& state, std::span<const SeqRun> runs, int32_t T);
  // A forward pass on every rank: the peers' plain pass, rank0() here (forward / forward_sample).
  void forward_peers(const ForwardBatch& batch, ModelState& state, const std::function<void()>& rank0);
  // This rank's part of the public passes.
  void forward_rank(const ForwardBatch& batch, ModelState& state, float* logits, float* hidden,
                    float* captured = nullptr, SampleRequest* sample = nullptr);
  void mtp_forward_rank(std::span<const float> hidden, std::span<const int32_t> next_tokens,
                        std::span<const SeqRun> runs, ModelState& state, float* logits, float* mtp_hidden,
                        std::span<const int32_t> output_rows);
  void commit_speculative_rank(ModelState& state, std::span<const SpecCommit> commits);
  // path: cm.path_tokens().
  void compact_tree_path(ModelState& state, const SpecCommit& cm, std::span<const int32_t> path);
  // y ← Σ over ranks of y (a row-parallel projection's partial output); nothing without a comm.
  void reduce(Tensor& y);

  ModelWeights w_;
  Backend& backend_;
  Comm* comm_ = nullptr;
  ExpertPlacement placement_;
  std::unique_ptr<Backend> host_;  // runs the host-placed routed experts (null: none)
  struct HostStaging {
    std::vector<std::byte> pack;  // HostPack's layout
    std::vector<float> y;
    // The same two for passes of up to kPinnedTokens tokens (decode), page-locked by a device
    // main backend: the routing copy lands by DMA and the sum goes back as an upload queued
    // without a wait (the next pass's routing copy waits for the stream, so for it too).
    // Null: not page-locked (a host main backend, or the backend refused).
    static constexpr int64_t kPinnedTokens = 64;
    Backend* pinned_by = nullptr;
    std::byte* pinned = nullptr;
    size_t pinned_bytes = 0, pinned_y = 0;  // mapped bytes, y's offset
    void pin(Backend& b, int64_t k, int64_t d);
    // Host-expert passes of one token (decode), too many to log one by one: their phases'
    // total milliseconds, logged once (debug level) when the model goes.
    int64_t decode_passes = 0;
    double decode_ms[4] = {};  // routing and x to host, device work, host experts, sum back
    ~HostStaging();
  };
  std::shared_ptr<HostStaging> staging_;
  // Streaming host experts: backend staging memory for one host layer's routed experts, each
  // host layer's expert views into it, the host ranges pinned for the uploads (unpinned when
  // this goes, before w_'s storage does). Null: the host always computes them.
  struct ExpertStream;
  std::shared_ptr<ExpertStream> stream_;
  // The host experts' page-locked copy, which w_'s host-expert tensors point into (null: they
  // are read from the weights' own storage). Destroyed before w_; nothing reads them then.
  std::shared_ptr<HostExpertCopy> host_copy_;
  // Routed experts per token of a one-token host-layer pass run on the main backend
  // (ExpertStreamCost::device_share; needs the staging area, stream_).
  int device_share_ = 0;
  // Expert offload's decode pipeline (host_moe_experts): a one-token pass's host experts run on
  // a pool of spinning workers while this thread queues the device's work of the layer and of
  // the next one, the next behind a device-side wait for the host's signal
  // (Backend::wait_host_signal), which the pass raises when it ends; it is joined
  // (finish_host_pass) at the next host pass or when forward_rank's layer loop ends. Null:
  // passes run in place (a host main backend, no page-locked staging, QWEN36_HOST_PIPELINE=0).
  struct HostPipeline;
  std::shared_ptr<HostPipeline> pipeline_;
  void finish_host_pass();
  // The constructor's part for a placement with host experts (expert_offload.cpp).
  void init_offload(int host_threads);
  // Whether a pass may go to the pipeline (forward_rank's one-token layer loop).
  void set_pipeline_open(bool open);
  std::shared_ptr<ModelPeers> peers_;
  struct Workspace;
  std::shared_ptr<Workspace> ws_;  // activation memory reused across forward passes
  std::shared_ptr<DeviceBuffer> chain_ids_;  // decode_greedy's tokens (one address: recordings read it)
};

}  // namespace qwen36
