// The MTP head (multi-token prediction; qwen36-model.md §4, engine/spec/mtp_drafter.h): a pass
// over rows with their logits to the host (mtp_forward), and greedy drafting whose chained
// steps stay on the backend (mtp_draft_greedy).
#include <vector>

#include "core/error.h"
#include "model/model_scratch.h"
#include "model/qwen36.h"

namespace qwen36 {

void Model::mtp_forward(std::span<const float> hidden, std::span<const int32_t> next_tokens,
                        std::span<const SeqRun> runs, ModelState& state, float* logits, float* mtp_hidden,
                        std::span<const int32_t> output_rows) {
  if (!peers_) return mtp_forward_rank(hidden, next_tokens, runs, state, logits, mtp_hidden, output_rows);
  // Every rank's hidden state is the same (the residual stream is replicated): rank 0's serves all.
  PeerPass p;
  p.kind = PeerPass::Kind::Mtp;
  p.hidden = hidden, p.next_tokens = next_tokens, p.runs = runs, p.output_rows = output_rows;
  peers_->run(state, p, [&] { mtp_forward_rank(hidden, next_tokens, runs, state, logits, mtp_hidden, output_rows); });
}

void Model::mtp_forward_rank(std::span<const float> hidden, std::span<const int32_t> next_tokens,
                             std::span<const SeqRun> runs, ModelState& state, float* logits, float* mtp_hidden,
                             std::span<const int32_t> output_rows) {
  QWEN36_CHECK(w_.mtp.has_value(), "this checkpoint has no MTP head");
  QWEN36_CHECK(state.has_mtp(), "the model state was created without an MTP cache");
  const ModelConfig& c = w_.config;
  const int64_t n = int64_t(next_tokens.size()), H = c.hidden_size;
  QWEN36_CHECK(int64_t(hidden.size()) == n * H, "mtp_forward: {} hidden values for {} tokens", hidden.size(), n);
  if (n == 0) return;
  Scratch s(backend_);
  Tensor e = s.f32({n, H}), hin = s.f32({n, H});
  backend_.embed(w_.embed_tokens, next_tokens, e);
  backend_.copy_from_host(hidden.data(), hin);
  const Tensor h = mtp_layer(s, e, hin, runs, state);
  std::vector<int32_t> rows(output_rows.begin(), output_rows.end());
  if (rows.empty())
    for (int32_t i = 0; i < int32_t(n); ++i) rows.push_back(i);
  for (int32_t row : rows) QWEN36_CHECK(row >= 0 && row < int32_t(n), "mtp_forward: output row {} out of range", row);
  head(s, h, w_.mtp->norm, rows, logits, mtp_hidden);
}

Tensor Model::mtp_layer(Scratch& s, Tensor& e, Tensor& hin, std::span<const SeqRun> runs, ModelState& state) {
  const ModelConfig& c = w_.config;
  const MtpWeights& m = *w_.mtp;
  const int64_t n = e.rows(), H = c.hidden_size;
  Tensor cat = s.f32({n, 2 * H});
  backend_.rms_norm(e, m.pre_fc_norm_embedding, c.rms_norm_eps, e);
  backend_.rms_norm(hin, m.pre_fc_norm_hidden, c.rms_norm_eps, hin);
  backend_.copy_cols(e, 0, cat, 0, H);  // embedding first, then the hidden state
  backend_.copy_cols(hin, 0, cat, H, H);
  Residual r = residual(s, n);
  backend_.matmul(cat, m.fc, r.h);
  decoder_layer(s, m.layer, r, state.mtp_k_cache(), state.mtp_v_cache(), runs, DeltaRuleMode::Auto);
  finish(r);
  return r.h;
}

// Step 0 runs every pending row (the catch-up of mtp_forward), steps 1.. one row per chain.
// Each step is one recording once seen twice (replay_or_record, as a decode step): its rows'
// tokens, slots and positions come from set_batch's tables, step 0's hidden rows from an upload
// queued before it, a later step's token and hidden row from the step before, on the backend. The
// host waits once, for the drafts, where mtp_forward's path (MtpDrafter's sampled drafts) waits
// at every step for a vocabulary of logits per chain and sends the hidden row back.
void Model::mtp_draft_greedy(std::span<const float> hidden, std::span<const int32_t> next_tokens,
                             std::span<const SeqRun> runs, ModelState& state, int32_t steps, int32_t* drafts) {
  QWEN36_CHECK(!peers_, "mtp_draft_greedy: not with tensor-parallel peers (mtp_forward runs on every rank)");
  QWEN36_CHECK(w_.mtp.has_value(), "this checkpoint has no MTP head");
  QWEN36_CHECK(state.has_mtp(), "the model state was created without an MTP cache");
  const ModelConfig& c = w_.config;
  const int64_t n = int64_t(next_tokens.size()), H = c.hidden_size, R = int64_t(runs.size());
  QWEN36_CHECK(int64_t(hidden.size()) == n * H, "mtp_draft_greedy: {} hidden values for {} tokens", hidden.size(), n);
  QWEN36_CHECK(steps >= 1 && R >= 1, "mtp_draft_greedy: {} steps for {} chains", steps, R);
  check_runs(runs, n, state, steps - 1);  // step j writes each chain's MTP position pos0 + count − 1 + j
  std::vector<int32_t> last;               // each chain's last row: where its drafting starts
  for (const SeqRun& r : runs) last.push_back(r.begin + r.count - 1);

  ws_->begin(backend_);
  Scratch s(backend_, *ws_);
  Tensor ids = s.i32({steps, R});                    // chain i's draft j + 1 at [j, i]
  Tensor out[2] = {s.f32({R, H}), s.f32({R, H})};    // a step's normalised MTP output, the next one's input
  auto draft_row = [&](int32_t j) { return Tensor(ids.as<int32_t>() + int64_t(j) * R, DType::I32, {R}); };
  auto step = [&](int32_t j, std::span<const SeqRun> step_runs, std::span<const int32_t> rows, Tensor& in) {
    Scratch st(backend_, *ws_);
    Tensor e = st.f32({in.rows(), H});
    if (j == 0)
      backend_.embed(w_.embed_tokens, next_tokens, e);
    else
      backend_.embed_ids(w_.embed_tokens, draft_row(j - 1), e);
    const Tensor h = mtp_layer(st, e, in, step_runs, state);
    Tensor& o = out[j % 2];
    backend_.get_rows(h, rows, o);
    backend_.rms_norm(o, w_.mtp->norm, c.rms_norm_eps, o);
    Tensor logits = st.f32({R, c.vocab_size});
    backend_.matmul(o, w_.lm_head, logits);
    Tensor d = draft_row(j);
    backend_.argmax_rows(logits, d);
  };
  std::vector<SeqRun> chained(size_t(R), SeqRun{});
  std::vector<int32_t> each(static_cast<size_t>(R)), dummy(static_cast<size_t>(R), 0);
  for (int32_t i = 0; i < int32_t(R); ++i) each[size_t(i)] = i;
  for (int32_t j = 0; j < steps; ++j) {
    if (j > 0)
      for (int32_t i = 0; i < int32_t(R); ++i) {
        const SeqRun& r = runs[size_t(i)];
        chained[size_t(i)] = {r.slot, r.pos0 + r.count - 1 + j, i, 1};
      }
    const std::span<const SeqRun> step_runs = j == 0 ? runs : std::span<const SeqRun>(chained);
    const std::span<const int32_t> rows = j == 0 ? std::span<const int32_t>(last) : std::span<const int32_t>(each);
    // A chained step's tokens are on the backend (embed_ids): the table's are placeholders.
    backend_.set_batch(j == 0 ? next_tokens : std::span<const int32_t>(dummy), step_runs, rows);
    // Step 0's hidden rows sit below its frame, so the later steps' frames start at one address
    // whatever the number of pending rows: their recordings serve every round.
    Scratch rows_in(backend_, *ws_);
    Tensor in = out[(j + 1) % 2];  // the step before's output
    if (j == 0) {  // queued behind the commit before it: the host goes on to queue step 0
      in = rows_in.f32({n, H});
      backend_.upload(hidden.data(), in.data, in.nbytes());  // `hidden` outlives the wait for the drafts
    }
    RecordingKey key(0x6d74702d64726674ull);
    for (uint64_t v : {uint64_t(j), uint64_t(steps), uint64_t(R)}) key.mix(v);
    if (j == 0)
      for (const SeqRun& r : runs) key.mix(uint64_t(r.count));
    key.mix(reinterpret_cast<uintptr_t>(ws_->buf ? ws_->buf->data() : nullptr));
    key.mix(state.mtp_k_cache());
    key.mix(state.mtp_v_cache());
    const int seen = ws_->seen[key.value]++;
    auto run = [&] { step(j, step_runs, rows, in); };
    if (seen == 0 || !ws_->buf || host_)  // first sight eager (fills the backend's caches), as decode_step
      run();
    else
      replay_or_record(key.value, seen, run);
  }
  backend_.copy_to_host(ids, drafts);
}

}  // namespace qwen36
