// CUDA attention (cuda_attention.cu: KV append, decode kernel with context splits;
// cuda_flash_attention.cu: tensor-core prefill) against cpu::attention, f32 and bf16 caches.
//
// Tolerances, relative to the output scale max(1, max |reference|) (|v| ≤ 1 here):
//  - decode kernel (runs of < 16 tokens, split or not): f32 arithmetic on the same cached
//    values the CPU reads (bf16 caches hold the same rounded values on both sides) → 2e-5.
//  - flash kernel (runs of ≥ 16 tokens, or any run when G > 8): Q and P rounded to bf16, and
//    K, V too from an f32 cache (relative 2^-9 each). A score error of δ changes a softmax
//    weight by a factor e^δ; δ stays below ~0.01 for these score magnitudes (|s| ~ 1), and the
//    output moves by at most that times the weighted mean of |v − o| (≤ 1) → 1e-2.
//  - caches after append: bit-exact (f32 copies; bf16 round-to-nearest-even on both sides).
// Timings (one 27B-shape 4096-token prefill layer, one decode step at 32K) are printed only.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <tuple>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "gpu_test_util.h"

namespace qwen36::gputest {
namespace {

class CudaAttention : public CudaTest {};

constexpr double kDecodeTol = 2e-5, kFlashTol = 1e-2;

// Mirrors the dispatch of cuda::attention (kFlashMinTokens, kMaxGroup, flash head dims).
bool takes_flash(int64_t hd, int64_t G, int32_t count) {
  return (hd == 64 || hd == 128 || hd == 256) && (count >= 16 || G > 8);
}

// Per token: worst |got − want| over the output scale against that token's tolerance; the
// first failing tokens are reported with their worst element.
void expect_tokens_close(const std::vector<float>& got, const std::vector<float>& want, int64_t H, int64_t hd,
                         const std::vector<double>& tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  double scale = 1;
  for (float w : want) scale = std::max(scale, double(std::abs(w)));
  const int64_t per = H * hd;
  int bad = 0;
  double worst_all = 0;
  for (size_t t = 0; t < tol.size(); ++t) {
    double worst = -1;
    int64_t at = 0;
    for (int64_t i = 0; i < per; ++i) {
      const size_t k = t * size_t(per) + size_t(i);
      double d = std::abs(double(got[k]) - double(want[k]));
      if (std::isnan(d)) d = 1e30;
      if (d > worst) worst = d, at = i;
    }
    worst_all = std::max(worst_all, worst / scale);
    if (worst / scale > tol[t] && bad++ < 4) {
      const size_t k = t * size_t(per) + size_t(at);
      ADD_FAILURE() << what << ": token " << t << " head " << at / hd << " dim " << at % hd << " got " << got[k]
                    << " want " << want[k] << ", rel err " << worst / scale << " > " << tol[t];
    }
  }
  if (bad) ADD_FAILURE() << what << ": " << bad << " of " << tol.size() << " tokens out of tolerance (worst "
                         << worst_all << ")";
}

std::vector<uint8_t> download_bytes(Backend& gpu, const Tensor& t) {
  std::vector<uint8_t> b(t.nbytes());
  gpu.copy_to_host(t, b.data());
  return b;
}

// Host and device K/V caches that stay in step: every call runs the CPU and the GPU op.
struct Rig {
  int64_t H, KVH, hd, slots, cap;
  DType kv;
  HostT kc, vc;
  DevT dkc, dvc;
  Rig(Backend& gpu, std::mt19937& rng, int64_t H_, int64_t KVH_, int64_t hd_, int64_t slots_, int64_t cap_, DType kv_,
      bool random_cache)
      : H(H_), KVH(KVH_), hd(hd_), slots(slots_), cap(cap_), kv(kv_) {
    if (random_cache) {
      kc = random_t(rng, kv, {slots, cap, KVH, hd}, -2, 2);
      vc = random_t(rng, kv, {slots, cap, KVH, hd});
    } else {
      kc = HostT(kv, {slots, cap, KVH, hd});
      vc = HostT(kv, {slots, cap, KVH, hd});
    }
    dkc = upload(gpu, kc);
    dvc = upload(gpu, vc);
  }
  std::string name() const {
    std::ostringstream o;
    o << dtype_name(kv) << " cache H=" << H << " KVH=" << KVH << " hd=" << hd;
    return o.str();
  }
  void step(Backend& gpu, std::mt19937& rng, const std::vector<SeqRun>& runs, const std::string& what) {
    int64_t T = 0;
    for (const SeqRun& r : runs) T = std::max<int64_t>(T, r.begin + r.count);
    HostT q = random_t(rng, DType::F32, {T, H, hd}, -2, 2), k = random_t(rng, DType::F32, {T, KVH, hd}, -2, 2),
          v = random_t(rng, DType::F32, {T, KVH, hd});
    const float scale = 1.0f / std::sqrt(float(hd));
    HostT want(DType::F32, {T, H, hd});
    cpu::attention(q.t, k.t, v.t, kc.t, vc.t, runs, scale, want.t);
    DevT dq = upload(gpu, q), dk = upload(gpu, k), dv = upload(gpu, v), o = upload(gpu, HostT(DType::F32, {T, H, hd}));
    gpu.attention(dq.t, dk.t, dv.t, dkc.t, dvc.t, runs, scale, o.t);
    std::vector<double> tol(size_t(T), kDecodeTol);
    for (const SeqRun& r : runs)
      for (int32_t j = 0; j < r.count; ++j)
        tol[size_t(r.begin + j)] = takes_flash(hd, H / KVH, r.count) ? kFlashTol : kDecodeTol;
    const std::string label = name() + ", " + what;
    expect_tokens_close(download(gpu, o.t), want.floats(), H, hd, tol, label);
    check_caches(gpu, label);
  }
  void check_caches(Backend& gpu, const std::string& label) {
    for (auto [h, d, nm] : {std::tuple{&kc, &dkc, "k"}, std::tuple{&vc, &dvc, "v"}}) {
      const std::vector<uint8_t> got = download_bytes(gpu, d->t);
      if (got == h->bytes) continue;
      const size_t es = kv == DType::BF16 ? 2 : 4;
      size_t i = 0;
      while (i < got.size() && got[i] == h->bytes[i]) ++i;
      ADD_FAILURE() << label << ": " << nm << " cache differs from the CPU's first at element " << i / es
                    << " (slot " << i / es / size_t(cap * KVH * hd) << ", position "
                    << i / es / size_t(KVH * hd) % size_t(cap) << ")";
    }
  }
};

// Fresh prefills of 1, 17, 100, 300 tokens, a 40-token chunk continuing at pos0 = count
// (attends to the cached prefix), then a decode token; GQA groups 6 (27B) and 8 (35B), hd 256.
TEST_F(CudaAttention, PrefillLengthsThenContinuation) {
  for (DType kv : {DType::F32, DType::BF16})
    for (auto [H, KVH] : {std::pair<int64_t, int64_t>{6, 1}, {8, 1}}) {
      Rig rig(*gpu_, rng_, H, KVH, 256, 2, 400, kv, false);
      for (int32_t n : {1, 17, 100, 300}) {
        const std::string tag = "prefill " + std::to_string(n);
        rig.step(*gpu_, rng_, {{1, 0, 0, n}}, tag);
        rig.step(*gpu_, rng_, {{1, n, 0, 40}}, tag + " + chunk of 40 at pos0 " + std::to_string(n));
        rig.step(*gpu_, rng_, {{1, n + 40, 0, 1}}, tag + " + 40 + decode");
      }
    }
}

// Several runs in one batch on different slots; a batch mixing a flash run with a decode
// token (the decode kernel then takes a token list); every flash head dim; G = 12 (> 8: the
// flash kernel takes even single tokens); hd 16 (no flash: the decode kernel takes all).
TEST_F(CudaAttention, SeveralRunsMixedPathsHeadDims) {
  struct Shape {
    int64_t H, KVH, hd;
  };
  const std::vector<std::vector<SeqRun>> steps{
      {{2, 0, 0, 37}, {0, 0, 37, 20}},  // two prefills, slots 2 and 0
      {{0, 20, 0, 1}, {2, 37, 1, 50}},  // decode of slot 0 + chunk of slot 2 in one batch
      {{0, 21, 0, 1}, {2, 87, 1, 1}},   // decode only
      {{1, 0, 0, 3}, {0, 22, 3, 16}},   // a short prefill (decode kernel) + a 16-token chunk
  };
  for (DType kv : {DType::F32, DType::BF16})
    for (Shape s : {Shape{4, 2, 64}, Shape{4, 2, 128}, Shape{12, 1, 64}, Shape{4, 1, 16}, Shape{6, 2, 256}}) {
      Rig rig(*gpu_, rng_, s.H, s.KVH, s.hd, 3, 100, kv, false);
      for (size_t i = 0; i < steps.size(); ++i) rig.step(*gpu_, rng_, steps[i], "step " + std::to_string(i));
    }
}

// Decode at long contexts through the split path (capacity > 1024): positions 5000, 3000 and
// 10 (most splits empty) in one batch, and one token alone; caches filled at random.
TEST_F(CudaAttention, LongContextDecodeSplits) {
  for (DType kv : {DType::F32, DType::BF16})
    for (auto [H, KVH] : {std::pair<int64_t, int64_t>{6, 1}, {16, 2}}) {
      Rig rig(*gpu_, rng_, H, KVH, 256, 3, 5120, kv, true);
      rig.step(*gpu_, rng_, {{0, 5000, 0, 1}, {1, 3000, 1, 1}, {2, 10, 2, 1}}, "decode at 5000, 3000, 10");
      rig.step(*gpu_, rng_, {{2, 5119, 0, 1}}, "decode at 5119 alone");
      rig.step(*gpu_, rng_, {{1, 3001, 0, 20}}, "flash chunk at 3001");
    }
}

// The decode path recorded once into a CUDA graph and replayed with other positions (the
// split ranges come from the device position table, not from the recording).
TEST_F(CudaAttention, DecodeGraphReplaysAtNewPositions) {
  for (DType kv : {DType::F32, DType::BF16}) {
    const int64_t H = 6, KVH = 1, hd = 256, T = 2;
    Rig rig(*gpu_, rng_, H, KVH, hd, 2, 4096, kv, true);
    DevT dq = upload(*gpu_, HostT(DType::F32, {T, H, hd})), dk = upload(*gpu_, HostT(DType::F32, {T, KVH, hd})),
         dv = upload(*gpu_, HostT(DType::F32, {T, KVH, hd})), o = upload(*gpu_, HostT(DType::F32, {T, H, hd}));
    const std::vector<int32_t> tokens(size_t(T), 0);
    const float scale = 1.0f / std::sqrt(float(hd));
    const std::vector<std::vector<SeqRun>> steps{{{0, 3000, 0, 1}, {1, 17, 1, 1}},
                                                 {{0, 3001, 0, 1}, {1, 18, 1, 1}},
                                                 {{0, 4090, 0, 1}, {1, 700, 1, 1}}};
    for (size_t i = 0; i < steps.size(); ++i) {
      const std::vector<SeqRun>& runs = steps[i];
      HostT q = random_t(rng_, DType::F32, {T, H, hd}, -2, 2), k = random_t(rng_, DType::F32, {T, KVH, hd}, -2, 2),
            v = random_t(rng_, DType::F32, {T, KVH, hd});
      gpu_->copy_from_host(q.t.data, dq.t);
      gpu_->copy_from_host(k.t.data, dk.t);
      gpu_->copy_from_host(v.t.data, dv.t);
      HostT want(DType::F32, {T, H, hd});
      cpu::attention(q.t, k.t, v.t, rig.kc.t, rig.vc.t, runs, scale, want.t);
      gpu_->set_batch(tokens, runs, {});
      if (i == 0) {
        ASSERT_TRUE(gpu_->begin_capture());
        gpu_->attention(dq.t, dk.t, dv.t, rig.dkc.t, rig.dvc.t, runs, scale, o.t);
        ASSERT_TRUE(gpu_->end_capture(77, true)) << "attention could not be recorded into a graph";
      }
      ASSERT_TRUE(gpu_->replay(77));
      const std::string label = rig.name() + ", graph replay " + std::to_string(i);
      expect_tokens_close(download(*gpu_, o.t), want.floats(), H, hd, std::vector<double>(size_t(T), kDecodeTol),
                          label);
      rig.check_caches(*gpu_, label);
    }
  }
}

// Printed, not asserted: one 27B attention layer's prefill of 4096 tokens (H 24, KVH 4,
// hd 256) and one decode step at a 32K context. Spot-checks the prefill's last token and the
// decode step against the CPU.
TEST_F(CudaAttention, Timing27BPrefill4096AndDecode32K) {
  const int64_t H = 24, KVH = 4, hd = 256;
  const float scale = 1.0f / 16;
  for (DType kv : {DType::BF16, DType::F32}) {
    const int64_t T = 4096;
    HostT q = random_t(rng_, DType::F32, {T, H, hd}, -2, 2), k = random_t(rng_, DType::F32, {T, KVH, hd}, -2, 2),
          v = random_t(rng_, DType::F32, {T, KVH, hd});
    DevT dq = upload(*gpu_, q), dk = upload(*gpu_, k), dv = upload(*gpu_, v), o = upload(*gpu_, HostT(DType::F32, {T, H, hd}));
    DevT dkc = upload(*gpu_, HostT(kv, {1, T, KVH, hd})), dvc = upload(*gpu_, HostT(kv, {1, T, KVH, hd}));
    const std::vector<SeqRun> runs{{0, 0, 0, int32_t(T)}};
    gpu_->attention(dq.t, dk.t, dv.t, dkc.t, dvc.t, runs, scale, o.t);
    const int reps = 5;
    cuda_synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) gpu_->attention(dq.t, dk.t, dv.t, dkc.t, dvc.t, runs, scale, o.t);
    cuda_synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    const double flops = 2.0 * double(T) * double(T + 1) * double(H) * double(hd);  // causal QKᵀ + PV
    std::printf("[ attention ] prefill 4096 tokens H=24 KVH=4 hd=256, %s cache: %.3f ms, %.0f TFLOP/s\n",
                std::string(dtype_name(kv)).c_str(), s * 1e3, flops / s / 1e12);
    // The last token against the CPU over the GPU's own cache (its row already appended).
    HostT kc(kv, {1, T, KVH, hd}), vc(kv, {1, T, KVH, hd});
    gpu_->copy_to_host(dkc.t, kc.bytes.data());
    gpu_->copy_to_host(dvc.t, vc.bytes.data());
    HostT q1(DType::F32, {1, H, hd}), k1(DType::F32, {1, KVH, hd}), v1(DType::F32, {1, KVH, hd});
    std::memcpy(q1.bytes.data(), q.f() + (T - 1) * H * hd, q1.bytes.size());
    std::memcpy(k1.bytes.data(), k.f() + (T - 1) * KVH * hd, k1.bytes.size());
    std::memcpy(v1.bytes.data(), v.f() + (T - 1) * KVH * hd, v1.bytes.size());
    HostT want(DType::F32, {1, H, hd});
    const std::vector<SeqRun> last{{0, int32_t(T - 1), 0, 1}};
    cpu::attention(q1.t, k1.t, v1.t, kc.t, vc.t, last, scale, want.t);
    const std::vector<float> all = download(*gpu_, o.t);
    expect_tokens_close(std::vector<float>(all.end() - H * hd, all.end()), want.floats(), H, hd, {kFlashTol},
                        "prefill 4096, last token");
  }
  for (DType kv : {DType::BF16, DType::F32}) {
    const int64_t cap = 32768;
    Rig rig(*gpu_, rng_, H, KVH, hd, 1, cap, kv, true);
    HostT q = random_t(rng_, DType::F32, {1, H, hd}, -2, 2), k = random_t(rng_, DType::F32, {1, KVH, hd}, -2, 2),
          v = random_t(rng_, DType::F32, {1, KVH, hd});
    DevT dq = upload(*gpu_, q), dk = upload(*gpu_, k), dv = upload(*gpu_, v), o = upload(*gpu_, HostT(DType::F32, {1, H, hd}));
    const std::vector<SeqRun> runs{{0, int32_t(cap - 1), 0, 1}};
    gpu_->attention(dq.t, dk.t, dv.t, rig.dkc.t, rig.dvc.t, runs, scale, o.t);
    const int reps = 20;
    cuda_synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) gpu_->attention(dq.t, dk.t, dv.t, rig.dkc.t, rig.dvc.t, runs, scale, o.t);
    cuda_synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    const double bytes = 2.0 * double(cap * KVH * hd) * (kv == DType::BF16 ? 2 : 4);
    std::printf("[ attention ] decode 1 token at 32768 positions H=24 KVH=4 hd=256, %s cache: %.1f us, %.0f GB/s of K+V\n",
                std::string(dtype_name(kv)).c_str(), s * 1e6, bytes / s / 1e9);
    HostT want(DType::F32, {1, H, hd});
    cpu::attention(q.t, k.t, v.t, rig.kc.t, rig.vc.t, runs, scale, want.t);
    expect_tokens_close(download(*gpu_, o.t), want.floats(), H, hd, {kDecodeTol}, rig.name() + ", decode at 32K");
  }
}

}  // namespace
}  // namespace qwen36::gputest
