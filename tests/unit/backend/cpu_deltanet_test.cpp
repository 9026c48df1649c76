// The gated delta rule: chunked (prefill) == recurrent (decode) == a naive per-token reference
// written here from the formula in backend/backend.h, in double:
//   q̂ = q / sqrt(Σq² + 1e-6) / sqrt(dk),  k̂ = k / sqrt(Σk² + 1e-6)
//   S ← e^g S;  S ← S + k̂ (β (v − Sᵀk̂))ᵀ;  o = Sᵀ q̂          per value head, S [dk, dv]
// Value head h reads key head h / (Hv/Hk). Outputs and the state left behind are compared.
//
// Tolerance: |x − ref| ≤ 1e-4 + 1e-4·|ref| for both forms against the reference. The state
// is a long f32 recurrence (up to 130 updates with decay near 1), and the chunked form adds
// a triangular solve per chunk; both stay well inside this on the inputs below.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "model/weights.h"
#include "cpu_ops_test_util.h"

namespace qwen36 {
namespace {

using test::expect_close;
using test::Rng;

constexpr double kAtol = 1e-4, kRtol = 1e-4;

struct Dims {
  int64_t Hk, Hv, dk, dv, slots;
};

struct Inputs {
  std::vector<float> q, k, v, g, beta;
};

Inputs random_inputs(Rng& r, const Dims& d, int64_t T) {
  Inputs in;
  in.q.resize(size_t(T * d.Hk * d.dk));
  in.k.resize(in.q.size());
  for (auto& x : in.q) x = r.normal();
  for (auto& x : in.k) x = r.normal();
  in.v = r.vec(size_t(T * d.Hv * d.dv), -1, 1);
  in.g.resize(size_t(T * d.Hv));
  in.beta.resize(in.g.size());
  for (size_t i = 0; i < in.g.size(); ++i) {
    // Mostly slow decay (long memory, the hard case for the chunked cumulative decay), some
    // fast, some none at all.
    const double u = r.uniform();
    in.g[i] = u < 0.6 ? r.uniform(-0.08f, 0.0f) : u < 0.9 ? r.uniform(-3.0f, -0.08f) : 0.0f;
    in.beta[i] = r.uniform(0.0f, 1.0f);
  }
  // A few degenerate keys/queries: all zero (the eps inside the norm keeps them finite).
  if (T > 3) {
    for (int64_t i = 0; i < d.dk; ++i) in.k[size_t((2 * d.Hk) * d.dk + i)] = 0.0f;
    for (int64_t i = 0; i < d.dk; ++i) in.q[size_t((3 * d.Hk) * d.dk + i)] = 0.0f;
  }
  return in;
}

// Per-token reference over the given runs; state [slots, Hv, dk, dv] in double, updated.
void naive_delta_rule(const Dims& d, const Inputs& in, const std::vector<SeqRun>& runs, std::vector<double>& state,
                      std::vector<double>& out) {
  const int64_t ratio = d.Hv / d.Hk;
  for (const SeqRun& r : runs)
    for (int32_t j = 0; j < r.count; ++j) {
      const int64_t t = r.begin + j;
      for (int64_t h = 0; h < d.Hv; ++h) {
        const int64_t kh = h / ratio;
        std::vector<double> q(static_cast<size_t>(d.dk)), k(static_cast<size_t>(d.dk));
        double qs = 0, ks = 0;
        for (int64_t i = 0; i < d.dk; ++i) {
          q[size_t(i)] = in.q[size_t((t * d.Hk + kh) * d.dk + i)];
          k[size_t(i)] = in.k[size_t((t * d.Hk + kh) * d.dk + i)];
          qs += q[size_t(i)] * q[size_t(i)];
          ks += k[size_t(i)] * k[size_t(i)];
        }
        for (int64_t i = 0; i < d.dk; ++i) {
          q[size_t(i)] /= std::sqrt(qs + 1e-6) * std::sqrt(double(d.dk));
          k[size_t(i)] /= std::sqrt(ks + 1e-6);
        }
        double* S = state.data() + (r.slot * d.Hv + h) * d.dk * d.dv;
        const double decay = std::exp(double(in.g[size_t(t * d.Hv + h)]));
        const double beta = in.beta[size_t(t * d.Hv + h)];
        for (int64_t i = 0; i < d.dk * d.dv; ++i) S[i] *= decay;
        std::vector<double> delta(static_cast<size_t>(d.dv));
        for (int64_t y = 0; y < d.dv; ++y) {
          double sk = 0;
          for (int64_t x = 0; x < d.dk; ++x) sk += S[x * d.dv + y] * k[size_t(x)];
          delta[size_t(y)] = beta * (double(in.v[size_t((t * d.Hv + h) * d.dv + y)]) - sk);
        }
        for (int64_t x = 0; x < d.dk; ++x)
          for (int64_t y = 0; y < d.dv; ++y) S[x * d.dv + y] += k[size_t(x)] * delta[size_t(y)];
        for (int64_t y = 0; y < d.dv; ++y) {
          double o = 0;
          for (int64_t x = 0; x < d.dk; ++x) o += S[x * d.dv + y] * q[size_t(x)];
          out[size_t((t * d.Hv + h) * d.dv + y)] = o;
        }
      }
    }
}

// Tokens t0 .. t0 + cnt − 1 of `all`.
Inputs tokens_of(const Inputs& all, const Dims& d, int64_t t0, int64_t cnt) {
  auto slice = [&](const std::vector<float>& src, int64_t per_token) {
    return std::vector<float>(src.begin() + t0 * per_token, src.begin() + (t0 + cnt) * per_token);
  };
  return {slice(all.q, d.Hk * d.dk), slice(all.k, d.Hk * d.dk), slice(all.v, d.Hv * d.dv), slice(all.g, d.Hv),
          slice(all.beta, d.Hv)};
}

struct Result {
  std::vector<float> out, state;
};

Result run_op(Backend& be, const Dims& d, Inputs& in, int64_t T, const std::vector<SeqRun>& runs,
              const std::vector<float>& state0, DeltaRuleMode mode) {
  Result res{std::vector<float>(size_t(T * d.Hv * d.dv), NAN), state0};
  Tensor q = test::f32(in.q, {T, d.Hk, d.dk}), k = test::f32(in.k, {T, d.Hk, d.dk}),
         v = test::f32(in.v, {T, d.Hv, d.dv}), g = test::f32(in.g, {T, d.Hv}), beta = test::f32(in.beta, {T, d.Hv});
  Tensor st = test::f32(res.state, {d.slots, d.Hv, d.dk, d.dv}), out = test::f32(res.out, {T, d.Hv, d.dv});
  be.gated_delta_rule(q, k, v, g, beta, st, runs, out, mode);
  return res;
}

struct Case {
  std::vector<int32_t> lengths;  // one run per entry, into slots in reverse order
  int64_t Hk, ratio;
};

std::string case_name(const Case& c) {
  // ostringstream, not string +: GCC 12 warns (-Wrestrict, falsely) on short concatenations.
  std::ostringstream s;
  s << "Hk" << c.Hk << "_r" << c.ratio << "_len";
  for (int32_t n : c.lengths) s << "_" << n;
  return s.str();
}

// Readable parameter in gtest's failure lines.
void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c); }

