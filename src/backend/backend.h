#pragma once
// defines: Backend, the one typed operation contract the model is written against;
//          SeqRun (a sequence's contiguous slice of a batch); DeviceBuffer
//
// The model (model/qwen36.cpp) calls only these operations. Each has a plain CPU
// implementation (backend/cpu/, the reference) and, later, a CUDA one; tests run both on the
// same random inputs. A backend is chosen once, at model load.
//
// Conventions: activations are f32 [rows, cols] row-major tensors living in the backend's
// memory; weights are ModelWeights tensors in any stored dtype. T = tokens in the batch.
// Per-sequence state (KV cache, conv and recurrent state) is indexed by SeqRun::slot.

#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/weights.h"

namespace qwen36 {

// Tokens [begin, begin + count) of the batch belong to state slot `slot` and sit at
// positions pos0, pos0 + 1, ... of that sequence.
struct SeqRun {
  int32_t slot = 0;
  int32_t pos0 = 0;
  int32_t begin = 0;
  int32_t count = 0;
};

// ---- sampling on the backend (Backend::sample_candidates, engine/sampler.h) ----
// One output row's sampling parameters.
struct SampleRowParams {
  float temperature = 0;  // stats are of logits / temperature (of the logits when 0: greedy)
  float repetition_penalty = 1, presence_penalty = 0, frequency_penalty = 0;
  int32_t penalty_begin = 0, penalty_count = 0;  // this row's entries of the penalty list
};
// A token the row's history holds and how often (unique per row; tokens outside the vocabulary
// are ignored).
struct PenaltyEntry {
  int32_t token = 0, count = 0;
};
constexpr int32_t kSampleCandidates = 64;      // candidates per row the engine asks for
constexpr int32_t kMaxSampleCandidates = 256;  // the op's limit
// The penalty formula of Sampler and every backend, bit for bit: repetition (divides a positive
// logit, multiplies a negative one), then presence + frequency · count subtracted. The fma
// leaves no room for a compiler's contraction choice (host -ffp-contract, nvcc), which would
// round differently on the two sides.
inline float penalised_logit(float l, const SampleRowParams& p, int32_t count) {
  if (p.repetition_penalty != 1.0f) l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
  return l - std::fma(p.frequency_penalty, float(count), p.presence_penalty);
}
// One row's candidates on the host (views into the op's outputs).
struct SampleCandidates {
  std::span<const int32_t> ids;   // k token ids, logit descending, ties to the lower id
  std::span<const float> logits;  // their logits after the penalties (copies)
  float max = 0;      // max over the whole row of x = logit / T (T: the row's temperature, 1 when 0)
  float sum_exp = 0;  // Σ exp(x − max) over the whole row (≤ 1e-5 relative error)
  float next = 0;     // the largest logit not among the candidates (−inf: the candidates are the row)
  int64_t vocab = 0;
};

class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  virtual void* data() const = 0;
  virtual size_t size() const = 0;
};

enum class DeltaRuleMode : uint8_t {
  Auto,       // chunked for runs longer than one token, recurrent otherwise
  Chunked,    // chunk-64 WY/UT form (prefill)
  Recurrent,  // token by token (decode)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // ---- memory ----
  virtual std::unique_ptr<DeviceBuffer> alloc(size_t bytes) = 0;  // zero-filled
  virtual void copy_to_host(const Tensor& src, void* dst) = 0;
  // copy_to_host without waiting: queued on the ops' stream after the ops queued before it,
  // returning a ticket at once; wait_download(ticket) returns once that download has landed in
  // its dst, which must stay valid until then. A download that is never waited for never
  // writes its dst (an exception between the two leaves nothing behind). A host loop can so read
  // step n's results while step n + 1 runs (Model::decode_greedy). The default (a host backend)
  // copies at once.
  virtual uint64_t download(const Tensor& src, void* dst) {
    copy_to_host(src, dst);
    return 0;
  }
  virtual void wait_download(uint64_t ticket) { (void)ticket; }
  virtual void copy_from_host(const void* src, Tensor& dst) = 0;
  virtual void fill_zero(Tensor& t) = 0;
  virtual void copy(const Tensor& src, Tensor& dst) = 0;  // same dtype and element count
  // dst[:, dst_col0 : dst_col0 + width] = src[:, src_col0 : src_col0 + width]   (f32, same row count)
  virtual void copy_cols(const Tensor& src, int64_t src_col0, Tensor& dst, int64_t dst_col0, int64_t width) = 0;
  // dst[i, :] = src[rows[i], :]
  virtual void get_rows(const Tensor& src, std::span<const int32_t> rows, Tensor& dst) = 0;
  // Makes the weights usable by this backend (uploads them for a device backend).
  virtual void prepare_weights(ModelWeights& w) = 0;
  // The same, but the tensors in `keep` (addresses of tensors of w: routed experts that a host
  // backend computes, model/expert_placement.h) are left exactly as they are: not uploaded,
  // not repacked, their host storage kept alive. The default suits a host backend, which
  // reads every weight in place anyway.
  virtual void prepare_weights_except(ModelWeights& w, const std::set<const Tensor*>& keep) {
    (void)keep;
    prepare_weights(w);
  }
  // Bytes of backend memory still free for caches and activations; 0: not tracked (host
  // memory), so memory plans are not checked against it.
  virtual size_t free_memory() { return 0; }
  // Bytes of w already in this backend's memory (a device backend's random weights generated
  // in place), which free_memory() no longer counts but a plan for w must: 0 on a host backend.
  virtual size_t resident_bytes(ModelWeights& /*w*/) { return 0; }

