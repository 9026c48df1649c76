// out[T, N] = x[T, K] · w[N, K]ᵀ for the Hugging Face checkpoint block types (W4_G32, W4_G128:
// AWQ / GPTQ / compressed-tensors int4; F8_B128: block-wise FP8; NVFP4_B64: modelopt and
// compressed-tensors NVFP4; layouts and formulas in quant/hf_blocks.h), their embedding rows and
// the dequantization of MoE experts for cuda_moe.cu's grouped GEMM.
//
//  - Decode (T ≤ 8, hf_gemv_kernel): activations stay f32 (no int8 rounding: these types are
//    the checkpoint's exact weights and the CPU twin multiplies them by f32 activations). The
//    unit of work is 32 weights of one row (a quarter of a 128-block, half of an NVFP4 block, a
//    whole W4_G32 block). A thread block owns one unit column per thread (a K chunk of ≤ 256
//    units; longer rows take several chunks, grid.y, summed in order by a second small kernel)
//    and a contiguous range of rows. Each thread loads its units' activations once into
//    registers ([TM][32]) and reuses them for every row of the range, so the loop only streams
//    weights: kRows rows at a time with the next rows' loads in flight. Blocks are 4-byte (W4,
//    F8) or 8-byte (NVFP4) aligned (68-, 20-, 132- and 40-byte blocks), so a thread reads its
//    unit with 4- or 8-byte loads; the 8 (4) threads of neighbouring units read neighbouring
//    bytes, so each warp load covers whole 32-byte sectors of 1-2 rows' bytes (L1 serves the
//    rest of a sector to the next load of the same warp). Rows meet over lanes by shuffles and
//    over warps in shared memory in warp order: results are deterministic.
//    T ≤ 4 rows go in one pass (x in 32·T registers); T = 5..8 in two (4 + the rest).
//    Arithmetic per weight: codes become exact floats without integer conversion (W4: the
//    byte in the mantissa of 2^23, minus 2^23 + z; NVFP4 and FP8: the bits shifted into an f16,
//    the exact value times a power of two, widened), then one FMA per activation row; the
//    block's scale multiplies the unit's (or NVFP4 group's) partial sum once. So a row's
//    result is Σ scale·(Σ code·x), the dot of the exact dequantized weights with the f32
//    activations up to f32 summation order (the GPU tests bound that against a double
//    reference), not bitwise the CPU's order.
//  - Prefill (T > 8) and exact_matmul: row slices dequantized exactly (the formulas of
//    quant/hf_blocks.h, same f32 operations) to bf16 (f32 with exact_matmul) and multiplied by
//    cuBLAS with the activations rounded to bf16 once (round_activations / gemm_half), as
//    cuda_quant_matmul.cu's quant_gemm does. FP8 takes the same route (no FP8 tensor-core
//    GEMM with block scales yet).
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "backend/cuda/cuda_fp8_gemm.cuh"
#include "backend/cuda/cuda_quant_blocks.cuh"
#include "backend/cuda/cuda_quant_hf.cuh"
#include "quant/hf_blocks.h"