class CpuOpsDeltaRule : public ::testing::TestWithParam<Case> {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend(0);
};

// One batch of runs (each into its own slot, with a non-zero initial state), three ways.
TEST_P(CpuOpsDeltaRule, ChunkedEqualsRecurrentEqualsNaive) {
  const Case& c = GetParam();
  const int64_t nruns = int64_t(c.lengths.size());
  const Dims d{c.Hk, c.Hk * c.ratio, 16, 24, nruns + 1};  // dk ≠ dv; one slot left untouched
  Rng r(uint64_t(c.Hk * 1000 + c.ratio * 100 + c.lengths[0]));
  std::vector<SeqRun> runs;
  int32_t T = 0;
  for (int64_t i = 0; i < nruns; ++i) {
    runs.push_back({int32_t(nruns - i), int32_t(7 * i), T, c.lengths[size_t(i)]});
    T += c.lengths[size_t(i)];
  }
  Inputs in = random_inputs(r, d, T);
  const std::vector<float> state0 = r.vec(size_t(d.slots * d.Hv * d.dk * d.dv), -0.5f, 0.5f);

  std::vector<double> ref_state(state0.begin(), state0.end()), ref_out(size_t(T * d.Hv * d.dv));
  naive_delta_rule(d, in, runs, ref_state, ref_out);

  const Result chunked = run_op(*be, d, in, T, runs, state0, DeltaRuleMode::Chunked);
  const Result recurrent = run_op(*be, d, in, T, runs, state0, DeltaRuleMode::Recurrent);
  const Result automatic = run_op(*be, d, in, T, runs, state0, DeltaRuleMode::Auto);
  expect_close(chunked.out, ref_out, kAtol, kRtol, "chunked out vs naive");
  expect_close(chunked.state, ref_state, kAtol, kRtol, "chunked state vs naive");
  expect_close(recurrent.out, ref_out, kAtol, kRtol, "recurrent out vs naive");
  expect_close(recurrent.state, ref_state, kAtol, kRtol, "recurrent state vs naive");
  expect_close(chunked.out, recurrent.out, kAtol, kRtol, "chunked vs recurrent out");
  expect_close(chunked.state, recurrent.state, kAtol, kRtol, "chunked vs recurrent state");
  expect_close(automatic.out, ref_out, kAtol, kRtol, "auto out vs naive");
  // Slot 0 belongs to no run and must be left exactly as it was.
  const size_t per_slot = size_t(d.Hv * d.dk * d.dv);
  for (const Result* res : {&chunked, &recurrent, &automatic})
    for (size_t i = 0; i < per_slot; ++i) ASSERT_EQ(res->state[i], state0[i]) << "untouched slot 0 changed at " << i;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (int64_t ratio : {1, 2, 3})
    for (int32_t n : {1, 63, 64, 65, 130}) v.push_back({{n}, 2, ratio});
  // Several runs of different lengths in one batch, crossing chunk boundaries differently.
  v.push_back({{65, 1, 130}, 1, 3});
  v.push_back({{3, 64, 2, 63}, 2, 2});
  v.push_back({{130, 17}, 3, 1});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Lengths, CpuOpsDeltaRule, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return case_name(i.param); });

