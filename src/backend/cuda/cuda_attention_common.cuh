#pragma once
// defines: what the attention kernels share (cuda_attention.cu, cuda_attention_decode.cu,
//          cuda_flash_attention.cu): the KV-cache kinds and their row sizes, the sm_80 tensor
//          core and async-copy wrappers (mma.sync m16n8k16, ldmatrix, cp.async), the
//          dequantisation of cached rows into f16 (formats: backend/kv_cache.h), the warp
//          Walsh–Hadamard transform, and the entry points of the two attention kernel files.
//
// Element types of the tensor-core tiles: bf16 for f32 and bf16 caches; f16 for fp8, q8_0 and
// q4_0, whose values are exact in f16 (fp8) or defined as f16(d·q) (kv_cache.h), so the tiles
// hold exactly the values the CPU twin reads.

#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_ops.cuh"

namespace qwen36::cuda {

enum class KvKind : int { F32, BF16, F8, Q8, Q4 };

inline KvKind kv_kind(DType t) {
  switch (t) {
    case DType::BF16: return KvKind::BF16;
    case DType::F8_E4M3: return KvKind::F8;
    case DType::Q8_0: return KvKind::Q8;
    case DType::Q4_0: return KvKind::Q4;
    default: return KvKind::F32;
  }
}
__host__ __device__ constexpr bool kv_quantized(KvKind k) { return k == KvKind::F8 || k == KvKind::Q8 || k == KvKind::Q4; }
__host__ __device__ constexpr bool kv_rotated(KvKind k) { return k == KvKind::Q8 || k == KvKind::Q4; }
// Bytes of one (position, kv head) row of D values.
__host__ __device__ constexpr int kv_row_bytes(KvKind k, int D) {
  return k == KvKind::F32 ? 4 * D : k == KvKind::BF16 ? 2 * D : k == KvKind::F8 ? D : k == KvKind::Q8 ? 34 * (D / 32) : 18 * (D / 32);
}

// ---- sm_80 primitives ----
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
template <int N>  // bytes: 4, 8 or 16 (16 bypasses L1: streamed data)
__device__ __forceinline__ void cp_async(void* dst, const void* src) {
  if constexpr (N == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(smem_addr(dst)), "l"(src), "n"(N) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// wait_group takes an immediate: a switch over the pipeline depths in use (warp-uniform).
__device__ __forceinline__ void cp_async_wait_dyn(int n) {
  switch (n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    default: cp_async_wait<6>(); break;
  }
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// d += a·b for one m16n8k16 tile, E = bf16 or f16 inputs, f32 accumulators.
template <typename E>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<E, __nv_bfloat16>)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Two f32 rounded to E, packed (lo in the lower 16 bits), and the rounded values back.
template <typename E>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<E, __nv_bfloat16>) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}
template <typename E>
__device__ __forceinline__ float2 unpack2(uint32_t u) {
  if constexpr (std::is_same_v<E, __nv_bfloat16>)
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u));
  else
    return __half22float2(*reinterpret_cast<const __half2*>(&u));
}
// x ≈ hi + lo, both E: the pair of operands that makes an E×E product almost an f32 one
// (lo carries the rounding error of hi: relative 2^-16 for bf16, 2^-22 for f16 left over).
template <typename E>
__device__ __forceinline__ void split2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  hi = pack2<E>(x0, x1);
  const float2 h = unpack2<E>(hi);
  lo = pack2<E>(x0 - h.x, x1 - h.y);
}
template <typename E>
__device__ __forceinline__ void store4(E* dst, float4 x) {  // 4 values, 8-byte aligned
  uint2 u;
  u.x = pack2<E>(x.x, x.y);
  u.y = pack2<E>(x.z, x.w);
  *reinterpret_cast<uint2*>(dst) = u;
}

// ---- dequantisation (formats: backend/kv_cache.h) ----
__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }

