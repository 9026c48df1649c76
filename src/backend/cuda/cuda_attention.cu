// Gated full attention on the GPU: KV append and causal GQA softmax attention over the
// per-slot KV cache [slots, capacity, KVH, hd] of f32, bf16, fp8 e4m3, q8_0 or q4_0 (formats:
// backend/kv_cache.h). CPU twin: backend/cpu/cpu_attention.cpp.
//
// Dispatch per run: runs of ≥ kFlashMinTokens tokens go to the tensor-core flash kernel
// (cuda_flash_attention.cu; hd 64/128/256), shorter runs (decode, short verify chunks) to a
// decode kernel: the tensor-core one (cuda_attention_decode.cu) for bf16 and quantised caches
// with hd 64/128/256 and ≤ 8 query heads per kv head, else the CUDA-core kernel here, which
// is exact f32 arithmetic on the cached values (f32 caches, other head dims, and every run
// of an f32/bf16 cache in exact mode, Ctx::exact_matmul). Quantised caches in exact mode take
// the tensor-core decode kernel for every run (its products are split into hi + lo parts:
// f32-level accuracy).
//
// Append: f32/bf16 elementwise; quantised caches one warp per (token, kv head) row, which
// rotates (q8_0/q4_0) and encodes it exactly as kv_encode_row does on the CPU, so the cache
// bytes agree. q8_0/q4_0 attention rotates q and the output (kv_cache.h): the decode kernel
// itself, the flash path through hadamard_rows_kernel before and after.
//
// CUDA-core decode kernel: one block per (token, kv head, split) serves all G = H/KVH query
// heads of the group, so each K/V row is read once per group. Its 4 warps stride over the
// split's positions; each warp keeps an online softmax (running max, sum, output) per query
// head, lanes own hd/32 consecutive dims (one 16-byte load per row for hd 256); the warps'
// partial results are merged at the end. With a large capacity the context is cut into
// splits (flash-decoding) so a handful of decode tokens still fills the GPU; a merge kernel
// combines the splits' (max, sum, output). The split count depends only on the batch shape
// and the capacity, and each block derives its chunk from the device-side position, so the
// op stays capturable into a CUDA graph whose replays see other positions.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "backend/cuda/cuda_attention_common.cuh"
#include "backend/kv_cache.h"

