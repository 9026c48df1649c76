// Gated full attention on the GPU: KV append and causal GQA softmax attention over the
// per-slot f32 KV cache [slots, capacity, KVH, hd]. CPU twin: backend/cpu/cpu_attention.cpp.
//
// One block per (token, kv head) serves all H/KVH query heads of that group, so each K/V row
// is read once per group. Its 4 warps split the context positions; each warp keeps an online
// softmax (running max, sum, output) per query head, lanes own head_dim/32 dims each; the
// warps' partial results are merged at the end. Straightforward, not flash-tiled yet.
#include <cmath>

#include "backend/cuda/cuda_ops.cuh"

namespace qwen36::cuda {

namespace {

constexpr int kMaxGroup = 8;  // query heads per kv head
constexpr int kWarps = 4;

__global__ void kv_append_kernel(const float* k, const float* v, float* kc, float* vc, const int32_t* tslot,
                                 const int32_t* tpos, int64_t cap, int64_t row, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / row, c = i % row;
    const int32_t s = tslot[t];
    if (s < 0) continue;
    const int64_t dst = (int64_t(s) * cap + tpos[t]) * row + c;
    kc[dst] = k[i];
    vc[dst] = v[i];
  }
}

template <int NPL>
__global__ void __launch_bounds__(kWarps * 32)
    attention_kernel(const float* __restrict__ q, const float* __restrict__ kc, const float* __restrict__ vc,
                     const int32_t* tslot, const int32_t* tpos, float* __restrict__ out, int H, int KVH, int hd,
                     int64_t cap, float scale) {
  const int t = blockIdx.x, kvh = blockIdx.y, G = H / KVH;
  const int slot = tslot[t], pos = tpos[t];
  if (slot < 0) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  extern __shared__ float sm[];
  float* qs = sm;                   // [G, hd]
  float* part = sm + G * hd;        // per warp: [G] m, [G] l, [G, hd] acc
  const int part_stride = G * (hd + 2);
  for (int i = threadIdx.x; i < G * hd; i += blockDim.x)
    qs[i] = q[(int64_t(t) * H + int64_t(kvh) * G) * hd + i];
  __syncthreads();

  float qr[kMaxGroup][NPL], acc[kMaxGroup][NPL], m[kMaxGroup], l[kMaxGroup];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    m[g] = -INFINITY;
    l[g] = 0;
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
      const int d = lane + 32 * i;
      qr[g][i] = (g < G && d < hd) ? qs[g * hd + d] : 0.0f;
      acc[g][i] = 0;
    }
  }
  const int64_t row = int64_t(KVH) * hd;
  const float* kb = kc + int64_t(slot) * cap * row + int64_t(kvh) * hd;
  const float* vb = vc + int64_t(slot) * cap * row + int64_t(kvh) * hd;
  for (int p = warp; p <= pos; p += kWarps) {
    float kr[NPL], vr[NPL];
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
      const int d = lane + 32 * i;
      kr[i] = d < hd ? kb[int64_t(p) * row + d] : 0.0f;
      vr[i] = d < hd ? vb[int64_t(p) * row + d] : 0.0f;
    }
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g >= G) break;
      float s = 0;
#pragma unroll
      for (int i = 0; i < NPL; ++i) s += qr[g][i] * kr[i];
      s = warp_sum(s) * scale;
      const float mn = fmaxf(m[g], s);
      const float corr = expf(m[g] - mn), e = expf(s - mn);
      l[g] = l[g] * corr + e;
#pragma unroll
      for (int i = 0; i < NPL; ++i) acc[g][i] = acc[g][i] * corr + e * vr[i];
      m[g] = mn;
    }
  }
  float* mine = part + warp * part_stride;
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= G) break;
    if (lane == 0) {
      mine[g] = m[g];
      mine[G + g] = l[g];
    }
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) mine[2 * G + g * hd + d] = acc[g][i];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * hd; i += blockDim.x) {
    const int g = i / hd;
    float M = -INFINITY;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, part[w * part_stride + g]);
    float L = 0, O = 0;
    for (int w = 0; w < kWarps; ++w) {
      const float* pw = part + w * part_stride;
      const float f = pw[g] == -INFINITY ? 0.0f : expf(pw[g] - M);
      L += pw[G + g] * f;
      O += pw[2 * G + i] * f;
    }
    out[(int64_t(t) * H + int64_t(kvh) * G) * hd + i] = O / L;
  }
}

}  // namespace

void attention(Ctx& c, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache,
               std::span<const SeqRun> runs, float scale, Tensor& out) {
  QWEN36_CHECK(q.ndim == 3 && k.ndim == 3 && k_cache.ndim == 4, "attention: bad ranks q {} k {} cache {}",
               q.shape_str(), k.shape_str(), k_cache.shape_str());
  const int64_t T = q.dim(0), H = q.dim(1), hd = q.dim(2), KVH = k.dim(1);
  const int64_t slots = k_cache.dim(0), cap = k_cache.dim(1);
  QWEN36_CHECK(k_cache.dim(2) == KVH && k_cache.dim(3) == hd && H % KVH == 0, "attention: cache {} for k {}",
               k_cache.shape_str(), k.shape_str());
  QWEN36_CHECK(H / KVH <= kMaxGroup && hd <= 256, "attention: CUDA kernel supports ≤ {} query heads per kv head and "
               "head_dim ≤ 256 (got {} and {})", kMaxGroup, H / KVH, hd);
  for (const SeqRun& r : runs) {
    QWEN36_CHECK(r.slot >= 0 && r.slot < slots, "attention: slot {} out of range", r.slot);
    QWEN36_CHECK(r.pos0 >= 0 && r.pos0 + r.count <= cap, "attention: positions {}..{} exceed the cache capacity {}",
                 r.pos0, r.pos0 + r.count - 1, cap);
  }
  if (T == 0) return;
  Temp<int32_t> stmp(c, 0), ptmp(c, 0);
  const int32_t *ts = nullptr, *tp = nullptr;
  dev_token_map(c, runs, T, stmp, ptmp, &ts, &tp);
  const int64_t row = KVH * hd, n = T * row;
  kv_append_kernel<<<int(std::min<int64_t>(blocks_for(n, 256), 65535 * 8)), 256, 0, c.stream>>>(
      k.as<const float>(), v.as<const float>(), k_cache.as<float>(), v_cache.as<float>(), ts, tp, cap, row,
      n);
  CUDA_LAUNCH_CHECK();
  const int G = int(H / KVH);
  const size_t smem = sizeof(float) * size_t(G * hd + kWarps * G * (hd + 2));
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(KVH));
  const int npl = int((hd + 31) / 32);
  auto launch = [&](auto kernel) {
    kernel<<<grid, kWarps * 32, smem, c.stream>>>(q.as<const float>(), k_cache.as<const float>(),
                                                   v_cache.as<const float>(), ts, tp, out.as<float>(),
                                                   int(H), int(KVH), int(hd), cap, scale);
  };
  if (npl <= 1)
    launch(attention_kernel<1>);
  else if (npl <= 2)
    launch(attention_kernel<2>);
  else if (npl <= 4)
    launch(attention_kernel<4>);
  else
    launch(attention_kernel<8>);
  CUDA_LAUNCH_CHECK();
}

}  // namespace qwen36::cuda
