// The fused chain verify pass and its commit (Backend::deltanet_verify / deltanet_commit on
// CUDA) against the compositions they replace (Model::deltanet_block, Model::commit_layers) run
// on the CPU backend, and against decode steps.
// Verify: plain one-token runs advance their conv and recurrent state; verify runs of 1..9
// tokens only read theirs, and their raw inputs, g and β land in the commit's buffers (rows
// [0, count) of the run's slot; the other rows untouched). A batch mixes both kinds in shuffled
// slots; one slot is never used; the 27B and dk = 64 head shapes; f32 and bf16 recurrent
// states; run directly and recorded into a graph (replayed twice: the arrival counters restart
// at zero). Commit: runs keeping 1, 3 and 6 tokens from random saved inputs.
// Tolerance 1e-4 of max(1, max |reference|) for the outputs and the advanced states (f32 on
// both sides, other summation orders, ≲ 1e-6 expected; bf16 states: one bf16 step, Tol); the
// conv states, the read-only runs' states and the saved conv inputs are copies, compared
// exactly; g and β at 1e-6 (the same formula, device expf / log1pf against the host's).
// Against decode steps (the same kernels' arithmetic): bit for bit.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "deltanet_test_util.h"
#include "gpu_test_util.h"

namespace qwen36::gputest {
namespace {

class CudaDeltaNetVerify : public CudaTest {};

// One verify-pass batch: runs in batch order; verify[i] marks the read-only ones.
struct VerifyBatch {
  std::vector<SeqRun> runs;
  std::vector<bool> verify;
  std::vector<SeqRun> plain_runs() const { return pick(false); }
  std::vector<SeqRun> verify_runs() const { return pick(true); }
  std::vector<SeqRun> pick(bool v) const {
    std::vector<SeqRun> out;
    for (size_t i = 0; i < runs.size(); ++i)
      if (verify[i] == v) out.push_back(runs[i]);
    return out;
  }
};
// (slot, length, verify?) in batch order
VerifyBatch make_batch(std::initializer_list<std::tuple<int32_t, int32_t, bool>> spec) {
  VerifyBatch b;
  int32_t begin = 0;
  for (const auto& [slot, count, v] : spec) {
    b.runs.push_back({slot, 100 + slot, begin, count});
    b.verify.push_back(v);
    begin += count;
  }
  return b;
}

// rows [begin, begin + count) of src [T, W] → rows [0, count) of the run's slot in buf [slots, n, W]
void save_rows(const HostT& src, HostT& buf, std::span<const SeqRun> runs) {
  const int64_t W = src.t.cols(), n = buf.t.dim(1);
  for (const SeqRun& r : runs)
    std::copy_n(src.t.as<const float>() + int64_t(r.begin) * W, r.count * W,
                buf.t.as<float>() + int64_t(r.slot) * n * W);
}

// The reference: Model::deltanet_block's composition of the plain and read-only ops.
struct Reference {
  HostT out, conv_in, g_in, beta_in;
};
void compose(Backend& cpu, const DecodeShape& s, const DeltaNetWeights& w, const VerifyBatch& vb, HostT mixed,
             const HostT& z, const HostT& a, const HostT& b, HostT& conv, HostT& st, Reference& ref) {
  const int64_t T = mixed.t.rows(), C = mixed.t.cols(), qk = s.Hk * s.dk;
  const std::vector<SeqRun> plain = vb.plain_runs(), verify = vb.verify_runs();
  save_rows(mixed, ref.conv_in, verify);
  cpu.causal_conv1d_silu(mixed.t, w.conv1d, conv.t, plain);
  cpu.causal_conv1d_silu_readonly(mixed.t, w.conv1d, conv.t, verify);
  HostT q(DType::F32, {T, s.Hk, s.dk}), k(DType::F32, {T, s.Hk, s.dk}), v(DType::F32, {T, s.Hv, s.dv});
  for (int64_t t = 0; t < T; ++t) {
    const float* row = mixed.t.as<const float>() + t * C;
    std::copy_n(row, qk, q.t.as<float>() + t * qk);
    std::copy_n(row + qk, qk, k.t.as<float>() + t * qk);
    std::copy_n(row + 2 * qk, s.Hv * s.dv, v.t.as<float>() + t * s.Hv * s.dv);
  }
  HostT g(DType::F32, {T, s.Hv}), beta(DType::F32, {T, s.Hv});
  cpu.deltanet_gates(a.t, b.t, w.a_neg_exp, w.dt_bias, g.t, beta.t);
  save_rows(g, ref.g_in, verify);
  save_rows(beta, ref.beta_in, verify);
  cpu.gated_delta_rule(q.t, k.t, v.t, g.t, beta.t, st.t, plain, ref.out.t, DeltaRuleMode::Recurrent);
  cpu.gated_delta_rule_readonly(q.t, k.t, v.t, g.t, beta.t, st.t, verify, ref.out.t);
  cpu.gated_rms_norm(ref.out.t, z.t, w.norm, kEps, ref.out.t);
}

std::vector<float> widened(const HostT& h) {
  if (h.t.dtype == DType::F32) return h.floats();
  std::vector<float> v(size_t(h.t.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_to_f32(h.t.as<const uint16_t>()[i]);
  return v;
}
std::vector<float> download_any(Backend& gpu, const Tensor& t) {
  if (t.dtype == DType::F32) return download(gpu, t);
  HostT h(t.dtype, {t.numel()});
  gpu.copy_to_host(t, h.t.data);
  return widened(h);
}

// Against the CPU composition: f32 states at 1e-4 (summation orders); a bf16 state is rounded
// after every token on both sides, and an f32 difference of ~1e-7 flips a rounding now and then:
// one bf16 step (2^-8 relative; 2e-3 at the states' |0.5|), and outputs read from such a state 1e-3.
struct Tol {
  double out, state;
};
Tol tolerance(DType state_type) { return state_type == DType::BF16 ? Tol{1e-3, 4e-3} : Tol{1e-4, 1e-4}; }

void check_verify(Backend& gpu, std::mt19937& rng, const DecodeShape& s, const VerifyBatch& vb, DType state_type,
                  bool record) {
  auto cpu = make_cpu_backend(1);
  const int64_t C = 2 * s.Hk * s.dk + s.Hv * s.dv, slots = 7, n = 9;
  int64_t T = 0;
  for (const SeqRun& r : vb.runs) T += r.count;
  const DecodeWeights w(gpu, rng, s);
  HostT conv = random_t(rng, DType::F32, {slots, C, kConvK - 1});
  HostT st = random_t(rng, state_type, {slots, s.Hv, s.dk, s.dv}, -0.5f, 0.5f);
  HostT mixed = random_t(rng, DType::F32, {T, C}), z = random_t(rng, DType::F32, {T, s.Hv, s.dv});
  HostT a = random_t(rng, DType::F32, {T, s.Hv}, -3.0f, 3.0f), b = random_t(rng, DType::F32, {T, s.Hv}, -3.0f, 3.0f);
  // the saved-input buffers start random: rows the pass does not own must keep their values
  Reference ref{HostT(DType::F32, {T, s.Hv, s.dv}), random_t(rng, DType::F32, {slots, n, C}),
                random_t(rng, DType::F32, {slots, n, s.Hv}), random_t(rng, DType::F32, {slots, n, s.Hv})};
  DevT dconv = upload(gpu, conv), dst = upload(gpu, st), dm = upload(gpu, mixed), dz = upload(gpu, z);
  DevT da = upload(gpu, a), db = upload(gpu, b), dout = upload(gpu, HostT(DType::F32, {T, s.Hv, s.dv}));
  DevT dci = upload(gpu, ref.conv_in), dgi = upload(gpu, ref.g_in), dbi = upload(gpu, ref.beta_in);
  HostT conv_want = conv, st_want = st;
  compose(*cpu, s, w.host(), vb, mixed, z, a, b, conv_want, st_want, ref);

  const std::vector<SeqRun> verify = vb.verify_runs();
  const DeltaNetWeights dw = w.dev();
  auto op = [&] {
    return gpu.deltanet_verify(dm.t, dz.t, da.t, db.t, dw, kEps, dconv.t, dst.t, vb.runs, verify, dci.t, dgi.t, dbi.t,
                               dout.t);
  };
  const int reps = record ? 2 : 1;
  if (record) {
    const std::vector<int32_t> tokens(size_t(T), 0);
    gpu.set_batch(tokens, vb.runs, {});
    if (!gpu.begin_capture()) GTEST_SKIP() << "the backend does not record (QWEN36_PROFILE set?)";
    const bool taken = op();
    ASSERT_TRUE(gpu.end_capture(0x7e51f1ed, true)) << s.name << ": the verify op could not be recorded";
    ASSERT_TRUE(taken) << s.name << ": the CUDA backend did not fuse the verify pass";
  }
  for (int rep = 0; rep < reps; ++rep) {
    if (rep > 0) {  // mixed is scratch to the op; the plain runs' states advance again
      gpu.copy_from_host(mixed.t.data, dm.t);
      gpu.copy_from_host(conv.t.data, dconv.t);
      gpu.copy_from_host(st.t.data, dst.t);
    }
    if (record)
      ASSERT_TRUE(gpu.replay(0x7e51f1ed));
    else
      ASSERT_TRUE(op()) << s.name << ": the CUDA backend did not fuse the verify pass";
  }
  const double eo = rel_err(download(gpu, dout.t), ref.out.floats());
  const double es = rel_err(download_any(gpu, dst.t), widened(st_want));
  const double eg = rel_err(download(gpu, dgi.t), ref.g_in.floats());
  const double eb = rel_err(download(gpu, dbi.t), ref.beta_in.floats());
  std::printf(
      "[ deltanet ] verify %s, %s state%s, %zu runs (%lld tokens): out err %.2e, state err %.2e, g err %.2e, "
      "beta err %.2e\n",
      s.name, std::string(dtype_name(state_type)).c_str(), record ? ", recorded" : "", vb.runs.size(), (long long)T, eo,
      es, eg, eb);
  const Tol tol = tolerance(state_type);
  EXPECT_LE(eo, tol.out) << s.name << ": outputs";
  EXPECT_LE(es, tol.state) << s.name << ": recurrent states (plain runs advanced, verify runs' and slot 6 as uploaded)";
  EXPECT_LE(eg, 1e-6) << s.name << ": saved g";
  EXPECT_LE(eb, 1e-6) << s.name << ": saved beta";
  EXPECT_EQ(download(gpu, dconv.t), conv_want.floats()) << s.name << ": conv states";
  EXPECT_EQ(download(gpu, dci.t), ref.conv_in.floats()) << s.name << ": saved conv inputs";
  // the verify runs' recurrent states are read, never written: bit for bit as uploaded
  const int64_t per_slot = s.Hv * s.dk * s.dv;
  const std::vector<float> got_st = download_any(gpu, dst.t), was = widened(st);
  for (const SeqRun& r : verify)
    EXPECT_TRUE(std::equal(was.begin() + r.slot * per_slot, was.begin() + (r.slot + 1) * per_slot,
                           got_st.begin() + r.slot * per_slot))
        << s.name << ": verify run in slot " << r.slot << " wrote its state";
}

// a verify run of 4 (k = 3) alone, as a batch-1 MTP round
const VerifyBatch kAlone = make_batch({{2, 4, true}});
// plain one-token runs beside verify runs of 1, 6 and 9 tokens, shuffled slots; slot 6 unused
const VerifyBatch kMixed = make_batch({{3, 1, false}, {0, 6, true}, {5, 1, false}, {1, 1, true}, {4, 9, true}});

TEST_F(CudaDeltaNetVerify, FusedMatchesComposition) {
  for (const DecodeShape* s : {&kDec27B, &kDecD64})
    for (const VerifyBatch* vb : {&kAlone, &kMixed}) check_verify(*gpu_, rng_, *s, *vb, DType::F32, false);
}

TEST_F(CudaDeltaNetVerify, FusedMatchesCompositionBf16State) {
  for (const VerifyBatch* vb : {&kAlone, &kMixed}) check_verify(*gpu_, rng_, kDec27B, *vb, DType::BF16, false);
}

TEST_F(CudaDeltaNetVerify, FusedRecorded) {
  for (const VerifyBatch* vb : {&kAlone, &kMixed}) check_verify(*gpu_, rng_, kDec27B, *vb, DType::F32, true);
}

// ---- commit ----

// The commit (Backend::deltanet_commit on CUDA) against the model's composition of the plain ops
// over the saved rows (Model::commit_layers): runs keeping 1, 3 and 6 tokens in shuffled slots,
// random saved inputs (g ≤ 0, β ∈ [0, 1]); the conv state exactly (copies of inputs), the
// recurrent state at 1e-4 as above; f32 and bf16 states.
void check_commit(Backend& gpu, std::mt19937& rng, const DecodeShape& s, DType state_type) {
  auto cpu = make_cpu_backend(1);
  const int64_t C = 2 * s.Hk * s.dk + s.Hv * s.dv, slots = 7, n = 9, qk = s.Hk * s.dk;
  const std::vector<SeqRun> runs{{4, 0, 0, 3}, {1, 0, 3, 1}, {5, 0, 4, 6}};
  const int64_t T = 10;
  const DecodeWeights w(gpu, rng, s);
  HostT conv = random_t(rng, DType::F32, {slots, C, kConvK - 1});
  HostT st = random_t(rng, state_type, {slots, s.Hv, s.dk, s.dv}, -0.5f, 0.5f);
  HostT ci = random_t(rng, DType::F32, {slots, n, C}), gi = random_t(rng, DType::F32, {slots, n, s.Hv}, -0.5f, 0.0f);
  HostT bi = random_t(rng, DType::F32, {slots, n, s.Hv}, 0.0f, 1.0f);
  DevT dconv = upload(gpu, conv), dst = upload(gpu, st), dci = upload(gpu, ci), dgi = upload(gpu, gi);
  DevT dbi = upload(gpu, bi), dm = upload(gpu, HostT(DType::F32, {T, C}));
  ASSERT_TRUE(gpu.deltanet_commit(w.dev(), dconv.t, dst.t, runs, dci.t, dgi.t, dbi.t, dm.t))
      << s.name << ": the CUDA backend did not fuse the commit";
  // the composition: the slots' first rows gathered, conv, q / k / v split, the delta rule
  HostT mixed(DType::F32, {T, C}), g(DType::F32, {T, s.Hv}), beta(DType::F32, {T, s.Hv});
  for (const SeqRun& r : runs) {
    std::copy_n(ci.t.as<const float>() + r.slot * n * C, r.count * C, mixed.f() + r.begin * C);
    std::copy_n(gi.t.as<const float>() + r.slot * n * s.Hv, r.count * s.Hv, g.f() + r.begin * s.Hv);
    std::copy_n(bi.t.as<const float>() + r.slot * n * s.Hv, r.count * s.Hv, beta.f() + r.begin * s.Hv);
  }
  const DeltaNetWeights hw = w.host();
  cpu->causal_conv1d_silu(mixed.t, hw.conv1d, conv.t, runs);
  HostT q(DType::F32, {T, s.Hk, s.dk}), k(DType::F32, {T, s.Hk, s.dk}), v(DType::F32, {T, s.Hv, s.dv});
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(mixed.f() + t * C, qk, q.f() + t * qk);
    std::copy_n(mixed.f() + t * C + qk, qk, k.f() + t * qk);
    std::copy_n(mixed.f() + t * C + 2 * qk, s.Hv * s.dv, v.f() + t * s.Hv * s.dv);
  }
  HostT o(DType::F32, {T, s.Hv, s.dv});
  cpu->gated_delta_rule(q.t, k.t, v.t, g.t, beta.t, st.t, runs, o.t, DeltaRuleMode::Recurrent);
  const double es = rel_err(download_any(gpu, dst.t), widened(st));
  std::printf("[ deltanet ] commit %s, %s state: state err %.2e\n", s.name, std::string(dtype_name(state_type)).c_str(),
              es);
  EXPECT_LE(es, tolerance(state_type).state) << s.name << ": recurrent states";
  EXPECT_EQ(download(gpu, dconv.t), conv.floats()) << s.name << ": conv states";
}

TEST_F(CudaDeltaNetVerify, CommitMatchesComposition) {
  for (const DecodeShape* s : {&kDec27B, &kDecD64}) check_commit(*gpu_, rng_, *s, DType::F32);
  check_commit(*gpu_, rng_, kDec27B, DType::BF16);
}

// The point of the fused pair: a verify pass of 6 tokens and the commit of its first `keep`
// leave the state, and give the kept tokens' outputs, that `keep` decode steps
// (Backend::deltanet_decode) do — bit for bit, f32 and bf16 states: the same kernels' arithmetic.
TEST_F(CudaDeltaNetVerify, VerifyThenCommitIsDecodeBitForBit) {
  const DecodeShape& s = kDec27B;
  const int64_t C = 2 * s.Hk * s.dk + s.Hv * s.dv, slots = 3, n = 9, T = 6, slot = 2;
  const DecodeWeights w(*gpu_, rng_, s);
  const DeltaNetWeights dw = w.dev();
  for (DType state_type : {DType::F32, DType::BF16})
    for (int32_t keep : {1, 4, 6}) {
      HostT conv = random_t(rng_, DType::F32, {slots, C, kConvK - 1});
      HostT st = random_t(rng_, state_type, {slots, s.Hv, s.dk, s.dv}, -0.5f, 0.5f);
      HostT mixed = random_t(rng_, DType::F32, {T, C}), z = random_t(rng_, DType::F32, {T, s.Hv, s.dv});
      HostT a = random_t(rng_, DType::F32, {T, s.Hv}, -3.0f, 3.0f),
            b = random_t(rng_, DType::F32, {T, s.Hv}, -3.0f, 3.0f);
      // speculative: verify all six, commit `keep`
      DevT dconv = upload(*gpu_, conv), dst = upload(*gpu_, st), dm = upload(*gpu_, mixed), dz = upload(*gpu_, z);
      DevT da = upload(*gpu_, a), db = upload(*gpu_, b), dout = upload(*gpu_, HostT(DType::F32, {T, s.Hv, s.dv}));
      DevT dci = upload(*gpu_, HostT(DType::F32, {slots, n, C})),
           dgi = upload(*gpu_, HostT(DType::F32, {slots, n, s.Hv}));
      DevT dbi = upload(*gpu_, HostT(DType::F32, {slots, n, s.Hv}));
      const std::vector<SeqRun> vr{{int32_t(slot), 0, 0, int32_t(T)}};
      ASSERT_TRUE(
          gpu_->deltanet_verify(dm.t, dz.t, da.t, db.t, dw, kEps, dconv.t, dst.t, vr, vr, dci.t, dgi.t, dbi.t, dout.t));
      const std::vector<SeqRun> cr{{int32_t(slot), 0, 0, keep}};
      DevT dscratch = upload(*gpu_, HostT(DType::F32, {keep, C}));
      ASSERT_TRUE(gpu_->deltanet_commit(dw, dconv.t, dst.t, cr, dci.t, dgi.t, dbi.t, dscratch.t));
      // plain: `keep` decode steps of one token
      DevT pconv = upload(*gpu_, conv), pst = upload(*gpu_, st);
      std::vector<float> want_out;
      for (int32_t j = 0; j < keep; ++j) {
        auto row = [&](const HostT& h, int64_t w1, std::initializer_list<int64_t> shape) {
          HostT r(DType::F32, shape);
          std::copy_n(h.t.as<const float>() + j * w1, w1, r.f());
          return upload(*gpu_, r);
        };
        DevT m1 = row(mixed, C, {1, C}), z1 = row(z, s.Hv * s.dv, {1, s.Hv, s.dv}), a1 = row(a, s.Hv, {1, s.Hv});
        DevT b1 = row(b, s.Hv, {1, s.Hv}), o1 = upload(*gpu_, HostT(DType::F32, {1, s.Hv, s.dv}));
        const std::vector<SeqRun> one{{int32_t(slot), j, 0, 1}};
        gpu_->deltanet_decode(m1.t, z1.t, a1.t, b1.t, dw, kEps, pconv.t, pst.t, one, o1.t);
        const std::vector<float> o = download(*gpu_, o1.t);
        want_out.insert(want_out.end(), o.begin(), o.end());
      }
      std::vector<float> got_out = download(*gpu_, dout.t);
      got_out.resize(want_out.size());
      const std::string what = std::string(dtype_name(state_type)) + " state, keep " + std::to_string(keep);
      EXPECT_EQ(got_out, want_out) << what << ": the kept tokens' outputs";
      EXPECT_EQ(download_any(*gpu_, dst.t), download_any(*gpu_, pst.t)) << what << ": recurrent states";
      EXPECT_EQ(download(*gpu_, dconv.t), download(*gpu_, pconv.t)) << what << ": conv states";
    }
}

// A GGUF's out_proj reads its heads in llama.cpp's tiled order (DeltaNetWeights::out_proj_heads):
// the fused decode, chain verify and tree verify ops then write out's head blocks in that order —
// bit for bit the blocks they write without it, moved (as the default composition moves them).
TEST_F(CudaDeltaNetVerify, FusedOpsWriteOutProjsHeadOrder) {
  const DecodeShape& s = kDecD64;
  const int64_t C = 2 * s.Hk * s.dk + s.Hv * s.dv, slots = 6, n = 9, T = 6, HD = s.Hv * s.dv, r = s.Hv / s.Hk;
  const DecodeWeights w(*gpu_, rng_, s);
  const DeltaNetWeights plain = w.dev();
  DeltaNetWeights ordered = plain;
  for (int64_t j = 0; j < r; ++j)  // block j·Hk + i holds head i·r + j
    for (int64_t i = 0; i < s.Hk; ++i) ordered.out_proj_heads.push_back(int32_t(i * r + j));
  const HostT conv = random_t(rng_, DType::F32, {slots, C, kConvK - 1});
  const HostT st = random_t(rng_, DType::F32, {slots, s.Hv, s.dk, s.dv}, -0.5f, 0.5f);
  const HostT mixed = random_t(rng_, DType::F32, {T, C}), z = random_t(rng_, DType::F32, {T, s.Hv, s.dv});
  const HostT a = random_t(rng_, DType::F32, {T, s.Hv}, -3.0f, 3.0f), b = random_t(rng_, DType::F32, {T, s.Hv}, -3.0f, 3.0f);
  const std::vector<int32_t> parent{-1, 0, 0, 1, 1, 2};
  // op 0: decode (six one-token runs), 1: a chain verify run of six, 2: a tree of six
  auto run_op = [&](int op, const DeltaNetWeights& dw) {
    DevT dconv = upload(*gpu_, conv), dst = upload(*gpu_, st), dm = upload(*gpu_, mixed), dz = upload(*gpu_, z);
    DevT da = upload(*gpu_, a), db = upload(*gpu_, b), dout = upload(*gpu_, HostT(DType::F32, {T, s.Hv, s.dv}));
    DevT dci = upload(*gpu_, HostT(DType::F32, {slots, n, C})), dgi = upload(*gpu_, HostT(DType::F32, {slots, n, s.Hv}));
    DevT dbi = upload(*gpu_, HostT(DType::F32, {slots, n, s.Hv}));
    const std::vector<SeqRun> one{{1, 0, 0, int32_t(T)}};
    std::vector<SeqRun> runs;
    for (int32_t i = 0; i < int32_t(T); ++i) runs.push_back({i, 0, i, 1});
    if (op == 0) {
      gpu_->deltanet_decode(dm.t, dz.t, da.t, db.t, dw, kEps, dconv.t, dst.t, runs, dout.t);
    } else if (op == 1) {
      EXPECT_TRUE(gpu_->deltanet_verify(dm.t, dz.t, da.t, db.t, dw, kEps, dconv.t, dst.t, one, one, dci.t, dgi.t,
                                        dbi.t, dout.t));
    } else {
      EXPECT_TRUE(gpu_->deltanet_verify_tree(dm.t, dz.t, da.t, db.t, dw, kEps, dconv.t, dst.t, one[0], parent, dci.t,
                                             dgi.t, dbi.t, dout.t));
    }
    return download(*gpu_, dout.t);
  };
  for (int op : {0, 1, 2}) {
    const std::vector<float> want = run_op(op, plain), got = run_op(op, ordered);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t q = 0; q < s.Hv; ++q) {
        const int64_t h = ordered.out_proj_heads[size_t(q)];
        EXPECT_TRUE(std::equal(got.begin() + t * HD + q * s.dv, got.begin() + t * HD + (q + 1) * s.dv,
                               want.begin() + t * HD + h * s.dv))
            << "op " << op << ", token " << t << ": block " << q << " is not head " << h;
      }
  }
}

// Batches the fused form does not take, nothing written: a plain run of many tokens (a prefill
// beside the verify runs), and more runs than its read-only mask holds.
TEST_F(CudaDeltaNetVerify, NotTakenLeavesEverything) {
  const DecodeShape& s = kDecD64;
  const int64_t C = 2 * s.Hk * s.dk + s.Hv * s.dv;
  const DecodeWeights w(*gpu_, rng_, s);
  for (int64_t nruns : {2, 65}) {
    std::vector<SeqRun> runs{{0, 0, 0, nruns == 2 ? 5 : 1}};
    for (int32_t i = 1; i < nruns; ++i) runs.push_back({i, 0, runs.back().begin + runs.back().count, 3});
    int64_t T = 0;
    for (const SeqRun& r : runs) T += r.count;
    const std::vector<SeqRun> verify(runs.begin() + 1, runs.end());
    HostT mixed = random_t(rng_, DType::F32, {T, C}), conv = random_t(rng_, DType::F32, {nruns, C, kConvK - 1});
    HostT st = random_t(rng_, DType::F32, {nruns, s.Hv, s.dk, s.dv}), ci = random_t(rng_, DType::F32, {nruns, 4, C});
    DevT dm = upload(*gpu_, mixed), dconv = upload(*gpu_, conv), dst = upload(*gpu_, st), dci = upload(*gpu_, ci);
    DevT dz = upload(*gpu_, random_t(rng_, DType::F32, {T, s.Hv, s.dv}));
    DevT da = upload(*gpu_, random_t(rng_, DType::F32, {T, s.Hv})),
         db = upload(*gpu_, random_t(rng_, DType::F32, {T, s.Hv}));
    DevT dg = upload(*gpu_, HostT(DType::F32, {nruns, 4, s.Hv})),
         dbeta = upload(*gpu_, HostT(DType::F32, {nruns, 4, s.Hv}));
    DevT dout = upload(*gpu_, HostT(DType::F32, {T, s.Hv, s.dv}));
    EXPECT_FALSE(gpu_->deltanet_verify(dm.t, dz.t, da.t, db.t, w.dev(), kEps, dconv.t, dst.t, runs, verify, dci.t, dg.t,
                                       dbeta.t, dout.t))
        << nruns << " runs";
    EXPECT_EQ(download(*gpu_, dm.t), mixed.floats()) << nruns << " runs: mixed";
    EXPECT_EQ(download(*gpu_, dconv.t), conv.floats()) << nruns << " runs: conv state";
    EXPECT_EQ(download(*gpu_, dst.t), st.floats()) << nruns << " runs: recurrent state";
    EXPECT_EQ(download(*gpu_, dci.t), ci.floats()) << nruns << " runs: saved conv inputs";
  }
}

}  // namespace
}  // namespace qwen36::gputest
