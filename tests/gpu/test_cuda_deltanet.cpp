// The CUDA Gated DeltaNet against the CPU reference on random inputs.
//
// Delta rule (cuda_deltanet.cu dispatch; cuda_delta_chunked.cu, the chunked prefill form) vs
// cpu::gated_delta_rule: several runs of one batch in different slots, lengths around the
// chunk size (1, 63, 64, 65, 200, 300), nonzero initial state carried over two batches, the
// 27B (Hv/Hk = 3), 35B (Hv/Hk = 2) and dk = 64 shapes, modes Chunked (every run chunked) and
// Auto (runs ≥ 64 chunked, the rest recurrent); a batch of 40 runs (decode steps mixed with
// prefills); outputs and the whole state tensor (one slot untouched) are compared.
// Tolerance 1e-4 of max(1, max |reference|) (outputs here are ≲ 1, so about 1e-4 absolute).
// Both sides compute in f32 with the same chunk boundaries; they differ in summation order
// and, on the GPU, in the tensor-core products (cuda_delta_chunked.cu's header: split
// operands, ≲ 1e-5 relative per product, or f16/tf32 operands (2^-11) in the output
// products, whose errors are not carried). The chunked tests run the default (fused) form;
// SplitFormMatchesCpu the split (three-kernel) fallback; ChunkedInSegments both forms with a
// workspace of 1-2 chunks (many launches, each starting and ending inside runs). The UT
// inverse of a chunk of random unit keys is well conditioned (|A_ij| ≤ β |k̂_i·k̂_j| ~ 0.1),
// and the decay (g ≤ 0) keeps state errors from growing over chunks, so errors of
// ~1e-6..3e-5 are expected; a wrong index, mask or padding row shows up as O(0.1..1).
//
// Fused decode (Backend::deltanet_decode) vs the CPU backend's composition of the plain ops:
// three steps carrying conv and recurrent state, batches of 1..5 one-token runs in shuffled
// slots, the 27B, 35B and dk = 64 shapes (and dv = 48, which the CUDA backend composes from
// the plain ops), run directly and recorded into a graph; each step run / replayed three
// times (the state kernel's per-head arrival counters must start every launch at zero);
// batches of 600 and 1100 tokens (blocks far from all resident). Tolerance 1e-4 as above:
// f32 on both sides, different summation orders (≲ 1e-6 expected); the conv state is copied,
// so compared exactly.
//
// Conv1d prefill (cuda_conv1d.cu) vs cpu::causal_conv1d_silu: multi-chunk runs, K 2/4/8,
// 4 channels a thread and 1, outputs at 1e-6, the state exactly; the same with the [q | k | v]
// blocks written apart (causal_conv1d_silu_split: widths of whole float4s and not, decode-sized
// runs too); a 4096 × 10240 timing print.
//
// Read-only ops (speculative verify) vs the CPU read-only ops, the state compared bit for bit
// with what was uploaded, and vs the GPU plain ops (the same kernels: bit for bit). The tree
// read-only ops' one-launch forms vs the Backend composition (backend/tree_ops.h) on the same
// device: bit for bit (the same window and recurrence steps over the same root paths); a
// malformed tree refused before anything runs.
//
// Timing tests print one 4096-token prefill layer of the 27B shape (chunked vs recurrent,
// and each chunked form per kernel, both also checked against the recurrent kernel), a
// crossover sweep for the Auto threshold, the conv1d prefill and the decode step per layer
// (fused vs composed, graph-replayed); their only assertions are chunked ≈ recurrent.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <utility>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "deltanet_test_util.h"
#include "gpu_test_util.h"

namespace qwen36::cuda {  // cuda_delta_chunked.cu: test instrumentation of the chunked form
// on: every later chunked call times its three kernels (cudaEvents, synchronising); resets the sums
void delta_rule_chunked_timing(bool on);
// summed milliseconds of prepare, state scan and output over `calls` calls since timing was turned on
// (the fused form's output is part of its scan: 0)
void delta_rule_chunked_times(float ms[3], int* calls);
// the form later calls take: 0 the default (fused where it fits), 1 split (three kernels), 2 fused
void delta_rule_chunked_form(int form);
// the workspace cap in bytes (0: the default 1 GB): small caps run a batch in segments of chunks
void delta_rule_chunked_workspace(size_t bytes);
void deltanet_decode_select(const char* mode);  // cuda_deltanet_fused.cu: "two", "head", "slice" or null
}  // namespace qwen36::cuda