namespace qwen36::cuda {

namespace {

static_assert(offsetof(BlockW4G128, qs) == 4 && offsetof(BlockW4G32, qs) == 4 && offsetof(BlockF8B128, q) == 4 &&
              offsetof(BlockNvfp4B64, s) == 4 && offsetof(BlockNvfp4B64, qs) == 8);

constexpr int kMaxThreads = 256;  // threads per block = units per K chunk, rounded up to 32
constexpr int kBatch = 32;        // rows whose warp partials meet in shared memory at once
constexpr int kPassRows = 4;      // activation rows per GEMV pass

// Weights are read once: streaming loads (evict-first), 4-byte aligned.
__device__ __forceinline__ uint32_t ldw(const uint8_t* p) { return __ldcs(reinterpret_cast<const unsigned*>(p)); }

// Byte e of w (a value 0..255) as the float 2^23 + byte: exact, one permute, no conversion.
template <int e>
__device__ __forceinline__ float magic_byte(uint32_t w) {
  return __uint_as_float(__byte_perm(w, 0x4B00u, 0x5440u | e));
}

// ---- per-type unit readers ----
//
// Raw: the loaded words of one unit of one row. load(block, j, raw): unit j of the block.
// elem(j, i): the element (within the block) of the unit's value i, in the order dot() uses.
// dot<TM>(raw, x, acc): acc[t] += Σ_i w_i · x[t][i]. values(raw, y): y[i] = w_i by the exact
// formula of quant/hf_blocks.h.

// W4_G32 / W4_G128: value i < 16 is the low nibble of qs byte 16j + i (element 16j + i), value
// 16 + i its high nibble (element L/2 + 16j + i). w = s · (q − z).
template <int L>
struct HfW4 {
  static constexpr int kElems = L, kBytes = 4 + L / 2, kUnits = L / 32, kRows = 4;
  struct Raw {
    uint32_t h, q[4];  // header (s | z << 16 | kind << 24), 16 code bytes
  };
  __device__ static void load(const uint8_t* b, int j, Raw& r) {
    r.h = ldw(b);
#pragma unroll
    for (int k = 0; k < 4; ++k) r.q[k] = ldw(b + 4 + 16 * j + 4 * k);
  }
  __host__ __device__ static constexpr int elem(int j, int i) { return (i < 16 ? 0 : L / 2) + 16 * j + (i & 15); }
  __device__ static float scale(uint32_t h) {
    const uint32_t s = h & 0xFFFFu;
    return (h >> 24) ? __uint_as_float(s << 16) : __half2float(__ushort_as_half(uint16_t(s)));
  }
  // q − z as exact floats: (2^23 + q) − (2^23 + z).
  __device__ static void codes(const Raw& r, float (&d)[32]) {
    const float c = 8388608.0f + float((r.h >> 16) & 0xFFu);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t lo = r.q[k] & 0x0F0F0F0Fu, hi = (r.q[k] >> 4) & 0x0F0F0F0Fu;
      d[4 * k + 0] = magic_byte<0>(lo) - c, d[4 * k + 1] = magic_byte<1>(lo) - c;
      d[4 * k + 2] = magic_byte<2>(lo) - c, d[4 * k + 3] = magic_byte<3>(lo) - c;
      d[16 + 4 * k + 0] = magic_byte<0>(hi) - c, d[16 + 4 * k + 1] = magic_byte<1>(hi) - c;
      d[16 + 4 * k + 2] = magic_byte<2>(hi) - c, d[16 + 4 * k + 3] = magic_byte<3>(hi) - c;
    }
  }
  template <int TM>
  __device__ static void dot(const Raw& r, const float (&x)[TM][32], float (&acc)[TM]) {
    float d[32];
    codes(r, d);
    const float s = scale(r.h);
#pragma unroll
    for (int t = 0; t < TM; ++t) {
      float p = 0.0f;
#pragma unroll
      for (int i = 0; i < 32; ++i) p = fmaf(d[i], x[t][i], p);
      acc[t] = fmaf(s, p, acc[t]);
    }
  }
  __device__ static void values(const Raw& r, float (&y)[32]) {
    codes(r, y);
    const float s = scale(r.h);
#pragma unroll
    for (int i = 0; i < 32; ++i) y[i] = s * y[i];
  }
};

// NVFP4_B64: unit j = qs bytes [16j, +16) = elements [32j, +32), groups 2j (bytes 0-7) and
// 2j + 1 (bytes 8-15). Per code word m (bytes 4m..4m+3 of the unit), value 8m + r is the low
// nibble (r < 4) or high nibble (r ≥ 4) of byte 4m + (r & 3). An E2M1 code in an f16's high
// byte (index bits → f16 bits 9-11, sign → 15) is e2m1 · 2^-14 exactly (0.5 the subnormal).
// w = (e2m1 · e4m3(s)) · g.
struct HfNvfp4 {
  static constexpr int kElems = 64, kBytes = 40, kUnits = 2, kRows = 4;
  struct Raw {
    uint32_t g, s;  // global scale bits; the unit's two group scale bytes (bits 0-7, 8-15)
    uint2 q[2];
  };
  __device__ static void load(const uint8_t* b, int j, Raw& r) {
    r.g = ldw(b);
    r.s = ldw(b + 4) >> (16 * j);
#pragma unroll
    for (int k = 0; k < 2; ++k) r.q[k] = __ldcs(reinterpret_cast<const uint2*>(b + 8 + 16 * j + 8 * k));
  }
  __host__ __device__ static constexpr int elem(int j, int i) {
    return 32 * j + 2 * (4 * (i / 8) + (i & 3)) + ((i & 7) >> 2);
  }
  // The 8 values of code word w as e2m1 · 2^-14, in the order above.
  __device__ static void word(uint32_t w, float* v) {
    const uint32_t hl = ((w & 0x07070707u) << 1) | ((w & 0x08080808u) << 4);  // f16 high bytes, low nibbles
    const uint32_t hh = ((w & 0x70707070u) >> 3) | (w & 0x80808080u);         // and high nibbles
    const float2 a = f16x2_to_f2(__byte_perm(hl, 0u, 0x1404u)), b = f16x2_to_f2(__byte_perm(hl, 0u, 0x3424u));
    const float2 c = f16x2_to_f2(__byte_perm(hh, 0u, 0x1404u)), d = f16x2_to_f2(__byte_perm(hh, 0u, 0x3424u));
    v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y, v[4] = c.x, v[5] = c.y, v[6] = d.x, v[7] = d.y;
  }
  __device__ static void codes(const Raw& r, float (&v)[32]) {
    word(r.q[0].x, v), word(r.q[0].y, v + 8), word(r.q[1].x, v + 16), word(r.q[1].y, v + 24);
  }
  template <int TM>
  __device__ static void dot(const Raw& r, const float (&x)[TM][32], float (&acc)[TM]) {
    float v[32];
    codes(r, v);
    const float g = __uint_as_float(r.g);
    // e2m1 · 2^-14 summed per group, then times e4m3(s) · 2^14 · g.
    const float fa = (e4m3_f32(r.s & 0xFFu) * 16384.0f) * g, fb = (e4m3_f32((r.s >> 8) & 0xFFu) * 16384.0f) * g;
#pragma unroll
    for (int t = 0; t < TM; ++t) {
      float pa = 0.0f, pb = 0.0f;
#pragma unroll
      for (int i = 0; i < 16; ++i) pa = fmaf(v[i], x[t][i], pa), pb = fmaf(v[16 + i], x[t][16 + i], pb);
      acc[t] = fmaf(fa, pa, fmaf(fb, pb, acc[t]));
    }
  }
  __device__ static void values(const Raw& r, float (&y)[32]) {
    codes(r, y);
    const float g = __uint_as_float(r.g);
    const float sa = e4m3_f32(r.s & 0xFFu), sb = e4m3_f32((r.s >> 8) & 0xFFu);
#pragma unroll
    for (int i = 0; i < 32; ++i) y[i] = ((y[i] * 16384.0f) * (i < 16 ? sa : sb)) * g;  // (e2m1 · s) · g
  }
};

// F8_B128: unit j = code bytes [32j, +32) (elements [32j, +32)); per word k, values 4k + r are
// bytes 0, 2, 1, 3 (the two f16 pairs of e4m3_to_f16x2). w = e4m3(q) · d.
struct HfF8 {
  static constexpr int kElems = 128, kBytes = 132, kUnits = 4, kRows = 2;
  struct Raw {
    uint32_t d, q[8];
  };
  __device__ static void load(const uint8_t* b, int j, Raw& r) {
    r.d = ldw(b);
#pragma unroll
    for (int k = 0; k < 8; ++k) r.q[k] = ldw(b + 4 + 32 * j + 4 * k);
  }
  __host__ __device__ static constexpr int elem(int j, int i) {
    return 32 * j + 4 * (i / 4) + ((i & 3) == 1 ? 2 : (i & 3) == 2 ? 1 : (i & 3));
  }
  __device__ static void codes(const Raw& r, float (&v)[32]) {  // e4m3 · 2^-8
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float2 a = f16x2_to_f2(e4m3_to_f16x2(r.q[k] << 8)), b = f16x2_to_f2(e4m3_to_f16x2(r.q[k]));
      v[4 * k] = a.x, v[4 * k + 1] = a.y, v[4 * k + 2] = b.x, v[4 * k + 3] = b.y;
    }
  }
  template <int TM>
  __device__ static void dot(const Raw& r, const float (&x)[TM][32], float (&acc)[TM]) {
    float v[32];
    codes(r, v);
    const float f = __uint_as_float(r.d) * 256.0f;
#pragma unroll
    for (int t = 0; t < TM; ++t) {
      float p = 0.0f;
#pragma unroll
      for (int i = 0; i < 32; ++i) p = fmaf(v[i], x[t][i], p);
      acc[t] = fmaf(f, p, acc[t]);
    }
  }
  __device__ static void values(const Raw& r, float (&y)[32]) {
    codes(r, y);
    const float d = __uint_as_float(r.d);
#pragma unroll
    for (int i = 0; i < 32; ++i) y[i] = (y[i] * 256.0f) * d;
  }
};

