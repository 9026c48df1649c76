// The multi-token GEMM's bf16 form on Hopper's warpgroup MMA: out[T, N] = x[T, K] · w[N, K]ᵀ for
// Q4_K / Q6_K tiles at 17-64 tokens (the dispatch, cuda_quant_mma.cu, where QWEN36_MMA_WG takes it on
// an sm_90a build and device), and the test hook that measured it first (wgmma_matmul_experiment).
//
// Why: the 17-64-token GEMMs (cuda_quant_mma_half.cuh) are bound by the activations' B fragments
// that every warp reads from L2 on its own (bench/RESULTS.md, session 53's ncu: a 24-token Q6_K
// down projection read 303 MB from L2 for 74 MB of weights). Here a block is one warpgroup of 4
// warps on 4 consecutive row-tiles (64 rows) at the same super-block: each warp turns its tile
// into bf16 A fragments in registers exactly as the bf16 form does (half_table, half_group), and
// one wgmma.mma_async m64nNk16 per 16 k reads the super-block's activations once per block from
// shared memory — staged there by cp.async from x already laid out as the MMA wants it (slabs:
// written by the activations' producers, store_act_half with ActLayout::np; by stage_x_kernel for
// the hook), a ring of slabs, one per super-block. A group of row-tiles whose super-blocks are few
// against the SMs is split along K (`splits` blocks, wg_splits), the pieces summed in split order
// by the group's last block to arrive (or, in the hook, by a second kernel). Same numerics as the
// bf16 form: the weights and x rounded to bf16 once, f32 sums (in another order).
//
// Measured as the hook (bench/RESULTS.md, session 63; the 27B's matrices, cold L2, with x staged
// and the pieces summed by launches of their own): 1.12-1.38× faster than the dispatch's forms at
// 64 tokens, about even at 24-32 (the GEMM kernel alone 12-32% faster), 0.73-0.98× at 4-16. The
// dispatch's form pays neither extra launch; in the model it is the default on rows of ≥ 16
// super-blocks (QWEN36_MMA_WG, below).
//
// Shared-memory layout of a slab (one super-block, tokens padded to NP = 8 · NG): 16 k16 steps,
// each NG × 2 core matrices of 8 tokens × 8 k (128 bytes, a token's 8 bf16 contiguous: K-major,
// no swizzle): core matrix (ng, kh) of step q at (q · NG + ng) · 256 + kh · 128. The A fragments'
// k order (cuda_quant_mma_half.cuh: a lane's slots 2t, 2t + 1 are the tile's k 4t, 4t + 2, slots
// 2t + 8, 2t + 9 its k 4t + 1, 4t + 3) makes logical k 0-7 of a 16-step the even k, 8-15 the odd
// ones: core matrix kh holds k 2e + kh, e = 0..7, of its 16. In global memory the slabs of a row
// follow one another (S · 512 · NP bytes).
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_ops.cuh"
#include "backend/cuda/cuda_quant_mma_half.cuh"
#include "backend/cuda/cuda_quant_wgmma.cuh"
#include "backend/cuda/cuda_sm80.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QWEN36_WGMMA_DEVICE 1
#endif

