// EXPERIMENT (a test hook, not called by the backend): the multi-token GEMM's bf16 form on
// Hopper's warpgroup MMA. out[T, N] = x[T, K] · w[N, K]ᵀ for Q4_K / Q6_K tiles at T ≤ 64.
//
// Why: the 17-64-token GEMMs (cuda_quant_mma_half.cuh) are bound by the activations' B fragments
// that every warp reads from L2 on its own (bench/RESULTS.md, session 53's ncu: a 24-token Q6_K
// down projection read 303 MB from L2 for 74 MB of weights). Here a block is one warpgroup of 4
// warps on 4 consecutive row-tiles (64 rows) at the same super-block: each warp turns its tile
// into bf16 A fragments in registers exactly as the bf16 form does (half_table, half_group), and
// one wgmma.mma_async m64nNk16 per 16 k reads the super-block's activations once per block from
// shared memory — staged there by cp.async from a copy of x already laid out as the MMA wants it
// (stage_x_kernel), a ring of slabs, one per super-block. A row-group whose super-blocks are
// few against the SMs is split along K (`splits` blocks), the pieces summed in split order by a
// second kernel or by the row-group's last block to arrive (kWgmmaLastBlockSums). Same numerics as the bf16 form: the weights and x rounded to bf16 once, f32 sums.
//
// Measured (bench/RESULTS.md, session 63; the 27B's matrices, cold L2): 1.12-1.38× faster than the
// dispatch's forms at 64 tokens, about even at 24-32 (the GEMM kernel alone 12-32% faster: the
// staging and sum launches are the experiment's), 0.73-0.98× at 4-16 (the last-block sums came
// after and have not run yet). What taking it into the dispatch for 24-64 tokens needs beyond them:
// the producers writing the slabs, stacked matrices, the backend's stream and PDL.
//
// Shared-memory layout of a slab (one super-block, tokens padded to NP = 8 · NG): 16 k16 steps,
// each NG × 2 core matrices of 8 tokens × 8 k (128 bytes, a token's 8 bf16 contiguous: K-major,
// no swizzle): core matrix (ng, kh) of step q at (q · NG + ng) · 256 + kh · 128. The A fragments'
// k order (cuda_quant_mma_half.cuh: a lane's slots 2t, 2t + 1 are the tile's k 4t, 4t + 2, slots
// 2t + 8, 2t + 9 its k 4t + 1, 4t + 3) makes logical k 0-7 of a 16-step the even k, 8-15 the odd
// ones: core matrix kh holds k 2e + kh, e = 0..7, of its 16.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_ops.cuh"
#include "backend/cuda/cuda_quant_mma_half.cuh"
#include "backend/cuda/cuda_sm80.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QWEN36_WGMMA_DEVICE 1
#endif