  // ---- streaming host memory in (expert offload: Model::host_moe_experts streams a host
  // layer's routed experts to the backend for a large batch) ----
  // Makes host memory [p, p + bytes) fast to copy from, once, ahead of many uploads: a device
  // backend page-locks it so that upload() reads it by DMA, without a bounce buffer and without
  // holding the calling thread. Without device_writes the memory is only ever read through
  // this (a read-only file mapping qualifies); with it, copy_to_host may land there too (a
  // device backend registers it writable: page-locked read-only, a device-to-host copy into it
  // is refused). Ranges may overlap earlier ones. false: it could not, and copies from it
  // still work, slower. The default (a host backend reads host memory directly): true.
  virtual bool pin_host_memory(const void* p, size_t bytes, bool device_writes = false) {
    (void)p;
    (void)bytes;
    (void)device_writes;
    return true;
  }
  // Undoes pin_host_memory for every pinned range overlapping [p, p + bytes); the owner of the
  // memory calls it before the memory is unmapped or freed.
  virtual void unpin_host_memory(const void* p, size_t bytes) {
    (void)p;
    (void)bytes;
  }
  // dst[0, bytes) = src[0, bytes): host bytes into backend memory (from alloc), queued on the
  // stream the ops run on, so that it lands after the ops queued before it have read dst and
  // before the ops queued after it read it, with no wait for the host. src must stay unchanged
  // until those later ops have run (weights do). From pinned memory the call returns at once;
  // otherwise it may return only once src has been read. The default is copy_from_host (a
  // synchronous copy); the CPU backend's is a plain memcpy.
  virtual void upload(const void* src, void* dst, size_t bytes) {
    Tensor t(dst, DType::U8, {int64_t(bytes)});
    copy_from_host(src, t);
  }
  // Several upload()s whose destinations do not overlap, done in any order among themselves:
  // a device backend queues the page-locked ones with one driver call instead of one each (a
  // decode pass's device share of host experts is up to 9 pieces). Default: upload() each.
  struct UploadPiece {
    const void* src;
    void* dst;
    size_t bytes;
  };
  virtual void upload_batch(std::span<const UploadPiece> pieces) {
    for (const UploadPiece& p : pieces) upload(p.src, p.dst, p.bytes);
  }
  // A word in host memory that the device reads: wait_host_signal(v) queues a wait, on the
  // stream the ops run on, until the host has stored a value ≥ v in it (a release store), so
  // that ops queued after it may read host memory the host fills after queuing them (expert
  // offload's decode pipeline: the next layer is queued while the host computes this one's
  // experts). Something must raise every value a wait is queued for, without waiting for the
  // stream first (expert offload: the host pool's thread that ends the pass). nullptr: this
  // backend has none (a host backend's ops run at once).
  virtual std::atomic<uint64_t>* host_signal() { return nullptr; }
  virtual void wait_host_signal(uint64_t value) { (void)value; }

