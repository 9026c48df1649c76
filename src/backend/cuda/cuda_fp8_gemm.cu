// out[T, N] = x[T, K] · w[N, K]ᵀ for block-wise FP8 weights (F8_B128) on Hopper's FP8 tensor
// cores, through cuBLASLt's 1×128 block scaling (cuBLAS ≥ 12.9, sm_90 only; the contract is
// summarized in docs/architecture.md, "HF quantized checkpoints"): W8A8.
//  - Activations: per token and 128-column group, scale = amax / 448 (e4m3's largest finite),
//    codes e4m3(x · 448 / amax) rounded to nearest, saturated; stored [Tp, K] with T padded to
//    Tp (a multiple of 4, as the scale layout needs) by zero rows, scales [K/128][Tp].
//  - Weights as stored: every F8_B128 block's 128 codes share one f32 scale, i.e. one scale per
//    row and 128 columns (VEC128 on both operands: no 128-row tile has to share its scale).
//    cuBLASLt wants the codes as contiguous rows and the scales as a table [K/128][rows], while
//    F8_B128 interleaves a scale every 128 bytes: each slice of rows is copied so first (1 byte a
//    weight written; the bf16 dequantization writes 2).
//  - cuBLAS operands: A = the weight slice, row-major [ns, K] read transposed (TN, the only FP8
//    order), B = the activations, D = out's columns n0 .. n0 + ns (f32, column-major ns × Tp with
//    leading dimension N, i.e. row-major [Tp, N]); when T % 4 ≠ 0, D is a [Tp, N] temporary whose
//    first T rows are copied to out.
//  - The MLP (fp8_mlp): x quantized once; gate and up rows of a slice side by side in one GEMM;
//    its f32 output SwiGLUed and quantized by one kernel into the down GEMM's activations.
// On by default on sm_90 from kMinTokens tokens (QWEN36_FP8_GEMM=0: the bf16 dequantization +
// cuBLAS path instead).
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <cublasLt.h>

#include "backend/cuda/cuda_fp8_gemm.cuh"
#include "quant/hf_blocks.h"

