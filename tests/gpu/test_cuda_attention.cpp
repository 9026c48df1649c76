// CUDA attention (cuda_attention.cu: KV append, CUDA-core decode kernel; cuda_attention_decode.cu:
// tensor-core decode; cuda_flash_attention.cu: tensor-core prefill) against cpu::attention,
// for every KV cache type: f32, bf16, fp8 e4m3, q8_0, q4_0 (formats: backend/kv_cache.h).
//
// Tolerances, relative to the output scale max(1, max |reference|) (|v| ≤ 1 here):
//  - caches after append: bit-exact for every type (bf16 round-to-nearest-even; fp8, q8_0,
//    q4_0: the GPU rotates and quantises with the same f32 operations in the same order as
//    kv_encode_row, so the bytes, scales included, must agree).
//  - CUDA-core decode kernel (f32 caches; bf16 with head dims other than 64/128/256): f32
//    arithmetic on the same cached values the CPU reads → 2e-5.
//  - tensor-core decode kernel (runs of < 16 tokens over bf16 and quantised caches, hd
//    64/128/256, G ≤ 8): both sides read the same values (bf16 tiles; f16 tiles equal to the
//    CPU's f16(d·q) / e4m3·2^e decode). q and the softmax weights enter the mma as E hi + lo
//    pairs, leaving a relative 2^-18 (bf16) / 2^-22 (f16) of each: a score moves by at most
//    scale·Σ|q·k|·2^-18 ≈ 16·4e-6 = 6e-5 for these inputs if every term erred the same way
//    (typically ~100× less), a weight by 2^-18 → 1e-4.
//  - flash kernel (runs of ≥ 16 tokens, or any run when G > 8): Q and P rounded to the tile
//    type (bf16, or f16 for quantised caches), and K, V too from an f32 cache (relative 2^-9
//    each). A score error of δ changes a softmax weight by a factor e^δ; δ stays below ~0.01
//    for these score magnitudes (|s| ~ 1), and the output moves by at most that times the
//    weighted mean of |v − o| (≤ 1) → 1e-2.
//  - quantised against f32 caches: the bounds of cpu_ops_test.cpp's
//    AttentionQuantizedCacheErrorAgainstF32Cache, measured there on the same data (the GPU
//    reads the same values, so its error against the f32 cache is the CPU's up to the above).
// Timings (27B shape: 4096-token prefill, decode steps at 32K and at 511 positions) are printed.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <tuple>

#include "backend/cpu/cpu_ops.h"
#include "backend/kv_cache.h"
#include "core/error.h"
#include "gpu_test_util.h"

namespace qwen36::cuda {
void attention_early_select(const char* mode);  // cuda_attention.cu: "on", "off" or null (the environment's)
}