template <DType D>
struct HfT;
template <>
struct HfT<DType::W4_G32> : HfW4<32> {};
template <>
struct HfT<DType::W4_G128> : HfW4<128> {};
template <>
struct HfT<DType::NVFP4_B64> : HfNvfp4 {};
template <>
struct HfT<DType::F8_B128> : HfF8 {};

template <typename F>
bool with_hf_type(DType t, F&& f) {
  switch (t) {
    case DType::W4_G32: f(std::integral_constant<DType, DType::W4_G32>{}); return true;
    case DType::W4_G128: f(std::integral_constant<DType, DType::W4_G128>{}); return true;
    case DType::F8_B128: f(std::integral_constant<DType, DType::F8_B128>{}); return true;
    case DType::NVFP4_B64: f(std::integral_constant<DType, DType::NVFP4_B64>{}); return true;
    default: return false;
  }
}

// ================================================================================================
// Decode GEMV
// ================================================================================================

struct HfGemvArgs {
  const uint8_t* w;
  unsigned long long rb;  // bytes per weight row
  const float* x;         // the pass's first activation row (rows of K floats)
  float* out;             // its first output row (rows of N floats)
  float* part;            // several K chunks: [chunk][kPassRows][N] partial sums, else null
  int N, K, U, uc, nt;    // units per row and per chunk; activation rows of this pass (≤ TM)
};