namespace qwen36::gputest {
namespace {

class CudaDeltaNet : public CudaTest {};

struct Shape {
  const char* name;
  int64_t Hk, Hv, d;  // dk = dv = d
};

// The worst element of got vs want, on rel_err's scale, and where it is.
struct Worst {
  double err = 0;
  size_t at = 0;
  float got = 0, want = 0;
};
Worst worst_of(const std::vector<float>& got, const std::vector<float>& want) {
  Worst w;
  double scale = 1;
  for (float x : want) scale = std::max(scale, double(std::abs(x)));
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double d = std::abs(double(got[i]) - double(want[i]));
    const double e = std::isnan(d) ? 1e30 : d / scale;
    if (e > w.err) w = {e, i, got[i], want[i]};
  }
  return w;
}

// "token t (run r, offset o), head h, col y" for an output index
std::string out_where(size_t at, const std::vector<SeqRun>& runs, int64_t Hv, int64_t d) {
  const int64_t t = int64_t(at) / (Hv * d), h = int64_t(at) / d % Hv, y = int64_t(at) % d;
  std::ostringstream o;
  o << "token " << t;
  for (size_t r = 0; r < runs.size(); ++r)
    if (t >= runs[r].begin && t < runs[r].begin + runs[r].count)
      o << " (run " << r << ": slot " << runs[r].slot << ", " << runs[r].count << " tokens, offset "
        << t - runs[r].begin << ", chunk " << (t - runs[r].begin) / 64 << ")";
  o << ", head " << h << ", col " << y;
  return o.str();
}

std::string state_where(size_t at, int64_t Hv, int64_t d) {
  const int64_t per_slot = Hv * d * d;
  std::ostringstream o;
  o << "slot " << int64_t(at) / per_slot << ", head " << int64_t(at) / (d * d) % Hv << ", row " << int64_t(at) / d % d
    << ", col " << int64_t(at) % d;
  return o.str();
}

struct Inputs {
  HostT q, k, v, g, beta;
};
Inputs random_inputs(std::mt19937& rng, int64_t T, const Shape& s) {
  // g: log-decays of realistic size (decay per token e^g ∈ [0.6, 1]); β ∈ [0, 1]
  return {random_t(rng, DType::F32, {T, s.Hk, s.d}), random_t(rng, DType::F32, {T, s.Hk, s.d}),
          random_t(rng, DType::F32, {T, s.Hv, s.d}), random_t(rng, DType::F32, {T, s.Hv}, -0.5f, 0.0f),
          random_t(rng, DType::F32, {T, s.Hv}, 0.0f, 1.0f)};
}

void run_gpu(Backend& gpu, const Inputs& in, DevT& dst, const std::vector<SeqRun>& runs, DeltaRuleMode mode,
             DevT& dout) {
  DevT dq = upload(gpu, in.q), dk = upload(gpu, in.k), dv = upload(gpu, in.v), dg = upload(gpu, in.g),
       db = upload(gpu, in.beta);
  gpu.gated_delta_rule(dq.t, dk.t, dv.t, dg.t, db.t, dst.t, runs, dout.t, mode);
}

// The default batches: six runs around the chunk size, then a second batch continuing them.
const std::vector<std::vector<SeqRun>> kSteps{
    {{5, 0, 0, 1}, {0, 0, 1, 63}, {3, 0, 64, 64}, {1, 0, 128, 65}, {4, 0, 193, 200}, {2, 0, 393, 300}},
    {{2, 300, 0, 130}, {5, 1, 130, 1}, {3, 64, 131, 64}, {0, 63, 195, 2}, {4, 200, 197, 129}}};

void check_against_cpu(Backend& gpu, std::mt19937& rng, const Shape& s, DeltaRuleMode mode,
                       const std::vector<std::vector<SeqRun>>& steps = kSteps, int64_t slots = 7) {
  const char* mname = mode == DeltaRuleMode::Chunked ? "Chunked" : "Auto";
  // the last slot is never used by kSteps: it must come back unchanged
  HostT st = random_t(rng, DType::F32, {slots, s.Hv, s.d, s.d}, -0.5f, 0.5f);
  DevT dst = upload(gpu, st);
  for (size_t step = 0; step < steps.size(); ++step) {
    const std::vector<SeqRun>& runs = steps[step];
    int64_t T = 0;
    for (const SeqRun& r : runs) T += r.count;
    const Inputs in = random_inputs(rng, T, s);
    HostT want(DType::F32, {T, s.Hv, s.d});
    cpu::gated_delta_rule(in.q.t, in.k.t, in.v.t, in.g.t, in.beta.t, st.t, runs, want.t, mode);
    DevT dout = upload(gpu, HostT(DType::F32, {T, s.Hv, s.d}));
    run_gpu(gpu, in, dst, runs, mode, dout);
    const Worst wo = worst_of(download(gpu, dout.t), want.floats());
    const Worst ws = worst_of(download(gpu, dst.t), st.floats());
    std::printf("[ deltanet ] %s %s step %zu: out err %.2e, state err %.2e\n", s.name, mname, step, wo.err, ws.err);
    EXPECT_LE(wo.err, 1e-4) << s.name << " " << mname << " step " << step << ": output at "
                            << out_where(wo.at, runs, s.Hv, s.d) << ": got " << wo.got << ", want " << wo.want;
    EXPECT_LE(ws.err, 1e-4) << s.name << " " << mname << " step " << step << ": state at "
                            << state_where(ws.at, s.Hv, s.d) << ": got " << ws.got << ", want " << ws.want;
  }
}

const Shape k27B{"27B (Hk 16, Hv 48, d 128)", 16, 48, 128};
const Shape k35B{"35B (Hk 16, Hv 32, d 128)", 16, 32, 128};
const Shape kD64{"d64 (Hk 2, Hv 4, d 64)", 2, 4, 64};

TEST_F(CudaDeltaNet, ChunkedMatchesCpu27B) {
  for (DeltaRuleMode mode : {DeltaRuleMode::Chunked, DeltaRuleMode::Auto}) check_against_cpu(*gpu_, rng_, k27B, mode);
}
TEST_F(CudaDeltaNet, ChunkedMatchesCpu35B) {
  for (DeltaRuleMode mode : {DeltaRuleMode::Chunked, DeltaRuleMode::Auto}) check_against_cpu(*gpu_, rng_, k35B, mode);
}
TEST_F(CudaDeltaNet, ChunkedMatchesCpuHeadDim64) {
  for (DeltaRuleMode mode : {DeltaRuleMode::Chunked, DeltaRuleMode::Auto}) check_against_cpu(*gpu_, rng_, kD64, mode);
}

// The split form (prepare, state scan, output: the fallback where the fused form's shared
// memory does not fit, or QWEN36_DELTA_CHUNKED=split); every other test takes the default.
TEST_F(CudaDeltaNet, SplitFormMatchesCpu) {
  cuda::delta_rule_chunked_form(1);
  for (const Shape* s : {&k27B, &kD64}) check_against_cpu(*gpu_, rng_, *s, DeltaRuleMode::Chunked);
  cuda::delta_rule_chunked_form(0);
}

// Segments: a 10 MB workspace holds 2 chunks of the 27B's fused records (4.4 MB each) or 1 of
// the split form's (6.2 MB), so the default batches (14 and 9 chunks) run in many launches
// that start and end inside runs, the state carried between them in the state tensor.
TEST_F(CudaDeltaNet, ChunkedInSegments) {
  cuda::delta_rule_chunked_workspace(size_t(10) << 20);
  for (int form : {2, 1}) {
    cuda::delta_rule_chunked_form(form);
    check_against_cpu(*gpu_, rng_, k27B, DeltaRuleMode::Chunked);
  }
  cuda::delta_rule_chunked_form(0);
  cuda::delta_rule_chunked_workspace(0);
}

// A serving batch: 40 runs, mostly one-token decode steps, with prefills among them (the
// chunked kernels locate their chunks by scanning the run table 32 runs at a time).
TEST_F(CudaDeltaNet, MixedBatchOfManyRuns) {
  std::vector<SeqRun> runs;
  int32_t begin = 0;
  for (int32_t i = 0; i < 40; ++i) {
    const int32_t count = i == 5 ? 70 : i == 33 ? 130 : i == 38 ? 64 : i == 39 ? 3 : 1;
    runs.push_back({i, 0, begin, count});
    begin += count;
  }
  for (DeltaRuleMode mode : {DeltaRuleMode::Chunked, DeltaRuleMode::Auto}) {
    check_against_cpu(*gpu_, rng_, kD64, mode, {runs}, 41);
    check_against_cpu(*gpu_, rng_, k35B, mode, {runs}, 41);
  }
}

// Milliseconds per call of one run over all of `in`'s tokens (mean of `reps` after one warm-up).
double time_ms(Backend& gpu, const Inputs& in, DevT& dst, DeltaRuleMode mode, int reps) {
  const int64_t T = in.q.t.dim(0);
  const std::vector<SeqRun> runs{{0, 0, 0, int32_t(T)}};
  DevT dout = upload(gpu, HostT(DType::F32, {T, in.v.t.dim(1), in.v.t.dim(2)}));
  DevT dq = upload(gpu, in.q), dk = upload(gpu, in.k), dv = upload(gpu, in.v), dg = upload(gpu, in.g),
       db = upload(gpu, in.beta);
  gpu.gated_delta_rule(dq.t, dk.t, dv.t, dg.t, db.t, dst.t, runs, dout.t, mode);
  cuda_synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) gpu.gated_delta_rule(dq.t, dk.t, dv.t, dg.t, db.t, dst.t, runs, dout.t, mode);
  cuda_synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
}