namespace qwen36::gputest {
namespace {

class CudaAttention : public CudaTest {};

constexpr double kDecodeTol = 2e-5, kTcTol = 1e-4, kFlashTol = 1e-2;
const std::vector<DType> kAllTypes{DType::F32, DType::BF16, DType::F8_E4M3, DType::Q8_0, DType::Q4_0};

bool quantized(DType kv) { return kv_cache_quantized(kv); }
bool gpu_head_dim(int64_t hd) { return hd == 64 || hd == 128 || hd == 256; }
// Which kernel takes a run: mirrors the dispatch of cuda::attention (not in exact mode).
enum class Path { Flash, Tc, Core };
Path path_of(DType kv, int64_t hd, int64_t G, int32_t count) {
  const bool tc = kv != DType::F32 && gpu_head_dim(hd) && G <= 8;
  const bool core = !quantized(kv) && G <= 8 && hd <= 256;
  if (gpu_head_dim(hd) && (count >= 16 || !(tc || core))) return Path::Flash;
  return tc ? Path::Tc : Path::Core;
}
double tol_of(Path p) { return p == Path::Flash ? kFlashTol : p == Path::Tc ? kTcTol : kDecodeTol; }

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

// A cache buffer of any type: the tensor [slots, cap, KVH, hd] over kv_cache_bytes (the fp8
// scales follow the elements). Copies go through an f32 view of all the bytes.
HostT host_cache(DType kv, int64_t slots, int64_t cap, int64_t KVH, int64_t hd) {
  HostT h(kv, {slots, cap, KVH, hd});
  h.bytes.assign(kv_cache_bytes(kv, slots, cap, KVH, hd), 0);
  h.t.data = h.bytes.data();
  return h;
}
Tensor raw_view(void* p, size_t bytes) { return Tensor(p, DType::F32, {int64_t(bytes / 4)}); }
DevT upload_cache(Backend& gpu, const HostT& h) {
  DevT d;
  d.buf = gpu.alloc(h.bytes.size());
  d.t = h.t;
  d.t.data = d.buf->data();
  Tensor raw = raw_view(d.t.data, h.bytes.size());
  gpu.copy_from_host(h.bytes.data(), raw);
  return d;
}
std::vector<uint8_t> download_cache(Backend& gpu, const DevT& d, size_t bytes) {
  std::vector<uint8_t> b(bytes);
  gpu.copy_to_host(raw_view(d.t.data, bytes), b.data());
  return b;
}
// Every row of a cache encoded from random values (k ~ U(−2, 2) or v ~ U(−1, 1)); quantised
// caches: each row times 2^U(ex.first, ex.second) when that range is not empty (rows of
// different scales).
void fill_random(std::mt19937& rng, HostT& c, float lo, float hi, std::pair<float, float> ex = {0, 0}) {
  const DType kv = c.t.dtype;
  const int64_t slots = c.t.dim(0), cap = c.t.dim(1), KVH = c.t.dim(2), hd = c.t.dim(3);
  std::uniform_real_distribution<float> u(lo, hi);
  if (!quantized(kv)) {
    const HostT r = random_t(rng, kv, {slots, cap, KVH, hd}, lo, hi);
    std::memcpy(c.bytes.data(), r.bytes.data(), r.bytes.size());
    return;
  }
  const size_t rb = dtype_row_bytes(kv, hd), soff = kv_scale_offset(kv, slots, cap, KVH, hd);
  std::vector<float> x(static_cast<size_t>(hd)), tmp(x.size());
  float unused = 0;
  std::uniform_real_distribution<float> ue(ex.first, ex.second);
  for (int64_t i = 0; i < slots * cap * KVH; ++i) {
    const float mag = ex.first < ex.second ? std::exp2(ue(rng)) : 1.0f;
    for (float& e : x) e = u(rng) * mag;
    const int64_t slot = i / (cap * KVH), p = i / KVH % cap, h = i % KVH;
    float* sc = kv == DType::F8_E4M3 ? reinterpret_cast<float*>(c.bytes.data() + soff) + (slot * KVH + h) * cap + p
                                     : &unused;
    kv_encode_row(kv, x.data(), hd, c.bytes.data() + size_t(i) * rb, sc, tmp.data());
  }
}

// Host and device K/V caches that stay in step: every call runs the CPU and the GPU op.
struct Rig {
  int64_t H, KVH, hd, slots, cap;
  DType kv;
  HostT kc, vc;
  DevT dkc, dvc;
  Rig(Backend& gpu, std::mt19937& rng, int64_t H_, int64_t KVH_, int64_t hd_, int64_t slots_, int64_t cap_, DType kv_,
      bool random_cache, std::pair<float, float> kexp = {0, 0}, std::pair<float, float> vexp = {0, 0})
      : H(H_), KVH(KVH_), hd(hd_), slots(slots_), cap(cap_), kv(kv_) {
    kc = host_cache(kv, slots, cap, KVH, hd);
    vc = host_cache(kv, slots, cap, KVH, hd);
    if (random_cache) {
      fill_random(rng, kc, -2, 2, kexp);
      fill_random(rng, vc, -1, 1, vexp);
    }
    dkc = upload_cache(gpu, kc);
    dvc = upload_cache(gpu, vc);
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
      for (int32_t j = 0; j < r.count; ++j) tol[size_t(r.begin + j)] = tol_of(path_of(kv, hd, H / KVH, r.count));
    const std::string label = name() + ", " + what;
    expect_tokens_close(download(gpu, o.t), want.floats(), H, hd, tol, label);
    check_caches(gpu, label);
  }
  // A tree verify run (Backend::attention_tree) against the CPU backend's (the reference
  // composition of chain ops): every token's output and the caches' final layout.
  void tree_step(Backend& gpu, Backend& cpu_be, std::mt19937& rng, const SeqRun& run, std::span<const int32_t> parent,
                 const std::string& what) {
    const int64_t T = run.begin + run.count;
    HostT q = random_t(rng, DType::F32, {T, H, hd}, -2, 2), k = random_t(rng, DType::F32, {T, KVH, hd}, -2, 2),
          v = random_t(rng, DType::F32, {T, KVH, hd});
    const float scale = 1.0f / std::sqrt(float(hd));
    HostT want(DType::F32, {T, H, hd});
    cpu_be.attention_tree(q.t, k.t, v.t, kc.t, vc.t, run, parent, scale, want.t);
    DevT dq = upload(gpu, q), dk = upload(gpu, k), dv = upload(gpu, v), o = upload(gpu, HostT(DType::F32, {T, H, hd}));
    gpu.attention_tree(dq.t, dk.t, dv.t, dkc.t, dvc.t, run, parent, scale, o.t);
    std::vector<double> tol(size_t(T), kDecodeTol);
    for (int32_t j = 0; j < run.count; ++j) tol[size_t(run.begin + j)] = tol_of(path_of(kv, hd, H / KVH, 1));
    const std::string label = name() + ", " + what;
    std::vector<float> got = download(gpu, o.t), ref = want.floats();
    for (int64_t i = 0; i < run.begin * H * hd; ++i) got[size_t(i)] = ref[size_t(i)] = 0;  // rows outside the run
    expect_tokens_close(got, ref, H, hd, tol, label);
    check_caches(gpu, label);
  }
  void check_caches(Backend& gpu, const std::string& label) {
    const size_t rb = dtype_row_bytes(kv, hd), data = size_t(slots * cap * KVH) * rb;
    for (auto [h, d, nm] : {std::tuple{&kc, &dkc, "k"}, std::tuple{&vc, &dvc, "v"}}) {
      const std::vector<uint8_t> got = download_cache(gpu, *d, h->bytes.size());
      if (got == h->bytes) continue;
      size_t i = 0;
      while (i < got.size() && got[i] == h->bytes[i]) ++i;
      if (i < data) {
        const size_t r = i / rb;  // (slot, position, kv head) row
        ADD_FAILURE() << label << ": " << nm << " cache differs from the CPU's first at byte " << i % rb
                      << " of the row of slot " << r / size_t(cap * KVH) << ", position " << r / size_t(KVH) % size_t(cap)
                      << ", kv head " << r % size_t(KVH) << " (GPU " << int(got[i]) << ", CPU " << int(h->bytes[i]) << ")";
      } else {
        const size_t s = (i - data) / 4;  // fp8 scale [slot][kv head][position]
        ADD_FAILURE() << label << ": " << nm << " cache's fp8 scale of slot " << s / size_t(KVH * cap) << ", kv head "
                      << s / size_t(cap) % size_t(KVH) << ", position " << s % size_t(cap) << " differs from the CPU's";
      }
    }
  }
};

// Fresh prefills of 1, 17, 100, 300 tokens, a 40-token chunk continuing at pos0 = count
// (attends to the cached prefix), then a decode token; GQA groups 6 (27B) and 8 (35B), hd 256.
TEST_F(CudaAttention, PrefillLengthsThenContinuation) {
  for (DType kv : kAllTypes)
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
// token (the decode kernel then takes a token list, and q8_0/q4_0 rotate only the flash
// rows' outputs); every flash head dim; G = 12 (> 8: the flash kernel takes even single
// tokens); hd 16 (no flash, f32/bf16 only: the CUDA-core kernel takes all).
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
  for (DType kv : kAllTypes)
    for (Shape s : {Shape{4, 2, 64}, Shape{4, 2, 128}, Shape{12, 1, 64}, Shape{4, 1, 16}, Shape{6, 2, 256}}) {
      if (quantized(kv) && !gpu_head_dim(s.hd)) continue;
      Rig rig(*gpu_, rng_, s.H, s.KVH, s.hd, 3, 100, kv, false);
      for (size_t i = 0; i < steps.size(); ++i) rig.step(*gpu_, rng_, steps[i], "step " + std::to_string(i));
    }
}

// Decode at long contexts through the split path: positions 5000, 3000 and 10 (most splits
// empty) in one batch, and one token alone; caches filled at random; a 20-token flash chunk.
TEST_F(CudaAttention, LongContextDecodeSplits) {
  for (DType kv : kAllTypes)
    for (auto [H, KVH] : {std::pair<int64_t, int64_t>{6, 1}, {16, 2}}) {
      Rig rig(*gpu_, rng_, H, KVH, 256, 3, 5120, kv, true);
      rig.step(*gpu_, rng_, {{0, 5000, 0, 1}, {1, 3000, 1, 1}, {2, 10, 2, 1}}, "decode at 5000, 3000, 10");
      rig.step(*gpu_, rng_, {{2, 5119, 0, 1}}, "decode at 5119 alone");
      rig.step(*gpu_, rng_, {{1, 3001, 0, 20}}, "flash chunk at 3001");
    }
}

// Quantised caches whose rows differ in scale: K rows times 2^U(−9, 0), V rows 2^U(−9, 4)
// (fp8 row scales from the clamp 2^-15 up to 2^-4, q8_0/q4_0 block scales alike; K no larger
// than elsewhere, so the score magnitudes, which set the flash tolerance, stay as assumed).
// The decode kernel folds fp8 K row scales into the f32 scores and multiplies V per key, the
// flash kernel dequantises per row. Every head dim the tensor-core kernels take; decode
// through splits (two slots in one batch) and a flash chunk.
TEST_F(CudaAttention, QuantizedCachesRowScalesSpread) {
  for (DType kv : {DType::F8_E4M3, DType::Q8_0, DType::Q4_0})
    for (int64_t hd : {64, 128, 256}) {
      Rig rig(*gpu_, rng_, 6, 1, hd, 2, 3000, kv, true, {-9, 0}, {-9, 4});
      rig.step(*gpu_, rng_, {{0, 2999, 0, 1}, {1, 1500, 1, 1}}, "row scales spread, decode at 2999, 1500");
      rig.step(*gpu_, rng_, {{1, 2000, 0, 20}}, "row scales spread, flash chunk at 2000");
    }
}

// The decode path recorded once into a CUDA graph and replayed with other positions (the
// split ranges come from the device position table, not from the recording).
TEST_F(CudaAttention, DecodeGraphReplaysAtNewPositions) {
  for (DType kv : kAllTypes) {
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
      expect_tokens_close(download(*gpu_, o.t), want.floats(), H, hd,
                          std::vector<double>(size_t(T), tol_of(path_of(kv, hd, H / KVH, 1))), label);
      rig.check_caches(*gpu_, label);
    }
  }
}

// The tensor-core decode kernel reading early (QWEN36_ATTN_EARLY=on: q staged and the rows older
// than the call's appended ones requested before its griddep_wait) computes what it does waiting
// first: outputs and caches bit for bit, eager and replayed from a graph. q comes from an RMSNorm
// kernel right before the call (it lets the next kernel start at once); one-token runs at short
// and long (split) positions, and a verify-like run of 4 tokens.
TEST_F(CudaAttention, DecodeReadingEarlyIsBitwiseWaitingFirst) {
  struct Restore {
    ~Restore() { cuda::attention_early_select(nullptr); }
  } restore;
  const int64_t H = 16, KVH = 2, hd = 256, T = 4;
  const std::vector<std::vector<SeqRun>> steps{{{0, 63, 0, 1}, {1, 3000, 1, 1}, {2, 17, 2, 1}, {3, 700, 3, 1}},
                                               {{1, 3001, 0, 4}}};
  const DevT norm = upload(*gpu_, random_t(rng_, DType::F32, {hd}, 0.5f, 1.5f));
  for (DType kv : {DType::BF16, DType::F8_E4M3, DType::Q8_0, DType::Q4_0}) {
    const HostT kc0 = [&] { HostT c = host_cache(kv, 4, 4096, KVH, hd); fill_random(rng_, c, -2, 2); return c; }();
    const HostT vc0 = [&] { HostT c = host_cache(kv, 4, 4096, KVH, hd); fill_random(rng_, c, -1, 1); return c; }();
    for (size_t i = 0; i < steps.size(); ++i) {
      const std::vector<SeqRun>& runs = steps[i];
      const HostT q0 = random_t(rng_, DType::F32, {T, H, hd}, -2, 2), k = random_t(rng_, DType::F32, {T, KVH, hd}, -2, 2),
                  v = random_t(rng_, DType::F32, {T, KVH, hd});
      const float scale = 1.0f / std::sqrt(float(hd));
      std::vector<float> out[2];
      std::vector<uint8_t> caches[2][2];
      for (int early = 0; early < 2; ++early) {
        cuda::attention_early_select(early ? "on" : "off");
        for (int recorded = 0; recorded < 2; ++recorded) {
          DevT dkc = upload_cache(*gpu_, kc0), dvc = upload_cache(*gpu_, vc0);
          DevT dq0 = upload(*gpu_, q0), dq = upload(*gpu_, HostT(DType::F32, {T, H, hd})), dk = upload(*gpu_, k),
               dv = upload(*gpu_, v), o = upload(*gpu_, HostT(DType::F32, {T, H, hd}));
          Tensor q_rows(dq0.t.data, DType::F32, {T * H, hd}), qn_rows(dq.t.data, DType::F32, {T * H, hd});
          auto pass = [&] {
            gpu_->rms_norm(q_rows, norm.t, 1e-6f, qn_rows);  // q, by the kernel right before the call
            gpu_->attention(dq.t, dk.t, dv.t, dkc.t, dvc.t, runs, scale, o.t);
          };
          const std::string label = std::string(dtype_name(kv)) + ", step " + std::to_string(i) +
                                    (early ? ", early" : ", waiting first") + (recorded ? ", replayed" : ", eager");
          if (recorded) {
            const std::vector<int32_t> tokens(size_t(T), 0);
            gpu_->set_batch(tokens, runs, {});
            ASSERT_TRUE(gpu_->begin_capture());
            pass();
            ASSERT_TRUE(gpu_->end_capture(0xa77e0000u + uint64_t(i * 4 + early * 2), true)) << label;
            ASSERT_TRUE(gpu_->replay(0xa77e0000u + uint64_t(i * 4 + early * 2))) << label;
          } else {
            pass();
          }
          const std::vector<float> got = download(*gpu_, o.t);
          const std::vector<uint8_t> gk = download_cache(*gpu_, dkc, kc0.bytes.size()),
                                     gv = download_cache(*gpu_, dvc, vc0.bytes.size());
          if (early == 0 && recorded == 0) {
            out[0] = got, caches[0][0] = gk, caches[0][1] = gv;
            continue;
          }
          EXPECT_EQ(got, out[0]) << label << ": outputs differ from the eager call waiting first";
          EXPECT_TRUE(gk == caches[0][0] && gv == caches[0][1]) << label << ": caches differ";
        }
      }
    }
  }
}

// Quantised caches against an f32 cache on the GPU, 27B-like heads (hd 256, G 6): a
// 160-token prefill (flash kernel), then a decode step at 160 (tensor-core decode kernel).
// Printed; bounded as on the CPU (see the file header).
TEST_F(CudaAttention, QuantizedCachesErrorAgainstF32Cache) {
  const int64_t H = 6, KVH = 1, hd = 256, T = 160;
  const float scale = 1.0f / 16;
  HostT q = random_t(rng_, DType::F32, {T, H, hd}, -2, 2), k = random_t(rng_, DType::F32, {T, KVH, hd}, -2, 2),
        v = random_t(rng_, DType::F32, {T, KVH, hd});
  HostT q1 = random_t(rng_, DType::F32, {1, H, hd}, -2, 2), k1 = random_t(rng_, DType::F32, {1, KVH, hd}, -2, 2),
        v1 = random_t(rng_, DType::F32, {1, KVH, hd});
  DevT dq = upload(*gpu_, q), dk = upload(*gpu_, k), dv = upload(*gpu_, v);
  DevT dq1 = upload(*gpu_, q1), dk1 = upload(*gpu_, k1), dv1 = upload(*gpu_, v1);
  auto run = [&](DType kv) {
    DevT kc = upload_cache(*gpu_, host_cache(kv, 1, T + 1, KVH, hd)), vc = upload_cache(*gpu_, host_cache(kv, 1, T + 1, KVH, hd));
    DevT o = upload(*gpu_, HostT(DType::F32, {T, H, hd})), o1 = upload(*gpu_, HostT(DType::F32, {1, H, hd}));
    const std::vector<SeqRun> prefill{{0, 0, 0, int32_t(T)}}, decode{{0, int32_t(T), 0, 1}};
    gpu_->attention(dq.t, dk.t, dv.t, kc.t, vc.t, prefill, scale, o.t);
    gpu_->attention(dq1.t, dk1.t, dv1.t, kc.t, vc.t, decode, scale, o1.t);
    return std::pair{download(*gpu_, o.t), download(*gpu_, o1.t)};
  };
  const auto ref = run(DType::F32);
  struct Bound {
    DType t;
    double max, rms;
  };
  for (auto [kv, max_bound, rms_bound] : {Bound{DType::F8_E4M3, 0.1, 0.012}, Bound{DType::Q8_0, 0.02, 0.003},
                                          Bound{DType::Q4_0, 0.35, 0.045}}) {
    const auto got = run(kv);
    auto errs = [](const std::vector<float>& a, const std::vector<float>& b) {
      double worst = 0, rms = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        double d = std::abs(double(a[i]) - double(b[i]));
        if (std::isnan(d)) d = 1e30;
        worst = std::max(worst, d);
        rms += d * d;
      }
      return std::pair{worst, std::sqrt(rms / double(a.size()))};
    };
    const auto [pmax, prms] = errs(got.first, ref.first);
    const auto [dmax, drms] = errs(got.second, ref.second);
    std::printf("[ attention ] %s cache vs f32 cache: prefill 160 max %.5f rms %.5f; decode at 160 max %.5f rms %.5f\n",
                std::string(dtype_name(kv)).c_str(), pmax, prms, dmax, drms);
    EXPECT_LE(pmax, max_bound) << dtype_name(kv) << " prefill";
    EXPECT_LE(prms, rms_bound) << dtype_name(kv) << " prefill";
    EXPECT_LE(dmax, max_bound) << dtype_name(kv) << " decode";
    EXPECT_LE(drms, rms_bound) << dtype_name(kv) << " decode";
  }
}

