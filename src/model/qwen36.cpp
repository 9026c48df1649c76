// The Qwen3.5/3.6 decoder, written once against the backend contract. Reads like the
// reference forward pass (transformers' modeling_qwen3_5 / qwen3_5_moe); shapes in comments
// use T = tokens in the batch, H = hidden size.
#include "model/qwen36.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <set>
#include <unordered_map>

#include <omp.h>
#include <spdlog/spdlog.h>

#include "backend/comm.h"
#include "backend/cpu/cpu_moe_pass.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/host_pool.h"
#include "backend/kv_cache.h"
#include "model/host_expert_copy.h"
#include "model/model_scratch.h"
#include "core/error.h"

namespace qwen36 {

ForwardBatch ForwardBatch::single(std::span<const int32_t> tokens, int32_t pos0, int32_t slot, bool all_logits) {
  ForwardBatch b;
  b.tokens.assign(tokens.begin(), tokens.end());
  b.runs.push_back({slot, pos0, 0, int32_t(tokens.size())});
  if (all_logits) {
    for (int32_t i = 0; i < int32_t(tokens.size()); ++i) b.output_rows.push_back(i);
  } else if (!tokens.empty()) {
    b.output_rows.push_back(int32_t(tokens.size()) - 1);
  }
  return b;
}

Model::Model(ModelWeights weights, Backend& backend, const ExpertPlacement& placement, int host_threads)
    : w_(std::move(weights)), backend_(backend), placement_(placement), ws_(std::make_shared<Workspace>()) {
  validate_weights(w_);
  if (!placement_.any()) {
    placement_.host.clear();
    backend_.prepare_weights(w_);
    return;
  }
  init_offload(host_threads);
}

void Model::project(const LayerInput& in, std::span<const Tensor* const> ws, std::span<Tensor* const> outs) {
  if (in.delta)
    backend_.add_rms_norm_matmul_multi(in.h, *in.delta, in.h_out, in.norm, w_.config.rms_norm_eps, in.x, ws, outs);
  else
    backend_.matmul_multi(in.x, ws, outs);
}

Tensor Model::attention_block(Scratch& s, const LayerWeights& l, const LayerInput& in, Tensor& k_cache,
                              Tensor& v_cache, std::span<const SeqRun> runs, const VerifySave* save) {
  const ModelConfig& c = w_.config;
  const Tensor& x = in.x;
  const int64_t T = x.rows(), nh = c.n_heads, nkv = c.n_kv_heads, hd = c.head_dim;
  const AttentionWeights& a = l.attn;
  Tensor q = s.f32({T, nh, hd});
  Tensor qg = c.attn_output_gate ? s.f32({T, nh, 2 * hd}) : q;  // per head [q | gate]
  Tensor k = s.f32({T, nkv, hd}), v = s.f32({T, nkv, hd});
  const Tensor* ws[] = {&a.q_proj, &a.k_proj, &a.v_proj};
  Tensor* outs[] = {&qg, &k, &v};
  project(in, ws, outs);
  Tensor gate;  // [T, nh*hd], only with attn_output_gate
  if (c.attn_output_gate) gate = s.f32({T, nh * hd});
  Tensor o = s.f32({T, nh, hd});
  const float scale = 1.0f / std::sqrt(float(hd));
  if (save && !save->trees.empty()) {  // tree verify runs take the tree ops, the others the batch ops
    if (c.attn_output_gate) backend_.split_q_gate(qg, q, gate);
    backend_.rms_norm(q, a.q_norm, c.rms_norm_eps, q);  // per head over hd
    backend_.rms_norm(k, a.k_norm, c.rms_norm_eps, k);
    if (!save->untreed.empty()) {
      backend_.rope(q, save->untreed, c.rotary_dim, c.rope_theta);
      backend_.rope(k, save->untreed, c.rotary_dim, c.rope_theta);
      backend_.attention(q, k, v, k_cache, v_cache, save->untreed, scale, o);
    }
    for (const TreeRun& t : save->trees) {
      backend_.rope_tree(q, t.run, t.parent, c.rotary_dim, c.rope_theta);
      backend_.rope_tree(k, t.run, t.parent, c.rotary_dim, c.rope_theta);
      backend_.attention_tree(q, k, v, k_cache, v_cache, t.run, t.parent, scale, o);
    }
  } else {
    backend_.qk_norm_rope(qg, q, c.attn_output_gate ? &gate : nullptr, k, a.q_norm, a.k_norm, c.rms_norm_eps, runs,
                          c.rotary_dim, c.rope_theta);
    backend_.attention(q, k, v, k_cache, v_cache, runs, scale, o);
  }
  Tensor o2(o.data, DType::F32, {T, nh * hd});
  Tensor y = s.f32({T, c.hidden_size});
  if (c.attn_output_gate)
    backend_.gated_matmul(o2, gate, a.o_proj, y);
  else
    backend_.matmul(o2, a.o_proj, y);
  return y;
}

// Rows [begin, begin + count) of src [T, C] for each run → rows [0, count) of the run's slot
// in buf [slots, n, C] (a verify run's saved DeltaNet inputs).
static void save_rows(Backend& b, const Tensor& src, Tensor& buf, std::span<const SeqRun> runs) {
  const int64_t C = src.cols(), per_slot = buf.dim(1) * C;
  for (const SeqRun& r : runs) {
    const Tensor from(static_cast<float*>(src.data) + int64_t(r.begin) * C, DType::F32, {r.count, C});
    Tensor to(static_cast<float*>(buf.data) + int64_t(r.slot) * per_slot, DType::F32, {r.count, C});
    b.copy(from, to);
  }
}

Tensor Model::deltanet_block(Scratch& s, const LayerWeights& l, const LayerInput& in, Tensor& conv_state,
                             Tensor& ssm_state, std::span<const SeqRun> runs, DeltaRuleMode mode,
                             const VerifySave* save) {
  const ModelConfig& c = w_.config;
  const Tensor& x = in.x;
  const DeltaNetWeights& d = l.deltanet;
  const int64_t T = x.rows(), Hk = c.linear_k_heads, Hv = c.linear_v_heads, dk = c.linear_k_dim,
                dv = c.linear_v_dim;
  Tensor mixed = s.f32({T, c.conv_dim()});  // [q | k | v] channels
  Tensor z = s.f32({T, Hv, dv});
  // A shard's b / a carry padding rows (ModelConfig::gate_rows), whose outputs the gates skip.
  Tensor b = s.f32({T, c.gate_rows()}), a = s.f32({T, c.gate_rows()});
  const Tensor* ws[] = {&d.in_proj_qkv, &d.in_proj_z, &d.in_proj_b, &d.in_proj_a};
  Tensor* outs[] = {&mixed, &z, &b, &a};
  project(in, ws, outs);
  Tensor o = s.f32({T, Hv, dv});
  // A decode step (one token per run, as recorded decode steps are): conv, gates, delta rule
  // and the gated norm in one backend op.
  const bool decode = !save && mode != DeltaRuleMode::Chunked && int64_t(runs.size()) == T &&
                      std::all_of(runs.begin(), runs.end(), [](const SeqRun& r) { return r.count == 1; });
  // A chain verify pass (no trees), or a pass of one tree: conv, gates, delta rule, norm and the
  // saved inputs in one backend op where the backend fuses them; otherwise the composition below
  // is the reference.
  const bool verify_pass = save && mode != DeltaRuleMode::Chunked;
  bool fused_verify = false;
  if (verify_pass && save->trees.empty())
    fused_verify = backend_.deltanet_verify(mixed, z, a, b, d, c.rms_norm_eps, conv_state, ssm_state, runs,
                                            save->verify, *save->conv_input, *save->g, *save->beta, o);
  else if (verify_pass && save->trees.size() == 1 && runs.size() == 1)
    fused_verify = backend_.deltanet_verify_tree(mixed, z, a, b, d, c.rms_norm_eps, conv_state, ssm_state,
                                                 save->trees[0].run, save->trees[0].parent, *save->conv_input,
                                                 *save->g, *save->beta, o);
  // The composed path's gated norm goes with out_proj as one op where out_proj reads the heads in
  // order (a device backend then writes the GEMM's input from the norm).
  bool norm_in_projection = false;
  if (decode) {
    backend_.deltanet_decode(mixed, z, a, b, d, c.rms_norm_eps, conv_state, ssm_state, runs, o);
  } else if (!fused_verify) {
    Tensor q, k, v;
    if (T == 1) {  // one row: its [q | k | v] channel slices are already contiguous tensors
      float* m = mixed.as<float>();
      q = Tensor(m, DType::F32, {T, Hk, dk});
      k = Tensor(m + Hk * dk, DType::F32, {T, Hk, dk});
      v = Tensor(m + 2 * Hk * dk, DType::F32, {T, Hv, dv});
    } else {
      q = s.f32({T, Hk, dk}), k = s.f32({T, Hk, dk}), v = s.f32({T, Hv, dv});
    }
    if (save) {  // verify runs only read their state; their inputs are kept for the commit
      save_rows(backend_, mixed, *save->conv_input, save->saved);  // before the conv overwrites mixed
      if (!save->plain.empty()) backend_.causal_conv1d_silu(mixed, d.conv1d, conv_state, save->plain);
      if (!save->verify.empty()) backend_.causal_conv1d_silu_readonly(mixed, d.conv1d, conv_state, save->verify);
      for (const TreeRun& t : save->trees)
        backend_.causal_conv1d_silu_tree_readonly(mixed, d.conv1d, conv_state, t.run, t.parent);
      if (T > 1) backend_.copy_column_blocks(mixed, q, k, v);  // contiguous, as gated_delta_rule takes them
    } else if (T == 1) {
      backend_.causal_conv1d_silu(mixed, d.conv1d, conv_state, runs);
    } else {
      backend_.causal_conv1d_silu_split(mixed, d.conv1d, conv_state, runs, q, k, v);
    }

    Tensor g = s.f32({T, Hv}), beta = s.f32({T, Hv});
    backend_.deltanet_gates(a, b, d.a_neg_exp, d.dt_bias, g, beta);
    if (save) {
      save_rows(backend_, g, *save->g, save->saved);
      save_rows(backend_, beta, *save->beta, save->saved);
      if (!save->plain.empty()) backend_.gated_delta_rule(q, k, v, g, beta, ssm_state, save->plain, o, mode);
      if (!save->verify.empty()) backend_.gated_delta_rule_readonly(q, k, v, g, beta, ssm_state, save->verify, o);
      for (const TreeRun& t : save->trees)
        backend_.gated_delta_rule_tree_readonly(q, k, v, g, beta, ssm_state, t.run, t.parent, o);
    } else {
      backend_.gated_delta_rule(q, k, v, g, beta, ssm_state, runs, o, mode);
    }
    norm_in_projection = d.out_proj_heads.empty();
    if (!norm_in_projection) backend_.gated_rms_norm(o, z, d.norm, c.rms_norm_eps, o);  // per head over dv, gated by silu(z)
  }
  Tensor y = s.f32({T, c.hidden_size});
  if (norm_in_projection) {
    backend_.gated_norm_matmul(o, z, d.norm, c.rms_norm_eps, d.out_proj, y);
    return y;
  }
  Tensor o2(o.data, DType::F32, {T, Hv * dv});
  // out_proj reads its heads in another order (GGUF): the fused ops wrote them so already
  if (!d.out_proj_heads.empty() && !decode && !fused_verify) {
    o2 = s.f32({T, Hv * dv});
    order_out_proj_heads(backend_, o, d.out_proj_heads, o2);
  }
  backend_.matmul(o2, d.out_proj, y);
  return y;
}

void Model::mlp_block(Scratch& s, const MlpWeights& m, const LayerInput& in, Tensor& y) {
  const int64_t T = in.x.rows(), I = m.gate_proj.rows();
  Tensor gate = s.f32({T, I}), up = s.f32({T, I});
  if (in.delta)
    backend_.add_rms_norm_mlp(in.h, *in.delta, in.h_out, in.norm, w_.config.rms_norm_eps, in.x, m, gate, up, y);
  else
    backend_.mlp(in.x, m, gate, up, y);
}

void Model::moe_block(Scratch& s, const MoeWeights& m, const LayerInput& in, Tensor& y, bool host_experts) {
  const ModelConfig& c = w_.config;
  const Tensor& x = in.x;
  const int64_t T = x.rows(), E = c.n_experts, K = c.n_experts_per_tok;
  Tensor logits = s.f32({T, E});
  const bool shared = !m.shared.gate_proj.empty();
  Tensor sg, sh_gate, sh_up;
  if (shared) {  // the router, the shared expert's gate and gate/up projections all read x: one pass
    const int64_t I = m.shared.gate_proj.rows();
    sg = s.f32({T, 1}), sh_gate = s.f32({T, I}), sh_up = s.f32({T, I});
    const Tensor* ws[] = {&m.router, &m.shared_gate, &m.shared.gate_proj, &m.shared.up_proj};
    Tensor* outs[] = {&logits, &sg, &sh_gate, &sh_up};
    project(in, ws, outs);
  } else {
    const Tensor* ws[] = {&m.router};
    Tensor* outs[] = {&logits};
    project(in, ws, outs);
  }
  // A host-placed layer's routing and (for the host) its input share one buffer, so that one
  // copy takes them to the host: each copy waits for the whole stream (HostPack).
  Tensor pack, weights, ids;
  if (host_experts) {
    const HostPack hp(T, K, c.hidden_size);
    pack = s.f32({hp.floats()});
    weights = hp.weights(pack.data), ids = hp.ids(pack.data);
  } else {
    weights = s.f32({T, K}), ids = s.i32({T, K});
  }
  backend_.moe_route(logits, K, /*renorm=*/true, weights, ids);  // Qwen3.5-MoE always renormalises
  if (c.local_experts) {  // expert parallelism: this rank's experts by local index, the others −1 (skipped)
    QWEN36_CHECK(!host_experts, "expert parallelism does not combine with experts on the host (--n-cpu-moe / -ot)");
    backend_.moe_local_ids(ids, c.expert0, c.local_experts);
  }
  Tensor out;  // the shared expert's output, before its gate
  auto shared_expert = [&] {
    if (!shared) return;
    backend_.swiglu(sh_gate, sh_up, sh_gate);
    out = s.f32({T, c.hidden_size});
    backend_.matmul(sh_gate, m.shared.down_proj, out);
  };
  // Host-placed experts, the exact path (host_moe_rows): y and the shared expert exactly as the
  // main backend's moe_experts_shared / moe_experts would have them. Otherwise: y gets the same
  // sum as moe_experts on the main backend up to f32 summation order, computed by the host (on
  // two CPU backends the very same code, so the logits are bitwise equal). The
  // shared expert is queued on the device between the copies out and the host's work, so a
  // GPU computes it while the CPU computes the routed experts; the add stays after both.
  if (host_experts && host_rows_exact(m.experts, T)) {
    Tensor rows = s.f32({T * K, c.hidden_size}), sh_row = shared ? s.f32({T, c.hidden_size}) : Tensor();
    const HostShared hs{sh_gate, sh_up, m.shared.down_proj, sg, sh_row};
    const bool folded = host_moe_rows(x, pack, m.experts, y, rows, shared ? &hs : nullptr, shared_expert);
    if (shared && !folded) backend_.add_sigmoid_scaled(y, out, sg);
  } else if (host_experts) {
    Tensor spare = device_share_ > 0 && T == 1 ? s.f32({T, c.hidden_size}) : Tensor();
    host_moe_experts(x, pack, m.experts, y, spare, shared_expert);
    if (shared) backend_.add_sigmoid_scaled(y, out, sg);
  } else if (shared) {  // the shared expert's SwiGLU, down and gated add with the routed experts
    out = s.f32({T, c.hidden_size});
    backend_.moe_experts_shared(x, weights, ids, m.experts, sh_gate, sh_up, m.shared.down_proj, sg, out, y);
  } else {
    backend_.moe_experts(x, weights, ids, m.experts, y);
  }
}

Model::Residual Model::residual(Scratch& s, int64_t T) {
  const int64_t H = w_.config.hidden_size;
  return {s.f32({T, H}), s.f32({T, H}), s.f32({T, H}), false};
}

void Model::finish(Residual& r) {
  if (r.has_pending) backend_.add(r.h, r.pending);
  r.has_pending = false;
}

void Model::decoder_layer(Scratch& s, const LayerWeights& l, Residual& r, Tensor& cache_a, Tensor& cache_b,
                          std::span<const SeqRun> runs, DeltaRuleMode mode, const VerifySave* save) {
  const ModelConfig& c = w_.config;
  Tensor x = s.f32({r.h.rows(), c.hidden_size});
  if (!r.has_pending) backend_.rms_norm(r.h, l.input_norm, c.rms_norm_eps, x);
  const LayerInput in{r.h, r.has_pending ? &r.pending : nullptr, r.spare, l.input_norm, x};
  Tensor mixed = l.kind == LayerKind::FullAttention ? attention_block(s, l, in, cache_a, cache_b, runs, save)
                                                    : deltanet_block(s, l, in, cache_a, cache_b, runs, mode, save);
  if (r.has_pending) r.advance();
  reduce(mixed);
  const LayerInput post{r.h, &mixed, r.spare, l.post_attention_norm, x};
  // A layer of w_.layers (not the MTP head's) may have its routed experts on the host.
  const bool host_experts = host_ && &l >= w_.layers.data() && &l < w_.layers.data() + w_.layers.size() &&
                            placement_.host[size_t(&l - w_.layers.data())];
  if (c.moe)
    moe_block(s, l.moe, post, r.pending, host_experts);  // routed and shared experts' partial sums: one reduction
  else
    mlp_block(s, l.mlp, post, r.pending);
  r.advance();
  reduce(r.pending);
  r.has_pending = true;
}

void Model::reduce(Tensor& y) {
  if (comm_ && comm_->size() > 1) comm_->all_reduce_sum(backend_, y);
}

void Model::head(Scratch& s, const Tensor& h, const Tensor& norm, std::span<const int32_t> rows, float* logits,
                 float* hidden, SampleRequest* sample) {
  const ModelConfig& c = w_.config;
  const int64_t n = int64_t(rows.size());
  if (n == 0) return;
  Tensor sel = s.f32({n, c.hidden_size});
  backend_.get_rows(h, rows, sel);
  backend_.rms_norm(sel, norm, c.rms_norm_eps, sel);
  const uint64_t hidden_copy = hidden ? backend_.download(sel, hidden) : 0;  // one wait with the logits
  if (logits || sample) {
    Tensor out = s.f32({n, c.vocab_size});
    backend_.matmul(sel, w_.lm_head, out);
    if (sample)
      sample_rows(out, *sample, /*on_host=*/false);
    else
      backend_.copy_to_host(out, logits);
  }
  if (hidden) backend_.wait_download(hidden_copy);
}

void Model::sample_rows(Tensor& logits, SampleRequest& req, bool on_host) {
  const int64_t n = logits.rows(), V = logits.cols();
  QWEN36_CHECK(int64_t(req.rows.size()) == n && req.take, "forward_sample: {} row parameters for {} output rows",
               req.rows.size(), n);
  const int32_t k = int32_t(std::min<int64_t>({int64_t(req.k), V, int64_t(kMaxSampleCandidates)}));
  QWEN36_CHECK(k >= 1, "forward_sample: {} candidates per row", req.k);
  std::vector<int32_t> ids(size_t(n * k));
  std::vector<float> vals(size_t(n * k)), stats(size_t(n * 3));
  if (on_host)
    cpu::sample_candidates(logits, req.rows, req.penalties, k, ids.data(), vals.data(), stats.data());
  else
    backend_.sample_candidates(logits, req.rows, req.penalties, k, ids.data(), vals.data(), stats.data());
  for (int64_t i = 0; i < n; ++i) {
    SampleCandidates c;
    c.ids = std::span<const int32_t>(ids).subspan(size_t(i * k), size_t(k));
    c.logits = std::span<const float>(vals).subspan(size_t(i * k), size_t(k));
    c.max = stats[size_t(i * 3)], c.sum_exp = stats[size_t(i * 3 + 1)], c.next = stats[size_t(i * 3 + 2)];
    c.vocab = V;
    if (req.take(int32_t(i), c) || on_host) continue;  // on the host the row is already there
    QWEN36_CHECK(req.full_logits, "forward_sample: a row needs its logits and there is no buffer for them");
    const Tensor row(logits.as<float>() + i * V, DType::F32, {1, V});
    backend_.copy_to_host(row, req.full_logits + i * V);
  }
}

void check_runs(std::span<const SeqRun> runs, int64_t tokens, const ModelState& state, int32_t ahead) {
  int64_t covered = 0;
  for (const SeqRun& r : runs) {
    QWEN36_CHECK(r.begin == covered && r.count > 0, "batch runs must cover the tokens in order without gaps");
    QWEN36_CHECK(r.slot >= 0 && r.slot < state.slots(), "slot {} out of range (state has {})", r.slot, state.slots());
    QWEN36_CHECK(r.pos0 >= 0 && int64_t(r.pos0) + r.count + ahead <= state.capacity(),
                 "sequence would reach position {}, past the context size {}", int64_t(r.pos0) + r.count + ahead,
                 state.capacity());
    covered += r.count;
  }
  QWEN36_CHECK(covered == tokens, "batch runs cover {} of {} tokens", covered, tokens);
}

static void check_batch(const ForwardBatch& b, const ModelState& state) {
  check_runs(b.runs, int64_t(b.tokens.size()), state);
  for (int32_t r : b.output_rows)
    QWEN36_CHECK(r >= 0 && r < int32_t(b.tokens.size()), "output row {} out of range", r);
  for (int32_t r : b.hidden_rows)
    QWEN36_CHECK(r >= 0 && r < int32_t(b.tokens.size()), "hidden row {} out of range", r);
  for (int32_t l : b.capture_layers)
    QWEN36_CHECK(l >= 0 && l < state.config().n_layers, "capture layer {} out of range", l);
}

// The batch's runs split into plain ones, chain verify ones and tree verify ones
// (ForwardBatch::verify_runs, verify_trees); untreed: the plain and chain verify runs; saved:
// the chain and tree verify runs.
static void split_verify_runs(const ForwardBatch& b, const ModelState& state, std::vector<SeqRun>& plain,
                              std::vector<SeqRun>& verify, std::vector<TreeRun>& trees, std::vector<SeqRun>& untreed,
                              std::vector<SeqRun>& saved) {
  QWEN36_CHECK(b.verify_trees.empty() || b.verify_trees.size() == b.verify_runs.size(),
               "verify_trees: {} entries for {} verify runs", b.verify_trees.size(), b.verify_runs.size());
  std::vector<int> kind(b.runs.size(), 0);  // 0 plain, 1 chain verify, 2 tree verify
  for (size_t j = 0; j < b.verify_runs.size(); ++j) {
    const int32_t i = b.verify_runs[j];
    QWEN36_CHECK(i >= 0 && size_t(i) < b.runs.size() && kind[size_t(i)] == 0, "bad verify run index {}", i);
    const SeqRun& r = b.runs[size_t(i)];
    QWEN36_CHECK(r.count <= state.spec_max_tokens(),
                 "a verify run of {} tokens needs ModelState::enable_speculation({}) (it holds {})", r.count, r.count,
                 state.spec_max_tokens());
    const bool tree = j < b.verify_trees.size() && !b.verify_trees[j].empty();
    if (tree) {
      QWEN36_CHECK(b.verify_trees[j].size() == size_t(r.count), "verify run {}: {} parents for {} tokens", i,
                   b.verify_trees[j].size(), r.count);
      trees.push_back({r, b.verify_trees[j]});
    }
    kind[size_t(i)] = tree ? 2 : 1;
  }
  for (size_t i = 0; i < b.runs.size(); ++i) {
    if (kind[i] == 0) plain.push_back(b.runs[i]);
    if (kind[i] == 1) verify.push_back(b.runs[i]);
    if (kind[i] != 2) untreed.push_back(b.runs[i]);
    if (kind[i] != 0) saved.push_back(b.runs[i]);
  }
}

// After the first sight of `key` (seen ≥ 1; the first ran eagerly, filling the backend's
// caches): replays its recording, or records `run` at the second sight and replays that; runs
// eagerly where the backend cannot record or dropped the recording.
void Model::replay_or_record(uint64_t key, int seen, const std::function<void()>& run) {
  if (backend_.replay(key)) return;
  if (seen == 1 && backend_.begin_capture()) {
    run();
    if (!backend_.end_capture(key, !ws_->overflowed) || !backend_.replay(key)) run();
  } else {
    run();
  }
}

// A decode step (every run one token, or a chain or tree verify run of speculative decoding,
// `verify`; plain Auto/Recurrent mode) on a backend that records: the first forward of a shape runs
// eagerly, the second is recorded and every later one is a replay of that recording (embedding
// to lm_head, no host work between layers), followed by the copies to the host. The key names
// everything the recorded ops bake in: batch shape (each run's length and kind), workspace and
// state addresses; slots, positions, token ids and trees' shapes are read on the device from the
// set_batch and set_batch_trees tables (an op that would need the host instead drops the
// recording: the step runs eagerly).
// Returns false when the step must run the ordinary way.
bool Model::decode_step(const ForwardBatch& batch, ModelState& state, float* logits, float* hidden,
                        SampleRequest* sample, const VerifySave* verify, Tensor* chain, float* captured) {
  const ModelConfig& c = w_.config;
  const int64_t T = int64_t(batch.tokens.size()), n = int64_t(batch.output_rows.size());
  const int64_t n_cap = captured ? int64_t(batch.capture_layers.size()) : 0;  // of the output rows
  // Host-placed experts copy to and from the host mid-step, which a recording cannot hold.
  if (T > 64 || n == 0 || batch.deltanet_mode == DeltaRuleMode::Chunked || host_) return false;
  if (verify && std::any_of(verify->plain.begin(), verify->plain.end(), [](const SeqRun& r) { return r.count != 1; }))
    return false;
  if (!verify && int64_t(batch.runs.size()) != T) return false;
  RecordingKey key(1469598103934665603ull);
  key.mix(uint64_t(T));
  key.mix(uint64_t(n));
  key.mix(uint64_t(batch.deltanet_mode));
  if (verify) {  // the runs' lengths (the plain ones are length 1), and the verify runs' slots:
    // the copies of their saved DeltaNet inputs (save_rows) address the slot's rows directly
    key.mix(uint64_t(batch.runs.size()) | uint64_t(1) << 63);
    // (a verify run of one token reads its state as a longer one: marked by bit 31; a tree, whose
    // shape the recorded tree ops read from set_batch_trees' tables, by bit 30)
    std::vector<uint64_t> kind(batch.runs.size(), 0);
    for (size_t j = 0; j < batch.verify_runs.size(); ++j) {
      const bool tree = j < batch.verify_trees.size() && !batch.verify_trees[j].empty();
      kind[size_t(batch.verify_runs[j])] = uint64_t(1) << 31 | (tree ? uint64_t(1) << 30 : 0);
    }
    for (size_t i = 0; i < batch.runs.size(); ++i) {
      const SeqRun& r = batch.runs[i];
      key.mix(uint64_t(r.count) | (kind[i] ? kind[i] | uint64_t(uint32_t(r.slot)) << 32 : 0));
    }
  }
  key.mix(uint64_t(logits != nullptr || sample != nullptr));  // the same recording serves both
  key.mix(uint64_t(n_cap));
  for (int64_t j = 0; j < n_cap; ++j) key.mix(uint64_t(batch.capture_layers[size_t(j)]));
  key.mix(chain ? reinterpret_cast<uintptr_t>(chain->data) : 0);
  key.mix(reinterpret_cast<uintptr_t>(ws_->buf ? ws_->buf->data() : nullptr));
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const bool attn = c.layer_kinds[size_t(i)] == LayerKind::FullAttention;
    key.mix(attn ? state.k_cache(i) : state.conv_state(i));
    key.mix(attn ? state.v_cache(i) : state.recurrent_state(i));
    if (verify && !attn)  // the verify runs' saved inputs are copied into these
      for (const Tensor* t : {&state.spec_conv_input(i), &state.spec_g(i), &state.spec_beta(i)}) key.mix(*t);
  }
  const int seen = ws_->seen[key.value]++;
  // First sight: eager (fills the backend's caches): forward_rank's ops, or a chained step's here.
  const bool eager = seen == 0 || !ws_->buf;
  if (eager && !chain) return false;
  Scratch s(backend_, *ws_);
  Residual r = residual(s, T);
  Tensor sel = s.f32({n, c.hidden_size}), out = s.f32({n, c.vocab_size});
  Tensor cap = n_cap ? s.f32({n, n_cap * c.hidden_size}) : Tensor();
  // An attention layer takes the verify runs only for a tree's ops (forward_rank's rule).
  const bool attn_save = verify && !verify->trees.empty();
  auto run = [&] {
    r.has_pending = false;
    if (chain)
      backend_.embed_ids(w_.embed_tokens, *chain, r.h);
    else
      backend_.embed(w_.embed_tokens, batch.tokens, r.h);
    for (int64_t i = 0; i < c.n_layers; ++i) {
      const bool attn = c.layer_kinds[size_t(i)] == LayerKind::FullAttention;
      Scratch layer_scratch(backend_, *ws_);
      VerifySave save = verify ? *verify : VerifySave{};
      if (verify && !attn)  // a DeltaNet layer keeps the verify runs' inputs (forward_rank's rule)
        save.conv_input = &state.spec_conv_input(i), save.g = &state.spec_g(i), save.beta = &state.spec_beta(i);
      decoder_layer(layer_scratch, w_.layers[size_t(i)], r, attn ? state.k_cache(i) : state.conv_state(i),
                    attn ? state.v_cache(i) : state.recurrent_state(i), batch.runs, batch.deltanet_mode,
                    verify && (!attn || attn_save) ? &save : nullptr);
      if (n_cap) capture_layer(layer_scratch, r, batch.capture_layers, i, batch.output_rows, cap);
    }
    finish(r);
    backend_.get_rows(r.h, batch.output_rows, sel);
    backend_.rms_norm(sel, w_.final_norm, c.rms_norm_eps, sel);
    if (logits || sample || chain) backend_.matmul(sel, w_.lm_head, out);
    if (chain) backend_.argmax_rows(out, *chain);
  };
  if (eager)
    run();
  else
    replay_or_record(key.value, seen, run);
  // The hidden rows come with the logits or candidates: one wait for the host, not two.
  const uint64_t hidden_copy = hidden ? backend_.download(sel, hidden) : 0;
  if (n_cap) backend_.copy_to_host(cap, captured);
  // Sampling runs after the replay, not inside it: its penalty tables change every step.
  if (sample)
    sample_rows(out, *sample, /*on_host=*/false);
  else if (logits)
    backend_.copy_to_host(out, logits);
  if (hidden) backend_.wait_download(hidden_copy);
  return true;
}