TEST_F(CudaDeltaNet, Timing27BPrefill4096) {
  const Shape& s = k27B;
  const int64_t T = 4096;
  const Inputs in = random_inputs(rng_, T, s);
  const HostT st0 = random_t(rng_, DType::F32, {1, s.Hv, s.d, s.d}, -0.5f, 0.5f);
  const std::vector<SeqRun> runs{{0, 0, 0, int32_t(T)}};
  // correctness over 64 chunks: chunked vs the recurrent kernel from the same state
  DevT st_c = upload(*gpu_, st0), st_r = upload(*gpu_, st0);
  DevT out_c = upload(*gpu_, HostT(DType::F32, {T, s.Hv, s.d})), out_r = upload(*gpu_, HostT(DType::F32, {T, s.Hv, s.d}));
  run_gpu(*gpu_, in, st_c, runs, DeltaRuleMode::Chunked, out_c);
  run_gpu(*gpu_, in, st_r, runs, DeltaRuleMode::Recurrent, out_r);
  const std::vector<float> oc = download(*gpu_, out_c.t), orr = download(*gpu_, out_r.t);
  const std::vector<float> st_r_host = download(*gpu_, st_r.t);
  const Worst wo = worst_of(oc, orr), ws = worst_of(download(*gpu_, st_c.t), st_r_host);
  EXPECT_LE(wo.err, 1e-4) << "4096 tokens: chunked vs recurrent output at " << out_where(wo.at, runs, s.Hv, s.d)
                          << ": " << wo.got << " vs " << wo.want;
  EXPECT_LE(ws.err, 1e-4) << "4096 tokens: chunked vs recurrent state at " << state_where(ws.at, s.Hv, s.d) << ": "
                          << ws.got << " vs " << ws.want;

  const double chunked = time_ms(*gpu_, in, st_c, DeltaRuleMode::Chunked, 10);
  const double recurrent = time_ms(*gpu_, in, st_r, DeltaRuleMode::Recurrent, 2);
  std::printf(
      "[ deltanet ] 27B shape, one 4096-token run: chunked %.3f ms/layer (x48 layers = %.1f ms), recurrent %.3f "
      "ms/layer; chunked vs recurrent err out %.2e state %.2e\n",
      chunked, chunked * 48, recurrent, wo.err, ws.err);
  for (int form : {2, 1}) {  // per kernel, each form (the fused form's output is in its scan)
    const char* fname = form == 2 ? "fused" : "split";
    cuda::delta_rule_chunked_form(form);
    DevT st_f = upload(*gpu_, st0), out_f = upload(*gpu_, HostT(DType::F32, {T, s.Hv, s.d}));
    run_gpu(*gpu_, in, st_f, runs, DeltaRuleMode::Chunked, out_f);
    const Worst fo = worst_of(download(*gpu_, out_f.t), orr), fs = worst_of(download(*gpu_, st_f.t), st_r_host);
    EXPECT_LE(fo.err, 1e-4) << fname << ", 4096 tokens: vs recurrent output at " << out_where(fo.at, runs, s.Hv, s.d)
                            << ": " << fo.got << " vs " << fo.want;
    EXPECT_LE(fs.err, 1e-4) << fname << ", 4096 tokens: vs recurrent state at " << state_where(fs.at, s.Hv, s.d)
                            << ": " << fs.got << " vs " << fs.want;
    const double plain = time_ms(*gpu_, in, st_f, DeltaRuleMode::Chunked, 10);
    cuda::delta_rule_chunked_timing(true);
    const double timed = time_ms(*gpu_, in, st_f, DeltaRuleMode::Chunked, 10);
    float ms[3] = {0, 0, 0};
    int calls = 0;
    cuda::delta_rule_chunked_times(ms, &calls);
    cuda::delta_rule_chunked_timing(false);
    if (calls > 0)
      std::printf("[ deltanet ] 27B shape, 4096 tokens, %s form: %.3f ms/layer; per call: prepare %.3f ms, state scan "
                  "%.3f ms, output %.3f ms (%.3f ms per call with the timing syncs); vs recurrent err out %.2e state "
                  "%.2e\n",
                  fname, plain, ms[0] / calls, ms[1] / calls, ms[2] / calls, timed, fo.err, fs.err);
  }
  cuda::delta_rule_chunked_form(0);
  for (int64_t n : {8, 16, 32, 64, 128, 256}) {  // where Auto should switch (kAutoChunkedMin)
    const Inputs small = random_inputs(rng_, n, s);
    const double c = time_ms(*gpu_, small, st_c, DeltaRuleMode::Chunked, 20);
    const double r = time_ms(*gpu_, small, st_r, DeltaRuleMode::Recurrent, 20);
    std::printf("[ deltanet ] 27B shape, one %lld-token run: chunked %.3f ms, recurrent %.3f ms\n", (long long)n, c, r);
  }
}

// ---- conv1d prefill (cuda_conv1d.cu: halo kernel + chunk kernel, in place or split) ----

// Runs over several 64-token chunks and on chunk boundaries, a run shorter than K−1 (its new
// state keeps old entries), kernel widths 2, 4 and 8, C not a multiple of the 128-thread
// block; slot 2 is never used and must come back unchanged. Outputs at 1e-6 (f32 in the CPU
// twin's order on both sides; only expf in the SiLU differs, ≲ 1e-7), the state exactly (copies).
TEST_F(CudaDeltaNet, ConvPrefillMatchesCpu) {
  const int64_t slots = 5;
  // the last step's runs are decode-sized: the per-channel kernel (and the split op's copies)
  const std::vector<std::vector<SeqRun>> steps{{{3, 0, 0, 130}, {0, 0, 130, 2}, {4, 0, 132, 64}},
                                               {{0, 2, 0, 200}, {3, 130, 200, 65}, {1, 0, 265, 9}},
                                               {{0, 202, 0, 3}, {3, 195, 3, 5}}};
  // C = 302: one channel a thread; the split op's first two blocks 64 wide (whole float4s) or 62
  for (const auto& [K, C] : {std::pair<int64_t, int64_t>{2, 300}, {4, 300}, {8, 300}, {4, 302}}) {
    const int64_t wq = C % 4 == 0 ? 64 : 62, widths[3] = {wq, wq, C - 2 * wq};
    const HostT w = random_t(rng_, DType::F32, {C, K}, -0.5f, 0.5f);
    HostT st = random_t(rng_, DType::F32, {slots, C, K - 1});
    DevT dw = upload(*gpu_, w), dst = upload(*gpu_, st), dst_split = upload(*gpu_, st);
    for (size_t step = 0; step < steps.size(); ++step) {
      const std::vector<SeqRun>& runs = steps[step];
      int64_t T = 0;
      for (const SeqRun& r : runs) T += r.count;
      HostT x = random_t(rng_, DType::F32, {T, C}, -2.0f, 2.0f);
      DevT dx = upload(*gpu_, x), dx_split = upload(*gpu_, x);
      std::array<DevT, 3> parts{upload(*gpu_, HostT(DType::F32, {T, widths[0]})),
                                upload(*gpu_, HostT(DType::F32, {T, widths[1]})),
                                upload(*gpu_, HostT(DType::F32, {T, widths[2]}))};
      cpu::causal_conv1d_silu(x.t, w.t, st.t, runs);
      gpu_->causal_conv1d_silu(dx.t, dw.t, dst.t, runs);
      gpu_->causal_conv1d_silu_split(dx_split.t, dw.t, dst_split.t, runs, parts[0].t, parts[1].t, parts[2].t);
      const Worst wo = worst_of(download(*gpu_, dx.t), x.floats());
      const Worst ws = worst_of(download(*gpu_, dst.t), st.floats());
      std::printf("[ deltanet ] conv1d prefill K %lld C %lld step %zu: out err %.2e, state err %.2e\n", (long long)K,
                  (long long)C, step, wo.err, ws.err);
      EXPECT_LE(wo.err, 1e-6) << "K " << K << " step " << step << ": output row " << wo.at / C << ", channel "
                              << wo.at % C << ": got " << wo.got << ", want " << wo.want;
      EXPECT_EQ(ws.err, 0.0) << "K " << K << " step " << step << ": state slot " << ws.at / (C * (K - 1))
                             << ", channel " << ws.at / (K - 1) % C << ", entry " << ws.at % (K - 1) << ": got "
                             << ws.got << ", want " << ws.want;
      // the split op: each block of the CPU's output columns, and the same state
      const std::vector<float> all = x.floats();
      for (size_t p = 0, col = 0; p < 3; col += size_t(widths[p++])) {
        std::vector<float> want;
        for (int64_t t = 0; t < T; ++t)
          want.insert(want.end(), all.begin() + t * C + int64_t(col), all.begin() + t * C + int64_t(col) + widths[p]);
        const Worst wp = worst_of(download(*gpu_, parts[p].t), want);
        EXPECT_LE(wp.err, 1e-6) << "split, K " << K << " C " << C << " step " << step << " block " << p << ": row "
                                << wp.at / widths[p] << ", column " << wp.at % widths[p];
      }
      EXPECT_EQ(worst_of(download(*gpu_, dst_split.t), st.floats()).err, 0.0) << "split, K " << K << " step " << step;
    }
  }
}