// Mean time of one decode step replayed from a CUDA graph (as the model runs decode).
double graph_step_seconds(Backend& gpu, DevT& dq, DevT& dk, DevT& dv, Tensor& kc, Tensor& vc,
                          const std::vector<SeqRun>& runs, float scale, DevT& o, uint64_t key) {
  const std::vector<int32_t> tokens(1, 0);
  gpu.set_batch(tokens, runs, {});
  gpu.attention(dq.t, dk.t, dv.t, kc, vc, runs, scale, o.t);  // first sight: eager (sets kernel attributes)
  if (!gpu.begin_capture()) return NAN;
  gpu.attention(dq.t, dk.t, dv.t, kc, vc, runs, scale, o.t);
  if (!gpu.end_capture(key, true)) return NAN;
  gpu.replay(key);
  cuda_synchronize();
  const int reps = 50;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) gpu.replay(key);
  cuda_synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

// Printed, not asserted: one 27B attention layer's prefill of 4096 tokens (H 24, KVH 4,
// hd 256) per cache type, and decode steps (graph replays) at a 32K context per type, with
// the bytes of K and V read per step. Spot-checks against the CPU. Also a decode at 511
// positions (capacity 32768 and 1024) for bf16, and the same steps on the CUDA-core kernel
// (an exact-mode backend) for comparison.
// Tree verification in one pass (CudaBackend::attention_tree: the decode kernels with each
// token's ancestor mask) against the CPU's composition of chain ops, every cache type: random
// trees of 23 tokens (DDTree's budget 22 + the root) and of 64 (the mask's width) after
// contexts of 0, 127 and 700 positions (split decode; 127: a split can hold only tree rows
// that some token does not see), GQA 6 and 8, hd 256 and 128.
TEST_F(CudaAttention, TreeVerifyMatchesTheComposition) {
  auto cpu_be = make_cpu_backend(1);
  for (DType kv : kAllTypes)
    for (const auto& [H, KVH, hd] : {std::tuple<int64_t, int64_t, int64_t>{24, 4, 256}, {16, 2, 128}})
      for (int32_t pos0 : {0, 127, 700})
        for (int32_t n : {23, 64}) {
          Rig r(*gpu_, rng_, H, KVH, hd, 2, 800, kv, /*random_cache=*/true);
          std::vector<int32_t> parent(size_t(n), -1);
          for (int32_t i = 1; i < n; ++i) parent[size_t(i)] = int32_t(rng_() % uint32_t(i));
          const SeqRun run{1, pos0, 3, n};  // slot 1, rows 3 .. of the batch
          r.tree_step(*gpu_, *cpu_be, rng_, run, parent,
                      "tree of " + std::to_string(n) + " after " + std::to_string(pos0) + " positions");
        }
}

