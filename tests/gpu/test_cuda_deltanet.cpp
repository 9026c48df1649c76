// The CUDA gated delta rule (cuda_deltanet.cu dispatch; cuda_delta_chunked.cu, the chunked
// prefill form) against cpu::gated_delta_rule on random inputs: several runs of one batch
// in different slots, lengths around the chunk size (1, 63, 64, 65, 200, 300), nonzero
// initial state carried over two batches, the 27B (Hv/Hk = 3), 35B (Hv/Hk = 2) and dk = 64
// shapes, modes Chunked (every run chunked) and Auto (runs ≥ 64 chunked, the rest recurrent);
// a batch of 40 runs (decode steps mixed with prefills); outputs and the whole state tensor
// (one slot untouched) are compared.
//
// Tolerance 1e-4 of max(1, max |reference|) (outputs here are ≲ 1, so about 1e-4 absolute).
// Both sides compute in f32 with the same chunk boundaries; they differ in summation order
// and, on the GPU, in the tensor-core products, whose operands are split into two tf32
// parts (error ≤ ~2^-21 relative per product, accumulated in f32). The UT inverse of a chunk
// of random unit keys is well conditioned (|A_ij| ≤ β |k̂_i·k̂_j| ~ 0.1), and the decay
// (g ≤ 0) keeps state errors from growing over chunks, so errors of ~1e-6..1e-5 are
// expected; a wrong index, mask or padding row shows up as O(0.1..1). (With kMmaPasses = 1,
// plain tf32, errors reach ~1e-3 and this tolerance fails by design.)
// A timing test prints one 4096-token prefill layer of the 27B shape (chunked vs recurrent)
// and a crossover sweep for the Auto threshold; its only assertion is chunked ≈ recurrent.
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>

#include "backend/cpu/cpu_ops.h"
#include "gpu_test_util.h"

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
  const Worst wo = worst_of(oc, orr), ws = worst_of(download(*gpu_, st_c.t), download(*gpu_, st_r.t));
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
  for (int64_t n : {8, 16, 32, 64, 128, 256}) {  // where Auto should switch (kAutoChunkedMin)
    const Inputs small = random_inputs(rng_, n, s);
    const double c = time_ms(*gpu_, small, st_c, DeltaRuleMode::Chunked, 20);
    const double r = time_ms(*gpu_, small, st_r, DeltaRuleMode::Recurrent, 20);
    std::printf("[ deltanet ] 27B shape, one %lld-token run: chunked %.3f ms, recurrent %.3f ms\n", (long long)n, c, r);
  }
}

}  // namespace
}  // namespace qwen36::gputest
