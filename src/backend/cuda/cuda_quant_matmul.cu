// out[T, N] = x[T, K] · w[N, K]ᵀ for GGUF block-quantized weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// Q4_K, Q5_K, Q6_K, IQ4_XS; layouts: quant/blocks.h); its fused decode forms (matrices sharing
// x; gate/up with the SwiGLU); the decode GEMVs of quantized MoE experts and their dequantization
// for the prefill GEMM; embedding rows. Block readers: cuda_quant_blocks.cuh; random blocks for
// synthetic models: cuda_quant_random.cu.
//
//  - Decode (T ≤ 8, qgemv_kernel): memory-bound. One persistent block per SM first quantizes the
//    activations per 32 to int8 in shared memory (scale amax/127, nearest even), in the order
//    its lanes read them (every 128-bit load of 8 lanes is 128 contiguous bytes: no bank
//    conflicts), while its first weights are already loading (programmatic dependent launch).
//    The min / zero-point terms use the int8 sums, so a result is the dot of the exact weights
//    with the rounded activations (tests/gpu/test_cuda_quant.cpp checks exactly that). The
//    block's rows are cut into tasks of 8 super-blocks or 32 small blocks (a row segment, or
//    several whole short rows); warps take balanced contiguous task ranges (no idle tail), and a
//    row split between warps meets in shared memory in warp order (deterministic). An octet
//    (8 lanes) decodes a super-block, 32 weights per lane as two runs of 16 (dp4a; scales
//    decoded once per 32 weights and reused for every activation row); a 32-weight block is one
//    lane's. Q4_K, Q5_K (16-byte aligned blocks) and IQ4_XS load straight into registers, one
//    header word per lane (shuffled to the octet), the next task's loads in flight while one
//    computes: only the activations touch shared memory, and by count ~2 instructions per
//    weight at T = 1 stay well under the issue rate HBM speed allows. The 2-byte aligned types
//    (Q6_K, Q8_0, Q4_0, ...) are staged per warp through a 3-slot shared-memory ring with
//    16-byte cp.async (in-flight bytes cost no registers); Q6_K's octets read consecutive
//    blocks, whose words fall in distinct banks. (Staging the register-loading types too was
//    slower on the H200; that variant went, to keep the instantiations and CI's build down.)
//  - Prefill (T > 8): weights dequantized to bf16 in row slices (≤ 96 Mi weights, 192 MiB), each
//    multiplied by cuBLAS with the activations rounded to bf16 once (matmul's bf16 path:
//    round_activations / gemm_half). With CudaOptions::exact_matmul, every T goes through f32
//    slices and cublasSgemm with f32 activations instead (reference checks).
//  - Weights in the device's tiled layout (Q4_K_T16, ..., NVFP4_B64_T16; prepare_weights makes
//    them) go to cuda_quant_mma.cu's tensor-core GEMM from every entry point here.
//  - MoE: decode is two GEMV launches over the routed (token, expert) pairs (gate/up + SwiGLU,
//    then down weighted by the routing); prefill dequantizes the experts that received tokens
//    to bf16 for cuda_moe.cu's grouped GEMM (quant_dequant_experts).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "backend/cuda/cuda_fp8_gemm.cuh"
#include "backend/cuda/cuda_quant_blocks.cuh"
#include "backend/cuda/cuda_quant_hf.cuh"
#include "backend/cuda/cuda_sm80.cuh"