namespace qwen36::cuda {

namespace {

constexpr int kMaxGroup = 8;  // query heads per kv head in the decode kernel (registers)
constexpr int kWarps = 4;
constexpr int32_t kFlashMinTokens = 16;    // a run this long goes to the flash kernel
constexpr int64_t kSplitMinCapacity = 1024;  // caches longer than this decode with splits
constexpr int kMaxSplits = 64;
constexpr int kMinSplitPositions = 256;  // at full capacity, no split is shorter than this

__device__ __forceinline__ void store_cache(float* p, float x) { *p = x; }
__device__ __forceinline__ void store_cache(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }

// Programmatically dependent: k and v come from the kernel before.
template <typename CT>
__global__ void kv_append_kernel(const float* k, const float* v, CT* kc, CT* vc, const int32_t* tslot,
                                 const int32_t* tpos, int64_t cap, int64_t row, int64_t n) {
  griddep_wait();
  griddep_trigger();  // after the wait: a dependent's early reads reach back no further than this kernel
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / row, c = i % row;
    const int32_t s = tslot[t];
    if (s < 0) continue;
    const int64_t dst = (int64_t(s) * cap + tpos[t]) * row + c;
    store_cache(kc + dst, k[i]);
    store_cache(vc + dst, v[i]);
  }
}

// fp8 row scale exponent and e4m3 encoding: kv_fp8_exponent (kv_cache.h) and
// f32_to_f8_e4m3 (core/dtype.cpp), operation for operation.
__device__ __forceinline__ int fp8_exponent(float amax) {
  const uint32_t u = __float_as_uint(amax) & 0x7fffffffu;
  const int e = int(u >> 23) - 127 - 8 + ((u & 0x7fffffu) > 0x600000u ? 1 : 0);
  return min(max(e, -15), 7);
}
__device__ __forceinline__ float pow2f(int e) { return __uint_as_float(uint32_t(127 + e) << 23); }
__device__ __forceinline__ uint32_t f32_to_e4m3(float f) {
  const uint32_t u = __float_as_uint(f), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7fu;
  if (a >= 0x43e00000u) return sign | 0x7eu;
  if (a < 0x3c800000u) return sign | uint32_t(__float2int_rn(__uint_as_float(a) * 512.0f));
  return sign | (((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - (120u << 3));
}

// Quantised append: warp w encodes row w / 2 (token t = row / KVH, kv head row % KVH) of k
// (w even) or v (w odd) the way kv_encode_row does: lane l holds values l·NPL .. l·NPL + NPL − 1.
template <int D, KvKind K>
__global__ void __launch_bounds__(256)
    kv_append_quant_kernel(const float* __restrict__ k, const float* __restrict__ v, uint8_t* kc, uint8_t* vc,
                           float* ksc, float* vsc, const int32_t* tslot, const int32_t* tpos, int64_t cap, int KVH,
                           int64_t n_warps, float hscale) {
  constexpr int NPL = D / 32, RB = kv_row_bytes(K, D);
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = int(threadIdx.x & 31);
  if (w >= n_warps) return;  // warp-uniform
  const int64_t row = w >> 1, t = row / KVH;
  const int h = int(row % KVH), which = int(w & 1);
  const int32_t slot = tslot[t];
  if (slot < 0) return;
  const int32_t pos = tpos[t];
  const float* src = (which ? v : k) + row * D + lane * NPL;
  float x[NPL];
#pragma unroll
  for (int i = 0; i < NPL; ++i) x[i] = src[i];
  uint8_t* dst = (which ? vc : kc) + ((int64_t(slot) * cap + pos) * KVH + h) * RB;
  if constexpr (K == KvKind::F8) {
    float amax = 0;
#pragma unroll
    for (int i = 0; i < NPL; ++i) amax = fmaxf(amax, fabsf(x[i]));
    const int e = fp8_exponent(warp_max(amax));
    const float inv = pow2f(-e);
#pragma unroll
    for (int i = 0; i < NPL; i += 2)
      *reinterpret_cast<uint16_t*>(dst + lane * NPL + i) =
          static_cast<uint16_t>(f32_to_e4m3(x[i] * inv) | f32_to_e4m3(x[i + 1] * inv) << 8);
    if (lane == 0) (which ? vsc : ksc)[(int64_t(slot) * KVH + h) * cap + pos] = pow2f(e);
  } else {
    warp_hadamard<NPL>(x, lane, hscale);
    constexpr int LPB = 32 / NPL;  // lanes per block of 32 values
    const int li = lane % LPB;
    if constexpr (K == KvKind::Q8) {
      float amax = 0;
#pragma unroll
      for (int i = 0; i < NPL; ++i) amax = fmaxf(amax, fabsf(x[i]));
#pragma unroll
      for (int m = 1; m < LPB; m <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
      const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
      uint8_t* blk = dst + (lane / LPB) * 34;
#pragma unroll
      for (int i = 0; i < NPL; i += 2) {
        const int q0 = min(max(__float2int_rn(x[i] * id), -127), 127), q1 = min(max(__float2int_rn(x[i + 1] * id), -127), 127);
        *reinterpret_cast<uint16_t*>(blk + 2 + li * NPL + i) = static_cast<uint16_t>((q0 & 0xff) | (q1 & 0xff) << 8);
      }
      if (li == 0) *reinterpret_cast<uint16_t*>(blk) = __half_as_ushort(__float2half_rn(d));
    } else {
      // The block's value of largest magnitude, the first on ties (lower lanes hold earlier values).
      float am = 0, vm = 0;
#pragma unroll
      for (int i = 0; i < NPL; ++i)
        if (fabsf(x[i]) > am) am = fabsf(x[i]), vm = x[i];
#pragma unroll
      for (int m = 1; m < LPB; m <<= 1) {
        const float oa = __shfl_xor_sync(0xffffffffu, am, m), ov = __shfl_xor_sync(0xffffffffu, vm, m);
        if (oa > am || (oa == am && (lane & m))) am = oa, vm = ov;
      }
      const __half dh = __float2half_rn(vm / -8.0f);
      const float s = __half2float(dh), is = s != 0.0f ? 1.0f / s : 0.0f;
      uint32_t qn[NPL], hi[NPL];
#pragma unroll
      for (int i = 0; i < NPL; ++i) qn[i] = uint32_t(min(max(__float2int_rn(x[i] * is), -8), 7) + 8);
      // Value j < 16 of a block shares its byte with value j + 16, LPB/2 lanes up.
#pragma unroll
      for (int i = 0; i < NPL; ++i) hi[i] = __shfl_down_sync(0xffffffffu, qn[i], LPB / 2);
      if (li < LPB / 2) {
        uint8_t* blk = dst + (lane / LPB) * 18;
#pragma unroll
        for (int i = 0; i < NPL; i += 2)
          *reinterpret_cast<uint16_t*>(blk + 2 + li * NPL + i) =
              static_cast<uint16_t>((qn[i] | hi[i] << 4) | (qn[i + 1] | hi[i + 1] << 4) << 8);
        if (li == 0) *reinterpret_cast<uint16_t*>(blk) = __half_as_ushort(dh);
      }
    }
  }
}

// out row ← H·in row (kv_cache.h) for n_rows rows of D values, one warp per row; rows are
// all rows (list null) or rows list[i / heads]·heads + i % heads (the heads of listed tokens).
// In place is fine: a warp reads its whole row before writing it.
template <int D>
__global__ void __launch_bounds__(256) hadamard_rows_kernel(const float* in, float* out, const int32_t* list,
                                                            int64_t n_rows, int heads, float hscale) {
  constexpr int NPL = D / 32;
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = int(threadIdx.x & 31);
  if (w >= n_rows) return;
  const int64_t row = list ? int64_t(list[w / heads]) * heads + w % heads : w;
  float x[NPL];
#pragma unroll
  for (int i = 0; i < NPL; ++i) x[i] = in[row * D + lane * NPL + i];
  warp_hadamard<NPL>(x, lane, hscale);
#pragma unroll
  for (int i = 0; i < NPL; ++i) out[row * D + lane * NPL + i] = x[i];
}

// The NPL consecutive dims of this lane (lane·NPL ..) of one cached row as f32; `vec`: the
// row is exactly 32·NPL long and 16-byte aligned, so it is read in vector loads.
template <int NPL>
__device__ __forceinline__ void load_dims(const float* row, int lane, int hd, bool vec, float (&r)[NPL]) {
  if constexpr (NPL % 4 == 0) {
    if (vec) {
#pragma unroll
      for (int i = 0; i < NPL; i += 4) {
        const float4 x = *reinterpret_cast<const float4*>(row + lane * NPL + i);
        r[i] = x.x, r[i + 1] = x.y, r[i + 2] = x.z, r[i + 3] = x.w;
      }
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < NPL; ++i) {
    const int d = lane * NPL + i;
    r[i] = d < hd ? row[d] : 0.0f;
  }
}
template <int NPL>
__device__ __forceinline__ void load_dims(const __nv_bfloat16* row, int lane, int hd, bool vec, float (&r)[NPL]) {
  if constexpr (NPL >= 2) {
    if (vec) {
      constexpr int W = NPL < 8 ? NPL : 8;  // bf16 per load: 4, 8 or 16 bytes
      using V = std::conditional_t<W == 8, uint4, std::conditional_t<W == 4, uint2, uint32_t>>;
#pragma unroll
      for (int i = 0; i < NPL; i += W) {
        const V x = *reinterpret_cast<const V*>(row + lane * NPL + i);
        const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&x);
#pragma unroll
        for (int j = 0; j < W / 2; ++j) {
          const float2 f = __bfloat1622float2(h[j]);
          r[i + 2 * j] = f.x, r[i + 2 * j + 1] = f.y;
        }
      }
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < NPL; ++i) {
    const int d = lane * NPL + i;
    r[i] = d < hd ? __bfloat162float(row[d]) : 0.0f;
  }
}

// part (splits > 1): per (block x, kv head, split) [G] max, [G] sum, [G, hd] unnormalised
// output; else the normalised output goes straight to out.
template <int NPL, typename CT>
__global__ void __launch_bounds__(kWarps * 32)
    attention_decode_kernel(const float* __restrict__ q, const CT* __restrict__ kc, const CT* __restrict__ vc,
                            const int32_t* tslot, const int32_t* tpos, const int32_t* tlist, float* __restrict__ out,
                            float* __restrict__ part, int H, int KVH, int hd, int64_t cap, float scale, bool vec,
                            TreeMask tree) {
  const int t = tlist ? tlist[blockIdx.x] : int(blockIdx.x);
  const int kvh = blockIdx.y, split = blockIdx.z, nsplit = gridDim.z, G = H / KVH;
  const int slot = tslot[t], pos = tpos[t];
  if (slot < 0) return;
  const TreeView tv = tree_view(tree, t);
  // This split's positions: 0..pos cut into nsplit chunks of a multiple of 32 positions.
  // Trailing splits may be empty; they still report (max −∞, sum 0) to the merge.
  const int n = pos + 1;
  const int chunk = ((n + nsplit - 1) / nsplit + 31) & ~31;
  const int p_begin = min(n, split * chunk), p_end = min(n, p_begin + chunk);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  extern __shared__ float sm[];
  float* qs = sm;             // [G, hd]
  float* wpart = sm + G * hd;  // per warp: [G] m, [G] l, [G, hd] acc
  const int part_stride = G * (hd + 2);
  for (int i = threadIdx.x; i < G * hd; i += blockDim.x) qs[i] = q[(int64_t(t) * H + int64_t(kvh) * G) * hd + i];
  __syncthreads();

  float qr[kMaxGroup][NPL], acc[kMaxGroup][NPL], m[kMaxGroup], l[kMaxGroup];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    m[g] = -INFINITY;
    l[g] = 0;
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
      const int d = lane * NPL + i;
      qr[g][i] = (g < G && d < hd) ? qs[g * hd + d] : 0.0f;
      acc[g][i] = 0;
    }
  }
  const int64_t row = int64_t(KVH) * hd;
  const CT* kb = kc + int64_t(slot) * cap * row + int64_t(kvh) * hd;
  const CT* vb = vc + int64_t(slot) * cap * row + int64_t(kvh) * hd;
  // Two positions per step: twice the loads in flight per warp (decode is bound by memory
  // latency at this occupancy) and one rescale of the running output for both.
  for (int p = p_begin + warp; p < p_end; p += 2 * kWarps) {
    const bool two = p + kWarps < p_end;  // warp-uniform
    const bool see0 = tree_visible(tv, p), see1 = two && tree_visible(tv, p + kWarps);
    float k0[NPL], v0[NPL], k1[NPL], v1[NPL];
    load_dims<NPL>(kb + int64_t(p) * row, lane, hd, vec, k0);
    load_dims<NPL>(vb + int64_t(p) * row, lane, hd, vec, v0);
    if (two) {
      load_dims<NPL>(kb + int64_t(p + kWarps) * row, lane, hd, vec, k1);
      load_dims<NPL>(vb + int64_t(p + kWarps) * row, lane, hd, vec, v1);
    } else {
#pragma unroll
      for (int i = 0; i < NPL; ++i) k1[i] = v1[i] = 0;
    }
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g >= G) break;
      float s0 = 0, s1 = 0;
#pragma unroll
      for (int i = 0; i < NPL; ++i) {
        s0 += qr[g][i] * k0[i];
        s1 += qr[g][i] * k1[i];
      }
      s0 = warp_sum(s0) * scale;
      s1 = two ? warp_sum(s1) * scale : -INFINITY;
      if (!see0) s0 = -INFINITY;
      if (!see1) s1 = -INFINITY;
      const float mn = fmaxf(m[g], fmaxf(s0, s1));
      if (mn == -INFINITY) continue;  // a tree mask hid every position so far
      const float corr = expf(m[g] - mn), e0 = expf(s0 - mn), e1 = expf(s1 - mn);
      l[g] = l[g] * corr + e0 + e1;
#pragma unroll
      for (int i = 0; i < NPL; ++i) acc[g][i] = acc[g][i] * corr + e0 * v0[i] + e1 * v1[i];
      m[g] = mn;
    }
  }
  float* mine = wpart + warp * part_stride;
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= G) break;
    if (lane == 0) {
      mine[g] = m[g];
      mine[G + g] = l[g];
    }
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
      const int d = lane * NPL + i;
      if (d < hd) mine[2 * G + g * hd + d] = acc[g][i];
    }
  }
  __syncthreads();
  float* pp = part ? part + ((int64_t(blockIdx.x) * KVH + kvh) * nsplit + split) * int64_t(part_stride) : nullptr;
  for (int i = threadIdx.x; i < G * hd; i += blockDim.x) {
    const int g = i / hd;
    float M = -INFINITY;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, wpart[w * part_stride + g]);
    float L = 0, O = 0;
    for (int w = 0; w < kWarps; ++w) {
      const float* pw = wpart + w * part_stride;
      const float f = pw[g] == -INFINITY ? 0.0f : expf(pw[g] - M);  // a warp without positions
      L += pw[G + g] * f;
      O += pw[2 * G + i] * f;
    }
    if (!pp) {
      out[(int64_t(t) * H + int64_t(kvh) * G) * hd + i] = O / L;
    } else {
      if (i % hd == 0) {
        pp[g] = M;
        pp[G + g] = L;
      }
      pp[2 * G + i] = O;
    }
  }
}