// Prefill in chunked pieces, then decode token by token: the state carried between calls
// gives the same outputs as the reference over the whole sequence.
TEST(CpuOpsDeltaRuleCalls, PrefillThenDecodeEqualsWholeSequence) {
  auto be = make_cpu_backend(0);
  const Dims d{2, 6, 16, 8, 1};
  const int64_t n = 140;
  Rng r(77);
  Inputs all = random_inputs(r, d, n);
  const std::vector<float> state0 = r.vec(size_t(d.Hv * d.dk * d.dv), -0.5f, 0.5f);
  std::vector<double> ref_state(state0.begin(), state0.end()), ref_out(size_t(n * d.Hv * d.dv));
  naive_delta_rule(d, all, {{0, 0, 0, int32_t(n)}}, ref_state, ref_out);

  std::vector<float> state = state0, out;
  // Pieces: 70 chunked (crosses 64), 60 chunked, then 10 single-token recurrent steps.
  std::vector<std::pair<int64_t, DeltaRuleMode>> pieces = {{70, DeltaRuleMode::Chunked},
                                                           {60, DeltaRuleMode::Chunked}};
  for (int i = 0; i < 10; ++i) pieces.push_back({1, DeltaRuleMode::Recurrent});
  int64_t t0 = 0;
  for (auto [cnt, mode] : pieces) {
    Inputs p = tokens_of(all, d, t0, cnt);
    const Result res = run_op(*be, d, p, cnt, {{0, int32_t(t0), 0, int32_t(cnt)}}, state, mode);
    state = res.state;
    out.insert(out.end(), res.out.begin(), res.out.end());
    t0 += cnt;
  }
  ASSERT_EQ(t0, n);
  expect_close(out, ref_out, kAtol, kRtol, "pieces out vs naive");
  expect_close(state, ref_state, kAtol, kRtol, "pieces state vs naive");
}

// ---- a bf16 recurrent state (--state-type bf16, model/state.h) ----