namespace qwen36::cuda {

namespace {


// ================================================================================================
// Decode GEMV (T ≤ 8 activation rows)
// ================================================================================================

// ---- activations as int8 per 32, in the order the lanes read them ----
//
// A lane of an octet (8 lanes) handles 32 weights of a block as two runs of 16, A and B, and
// reads their activations as two 16-byte loads: slot j (run A) and slot 8 + j (run B) of the
// 256-activation chunk. The quantizer stores each 16-activation unit of a chunk at the slot
// that reads it, so the 8 lanes of a 128-bit shared-memory phase always read 128 contiguous
// bytes (no bank conflicts). Per chunk and lane slot j, one float4 of metadata:
// {dA, dA·ΣqA, dB, dB·ΣqB} (scale of the run's 32-block and the scaled sum of the run's int8
// values: the min / zero-point terms use the quantized sum, so the result is exactly the dot
// of the weights with the int8-rounded activations).
//
// Slot orders (kPerm): 0: lane j = 32-block j (units 2j, 2j+1); 1: Q4_K/Q5_K, lane j = qs
// bytes [16j, +16) (units 4(j/2) + j%2 and +2); 2: Q6_K, lane j = (half j/4, pair (j/2)%2,
// l-half j%2) (units j + 4(j/4) and +4).
template <int kPerm>
__device__ __forceinline__ int x_slot(int unit) {
  if constexpr (kPerm == 0) {
    return (unit & 1) * 8 + (unit >> 1);
  } else if constexpr (kPerm == 1) {
    const int r = unit & 3;
    return (r < 2 ? 0 : 6) + 2 * (unit >> 2) + r;
  } else {
    const int r = unit & 7;
    return (r < 4 ? 0 : 4) + 4 * (unit >> 3) + r;
  }
}

constexpr int kXUnroll = 4;  // loads in flight per lane in the activation pass

// Quantizes nrows rows of K activations (row-major, stride K) into xq ([nrows][Kp] bytes) and
// xm ([nrows][Kp/256][8] float4). Warp w of nw takes 4 blocks of 32 at a time, 8 lanes per
// block, each quantized by quantize_quad (cuda_quant_blocks.cuh; the CPU twin in the tests
// rounds the same way).
template <int kPerm>
__device__ void quantize_rows(const float* __restrict__ x, int nrows, int K, int Kp, int8_t* xq, float4* xm, int warp,
                              int nw, int lane) {
  const int kb = K >> 5, nb = nrows * kb, nch = Kp >> 8;
  const int u = lane & 7, g = lane >> 3;
  const int stride = nw * 4;
  for (int base = warp * 4; base < nb; base += stride * kXUnroll) {  // warp-uniform: shuffles below
    float4 v[kXUnroll];
#pragma unroll
    for (int r = 0; r < kXUnroll; ++r) {
      const int b = base + r * stride + g;
      v[r] = b < nb ? __ldca(reinterpret_cast<const float4*>(x) + size_t(b) * 8 + u) : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (int r = 0; r < kXUnroll; ++r) {
      const int b = base + r * stride + g;
      const QuantQuad qq = quantize_quad(v[r]);  // qq.half: the code sum of this 16-activation unit
      if (b < nb) {
        const int row = b / kb, bb = b - row * kb, chunk = bb >> 3;
        const int slot = x_slot<kPerm>(2 * (bb & 7) + (u >> 2));
        reinterpret_cast<uint32_t*>(xq + size_t(row) * Kp + chunk * 256 + slot * 16)[u & 3] = qq.packed;
        if ((u & 3) == 0)
          reinterpret_cast<float2*>(xm + (size_t(row) * nch + chunk) * 8 + (slot & 7))[slot >> 3] =
              make_float2(qq.d, qq.d * float(qq.half));
      }
    }
  }
}

// ---- per-type lane decoders ----

// A lane's 32 weights of a block: runs A and B of 16 weights as q bytes (unsigned, or signed
// for kSigned types), weight = s · q + z with (s, z) per run.
struct Runs {
  uint32_t a[4], b[4];
  float sa, sb, za, zb;
};

// dp4a with unsigned (weights) or signed bytes in a, signed bytes (activations) in b.
template <bool kSigned>
__device__ __forceinline__ int dp4(uint32_t a, int b, int c) {
  if constexpr (kSigned) {
    return __dp4a(int(a), b, c);
  } else {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
  }
}

// Scales and mins of sub-blocks 2c and 2c+1 of a Q4_K / Q5_K block with header h (as
// k_scale_min, both at once and without branches on c: bytes 2(c%2), +1 of the scale words).
__device__ __forceinline__ void k_scales(const uint4& h, int c, float b_factor, Runs& o) {
  const int sh = 16 * (c & 1);
  const uint32_t a = (h.y >> sh) & 0xFFFFu, b = (h.z >> sh) & 0xFFFFu, w = (h.w >> sh) & 0xFFFFu;
  const bool hi = c >= 2;
  const uint32_t s2 = hi ? (w & 0x0F0Fu) | ((a >> 2) & 0x3030u) : a & 0x3F3Fu;
  const uint32_t m2 = hi ? ((w >> 4) & 0x0F0Fu) | ((b >> 2) & 0x3030u) : b & 0x3F3Fu;
  const float d = h2f(uint16_t(h.x & 0xFFFFu)), dmin = h2f(uint16_t(h.x >> 16));
  o.sa = d * float(s2 & 255u);
  o.sb = d * b_factor * float(s2 >> 8);
  o.za = -dmin * float(m2 & 255u);
  o.zb = -dmin * float(m2 >> 8);
}

// GEMV traits. kSlots: blocks per task (8 super-blocks: octet o takes blocks 2o, 2o+1; or 32
// blocks of 32: lane L takes block L). kDirect: blocks are 16-byte aligned (or 8 for IQ4_XS)
// and each lane loads its bytes from global memory into registers (load, gather, decode);
// otherwise the warp stages a task's rows through a shared-memory ring with 16-byte cp.async
// and each lane decodes from there (decode_smem, at the block's alignment, 2 bytes for Q6_K).
template <DType D>
struct GV;

// Register-loading types keep few registers per block in flight: each lane of an octet loads
// one word of the shared header (and of Q5_K's shared qh chunk) and gather() collects the rest
// from the octet with shuffles (every lane calls it, valid block or not).
template <>
struct GV<DType::Q4_K> {  // runs: low nibbles (sub-block 2c), high nibbles in place (16·q, 2c+1)
  static constexpr int kSlots = 8, kPerm = 1;
  static constexpr bool kDirect = true, kSigned = false, kHasZ = true;
  struct Raw {
    uint32_t h;  // header word j % 4
    uint4 q;     // qs bytes [16j, +16)
  };
  struct Full {
    uint4 h, q;
  };
  __device__ static void load(const uint8_t* p, int j, Raw& r) {
    r.h = __ldcs(reinterpret_cast<const unsigned*>(p) + (j & 3));
    r.q = __ldcs(reinterpret_cast<const uint4*>(p + 16) + j);
  }
  __device__ static void gather(const Raw& r, int lane, Full& f) {
    const int o = lane & ~7;
    f.h = make_uint4(__shfl_sync(0xffffffffu, r.h, o), __shfl_sync(0xffffffffu, r.h, o | 1),
                     __shfl_sync(0xffffffffu, r.h, o | 2), __shfl_sync(0xffffffffu, r.h, o | 3));
    f.q = r.q;
  }
  __device__ static void decode(const Full& f, int j, Runs& o) {
    const uint32_t q[4] = {f.q.x, f.q.y, f.q.z, f.q.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) o.a[k] = q[k] & 0x0F0F0F0Fu, o.b[k] = q[k] & 0xF0F0F0F0u;
    k_scales(f.h, j >> 1, 0.0625f, o);
  }
};
template <>
struct GV<DType::Q5_K> {  // as Q4_K; the 5th bits from qh bytes [16(j%2), +16)
  static constexpr int kSlots = 8, kPerm = 1;
  static constexpr bool kDirect = true, kSigned = false, kHasZ = true;
  struct Raw {
    uint32_t h;   // header word j % 4
    uint32_t qh;  // word j / 2 of qh chunk j % 2
    uint4 q;
  };
  struct Full {
    uint4 h, qh, q;
  };
  __device__ static void load(const uint8_t* p, int j, Raw& r) {
    r.h = __ldcs(reinterpret_cast<const unsigned*>(p) + (j & 3));
    r.qh = __ldcs(reinterpret_cast<const unsigned*>(p + 16) + 4 * (j & 1) + (j >> 1));
    r.q = __ldcs(reinterpret_cast<const uint4*>(p + 48) + (j & 7));
  }
  __device__ static void gather(const Raw& r, int lane, Full& f) {
    const int o = lane & ~7, hh = lane & 1;
    f.h = make_uint4(__shfl_sync(0xffffffffu, r.h, o), __shfl_sync(0xffffffffu, r.h, o | 1),
                     __shfl_sync(0xffffffffu, r.h, o | 2), __shfl_sync(0xffffffffu, r.h, o | 3));
    f.qh = make_uint4(__shfl_sync(0xffffffffu, r.qh, o | hh), __shfl_sync(0xffffffffu, r.qh, o | (2 + hh)),
                      __shfl_sync(0xffffffffu, r.qh, o | (4 + hh)), __shfl_sync(0xffffffffu, r.qh, o | (6 + hh)));
    f.q = r.q;
  }
  __device__ static void decode(const Full& f, int j, Runs& o) {
    const uint32_t q[4] = {f.q.x, f.q.y, f.q.z, f.q.w}, h[4] = {f.qh.x, f.qh.y, f.qh.z, f.qh.w};
    const int c = j >> 1;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t hs = h[k] >> (2 * c);
      o.a[k] = (q[k] & 0x0F0F0F0Fu) | ((hs & 0x01010101u) << 4);
      o.b[k] = ((q[k] >> 4) & 0x0F0F0F0Fu) | ((hs & 0x02020202u) << 3);
    }
    k_scales(f.h, c, 1.0f, o);
  }
};
template <>
struct GV<DType::IQ4_XS> {  // lane j = sub-block j: low nibbles (weights 0..15), high (16..31)
  static constexpr int kSlots = 8, kPerm = 0;
  static constexpr bool kDirect = true, kSigned = true, kHasZ = false;
  struct Raw {
    uint32_t h;  // header word j % 2 (d | scales_h, scales_l)
    uint2 q0, q1;
  };
  struct Full {
    uint32_t h0, h1;
    uint2 q0, q1;
  };
  __device__ static void load(const uint8_t* p, int j, Raw& r) {
    r.h = __ldcs(reinterpret_cast<const unsigned*>(p) + (j & 1));
    r.q0 = __ldcs(reinterpret_cast<const uint2*>(p + 8 + 16 * j));
    r.q1 = __ldcs(reinterpret_cast<const uint2*>(p + 16 + 16 * j));
  }
  __device__ static void gather(const Raw& r, int lane, Full& f) {
    const int o = lane & ~7;
    f.h0 = __shfl_sync(0xffffffffu, r.h, o);
    f.h1 = __shfl_sync(0xffffffffu, r.h, o | 1);
    f.q0 = r.q0, f.q1 = r.q1;
  }
  __device__ static void decode(const Full& f, int j, Runs& o) {
    const uint32_t q[4] = {f.q0.x, f.q0.y, f.q1.x, f.q1.y};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      o.a[k] = iq4_lookup(q[k] & 0x0F0F0F0Fu);
      o.b[k] = iq4_lookup((q[k] >> 4) & 0x0F0F0F0Fu);
    }
    const int ls = int((f.h1 >> (4 * j)) & 15u) | int(((f.h0 >> (16 + 2 * j)) & 3u) << 4);
    o.sa = o.sb = h2f(uint16_t(f.h0 & 0xFFFFu)) * float(ls - 32);
    o.za = o.zb = 0.0f;
  }
};
template <>
struct GV<DType::Q6_K> {  // runs: ql low nibbles (m = (j/2)%2), high nibbles (m + 2); qh bits
  static constexpr int kSlots = 8, kPerm = 2;
  static constexpr bool kDirect = false, kSigned = false, kHasZ = true;
  __device__ static void decode_smem(const uint8_t* p, int j, Runs& o) {
    const int n = j >> 2, m = (j >> 1) & 1, h = j & 1;
    uint32_t l[4], hi[4];
    load_words<2, true>(p + 64 * n + 32 * m + 16 * h, l);
    load_words<2, true>(p + 128 + 32 * n + 16 * h, hi);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t hs = hi[k] >> (2 * m);
      o.a[k] = (l[k] & 0x0F0F0F0Fu) | ((hs & 0x03030303u) << 4);
      o.b[k] = ((l[k] >> 4) & 0x0F0F0F0Fu) | (hs & 0x30303030u);
    }
    const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192 + 8 * n + 2 * m + h);
    const float d = h2f(ld_u16(p + 208));
    o.sa = d * float(sc[0]);
    o.sb = d * float(sc[4]);
    o.za = -32.0f * o.sa;
    o.zb = -32.0f * o.sb;
  }
};
template <>
struct GV<DType::Q8_0> {
  static constexpr int kSlots = 32, kPerm = 0;
  static constexpr bool kDirect = false, kSigned = true, kHasZ = false;
  __device__ static void decode_smem(const uint8_t* p, int, Runs& o) {
    uint32_t w[8];
    load_words<2, true>(p + 2, w);
#pragma unroll
    for (int k = 0; k < 4; ++k) o.a[k] = w[k], o.b[k] = w[k + 4];
    o.sa = o.sb = h2f(ld_u16(p));
    o.za = o.zb = 0.0f;
  }
};
// The 32-weight types with nibbles: weights 0..15 in the low nibbles of qs, 16..31 in the high.
__device__ __forceinline__ void nibble_runs(const uint32_t (&v)[4], Runs& o) {
#pragma unroll
  for (int k = 0; k < 4; ++k) o.a[k] = v[k] & 0x0F0F0F0Fu, o.b[k] = (v[k] >> 4) & 0x0F0F0F0Fu;
}
__device__ __forceinline__ void fifth_bits(uint32_t qh, Runs& o) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    o.a[k] |= spread4(qh >> (4 * k)) << 4;
    o.b[k] |= spread4(qh >> (16 + 4 * k)) << 4;
  }
}
template <>
struct GV<DType::Q4_0> {
  static constexpr int kSlots = 32, kPerm = 0;
  static constexpr bool kDirect = false, kSigned = false, kHasZ = true;
  __device__ static void decode_smem(const uint8_t* p, int, Runs& o) {
    uint32_t v[4];
    load_words<2, true>(p + 2, v);
    nibble_runs(v, o);
    o.sa = o.sb = h2f(ld_u16(p));
    o.za = o.zb = -8.0f * o.sa;
  }
};
template <>
struct GV<DType::Q4_1> {
  static constexpr int kSlots = 32, kPerm = 0;
  static constexpr bool kDirect = false, kSigned = false, kHasZ = true;
  __device__ static void decode_smem(const uint8_t* p, int, Runs& o) {
    uint32_t v[4];
    load_words<4>(p + 4, v);
    nibble_runs(v, o);
    o.sa = o.sb = h2f(ld_u16(p));
    o.za = o.zb = h2f(ld_u16(p + 2));
  }
};
template <>
struct GV<DType::Q5_0> {
  static constexpr int kSlots = 32, kPerm = 0;
  static constexpr bool kDirect = false, kSigned = false, kHasZ = true;
  __device__ static void decode_smem(const uint8_t* p, int, Runs& o) {
    uint32_t h[1], v[4];
    load_words<2, true>(p + 2, h);
    load_words<2, true>(p + 6, v);
    nibble_runs(v, o);
    fifth_bits(h[0], o);
    o.sa = o.sb = h2f(ld_u16(p));
    o.za = o.zb = -16.0f * o.sa;
  }
};
template <>
struct GV<DType::Q5_1> {
  static constexpr int kSlots = 32, kPerm = 0;
  static constexpr bool kDirect = false, kSigned = false, kHasZ = true;
  __device__ static void decode_smem(const uint8_t* p, int, Runs& o) {
    uint32_t h[1], v[4];
    load_words<4>(p + 4, h);
    load_words<8>(p + 8, v);
    nibble_runs(v, o);
    fifth_bits(h[0], o);
    o.sa = o.sb = h2f(ld_u16(p));
    o.za = o.zb = h2f(ld_u16(p + 2));
  }
};