namespace qwen36::cuda {
namespace {

constexpr int kWarps = 4;  // one warpgroup

// x [T, K] f32 → slabs of bf16 (the layout in this file's header), for the hook. A thread writes
// one core-matrix row: 8 k of one token (tokens past T as zeros).
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

// The pieces of a split row-group summed in split order (the hook's second kernel).
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
__device__ __forceinline__ void wgmma_bf16<48>(float (&d)[24], const uint32_t* a, uint64_t desc) {
  asm volatile(QWEN36_WG_HEAD(48, 29) "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                                  "%16,%17,%18,%19,%20,%21,%22,%23}, {%24,%25,%26,%27}, %28" QWEN36_WG_TAIL
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
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

// Column 0 of row-tile r in its matrix's output, and that output's row stride (compile-time
// indices: a runtime one would copy the arguments to local memory).
__device__ __forceinline__ float* wg_out(const WgArgs& a, int r, int& n) {
  float* o = a.out[0];
  int r0 = 0;
  n = a.n[0];
#pragma unroll
  for (int m = 1; m < 4; ++m)
    if (m < a.nmat && r >= a.rt_end[m - 1]) o = a.out[m], r0 = a.rt_end[m - 1], n = a.n[m];
  return o + 16 * (r - r0);
}
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

// Block b: row-tiles 4 · (b / splits) + warp (a warp past the last row-tile computes the last
// one's again and stores nothing: the MMA takes the whole warpgroup), super-blocks
// [S · p / splits, S · (p + 1) / splits) of split p = b % splits. With splits == 1 the block
// writes out; else its [T, 64] piece goes to part[p] and the group's last block to arrive sums the
// pieces in split order into out (without cnt the pieces stay in part).
// RING = false: each warp holds its next tile in registers (requested one super-block ahead; the
// first before griddep_wait: the weights depend on no kernel); true (the hook only): the 4 warps'
// tiles come through shared memory with the slabs, stages − 1 super-blocks ahead (cp.async, one
// group per super-block: the slab and the 4 tiles).
template <DType D, int NP, bool RING>
__global__ void __launch_bounds__(128) wgmma_gemm_kernel(const WgArgs a) {
#ifdef QWEN36_WGMMA_DEVICE
  constexpr int kSlab = slab_bytes<NP>(), kStages = stages<NP, RING>(), kTile = TileLayout<D>::kBytes;
  constexpr int kStep = NP / 8 * 256;  // bytes of one k16 step's core matrices
  extern __shared__ __align__(128) uint8_t smem[];
  griddep_trigger();
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  const int S = a.S, T = a.T, splits = a.splits;
  uint8_t* const tiles = smem + kStages * kSlab;  // RING: [stage][warp] tiles
  float2* tab = reinterpret_cast<float2*>(tiles + (RING ? kStages * kWarps * kTile : 0)) + warp * 16 * kTabStride;
  const int rg = int(blockIdx.x) / splits, p = int(blockIdx.x) % splits;
  const int r = 4 * rg + warp;
  const bool live = r < a.rt;
  const int s0 = int(int64_t(S) * p / splits), s1 = int(int64_t(S) * (p + 1) / splits);
  const uint8_t* wt = a.w + (size_t(live ? r : a.rt - 1) * size_t(S)) * kTile;
  const uint8_t* xsb = reinterpret_cast<const uint8_t*>(a.xs);
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
  griddep_wait();  // the slabs (and this call's pieces and counters) come after the kernel before
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
    uint32_t af[2][8];
    half_group(cur, 0, g, tab, af[0]);
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
      uint32_t(&f)[8] = af[jj & 1];
#pragma unroll
      for (int i = 0; i < NP / 2; ++i) keep(acc[i]);
      wg_fence();
      wgmma_bf16<NP>(acc, f, smem_desc(base + (2 * jj) * kStep, a.lbo, a.sbo));
      wgmma_bf16<NP>(acc, f + 4, smem_desc(base + (2 * jj + 1) * kStep, a.lbo, a.sbo));
      wg_commit();
      if (jj < 7) {
        wg_wait<1>();  // group jj - 1 done: its registers, af[(jj + 1) & 1], are free
        half_group(cur, jj + 1, g, tab, af[(jj + 1) & 1]);
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
  int n = 0;
  float* dst = nullptr;
  int64_t stride = 0;
  if (splits == 1) {
    dst = wg_out(a, live ? r : 0, n), stride = n;
  } else {
    stride = int64_t(16) * a.rt;
    dst = a.part + int64_t(p) * T * stride + 16 * r;
  }
  if (live) {
#pragma unroll
    for (int i = 0; i < NP / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tok = 8 * i + 2 * t + (e & 1);
        if (tok < T) dst[int64_t(tok) * stride + g + 8 * (e >> 1)] = acc[4 * i + e];
      }
  }
  if (splits == 1 || a.cnt == nullptr) return;  // no pieces, or left for the caller
  // The last block of the group to arrive sums its pieces in split order, each warp its row-tile's.
  __shared__ int last;
  __syncthreads();  // every warp's pieces written before thread 0's release
  if (threadIdx.x == 0) last = atomic_add_acq_rel(a.cnt + rg, 1) == splits - 1;
  __syncthreads();  // thread 0's acquire before every thread's reads of the pieces
  if (!last) return;
  if (live) {
    float* o = wg_out(a, r, n);
    for (int e = lane; e < 16 * T; e += 32) {
      const int tok = e >> 4, row = e & 15;
      const float* src = a.part + int64_t(tok) * stride + 16 * r + row;
      float v = 0.0f;
      for (int q = 0; q < splits; ++q) v += __ldcg(src + int64_t(q) * T * stride);
      o[int64_t(tok) * n + row] = v;
    }
  }
  if (threadIdx.x == 0) a.cnt[rg] = 0;  // for the next launch (which reads it after its griddep_wait)
#else
  (void)a;
  __trap();
#endif
}

// pdl: launch_pdl (the dispatch, on the backend's stream); else a plain launch (the hook, on the
// legacy default stream, as it was measured).
template <DType D, int NP, bool RING>
void launch(cudaStream_t stream, bool pdl, const WgArgs& a) {
  constexpr int smem = wgmma_smem<D, NP, RING>();
  auto* kern = wgmma_gemm_kernel<D, NP, RING>;
  static std::atomic<uint64_t> done{0};
  once_per_device(done, [&] { CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem)); });
  const dim3 grid(unsigned((a.rt + 3) / 4 * a.splits));
  if (pdl) {
    launch_pdl(kern, grid, dim3(128), size_t(smem), stream, a);
  } else {
    kern<<<grid, 128, smem, stream>>>(a);
    CUDA_LAUNCH_CHECK();
  }
}

template <DType D, bool RING>
void launch_np(cudaStream_t stream, bool pdl, const WgArgs& a) {
  switch (a.np) {
    case 8: return launch<D, 8, RING>(stream, pdl, a);
    case 16: return launch<D, 16, RING>(stream, pdl, a);
    case 24: return launch<D, 24, RING>(stream, pdl, a);
    case 32: return launch<D, 32, RING>(stream, pdl, a);
    case 48: return launch<D, 48, RING>(stream, pdl, a);
    case 64: return launch<D, 64, RING>(stream, pdl, a);
    default: fail("wgmma: no kernel for slabs of {} tokens", a.np);
  }
}

void launch_any(cudaStream_t stream, bool pdl, DType t, bool ring, const WgArgs& a) {
  if (t == DType::Q4_K_T16)
    ring ? launch_np<DType::Q4_K_T16, true>(stream, pdl, a) : launch_np<DType::Q4_K_T16, false>(stream, pdl, a);
  else if (t == DType::Q6_K_T16)
    ring ? launch_np<DType::Q6_K_T16, true>(stream, pdl, a) : launch_np<DType::Q6_K_T16, false>(stream, pdl, a);
  else
    fail("wgmma: Q4_K / Q6_K tiles only, not {}", dtype_name(t));
}

// Slab tokens for T: the kernels' instantiations (T ≤ 8 and ≤ 16 for the hook only).
int slab_tokens_for(int64_t T) { return T <= 8 ? 8 : T <= 16 ? 16 : T <= 24 ? 24 : T <= 32 ? 32 : T <= 48 ? 48 : 64; }

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

// The build has the kernels' sm_90a code (CMake defines QWEN36_SM90A_BUILT where
// CMAKE_CUDA_ARCHITECTURES names 90a; without it they would trap).
#ifdef QWEN36_SM90A_BUILT
constexpr bool kBuilt = true;
#else
constexpr bool kBuilt = false;
#endif

// QWEN36_MMA_WG = on | off | auto (unset: auto): Q4_K and Q6_K tiles at 17-64 tokens on the
// warpgroup form, or the bf16 / int8 forms (hb_form), or the form on rows of ≥ 16 super-blocks
// only, where it measured faster in the model (H100, bench/RESULTS.md sessions 64-65, against the
// bf16 form: 27B Q4_K_M tg32 +4.7% at 17 tokens, +4.5% at 24, +1.0% at 32, +22.8% at 48, +13.5% at
// 64; the 35B-A3B's K = 2048 rows lost 1-2%, its K = 4096 ones are even). Cold-L2 timing alone had
// the 27B's K = 5120 matrices slower at 17-32 tokens; inside the model's step (warm L2, launches
// overlapping) they gain, so the rule follows the model. No H200 has run it yet.
std::atomic<int> g_wg{-1};
int wg_mode() { return variant(g_wg, "QWEN36_MMA_WG", "on", "off"); }  // kFirstForm: on, kSecondForm: off
std::atomic<long long> g_wg_launches{0};
// QWEN36_MMA_WG_SPLITS = N (1-64; unset or 0: wg_splits' rule), read once (−1: not yet).
std::atomic<int> g_wg_splits{-1};
int forced_splits() {
  int v = g_wg_splits.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* e = std::getenv("QWEN36_MMA_WG_SPLITS");
    v = e && *e ? std::clamp(std::atoi(e), 0, 64) : 0;
    g_wg_splits.store(v, std::memory_order_relaxed);
  }
  return v;
}
constexpr int64_t kAutoMinS = 16;  // super-blocks a row

}  // namespace