  // ---- elementwise and normalisation ----
  // out[t] = table[ids[t]]                                  table (vocab, D) any dtype → out [T, D]
  virtual void embed(const Tensor& table, std::span<const int32_t> ids, Tensor& out) = 0;
  // embed with the ids an I32 tensor in this backend's memory (tokens an op of this backend
  // chose: argmax_rows), so a chain of steps needs no host round trip. The default reads them
  // as host memory (a host backend's).
  virtual void embed_ids(const Tensor& table, const Tensor& ids, Tensor& out) {
    embed(table, std::span<const int32_t>(ids.as<int32_t>(), size_t(ids.numel())), out);
  }
  // out = x * rsqrt(mean(x²) + eps) * w, per row of length D = w.numel()   x, out [R, D]
  virtual void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) = 0;
  // out = (w * x * rsqrt(mean(x²) + eps)) * silu(z), per row    x, z, out [R, D]; w (D)
  virtual void gated_rms_norm(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Tensor& out) = 0;
  virtual void add(Tensor& y, const Tensor& x) = 0;                                 // y += x
  virtual void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) = 0;        // silu(gate) * up
  virtual void sigmoid_mul(Tensor& x, const Tensor& gate) = 0;                       // x *= sigmoid(gate), same shape
  // y[t, :] += sigmoid(s[t]) * x[t, :]                    y, x [T, D]; s [T, 1]
  virtual void add_sigmoid_scaled(Tensor& y, const Tensor& x, const Tensor& s) = 0;

  // ---- matrix products ----
  // out[T, N] = x[T, K] · w[N, K]ᵀ for any weight dtype
  virtual void matmul(const Tensor& x, const Tensor& w, Tensor& out) = 0;

  // ---- fused forms: the defaults compose the plain ops (that is their reference); a backend
  // overrides them where one pass saves launches or memory traffic (decode) ----
  // outs[i] = x · ws[i]ᵀ for every i: several weights applied to the same activations (the
  // DeltaNet in-projections, attention q/k/v). outs[i] [T, ws[i].rows()].
  virtual void matmul_multi(const Tensor& x, std::span<const Tensor* const> ws, std::span<Tensor* const> outs) {
    for (size_t i = 0; i < ws.size(); ++i) matmul(x, *ws[i], *outs[i]);
  }
  // gate_out = silu(x · gateᵀ) * (x · upᵀ). up_out is scratch of gate_out's shape, which a fused
  // implementation may leave untouched.
  virtual void matmul_swiglu(const Tensor& x, const Tensor& gate, const Tensor& up, Tensor& gate_out,
                             Tensor& up_out) {
    matmul(x, gate, gate_out);
    matmul(x, up, up_out);
    swiglu(gate_out, up_out, gate_out);
  }
  // out = (x ⊙ sigmoid(gate)) · wᵀ: attention's gated output projection. x is scratch (the
  // default scales it in place; a fused form may leave it as it was).
  virtual void gated_matmul(Tensor& x, const Tensor& gate, const Tensor& w, Tensor& out) {
    sigmoid_mul(x, gate);
    matmul(x, w, out);
  }
  // out = gated_rms_norm(x, z, norm, eps) · wᵀ, x [T, H, D] read as [T, H·D] by w [N, H·D]:
  // DeltaNet's gated norm and output projection. x is scratch as above (the default normalises
  // it in place).
  virtual void gated_norm_matmul(Tensor& x, const Tensor& z, const Tensor& norm, float eps, const Tensor& w,
                                 Tensor& out) {
    gated_rms_norm(x, z, norm, eps, x);
    const int64_t K = w.cols(), T = K ? x.numel() / K : 0;
    matmul(Tensor(x.data, x.dtype, {T, K}), w, out);
  }
  // out = down · (silu(x · gateᵀ) * (x · upᵀ)): the whole MLP. gate_out and up_out are scratch
  // [T, I] that a fused implementation may leave untouched.
  virtual void mlp(const Tensor& x, const MlpWeights& m, Tensor& gate_out, Tensor& up_out, Tensor& out) {
    matmul_swiglu(x, m.gate_proj, m.up_proj, gate_out, up_out);
    matmul(gate_out, m.down_proj, out);
  }
  // y += delta; out = rms_norm(y, w, eps)   (the residual add and the next norm in one pass)
  virtual void add_rms_norm(Tensor& y, const Tensor& delta, const Tensor& w, float eps, Tensor& out) {
    add(y, delta);
    rms_norm(y, w, eps, out);
  }
  // y_out = y + delta; out = rms_norm(y_out, w, eps). y_out is y itself (in place) or a buffer
  // of y's shape overlapping neither y nor delta. (The composition copies y first; a backend may
  // read y and write y_out in one pass.)
  virtual void add_rms_norm_into(const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w, float eps,
                                 Tensor& out) {
    if (y_out.data != y.data) copy(y, y_out);
    add_rms_norm(y_out, delta, w, eps, out);
  }
  // A layer's residual add and norm (add_rms_norm_into: y_out = y + delta, x = its norm) with the
  // ops that read x first: its projections (the mixer's in-projections, the MoE router and shared
  // expert) or its MLP. A backend may prepare x for those matrix products in the norm's own pass
  // (the CUDA backend's int8 activations for quantized weights), or, with y_out other than y,
  // compute the norm where x is read (every block of its one-token quantized GEMM does): nothing
  // there rewrites y while other readers still need it.
  virtual void add_rms_norm_matmul_multi(const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w,
                                         float eps, Tensor& x, std::span<const Tensor* const> ws,
                                         std::span<Tensor* const> outs) {
    add_rms_norm_into(y, delta, y_out, w, eps, x);
    matmul_multi(x, ws, outs);
  }
  virtual void add_rms_norm_mlp(const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w, float eps,
                                Tensor& x, const MlpWeights& m, Tensor& gate_out, Tensor& up_out, Tensor& out) {
    add_rms_norm_into(y, delta, y_out, w, eps, x);
    mlp(x, m, gate_out, up_out, out);
  }

  // ---- gated full attention ----
  // qg [T, H, 2·hd] (per head [q | gate]) → q [T, H, hd], gate [T, H·hd]
  virtual void split_q_gate(const Tensor& qg, Tensor& q, Tensor& gate) = 0;
  // NeoX RoPE on the leading rotary_dim dims of every head, pairing (i, i + rotary_dim/2).
  // x [T, heads, hd]; positions come from runs.
  virtual void rope(Tensor& x, std::span<const SeqRun> runs, int64_t rotary_dim, float theta) = 0;
  // The attention's q and k before it: q = rope(rms_norm(q) · q_norm) with q the q halves of qg
  // (per head [q | gate], the gate halves to *gate) or, without a gate, qg itself (q is qg: in
  // place); k = rope(rms_norm(k) · k_norm) in place. Norms per head over hd; RoPE as rope().
  virtual void qk_norm_rope(const Tensor& qg, Tensor& q, Tensor* gate, Tensor& k, const Tensor& q_norm,
                            const Tensor& k_norm, float eps, std::span<const SeqRun> runs, int64_t rotary_dim,
                            float theta) {
    if (gate) split_q_gate(qg, q, *gate);
    rms_norm(q, q_norm, eps, q);
    rms_norm(k, k_norm, eps, k);
    rope(q, runs, rotary_dim, theta);
    rope(k, runs, rotary_dim, theta);
  }
  // Appends k, v [T, KVH, hd] to the caches at each run's positions, then causal softmax
  // attention of q [T, H, hd] over positions [0, pos] of its sequence (GQA: head h reads kv
  // head h / (H/KVH)). k_cache, v_cache [slots, capacity, KVH, hd]. out [T, H, hd].
  virtual void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache,
                         std::span<const SeqRun> runs, float scale, Tensor& out) = 0;

  // ---- Gated DeltaNet ----
  // Depthwise causal conv over time then SiLU, in place on x [T, C]; w [C, K];
  // conv_state [slots, C, K-1] holds each sequence's last K-1 inputs and is updated.
  virtual void causal_conv1d_silu(Tensor& x, const Tensor& w, Tensor& conv_state, std::span<const SeqRun> runs) = 0;
  // The same with x's [q | k | v] column blocks (widths from q, k, v [T, ·]) written to q, k, v:
  // x is scratch (its contents afterwards are unspecified). The default runs causal_conv1d_silu
  // and copies the blocks out; a device backend writes them from its conv kernel directly.
  virtual void causal_conv1d_silu_split(Tensor& x, const Tensor& w, Tensor& conv_state, std::span<const SeqRun> runs,
                                        Tensor& q, Tensor& k, Tensor& v);
  // x's [q | k | v] column blocks (widths from q, k, v [T, ·]) copied to q, k, v. The default
  // runs three copy_cols; a device backend copies them in one launch.
  virtual void copy_column_blocks(const Tensor& x, Tensor& q, Tensor& k, Tensor& v);
  // g = a_neg_exp * softplus(a + dt_bias), beta = sigmoid(b)      g, beta [T, Hv]; a, b [T, Hv],
  // or [T, G > Hv] whose first Hv columns count (a shard's padded projections, ModelConfig::gate_rows)
  virtual void deltanet_gates(const Tensor& a, const Tensor& b, const Tensor& a_neg_exp, const Tensor& dt_bias,
                              Tensor& g, Tensor& beta) = 0;
  // The gated delta rule with q, k L2-normalised inside and q scaled by 1/sqrt(dk):
  //   S ← e^g S;  S ← S + k (β (v − Sᵀk))ᵀ;  o = Sᵀ q         per value head
  // q, k [T, Hk, dk]; v [T, Hv, dv]; g, beta [T, Hv]; state [slots, Hv, dk, dv] (f32, updated);
  // out [T, Hv, dv]. Value head h reads key head h / (Hv/Hk).
  virtual void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                const Tensor& beta, Tensor& state, std::span<const SeqRun> runs, Tensor& out,
                                DeltaRuleMode mode = DeltaRuleMode::Auto) = 0;
  // The DeltaNet mixer of a decode step, every run exactly one token (run i = row i):
  //   causal_conv1d_silu(mixed, w.conv1d, conv_state); g, beta = deltanet_gates(a, b, ...);
  //   q, k, v = mixed's [q | k | v] column blocks; gated_delta_rule(q, k, v, g, beta, ssm_state,
  //   Recurrent) → out; out = gated_rms_norm(out, z, w.norm, eps).
  // mixed [T, conv_dim] is scratch (its contents afterwards are unspecified); z, out [T, Hv, dv],
  // out's head blocks in out_proj's order where w.out_proj_heads gives one (block p: head
  // out_proj_heads[p], as a GGUF out_proj reads them; the same in deltanet_verify and _tree);
  // a, b as deltanet_gates' ([T, Hv] or padded rows); conv_state, ssm_state as above (updated).
  // Head counts and dims come from the shapes: dk = ssm_state.dim(2), Hk = (conv_dim − Hv·dv) /
  // (2·dk). The default composes the ops above (the reference); a device backend fuses them, since a decode step's DeltaNet is
  // bound by launches and latency, not arithmetic.
  virtual void deltanet_decode(Tensor& mixed, const Tensor& z, const Tensor& a, const Tensor& b,
                               const DeltaNetWeights& w, float eps, Tensor& conv_state, Tensor& ssm_state,
                               std::span<const SeqRun> runs, Tensor& out);

  // The DeltaNet mixer of a chain verify pass (speculative decoding) in one op: the runs in
  // `verify` (some of `runs`, the batch's) only read their state, as the _readonly ops below,
  // and keep their inputs for the commit: rows [0, count) of the run's slot in conv_in
  // [slots, n, C] (mixed before the conv), g_in and beta_in [slots, n, Hv]; every other run
  // is one token that advances its state, as in deltanet_decode, whose arguments the rest are.
  // Returns false, having done nothing, where the backend has no fused form for the batch: the
  // model then composes the plain and read-only ops (Model::deltanet_block) — the reference
  // this op is tested against.
  virtual bool deltanet_verify(Tensor& /*mixed*/, const Tensor& /*z*/, const Tensor& /*a*/, const Tensor& /*b*/,
                               const DeltaNetWeights& /*w*/, float /*eps*/, Tensor& /*conv_state*/,
                               Tensor& /*ssm_state*/, std::span<const SeqRun> /*runs*/,
                               std::span<const SeqRun> /*verify*/, Tensor& /*conv_in*/, Tensor& /*g_in*/,
                               Tensor& /*beta_in*/, Tensor& /*out*/) {
    return false;
  }
  // The DeltaNet mixer of a tree verify pass (DDTree) whose only run is the tree `run` (parents
  // `parent`, as the _tree_readonly ops below take them), in one op: the state only read, every
  // token's output that of a chain verify pass over its root path, the inputs kept for the
  // commit as deltanet_verify keeps a verify run's (row i of the slot: token i). The rest as
  // deltanet_verify; false, having done nothing, where the backend has no fused form (the model
  // composes the tree ops, the reference).
  virtual bool deltanet_verify_tree(Tensor& /*mixed*/, const Tensor& /*z*/, const Tensor& /*a*/, const Tensor& /*b*/,
                                    const DeltaNetWeights& /*w*/, float /*eps*/, Tensor& /*conv_state*/,
                                    Tensor& /*ssm_state*/, const SeqRun& /*run*/, std::span<const int32_t> /*parent*/,
                                    Tensor& /*conv_in*/, Tensor& /*g_in*/, Tensor& /*beta_in*/, Tensor& /*out*/) {
    return false;
  }
  // The commit of a chain verify pass (Model::commit_speculative) in one op: each run's state
  // advances through rows [0, count) of its slot's saved inputs (deltanet_verify's conv_in, g_in,
  // beta_in), as causal_conv1d_silu and gated_delta_rule (Recurrent) over those rows would;
  // mixed [T, C] (T the runs' tokens) is scratch. False, having done nothing, where the backend
  // has no fused form: the model composes those ops (Model::commit_layers), the reference.
  virtual bool deltanet_commit(const DeltaNetWeights& /*w*/, Tensor& /*conv_state*/, Tensor& /*ssm_state*/,
                               std::span<const SeqRun> /*runs*/, const Tensor& /*conv_in*/, const Tensor& /*g_in*/,
                               const Tensor& /*beta_in*/, Tensor& /*mixed*/) {
    return false;
  }

  // ---- speculative verify: DeltaNet without advancing the state ----
  // The verify pass of speculative decoding runs k drafts that may be rejected. The recurrent
  // and conv state cannot be truncated afterwards, so verify runs only READ them: the
  // outputs are exactly those of causal_conv1d_silu / gated_delta_rule (token by token, as
  // decode runs), and the state is left as it was. Once the accepted count n is known, the
  // model replays the first n tokens' saved inputs through the plain ops, which advances the
  // state to exactly where n decode steps would have left it (Model::commit_speculative).
  // Defaults throw: a backend without them cannot run speculative decoding.
  virtual void causal_conv1d_silu_readonly(Tensor& x, const Tensor& w, const Tensor& conv_state,
                                           std::span<const SeqRun> runs);
  virtual void gated_delta_rule_readonly(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                         const Tensor& beta, const Tensor& state, std::span<const SeqRun> runs,
                                         Tensor& out);

  // ---- tree verify (DDTree): a verify run whose tokens form a tree ----
  // parent[i] is token i's parent within the run (−1 for token 0, the root, and only for it;
  // parents before children). Token i stands at position pos0 + depth(i), attends to the
  // context and its root path (its K/V land in cache row pos0 + i), and starts its DeltaNet
  // recurrence from its parent's end state; the state is only read. Each token's output is
  // exactly that of decoding its root path (the CPU reference: cpu_ops.h, "tree verification").
  // The defaults compose the backend's chain ops over root paths (backend/tree_ops.h): correct on
  // any backend, not fast; a device backend overrides them with tree kernels.
  virtual void rope_tree(Tensor& x, const SeqRun& run, std::span<const int32_t> parent, int64_t rotary_dim,
                         float theta);
  virtual void attention_tree(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache,
                              const SeqRun& run, std::span<const int32_t> parent, float scale, Tensor& out);
  virtual void causal_conv1d_silu_tree_readonly(Tensor& x, const Tensor& w, const Tensor& conv_state,
                                                const SeqRun& run, std::span<const int32_t> parent);
  virtual void gated_delta_rule_tree_readonly(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                              const Tensor& beta, const Tensor& state, const SeqRun& run,
                                              std::span<const int32_t> parent, Tensor& out);
  // A tree commit's rows (Model::commit_speculative): in every tensor of `ts` (each [n, ...] of
  // any type, rows contiguous) row j becomes row from[j], for j = 0, 1, ... in order, so that the
  // accepted path stands where a chain's accepted tokens would. from[j] ≥ j and < n: no row is
  // overwritten before it is read. The default copies row by row; a device backend moves them
  // all in one launch.
  virtual void compact_rows(std::span<Tensor> ts, std::span<const int32_t> from);

  // ---- batch tables and one-step graphs (optional; the defaults do nothing) ----
  // The token ids, runs and output rows of the forward pass about to run. A device backend
  // uploads them once; ops later given spans with the same contents read that device copy.
  virtual void set_batch(std::span<const int32_t> /*tokens*/, std::span<const SeqRun> /*runs*/,
                         std::span<const int32_t> /*rows*/) {}
  // The tree verify runs of that forward pass (after set_batch; none until called again): run
  // i's tokens have parents[i], as the tree ops will be given them. A device backend builds the
  // tree ops' tables (positions, ancestor masks, root paths) and uploads them once, so that those
  // ops read them on the device and a recorded pass can replay any tree of the same size.
  virtual void set_batch_trees(std::span<const SeqRun> /*runs*/,
                               std::span<const std::span<const int32_t>> /*parents*/) {}
  // Records the ops issued until end_capture instead of running them; false: not supported
  // (then nothing is being recorded).
  virtual bool begin_capture() { return false; }
  // Ends the recording and keeps it under `key` when `keep` and every recorded op could be
  // recorded; returns whether it was kept. Nothing recorded has run yet.
  virtual bool end_capture(uint64_t /*key*/, bool /*keep*/) { return false; }
  // Runs the recording kept under `key` (its ops read the tables of the last set_batch);
  // false when there is none.
  virtual bool replay(uint64_t /*key*/) { return false; }
  // Frees every kept recording. A recording that holds a collective keeps its communicator
  // alive: NCCL's ncclCommDestroy waits until every graph that captured one of its operations is
  // destroyed, so the recordings go before the communicator (tensor-parallel teardown).
  virtual void drop_recordings() {}
  // The device stream the ops are queued on (a cudaStream_t for CUDA), for collectives that
  // must run in the same order as the ops (backend/comm.h); nullptr on the CPU.
  virtual void* native_stream() { return nullptr; }

  // ---- mixture of experts ----
  // softmax over all experts → top-k → renormalise (when renorm) → weights [T, k] f32, ids [T, k] i32
  virtual void moe_route(const Tensor& logits, int64_t k, bool renorm, Tensor& weights, Tensor& ids) = 0;
  // Expert parallelism: ids [T, k] of all experts → the index among experts [e0, e0 + n) of this
  // rank, −1 for the others; moe_experts skips −1 (contributes nothing).
  virtual void moe_local_ids(Tensor& ids, int64_t e0, int64_t n) = 0;
  // out[t] = Σ_j weights[t, j] · down_e(silu(gate_e x_t) * up_e x_t), e = ids[t, j]     x, out [T, D]
  virtual void moe_experts(const Tensor& x, const Tensor& weights, const Tensor& ids,
                           std::span<const MlpWeights> experts, Tensor& out) = 0;
  // moe_experts, then the shared expert's second half added, gated:
  //   out[t] += sigmoid(s[t]) · down(silu(sh_gate[t]) * sh_up[t])
  // sh_gate, sh_up [T, I_s] are the shared expert's gate and up projections of x, s [T, 1] its
  // gate logit. sh_gate and sh_out [T, D] are scratch (the composition writes the SwiGLU into
  // sh_gate and the down projection into sh_out); a backend may run the shared expert as one
  // more pair of its expert kernels and leave them untouched (a decode step: three launches fewer).
  virtual void moe_experts_shared(const Tensor& x, const Tensor& weights, const Tensor& ids,
                                  std::span<const MlpWeights> experts, Tensor& sh_gate, const Tensor& sh_up,
                                  const Tensor& down, const Tensor& s, Tensor& sh_out, Tensor& out) {
    moe_experts(x, weights, ids, experts, out);
    swiglu(sh_gate, sh_up, sh_gate);
    matmul(sh_gate, down, sh_out);
    add_sigmoid_scaled(out, sh_out, s);
  }

  // ---- expert offload's exact combination (Model::host_moe_experts; issue 11) ----
  // moe_experts as rows and one sum, so that pairs computed elsewhere (the host's experts, with
  // this backend's arithmetic: cpu::MoePass's exact path for the CUDA backend's tiled kernels)
  // join the sum exactly where this backend would have added them.
  // rows [T·k, D]: row t·k + j = down_e(silu(gate_e x_t) * up_e x_t), e = ids[t, j] in [0, E),
  // unweighted, as moe_experts computes it before weighting (other rows untouched). False,
  // nothing done, when this backend's moe_experts does not sum such rows for these experts.
  virtual bool moe_expert_rows(const Tensor& /*x*/, const Tensor& /*ids*/, std::span<const MlpWeights> /*experts*/,
                               Tensor& /*rows*/) {
    return false;
  }
  // sh_row [T, D]: the shared expert's down row as moe_experts_shared folds it into the routed
  // sum (sh_gate, sh_up, down as there), for T tokens routed top-k to experts of these types and
  // shapes as this backend would hold them resident. False, nothing done, when
  // moe_experts_shared would compose instead (swiglu, matmul, add_sigmoid_scaled).
  virtual bool moe_shared_row(std::span<const MlpWeights> /*experts*/, int64_t /*k*/, const Tensor& /*sh_gate*/,
                              const Tensor& /*sh_up*/, const Tensor& /*down*/, Tensor& /*sh_row*/) {
    return false;
  }
  // out[t] = Σ_j weights[t, j] · rows[t·k + j] over ids[t, j] in [0, E), fused multiply-adds in j
  // order from 0, then (sh_row) + sigmoid(s[t]) · sh_row[t]: the sums of moe_experts (and of
  // moe_experts_shared's fold) for up to moe_row_pairs() pairs.
  virtual void moe_combine_rows(const Tensor& rows, const Tensor& weights, const Tensor& ids, int64_t E,
                                const Tensor* sh_row, const Tensor* s, Tensor& out) = 0;
  // The most pairs (T·k) for which moe_experts on experts that moe_expert_rows takes sums as
  // moe_combine_rows does.
  virtual int64_t moe_row_pairs() const { return 0; }
  // The most pairs for which moe_experts on experts in this backend's repacked layout (tile_into's,
  // tile_weights') computes on the kernels whose rows moe_expert_rows gives (above: another path,
  // e.g. dequantized); at least moe_row_pairs() where that is not 0.
  virtual int64_t moe_tiled_pairs() const { return moe_row_pairs(); }
  // ws[i] (GGUF blocks in this backend's memory) repacked into dsts[i] (ws[i].nbytes()) in the
  // layout this backend's expert kernels read (the CUDA backend's tiles, one launch for a few
  // experts); tiled[i]: the view of dsts[i]. False, nothing done, when this backend has no such
  // layout or one of ws does not take it.
  virtual bool tile_into(std::span<const Tensor> /*ws*/, std::span<void* const> /*dsts*/, std::span<Tensor> /*tiled*/) {
    return false;
  }

  // ---- sampling ----
  // logits [R, V] f32, R = rows.size(). Per row r, with its parameters rows[r]:
  //   1. each of its penalty entries (t, c): logits[r, t] = penalised_logit(logits[r, t], rows[r], c)
  //      (in place; a row without entries is left as it is)
  //   2. ids[r, 0..k), vals[r, 0..k): the k largest logits, logit descending, ties to the lower
  //      id; vals are copies of the (penalised) logits
  //   3. stats[r, 0..3) = {max, sum_exp, next}: with x = logits[r, :] / T (IEEE division; T the
  //      row's temperature, 1 when 0), max = max x, sum_exp = Σ exp(x − max) over all V (f32
  //      accumulation allowed: ≤ 1e-5 relative), next = the (k+1)-th largest logit (−inf when k = V)
  // ids, vals, stats are host memory; 1 ≤ k ≤ min(V, kMaxSampleCandidates). A device backend
  // moves only these few values to the host. Not recordable (its tables change every call).
  // The default copies the logits to the host, runs the CPU reference and copies them back.
  virtual void sample_candidates(Tensor& logits, std::span<const SampleRowParams> rows,
                                 std::span<const PenaltyEntry> penalties, int32_t k, int32_t* ids, float* vals,
                                 float* stats);
  // ids[r] = the id of row r's largest logit, the lowest such id on ties; NaN never wins (0 when
  // the row holds nothing else)                        logits [R, V] f32 → ids [R] I32, backend memory
  // Recordable (a step of greedy drafting on the device: Model::mtp_draft_greedy). The default
  // runs the CPU reference on a host copy.
  virtual void argmax_rows(const Tensor& logits, Tensor& ids);
};