// v[t] += Σ over the lane's 32 weights of weight · int8 activation, for the T activation rows
// whose chunk bases are xc + t·Kp (int8) and mc + t·mstride (metadata); slot: the lane's slot.
template <DType D, int TM>
__device__ __forceinline__ void runs_dot(const Runs& r, const int8_t* xc, const float4* mc, int slot, int Kp,
                                         int mstride, int T, float (&v)[TM]) {
  using G = GV<D>;
#pragma unroll
  for (int t = 0; t < TM; ++t) {
    if (t < T) {
      const int8_t* xt = xc + size_t(t) * Kp;
      const int4 xa = *reinterpret_cast<const int4*>(xt + 16 * slot);
      const int4 xb = *reinterpret_cast<const int4*>(xt + 128 + 16 * slot);
      const float4 m = mc[size_t(t) * mstride + slot];
      const int da = dp4<G::kSigned>(r.a[3], xa.w,
                                     dp4<G::kSigned>(r.a[2], xa.z, dp4<G::kSigned>(r.a[1], xa.y, dp4<G::kSigned>(r.a[0], xa.x, 0))));
      const int db = dp4<G::kSigned>(r.b[3], xb.w,
                                     dp4<G::kSigned>(r.b[2], xb.z, dp4<G::kSigned>(r.b[1], xb.y, dp4<G::kSigned>(r.b[0], xb.x, 0))));
      float s = fmaf(r.sa, m.x * float(da), r.sb * (m.z * float(db)));
      if constexpr (G::kHasZ) s = fmaf(r.za, m.y, fmaf(r.zb, m.w, s));
      v[t] += s;
    }
  }
}

// ---- the kernel ----

constexpr int kMaxMats = 4, kMaxWarps = 32, kStages = 3;
constexpr int kPartFloats = 2 * kMaxWarps * 8;  // head and tail partial sums per warp, T ≤ 8

// Row sources. Plain: the rows of up to 4 matrices of one type, back to back in one index
// space (Backend::matmul / matmul_multi), all T activation rows. Swiglu: row r of gate and of up
// (virtual rows r), out[0] = silu(x · gate) · (x · up), out[1] scratch. MoE gate/up: virtual
// row q = p·I + i of pair p's expert (gate and up), activation row = the pair's token,
// out[0][q] = the SwiGLU. MoE down: virtual row u = t·D + d: row d of the k experts of token t,
// each with its pair's SwiGLU row as activations; out[0][u] = Σ_j w[t, j] · dot_j.
enum : int { kModePlain = 0, kModeSwiglu = 1, kModeMoeGateUp = 2, kModeMoeDown = 3 };

struct GemvArgs {
  const uint8_t* w[kMaxMats];
  float* out[kMaxMats];
  int row_end[kMaxMats];  // plain: cumulative row counts
  int nmat;
  const void* const* table;  // MoE: [E][gate, up, down] expert pointers
  const int32_t* ids;        // MoE: [P] expert of each (token, slot) pair
  const float* route_w;      // MoE down: [P] routing weights
  float* res;                // MoE: per-row dot products (gate/up: [2][P·I], down: [T·D][k])
  const float* x;            // activations, rows of K floats
  unsigned long long rb;     // bytes per weight row
  int mode, T, V, K, Kp, bpr, nseg, R, lgbpr, slot_bytes, span_stride, xcap, mrows, k, E;
};

struct RowSrc {
  const uint8_t* p;    // the weight row (null: an invalid expert id, contributes 0)
  const uint8_t* end;  // end of its matrix (copies never read past it)
  int xrow;            // activation row in shared memory (MoE; plain rows use all T)
};

// Local row lr of the block whose virtual rows are [v0, v0 + nv). Matrices are picked with
// compile-time indices only (a runtime index into the parameter arrays would copy them to
// local memory in every thread).
__device__ __forceinline__ RowSrc row_src(const GemvArgs& a, int v0, int nv, int src0, int lr) {
  RowSrc s{nullptr, nullptr, 0};
  if (a.mode == kModePlain) {
    const int v = v0 + lr;
    const uint8_t* w = a.w[0];
    int r0 = 0, r1 = a.row_end[0];
#pragma unroll
    for (int i = 1; i < kMaxMats; ++i)
      if (i < a.nmat && v >= a.row_end[i - 1]) w = a.w[i], r0 = a.row_end[i - 1], r1 = a.row_end[i];
    s.p = w + (unsigned long long)(v - r0) * a.rb;
    s.end = w + (unsigned long long)(r1 - r0) * a.rb;
  } else if (a.mode == kModeSwiglu) {
    const bool up = lr >= nv;
    const uint8_t* w = up ? a.w[1] : a.w[0];
    s.p = w + (unsigned long long)(v0 + lr - (up ? nv : 0)) * a.rb;
    s.end = w + (unsigned long long)a.V * a.rb;
  } else {
    int pair, row, kind;
    if (a.mode == kModeMoeGateUp) {
      const bool up = lr >= nv;
      const int q = v0 + lr - (up ? nv : 0);
      pair = q / a.mrows, row = q - pair * a.mrows, kind = up ? 1 : 0;
      s.xrow = pair / a.k - src0;
    } else {
      const int du = lr / a.k, j = lr - du * a.k, u = v0 + du, t = u / a.mrows;
      row = u - t * a.mrows, pair = t * a.k + j, kind = 2;
      s.xrow = pair - src0;
    }
    const int e = a.ids[pair];
    if (e >= 0 && e < a.E) {
      const uint8_t* base = static_cast<const uint8_t*>(a.table[3 * e + kind]);
      s.p = base + (unsigned long long)row * a.rb;
      s.end = base + (unsigned long long)a.mrows * a.rb;
    }
  }
  return s;
}

// The finished dot product of local row lr for activation row t.
__device__ __forceinline__ void write_row(const GemvArgs& a, int v0, int nv, int lr, int t, float val) {
  if (a.mode == kModePlain) {
    const int v = v0 + lr;
    float* o = a.out[0];
    int r0 = 0, r1 = a.row_end[0];
#pragma unroll
    for (int i = 1; i < kMaxMats; ++i)
      if (i < a.nmat && v >= a.row_end[i - 1]) o = a.out[i], r0 = a.row_end[i - 1], r1 = a.row_end[i];
    o[size_t(t) * (r1 - r0) + (v - r0)] = val;
  } else if (a.mode == kModeSwiglu) {
    const bool up = lr >= nv;
    (up ? a.out[1] : a.out[0])[size_t(t) * a.V + v0 + lr - (up ? nv : 0)] = val;
  } else if (a.mode == kModeMoeGateUp) {
    const bool up = lr >= nv;
    a.res[(up ? size_t(a.V) : 0) + v0 + lr - (up ? nv : 0)] = val;
  } else {
    a.res[size_t(v0) * a.k + lr] = val;
  }
}