// The op on a bf16 state [slots, Hv, dk, dv] (bits in st, updated); returns the outputs.
std::vector<float> run_bf16(Backend& be, const Dims& d, Inputs& in, int64_t T, const std::vector<SeqRun>& runs,
                            std::vector<uint16_t>& st, DeltaRuleMode mode, bool readonly = false) {
  std::vector<float> out(size_t(T * d.Hv * d.dv), NAN);
  Tensor q = test::f32(in.q, {T, d.Hk, d.dk}), k = test::f32(in.k, {T, d.Hk, d.dk}),
         v = test::f32(in.v, {T, d.Hv, d.dv}), g = test::f32(in.g, {T, d.Hv}), beta = test::f32(in.beta, {T, d.Hv});
  Tensor state(st.data(), DType::BF16, {d.slots, d.Hv, d.dk, d.dv}), o = test::f32(out, {T, d.Hv, d.dv});
  if (readonly)
    be.gated_delta_rule_readonly(q, k, v, g, beta, state, runs, o);
  else
    be.gated_delta_rule(q, k, v, g, beta, state, runs, o, mode);
  return out;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
  return b;
}
std::vector<float> widen(const std::vector<uint16_t>& b) {
  std::vector<float> v(b.size());
  for (size_t i = 0; i < b.size(); ++i) v[i] = bf16_to_f32(b[i]);
  return v;
}

// One call = the f32 op on the widened state, the state rounded once at its end: the chunked
// form over 70 tokens, and the recurrent form over one token (a decode step). Bit for bit.
TEST(CpuOpsDeltaRuleBf16State, OneCallIsTheF32OpRoundedAtItsEnd) {
  auto be = make_cpu_backend(0);
  const Dims d{2, 4, 16, 8, 2};
  Rng r(31);
  for (auto [T, mode] : {std::pair<int64_t, DeltaRuleMode>{70, DeltaRuleMode::Chunked}, {1, DeltaRuleMode::Recurrent}}) {
    Inputs in = random_inputs(r, d, T);
    std::vector<uint16_t> st = to_bf16(r.vec(size_t(d.slots * d.Hv * d.dk * d.dv), -0.5f, 0.5f));
    const Result f32 = run_op(*be, d, in, T, {{1, 0, 0, int32_t(T)}}, widen(st), mode);
    const std::vector<float> out = run_bf16(*be, d, in, T, {{1, 0, 0, int32_t(T)}}, st, mode);
    EXPECT_EQ(out, f32.out) << "T = " << T;
    EXPECT_EQ(st, to_bf16(f32.state)) << "T = " << T;  // slot 0 untouched: to_bf16 of its widened self
  }
}

// The recurrent form over several tokens stores (rounds) the state after every token, as that
// many decode steps do: a speculative verify / commit reproduces decode bit for bit. The
// read-only op gives the same outputs and leaves the state alone.
TEST(CpuOpsDeltaRuleBf16State, RecurrentRoundsAfterEveryToken) {
  auto be = make_cpu_backend(0);
  const Dims d{2, 4, 16, 8, 1};
  const int64_t T = 6;
  Rng r(32);
  Inputs all = random_inputs(r, d, T);
  const std::vector<uint16_t> st0 = to_bf16(r.vec(size_t(d.Hv * d.dk * d.dv), -0.5f, 0.5f));
  std::vector<uint16_t> whole = st0, steps = st0, ro = st0;
  const std::vector<float> out = run_bf16(*be, d, all, T, {{0, 0, 0, int32_t(T)}}, whole, DeltaRuleMode::Recurrent);
  EXPECT_EQ(run_bf16(*be, d, all, T, {{0, 0, 0, int32_t(T)}}, ro, DeltaRuleMode::Recurrent, true), out);
  EXPECT_EQ(ro, st0) << "the read-only op wrote the state";
  std::vector<float> stepped;
  for (int64_t t = 0; t < T; ++t) {
    Inputs p = tokens_of(all, d, t, 1);
    const std::vector<float> o = run_bf16(*be, d, p, 1, {{0, int32_t(t), 0, 1}}, steps, DeltaRuleMode::Recurrent);
    stepped.insert(stepped.end(), o.begin(), o.end());
  }
  EXPECT_EQ(out, stepped);
  EXPECT_EQ(whole, steps);
  // and the rounding is real: the f32 state over the same tokens differs from it somewhere
  const Result f32 = run_op(*be, d, all, T, {{0, 0, 0, int32_t(T)}}, widen(st0), DeltaRuleMode::Recurrent);
  EXPECT_NE(to_bf16(f32.state), whole);
}