inline void Backend::copy_column_blocks(const Tensor& x, Tensor& q, Tensor& k, Tensor& v) {
  const int64_t T = x.rows(), nq = T ? q.numel() / T : 0, nk = T ? k.numel() / T : 0, nv = T ? v.numel() / T : 0;
  if (q.numel() != T * nq || k.numel() != T * nk || v.numel() != T * nv || nq + nk + nv != x.cols())
    throw std::runtime_error("copy_column_blocks: q " + q.shape_str() + ", k " + k.shape_str() + ", v " +
                             v.shape_str() + " do not split x " + x.shape_str());
  Tensor q2(q.data, DType::F32, {T, nq}), k2(k.data, DType::F32, {T, nk}), v2(v.data, DType::F32, {T, nv});
  copy_cols(x, 0, q2, 0, nq);
  copy_cols(x, nq, k2, 0, nk);
  copy_cols(x, nq + nk, v2, 0, nv);
}

inline void Backend::causal_conv1d_silu_split(Tensor& x, const Tensor& w, Tensor& conv_state,
                                              std::span<const SeqRun> runs, Tensor& q, Tensor& k, Tensor& v) {
  causal_conv1d_silu(x, w, conv_state, runs);
  copy_column_blocks(x, q, k, v);
}

inline void Backend::causal_conv1d_silu_readonly(Tensor&, const Tensor&, const Tensor&, std::span<const SeqRun>) {
  // std::runtime_error, not Error: core/error.h (fmt) cannot be compiled by nvcc, which reads this header
  throw std::runtime_error("causal_conv1d_silu_readonly (speculative decoding) is not implemented on the " + name() + " backend");
}
inline void Backend::gated_delta_rule_readonly(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                               const Tensor&, const Tensor&, std::span<const SeqRun>, Tensor&) {
  throw std::runtime_error("gated_delta_rule_readonly (speculative decoding) is not implemented on the " + name() + " backend");
}