int wg_slab_tokens(int64_t T, int64_t K) {
  if (!kBuilt || T < 17 || T > 64) return 0;
  const int mode = wg_mode();
  if (mode == kSecondForm || !sm90_device()) return 0;
  if (mode == kAutoForm && K / 256 < kAutoMinS) return 0;
  return slab_tokens_for(T);
}

// H100, session 64 (the dispatch's form, best of splits 1, 2, 4, 8 on the 27B's matrices, cold L2;
// session 63's hook figures alike): groups of 4 row-tiles few against the SMs (5120 rows: 80
// groups) best at 8, 160-272 groups at 4 (a few waves of blocks: the splits even out the last
// one), but none where the groups alone fill the SMs twice past 32 tokens (17408 rows: 272; the
// pieces' traffic, splits · T · N floats written and read, grows against the weights') or 4
// times at 17-32 (34816 rows: 544). The pieces stay within 32 MB, a piece keeps ≥ 2 super-blocks.
int wg_splits(int rt, int S, int T) {
  if (const int forced = forced_splits(); forced > 0) return std::clamp(forced, 1, std::max(S, 1));
  const int groups = (rt + 3) / 4, sms = dev_info().sms;
  int splits = groups >= (T > 32 ? 2 : 4) * sms ? 1 : 4 * groups < 3 * sms ? 8 : 4;
  while (splits > 1 && size_t(splits) * size_t(T) * 16 * size_t(rt) * sizeof(float) > (size_t(32) << 20)) splits /= 2;
  return std::max(1, std::min(splits, S / 2));
}