namespace qwen36::cuda {
namespace {

constexpr int kWarps = 4;  // one warpgroup

// x [T, K] f32 → slabs of bf16 (the layout in this file's header). A thread writes one core-matrix
// row: 8 k of one token (tokens past T as zeros).
__global__ void stage_x_kernel(const float* __restrict__ x, int T, int K, int NP, uint4* __restrict__ xs) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t total = int64_t(K / 256) * 16 * NP * 2;
  if (i >= total) return;
  const int kh = int(i & 1);
  int64_t r = i >> 1;
  const int n = int(r % NP);
  r /= NP;
  const int q = int(r % 16);
  const int64_t s = r / 16;
  const int64_t k0 = 256 * s + 16 * q + kh;
  uint32_t v[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float a = n < T ? x[int64_t(n) * K + k0 + 4 * e] : 0.0f;
    const float b = n < T ? x[int64_t(n) * K + k0 + 4 * e + 2] : 0.0f;
    v[e] = bf2_bits(__floats2bfloat162_rn(a, b));
  }
  const int NG = NP / 8;
  const int64_t at = ((s * 16 + q) * NG + (n >> 3)) * 16 + kh * 8 + (n & 7);  // in uint4
  xs[at] = make_uint4(v[0], v[1], v[2], v[3]);
}

// The pieces of a split row-group summed in split order.
__global__ void sum_splits_kernel(const float* __restrict__ part, int splits, int64_t n, float* __restrict__ out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float s = 0.0f;
  for (int p = 0; p < splits; ++p) s += part[int64_t(p) * n + i];
  out[i] = s;
}

#ifdef QWEN36_WGMMA_DEVICE
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFFu) >> 4) | uint64_t((lbo & 0x3FFFFu) >> 4) << 16 |
         uint64_t((sbo & 0x3FFFFu) >> 4) << 32;  // no swizzle, base offset 0
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void keep(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
__device__ __forceinline__ void keep(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// acc[NP / 2] += A (registers a[0..3]: the m16n8k16 A fragment of the warp's 16 rows) · B (desc).
template <int NP>
__device__ __forceinline__ void wgmma_bf16(float (&d)[NP / 2], const uint32_t* a, uint64_t desc);

// The register-A form: d, a, b-desc, scale-d (a predicate: 1, D += A·B), scale-a, scale-b,
// trans-b (0: B K-major).
#define QWEN36_WG_HEAD(N, P) "{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 "
#define QWEN36_WG_TAIL ", p, 1, 1, 0;\n}\n"
template <>
__device__ __forceinline__ void wgmma_bf16<8>(float (&d)[4], const uint32_t* a, uint64_t desc) {
  asm volatile(QWEN36_WG_HEAD(8, 9) "{%0,%1,%2,%3}, {%4,%5,%6,%7}, %8" QWEN36_WG_TAIL
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_bf16<16>(float (&d)[8], const uint32_t* a, uint64_t desc) {
  asm volatile(QWEN36_WG_HEAD(16, 13) "{%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12" QWEN36_WG_TAIL
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_bf16<24>(float (&d)[12], const uint32_t* a, uint64_t desc) {
  asm volatile(QWEN36_WG_HEAD(24, 17) "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11}, {%12,%13,%14,%15}, %16" QWEN36_WG_TAIL
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_bf16<32>(float (&d)[16], const uint32_t* a, uint64_t desc) {
  asm volatile(QWEN36_WG_HEAD(32, 21) "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20"
                   QWEN36_WG_TAIL
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_bf16<64>(float (&d)[32], const uint32_t* a, uint64_t desc) {
  asm volatile(QWEN36_WG_HEAD(64, 37) "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                                  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                                  "{%32,%33,%34,%35}, %36" QWEN36_WG_TAIL
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
#undef QWEN36_WG_HEAD
#undef QWEN36_WG_TAIL
#endif  // QWEN36_WGMMA_DEVICE

template <int NP>
__host__ __device__ constexpr int slab_bytes() {
  return 512 * NP;  // 256 k × NP tokens × 2 bytes
}
// Ring depth: slabs (and with RING, the 4 warps' tiles) of this many super-blocks.
template <int NP, bool RING>
__host__ __device__ constexpr int stages() {
  if constexpr (!RING) return NP <= 32 ? 3 : 2;
  return NP <= 16 ? 4 : NP <= 32 ? 3 : 2;
}
template <DType D, int NP, bool RING>
__host__ __device__ constexpr int wgmma_smem() {
  return stages<NP, RING>() * (slab_bytes<NP>() + (RING ? kWarps * TileLayout<D>::kBytes : 0)) +
         kWarps * 16 * kTabStride * int(sizeof(float2));
}

// Block b: row-tiles 4 · (b / splits) + warp, super-blocks [S · p / splits, S · (p + 1) / splits)
// of split p = b % splits. out (splits == 1) or part[p] gets the block's [T, 64] piece.
// RING = false: each warp holds its next tile in registers (requested one super-block ahead);
// true: the 4 warps' tiles come through shared memory with the slabs, stages − 1 super-blocks
// ahead (cp.async, one group per super-block: the slab and the 4 tiles).
template <DType D, int NP, bool RING>
__global__ void __launch_bounds__(128) wgmma_gemm_kernel(const uint8_t* __restrict__ w, int S,
                                                         const uint4* __restrict__ xs, float* __restrict__ out,
                                                         float* __restrict__ part, int* __restrict__ cnt, int T, int N,
                                                         int splits, uint32_t lbo, uint32_t sbo) {
#ifdef QWEN36_WGMMA_DEVICE
  constexpr int kSlab = slab_bytes<NP>(), kStages = stages<NP, RING>(), kTile = TileLayout<D>::kBytes;
  constexpr int kStep = NP / 8 * 256;  // bytes of one k16 step's core matrices
  extern __shared__ __align__(128) uint8_t smem[];
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  uint8_t* const tiles = smem + kStages * kSlab;  // RING: [stage][warp] tiles
  float2* tab = reinterpret_cast<float2*>(tiles + (RING ? kStages * kWarps * kTile : 0)) + warp * 16 * kTabStride;
  const int rg = int(blockIdx.x) / splits, p = int(blockIdx.x) % splits;
  const int s0 = int(int64_t(S) * p / splits), s1 = int(int64_t(S) * (p + 1) / splits);
  const uint8_t* wt = w + (size_t(4 * rg + warp) * size_t(S)) * kTile;
  const uint8_t* xsb = reinterpret_cast<const uint8_t*>(xs);
  auto slot = [&](int s) { return (s - s0) % kStages; };

  auto stage = [&](int s) {  // super-block s into its ring slot: the slab by every thread (16 B
                             // chunks), with RING the warp's tile by its lanes
    uint8_t* dst = smem + slot(s) * kSlab;
    const uint8_t* src = xsb + size_t(s) * kSlab;
#pragma unroll
    for (int c = 0; c < kSlab / 2048; ++c) cp_async16(dst + 16 * (int(threadIdx.x) + 128 * c), src + 16 * (int(threadIdx.x) + 128 * c));
    if constexpr (RING)
      issue_tile<kTile>(smem_addr(tiles + (slot(s) * kWarps + warp) * kTile) + 16 * lane, wt + size_t(s) * kTile + 16 * lane,
                        lane);
  };

  float acc[NP / 2];
#pragma unroll
  for (int i = 0; i < NP / 2; ++i) acc[i] = 0.0f;

  Raw<D> cur, nxt;
  if constexpr (!RING) load_tile<D, true>(wt + size_t(s0) * kTile, lane, cur);
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (s0 + i < s1) stage(s0 + i);
    cp_async_commit();
  }
  for (int s = s0; s < s1; ++s) {
    cp_async_wait<kStages - 2>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // cp.async's writes, then wgmma's reads
    __syncthreads();  // super-block s complete for every thread; every warp done with s - 1's slot
    if (s + kStages - 1 < s1) stage(s + kStages - 1);
    cp_async_commit();
    if constexpr (RING)
      load_tile<D, false>(tiles + (slot(s) * kWarps + warp) * kTile, lane, cur);
    else if (s + 1 < s1)
      load_tile<D, true>(wt + size_t(s + 1) * kTile, lane, nxt);
    half_table(cur, lane, tab);
    const uint32_t base = smem_addr(smem + slot(s) * kSlab);
    uint32_t a[2][8];
    half_group(cur, 0, g, tab, a[0]);
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
      uint32_t(&f)[8] = a[jj & 1];
#pragma unroll
      for (int i = 0; i < NP / 2; ++i) keep(acc[i]);
      wg_fence();
      wgmma_bf16<NP>(acc, f, smem_desc(base + (2 * jj) * kStep, lbo, sbo));
      wgmma_bf16<NP>(acc, f + 4, smem_desc(base + (2 * jj + 1) * kStep, lbo, sbo));
      wg_commit();
      if (jj < 7) {
        wg_wait<1>();  // group jj - 1 done: its registers, a[(jj + 1) & 1], are free
        half_group(cur, jj + 1, g, tab, a[(jj + 1) & 1]);
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) keep(f[i]);
    }
    wg_wait<0>();  // the slot may be refilled after the next barrier
#pragma unroll
    for (int i = 0; i < NP / 2; ++i) keep(acc[i]);
    if constexpr (!RING) cur = nxt;
  }
  cp_async_wait_all();

  // acc[4i + e]: row g (e < 2) or g + 8, token 8i + 2t + (e & 1), of the warp's 16 rows.
  float* dst = splits == 1 ? out : part + int64_t(p) * T * N;
  const int row = 64 * rg + 16 * warp + g;
#pragma unroll
  for (int i = 0; i < NP / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int tok = 8 * i + 2 * t + (e & 1);
      if (tok < T) dst[int64_t(tok) * N + row + 8 * (e >> 1)] = acc[4 * i + e];
    }
  if (splits == 1 || cnt == nullptr) return;  // no pieces, or summed by sum_splits_kernel
  // The last block of the row-group to arrive sums its pieces in split order (as sum_splits_kernel).
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) last = atomic_add_acq_rel(cnt + rg, 1) == splits - 1;
  __syncthreads();
  if (!last) return;
  for (int e = int(threadIdx.x); e < 64 * T; e += 128) {
    const int64_t at = int64_t(e >> 6) * N + 64 * rg + (e & 63);
    float v = 0.0f;
    for (int q = 0; q < splits; ++q) v += __ldcg(part + int64_t(q) * T * N + at);
    out[at] = v;
  }
  if (threadIdx.x == 0) cnt[rg] = 0;  // for the next call
#else
  (void)w, (void)S, (void)xs, (void)out, (void)part, (void)cnt, (void)T, (void)N, (void)splits, (void)lbo, (void)sbo;
  __trap();
#endif
}

struct Call {
  const Tensor& w;
  const uint4* xs;
  float *out, *part;
  int* cnt;  // nullptr: the pieces are summed by sum_splits_kernel
  int T, splits;
  uint32_t lbo, sbo;
};

template <DType D, int NP, bool RING>
void launch(const Call& c) {
  const int N = int(c.w.rows()), S = int(c.w.cols() / 256);
  constexpr int smem = wgmma_smem<D, NP, RING>();
  CUDA_CHECK(cudaFuncSetAttribute(wgmma_gemm_kernel<D, NP, RING>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  wgmma_gemm_kernel<D, NP, RING><<<(N / 64) * c.splits, 128, smem>>>(static_cast<const uint8_t*>(c.w.data), S, c.xs,
                                                                      c.out, c.part, c.cnt, c.T, N, c.splits, c.lbo,
                                                                      c.sbo);
  CUDA_LAUNCH_CHECK();
}

template <DType D, bool RING>
void launch_np(int NP, const Call& c) {
  switch (NP) {
    case 8: return launch<D, 8, RING>(c);
    case 16: return launch<D, 16, RING>(c);
    case 24: return launch<D, 24, RING>(c);
    case 32: return launch<D, 32, RING>(c);
    default: return launch<D, 64, RING>(c);
  }
}

// A buffer kept for the hook's calls (grown, never freed: a test hook).
void* scratch(int i, size_t bytes) {
  static void* p[3] = {nullptr, nullptr, nullptr};
  static size_t have[3] = {0, 0, 0};
  if (have[i] < bytes) {
    if (p[i]) CUDA_CHECK(cudaFree(p[i]));
    CUDA_CHECK(cudaMalloc(&p[i], bytes));
    CUDA_CHECK(cudaMemset(p[i], 0, bytes));  // the arrival counters start at zero
    have[i] = bytes;
  }
  return p[i];
}

// Whether the current device is sm_90 (the kernels' wgmma path), asked once per device.
bool sm90_device() {
  static int cache[16];  // 0 unknown, 1 yes, 2 no
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  int& c = cache[dev & 15];
  if (c == 0) {
    int major = 0, minor = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    c = major == 9 && minor == 0 ? 1 : 2;
  }
  return c == 1;
}

}  // namespace

// Test hook (tests/gpu/test_cuda_quant_mma_half.cpp's Wgmma*): out = x · wᵀ for a tiled Q4_K / Q6_K matrix w
// whose rows are a multiple of 64, T ≤ 64, on the legacy default stream. splits ≤ 0: picked so
// that the blocks fill the SMs about 4 times. lbo / sbo: the descriptors' byte offsets between
// core matrices adjacent along K and along N (128 and 256 by the PTX ISA's reading; a test may
// try the other). flags: kWgmmaRing, the tiles through shared memory (else registers); for timing
// the GEMM kernel alone, kWgmmaReuseX (x as the previous call of the same T and K staged it) and
// kWgmmaNoSum (split pieces left unsummed: out is incomplete); kWgmmaLastBlockSums: a split
// row-group's pieces summed by its last block to arrive instead of a second kernel. Returns the
// splits used, or 0 where the device cannot run it (not sm_90).
constexpr int kWgmmaRing = 1, kWgmmaReuseX = 2, kWgmmaNoSum = 4, kWgmmaLastBlockSums = 8;
int wgmma_matmul_experiment(const Tensor& x, const Tensor& w, Tensor& out, int splits, uint32_t lbo, uint32_t sbo,
                            int flags) {
  const bool ring = flags & kWgmmaRing, restage = !(flags & kWgmmaReuseX), sum = !(flags & kWgmmaNoSum);
  const bool last_sums = sum && (flags & kWgmmaLastBlockSums);
  if (!sm90_device()) return 0;
  if (w.dtype != DType::Q4_K_T16 && w.dtype != DType::Q6_K_T16) fail("wgmma experiment: Q4_K / Q6_K tiles only");
  const int T = int(x.rows()), K = int(x.cols()), N = int(w.rows()), S = K / 256;
  if (T < 1 || T > 64 || N % 64 != 0 || K % 256 != 0 || w.cols() != K) fail("wgmma experiment: unsupported shape");
  const int NP = T <= 8 ? 8 : T <= 16 ? 16 : T <= 24 ? 24 : T <= 32 ? 32 : 64;
  if (splits <= 0) splits = std::clamp((4 * dev_info().sms + N / 64 - 1) / (N / 64), 1, std::max(1, S / 2));
  const size_t xs_bytes = size_t(S) * size_t(512 * NP);
  uint4* xs = static_cast<uint4*>(scratch(0, xs_bytes));
  float* part = splits > 1 ? static_cast<float*>(scratch(1, size_t(splits) * T * N * sizeof(float))) : nullptr;
  const int64_t rows = int64_t(S) * 16 * NP * 2;
  if (restage) {
    stage_x_kernel<<<unsigned((rows + 255) / 256), 256>>>(x.as<const float>(), T, K, NP, xs);
    CUDA_LAUNCH_CHECK();
  }
  int* cnt = last_sums && splits > 1 ? static_cast<int*>(scratch(2, size_t(N / 64) * sizeof(int))) : nullptr;
  const Call c{w, xs, out.as<float>(), part, cnt, T, splits, lbo, sbo};
  if (w.dtype == DType::Q4_K_T16)
    ring ? launch_np<DType::Q4_K_T16, true>(NP, c) : launch_np<DType::Q4_K_T16, false>(NP, c);
  else
    ring ? launch_np<DType::Q6_K_T16, true>(NP, c) : launch_np<DType::Q6_K_T16, false>(NP, c);
  if (splits > 1 && sum && !last_sums) {
    const int64_t n = int64_t(T) * N;
    sum_splits_kernel<<<unsigned((n + 255) / 256), 256>>>(part, splits, n, out.as<float>());
    CUDA_LAUNCH_CHECK();
  }
  return splits;
}

}  // namespace qwen36::cuda