// Values 8c .. 8c + 7 of one cached row (global or shared memory) as 8 f16 in a uint4.
// fp8: the exponent/mantissa bits shifted into an f16 give e4m3·2^-8 exactly (subnormals
// included), times f16 2^(e+8) (`s2`: both halves) gives e4m3·2^e exactly.
// q8_0 / q4_0: integers through the f16 magic 1024 + u (exact), then d·q rounded once.
template <KvKind K>
__device__ __forceinline__ uint4 dequant8(const uint8_t* row, int c, __half2 s2) {
  uint32_t h[4];
  if constexpr (K == KvKind::F8) {
    const uint2 w = *reinterpret_cast<const uint2*>(row + 8 * c);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t x = __byte_perm(i < 2 ? w.x : w.y, 0, (i & 1) ? 0x3424 : 0x1404);  // bytes 2i, 2i+1 → bits 8-15, 24-31
      h[i] = (x & 0x80008000u) | ((x >> 1) & 0x3f803f80u);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      __half2 v = __hmul2(*reinterpret_cast<const __half2*>(&h[i]), s2);
      h[i] = *reinterpret_cast<const uint32_t*>(&v);
    }
  } else {
    constexpr int BB = K == KvKind::Q8 ? 34 : 18;  // block bytes
    const uint8_t* blk = row + (c >> 2) * BB;
    const __half d = __ushort_as_half(static_cast<unsigned short>(ld_u16(blk)));
    const __half2 d2 = __halves2half2(d, d);
    const int j0 = (c & 3) * 8;  // first element of the chunk within its block
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t x;
      __half2 off;
      if constexpr (K == KvKind::Q8) {
        x = __byte_perm(ld_u16(blk + 2 + j0 + 2 * i) ^ 0x8080u, 0x6464u, 0x5140);  // 1024 + q + 128
        off = __float2half2_rn(1152.0f);
      } else {
        const uint32_t w = ld_u16(blk + 2 + (j0 & 15) + 2 * i);
        x = __byte_perm(j0 < 16 ? (w & 0x0f0fu) : ((w >> 4) & 0x0f0fu), 0x6464u, 0x5140);  // 1024 + nibble
        off = __float2half2_rn(1032.0f);
      }
      const __half2 v = __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&x), off), d2);
      h[i] = *reinterpret_cast<const uint32_t*>(&v);
    }
  }
  return make_uint4(h[0], h[1], h[2], h[3]);
}
// The f16 multiplier of a row's fp8 values (its f32 scale 2^e, e in [-15, 7], times 256).
__device__ __forceinline__ __half2 fp8_row_mult(float scale) { return __float2half2_rn(scale * 256.0f); }

// ---- Walsh–Hadamard rotation (kv_cache.h) ----
// The warp holds one row of 32·NPL values, lane l the NPL consecutive values from l·NPL:
// spans < NPL inside the lane, larger ones across lanes, in increasing order, then the
// scale: the same additions as kv_hadamard on the CPU, so the results agree bit for bit.
template <int NPL>
__device__ __forceinline__ void warp_hadamard(float (&r)[NPL], int lane, float scale) {
#pragma unroll
  for (int h = 1; h < NPL; h <<= 1)
#pragma unroll
    for (int e = 0; e < NPL; ++e)
      if ((e & h) == 0) {
        const float a = r[e], b = r[e + h];
        r[e] = a + b;
        r[e + h] = a - b;
      }
#pragma unroll
  for (int m = 1; m < 32; m <<= 1)
#pragma unroll
    for (int e = 0; e < NPL; ++e) {
      const float p = __shfl_xor_sync(0xffffffffu, r[e], m);
      r[e] = (lane & m) ? p - r[e] : r[e] + p;
    }
#pragma unroll
  for (int e = 0; e < NPL; ++e) r[e] *= scale;
}

// ---- entry points ----
// cuda_flash_attention.cu: prefill runs. tiles: n_tiles × {slot, pos0, begin, count, row0}
// on the device; q (rotated already for q8_0/q4_0), out [T, H, hd] f32; caches
// [slots, cap, KVH, hd] holding this batch's keys; ksc/vsc: fp8 row scales (else null).
int flash_attention_tile_rows();
bool flash_attention_supported(Ctx& c, int64_t hd);
void flash_attention(Ctx& c, const float* q, const void* kc, const void* vc, const float* ksc, const float* vsc,
                     KvKind kind, const int32_t* tiles, int n_tiles, int H, int KVH, int hd, int64_t cap, float scale,
                     float* out);
// cuda_attention_decode.cu: tensor-core decode of n_tok single-token rows (tlist: their
// batch rows, or null for rows 0 .. n_tok − 1) over bf16 / fp8 / q8_0 / q4_0 caches; rotates
// q and the output itself. Capturable (positions from tslot/tpos on the device).
bool attention_decode_tc_supported(KvKind kind, int64_t hd, int64_t G);
void attention_decode_tc(Ctx& c, const float* q, const void* kc, const void* vc, const float* ksc, const float* vsc,
                         KvKind kind, const int32_t* tslot, const int32_t* tpos, const int32_t* tlist, int64_t n_tok,
                         int H, int KVH, int hd, int64_t cap, float scale, float hscale, float* out);

}  // namespace qwen36::cuda