// Warps per block: as many as the registers allow without spilling (the SM's 64 K registers
// for one block), since the warps' loads in flight hide the memory latency. Register-loading
// types keep two tasks' blocks in registers (80 at 24 warps; Q5_K more); more activation rows
// need more accumulators.
template <DType D, bool kDirect, int TM>
__host__ __device__ constexpr int gemv_warps() {
  if constexpr (kDirect) return TM > 1 ? 16 : (D == DType::Q5_K ? 20 : 24);
  return TM >= 4 ? 16 : (TM == 1 ? 32 : 24);
}

// The 16-byte chunks covering [src, src + len) → dst (zero-filled past `end`, never read).
__device__ __forceinline__ void copy_span(const uint8_t* src, int len, const uint8_t* end, uint8_t* dst, int lane) {
  const uintptr_t c0 = reinterpret_cast<uintptr_t>(src) & ~uintptr_t(15);
  const int n = int((((reinterpret_cast<uintptr_t>(src) + uintptr_t(len) + 15) & ~uintptr_t(15)) - c0) >> 4);
  for (int k = lane; k < n; k += 32) {
    const uintptr_t g = c0 + uintptr_t(16 * k);
    const long long left = (long long)(reinterpret_cast<uintptr_t>(end) - g);
    const int bytes = left >= 16 ? 16 : (left > 0 ? int(left) : 0);
    cp_async16_fill(smem_addr(dst + 16 * k), reinterpret_cast<const void*>(g), bytes);
  }
}

// One block per SM (persistent) owns virtual rows [v0, v1); its local rows (the block's rows of
// every matrix it reads) are cut into tasks, and its warps take balanced contiguous ranges of
// tasks. A task is kSlots blocks: a segment of one row (R = 1, nseg segments per row), or R
// whole rows of bpr blocks when rows are that short (R = kSlots / bpr ≤ 8). Rows of R = 1
// tasks may be split between warps: the parts meet in shared memory, summed in warp order
// (deterministic, no atomics). Shared memory: partials | activations (int8, metadata) | rings.
template <DType D, int TM, bool kRegs>
__global__ void __launch_bounds__(gemv_warps<D, kRegs, TM>() * 32, 1) qgemv_kernel(const GemvArgs a) {
  using G = GV<D>;
  using Q = QType<D>;
  constexpr int NB = G::kSlots == 8 ? 2 : 1;  // blocks per lane per task
  extern __shared__ __align__(16) uint8_t smem[];
  griddep_trigger();
  const int nwarps = int(blockDim.x >> 5), warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31);
  const int oct = lane >> 3, j = lane & 7;
  const int v0 = int((long long)blockIdx.x * a.V / gridDim.x), v1 = int((long long)(blockIdx.x + 1) * a.V / gridDim.x);
  const int nv = v1 - v0;
  const int nl = a.mode == kModePlain || a.mode == kModeSwiglu ? (a.mode == kModePlain ? nv : 2 * nv)
                                                                : (a.mode == kModeMoeDown ? nv * a.k : 2 * nv);
  const int R = a.R, nseg = a.nseg, T = a.T;
  const int S = (R > 1 ? (nl + R - 1) / R : nl) * nseg;
  const int W = min(nwarps, S);
  auto range_begin = [&](int w) { return int((long long)w * S / W); };
  const int s_begin = warp < W ? range_begin(warp) : 0, s_end = warp < W ? range_begin(warp + 1) : 0;

  // Activation rows this block needs: all T (plain), or its pairs' tokens / its tokens' pairs.
  int src0 = 0, nsrc = a.T;
  if (a.mode == kModeMoeGateUp) {
    src0 = (v0 / a.mrows) / a.k;
    nsrc = ((v1 - 1) / a.mrows) / a.k - src0 + 1;
  } else if (a.mode == kModeMoeDown) {
    const int t0 = v0 / a.mrows;
    src0 = t0 * a.k;
    nsrc = ((v1 - 1) / a.mrows - t0 + 1) * a.k;
  }
  const int nch = a.Kp >> 8;
  float* part = reinterpret_cast<float*>(smem);  // [head | tail][warp][t]
  int8_t* xq = reinterpret_cast<int8_t*>(smem + kPartFloats * sizeof(float));
  float4* xm = reinterpret_cast<float4*>(xq + size_t(a.xcap) * a.Kp);
  uint8_t* ring = reinterpret_cast<uint8_t*>(xm + size_t(a.xcap) * nch * 8) + size_t(warp) * kStages * a.slot_bytes;

  // Task positions advance one at a time (no divisions in the loop).
  struct Pos {
    int g, seg;
  };
  auto advance = [&](Pos& q) {
    if (++q.seg == nseg) q.seg = 0, ++q.g;
  };
  // The lane's blocks of task q: pointer (null: none), K index in blocks, activation row,
  // and (staged types) the 16-aligned start of the block's span and the span's number.
  struct Ref {
    const uint8_t* p;
    const uint8_t* span0;
    int kb, xrow, span;
  };
  auto refs = [&](const Pos& q, Ref (&r)[NB]) {
    if (R == 1) {
      const RowSrc rs = row_src(a, v0, nv, src0, q.g);
      const int nblk = min(G::kSlots, a.bpr - q.seg * G::kSlots);
      const uint8_t* seg0 = rs.p ? rs.p + size_t(q.seg) * G::kSlots * Q::kBytes : nullptr;
#pragma unroll
      for (int s = 0; s < NB; ++s) {
        const int b = NB == 2 ? 2 * oct + s : lane;
        r[s].p = rs.p && b < nblk ? seg0 + b * Q::kBytes : nullptr;
        r[s].span0 = reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(seg0) & ~uintptr_t(15));
        r[s].kb = q.seg * G::kSlots + b, r[s].xrow = rs.xrow, r[s].span = 0;
      }
    } else {
#pragma unroll
      for (int s = 0; s < NB; ++s) {
        const int b = NB == 2 ? 2 * oct + s : lane, i = b >> a.lgbpr, lr = q.g * R + i;
        const RowSrc rs = lr < nl ? row_src(a, v0, nv, src0, lr) : RowSrc{nullptr, nullptr, 0};
        r[s].kb = b - (i << a.lgbpr);
        r[s].p = rs.p ? rs.p + r[s].kb * Q::kBytes : nullptr;
        r[s].span0 = reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(rs.p) & ~uintptr_t(15));
        r[s].xrow = rs.xrow, r[s].span = i;
      }
    }
  };
  auto dot = [&](const Runs& ru, const Ref& r, float (&v)[TM]) {
    const int chunk = NB == 2 ? r.kb : r.kb >> 3, slot = NB == 2 ? j : r.kb & 7;
    runs_dot<D, TM>(ru, xq + size_t(r.xrow) * a.Kp + size_t(chunk) * 256, xm + (size_t(r.xrow) * nch + chunk) * 8,
                    slot, a.Kp, nch * 8, T, v);
  };

  // End of a task: R = 1 rows accumulate until their last segment (or the range's end); R > 1
  // tasks hold whole rows, reduced over the lanes that share each row and written.
  float acc[TM];