template <DType D, int TM>
__global__ void __launch_bounds__(kMaxThreads) hf_gemv_kernel(const HfGemvArgs a) {
  using H = HfT<D>;
  constexpr int RW = H::kRows;
  static_assert(kBatch % RW == 0, "a row group must not straddle a batch");
  __shared__ float red[kMaxThreads / 32][kBatch][TM];
  griddep_trigger();
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5, nw = int(blockDim.x >> 5);
  const int u = int(blockIdx.y) * a.uc + tid;
  const bool valid = tid < a.uc && u < a.U;
  const int blk = valid ? u / H::kUnits : 0, j = valid ? u - blk * H::kUnits : 0;
  const int r0 = int((long long)a.N * blockIdx.x / gridDim.x), r1 = int((long long)a.N * (blockIdx.x + 1) / gridDim.x);
  const uint8_t* wb = a.w + size_t(blk) * H::kBytes;

  using Raw = typename H::Raw;
  Raw cur[RW], nxt[RW];
  auto fetch = [&](int r, Raw (&raw)[RW]) {
#pragma unroll
    for (int p = 0; p < RW; ++p) {
      raw[p] = Raw{};
      if (valid && r + p < r1) H::load(wb + (unsigned long long)(r + p) * a.rb, j, raw[p]);
    }
  };
  // The first rows' weights depend on no earlier kernel: under programmatic dependent launch
  // they load while the kernel before finishes; the activations wait for it.
  fetch(r0, cur);
#pragma unroll
  for (int p = 0; p < RW; ++p) nxt[p] = Raw{};
  griddep_wait();
  float x[TM][32];
#pragma unroll
  for (int t = 0; t < TM; ++t)
#pragma unroll
    for (int i = 0; i < 32; ++i)
      x[t][i] = valid && t < a.nt ? __ldca(a.x + size_t(t) * a.K + size_t(blk) * H::kElems + H::elem(j, i)) : 0.0f;

  for (int r = r0; r < r1; r += RW) {  // block-uniform: every thread runs every iteration
    if (r + RW < r1) fetch(r + RW, nxt);
    float acc[RW][TM];
#pragma unroll
    for (int p = 0; p < RW; ++p) {
#pragma unroll
      for (int t = 0; t < TM; ++t) acc[p][t] = 0.0f;
      H::template dot<TM>(cur[p], x, acc[p]);
    }
#pragma unroll
    for (int p = 0; p < RW; ++p)
#pragma unroll
      for (int t = 0; t < TM; ++t) {
        const float v = warp_sum(acc[p][t]);
        if (lane == 0) red[warp][(r - r0 + p) % kBatch][t] = v;
      }
    const int next = r + RW;
    if ((next - r0) % kBatch == 0 || next >= r1) {  // the batch is complete: sum over warps in order
      __syncthreads();
      const int b0 = r0 + (r - r0) / kBatch * kBatch, nb = min(next, r1) - b0;
      for (int i = tid; i < nb * a.nt; i += int(blockDim.x)) {
        const int rr = i / a.nt, t = i - rr * a.nt;
        float s = 0.0f;
        for (int w = 0; w < nw; ++w) s += red[w][rr][t];
        if (a.part)
          a.part[(size_t(blockIdx.y) * kPassRows + t) * a.N + b0 + rr] = s;
        else
          a.out[size_t(t) * a.N + b0 + rr] = s;
      }
      __syncthreads();
    }
#pragma unroll
    for (int p = 0; p < RW; ++p) cur[p] = nxt[p];
  }
}

