// Mixture of experts on the GPU. CPU twin: backend/cpu/cpu_moe.cpp.
//
//  - moe_route: one warp per token: softmax over the experts, top-k by repeated arg-max
//    (ties to the lower id, as the CPU), renormalised.
//  - moe_experts, few (token, expert) pairs (decode, batch decode: T·k ≤ 64): two fused
//    kernels that read each pair's expert from the routing ids on the device (no host sync):
//    act[p] = silu(gate_e x_t) * (up_e x_t), then out[t] = Σ_j w_tj · down_e act[p]. One warp
//    per weight row, 16-byte loads.
//  - many pairs (prefill): the ids come to the host, tokens are grouped per expert, and each
//    expert with tokens runs gather → matmul (cuBLAS) → SwiGLU → matmul → weighted
//    scatter-add, in ascending expert order like the CPU. (A grouped GEMM is future work.)
#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_ops.cuh"

namespace qwen36::cuda {

namespace {

constexpr int kMaxExperts = 1024;
constexpr int kMaxPairs = 64;

__global__ void route_kernel(const float* logits, int E, int k, bool renorm, float* weights, int32_t* ids) {
  __shared__ float p[kMaxExperts];
  const int t = blockIdx.x, lane = threadIdx.x;
  const float* l = logits + int64_t(t) * E;
  float mx = -INFINITY;
  for (int e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
  mx = warp_max(mx);
  float sum = 0;
  for (int e = lane; e < E; e += 32) {
    p[e] = expf(l[e] - mx);
    sum += p[e];
  }
  sum = warp_sum(sum);
  for (int e = lane; e < E; e += 32) p[e] /= sum;
  __syncwarp();
  float top = 0;
  for (int j = 0; j < k; ++j) {
    float best = -1.0f;
    int bi = E;
    for (int e = lane; e < E; e += 32)
      if (p[e] > best) best = p[e], bi = e;  // ascending e: the first (lowest) max of this lane
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ob > best || (ob == best && oi < bi)) best = ob, bi = oi;
    }
    if (lane == 0) {
      ids[int64_t(t) * k + j] = bi;
      weights[int64_t(t) * k + j] = best;
      top += best;
    }
    __syncwarp();
    if (lane == 0) p[bi] = -2.0f;  // taken
    __syncwarp();
  }
  if (lane == 0 && renorm)
    for (int j = 0; j < k; ++j) weights[int64_t(t) * k + j] /= top;
}

struct ExpertPtrs {
  const void* gate;
  const void* up;
  const void* down;
};

// Dot of a weight row (n elements of type W) with an f32 vector, by one warp; all lanes get it.
template <typename W>
__device__ __forceinline__ float warp_dot(const W* w, const float* x, int n) {
  float acc = 0;
  if (n % 8 == 0) {
    for (int i = threadIdx.x % 32; i < n / 8; i += 32) {
      float f[8];
      if constexpr (sizeof(W) == 2) {
        const uint4 r = __ldg(reinterpret_cast<const uint4*>(w) + i);
        const W* h = reinterpret_cast<const W*>(&r);
#pragma unroll
        for (int j = 0; j < 8; ++j) f[j] = to_f32(h[j]);
      } else {
        const float4 a = __ldg(reinterpret_cast<const float4*>(w) + 2 * i);
        const float4 b = __ldg(reinterpret_cast<const float4*>(w) + 2 * i + 1);
        f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
      }
      const float4 x0 = __ldg(reinterpret_cast<const float4*>(x) + 2 * i);
      const float4 x1 = __ldg(reinterpret_cast<const float4*>(x) + 2 * i + 1);
      acc += f[0] * x0.x + f[1] * x0.y + f[2] * x0.z + f[3] * x0.w + f[4] * x1.x + f[5] * x1.y + f[6] * x1.z +
             f[7] * x1.w;
    }
  } else {
    for (int i = threadIdx.x % 32; i < n; i += 32) acc += to_f32(w[i]) * x[i];
  }
  return warp_sum(acc);
}

// grid (ceil(I / 8), pairs); warp per intermediate row i of pair p = t·k + j.
template <typename W>
__global__ void experts_gate_up_kernel(const float* x, const int32_t* ids, const ExpertPtrs* table, float* act, int D,
                                       int I, int k) {
  const int p = blockIdx.y, i = blockIdx.x * 8 + threadIdx.x / 32;
  if (i >= I) return;
  const ExpertPtrs e = table[ids[p]];
  const float* xt = x + int64_t(p / k) * D;
  const float g = warp_dot(static_cast<const W*>(e.gate) + int64_t(i) * D, xt, D);
  const float u = warp_dot(static_cast<const W*>(e.up) + int64_t(i) * D, xt, D);
  if (threadIdx.x % 32 == 0) act[int64_t(p) * I + i] = silu_f(g) * u;
}

// grid (ceil(D / 8), T); warp per output row d of token t, summing its k experts.
template <typename W>
__global__ void experts_down_kernel(const float* act, const int32_t* ids, const float* weights,
                                    const ExpertPtrs* table, float* out, int D, int I, int k) {
  const int t = blockIdx.y, d = blockIdx.x * 8 + threadIdx.x / 32;
  if (d >= D) return;
  float acc = 0;
  if constexpr (sizeof(W) == 2) {
    if (I % 8 == 0 && k <= 16) {
      // Every expert's row loads are issued before any is reduced (the k rows are short:
      // one sequential warp_dot per expert would leave the memory system mostly idle).
      const W* rows[16];
      float part[16];
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        rows[j] = j < k ? static_cast<const W*>(table[ids[t * k + j]].down) + int64_t(d) * I : nullptr;
        part[j] = 0;
      }
      for (int i = threadIdx.x % 32; i < I / 8; i += 32) {
        uint4 r[16];
#pragma unroll
        for (int j = 0; j < 16; ++j)
          if (j < k) r[j] = __ldg(reinterpret_cast<const uint4*>(rows[j]) + i);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          if (j >= k) break;
          const float* a = act + int64_t(t * k + j) * I + i * 8;
          const float4 x0 = *reinterpret_cast<const float4*>(a), x1 = *reinterpret_cast<const float4*>(a + 4);
          const W* h = reinterpret_cast<const W*>(&r[j]);
          part[j] += to_f32(h[0]) * x0.x + to_f32(h[1]) * x0.y + to_f32(h[2]) * x0.z + to_f32(h[3]) * x0.w +
                     to_f32(h[4]) * x1.x + to_f32(h[5]) * x1.y + to_f32(h[6]) * x1.z + to_f32(h[7]) * x1.w;
        }
      }
#pragma unroll
      for (int j = 0; j < 16; ++j)
        if (j < k) acc += weights[t * k + j] * warp_sum(part[j]);
      if (threadIdx.x % 32 == 0) out[int64_t(t) * D + d] = acc;
      return;
    }
  }
  for (int j = 0; j < k; ++j) {
    const int p = t * k + j;
    const ExpertPtrs e = table[ids[p]];
    acc += weights[p] * warp_dot(static_cast<const W*>(e.down) + int64_t(d) * I, act + int64_t(p) * I, I);
  }
  if (threadIdx.x % 32 == 0) out[int64_t(t) * D + d] = acc;
}