// One 4096-token run of the 27B's conv (10240 channels, K 4), in place (the input drifts
// between calls; only the time matters). Memory floor: x read and written once, ~336 MB.
TEST_F(CudaDeltaNet, TimingConvPrefill4096) {
  const int64_t T = 4096, C = 10240, K = 4;
  DevT dx = upload(*gpu_, random_t(rng_, DType::F32, {T, C}, -2.0f, 2.0f));
  DevT dw = upload(*gpu_, random_t(rng_, DType::F32, {C, K}, -0.5f, 0.5f));
  DevT dst = upload(*gpu_, random_t(rng_, DType::F32, {1, C, K - 1}));
  const std::vector<SeqRun> runs{{0, 0, 0, int32_t(T)}};
  gpu_->causal_conv1d_silu(dx.t, dw.t, dst.t, runs);
  cuda_synchronize();
  const int reps = 20;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) gpu_->causal_conv1d_silu(dx.t, dw.t, dst.t, runs);
  cuda_synchronize();
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
  std::printf("[ deltanet ] conv1d prefill, 4096 tokens x 10240 channels (K 4): %.1f us/layer (%.0f GB/s for x "
              "read + written once)\n",
              us, 2.0 * double(T * C) * 4 / (us * 1e3));
}

// ---- fused decode ----

// Decode steps of one-token runs in the given slots (steps[i]: step i's slots in batch order),
// GPU deltanet_decode vs the CPU backend's composition; record: each step is recorded into a
// graph (the batch tables set first, as decode_step does) and replayed. repeats > 1: each step
// runs (is replayed) that many times on the same inputs, mixed uploaded again before each (it
// is scratch to the op), the CPU stepping as often: the state kernel's arrival counters must
// start every launch at zero, the recorded one's replays included.
void check_decode(Backend& gpu, std::mt19937& rng, const DecodeShape& s,
                  const std::vector<std::vector<int32_t>>& steps, int64_t slots, bool record, int repeats = 1) {
  auto cpu = make_cpu_backend(1);
  const int64_t C = 2 * s.Hk * s.dk + s.Hv * s.dv;
  const DecodeWeights w(gpu, rng, s);
  HostT conv = random_t(rng, DType::F32, {slots, C, kConvK - 1});
  HostT st = random_t(rng, DType::F32, {slots, s.Hv, s.dk, s.dv}, -0.5f, 0.5f);
  DevT dconv = upload(gpu, conv), dst = upload(gpu, st);
  for (size_t step = 0; step < steps.size(); ++step) {
    const int64_t T = int64_t(steps[step].size());
    std::vector<SeqRun> runs;
    for (int64_t i = 0; i < T; ++i) runs.push_back({steps[step][size_t(i)], int32_t(step), int32_t(i), 1});
    HostT mixed = random_t(rng, DType::F32, {T, C}), z = random_t(rng, DType::F32, {T, s.Hv, s.dv});
    HostT a = random_t(rng, DType::F32, {T, s.Hv}, -3.0f, 3.0f), b = random_t(rng, DType::F32, {T, s.Hv}, -3.0f, 3.0f);
    DevT dm = upload(gpu, mixed), dz = upload(gpu, z), da = upload(gpu, a), db = upload(gpu, b);
    DevT dout = upload(gpu, HostT(DType::F32, {T, s.Hv, s.dv}));
    HostT want(DType::F32, {T, s.Hv, s.dv});
    for (int rep = 0; rep < repeats; ++rep) {
      HostT m = mixed;  // the CPU composition convolves mixed in place
      cpu->deltanet_decode(m.t, z.t, a.t, b.t, w.host(), kEps, conv.t, st.t, runs, want.t);
    }
    const DeltaNetWeights dw = w.dev();
    const uint64_t key = 0xdec0de00u + step;
    if (record) {
      const std::vector<int32_t> tokens(size_t(T), 0);
      gpu.set_batch(tokens, runs, {});
      if (!gpu.begin_capture()) GTEST_SKIP() << "the backend does not record (QWEN36_PROFILE set?)";
      gpu.deltanet_decode(dm.t, dz.t, da.t, db.t, dw, kEps, dconv.t, dst.t, runs, dout.t);
      ASSERT_TRUE(gpu.end_capture(key, true)) << s.name << ": the decode op could not be recorded";
    }
    for (int rep = 0; rep < repeats; ++rep) {
      if (rep > 0) gpu.copy_from_host(mixed.t.data, dm.t);
      if (record)
        ASSERT_TRUE(gpu.replay(key));
      else
        gpu.deltanet_decode(dm.t, dz.t, da.t, db.t, dw, kEps, dconv.t, dst.t, runs, dout.t);
    }
    const Worst wo = worst_of(download(gpu, dout.t), want.floats());
    const Worst ws = worst_of(download(gpu, dst.t), st.floats());
    const Worst wc = worst_of(download(gpu, dconv.t), conv.floats());
    std::printf("[ deltanet ] decode %s%s step %zu (%lld runs, x%d): out err %.2e, state err %.2e, conv state err "
                "%.2e\n",
                s.name, record ? " recorded" : "", step, (long long)T, repeats, wo.err, ws.err, wc.err);
    EXPECT_LE(wo.err, 1e-4) << s.name << " step " << step << ": output at " << out_where(wo.at, runs, s.Hv, s.dv)
                            << ": got " << wo.got << ", want " << wo.want;
    EXPECT_LE(ws.err, 1e-4) << s.name << " step " << step << ": state at slot " << int64_t(ws.at) / (s.Hv * s.dk * s.dv)
                            << ", head " << int64_t(ws.at) / (s.dk * s.dv) % s.Hv << ", row "
                            << int64_t(ws.at) / s.dv % s.dk << ", col " << int64_t(ws.at) % s.dv << ": got " << ws.got
                            << ", want " << ws.want;
    EXPECT_EQ(wc.err, 0.0) << s.name << " step " << step << ": conv state at slot "
                           << int64_t(wc.at) / (C * (kConvK - 1)) << ", channel " << int64_t(wc.at) / (kConvK - 1) % C
                           << ": got " << wc.got << ", want " << wc.want;
  }
}