// Layer i's output rows into cap's column blocks of the capture layers equal to i. A layer's output
// is h plus its FFN output, which is still pending (added with the next layer's norm), so the two
// rows are summed here.
void Model::capture_layer(Scratch& s, const Residual& r, std::span<const int32_t> layers, int64_t i,
                          std::span<const int32_t> rows, Tensor& cap) {
  const int64_t H = w_.config.hidden_size, n = int64_t(rows.size());
  for (size_t j = 0; j < layers.size() && n > 0; ++j) {
    if (layers[j] != i) continue;
    Tensor out = s.f32({n, H}), ffn = s.f32({n, H});
    backend_.get_rows(r.h, rows, out);
    backend_.get_rows(r.pending, rows, ffn);
    backend_.add(out, ffn);
    backend_.copy_cols(out, 0, cap, int64_t(j) * H, H);
  }
}

void Model::forward(const ForwardBatch& batch, ModelState& state, float* logits, float* hidden, float* captured) {
  if (!peers_) return forward_rank(batch, state, logits, hidden, captured);
  forward_peers(batch, state, [&] { forward_rank(batch, state, logits, hidden, captured); });
}

// Tensor parallel: the peers need no logits (lm_head is replicated; rank 0's are the result).
// A bad batch is refused here, before the other ranks see it: a failure during a pass leaves
// the group unusable.
void Model::forward_peers(const ForwardBatch& batch, ModelState& state, const std::function<void()>& rank0) {
  check_batch(batch, state);
  QWEN36_CHECK(batch.verify_trees.empty(), "tree verification with tensor parallelism is not supported yet");
  PeerPass p;
  p.kind = PeerPass::Kind::Forward;
  p.batch = &batch;
  peers_->run(state, p, rank0);
}