// out[t, n] = Σ over the K chunks, in chunk order, of part[chunk][t][n].
__global__ void hf_chunk_sum_kernel(const float* __restrict__ part, int chunks, int nt, int N, float* __restrict__ out) {
  const long long n = (long long)nt * N;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const int t = int(i / N), c0 = int(i - (long long)t * N);
    float s = 0.0f;
    for (int c = 0; c < chunks; ++c) s += part[(size_t(c) * kPassRows + t) * N + c0];
    out[size_t(t) * N + c0] = s;
  }
}

// Blocks per SM of a kernel instance at `threads` threads, queried once per thread count.
template <DType D, int TM>
int gemv_blocks_per_sm(int threads) {
  static std::atomic<int> cache[kMaxThreads / 32 + 1];
  std::atomic<int>& slot = cache[threads / 32];
  int n = slot.load(std::memory_order_relaxed);
  if (n == 0) {
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, hf_gemv_kernel<D, TM>, threads, 0));
    n = std::max(n, 1);
    slot.store(n, std::memory_order_relaxed);
  }
  return n;
}

// One pass: nt ≤ TM activation rows.
template <DType D, int TM>
void hf_gemv_pass(Ctx& c, const Tensor& w, const float* x, float* out, int nt, int N, int K) {
  using H = HfT<D>;
  const int U = K / 32, chunks = (U + kMaxThreads - 1) / kMaxThreads, uc = (U + chunks - 1) / chunks;
  const int threads = (uc + 31) / 32 * 32;
  const int row_groups = (N + H::kRows - 1) / H::kRows;
  const int gx = std::clamp(dev_info().sms * gemv_blocks_per_sm<D, TM>(threads) / chunks, 1, row_groups);
  Temp<float> part(c, chunks > 1 ? size_t(chunks) * kPassRows * size_t(N) : 0);
  const HfGemvArgs a{static_cast<const uint8_t*>(w.data), w.row_bytes(), x, out, part.get(), N, K, U, uc, nt};
  launch_pdl(hf_gemv_kernel<D, TM>, dim3(unsigned(gx), unsigned(chunks)), dim3(unsigned(threads)), 0, c.stream, a);
  if (chunks > 1) {
    const int blocks = int(std::min<int64_t>(blocks_for(int64_t(nt) * N, 256), int64_t(dev_info().sms) * 8));
    hf_chunk_sum_kernel<<<blocks, 256, 0, c.stream>>>(part.get(), chunks, nt, N, out);
    CUDA_LAUNCH_CHECK();
  }
}