const DecodeShape kDecDv48{"dv48 (Hk 2, Hv 4, dk 64, dv 48: composed)", 2, 4, 64, 48};
// batches of 4, 1 and 5 runs in shuffled slots; slot 6 is never used and must stay as it was
const std::vector<std::vector<int32_t>> kDecodeSteps{{3, 0, 5, 1}, {2}, {1, 5, 0, 3, 2}};

// On an H100 / H200 (132 SMs) the steps take each fused form as a model's would before a dense
// out projection (the test weights' empty out_proj is f32): a block per slice where those blocks
// fit one wave (35B 1 run, d64), a block per head where heads do (27B 1 run, 35B 4), the prep and
// state kernels beyond (27B 4 and 5 runs, 35B 5); dv48 the composition.
TEST_F(CudaDeltaNet, FusedDecodeMatchesCpu) {
  for (const DecodeShape* s : {&kDec27B, &kDec35B, &kDecD64, &kDecDv48})
    check_decode(*gpu_, rng_, *s, kDecodeSteps, 7, false);
}

TEST_F(CudaDeltaNet, FusedDecodeRecorded) {
  for (const DecodeShape* s : {&kDec27B, &kDecD64}) check_decode(*gpu_, rng_, *s, kDecodeSteps, 7, true);
}

// Each recording replayed three times (and the direct op run three times): the per-head
// arrival counters start every launch, every replay, at zero.
TEST_F(CudaDeltaNet, FusedDecodeRepeated) {
  for (bool record : {false, true}) check_decode(*gpu_, rng_, kDec35B, kDecodeSteps, 7, record, 3);
}

// Batches whose blocks are far from all resident at once (12 heads × 2 slices a token, 3 value
// heads per key head): 600 and 1100 tokens, run directly and recorded, twice each.
TEST_F(CudaDeltaNet, FusedDecodeLargeBatches) {
  const DecodeShape shape{"batches (Hk 4, Hv 12, dk 16, dv 64)", 4, 12, 16, 64};
  const int64_t slots = 1200;
  std::vector<int32_t> order(static_cast<size_t>(slots));
  for (int32_t i = 0; i < int32_t(slots); ++i) order[size_t(i)] = i;
  std::shuffle(order.begin(), order.end(), rng_);
  // 1150.. never used: those slots must stay as they were
  const std::vector<std::vector<int32_t>> steps{std::vector<int32_t>(order.begin(), order.begin() + 600),
                                                std::vector<int32_t>(order.begin() + 50, order.begin() + 1150)};
  for (bool record : {false, true}) check_decode(*gpu_, rng_, shape, steps, slots, record, 2);
}

// The decode step's forms forced in turn (where a form's shapes do not allow it, the two
// kernels run): a block per 32-column slice in clusters of a key head's slices (27B: 12 blocks,
// a non-portable size), a block per value head, the prep and state kernels. Each against the
// CPU as above, on every shape and batch, run directly and recorded.
TEST_F(CudaDeltaNet, FusedDecodeEachForm) {
  struct Restore {
    ~Restore() { cuda::deltanet_decode_select(nullptr); }
  } restore;
  const DecodeShape d16{"d16 (Hk 4, Hv 12, dk 16, dv 64)", 4, 12, 16, 64};
  for (const char* form : {"slice", "head", "two"}) {
    std::printf("[ deltanet ] decode form %s\n", form);
    cuda::deltanet_decode_select(form);
    for (const DecodeShape* s : {&kDec27B, &kDec35B, &kDecD64, &d16}) check_decode(*gpu_, rng_, *s, kDecodeSteps, 7, false);
    check_decode(*gpu_, rng_, kDec27B, kDecodeSteps, 7, true);
  }
}

// The forms do the same float operations in the same order: one step's outputs, recurrent
// states and conv states are bit for bit the same from each.
TEST_F(CudaDeltaNet, FusedDecodeFormsAreBitwiseEqual) {
  struct Restore {
    ~Restore() { cuda::deltanet_decode_select(nullptr); }
  } restore;
  const DecodeShape d16{"d16 (Hk 4, Hv 12, dk 16, dv 64)", 4, 12, 16, 64};
  for (const DecodeShape* s : {&kDec27B, &kDec35B, &kDecD64, &d16}) {
    const int64_t C = 2 * s->Hk * s->dk + s->Hv * s->dv, slots = 5;
    const DecodeWeights w(*gpu_, rng_, *s);
    const DeltaNetWeights dw = w.dev();
    const std::vector<SeqRun> runs{{3, 0, 0, 1}, {0, 0, 1, 1}, {4, 0, 2, 1}};
    const int64_t T = int64_t(runs.size());
    const HostT conv = random_t(rng_, DType::F32, {slots, C, kConvK - 1});
    const HostT st = random_t(rng_, DType::F32, {slots, s->Hv, s->dk, s->dv}, -0.5f, 0.5f);
    const HostT mixed = random_t(rng_, DType::F32, {T, C}), z = random_t(rng_, DType::F32, {T, s->Hv, s->dv});
    const HostT a = random_t(rng_, DType::F32, {T, s->Hv}, -3.0f, 3.0f), b = random_t(rng_, DType::F32, {T, s->Hv}, -3.0f, 3.0f);
    DevT dz = upload(*gpu_, z), da = upload(*gpu_, a), db = upload(*gpu_, b);
    std::vector<float> first[3];
    for (const char* form : {"two", "head", "slice"}) {
      cuda::deltanet_decode_select(form);
      DevT dconv = upload(*gpu_, conv), dst = upload(*gpu_, st), dm = upload(*gpu_, mixed);
      DevT dout = upload(*gpu_, HostT(DType::F32, {T, s->Hv, s->dv}));
      gpu_->deltanet_decode(dm.t, dz.t, da.t, db.t, dw, kEps, dconv.t, dst.t, runs, dout.t);
      const std::vector<float> got[3] = {download(*gpu_, dout.t), download(*gpu_, dst.t), download(*gpu_, dconv.t)};
      for (int k = 0; k < 3; ++k) {
        if (first[k].empty()) {
          first[k] = got[k];
          continue;
        }
        size_t differ = 0;
        for (size_t e = 0; e < got[k].size(); ++e) differ += got[k][e] != first[k][e];
        static const char* kWhat[] = {"outputs", "recurrent state", "conv state"};
        std::printf("[ deltanet ] decode %s, form %s: %zu of %zu %s differ from the two kernels'\n", s->name, form,
                    differ, got[k].size(), kWhat[k]);
        EXPECT_EQ(differ, 0u) << s->name << ", form " << form << ": " << kWhat[k];
      }
    }
  }
}