void Model::forward_sample(const ForwardBatch& batch, ModelState& state, SampleRequest& req, float* hidden,
                           float* captured) {
  if (!peers_) return forward_rank(batch, state, nullptr, hidden, captured, &req);
  // Tensor parallel: the other ranks run the plain pass; rank 0 samples on its device as alone,
  // instead of copying every row's logits to the host and sampling there (32 MB and a host scan
  // per 32-sequence 27B step: bench/RESULTS.md, session 9).
  forward_peers(batch, state, [&] { forward_rank(batch, state, nullptr, hidden, captured, &req); });
}

void Model::run_pass(const PeerPass& p, ModelState& state) {
  switch (p.kind) {
    case PeerPass::Kind::Forward:
      return forward(*p.batch, state, nullptr, nullptr);
    case PeerPass::Kind::Mtp:
      return mtp_forward(p.hidden, p.next_tokens, p.runs, state, nullptr, nullptr, p.output_rows);
    case PeerPass::Kind::Commit:
      return commit_speculative(state, p.commits);
  }
}

void Model::forward_rank(const ForwardBatch& batch, ModelState& state, float* logits, float* hidden, float* captured,
                         SampleRequest* sample) {
  check_batch(batch, state);
  const ModelConfig& c = w_.config;
  const int64_t T = int64_t(batch.tokens.size());
  if (T == 0) return;
  std::vector<SeqRun> plain_runs, verify_runs, untreed_runs, saved_runs;
  std::vector<TreeRun> tree_runs;
  split_verify_runs(batch, state, plain_runs, verify_runs, tree_runs, untreed_runs, saved_runs);
  ws_->begin(backend_);
  backend_.set_batch(batch.tokens, batch.runs, batch.output_rows);
  if (!tree_runs.empty()) {
    std::vector<SeqRun> truns;
    std::vector<std::span<const int32_t>> parents;
    for (const TreeRun& t : tree_runs) truns.push_back(t.run), parents.push_back(t.parent);
    backend_.set_batch_trees(truns, parents);
  }
  const VerifySave chain{plain_runs, verify_runs, tree_runs, untreed_runs, saved_runs, nullptr, nullptr, nullptr};
  if (batch.hidden_rows.empty() &&
      decode_step(batch, state, logits, hidden, sample, verify_runs.empty() && tree_runs.empty() ? nullptr : &chain,
                  nullptr, captured))
    return;
  Scratch s(backend_, *ws_);
  Residual r = residual(s, T);
  // Captured layer outputs [rows, layers · H] (capture_layer).
  const std::vector<int32_t>& cap_rows = batch.hidden_rows.empty() ? batch.output_rows : batch.hidden_rows;
  const int64_t n_cap = captured ? int64_t(batch.capture_layers.size()) : 0, H = c.hidden_size;
  Tensor cap = n_cap ? s.f32({int64_t(cap_rows.size()), n_cap * H}) : Tensor();
  backend_.embed(w_.embed_tokens, batch.tokens, r.h);
  // The decode pipeline's passes stay inside this loop: the last one is joined when it ends
  // (by exception too), before anything reads the step's results.
  struct PipelineScope {
    Model& m;
    PipelineScope(Model& model, bool open) : m(model) { m.set_pipeline_open(open); }
    ~PipelineScope() {
      m.set_pipeline_open(false);
      m.finish_host_pass();
    }
  } pipeline_scope(*this, T == 1 && verify_runs.empty() && tree_runs.empty() && n_cap == 0);
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const bool attn = c.layer_kinds[size_t(i)] == LayerKind::FullAttention;
    Tensor& ca = attn ? state.k_cache(i) : state.conv_state(i);
    Tensor& cb = attn ? state.v_cache(i) : state.recurrent_state(i);
    Scratch layer_scratch(backend_, *ws_);  // a layer's activations are freed before the next layer
    VerifySave save{plain_runs, verify_runs, tree_runs, untreed_runs, saved_runs, nullptr, nullptr, nullptr};
    const bool verifying = !verify_runs.empty() || !tree_runs.empty();
    if (!attn && verifying)
      save.conv_input = &state.spec_conv_input(i), save.g = &state.spec_g(i), save.beta = &state.spec_beta(i);
    const VerifySave* sv = attn ? (tree_runs.empty() ? nullptr : &save) : (verifying ? &save : nullptr);
    decoder_layer(layer_scratch, w_.layers[size_t(i)], r, ca, cb, batch.runs, batch.deltanet_mode, sv);
    if (n_cap) capture_layer(layer_scratch, r, batch.capture_layers, i, cap_rows, cap);
  }
  finish_host_pass();
  if (n_cap && !cap_rows.empty()) backend_.copy_to_host(cap, captured);
  finish(r);
  const Tensor& h = r.h;
  if (batch.hidden_rows.empty()) {
    head(s, h, w_.final_norm, batch.output_rows, logits, hidden, sample);
  } else {
    head(s, h, w_.final_norm, batch.output_rows, logits, nullptr, sample);
    head(s, h, w_.final_norm, batch.hidden_rows, nullptr, hidden);
  }
}