#pragma unroll
  for (int t = 0; t < TM; ++t) acc[t] = 0.0f;
  auto finish = [&](const Pos& q, int s, float (&v)[NB][TM]) {
    if (R == 1) {
#pragma unroll
      for (int t = 0; t < TM; ++t) acc[t] += NB == 2 ? v[0][t] + v[NB - 1][t] : v[0][t];
      if (q.seg == nseg - 1 || s == s_end - 1) {
        const int lr = q.g;
        const bool head = lr * nseg < s_begin, tail = (lr + 1) * nseg > s_end;
#pragma unroll
        for (int t = 0; t < TM; ++t) {
          const float val = warp_sum(acc[t]);
          acc[t] = 0.0f;
          if (lane == 0 && t < T) {
            if (head)
              part[warp * 8 + t] = val;
            else if (tail)
              part[kMaxWarps * 8 + warp * 8 + t] = val;
            else
              write_row(a, v0, nv, lr, t, val);
          }
        }
      }
      return;
    }
    const int bpr = a.bpr;
    if (NB == 2 && bpr == 1) {  // blocks 2·oct + s are rows of their own
#pragma unroll
      for (int s = 0; s < NB; ++s)
#pragma unroll
        for (int t = 0; t < TM; ++t) {
          float val = v[s][t];
          val += __shfl_xor_sync(0xffffffffu, val, 1);
          val += __shfl_xor_sync(0xffffffffu, val, 2);
          val += __shfl_xor_sync(0xffffffffu, val, 4);
          const int lr = q.g * R + 2 * oct + s;
          if (j == 0 && t < T && lr < nl) write_row(a, v0, nv, lr, t, val);
        }
      return;
    }
    // Lanes sharing a row: 4·bpr (octets hold 2 blocks) or bpr (lanes hold 1), a power of two.
    const int width = NB == 2 ? 4 * bpr : bpr;
#pragma unroll
    for (int t = 0; t < TM; ++t) {
      float val = NB == 2 ? v[0][t] + v[NB - 1][t] : v[0][t];
      for (int o = 1; o < width; o <<= 1) val += __shfl_xor_sync(0xffffffffu, val, o);
      const int lr = q.g * R + lane / width;
      if ((lane & (width - 1)) == 0 && t < T && lr < nl) write_row(a, v0, nv, lr, t, val);
    }
  };

  const bool early = a.mode == kModePlain || a.mode == kModeSwiglu;  // weight rows known before the wait
  Pos pc{0, 0};
  if (s_begin < s_end) pc = Pos{s_begin / nseg, s_begin % nseg};
  if constexpr (kRegs) {
    typename G::Raw cur[NB] = {}, nxt[NB] = {};
    auto fetch = [&](const Pos& q, typename G::Raw (&w)[NB]) {
      Ref r[NB];
      refs(q, r);
#pragma unroll
      for (int s = 0; s < NB; ++s)
        if (r[s].p) G::load(r[s].p, j, w[s]);
    };
    // The first task's weights depend on nothing before this kernel; the activations (and
    // out, which the kernel before may still read) do: under programmatic dependent launch,
    // wait after issuing them.
    if (early && s_begin < s_end) fetch(pc, cur);
    griddep_wait();
    quantize_rows<G::kPerm>(a.x + size_t(src0) * a.K, nsrc, a.K, a.Kp, xq, xm, warp, nwarps, lane);
    __syncthreads();
    if (!early && s_begin < s_end) fetch(pc, cur);
    Pos pn = pc;
    for (int s = s_begin; s < s_end; ++s) {
      advance(pn);
      if (s + 1 < s_end) fetch(pn, nxt);  // the next task's loads fly while this one computes
      Ref r[NB];
      refs(pc, r);  // recomputed rather than kept: registers go to the loads in flight
      float v[NB][TM];
#pragma unroll
      for (int b = 0; b < NB; ++b) {
#pragma unroll
        for (int t = 0; t < TM; ++t) v[b][t] = 0.0f;
        typename G::Full f;
        G::gather(cur[b], lane, f);
        if (r[b].p) {
          Runs ru;
          G::decode(f, j, ru);
          dot(ru, r[b], v[b]);
        }
      }
      finish(pc, s, v);
      pc = pn;
#pragma unroll
      for (int b = 0; b < NB; ++b) cur[b] = nxt[b];
    }
  } else {
    Pos pp = pc;  // producer
    auto issue = [&](uint8_t* dst) {
      if (R == 1) {
        const RowSrc rs = row_src(a, v0, nv, src0, pp.g);
        const int nblk = min(G::kSlots, a.bpr - pp.seg * G::kSlots);
        if (rs.p) copy_span(rs.p + size_t(pp.seg) * G::kSlots * Q::kBytes, nblk * Q::kBytes, rs.end, dst, lane);
      } else {
        for (int i = 0; i < R; ++i) {
          const int lr = pp.g * R + i;
          if (lr >= nl) break;
          const RowSrc rs = row_src(a, v0, nv, src0, lr);
          if (rs.p) copy_span(rs.p, a.bpr * Q::kBytes, rs.end, dst + i * a.span_stride, lane);
        }
      }
      advance(pp);
    };
    if (early) {
#pragma unroll
      for (int i = 0; i < kStages - 1; ++i) {
        if (s_begin + i < s_end) issue(ring + i * a.slot_bytes);
        cp_async_commit();
      }
    }
    griddep_wait();
    quantize_rows<G::kPerm>(a.x + size_t(src0) * a.K, nsrc, a.K, a.Kp, xq, xm, warp, nwarps, lane);
    __syncthreads();
    if (!early) {
#pragma unroll
      for (int i = 0; i < kStages - 1; ++i) {
        if (s_begin + i < s_end) issue(ring + i * a.slot_bytes);
        cp_async_commit();
      }
    }
    for (int s = s_begin; s < s_end; ++s) {
      const int i = s - s_begin;
      if (s + kStages - 1 < s_end) issue(ring + ((i + kStages - 1) % kStages) * a.slot_bytes);
      cp_async_commit();
      cp_async_wait<kStages - 1>();
      __syncwarp();
      const uint8_t* slot = ring + (i % kStages) * a.slot_bytes;
      Ref r[NB];
      refs(pc, r);
      float v[NB][TM];
#pragma unroll
      for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int t = 0; t < TM; ++t) v[b][t] = 0.0f;
#pragma unroll
      for (int b = 0; b < NB; ++b)
        if (r[b].p) {
          Runs ru;
          G::decode_smem(slot + r[b].span * a.span_stride + (r[b].p - r[b].span0), j, ru);
          dot(ru, r[b], v[b]);
        }
      __syncwarp();  // every lane is done with the slot before it is refilled
      finish(pc, s, v);
      advance(pc);
    }
    cp_async_wait<0>();
  }

  __syncthreads();
  // Rows split between warps (R = 1): the warp holding a row's start (its tail partial) adds
  // the head partials of the following warps, in order.
  if (R == 1) {
    for (int w = int(threadIdx.x); w < W; w += int(blockDim.x)) {
      const int sb = range_begin(w), se = range_begin(w + 1), lr = (se - 1) / nseg;
      if ((lr + 1) * nseg > se && lr * nseg >= sb) {
        for (int t = 0; t < T; ++t) {
          float sum = part[kMaxWarps * 8 + w * 8 + t];
          for (int w2 = w + 1; w2 < W && range_begin(w2) < (lr + 1) * nseg; ++w2) sum += part[w2 * 8 + t];
          write_row(a, v0, nv, lr, t, sum);
        }
      }
    }
  }
  if (a.mode == kModePlain) return;
  __syncthreads();  // the rows written above (global memory) are read back below
  if (a.mode == kModeSwiglu) {
    for (int i = int(threadIdx.x); i < nv * T; i += int(blockDim.x)) {
      const int t = i / nv;
      const size_t o = size_t(t) * a.V + v0 + (i - t * nv);
      a.out[0][o] = silu_f(a.out[0][o]) * a.out[1][o];
    }
  } else if (a.mode == kModeMoeGateUp) {
    for (int q = v0 + int(threadIdx.x); q < v1; q += int(blockDim.x))
      a.out[0][q] = silu_f(a.res[q]) * a.res[size_t(a.V) + q];
  } else {
    for (int u = v0 + int(threadIdx.x); u < v1; u += int(blockDim.x)) {
      const int t = u / a.mrows;
      float sum = 0.0f;
      for (int jj = 0; jj < a.k; ++jj) {
        const int p = t * a.k + jj, e = a.ids[p];
        if (e >= 0 && e < a.E) sum += a.route_w[p] * a.res[size_t(u) * a.k + jj];
      }
      a.out[0][u] = sum;
    }
  }
}

struct GemvPlan {
  int grid = 0, warps = 0;
  size_t smem = 0;
};

// Fills the derived fields of a (K, V, mode and xcap set) and the launch shape; false when the
// activations and at least 4 warps' rings do not fit in shared memory.
template <DType D, int TM, bool kRegs>
bool plan_gemv(GemvArgs& a, GemvPlan& pl) {
  using G = GV<D>;
  using Q = QType<D>;
  // The decoders assume blocks start kAlign-aligned in a 16-byte aligned tensor (ring slots keep
  // the alignment mod 16): kAlign is exactly the power of two in kBytes, capped at 16; the
  // register-loading decoders need 8.
  static_assert(Q::kBytes % Q::kAlign == 0 && (Q::kAlign == 16 || Q::kBytes % (2 * Q::kAlign) != 0));
  static_assert(!kRegs || (G::kDirect && Q::kAlign >= 8));
  a.bpr = a.K / Q::kElems;
  a.Kp = (a.K + 255) / 256 * 256;
  const int slots = G::kSlots;
  if (a.bpr < slots && slots % a.bpr == 0 && slots / a.bpr <= 8) {
    a.R = slots / a.bpr, a.nseg = 1, a.lgbpr = 0;
    while ((1 << a.lgbpr) < a.bpr) ++a.lgbpr;
  } else {
    a.R = 1, a.nseg = (a.bpr + slots - 1) / slots, a.lgbpr = 0;
  }
  const DevInfo di = dev_info();
  pl.grid = std::min(a.V, di.sms);
  const size_t fixed = kPartFloats * sizeof(float), xb = size_t(a.xcap) * a.Kp * 3 / 2;
  const size_t optin = size_t(di.smem_optin);
  if (fixed + xb > optin) return false;
  pl.warps = gemv_warps<D, kRegs, TM>();
  a.slot_bytes = a.span_stride = 0;
  if (!kRegs) {
    // A slot holds one task's spans, each from its first 16-byte chunk, plus 16 bytes of slack
    // for the decoders' padded word reads.
    a.span_stride = (15 + a.bpr * Q::kBytes + 15) / 16 * 16 + 16;
    a.slot_bytes = a.R > 1 ? a.R * a.span_stride : (15 + std::min(slots, a.bpr) * Q::kBytes + 15) / 16 * 16 + 16;
    const size_t per_warp = size_t(kStages) * a.slot_bytes;
    pl.warps = int(std::min<size_t>(size_t(pl.warps), (optin - fixed - xb) / per_warp));
    if (pl.warps < 4) return false;
  }
  pl.smem = fixed + xb + size_t(pl.warps) * kStages * a.slot_bytes;
  return true;
}