// Microseconds per replay of a recording of one decode-step DeltaNet layer (T one-token runs):
// the fused op, or (composed) the default composition of the plain CUDA ops.
double decode_us(Backend& gpu, std::mt19937& rng, const DecodeShape& s, int64_t T, bool composed) {
  const int64_t C = 2 * s.Hk * s.dk + s.Hv * s.dv;
  const DecodeWeights w(gpu, rng, s);
  DevT dconv = upload(gpu, random_t(rng, DType::F32, {T, C, kConvK - 1}));
  DevT dst = upload(gpu, random_t(rng, DType::F32, {T, s.Hv, s.dk, s.dv}, -0.5f, 0.5f));
  DevT dm = upload(gpu, random_t(rng, DType::F32, {T, C}));
  DevT dz = upload(gpu, random_t(rng, DType::F32, {T, s.Hv, s.dv}));
  DevT da = upload(gpu, random_t(rng, DType::F32, {T, s.Hv})), db = upload(gpu, random_t(rng, DType::F32, {T, s.Hv}));
  DevT dout = upload(gpu, HostT(DType::F32, {T, s.Hv, s.dv}));
  std::vector<SeqRun> runs;
  for (int32_t i = 0; i < int32_t(T); ++i) runs.push_back({i, 0, i, 1});
  const std::vector<int32_t> tokens(size_t(T), 0);
  gpu.set_batch(tokens, runs, {});
  const DeltaNetWeights dw = w.dev();
  if (!gpu.begin_capture()) return -1;
  if (composed)
    gpu.Backend::deltanet_decode(dm.t, dz.t, da.t, db.t, dw, kEps, dconv.t, dst.t, runs, dout.t);
  else
    gpu.deltanet_decode(dm.t, dz.t, da.t, db.t, dw, kEps, dconv.t, dst.t, runs, dout.t);
  const uint64_t key = 0x71de0000u + uint64_t(T) * 2 + (composed ? 1 : 0);
  if (!gpu.end_capture(key, true)) return -1;
  for (int i = 0; i < 20; ++i) gpu.replay(key);
  cuda_synchronize();
  const int reps = 500;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) gpu.replay(key);
  cuda_synchronize();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
}

TEST_F(CudaDeltaNet, TimingDecodeStep) {
  struct Restore {
    ~Restore() { cuda::deltanet_decode_select(nullptr); }
  } restore;
  for (const DecodeShape* s : {&kDec27B, &kDec35B})
    for (int64_t T : {1, 4, 8, 32}) {
      double us[3];
      for (int f = 0; f < 3; ++f) {
        cuda::deltanet_decode_select(f == 0 ? "slice" : f == 1 ? "head" : "two");
        us[f] = decode_us(*gpu_, rng_, *s, T, false);
      }
      cuda::deltanet_decode_select(nullptr);
      const double composed = decode_us(*gpu_, rng_, *s, T, true);
      std::printf("[ deltanet ] decode %s, %lld runs: fused per slice %.1f, per head %.1f, two kernels %.1f, composed "
                  "ops %.1f us/layer (graph replays, back to back)\n",
                  s->name, (long long)T, us[0], us[1], us[2], composed);
    }
}

// ---- read-only ops (speculative verify) ----

TEST_F(CudaDeltaNet, ReadonlyOpsMatchCpuAndLeaveStateAlone) {
  {  // conv: runs of 1, 3, 9 (the plain op takes its prefill kernel) and 5 tokens in shuffled slots
    const int64_t C = 300, slots = 5;
    const std::vector<SeqRun> runs{{2, 4, 0, 1}, {0, 7, 1, 3}, {4, 0, 4, 9}, {1, 2, 13, 5}};
    const int64_t T = 18;
    HostT x = random_t(rng_, DType::F32, {T, C}), w = random_t(rng_, DType::F32, {C, kConvK}, -0.5f, 0.5f);
    const HostT st = random_t(rng_, DType::F32, {slots, C, kConvK - 1});
    DevT dx = upload(*gpu_, x), dw = upload(*gpu_, w), dst = upload(*gpu_, st);
    DevT dxp = upload(*gpu_, x), dstp = upload(*gpu_, st);
    gpu_->causal_conv1d_silu_readonly(dx.t, dw.t, dst.t, runs);
    gpu_->causal_conv1d_silu(dxp.t, dw.t, dstp.t, runs);
    HostT want = x;
    cpu::causal_conv1d_silu_readonly(want.t, w.t, st.t, runs);
    const std::vector<float> got = download(*gpu_, dx.t);
    const Worst wo = worst_of(got, want.floats()), wp = worst_of(got, download(*gpu_, dxp.t));
    std::printf("[ deltanet ] conv1d read-only: vs CPU err %.2e, vs the GPU plain op err %.2e\n", wo.err, wp.err);
    // f32 in the same order on both sides; only expf in the SiLU differs (≲ 1e-7 relative)
    EXPECT_LE(wo.err, 1e-5) << "conv1d read-only vs CPU at row " << wo.at / C << ", channel " << wo.at % C;
    // the same arithmetic in the same order as the plain kernels (per channel; prefill for the 9-token run)
    EXPECT_LE(wp.err, 1e-6) << "conv1d read-only vs the plain op at row " << wp.at / C << ", channel " << wp.at % C;
    EXPECT_EQ(download(*gpu_, dst.t), st.floats()) << "conv1d read-only wrote its state";
  }
  {  // delta rule: runs of 1, 4 and 70 tokens (70 would be chunked in the plain op's Auto mode)
    const Shape s{"Hk 2, Hv 6, d 128", 2, 6, 128};
    const int64_t slots = 4;
    const std::vector<SeqRun> runs{{3, 0, 0, 1}, {0, 5, 1, 4}, {2, 9, 5, 70}};
    const int64_t T = 75;
    const Inputs in = random_inputs(rng_, T, s);
    const HostT st = random_t(rng_, DType::F32, {slots, s.Hv, s.d, s.d}, -0.5f, 0.5f);
    HostT want(DType::F32, {T, s.Hv, s.d});
    cpu::gated_delta_rule_readonly(in.q.t, in.k.t, in.v.t, in.g.t, in.beta.t, st.t, runs, want.t);
    DevT dq = upload(*gpu_, in.q), dk = upload(*gpu_, in.k), dv = upload(*gpu_, in.v), dg = upload(*gpu_, in.g),
         db = upload(*gpu_, in.beta), dst = upload(*gpu_, st), dstp = upload(*gpu_, st);
    DevT dout = upload(*gpu_, HostT(DType::F32, {T, s.Hv, s.d}));
    DevT doutp = upload(*gpu_, HostT(DType::F32, {T, s.Hv, s.d}));
    gpu_->gated_delta_rule_readonly(dq.t, dk.t, dv.t, dg.t, db.t, dst.t, runs, dout.t);
    gpu_->gated_delta_rule(dq.t, dk.t, dv.t, dg.t, db.t, dstp.t, runs, doutp.t, DeltaRuleMode::Recurrent);
    const std::vector<float> got = download(*gpu_, dout.t);
    const Worst wo = worst_of(got, want.floats()), wp = worst_of(got, download(*gpu_, doutp.t));
    std::printf("[ deltanet ] delta rule read-only: vs CPU err %.2e, vs the GPU plain op err %.2e\n", wo.err, wp.err);
    EXPECT_LE(wo.err, 1e-4) << "delta rule read-only vs CPU at " << out_where(wo.at, runs, s.Hv, s.d) << ": got "
                            << wo.got << ", want " << wo.want;
    EXPECT_EQ(wp.err, 0.0) << "delta rule read-only vs the plain recurrent kernel (the same kernel) at "
                           << out_where(wp.at, runs, s.Hv, s.d);
    EXPECT_EQ(download(*gpu_, dst.t), st.floats()) << "delta rule read-only wrote its state";
  }
}