void Model::commit_speculative(ModelState& state, std::span<const SpecCommit> commits) {
  if (!peers_) return commit_speculative_rank(state, commits);
  PeerPass p;
  p.kind = PeerPass::Kind::Commit;
  p.commits = commits;
  peers_->run(state, p, [&] { commit_speculative_rank(state, commits); });
}

std::vector<int32_t> SpecCommit::path_tokens() const {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < 64; ++i)
    if (path >> i & 1u) p.push_back(i);
  return p;
}

// A tree commit's accepted path moved to the front of its rows, in every layer in one backend
// op: the DeltaNet layers' saved verify inputs (rows path[j] → j of the slot's) and the
// attention layers' K/V (positions pos0 + path[j] → pos0 + j; an fp8 cache's per-head scales
// too). What is left is a chain's commit of the first `keep` rows.
void Model::compact_tree_path(ModelState& state, const SpecCommit& cm, std::span<const int32_t> path) {
  const ModelConfig& c = w_.config;
  const int64_t n = state.spec_max_tokens();
  std::vector<Tensor> rows;
  for (int64_t i = 0; i < c.n_layers; ++i) {
    if (c.layer_kinds[size_t(i)] != LayerKind::FullAttention) {
      for (Tensor* buf : {&state.spec_conv_input(i), &state.spec_g(i), &state.spec_beta(i)}) {
        const int64_t w = buf->cols();
        rows.emplace_back(buf->as<float>() + int64_t(cm.slot) * n * w, DType::F32, std::initializer_list<int64_t>{n, w});
      }
      continue;
    }
    for (Tensor* cache : {&state.k_cache(i), &state.v_cache(i)}) {
      // A position's rows of every KV head are contiguous in any cache type (backend/kv_cache.h);
      // an fp8 cache also keeps one scale per (slot, head, position) after the rows.
      const DType t = cache->dtype;
      const int64_t slots = cache->dim(0), cap = cache->dim(1), kvh = cache->dim(2), hd = cache->dim(3);
      const int64_t used = int64_t(path.back()) + 1;
      QWEN36_CHECK(cm.pos0 >= 0 && cm.pos0 + used <= cap, "commit: path rows past the cache ({} + {} > {})", cm.pos0,
                   used, cap);
      const int64_t row = kvh * int64_t(dtype_row_bytes(t, hd));
      auto* bytes = static_cast<std::byte*>(cache->data);
      rows.emplace_back(bytes + (int64_t(cm.slot) * cap + cm.pos0) * row, DType::U8,
                        std::initializer_list<int64_t>{used, row});
      if (t != DType::F8_E4M3) continue;
      auto* scales = reinterpret_cast<float*>(bytes + kv_scale_offset(t, slots, cap, kvh, hd));
      for (int64_t h = 0; h < kvh; ++h)
        rows.emplace_back(scales + (int64_t(cm.slot) * kvh + h) * cap + cm.pos0, DType::F32,
                          std::initializer_list<int64_t>{used, 1});
    }
  }
  backend_.compact_rows(rows, path);
}