void launch_wgmma(Ctx& c, DType t, const WgArgs& a) {
  QWEN36_CHECK(a.rt >= 1 && a.S >= 1 && a.T >= 1 && a.T <= a.np && a.splits >= 1 && a.splits <= a.S &&
                   (a.splits == 1 || (a.part && a.cnt)),
               "wgmma: {} row-tiles of {} super-blocks, T = {} in slabs of {}, {} splits", a.rt, a.S, a.T, a.np, a.splits);
  g_wg_launches.fetch_add(1, std::memory_order_relaxed);
  launch_any(c.stream, true, t, false, a);
}

// Test hooks (test_cuda_quant_mma_half.cpp): QWEN36_MMA_WG as "on" | "off" | "auto" (nullptr reads
// the environment again), and the form's launches so far.
void mma_select_wg(const char* wg) { g_wg.store(wg ? parse_variant(wg, "on", "off") : -1); }
long long mma_wg_launches() { return g_wg_launches.load(); }
// The same for QWEN36_MMA_WG_SPLITS (n ≥ 1 forces n splits, capped by the super-blocks; 0 the
// rule; −1 reads the environment again).
void mma_wg_force_splits(int n) { g_wg_splits.store(n >= 0 ? std::min(n, 64) : -1); }

namespace {
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
}  // namespace