// ---- a bf16 recurrent state (--state-type bf16, model/state.h) ----

// A state of bf16-representable values, as f32 and as bf16.
struct States {
  HostT f32, bf16;
};
States bf16_states(std::mt19937& rng, std::initializer_list<int64_t> shape) {
  States st{random_t(rng, DType::F32, shape, -0.5f, 0.5f), HostT(DType::BF16, shape)};
  for (int64_t i = 0; i < st.f32.t.numel(); ++i) {
    st.bf16.t.as<uint16_t>()[i] = f32_to_bf16(st.f32.t.as<float>()[i]);
    st.f32.t.as<float>()[i] = bf16_to_f32(st.bf16.t.as<uint16_t>()[i]);
  }
  return st;
}
std::vector<uint16_t> download_bits(Backend& gpu, const Tensor& t) {
  std::vector<uint16_t> v(size_t(t.numel()));
  gpu.copy_to_host(t, v.data());
  return v;
}
std::vector<uint16_t> rounded(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
  return b;
}

// One call is the f32 op on the widened state with the state rounded at its end, bit for bit:
// the chunked kernels (runs of 70 and 130 tokens, one launch) and the fused decode step (4
// runs); the kernels only widen the loads and round the stores.
TEST_F(CudaDeltaNet, Bf16StateOneCallIsTheF32OpRounded) {
  const Shape& s = k27B;
  const std::vector<SeqRun> runs{{2, 0, 0, 70}, {0, 9, 70, 130}};
  const int64_t T = 200, slots = 3;
  const Inputs in = random_inputs(rng_, T, s);
  const States st = bf16_states(rng_, {slots, s.Hv, s.d, s.d});
  DevT d32 = upload(*gpu_, st.f32), d16 = upload(*gpu_, st.bf16);
  DevT o32 = upload(*gpu_, HostT(DType::F32, {T, s.Hv, s.d})), o16 = upload(*gpu_, HostT(DType::F32, {T, s.Hv, s.d}));
  run_gpu(*gpu_, in, d32, runs, DeltaRuleMode::Chunked, o32);
  run_gpu(*gpu_, in, d16, runs, DeltaRuleMode::Chunked, o16);
  EXPECT_EQ(download(*gpu_, o16.t), download(*gpu_, o32.t)) << "chunked: outputs";
  EXPECT_EQ(download_bits(*gpu_, d16.t), rounded(download(*gpu_, d32.t))) << "chunked: the stored state";

  const DecodeShape& ds = kDec27B;
  const int64_t C = 2 * ds.Hk * ds.dk + ds.Hv * ds.dv, n = 4;
  const DecodeWeights w(*gpu_, rng_, ds);
  const States dst = bf16_states(rng_, {5, ds.Hv, ds.dk, ds.dv});
  const HostT conv = random_t(rng_, DType::F32, {5, C, kConvK - 1});
  std::vector<SeqRun> dr;
  for (int32_t i = 0; i < n; ++i) dr.push_back({4 - i, 7, i, 1});
  const HostT mixed = random_t(rng_, DType::F32, {n, C}), z = random_t(rng_, DType::F32, {n, ds.Hv, ds.dv});
  const HostT a = random_t(rng_, DType::F32, {n, ds.Hv}, -3.0f, 3.0f), b = random_t(rng_, DType::F32, {n, ds.Hv}, -3.0f, 3.0f);
  std::vector<float> outs[2];
  std::vector<float> st32;
  std::vector<uint16_t> st16;
  for (int k = 0; k < 2; ++k) {
    DevT dm = upload(*gpu_, mixed), dz = upload(*gpu_, z), da = upload(*gpu_, a), db = upload(*gpu_, b);
    DevT dc = upload(*gpu_, conv), ds_ = upload(*gpu_, k ? dst.bf16 : dst.f32);
    DevT dout = upload(*gpu_, HostT(DType::F32, {n, ds.Hv, ds.dv}));
    gpu_->deltanet_decode(dm.t, dz.t, da.t, db.t, w.dev(), kEps, dc.t, ds_.t, dr, dout.t);
    outs[k] = download(*gpu_, dout.t);
    if (k)
      st16 = download_bits(*gpu_, ds_.t);
    else
      st32 = download(*gpu_, ds_.t);
  }
  EXPECT_EQ(outs[1], outs[0]) << "decode: outputs";
  EXPECT_EQ(st16, rounded(st32)) << "decode: the stored state";
}