TEST(CpuOpsDeltaRuleCalls, RejectsBadShapesAndSlots) {
  auto be = make_cpu_backend(0);
  const Dims d{2, 4, 4, 4, 1};
  Rng r(5);
  Inputs in = random_inputs(r, d, 2);
  std::vector<float> st(static_cast<size_t>(d.Hv * d.dk * d.dv));
  EXPECT_THROW(run_op(*be, d, in, 2, {{1, 0, 0, 2}}, st, DeltaRuleMode::Chunked), Error);   // slot past the end
  EXPECT_THROW(run_op(*be, d, in, 2, {{-1, 0, 0, 2}}, st, DeltaRuleMode::Recurrent), Error);
  // Hv not a multiple of Hk.
  const Dims odd{2, 3, 4, 4, 1};
  Inputs in3 = random_inputs(r, odd, 2);
  std::vector<float> st3(size_t(odd.Hv * odd.dk * odd.dv));
  EXPECT_THROW(run_op(*be, odd, in3, 2, {{0, 0, 0, 2}}, st3, DeltaRuleMode::Chunked), Error);
}

// Backend::deltanet_decode (the composition the CPU backend runs) with a GGUF's out_proj head
// order (DeltaNetWeights::out_proj_heads, llama.cpp's tiled order): out's head blocks are the
// blocks of the same step without it, moved — block q holds head out_proj_heads[q].
TEST(CpuOpsDeltaNetDecode, OutProjsHeadOrderMovesTheBlocks) {
  auto be = make_cpu_backend(0);
  const int64_t Hk = 2, Hv = 6, dk = 8, dv = 4, K = 4, T = 3, C = 2 * Hk * dk + Hv * dv;
  Rng r(11);
  std::vector<float> conv_w = r.vec(size_t(C * K), -0.5f, 0.5f), a_neg = r.vec(size_t(Hv), -1.0f, -0.1f),
                     dt = r.vec(size_t(Hv), 0.0f, 0.5f), norm = r.vec(size_t(dv), 0.9f, 1.1f);
  DeltaNetWeights w;
  w.conv1d = test::f32(conv_w, {C, K}), w.a_neg_exp = test::f32(a_neg, {Hv}), w.dt_bias = test::f32(dt, {Hv});
  w.norm = test::f32(norm, {dv});
  DeltaNetWeights tiled = w;
  tiled.out_proj_heads = gguf_tiled_heads(Hk, Hv);
  const std::vector<float> mixed0 = r.vec(size_t(T * C), -1.0f, 1.0f), conv0 = r.vec(size_t(T * C * (K - 1)), -1.0f, 1.0f),
                           st0 = r.vec(size_t(T * Hv * dk * dv), -0.5f, 0.5f);
  std::vector<float> z = r.vec(size_t(T * Hv * dv), -1.0f, 1.0f), a = r.vec(size_t(T * Hv), -2.0f, 2.0f),
                     b = r.vec(size_t(T * Hv), -2.0f, 2.0f);
  const std::vector<SeqRun> runs{{2, 0, 0, 1}, {0, 0, 1, 1}, {1, 0, 2, 1}};
  auto step = [&](const DeltaNetWeights& dw) {
    std::vector<float> mixed = mixed0, conv = conv0, st = st0, out(size_t(T * Hv * dv));
    Tensor tm = test::f32(mixed, {T, C}), tc = test::f32(conv, {T, C, K - 1}), ts = test::f32(st, {T, Hv, dk, dv});
    Tensor to = test::f32(out, {T, Hv, dv});
    be->deltanet_decode(tm, test::f32(z, {T, Hv, dv}), test::f32(a, {T, Hv}), test::f32(b, {T, Hv}), dw, 1e-6f, tc,
                        ts, runs, to);
    return out;
  };
  const std::vector<float> want = step(w), got = step(tiled);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t q = 0; q < Hv; ++q) {
      const int64_t h = tiled.out_proj_heads[size_t(q)];
      EXPECT_TRUE(std::equal(got.begin() + (t * Hv + q) * dv, got.begin() + (t * Hv + q + 1) * dv,
                             want.begin() + (t * Hv + h) * dv))
          << "token " << t << ": block " << q << " is not head " << h;
    }
  EXPECT_NE(got, want);  // (the order is not the identity)
}

}  // namespace
}  // namespace qwen36