template <DType D, int TM, bool kRegs>
void launch_gemv(Ctx& c, const GemvArgs& a, const GemvPlan& pl) {
  static std::atomic<uint64_t> attr_set{0};  // per device
  once_per_device(attr_set, [] {
    CUDA_CHECK(cudaFuncSetAttribute(qgemv_kernel<D, TM, kRegs>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    dev_info().smem_optin));
  });
  launch_pdl(qgemv_kernel<D, TM, kRegs>, dim3(unsigned(pl.grid)), dim3(unsigned(pl.warps * 32)), pl.smem, c.stream,
             a);
}

// Plans (and with launch, runs) the GEMV of a for its T; false: it does not fit.
template <DType D>
bool run_gemv(Ctx& c, GemvArgs a, bool launch = true) {
  GemvPlan pl;
  auto go = [&](auto tm) {
    constexpr int TM = decltype(tm)::value;
    constexpr bool kRegs = GV<D>::kDirect;  // register loads where the alignment allows, else the ring
    if (!plan_gemv<D, TM, kRegs>(a, pl)) return false;
    if (launch) launch_gemv<D, TM, kRegs>(c, a, pl);
    return true;
  };
  if (a.T <= 1) return go(std::integral_constant<int, 1>{});
  if (a.T <= 2) return go(std::integral_constant<int, 2>{});
  if (a.T <= 4) return go(std::integral_constant<int, 4>{});
  return go(std::integral_constant<int, 8>{});
}

template <DType D>
void quant_gemm(Ctx& c, const Tensor& w, const float* x, float* out, int T, int N, int K);

// out[T, N] = x · wᵀ with the GEMV; activations too large for shared memory are split in
// halves of T (each a pass over the weights), and a single row that still does not fit takes
// the dequantizing GEMM.
template <DType D>
void quant_gemv(Ctx& c, const Tensor& w, const float* x, float* out, int T, int N, int K) {
  GemvArgs a{};
  a.w[0] = static_cast<const uint8_t*>(w.data);
  a.out[0] = out;
  a.row_end[0] = N;
  a.nmat = 1;
  a.x = x;
  a.rb = w.row_bytes();
  a.mode = kModePlain;
  a.T = a.xcap = T;
  a.V = N;
  a.K = K;
  if (run_gemv<D>(c, a)) return;
  if (T == 1) return quant_gemm<D>(c, w, x, out, T, N, K);
  const int h = T / 2;
  quant_gemv<D>(c, w, x, out, h, N, K);
  quant_gemv<D>(c, w, x + size_t(h) * K, out + size_t(h) * N, T - h, N, K);
}
// ---- dequantization (prefill slices, embedding rows) ----

__device__ __forceinline__ void store32(float* o, const float (&y)[32]) {
#pragma unroll
  for (int k = 0; k < 8; ++k) reinterpret_cast<float4*>(o)[k] = make_float4(y[4 * k], y[4 * k + 1], y[4 * k + 2], y[4 * k + 3]);
}
__device__ __forceinline__ void store32(__nv_bfloat16* o, const float (&y)[32]) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    uint32_t u[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(y[8 * k + 2 * j], y[8 * k + 2 * j + 1]);
      u[j] = *reinterpret_cast<const uint32_t*>(&h);
    }
    reinterpret_cast<uint4*>(o)[k] = make_uint4(u[0], u[1], u[2], u[3]);
  }
}

// Slice s as 32 values: y = fma(scale · sc, q − Z, bias) rounds once, as quant/dequantize.cpp.
template <DType D>
__device__ __forceinline__ void slice_values(const Slice& s, float (&y)[32]) {
  const float a0 = s.scale * float(s.sc0), a1 = s.scale * float(s.sc1);
#pragma unroll
  for (int k = 0; k < 8; ++k)
#pragma unroll
    for (int j = 0; j < 4; ++j)
      y[4 * k + j] = fmaf(k < 4 ? a0 : a1, float(int(int8_t(s.q[k] >> (8 * j))) - QType<D>::kZ), s.bias);
}

// Decode unit u of weight row wr into o (the row's K outputs): a slice pair of a super-block, or
// one 32-weight block.
template <DType D, typename O>
__device__ __forceinline__ void dequant_unit(const uint8_t* wr, int u, O* o) {
  using Q = QType<D>;
  float y[32];
  if constexpr (Q::kElems == 256) {
    Slice a, b;
    const int blk = u >> 2, pair = u & 3;
    Q::template decode2<false>(wr + size_t(blk) * Q::kBytes, pair, a, b);
    slice_values<D>(a, y);
    store32(o + size_t(blk) * 256 + 32 * Q::slice_a(pair), y);
    slice_values<D>(b, y);
    store32(o + size_t(blk) * 256 + 32 * Q::slice_b(pair), y);
  } else {
    Slice a;
    Q::template decode<false>(wr + size_t(u) * Q::kBytes, 0, a);
    slice_values<D>(a, y);
    store32(o + size_t(u) * 32, y);
  }
}
template <DType D>
__host__ __device__ constexpr int unit_elems() {
  return QType<D>::kElems == 256 ? 64 : 32;
}

// out[r, :] = weight row rows[r] (or r0 + r without a row list) as f32 / bf16, r < nrows. One
// thread per decode unit.
template <DType D, typename O>
__global__ void dequant_kernel(const uint8_t* __restrict__ w, size_t row_bytes, const int32_t* __restrict__ rows, int r0,
                               int nrows, int K, O* __restrict__ out) {
  const int units = K / unit_elems<D>();
  const long long n = (long long)nrows * units;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const int r = int(i / units), u = int(i - (long long)r * units);
    const long long row = rows ? rows[r] : r0 + r;
    dequant_unit<D>(w + size_t(row) * row_bytes, u, out + size_t(r) * K);
  }
}

// MoE prefill: matrices kind0 .. kind0 + nkind - 1 (0 gate, 1 up: [I, D]; 2 down: [D, I]; rows
// x K each) of experts e0 + es, es < ne, into bf16 slot es of scratch ([ne][3][I·D], kind κ at
// offset κ·I·D); experts that received no pair (off[e + 1] == off[e]) are skipped.
template <DType D>
__global__ void dequant_experts_kernel(const void* const* __restrict__ table, int kind0, int nkind,
                                       const int32_t* __restrict__ off, int e0, int ne, int rows, int K,
                                       size_t row_bytes, __nv_bfloat16* __restrict__ scratch) {
  const int units = K / unit_elems<D>();
  const long long per_mat = (long long)rows * units, n = per_mat * nkind * ne;
  const size_t mat_elems = size_t(rows) * K;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const long long m = i / per_mat, ru = i - m * per_mat;
    const int es = int(m / nkind), kind = kind0 + int(m - (long long)es * nkind), e = e0 + es;
    if (off[e + 1] == off[e]) continue;
    const int r = int(ru / units), u = int(ru - (long long)r * units);
    const uint8_t* w = static_cast<const uint8_t*>(table[3 * e + kind]);
    dequant_unit<D>(w + size_t(r) * row_bytes, u,
                    scratch + (size_t(es) * 3 + size_t(kind)) * mat_elems + size_t(r) * K);
  }
}

template <DType D, typename O>
void launch_dequant(Ctx& c, const Tensor& w, const int32_t* rows, int r0, int nrows, O* out) {
  const int K = int(w.cols());
  const int64_t n = int64_t(nrows) * (K / unit_elems<D>());
  const int blocks = int(std::min<int64_t>(blocks_for(n, 256), int64_t(dev_info().sms) * 32));
  dequant_kernel<D, O><<<blocks, 256, 0, c.stream>>>(static_cast<const uint8_t*>(w.data), w.row_bytes(), rows, r0,
                                                     nrows, K, out);
  CUDA_LAUNCH_CHECK();
}