// Combines the splits of attention_decode_kernel (grid: its x × KVH).
__global__ void attention_merge_kernel(const float* __restrict__ part, const int32_t* tslot, const int32_t* tlist,
                                       float* __restrict__ out, int H, int KVH, int hd, int nsplit) {
  const int t = tlist ? tlist[blockIdx.x] : int(blockIdx.x);
  if (tslot[t] < 0) return;
  const int kvh = blockIdx.y, G = H / KVH;
  const int64_t stride = int64_t(G) * (hd + 2);
  const float* pb = part + (int64_t(blockIdx.x) * KVH + kvh) * nsplit * stride;
  for (int i = threadIdx.x; i < G * hd; i += blockDim.x) {
    const int g = i / hd;
    float M = -INFINITY;
    for (int s = 0; s < nsplit; ++s) M = fmaxf(M, pb[s * stride + g]);
    float L = 0, O = 0;
    for (int s = 0; s < nsplit; ++s) {
      const float* ps = pb + s * stride;
      const float f = ps[g] == -INFINITY ? 0.0f : expf(ps[g] - M);  // an empty split
      L += ps[G + g] * f;
      O += ps[2 * G + i] * f;
    }
    out[(int64_t(t) * H + int64_t(kvh) * G) * hd + i] = O / L;
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Splits of the decode kernel for `blocks` (token, kv head) blocks: about two blocks per SM
// in all, when the capacity is large enough for the context to be worth cutting.
int decode_splits(int64_t blocks, int64_t cap) {
  if (cap <= kSplitMinCapacity) return 1;
  const int64_t want = (2 * int64_t(dev_info().sms) + blocks - 1) / blocks;
  return int(std::clamp<int64_t>(want, 1, std::min<int64_t>(kMaxSplits, cap / kMinSplitPositions)));
}

template <int D>
void launch_append_quant(Ctx& c, KvKind kind, const float* k, const float* v, void* kc, void* vc, float* ksc,
                         float* vsc, const int32_t* ts, const int32_t* tp, int64_t cap, int KVH, int64_t T,
                         float hscale) {
  const int64_t n_warps = 2 * T * KVH;
  const int blocks = blocks_for(n_warps * 32, 256);
  auto go = [&](auto kernel) {
    kernel<<<blocks, 256, 0, c.stream>>>(k, v, static_cast<uint8_t*>(kc), static_cast<uint8_t*>(vc), ksc, vsc, ts, tp,
                                         cap, KVH, n_warps, hscale);
  };
  switch (kind) {
    case KvKind::F8: go(kv_append_quant_kernel<D, KvKind::F8>); break;
    case KvKind::Q8: go(kv_append_quant_kernel<D, KvKind::Q8>); break;
    case KvKind::Q4: go(kv_append_quant_kernel<D, KvKind::Q4>); break;
    default: fail("attention: {} is not a quantised KV cache kind", int(kind));
  }
  CUDA_LAUNCH_CHECK();
}

void hadamard_rows(Ctx& c, const float* in, float* out, const int32_t* list, int64_t n_rows, int heads, int hd,
                   float hscale) {
  if (n_rows == 0) return;
  const int blocks = blocks_for(n_rows * 32, 256);
  switch (hd) {
    case 64: hadamard_rows_kernel<64><<<blocks, 256, 0, c.stream>>>(in, out, list, n_rows, heads, hscale); break;
    case 128: hadamard_rows_kernel<128><<<blocks, 256, 0, c.stream>>>(in, out, list, n_rows, heads, hscale); break;
    case 256: hadamard_rows_kernel<256><<<blocks, 256, 0, c.stream>>>(in, out, list, n_rows, heads, hscale); break;
    default: fail("attention: head_dim {} has no rotation kernel (64, 128, 256)", hd);
  }
  CUDA_LAUNCH_CHECK();
}

}  // namespace

// The tensor-core decode kernel stages q and requests the rows older than the call's appended
// ones before its griddep_wait (attention_decode_tc's early_rows); QWEN36_ATTN_EARLY=off: it
// waits first. attention_early_select for tests.
static std::atomic<int> g_early{-1};
static bool decode_reads_early() { return variant(g_early, "QWEN36_ATTN_EARLY", "on", "off") != kSecondForm; }
void attention_early_select(const char* mode) { g_early.store(mode ? parse_variant(mode, "on", "off") : -1); }

void attention(Ctx& c, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache,
               std::span<const SeqRun> runs, float scale, Tensor& out, TreeMask tree) {
  QWEN36_CHECK(q.ndim == 3 && k.ndim == 3 && k_cache.ndim == 4, "attention: bad ranks q {} k {} cache {}",
               q.shape_str(), k.shape_str(), k_cache.shape_str());
  const int64_t T = q.dim(0), H = q.dim(1), hd = q.dim(2), KVH = k.dim(1);
  const int64_t slots = k_cache.dim(0), cap = k_cache.dim(1);
  QWEN36_CHECK(k_cache.dim(2) == KVH && k_cache.dim(3) == hd && H % KVH == 0, "attention: cache {} for k {}",
               k_cache.shape_str(), k.shape_str());
  QWEN36_CHECK(k_cache.dtype == v_cache.dtype && kv_cache_type_supported(k_cache.dtype),
               "attention: KV cache types {} / {} are not supported (f32, bf16, f8_e4m3, q8_0, q4_0; both the same)",
               dtype_name(k_cache.dtype), dtype_name(v_cache.dtype));
  for (const SeqRun& r : runs) {
    QWEN36_CHECK(r.slot >= 0 && r.slot < slots, "attention: slot {} out of range", r.slot);
    QWEN36_CHECK(r.pos0 >= 0 && r.pos0 + r.count <= cap, "attention: positions {}..{} exceed the cache capacity {}",
                 r.pos0, r.pos0 + r.count - 1, cap);
  }
  const KvKind kind = kv_kind(k_cache.dtype);
  const bool quant = kv_quantized(kind), rot = kv_rotated(kind);
  const bool caches_aligned = aligned16(k_cache.data) && aligned16(v_cache.data);
  QWEN36_CHECK(!quant || ((hd == 64 || hd == 128 || hd == 256) && caches_aligned),
               "attention: a {} KV cache needs head_dim 64, 128 or 256 on CUDA (got {}) and 16-byte aligned caches",
               dtype_name(k_cache.dtype), hd);
  if (T == 0) return;
  const int G = int(H / KVH);
  const float hscale = kv_hadamard_scale(hd);
  // fp8 row scales: after the elements of each cache buffer (kv_cache.h).
  const size_t soff = kv_scale_offset(k_cache.dtype, slots, cap, KVH, hd);
  float* ksc = kind == KvKind::F8 ? reinterpret_cast<float*>(k_cache.as<uint8_t>() + soff) : nullptr;
  float* vsc = kind == KvKind::F8 ? reinterpret_cast<float*>(v_cache.as<uint8_t>() + soff) : nullptr;

  // Which runs take the flash kernel (decided on the host from run lengths alone; a decode
  // graph has runs of one token, so it never takes this path and needs no host tables).
  // Exact mode (CudaOptions::exact_matmul, for reference checks) keeps f32/bf16 attention in
  // f32 (CUDA-core kernel); quantised caches then use the tensor-core decode kernel, whose
  // split products are f32-accurate, for every run it can take (G ≤ 8; else flash).
  const bool tc_ok = caches_aligned && attention_decode_tc_supported(kind, hd, G) && (quant || !c.exact_matmul);
  const bool core_ok = !quant && G <= kMaxGroup && hd <= 256;
  const bool decode_ok = tc_ok || core_ok;
  // A tree mask is the decode kernels' (every token its own row of the call).
  const bool flash_ok = !tree.mask && flash_attention_supported(c, hd) && aligned16(q.data) && aligned16(out.data) &&
                        caches_aligned && !(c.exact_matmul && (decode_ok || !quant));
  std::vector<const SeqRun*> flash_runs;
  int64_t decode_tokens = 0;
  for (const SeqRun& r : runs) {
    if (r.count == 0) continue;
    if (flash_ok && (r.count >= kFlashMinTokens || !decode_ok)) {
      flash_runs.push_back(&r);
    } else {
      QWEN36_CHECK(decode_ok, "attention: the CUDA kernels support ≤ {} query heads per kv head and head_dim ≤ 256, "
                   "or head_dim 64/128/256 (got {} and {})", kMaxGroup, G, hd);
      decode_tokens += r.count;
    }
  }

  Temp<int32_t> stmp(c, 0), ptmp(c, 0);
  const int32_t *ts = nullptr, *tp = nullptr;
  dev_token_map(c, runs, T, stmp, ptmp, &ts, &tp);
  if (!ts) return;  // recording a graph that needed the host: it is dropped
  const int64_t row = KVH * hd, n = T * row;
  if (quant) {
    switch (hd) {
      case 64: launch_append_quant<64>(c, kind, k.as<const float>(), v.as<const float>(), k_cache.data, v_cache.data, ksc, vsc, ts, tp, cap, int(KVH), T, hscale); break;
      case 128: launch_append_quant<128>(c, kind, k.as<const float>(), v.as<const float>(), k_cache.data, v_cache.data, ksc, vsc, ts, tp, cap, int(KVH), T, hscale); break;
      default: launch_append_quant<256>(c, kind, k.as<const float>(), v.as<const float>(), k_cache.data, v_cache.data, ksc, vsc, ts, tp, cap, int(KVH), T, hscale); break;
    }
  } else {
    const int append_blocks = int(std::min<int64_t>(blocks_for(n, 256), 65535 * 8));
    if (kind == KvKind::BF16)
      launch_pdl(kv_append_kernel<__nv_bfloat16>, dim3(append_blocks), dim3(256), 0, c.stream, k.as<const float>(),
                 v.as<const float>(), k_cache.as<__nv_bfloat16>(), v_cache.as<__nv_bfloat16>(), ts, tp, cap, row, n);
    else
      launch_pdl(kv_append_kernel<float>, dim3(append_blocks), dim3(256), 0, c.stream, k.as<const float>(),
                 v.as<const float>(), k_cache.as<float>(), v_cache.as<float>(), ts, tp, cap, row, n);
    CUDA_LAUNCH_CHECK();
  }

  // A batch a step could record (decode_step: T ≤ 64) keeps its tables fixed by its runs' lengths
  // and order (device constants, cached at its eager first sight); a longer one uploads them.
  const bool recordable = T <= 64;
  auto upload = [&](const std::vector<int32_t>& v, Temp<int32_t>& tmp) {
    return dev_i32(c, std::span<const int32_t>(v.data(), v.size()), tmp, recordable);
  };
  Temp<int32_t> tile_tmp(c, 0), list_tmp(c, 0), flist_tmp(c, 0);
  Temp<SeqRun> run_tmp(c, 0);
  Temp<float> qrot(c, rot && !flash_runs.empty() ? size_t(T * H * hd) : 0);
  if (!flash_runs.empty()) {
    // Tiles {run, row0} of 64 (token, head) rows, the heaviest first: by the tile's latest
    // position, or where that may change between replays of a recording by its latest row in
    // its run (within a run the same order).
    const int bm = flash_attention_tile_rows();
    struct Tile {
      int64_t work;
      int32_t run, row0;
    };
    std::vector<Tile> tl;
    for (const SeqRun* r : flash_runs)
      for (int32_t row0 = 0; row0 < r->count * G; row0 += bm) {
        const int64_t last = std::min<int64_t>(r->count - 1, (row0 + bm - 1) / G);
        tl.push_back({(recordable ? 0 : r->pos0) + last, int32_t(r - runs.data()), row0});
      }
    std::stable_sort(tl.begin(), tl.end(), [](const Tile& a, const Tile& b) { return a.work > b.work; });
    std::vector<int32_t> flat;
    flat.reserve(tl.size() * 2);
    for (const Tile& t : tl) flat.insert(flat.end(), {t.run, t.row0});
    const int32_t* dtiles = upload(flat, tile_tmp);
    const SeqRun* druns = dev_runs(c, runs, run_tmp);
    if (!dtiles || !druns) return;  // recording a graph that needed the host: it is dropped
    const float* qf = q.as<const float>();
    if (rot) {  // q rotated into a temporary; the flash rows of out rotated back afterwards
      hadamard_rows(c, qf, qrot.get(), nullptr, T * H, int(H), int(hd), hscale);
      qf = qrot.get();
    }
    flash_attention(c, qf, k_cache.data, v_cache.data, ksc, vsc, kind, dtiles, druns, int(tl.size()), int(H),
                    int(KVH), int(hd), cap, scale, out.as<float>());
    if (rot) {
      const int32_t* fl = nullptr;
      int64_t n_flash = T;
      if (decode_tokens > 0) {  // only the flash runs' tokens (the decode kernel rotates its own)
        std::vector<int32_t> list;
        for (const SeqRun* r : flash_runs)
          for (int32_t j = 0; j < r->count; ++j) list.push_back(r->begin + j);
        fl = upload(list, flist_tmp);
        if (!fl) return;
        n_flash = int64_t(list.size());
      }
      hadamard_rows(c, out.as<const float>(), out.as<float>(), fl, n_flash * H, int(H), int(hd), hscale);
    }
  }
  if (decode_tokens == 0) return;

  // Decode tokens: all of the batch (no list: capturable), or the listed rows of short runs.
  const int32_t* tlist = nullptr;
  int64_t n_tok = T;
  if (!flash_runs.empty()) {
    std::vector<int32_t> list;
    for (const SeqRun& r : runs)
      if (r.count > 0 && std::find(flash_runs.begin(), flash_runs.end(), &r) == flash_runs.end())
        for (int32_t j = 0; j < r.count; ++j) list.push_back(r.begin + j);
    tlist = upload(list, list_tmp);
    if (!tlist) return;
    n_tok = int64_t(list.size());
  }
  if (tc_ok) {
    // The launch right before is this call's append (kv_append_kernel releases after its wait;
    // the quantized appends are plain launches) or a flash launch (after its wait too) or an
    // upload: everything before this call has ended when the decode kernel starts.
    int32_t appended = 0;
    for (const SeqRun& r : runs) appended = std::max(appended, r.count);
    attention_decode_tc(c, q.as<const float>(), k_cache.data, v_cache.data, ksc, vsc, kind, ts, tp, tlist, n_tok,
                        int(H), int(KVH), int(hd), cap, scale, hscale, out.as<float>(), tree,
                        decode_reads_early() ? int(appended) : 0);
    return;
  }
  const bool bf16 = kind == KvKind::BF16;
  const int nsplit = decode_splits(n_tok * KVH, cap);
  Temp<float> part(c, nsplit > 1 ? size_t(n_tok * KVH * nsplit) * size_t(G) * size_t(hd + 2) : 0);
  const size_t smem = sizeof(float) * size_t(G * hd + kWarps * G * (hd + 2));
  const dim3 grid(static_cast<unsigned>(n_tok), static_cast<unsigned>(KVH), static_cast<unsigned>(nsplit));
  const int npl = hd <= 32 ? 1 : hd <= 64 ? 2 : hd <= 128 ? 4 : 8;
  const bool vec = hd == 32 * npl && aligned16(k_cache.data) && aligned16(v_cache.data);
  auto launch = [&](auto kernel, auto* kc, auto* vc) {
    kernel<<<grid, kWarps * 32, smem, c.stream>>>(q.as<const float>(), kc, vc, ts, tp, tlist, out.as<float>(),
                                                   part.get(), int(H), int(KVH), int(hd), cap, scale, vec, tree);
  };
  auto launch_npl = [&](auto* kc, auto* vc) {
    using CT = std::remove_const_t<std::remove_pointer_t<decltype(kc)>>;
    if (npl == 1)
      launch(attention_decode_kernel<1, CT>, kc, vc);
    else if (npl == 2)
      launch(attention_decode_kernel<2, CT>, kc, vc);
    else if (npl == 4)
      launch(attention_decode_kernel<4, CT>, kc, vc);
    else
      launch(attention_decode_kernel<8, CT>, kc, vc);
  };
  if (bf16)
    launch_npl(k_cache.as<const __nv_bfloat16>(), v_cache.as<const __nv_bfloat16>());
  else
    launch_npl(k_cache.as<const float>(), v_cache.as<const float>());
  CUDA_LAUNCH_CHECK();
  if (nsplit > 1) {
    attention_merge_kernel<<<dim3(static_cast<unsigned>(n_tok), static_cast<unsigned>(KVH)), 256, 0, c.stream>>>(
        part.get(), ts, tlist, out.as<float>(), int(H), int(KVH), int(hd), nsplit);
    CUDA_LAUNCH_CHECK();
  }
}

}  // namespace qwen36::cuda