namespace qwen36::cuda {

namespace {

constexpr float kE4m3Max = 448.0f;
// Below this many tokens the bf16 dequantization + cuBLAS path is faster (H200, 27B FP8, one
// machine start: pp512 6,958 bf16 path vs 6,329 W8A8; pp1024 8,422 vs 8,886; pp2048 8,975 vs
// 10,047; pp4096 9,645 vs 10,919): the per-call copy of the weights into cuBLASLt's layout and
// the unfused MLP weigh more than the GEMM's gain on few tokens.
constexpr int64_t kMinTokens = 1024;
constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLASLt's recommendation on sm_90

// A warp's 128 values (v: lane l's 4l .. 4l + 3) to e4m3 codes, lane l's word at q[l], and
// their scale at *s (lane 0): scale amax / 448, codes e4m3(v · 448 / amax).
__device__ __forceinline__ void quantize128(const float4& v, int lane, __nv_fp8x4_e4m3* __restrict__ q,
                                            float* __restrict__ s) {
  float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float inv = amax > 0.0f ? kE4m3Max / amax : 0.0f;
  q[lane] = __nv_fp8x4_e4m3(make_float4(v.x * inv, v.y * inv, v.z * inv, v.w * inv));
  if (lane == 0) *s = amax > 0.0f ? amax / kE4m3Max : 1.0f;
}

// A warp per (token, group of 128): lane l quantizes columns 4l .. 4l + 3.
__global__ void fp8_quantize_kernel(const float* __restrict__ x, int T, int Tp, int K, __nv_fp8x4_e4m3* __restrict__ q,
                                    float* __restrict__ s) {
  const int L = K / 128, lane = threadIdx.x & 31;
  const long long units = (long long)Tp * L, warps = (long long)gridDim.x * (blockDim.x >> 5);
  for (long long u = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5; u < units; u += warps) {
    const int t = int(u / L), g = int(u - (long long)t * L);
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (t < T) v = reinterpret_cast<const float4*>(x + size_t(t) * K + size_t(g) * 128)[lane];
    quantize128(v, lane, q + (size_t(t) * K + size_t(g) * 128) / 4, s + size_t(g) * Tp + t);
  }
}

// Rows n0 .. n0 + ns − 1 of an F8_B128 matrix (rows of K / 128 blocks {f32 d, 128 codes}) to
// q [ns, K] (contiguous codes) and the columns 0 .. ns − 1 of s [K/128][ld_s]: a warp per
// block, a code word per lane.
__global__ void fp8_repack_kernel(const uint8_t* __restrict__ w, size_t rb, int n0, int ns, int K,
                                  uint32_t* __restrict__ q, float* __restrict__ s, int ld_s) {
  const int L = K / 128, lane = threadIdx.x & 31;
  const long long blocks = (long long)ns * L, warps = (long long)gridDim.x * (blockDim.x >> 5);
  for (long long u = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5; u < blocks; u += warps) {
    const int r = int(u / L), b = int(u - (long long)r * L);
    const uint8_t* blk = w + size_t(n0 + r) * rb + size_t(b) * sizeof(BlockF8B128);
    q[(size_t(r) * K + size_t(b) * 128) / 4 + lane] = __ldcs(reinterpret_cast<const unsigned*>(blk + 4) + lane);
    if (lane == 0) s[size_t(b) * ld_s + r] = *reinterpret_cast<const float*>(blk);
  }
}

// The MLP's gate / up GEMM output of one slice, gu [Tp, 2·ns] (gate columns, then up), to the
// down GEMM's activations: a warp per (token, 128 columns of the slice) takes silu(g) · u of its
// columns (swiglu_kernel's arithmetic) and quantizes them as fp8_quantize_kernel does, into
// columns g0 + 128·(its group) of q [Tp, I] and their scale s [I/128][Tp].
__global__ void fp8_swiglu_quantize_kernel(const float* __restrict__ gu, int Tp, int ns, int I, int g0,
                                           __nv_fp8x4_e4m3* __restrict__ q, float* __restrict__ s) {
  const int L = ns / 128, lane = threadIdx.x & 31;
  const long long units = (long long)Tp * L, warps = (long long)gridDim.x * (blockDim.x >> 5);
  for (long long u = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5; u < units; u += warps) {
    const int t = int(u / L), g = int(u - (long long)t * L);
    const float* row = gu + size_t(t) * 2 * ns + size_t(g) * 128;
    const float4 gv = reinterpret_cast<const float4*>(row)[lane], uv = reinterpret_cast<const float4*>(row + ns)[lane];
    const float4 v = make_float4(silu_f(gv.x) * uv.x, silu_f(gv.y) * uv.y, silu_f(gv.z) * uv.z, silu_f(gv.w) * uv.w);
    quantize128(v, lane, q + (size_t(t) * I + size_t(g0) + size_t(g) * 128) / 4, s + size_t(g0 / 128 + g) * Tp + t);
  }
}

// One cuBLASLt handle per device, made on first use (a handle belongs to the device current at
// its creation; tensor parallelism runs one backend per device in one process).
cublasLtHandle_t lt_handle() {
  static std::mutex mu;
  static cublasLtHandle_t handles[64] = {};
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  QWEN36_CHECK(dev >= 0 && dev < 64, "cuBLASLt: device {} out of range", dev);
  const std::lock_guard<std::mutex> lock(mu);
  if (!handles[dev]) CUBLAS_CHECK(cublasLtCreate(&handles[dev]));
  return handles[dev];
}

// D (column-major m × n, leading dimension ldd, f32) = Aᵀ · B for A [m rows of k] and B [n rows
// of k], both e4m3 with VEC128 scales sa [k/128][m] and sb [k/128][n].
void lt_fp8_gemm(Ctx& c, const void* a, const float* sa, int m, const void* b, const float* sb, int n, int k, float* d,
                 int ldd) {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(m), int64_t(k)));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(n), int64_t(k)));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, uint64_t(m), uint64_t(n), int64_t(ldd)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws_bytes = kWorkspaceBytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                    sizeof(ws_bytes)));
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  const cublasLtHandle_t h = lt_handle();
  CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, ld, ld, pref, 1, &heur, &found));
  QWEN36_CHECK(found > 0, "matmul: cuBLASLt has no FP8 block-scaled algorithm for {} x {} x {}", m, n, k);
  Temp<uint8_t> ws(c, kWorkspaceBytes);
  const float one = 1.0f, zero = 0.0f;
  CUBLAS_CHECK(cublasLtMatmul(h, op, &one, a, la, b, lb, &zero, d, ld, d, ld, &heur.algo, ws.get(), kWorkspaceBytes,
                              c.stream));
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatmulDescDestroy(op);
}

}  // namespace