// Prefill: bf16 (or f32 with exact_matmul) slices of rows, one GEMM each into out's columns.
template <DType D>
void quant_gemm(Ctx& c, const Tensor& w, const float* x, float* out, int T, int N, int K) {
  sliced_dequant_gemm(c, x, out, T, N, K, 1,
                      [&](int n0, int ns, auto* dst) { launch_dequant<D>(c, w, nullptr, n0, ns, dst); });
}

}  // namespace



bool quant_supported(DType t) {
  return with_quant_type(t, [](auto) {}) || hf_quant_supported(t);  // HF types: cuda_quant_hf.cu
}

namespace {
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
}  // namespace

void quant_matmul(Ctx& c, const Tensor& x, const Tensor& w, Tensor& out) {
  if (dtype_is_tiled(w.dtype)) {  // the tensor-core GEMM of tiled weights (cuda_quant_mma.cu)
    const Tensor* ws[] = {&w};
    Tensor* os[] = {&out};
    return quant_tiled_matmul(c, x, ws, os);
  }
  const int64_t K = w.cols(), N = w.rows(), T = x.numel() / std::max<int64_t>(K, 1);
  QWEN36_CHECK(quant_supported(w.dtype), "matmul: weight dtype {} is not supported by the CUDA backend",
               dtype_name(w.dtype));
  QWEN36_CHECK(x.dtype == DType::F32 && out.dtype == DType::F32, "matmul: activations must be f32");
  QWEN36_CHECK(x.cols() == K && out.numel() == T * N, "matmul: x {} · w {} → out {}", x.shape_str(), w.shape_str(),
               out.shape_str());
  QWEN36_CHECK(N < (int64_t(1) << 30) && T * K < (int64_t(1) << 31) && T * N < (int64_t(1) << 31),
               "matmul: {} is too large", w.shape_str());
  QWEN36_CHECK(aligned16(w.data) && aligned16(x.data), "matmul: quantized weights and activations must be 16-byte aligned");
  if (T == 0 || N == 0) return;
  const float* xp = x.as<const float>();
  float* op = out.as<float>();
  if (hf_quant_supported(w.dtype)) return hf_quant_matmul(c, w, xp, op, int(T), int(N), int(K));  // cuda_quant_hf.cu
  with_quant_type(w.dtype, [&](auto dt) {
    constexpr DType D = decltype(dt)::value;
    if (T <= 8 && !c.exact_matmul)
      quant_gemv<D>(c, w, xp, op, int(T), int(N), int(K));
    else
      quant_gemm<D>(c, w, xp, op, int(T), int(N), int(K));
  });
}

bool quant_dequant_rows(Ctx& c, const Tensor& w, int64_t r0, int64_t n, __nv_bfloat16* out) {
  QWEN36_CHECK(r0 >= 0 && n >= 0 && r0 + n <= w.rows() && w.rows() < (int64_t(1) << 31), "dequantize: rows {} + {} of {}",
               r0, n, w.shape_str());
  if (dtype_is_tiled(w.dtype)) return quant_tiled_dequant_rows(c, w, r0, n, out);
  if (hf_quant_supported(w.dtype)) return hf_quant_dequant_rows(c, w, r0, n, out);
  return with_quant_type(w.dtype,
                         [&](auto dt) { launch_dequant<decltype(dt)::value>(c, w, nullptr, int(r0), int(n), out); });
}

namespace {

// Untiled quantized matrices at T > 64 (after the tiled ones of a call went to their GEMM):
// x rounded to bf16 once for all of them, then each matrix's dequantized slices and cuBLAS, as
// quant_matmul would do for each with its own rounding. False (nothing done) when one of them
// has another dtype, with exact_matmul, or at T ≤ 64.
bool dequant_matmul_multi(Ctx& c, const Tensor& x, std::span<const Tensor* const> ws, std::span<Tensor* const> outs) {
  const int64_t K = ws.empty() ? 0 : ws[0]->cols(), T = x.numel() / std::max<int64_t>(K, 1);
  if (ws.size() < 2 || c.exact_matmul || T <= kTiledMaxT || x.cols() != K || T * K >= (int64_t(1) << 31) ||
      !aligned16(x.data))
    return false;
  for (size_t i = 0; i < ws.size(); ++i)
    if (!dtype_is_quantized(ws[i]->dtype) || dtype_is_tiled(ws[i]->dtype) || !quant_supported(ws[i]->dtype) ||
        ws[i]->cols() != K || outs[i]->dtype != DType::F32 || outs[i]->numel() != T * ws[i]->rows() ||
        ws[i]->rows() >= (int64_t(1) << 30) || !aligned16(ws[i]->data) || fp8_gemm_takes(*ws[i], T))
      return false;
  Temp<uint16_t> xh(c, size_t(T * K));
  round_activations(c, x.as<const float>(), xh.get(), T * K, true);
  for (size_t i = 0; i < ws.size(); ++i) {
    const Tensor& w = *ws[i];
    sliced_dequant_gemm_erased(
        c, x.as<const float>(), outs[i]->as<float>(), int(T), int(w.rows()), int(K), 1,
        [&](int n0, int ns, void* dst, bool) { quant_dequant_rows(c, w, n0, ns, static_cast<__nv_bfloat16*>(dst)); },
        xh.get());
  }
  return true;
}

// Untiled quantized matrices at 8 < T ≤ 64 that are small (types without a tiled layout, or
// rows the 16-row tiles cannot hold): the GEMV once per 8 tokens. Reading such a matrix T / 8
// times costs a few µs, against ~50 µs for dequantizing it and a cuBLAS GEMM at T = 32.
constexpr size_t kChunkedGemvMaxBytes = size_t(4) << 20;
constexpr int64_t kGemvMaxT = 8;

bool chunked_small_gemv(Ctx& c, const Tensor& x, std::span<const Tensor* const> ws, std::span<Tensor* const> outs) {
  const int64_t K = ws[0]->cols(), T = x.numel() / std::max<int64_t>(K, 1);
  size_t bytes = 0;
  for (const Tensor* w : ws) bytes += w->nbytes();
  if (T > kTiledMaxT || x.cols() != K || bytes > kChunkedGemvMaxBytes) return false;
  for (size_t i = 0; i < ws.size(); ++i)
    if (ws[i]->cols() != K || !dtype_is_quantized(ws[i]->dtype) || outs[i]->numel() != T * ws[i]->rows()) return false;
  std::vector<Tensor> ov(ws.size());
  std::vector<Tensor*> op(ws.size());
  for (int64_t t0 = 0; t0 < T; t0 += kGemvMaxT) {
    const int64_t n = std::min(kGemvMaxT, T - t0);
    const Tensor xv(const_cast<float*>(x.as<const float>() + t0 * K), DType::F32, {n, K});
    for (size_t i = 0; i < ws.size(); ++i) {
      ov[i] = Tensor(outs[i]->as<float>() + t0 * ws[i]->rows(), DType::F32, {n, ws[i]->rows()});
      op[i] = &ov[i];
    }
    if (!quant_matmul_multi(c, xv, ws, op)) {
      QWEN36_CHECK(t0 == 0, "matmul: a quantized GEMV took tokens 0..{} but not {}..{}", t0 - 1, t0, t0 + n - 1);
      return false;
    }
  }
  return true;
}

}  // namespace

TiledSplit::TiledSplit(std::span<const Tensor* const> ws, std::span<Tensor* const> outs) {
  for (size_t i = 0; i < ws.size(); ++i) {
    const bool tiled = dtype_is_tiled(ws[i]->dtype);
    (tiled ? tw : rw).push_back(ws[i]);
    (tiled ? to : ro).push_back(outs[i]);
  }
}

void matmul_untiled(Ctx& c, const Tensor& x, std::span<const Tensor* const> ws, std::span<Tensor* const> outs) {
  if (!ws.empty() && !quant_matmul_multi(c, x, ws, outs) && !matmul_multi(c, x, ws, outs))
    for (size_t i = 0; i < ws.size(); ++i) matmul(c, x, *ws[i], *outs[i]);
}