void Model::commit_speculative_rank(ModelState& state, std::span<const SpecCommit> commits) {
  const ModelConfig& c = w_.config;
  const int32_t n_max = state.spec_max_tokens();
  std::vector<SeqRun> runs;  // the kept tokens of every commit, packed
  int32_t T = 0;
  std::vector<std::vector<int32_t>> paths;  // each commit's tree path (empty for a chain)
  for (const SpecCommit& cm : commits) {
    QWEN36_CHECK(cm.slot >= 0 && cm.slot < state.slots(), "commit: slot {} out of range", cm.slot);
    QWEN36_CHECK(cm.keep >= 0 && cm.keep <= n_max, "commit: keep {} outside 0..{}", cm.keep, n_max);
    paths.push_back(cm.path_tokens());
    if (cm.path) {
      const std::vector<int32_t>& p = paths.back();
      QWEN36_CHECK(p.size() == size_t(cm.keep) && p[0] == 0 && p.back() < n_max,
                   "commit: a tree path of {} tokens (root {}, last {}) for keep {} of at most {}", p.size(), p[0],
                   p.back(), cm.keep, n_max);
    }
    if (cm.keep > 0) runs.push_back({cm.slot, 0, T, cm.keep});
    T += cm.keep;
  }
  if (T == 0) return;
  for (size_t i = 0; i < commits.size(); ++i)  // every commit checked first: then each tree's becomes a chain's
    if (commits[i].path) compact_tree_path(state, commits[i], paths[i]);
  // The ops read the runs from the batch tables and their temporaries come from the workspace,
  // so that a commit can be recorded and replayed like a decode step, keyed by the runs' slots
  // and lengths: ~8 launches a DeltaNet layer otherwise cost the host more than the device.
  ws_->begin(backend_);
  backend_.set_batch(std::vector<int32_t>(size_t(T), 0), runs, {});
  auto run = [&] { commit_layers(state, runs, T); };
  RecordingKey key(0x9e3779b97f4a7c15ull);
  key.mix(uint64_t(T));
  for (const SeqRun& r : runs) key.mix(uint64_t(uint32_t(r.slot)) << 32 | uint32_t(r.count));
  key.mix(reinterpret_cast<uintptr_t>(ws_->buf ? ws_->buf->data() : nullptr));
  for (int64_t i = 0; i < c.n_layers; ++i)
    if (c.layer_kinds[size_t(i)] != LayerKind::FullAttention)
      for (const Tensor* t : {&state.spec_conv_input(i), &state.spec_g(i), &state.spec_beta(i), &state.conv_state(i),
                              &state.recurrent_state(i)})
        key.mix(*t);
  const int seen = ws_->seen[key.value]++;
  if (seen == 0 || !ws_->buf) return run();
  replay_or_record(key.value, seen, run);
}