// o [T, Hv, dv]'s head blocks in out_proj's order `heads` (DeltaNetWeights::out_proj_heads: block
// p of a row is head heads[p]) → dst [T, Hv, dv] (not o's memory): one get_rows.
inline void order_out_proj_heads(Backend& be, const Tensor& o, std::span<const int32_t> heads, Tensor& dst) {
  const int64_t Hv = int64_t(heads.size()), rows_n = o.numel() / o.cols(), T = rows_n / Hv, dv = o.cols();
  std::vector<int32_t> rows(size_t(T * Hv));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < Hv; ++j) rows[size_t(t * Hv + j)] = int32_t(t * Hv + heads[size_t(j)]);
  const Tensor from(o.data, DType::F32, {T * Hv, dv});
  Tensor to(dst.data, DType::F32, {T * Hv, dv});
  be.get_rows(from, rows, to);
}

inline void Backend::deltanet_decode(Tensor& mixed, const Tensor& z, const Tensor& a, const Tensor& b,
                                     const DeltaNetWeights& w, float eps, Tensor& conv_state, Tensor& ssm_state,
                                     std::span<const SeqRun> runs, Tensor& out) {
  const int64_t T = mixed.rows(), C = mixed.cols(), Hv = out.dim(1), dv = out.dim(2), dk = ssm_state.dim(2);
  const int64_t Hk = (C - Hv * dv) / (2 * dk);
  if (out.ndim != 3 || ssm_state.ndim != 4 || Hk <= 0 || 2 * Hk * dk + Hv * dv != C || int64_t(runs.size()) != T)
    throw std::runtime_error("deltanet_decode: mixed " + mixed.shape_str() + ", out " + out.shape_str() + ", state " +
                             ssm_state.shape_str() + ", " + std::to_string(runs.size()) + " runs");
  for (const SeqRun& r : runs)
    if (r.count != 1) throw std::runtime_error("deltanet_decode: a run of " + std::to_string(r.count) + " tokens");
  if (T == 0) return;
  // g, beta, and (T > 1) contiguous q, k, v
  std::unique_ptr<DeviceBuffer> tmp = alloc(size_t(2 * T * Hv + (T > 1 ? T * C : 0)) * sizeof(float));
  float* p = static_cast<float*>(tmp->data());
  Tensor g(p, DType::F32, {T, Hv}), beta(p + T * Hv, DType::F32, {T, Hv});
  float* qkv = T > 1 ? p + 2 * T * Hv : mixed.as<float>();  // one row: the column blocks are contiguous
  Tensor q(qkv, DType::F32, {T, Hk, dk}), k(qkv + T * Hk * dk, DType::F32, {T, Hk, dk}),
      v(qkv + 2 * T * Hk * dk, DType::F32, {T, Hv, dv});
  if (T > 1)
    causal_conv1d_silu_split(mixed, w.conv1d, conv_state, runs, q, k, v);
  else
    causal_conv1d_silu(mixed, w.conv1d, conv_state, runs);
  deltanet_gates(a, b, w.a_neg_exp, w.dt_bias, g, beta);
  gated_delta_rule(q, k, v, g, beta, ssm_state, runs, out, DeltaRuleMode::Recurrent);
  gated_rms_norm(out, z, w.norm, eps, out);
  if (w.out_proj_heads.empty()) return;
  std::unique_ptr<DeviceBuffer> buf = alloc(size_t(T * Hv * dv) * sizeof(float));
  Tensor ordered(buf->data(), DType::F32, {T, Hv, dv});
  order_out_proj_heads(*this, out, w.out_proj_heads, ordered);
  copy(ordered, out);
}

// The CPU backend (always available). `threads` 0 means all cores.
std::unique_ptr<Backend> make_cpu_backend(int threads = 0);

}  // namespace qwen36