namespace {
std::atomic<int> g_fp8{-1};  // −1: QWEN36_FP8_GEMM not read yet; 0 off; 1 on
}  // namespace

bool fp8_gemm_enabled() {
  int v = g_fp8.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* e = std::getenv("QWEN36_FP8_GEMM");
    v = e != nullptr && std::strcmp(e, "0") == 0 ? 0 : 1;
    g_fp8.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

void fp8_gemm_select(int on) { g_fp8.store(on < 0 ? -1 : on ? 1 : 0, std::memory_order_relaxed); }

bool fp8_gemm_takes(const Tensor& w, int64_t T) {
  if (!fp8_gemm_enabled() || w.dtype != DType::F8_B128 || T < kMinTokens || w.rows() % 4 != 0 || w.cols() % 128 != 0 ||
      w.rows() >= (int64_t(1) << 30) || (T + 3) * w.cols() >= (int64_t(1) << 31))
    return false;
  int dev = 0, major = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major == 9;
}

namespace {

int grid_of_warps(int64_t warps) { return int(std::min<int64_t>(blocks_for(warps * 32, 256), 4096)); }

// x [T, K] f32 to e4m3 codes xq [Tp, K] (zero rows from T) and scales xs [K/128][Tp].
void quantize_x(Ctx& c, const float* x, int64_t T, int64_t Tp, int64_t K, uint8_t* xq, float* xs) {
  fp8_quantize_kernel<<<grid_of_warps(Tp * (K / 128)), 256, 0, c.stream>>>(
      x, int(T), int(Tp), int(K), reinterpret_cast<__nv_fp8x4_e4m3*>(xq), xs);
  CUDA_LAUNCH_CHECK();
}

// Rows n0 .. n0 + ns − 1 of w into q [ns, K] and columns 0 .. ns − 1 of s [K/128][ld_s].
void repack(Ctx& c, const Tensor& w, int64_t n0, int64_t ns, uint8_t* q, float* s, int64_t ld_s) {
  const int64_t K = w.cols();
  fp8_repack_kernel<<<grid_of_warps(ns * (K / 128)), 256, 0, c.stream>>>(
      static_cast<const uint8_t*>(w.data), w.row_bytes(), int(n0), int(ns), int(K), reinterpret_cast<uint32_t*>(q), s,
      int(ld_s));
  CUDA_LAUNCH_CHECK();
}

// out[T, N] = x · wᵀ from x already quantized (xq [Tp, K], xs [K/128][Tp]): per slice of ≤ 96 Mi
// weights (a multiple of 4 rows) the rows repacked and one GEMM; when Tp ≠ T into a [Tp, N]
// temporary whose first T rows are copied to out.
void gemm_quantized_x(Ctx& c, const Tensor& w, const uint8_t* xq, const float* xs, int64_t T, int64_t Tp, float* out) {
  const int64_t N = w.rows(), K = w.cols(), L = K / 128;
  Temp<float> padded(c, Tp != T ? size_t(Tp * N) : 0);
  float* d = Tp != T ? padded.get() : out;
  const int64_t slice = std::clamp<int64_t>((int64_t(96) << 20) / K / 4 * 4, 4, N);
  Temp<uint8_t> wq(c, size_t(slice * K));
  Temp<float> wsc(c, size_t(L * slice));
  for (int64_t n0 = 0; n0 < N; n0 += slice) {
    const int64_t ns = std::min(slice, N - n0);
    repack(c, w, n0, ns, wq.get(), wsc.get(), ns);
    lt_fp8_gemm(c, wq.get(), wsc.get(), int(ns), xq, xs, int(Tp), int(K), d + n0, int(N));
  }
  if (Tp != T) CUDA_CHECK(cudaMemcpyAsync(out, d, size_t(T * N) * sizeof(float), cudaMemcpyDeviceToDevice, c.stream));
}

}  // namespace

void fp8_gemm(Ctx& c, const Tensor& w, const float* x, float* out, int64_t T, int64_t N, int64_t K) {
  QWEN36_CHECK(fp8_gemm_takes(w, T) && w.rows() == N && w.cols() == K, "matmul: the FP8 GEMM does not take {} at {} tokens",
               w.shape_str(), T);
  const int64_t Tp = (T + 3) / 4 * 4;
  Temp<uint8_t> xq(c, size_t(Tp * K));
  Temp<float> xs(c, size_t(K / 128 * Tp));
  quantize_x(c, x, T, Tp, K, xq.get(), xs.get());
  gemm_quantized_x(c, w, xq.get(), xs.get(), T, Tp, out);
}

bool fp8_mlp(Ctx& c, const Tensor& x, const MlpWeights& m, Tensor& out) {
  const Tensor &gate = m.gate_proj, &up = m.up_proj, &down = m.down_proj;
  const int64_t K = gate.cols(), I = gate.rows(), H = down.rows(), T = x.numel() / std::max<int64_t>(K, 1);
  if (x.dtype != DType::F32 || out.dtype != DType::F32 || x.cols() != K || up.rows() != I || up.cols() != K ||
      down.cols() != I || out.numel() != T * H || I % 128 != 0)
    return false;
  for (const Tensor* w : {&gate, &up, &down})
    if (!fp8_gemm_takes(*w, T)) return false;
  const int64_t Tp = (T + 3) / 4 * 4;
  Temp<uint8_t> aq(c, size_t(Tp * I));  // the down GEMM's activations
  Temp<float> as(c, size_t(I / 128 * Tp));
  {
    Temp<uint8_t> xq(c, size_t(Tp * K));
    Temp<float> xs(c, size_t(K / 128 * Tp));
    quantize_x(c, x.as<const float>(), T, Tp, K, xq.get(), xs.get());
    // Slices of ns intermediate rows (a multiple of 128: whole activation groups), gate + up ≤ 96 Mi weights.
    const int64_t slice = std::clamp<int64_t>((int64_t(48) << 20) / K / 128 * 128, 128, I);
    Temp<uint8_t> wq(c, size_t(2 * slice * K));
    Temp<float> wsc(c, size_t(K / 128 * 2 * slice)), gu(c, size_t(Tp * 2 * slice));
    for (int64_t n0 = 0; n0 < I; n0 += slice) {
      const int64_t ns = std::min(slice, I - n0);
      repack(c, gate, n0, ns, wq.get(), wsc.get(), 2 * ns);
      repack(c, up, n0, ns, wq.get() + ns * K, wsc.get() + ns, 2 * ns);
      lt_fp8_gemm(c, wq.get(), wsc.get(), int(2 * ns), xq.get(), xs.get(), int(Tp), int(K), gu.get(), int(2 * ns));
      fp8_swiglu_quantize_kernel<<<grid_of_warps(Tp * (ns / 128)), 256, 0, c.stream>>>(
          gu.get(), int(Tp), int(ns), int(I), int(n0), reinterpret_cast<__nv_fp8x4_e4m3*>(aq.get()), as.get());
      CUDA_LAUNCH_CHECK();
    }
  }
  gemm_quantized_x(c, down, aq.get(), as.get(), T, Tp, out.as<float>());
  return true;
}

}  // namespace qwen36::cuda