// commit_speculative_rank's device work: each DeltaNet layer's kept rows (every run's first
// `count` saved inputs of its slot) replayed through the plain conv and delta rule, advancing
// the slots' states.
void Model::commit_layers(ModelState& state, std::span<const SeqRun> runs, int32_t T) {
  const ModelConfig& c = w_.config;
  const int32_t n_max = state.spec_max_tokens();
  const int64_t Hk = c.linear_k_heads, Hv = c.linear_v_heads, dk = c.linear_k_dim, dv = c.linear_v_dim,
                C = c.conv_dim();
  for (int64_t i = 0; i < c.n_layers; ++i) {
    if (c.layer_kinds[size_t(i)] == LayerKind::FullAttention) continue;
    Scratch s(backend_, *ws_);
    Tensor mixed = s.f32({T, C});
    const DeltaNetWeights& d = w_.layers[size_t(i)].deltanet;
    if (backend_.deltanet_commit(d, state.conv_state(i), state.recurrent_state(i), runs, state.spec_conv_input(i),
                                 state.spec_g(i), state.spec_beta(i), mixed))
      continue;
    Tensor g = s.f32({T, Hv}), beta = s.f32({T, Hv});
    const std::pair<Tensor*, Tensor*> parts[] = {
        {&state.spec_conv_input(i), &mixed}, {&state.spec_g(i), &g}, {&state.spec_beta(i), &beta}};
    for (const auto& [buf, dst] : parts) {
      const int64_t w = dst->cols(), per_slot = int64_t(n_max) * w;
      for (const SeqRun& r : runs) {
        const Tensor from(static_cast<float*>(buf->data) + int64_t(r.slot) * per_slot, DType::F32, {r.count, w});
        Tensor to(static_cast<float*>(dst->data) + int64_t(r.begin) * w, DType::F32, {r.count, w});
        backend_.copy(from, to);
      }
    }
    Tensor q = s.f32({T, Hk, dk}), k = s.f32({T, Hk, dk}), v = s.f32({T, Hv, dv});
    backend_.causal_conv1d_silu_split(mixed, d.conv1d, state.conv_state(i), runs, q, k, v);
    Tensor o = s.f32({T, Hv, dv});  // outputs were produced by the verify pass; discarded
    backend_.gated_delta_rule(q, k, v, g, beta, state.recurrent_state(i), runs, o, DeltaRuleMode::Recurrent);
  }
}

}  // namespace qwen36