bool quant_matmul_multi(Ctx& c, const Tensor& x, std::span<const Tensor* const> ws, std::span<Tensor* const> outs,
                        const void* act) {
  if (c.exact_matmul || ws.empty() || ws.size() != outs.size() || x.dtype != DType::F32) return false;
  if (std::any_of(ws.begin(), ws.end(), [](const Tensor* w) { return dtype_is_tiled(w->dtype); })) {
    // Tiled matrices share one quantization of x (cuda_quant_mma.cu, any T); the others as usual.
    const TiledSplit sp(ws, outs);
    quant_tiled_matmul(c, x, sp.tw, sp.to, act);
    matmul_untiled(c, x, sp.rw, sp.ro);
    return true;
  }
  const int64_t K = ws[0]->cols(), T = x.numel() / std::max<int64_t>(K, 1);
  if (T > 8) return chunked_small_gemv(c, x, ws, outs) || dequant_matmul_multi(c, x, ws, outs);
  if (T < 1 || x.cols() != K || !aligned16(x.data)) return false;
  bool any = false;
  for (size_t i = 0; i < ws.size(); ++i) {
    const Tensor& w = *ws[i];
    if (w.cols() != K || outs[i]->dtype != DType::F32 || outs[i]->numel() != T * w.rows()) return false;
    if (dtype_is_quantized(w.dtype)) {
      if (!quant_supported(w.dtype) || !aligned16(w.data) || w.rows() >= (int64_t(1) << 30)) return false;
      any = true;
    }
  }
  if (!any) return false;
  // One launch per quantized type (up to 4 matrices each); the other matrices go to the bf16 /
  // f16 / f32 multi-GEMV.
  std::vector<bool> done(ws.size(), false);
  std::vector<const Tensor*> rest_w;
  std::vector<Tensor*> rest_o;
  for (size_t i = 0; i < ws.size(); ++i) {
    if (done[i]) continue;
    const DType t = ws[i]->dtype;
    if (!dtype_is_quantized(t)) {
      rest_w.push_back(ws[i]);
      rest_o.push_back(outs[i]);
      done[i] = true;
      continue;
    }
    GemvArgs a{};
    std::vector<size_t> members;
    int64_t rows = 0;
    for (size_t m = i; m < ws.size() && a.nmat < kMaxMats; ++m) {
      if (done[m] || ws[m]->dtype != t || rows + ws[m]->rows() >= (int64_t(1) << 30)) continue;
      rows += ws[m]->rows();
      a.w[a.nmat] = static_cast<const uint8_t*>(ws[m]->data);
      a.out[a.nmat] = outs[m]->as<float>();
      a.row_end[a.nmat] = int(rows);
      ++a.nmat;
      members.push_back(m);
      done[m] = true;
    }
    a.x = x.as<const float>();
    a.rb = ws[i]->row_bytes();
    a.mode = kModePlain;
    a.T = a.xcap = int(T);
    a.V = int(rows);
    a.K = int(K);
    bool ok = false;
    with_quant_type(t, [&](auto dt) { ok = rows == 0 || run_gemv<decltype(dt)::value>(c, a); });
    if (!ok)
      for (size_t m : members) quant_matmul(c, x, *ws[m], *outs[m]);
  }
  if (!rest_w.empty() && !matmul_multi(c, x, rest_w, rest_o))
    for (size_t i = 0; i < rest_w.size(); ++i) matmul(c, x, *rest_w[i], *rest_o[i]);
  return true;
}

bool quant_matmul_swiglu(Ctx& c, const Tensor& x, const Tensor& gate, const Tensor& up, Tensor& gate_out,
                         Tensor& up_out) {
  const int64_t K = gate.cols(), N = gate.rows(), T = x.numel() / std::max<int64_t>(K, 1);
  if (dtype_is_tiled(gate.dtype) || dtype_is_tiled(up.dtype)) {  // two tiled GEMMs (T ≤ 64), then the SwiGLU
    if (c.exact_matmul || up.dtype != gate.dtype || up.rows() != N || up.cols() != K || x.dtype != DType::F32 ||
        x.cols() != K || T < 1 || T > 64 || gate_out.dtype != DType::F32 || up_out.dtype != DType::F32 ||
        gate_out.numel() != T * N || up_out.numel() != T * N)
      return false;
    const Tensor* ws[] = {&gate, &up};
    Tensor* os[] = {&gate_out, &up_out};
    quant_tiled_matmul(c, x, ws, os);
    swiglu(c, gate_out, up_out, gate_out);
    return true;
  }
  if (c.exact_matmul || !dtype_is_quantized(gate.dtype) || !quant_supported(gate.dtype) || up.dtype != gate.dtype ||
      up.rows() != N || up.cols() != K || x.dtype != DType::F32 || x.cols() != K || T < 1 || T > 8 ||
      gate_out.dtype != DType::F32 || up_out.dtype != DType::F32 || gate_out.numel() != T * N ||
      up_out.numel() != T * N || N < 1 || N >= (int64_t(1) << 29) || !aligned16(x.data) || !aligned16(gate.data) ||
      !aligned16(up.data))
    return false;
  GemvArgs a{};
  a.w[0] = static_cast<const uint8_t*>(gate.data);
  a.w[1] = static_cast<const uint8_t*>(up.data);
  a.out[0] = gate_out.as<float>();
  a.out[1] = up_out.as<float>();
  a.nmat = 2;
  a.x = x.as<const float>();
  a.rb = gate.row_bytes();
  a.mode = kModeSwiglu;
  a.T = a.xcap = int(T);
  a.V = int(N);
  a.K = int(K);
  bool ok = false;
  with_quant_type(gate.dtype, [&](auto dt) { ok = run_gemv<decltype(dt)::value>(c, a); });
  return ok;
}

bool quant_moe_decode(Ctx& c, const Tensor& x, const Tensor& weights, const Tensor& ids, const void* const* table,
                      DType gate_up, DType down, int64_t E, int64_t I, Tensor& out) {
  const int64_t T = x.rows(), D = x.cols(), k = ids.cols(), P = T * k;
  if (c.exact_matmul || !quant_supported(gate_up) || !quant_supported(down) || P < 1 || !aligned16(x.data) ||
      P * I >= (int64_t(1) << 29) || P * D >= (int64_t(1) << 30) || E >= (int64_t(1) << 30))
    return false;
  GemvArgs g{};
  g.table = table;
  g.ids = ids.as<const int32_t>();
  g.x = x.as<const float>();
  g.rb = dtype_row_bytes(gate_up, D);
  g.mode = kModeMoeGateUp;
  g.T = 1;
  g.xcap = int(T);
  g.V = int(P * I);
  g.K = int(D);
  g.mrows = int(I);
  g.k = int(k);
  g.E = int(E);
  GemvArgs d = g;
  d.route_w = weights.as<const float>();
  d.rb = dtype_row_bytes(down, I);
  d.mode = kModeMoeDown;
  d.xcap = int(P);
  d.V = int(T * D);
  d.K = int(I);
  d.mrows = int(D);
  auto run = [&](DType t, GemvArgs& a, bool launch) {
    bool ok = false;
    with_quant_type(t, [&](auto dt) { ok = run_gemv<decltype(dt)::value>(c, a, launch); });
    return ok;
  };
  if (!run(gate_up, g, false) || !run(down, d, false)) return false;
  // act: the pairs' SwiGLU rows; res: per-row dot products of either launch (stream-ordered).
  Temp<float> act(c, size_t(P * I)), res(c, size_t(std::max(2 * P * I, P * D)));
  g.res = d.res = res.get();
  g.out[0] = act.get();
  d.x = act.get();
  d.out[0] = out.as<float>();
  run(gate_up, g, true);
  run(down, d, true);
  return true;
}

void quant_dequant_experts(Ctx& c, DType t, const void* const* table, int kind0, int nkind, const int32_t* off,
                           int e0, int ne, int64_t rows, int64_t K, __nv_bfloat16* scratch) {
  if (hf_quant_supported(t)) return hf_quant_dequant_experts(c, t, table, kind0, nkind, off, e0, ne, rows, K, scratch);
  const bool ok = with_quant_type(t, [&](auto dt) {
    constexpr DType D = decltype(dt)::value;
    const int64_t n = int64_t(ne) * nkind * rows * (K / unit_elems<D>());
    if (n == 0) return;
    const int blocks = int(std::min<int64_t>(blocks_for(n, 256), int64_t(dev_info().sms) * 32));
    dequant_experts_kernel<D><<<blocks, 256, 0, c.stream>>>(table, kind0, nkind, off, e0, ne, int(rows), int(K),
                                                           dtype_row_bytes(t, K), scratch);
    CUDA_LAUNCH_CHECK();
  });
  QWEN36_CHECK(ok, "moe_experts: weight dtype {} is not supported by the CUDA backend", dtype_name(t));
}

void quant_embed_rows(Ctx& c, const Tensor& table, const int32_t* ids, int64_t n, Tensor& out) {
  const int64_t D = table.cols();
  QWEN36_CHECK(quant_supported(table.dtype), "embed: table dtype {} is not supported by the CUDA backend",
               dtype_name(table.dtype));
  QWEN36_CHECK(out.dtype == DType::F32 && out.numel() == n * D, "embed: out {} for {} ids of width {}",
               out.shape_str(), n, D);
  QWEN36_CHECK(reinterpret_cast<uintptr_t>(table.data) % 16 == 0, "embed: quantized tables must be 16-byte aligned");
  if (n == 0) return;
  if (hf_quant_supported(table.dtype))  // cuda_quant_hf.cu
    return hf_quant_embed_rows(c, table, ids, int(n), out.as<float>());
  with_quant_type(table.dtype, [&](auto dt) {
    launch_dequant<decltype(dt)::value>(c, table, ids, 0, int(n), out.as<float>());
  });
}

}  // namespace qwen36::cuda
