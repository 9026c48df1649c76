#pragma once
// defines: the sm_80 warp-level primitives the staged and tensor-core kernels share — shared
//          addresses; asynchronous copies global → shared (cp.async: 4/8/16 bytes, a partial
//          16-byte copy that zero-fills, the group commit and waits); ldmatrix; the
//          f32-accumulating mma.sync tiles (tf32 m16n8k8, bf16 / f16 m16n8k16), the packing of
//          f32 pairs into their 16-bit operands and the two-term split that makes a 16-bit
//          product nearly an f32 one. The integer tiles (s8 / u8) and the quantized
//          weights' fragments: cuda_quant_mma_frags.cuh.
//
// Fragments (PTX ISA, "mma.m16n8k16"; g = lane / 4, t = lane % 4): a = A(g, 2t..2t+1),
// A(g+8, 2t..), A(g, 2t+8..), A(g+8, 2t+8..); b = B(2t..2t+1, g), B(2t+8.., g); d = C(g, 2t),
// C(g, 2t+1), C(g+8, 2t), C(g+8, 2t+1). Each 32-bit operand register holds a k pair, the lower k
// in its low half.
//
// The copies and waits carry a "memory" clobber so the compiler keeps shared-memory accesses on
// their side of them; the mma wrappers are plain asm (pure functions of their registers, which
// the compiler may schedule freely).

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace qwen36::cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- cp.async ----
// 16 bytes, L2 only (.cg: streamed data bypasses L1).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src) { cp_async16(smem_addr(dst), src); }
// 16 bytes at dst + OFF from src + OFF: the offset an immediate of the instruction (a warp
// issuing a run of copies from one base keeps one address register pair).
template <int OFF>
__device__ __forceinline__ void cp_async16_at(uint32_t dst, const uint8_t* src) {
  asm volatile("cp.async.cg.shared.global [%0+%2], [%1+%2], 16;\n" ::"r"(dst), "l"(src), "n"(OFF) : "memory");
}
// The first src_bytes (0..16) of 16 copied, the rest zero-filled; 0 reads nothing (rows past a
// matrix, k past K).
__device__ __forceinline__ void cp_async16_fill(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
template <int N>  // bytes: 4, 8 or 16 (16 bypasses L1: streamed data)
__device__ __forceinline__ void cp_async(void* dst, const void* src) {
  if constexpr (N == 16)
    cp_async16(dst, src);
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(smem_addr(dst)), "l"(src), "n"(N) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Until at most N of this thread's committed groups are in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// Every copy of this thread, committed or not.
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
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

// ---- ldmatrix: four 8 × 8 b16 matrices, lanes 8i .. 8i + 7 addressing matrix i's rows ----
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

// ---- mma.sync with f32 accumulators ----
// d += a·b, one m16n8k8 tf32 tile: a = A(g, t), A(g+8, t), A(g, t+4), A(g+8, t+4);
// b = B(t, g), B(t+4, g); d as for m16n8k16.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// d += a·b for one m16n8k16 tile, E = bf16 or f16 inputs.
template <typename E>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  static_assert(std::is_same_v<E, __nv_bfloat16> || std::is_same_v<E, __half>, "bf16 or f16 tiles");
  if constexpr (std::is_same_v<E, __nv_bfloat16>)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <typename E>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  mma16816<E>(d, a, b[0], b[1]);
}

// ---- operand packing ----
// Two f32 rounded to E (round to nearest even), packed: lo in the lower 16 bits.
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

}  // namespace qwen36::cuda