__global__ void scatter_add_kernel(const float* y, const int32_t* toks, const float* w, float* out, int64_t D,
                                   int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / D, c = i % D;
    out[int64_t(toks[r]) * D + c] += w[r] * y[i];
  }
}

const ExpertPtrs* expert_table(Ctx& c, std::span<const MlpWeights> experts) {
  std::vector<const void*> h;
  for (const MlpWeights& m : experts) h.insert(h.end(), {m.gate_proj.data, m.up_proj.data, m.down_proj.data});
  ExpertTable& t = c.expert_tables[experts.data()];
  if (t.dev && t.host == h) return static_cast<const ExpertPtrs*>(t.dev);
  if (!host_work_allowed(c)) return nullptr;
  if (t.dev) {
    CUDA_CHECK(cudaStreamSynchronize(c.stream));  // the old table may still be read
    CUDA_CHECK(cudaFree(t.dev));
    t.dev = nullptr;
  }
  CUDA_CHECK(cudaMalloc(&t.dev, h.size() * sizeof(void*)));
  CUDA_CHECK(cudaMemcpy(t.dev, h.data(), h.size() * sizeof(void*), cudaMemcpyHostToDevice));
  t.host = std::move(h);
  return static_cast<const ExpertPtrs*>(t.dev);
}

}  // namespace

void moe_route(Ctx& c, const Tensor& logits, int64_t k, bool renorm, Tensor& weights, Tensor& ids) {
  const int64_t E = logits.cols(), T = logits.rows();
  QWEN36_CHECK(k > 0 && k <= E && weights.numel() == T * k && ids.numel() == T * k && ids.dtype == DType::I32,
               "moe_route: logits {} top-{} into {} / {}", logits.shape_str(), k, weights.shape_str(), ids.shape_str());
  QWEN36_CHECK(E <= kMaxExperts, "moe_route: {} experts (CUDA supports ≤ {})", E, kMaxExperts);
  if (T == 0) return;
  route_kernel<<<unsigned(T), 32, 0, c.stream>>>(logits.as<const float>(), int(E), int(k), renorm,
                                                  weights.as<float>(), ids.as<int32_t>());
  CUDA_LAUNCH_CHECK();
}