// Test hook (tests/gpu/test_cuda_quant_mma_half.cpp's Wgmma*): out = x · wᵀ for a tiled Q4_K / Q6_K matrix w
// whose rows are a multiple of 16, T ≤ 64, on the legacy default stream. splits ≤ 0: picked so
// that the blocks fill the SMs about 4 times. lbo / sbo: the descriptors' byte offsets between
// core matrices adjacent along K and along N (128 and 256 by the PTX ISA's reading; a test may
// try the other). flags: kWgmmaRing, the tiles through shared memory (else registers); for timing
// the GEMM kernel alone, kWgmmaReuseX (x as the previous call of the same T and K staged it) and
// kWgmmaNoSum (split pieces left unsummed: out is incomplete); kWgmmaLastBlockSums: a split
// row-group's pieces summed by its last block to arrive instead of a second kernel. Returns the
// splits used, or 0 where the device or the build cannot run it (not sm_90 / sm_90a).
constexpr int kWgmmaRing = 1, kWgmmaReuseX = 2, kWgmmaNoSum = 4, kWgmmaLastBlockSums = 8;
int wgmma_matmul_experiment(const Tensor& x, const Tensor& w, Tensor& out, int splits, uint32_t lbo, uint32_t sbo,
                            int flags) {
  const bool ring = flags & kWgmmaRing, restage = !(flags & kWgmmaReuseX), sum = !(flags & kWgmmaNoSum);
  const bool last_sums = sum && (flags & kWgmmaLastBlockSums);
  if (!kBuilt || !sm90_device()) return 0;
  if (w.dtype != DType::Q4_K_T16 && w.dtype != DType::Q6_K_T16) fail("wgmma experiment: Q4_K / Q6_K tiles only");
  const int T = int(x.rows()), K = int(x.cols()), N = int(w.rows()), S = K / 256;
  if (T < 1 || T > 64 || N % 16 != 0 || K % 256 != 0 || w.cols() != K) fail("wgmma experiment: unsupported shape");
  const int NP = slab_tokens_for(T), rt = N / 16;
  if (splits <= 0) splits = std::clamp((4 * dev_info().sms + rt / 4 - 1) / std::max(rt / 4, 1), 1, std::max(1, S / 2));
  const size_t xs_bytes = size_t(S) * size_t(512 * NP);
  uint4* xs = static_cast<uint4*>(scratch(0, xs_bytes));
  float* part = splits > 1 ? static_cast<float*>(scratch(1, size_t(splits) * T * N * sizeof(float))) : nullptr;
  const int64_t rows = int64_t(S) * 16 * NP * 2;
  if (restage) {
    stage_x_kernel<<<unsigned((rows + 255) / 256), 256>>>(x.as<const float>(), T, K, NP, xs);
    CUDA_LAUNCH_CHECK();
  }
  WgArgs a;
  a.w = static_cast<const uint8_t*>(w.data), a.xs = xs;
  a.out[0] = out.as<float>(), a.rt_end[0] = rt, a.n[0] = N, a.nmat = 1, a.rt = rt;
  a.part = part;
  a.cnt = last_sums && splits > 1 ? static_cast<int*>(scratch(2, size_t(rt / 4 + 1) * sizeof(int))) : nullptr;
  a.S = S, a.T = T, a.np = NP, a.splits = splits, a.lbo = lbo, a.sbo = sbo;
  launch_any(nullptr, false, w.dtype, ring, a);
  if (splits > 1 && sum && !last_sums) {
    const int64_t n = int64_t(T) * N;
    sum_splits_kernel<<<unsigned((n + 255) / 256), 256>>>(part, splits, n, out.as<float>());
    CUDA_LAUNCH_CHECK();
  }
  return splits;
}

}  // namespace qwen36::cuda