TEST_F(CudaAttention, Timing27BPrefill4096AndDecode32K) {
  const int64_t H = 24, KVH = 4, hd = 256;
  const float scale = 1.0f / 16;
  for (DType kv : kAllTypes) {
    const int64_t T = 4096;
    HostT q = random_t(rng_, DType::F32, {T, H, hd}, -2, 2), k = random_t(rng_, DType::F32, {T, KVH, hd}, -2, 2),
          v = random_t(rng_, DType::F32, {T, KVH, hd});
    DevT dq = upload(*gpu_, q), dk = upload(*gpu_, k), dv = upload(*gpu_, v), o = upload(*gpu_, HostT(DType::F32, {T, H, hd}));
    HostT kc = host_cache(kv, 1, T, KVH, hd), vc = host_cache(kv, 1, T, KVH, hd);
    DevT dkc = upload_cache(*gpu_, kc), dvc = upload_cache(*gpu_, vc);
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
    kc.bytes = download_cache(*gpu_, dkc, kc.bytes.size());
    vc.bytes = download_cache(*gpu_, dvc, vc.bytes.size());
    kc.t.data = kc.bytes.data();
    vc.t.data = vc.bytes.data();
    HostT q1(DType::F32, {1, H, hd}), k1(DType::F32, {1, KVH, hd}), v1(DType::F32, {1, KVH, hd});
    std::memcpy(q1.bytes.data(), q.f() + (T - 1) * H * hd, q1.bytes.size());
    std::memcpy(k1.bytes.data(), k.f() + (T - 1) * KVH * hd, k1.bytes.size());
    std::memcpy(v1.bytes.data(), v.f() + (T - 1) * KVH * hd, v1.bytes.size());
    HostT want(DType::F32, {1, H, hd});
    const std::vector<SeqRun> last{{0, int32_t(T - 1), 0, 1}};
    cpu::attention(q1.t, k1.t, v1.t, kc.t, vc.t, last, scale, want.t);
    const std::vector<float> all = download(*gpu_, o.t);
    expect_tokens_close(std::vector<float>(all.end() - H * hd, all.end()), want.floats(), H, hd, {kFlashTol},
                        std::string(dtype_name(kv)) + " prefill 4096, last token");
  }
  const std::unique_ptr<Backend> core = make_cuda_backend(CudaOptions{0, true});  // exact: CUDA-core decode kernel
  uint64_t key = 1000;
  for (DType kv : kAllTypes) {
    const int64_t cap = 32768;
    Rig rig(*gpu_, rng_, H, KVH, hd, 1, cap, kv, true);
    HostT q = random_t(rng_, DType::F32, {1, H, hd}, -2, 2), k = random_t(rng_, DType::F32, {1, KVH, hd}, -2, 2),
          v = random_t(rng_, DType::F32, {1, KVH, hd});
    DevT dq = upload(*gpu_, q), dk = upload(*gpu_, k), dv = upload(*gpu_, v), o = upload(*gpu_, HostT(DType::F32, {1, H, hd}));
    const std::vector<SeqRun> runs{{0, int32_t(cap - 1), 0, 1}};
    const double s = graph_step_seconds(*gpu_, dq, dk, dv, rig.dkc.t, rig.dvc.t, runs, scale, o, key++);
    const double bytes = 2.0 * double(kv_cache_bytes(kv, 1, cap, KVH, hd));
    std::printf("[ attention ] decode 1 token at 32768 positions H=24 KVH=4 hd=256, %s cache: %.1f us, %.0f GB/s of K+V\n",
                std::string(dtype_name(kv)).c_str(), s * 1e6, bytes / s / 1e9);
    HostT want(DType::F32, {1, H, hd});
    cpu::attention(q.t, k.t, v.t, rig.kc.t, rig.vc.t, runs, scale, want.t);
    expect_tokens_close(download(*gpu_, o.t), want.floats(), H, hd, {tol_of(path_of(kv, hd, H / KVH, 1))},
                        rig.name() + ", decode at 32K");
    if (kv == DType::BF16) {
      for (int64_t short_cap : {int64_t(32768), int64_t(1024)}) {
        Rig r2(*gpu_, rng_, H, KVH, hd, 1, short_cap, kv, true);
        const std::vector<SeqRun> at511{{0, 511, 0, 1}};
        const double ts = graph_step_seconds(*gpu_, dq, dk, dv, r2.dkc.t, r2.dvc.t, at511, scale, o, key++);
        DevT ck = upload_cache(*core, r2.kc), cv = upload_cache(*core, r2.vc);
        DevT cq = upload(*core, q), cdk = upload(*core, k), cdv = upload(*core, v), co = upload(*core, HostT(DType::F32, {1, H, hd}));
        const double tc = graph_step_seconds(*core, cq, cdk, cdv, ck.t, cv.t, at511, scale, co, key++);
        std::printf("[ attention ] decode 1 token at 512 positions (capacity %lld), bf16 cache: %.1f us "
                    "(CUDA-core kernel: %.1f us)\n", static_cast<long long>(short_cap), ts * 1e6, tc * 1e6);
      }
      DevT ck = upload_cache(*core, rig.kc), cv = upload_cache(*core, rig.vc);
      DevT cq = upload(*core, q), cdk = upload(*core, k), cdv = upload(*core, v), co = upload(*core, HostT(DType::F32, {1, H, hd}));
      const double tc = graph_step_seconds(*core, cq, cdk, cdv, ck.t, cv.t, runs, scale, co, key++);
      std::printf("[ attention ] decode 1 token at 32768 positions, bf16 cache, CUDA-core kernel: %.1f us\n", tc * 1e6);
    }
  }
}

}  // namespace
}  // namespace qwen36::gputest