void moe_experts(Ctx& c, const Tensor& x, const Tensor& weights, const Tensor& ids, std::span<const MlpWeights> experts,
                 Tensor& out) {
  const int64_t D = x.cols(), T = x.rows(), k = ids.cols();
  QWEN36_CHECK(out.numel() == T * D && ids.rows() == T, "moe_experts: x {} ids {} out {}", x.shape_str(),
               ids.shape_str(), out.shape_str());
  QWEN36_CHECK(!experts.empty(), "moe_experts: no experts");
  const int64_t E = int64_t(experts.size()), I = experts[0].gate_proj.rows();
  const DType dt = experts[0].gate_proj.dtype;
  check_weight_dtype(experts[0].gate_proj, "moe_experts");
  for (const MlpWeights& m : experts)
    QWEN36_CHECK(m.gate_proj.dtype == dt && m.up_proj.dtype == dt && m.down_proj.dtype == dt &&
                     m.gate_proj.rows() == I && m.gate_proj.cols() == D && m.down_proj.rows() == D,
                 "moe_experts: experts must share one dtype and shape");
  if (T == 0) return;
  const int64_t P = T * k;
  if (P <= kMaxPairs) {
    // Ids are trusted here (they come from moe_route on the device).
    const ExpertPtrs* table = expert_table(c, experts);
    Temp<float> act(c, size_t(P * I));
    const dim3 g1(unsigned((I + 7) / 8), unsigned(P)), g2(unsigned((D + 7) / 8), unsigned(T));
    auto run = [&](auto tag) {
      using W = decltype(tag);
      experts_gate_up_kernel<W><<<g1, 256, 0, c.stream>>>(x.as<const float>(), ids.as<const int32_t>(), table,
                                                          act.get(), int(D), int(I), int(k));
      CUDA_LAUNCH_CHECK();
      experts_down_kernel<W><<<g2, 256, 0, c.stream>>>(act.get(), ids.as<const int32_t>(), weights.as<const float>(),
                                                       table, out.as<float>(), int(D), int(I), int(k));
      CUDA_LAUNCH_CHECK();
    };
    if (dt == DType::BF16)
      run(__nv_bfloat16{});
    else if (dt == DType::F16)
      run(__half{});
    else
      run(float{});
    return;
  }
  // Prefill: group on the host.
  if (!host_work_allowed(c)) return;
  std::vector<int32_t> hid(static_cast<size_t>(P));
  std::vector<float> hw(static_cast<size_t>(P));
  CUDA_CHECK(cudaMemcpyAsync(hid.data(), ids.data, size_t(P) * 4, cudaMemcpyDeviceToHost, c.stream));
  CUDA_CHECK(cudaMemcpyAsync(hw.data(), weights.data, size_t(P) * 4, cudaMemcpyDeviceToHost, c.stream));
  CUDA_CHECK(cudaStreamSynchronize(c.stream));
  std::vector<std::vector<int32_t>> toks(static_cast<size_t>(E));
  std::vector<std::vector<float>> wts(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = hid[size_t(t * k + j)];
      QWEN36_CHECK(e >= 0 && e < E, "moe_experts: expert id {} out of range", e);
      toks[size_t(e)].push_back(int32_t(t));
      wts[size_t(e)].push_back(hw[size_t(t * k + j)]);
    }
  // One upload of every expert's token list and weights.
  std::vector<int32_t> all_t;
  std::vector<float> all_w;
  std::vector<int64_t> off(size_t(E) + 1, 0);
  for (int64_t e = 0; e < E; ++e) {
    all_t.insert(all_t.end(), toks[size_t(e)].begin(), toks[size_t(e)].end());
    all_w.insert(all_w.end(), wts[size_t(e)].begin(), wts[size_t(e)].end());
    off[size_t(e) + 1] = int64_t(all_t.size());
  }
  Temp<int32_t> dt_tok(c, std::span<const int32_t>(all_t.data(), all_t.size()));
  Temp<float> dt_w(c, std::span<const float>(all_w.data(), all_w.size()));
  int64_t max_n = 0;
  for (int64_t e = 0; e < E; ++e) max_n = std::max(max_n, off[size_t(e) + 1] - off[size_t(e)]);
  Temp<float> xs(c, size_t(max_n * D)), gate(c, size_t(max_n * I)), up(c, size_t(max_n * I)), y(c, size_t(max_n * D));
  CUDA_CHECK(cudaMemsetAsync(out.data, 0, size_t(T * D) * 4, c.stream));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = off[size_t(e) + 1] - off[size_t(e)];
    if (n == 0) continue;
    const MlpWeights& m = experts[size_t(e)];
    get_rows_dev(c, x.as<const float>(), D, dt_tok.get() + off[size_t(e)], n, xs.get());
    Tensor tx(xs.get(), DType::F32, {n, D}), tg(gate.get(), DType::F32, {n, I}), tu(up.get(), DType::F32, {n, I}),
        ty(y.get(), DType::F32, {n, D});
    matmul(c, tx, m.gate_proj, tg);
    matmul(c, tx, m.up_proj, tu);
    swiglu(c, tg, tu, tg);
    matmul(c, tg, m.down_proj, ty);
    scatter_add_kernel<<<int(std::min<int64_t>(blocks_for(n * D, 256), 65535)), 256, 0, c.stream>>>(
        y.get(), dt_tok.get() + off[size_t(e)], dt_w.get() + off[size_t(e)], out.as<float>(), D, n * D);
    CUDA_LAUNCH_CHECK();
  }
}

}  // namespace qwen36::cuda