template <DType D>
void hf_gemv(Ctx& c, const Tensor& w, const float* x, float* out, int T, int N, int K) {
  for (int t0 = 0; t0 < T; t0 += kPassRows) {
    const int nt = std::min(kPassRows, T - t0);
    const float* xp = x + size_t(t0) * K;
    float* op = out + size_t(t0) * N;
    if (nt == 1)
      hf_gemv_pass<D, 1>(c, w, xp, op, nt, N, K);
    else if (nt == 2)
      hf_gemv_pass<D, 2>(c, w, xp, op, nt, N, K);
    else
      hf_gemv_pass<D, kPassRows>(c, w, xp, op, nt, N, K);
  }
}

// ================================================================================================
// Dequantization (prefill GEMM slices, embedding rows, MoE experts)
// ================================================================================================

__device__ __forceinline__ void store_run(__nv_bfloat16* o, const float* y, int n) {
#pragma unroll
  for (int k = 0; k < n; k += 8) {
    uint32_t v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const __nv_bfloat162 b = __floats2bfloat162_rn(y[k + 2 * e], y[k + 2 * e + 1]);
      v[e] = *reinterpret_cast<const uint32_t*>(&b);
    }
    *reinterpret_cast<uint4*>(o + k) = make_uint4(v[0], v[1], v[2], v[3]);
  }
}

// Unit j of the block at b, written into o (the block's first output element) in element
// order: W4 as its two 16-element runs, the others as one 32-element run (16-byte aligned).
template <DType D, typename O>
__device__ __forceinline__ void dequant_unit(const uint8_t* b, int j, O* o) {
  using H = HfT<D>;
  typename H::Raw r;
  H::load(b, j, r);
  float y[32];
  H::values(r, y);
  if constexpr (D == DType::W4_G32 || D == DType::W4_G128) {
    store_run(o + H::elem(j, 0), y, 16);
    store_run(o + H::elem(j, 16), y + 16, 16);
  } else {
    float z[32];  // elem(j, i) = 32j + a permutation of 0..31
#pragma unroll
    for (int i = 0; i < 32; ++i) z[H::elem(0, i)] = y[i];
    store_run(o + 32 * j, z, 32);
  }
}

// Rows of out (K each) from rows r0 .. r0 + nrows − 1 of w (or rows[0 .. nrows) when given).
// Unit i (row i / units, unit i % units) fills out[32 i, +32) as a set (a block's units share
// its elements), so a warp's 32 consecutive units (whole blocks: kUnits divides 32) fill 1,024
// consecutive elements: each lane dequantizes its unit into the warp's shared-memory stage
// (32-element slots padded by 16 bytes: a lane's 16-byte stores and the copy-out's reads meet
// no bank twice), and the warp stores the stage with consecutive 16-byte stores, whole sectors.
// (Each lane storing its own 64-byte run, 16 bytes per store instruction and lane, moved
// ~2.1–2.4 TB/s.)
constexpr int kDequantWarps = 8;
template <typename O>
struct Stage {
  static constexpr int kSlot = 32 + 16 / int(sizeof(O));  // elements per padded 32-element slot
  static constexpr int kV = 16 / int(sizeof(O));           // elements per 16-byte chunk
  __device__ static int at(int x) { return x / 32 * kSlot + x % 32; }
  // n (16 or 32) values from warp-relative element x0 (a multiple of 16), rounded to O.
  __device__ static void put(O* st, int x0, const float* y, int n) {
    for (int k = 0; k < n; k += kV) {
      uint4 v;
      if constexpr (std::is_same_v<O, float>) {
        v = make_uint4(__float_as_uint(y[k]), __float_as_uint(y[k + 1]), __float_as_uint(y[k + 2]), __float_as_uint(y[k + 3]));
      } else {
        uint32_t u[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const __nv_bfloat162 h = __floats2bfloat162_rn(y[k + 2 * e], y[k + 2 * e + 1]);
          u[e] = *reinterpret_cast<const uint32_t*>(&h);
        }
        v = make_uint4(u[0], u[1], u[2], u[3]);
      }
      *reinterpret_cast<uint4*>(st + at(x0 + k)) = v;
    }
  }
};