// Several tokens in the recurrent form (a speculative verify or commit) against the CPU twin,
// which rounds the state after every token as the kernel does: the state within the f32 bound
// (1e-4 absolute: the two sum in different orders, which for a value near zero is many bf16
// steps) plus one bf16 step (an f32 value a hair either side of a rounding midpoint may round
// the other way; values off at all, 1 in ~100 allowed), outputs within 1e-3 (a state value one step off moves a later token's output by
// 2^-8 · |s| · |q̂_i| ≈ 2e-4 here). The read-only op: the same outputs, the state untouched.
TEST_F(CudaDeltaNet, Bf16StateRecurrentMatchesCpu) {
  const Shape s{"Hk 2, Hv 6, d 128", 2, 6, 128};
  const std::vector<SeqRun> runs{{1, 0, 0, 5}, {0, 3, 5, 1}, {2, 8, 6, 7}};
  const int64_t T = 13, slots = 3;
  const Inputs in = random_inputs(rng_, T, s);
  States st = bf16_states(rng_, {slots, s.Hv, s.d, s.d});
  const std::vector<uint16_t> st0(st.bf16.t.as<const uint16_t>(), st.bf16.t.as<const uint16_t>() + st.bf16.t.numel());
  DevT dst = upload(*gpu_, st.bf16), dro = upload(*gpu_, st.bf16);
  HostT want(DType::F32, {T, s.Hv, s.d});
  cpu::gated_delta_rule(in.q.t, in.k.t, in.v.t, in.g.t, in.beta.t, st.bf16.t, runs, want.t, DeltaRuleMode::Recurrent);
  DevT dout = upload(*gpu_, HostT(DType::F32, {T, s.Hv, s.d})), dro_out = upload(*gpu_, HostT(DType::F32, {T, s.Hv, s.d}));
  run_gpu(*gpu_, in, dst, runs, DeltaRuleMode::Recurrent, dout);
  DevT dq = upload(*gpu_, in.q), dk = upload(*gpu_, in.k), dv = upload(*gpu_, in.v), dg = upload(*gpu_, in.g),
       db = upload(*gpu_, in.beta);
  gpu_->gated_delta_rule_readonly(dq.t, dk.t, dv.t, dg.t, db.t, dro.t, runs, dro_out.t);
  const std::vector<float> got = download(*gpu_, dout.t);
  const Worst wo = worst_of(got, want.floats());
  EXPECT_LE(wo.err, 1e-3) << "output at " << out_where(wo.at, runs, s.Hv, s.d) << ": got " << wo.got << ", want "
                          << wo.want;
  EXPECT_EQ(download(*gpu_, dro_out.t), got) << "read-only outputs";
  EXPECT_EQ(download_bits(*gpu_, dro.t), st0) << "the read-only op wrote its state";
  const std::vector<uint16_t> gs = download_bits(*gpu_, dst.t);
  int64_t far = 0, off = 0;
  for (size_t i = 0; i < gs.size(); ++i) {
    const float g = bf16_to_f32(gs[i]), w = bf16_to_f32(st.bf16.t.as<const uint16_t>()[i]);
    off += g != w;
    far += std::fabs(g - w) > std::ldexp(std::fabs(w), -7) + 1e-4f;  // the f32 bound + one bf16 step
  }
  std::printf("[ deltanet ] bf16 state, recurrent: out err %.2e; %lld of %zu state values one bf16 step off\n", wo.err,
              (long long)off, gs.size());
  EXPECT_EQ(far, 0) << "state values beyond the f32 bound + one bf16 step from the CPU's";
  EXPECT_LE(off, int64_t(gs.size() / 100)) << "state values one bf16 step from the CPU's";
}

// DDTree verify's DeltaNet ops: a random tree of 23 tokens (and a chain, and a star) at rows 3..
// of a 30-row batch in slot 1, against the composition of chain ops over the leaves' root paths:
// the one-launch conv bit for bit; the delta rule (the fused decode kernels' 32-column slices,
// the composition's recurrent kernel sums in another order) within 1e-5 of the largest output;
// rows outside the run untouched, the states only read.
TEST_F(CudaDeltaNet, TreeReadonlyOpsAreTheComposition) {
  const int64_t T = 30, Hk = 2, Hv = 4, dk = 128, dv = 128, C = 2 * Hk * dk + Hv * dv, K = 4, slots = 2;
  const SeqRun run{1, 9, 3, 23};
  std::vector<std::vector<int32_t>> trees(3, std::vector<int32_t>(size_t(run.count), -1));
  for (int32_t i = 1; i < run.count; ++i) {
    trees[0][size_t(i)] = int32_t(rng_() % uint32_t(i));
    trees[1][size_t(i)] = i - 1;
    trees[2][size_t(i)] = 0;
  }
  const HostT q = random_t(rng_, DType::F32, {T, Hk, dk}), k = random_t(rng_, DType::F32, {T, Hk, dk}),
              v = random_t(rng_, DType::F32, {T, Hv, dv}), g = random_t(rng_, DType::F32, {T, Hv}, -1.0f, -0.01f),
              beta = random_t(rng_, DType::F32, {T, Hv}, 0.0f, 1.0f),
              state = random_t(rng_, DType::F32, {slots, Hv, dk, dv}, -0.5f, 0.5f),
              x = random_t(rng_, DType::F32, {T, C}), w = random_t(rng_, DType::F32, {C, K}),
              cs = random_t(rng_, DType::F32, {slots, C, K - 1}), out0 = random_t(rng_, DType::F32, {T, Hv, dv});
  const DevT dq = upload(*gpu_, q), dk_ = upload(*gpu_, k), dv_ = upload(*gpu_, v), dg = upload(*gpu_, g),
             db = upload(*gpu_, beta), ds = upload(*gpu_, state), dw = upload(*gpu_, w), dcs = upload(*gpu_, cs);
  for (size_t ti = 0; ti < trees.size(); ++ti) {
    const std::vector<int32_t>& parent = trees[ti];
    DevT xa = upload(*gpu_, x), xb = upload(*gpu_, x), oa = upload(*gpu_, out0), ob = upload(*gpu_, out0);
    gpu_->causal_conv1d_silu_tree_readonly(xa.t, dw.t, dcs.t, run, parent);
    gpu_->Backend::causal_conv1d_silu_tree_readonly(xb.t, dw.t, dcs.t, run, parent);
    EXPECT_EQ(download(*gpu_, xa.t), download(*gpu_, xb.t)) << "conv, tree " << ti;
    gpu_->gated_delta_rule_tree_readonly(dq.t, dk_.t, dv_.t, dg.t, db.t, ds.t, run, parent, oa.t);
    gpu_->Backend::gated_delta_rule_tree_readonly(dq.t, dk_.t, dv_.t, dg.t, db.t, ds.t, run, parent, ob.t);
    const std::vector<float> a = download(*gpu_, oa.t), b = download(*gpu_, ob.t);
    const Worst wd = worst_of(a, b);
    EXPECT_LE(wd.err, 1e-5) << "delta rule, tree " << ti << ": got " << wd.got << ", want " << wd.want;
    const size_t per = size_t(Hv * dv);
    const std::vector<float> before = out0.floats();
    for (size_t r = 0; r < size_t(T); ++r) {  // rows outside the run keep what was there
      if (r >= size_t(run.begin) && r < size_t(run.begin + run.count)) continue;
      EXPECT_TRUE(std::equal(a.begin() + long(r * per), a.begin() + long((r + 1) * per), before.begin() + long(r * per)))
          << "row " << r;
    }
  }
  EXPECT_EQ(download(*gpu_, ds.t), state.floats());
  EXPECT_EQ(download(*gpu_, dcs.t), cs.floats());
  std::vector<int32_t> bad = trees[1];
  bad[5] = 7;  // a parent after its child: refused before anything runs
  DevT xo = upload(*gpu_, x), oo = upload(*gpu_, out0);
  EXPECT_THROW(gpu_->causal_conv1d_silu_tree_readonly(xo.t, dw.t, dcs.t, run, bad), Error);
  EXPECT_THROW(gpu_->gated_delta_rule_tree_readonly(dq.t, dk_.t, dv_.t, dg.t, db.t, ds.t, run, bad, oo.t), Error);
  EXPECT_EQ(download(*gpu_, xo.t), x.floats());
}

}  // namespace
}  // namespace qwen36::gputest