template <DType D, typename O>
__global__ void __launch_bounds__(32 * kDequantWarps)
    hf_dequant_kernel(const uint8_t* __restrict__ w, unsigned long long rb, const int32_t* __restrict__ rows, int r0,
                      int nrows, int K, O* __restrict__ out) {
  using H = HfT<D>;
  using S = Stage<O>;
  static_assert(32 % H::kUnits == 0);
  __shared__ __align__(16) O stage[kDequantWarps][32 * S::kSlot];
  const int units = K / 32, lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
  const long long n = (long long)nrows * units;
  const bool vec = reinterpret_cast<uintptr_t>(out) % 16 == 0;
  O* st = stage[wi];
  for (long long base = (blockIdx.x * (long long)kDequantWarps + wi) * 32; base < n;
       base += (long long)gridDim.x * kDequantWarps * 32) {
    const long long i = base + lane;
    if (i < n) {
      const int r = int(i / units), u = int(i - (long long)r * units), blk = u / H::kUnits, j = u - blk * H::kUnits;
      const long long row = rows ? rows[r] : r0 + r;
      typename H::Raw raw;
      H::load(w + (unsigned long long)row * rb + size_t(blk) * H::kBytes, j, raw);
      float y[32];
      H::values(raw, y);
      const int x0 = 32 * (lane - j);  // the block's first element, warp-relative
      if constexpr (D == DType::W4_G32 || D == DType::W4_G128) {
        S::put(st, x0 + H::elem(j, 0), y, 16);
        S::put(st, x0 + H::elem(j, 16), y + 16, 16);
      } else {
        float z[32];  // elem(j, i) = 32j + a permutation of 0..31
#pragma unroll
        for (int e = 0; e < 32; ++e) z[H::elem(0, e)] = y[e];
        S::put(st, x0 + 32 * j, z, 32);
      }
    }
    __syncwarp();
    const int m = int(32 * (n - base < 32 ? n - base : 32));  // elements of the warp's units
    O* dst = out + 32 * base;
    if (vec) {
      for (int e = S::kV * lane; e < m; e += 32 * S::kV)
        *reinterpret_cast<uint4*>(dst + e) = *reinterpret_cast<const uint4*>(st + S::at(e));
    } else {
      for (int e = lane; e < m; e += 32) dst[e] = st[S::at(e)];
    }
    __syncwarp();
  }
}

template <DType D>
__global__ void hf_dequant_experts_kernel(const void* const* __restrict__ table, int kind0, int nkind,
                                          const int32_t* __restrict__ off, int e0, int ne, int rows, int K,
                                          unsigned long long rb, __nv_bfloat16* __restrict__ scratch) {
  using H = HfT<D>;
  const int units = K / 32;
  const long long per_mat = (long long)rows * units, n = per_mat * nkind * ne;
  const size_t mat_elems = size_t(rows) * K;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const long long m = i / per_mat, ru = i - m * per_mat;
    const int es = int(m / nkind), kind = kind0 + int(m - (long long)es * nkind), e = e0 + es;
    if (off[e + 1] == off[e]) continue;
    const int r = int(ru / units), u = int(ru - (long long)r * units), blk = u / H::kUnits;
    const uint8_t* w = static_cast<const uint8_t*>(table[3 * e + kind]);
    dequant_unit<D>(w + (unsigned long long)r * rb + size_t(blk) * H::kBytes, u - blk * H::kUnits,
                    scratch + (size_t(es) * 3 + size_t(kind)) * mat_elems + size_t(r) * K + size_t(blk) * H::kElems);
  }
}

template <DType D, typename O>
void launch_dequant(Ctx& c, const Tensor& w, const int32_t* rows, int r0, int nrows, O* out) {
  const int K = int(w.cols());
  const int64_t n = int64_t(nrows) * (K / 32);
  if (n == 0) return;
  const int blocks = int(std::min<int64_t>(blocks_for(n, 32 * kDequantWarps), int64_t(dev_info().sms) * 8));
  hf_dequant_kernel<D, O><<<blocks, 32 * kDequantWarps, 0, c.stream>>>(static_cast<const uint8_t*>(w.data), w.row_bytes(), rows, r0,
                                                        nrows, K, out);
  CUDA_LAUNCH_CHECK();
}

// Prefill: bf16 (f32 with exact_matmul) slices of rows, one GEMM each into out's columns.
template <DType D>
void hf_gemm(Ctx& c, const Tensor& w, const float* x, float* out, int T, int N, int K) {
  if constexpr (D == DType::F8_B128) {
    if (!c.exact_matmul && fp8_gemm_takes(w, T)) return fp8_gemm(c, w, x, out, T, N, K);  // cuda_fp8_gemm.cu
  }
  sliced_dequant_gemm(c, x, out, T, N, K, 1,
                      [&](int n0, int ns, auto* dst) { launch_dequant<D>(c, w, nullptr, n0, ns, dst); });
}

}  // namespace

bool hf_quant_supported(DType t) { return dtype_is_hf_block(t); }

void hf_quant_matmul(Ctx& c, const Tensor& w, const float* x, float* out, int T, int N, int K) {
  QWEN36_CHECK(hf_quant_supported(w.dtype), "matmul: weight dtype {} is not a Hugging Face block type",
               dtype_name(w.dtype));
  with_hf_type(w.dtype, [&](auto dt) {
    constexpr DType D = decltype(dt)::value;
    if (T <= 8 && !c.exact_matmul)
      hf_gemv<D>(c, w, x, out, T, N, K);
    else
      hf_gemm<D>(c, w, x, out, T, N, K);
  });
}

bool hf_quant_dequant_rows(Ctx& c, const Tensor& w, int64_t r0, int64_t n, __nv_bfloat16* out) {
  return with_hf_type(w.dtype, [&](auto dt) { launch_dequant<decltype(dt)::value>(c, w, nullptr, int(r0), int(n), out); });
}

void hf_quant_embed_rows(Ctx& c, const Tensor& table, const int32_t* rows, int n, float* out) {
  with_hf_type(table.dtype, [&](auto dt) { launch_dequant<decltype(dt)::value>(c, table, rows, 0, n, out); });
}

void hf_quant_dequant_experts(Ctx& c, DType t, const void* const* table, int kind0, int nkind, const int32_t* off,
                              int e0, int ne, int64_t rows, int64_t K, __nv_bfloat16* scratch) {
  const bool ok = with_hf_type(t, [&](auto dt) {
    constexpr DType D = decltype(dt)::value;
    const int64_t n = int64_t(ne) * nkind * rows * (K / 32);
    if (n == 0) return;
    const int blocks = int(std::min<int64_t>(blocks_for(n, 256), int64_t(dev_info().sms) * 32));
    hf_dequant_experts_kernel<D><<<blocks, 256, 0, c.stream>>>(table, kind0, nkind, off, e0, ne, int(rows), int(K),
                                                              dtype_row_bytes(t, K), scratch);
    CUDA_LAUNCH_CHECK();
  });
  QWEN36_CHECK(ok, "moe_experts: weight dtype {} is not a Hugging Face block type", dtype_name(t));
}

}  // namespace qwen36::cuda
