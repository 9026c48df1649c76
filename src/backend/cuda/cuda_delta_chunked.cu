// The chunked (prefill) gated delta rule on the GPU: chunks of 64 tokens in the WY/UT form,
// the f32 state carried across chunks. CPU twin: delta_rule_chunked in
// backend/cpu/cpu_deltanet.cpp (same maths, same zero padding of a run's last chunk).
// cuda_deltanet.cu normalises q, k and dispatches the runs long enough to pay here.
//
// Maths per chunk (γ = cumsum g in the chunk): A = −β_i (k̂_i·k̂_j) e^{γ_i−γ_j} (j < i);
// T = (I − A)⁻¹; W = T·diag(β e^γ)·K̂, U = T·diag(β)·V; V' = U − W·S;
// O = (Q̂ ⊙ e^γ)·S + tril(Q̂K̂ᵀ ⊙ e^{γ_i−γ_j})·V'; S ← e^{γ_last} S + K̂ᵀ·diag(e^{γ_last−γ})·V'.
// A 4096-token run has 64 chunks but only Hv = 48 (or 32) heads, so everything that does not
// depend on S runs in a parallel prepare kernel (grid chunks × Hv; T in f32 SIMT, the
// sensitive step: 16×16 diagonal blocks by forward substitution, then the off-diagonal blocks
// by block products), and only the S-dependent products run in a sequential scan. Two forms:
//  fused (default): the prepare writes its results as mma B fragments (FragRecords); one scan
//     kernel (grid runs × Hv × dv/64, 4 warps) keeps each warp's 16 state columns as Sᵀ in mma
//     accumulators, which double as the A fragments of the next products, and computes V',
//     the chunk's outputs and the state update per chunk without any exchange between warps;
//     the next chunk's records in flight (cp.async; one chunk's where two do not fit, 107 KB
//     each at d 128). No S snapshots or V' in memory, no output kernel.
//  split (the earlier form, kept as the fallback: QWEN36_DELTA_CHUNKED=split): prepare → W, U
//     f32; state scan (grid runs × Hv × dv/32) writes a snapshot of S per chunk and V'; an
//     output kernel (grid chunks × Hv) computes O.
// Every product runs on tensor cores (mma.sync, f32 accumulators, sm_80+). Products that feed
// the carried state split their operands into bf16 hi + lo parts (3 m16n8k16 mma per k16:
// ≲ 1e-5 relative per product, f32-like, at half the tensor work of split tf32); the output
// products, whose errors are not carried, take single f16 (fused) or tf32 (split) operands
// (kPrec*: see there). Workspace per chunk: fused ~68 KB per token for the 27B (W, U, P per
// value head; k̂, q̂ per key head; fragment order), split ~98 KB (W, U/V', S_c, γ); longer
// batches run in segments of chunks that fit workspace_bytes() (the state carries between
// segments in the state tensor). The GPU test prints each kernel's time
// (delta_rule_chunked_timing) for both forms.
// Expected limits of the fused form (not measured): the scan is bound by its tensor work
// (~470 mma per warp and chunk at d 128, 4 warps per SM: ~1.5 µs per chunk step) and by
// the ~5 MB per step of records it streams; the prepare by its ~100 KB per block of loads and
// stores and the serial parts of the inverse.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "backend/cuda/cuda_ops.cuh"
#include "backend/cuda/cuda_sm80.cuh"
#include "backend/cuda/cuda_state_ref.cuh"

namespace qwen36::cuda {

namespace {

constexpr int kC = 64;                 // chunk length (the CPU twin's kChunk)
constexpr int kThreads = 256;          // every kernel: 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kNB = 32;                // split form: value columns of the state per scan block
// How each kernel's products run (tensor cores unless Simt; f32 accumulators throughout):
//  Tf32x3: operands split into tf32 big + small, 3 m16n8k8 mma per k8 (≈ 2^-20 relative per product)
//  Bf16x3: operands split into bf16 hi + lo, 3 m16n8k16 mma per k16 (≲ 3·2^-18 ≈ 1e-5): half
//          Tf32x3's tensor work (a bf16 k16 mma costs what a tf32 k8 one does) at f32-like accuracy
//  Tf32:   plain tf32, 1 mma per k8 (2^-11 per operand)
//  Simt:   f32 FMAs (the simple reference path)
// prepare and state feed the carried state (errors accumulate over chunks); output errors are
// not carried, so the split form's output kernel takes plain tf32 (and the fused scan f16,
// the same 2^-11 per operand, which lets its accumulators serve as m16n8k16 A fragments).
// Host emulation of these roundings vs an f64 recurrence (d 128, 4096 tokens, the GPU test's
// input ranges; max error / max(1, |ref|)): as chosen here state 1.9e-6, outputs 1.5e-5
// (3e-7 with Bf16x3 output); everything plain tf32 state 1.6e-4 (fails the tests' 1e-4); f32
// throughout 2e-7.
enum class Prec { Simt, Tf32, Tf32x3, Bf16x3 };
constexpr Prec kPrecPrepare = Prec::Bf16x3, kPrecState = Prec::Bf16x3, kPrecOutput = Prec::Tf32;
// Row pads (floats) of shared-memory operands so that a warp's fragment loads hit distinct
// banks: tf32 fragments read 8 rows × 4 k (k-contiguous operand: pad ≡ 4 mod 32) or 4 k-rows
// × 8 (k-strided: ≡ 8); bf16 ones read k pairs, as one 8-byte load where k is contiguous
// (pad 8) or two loads 8 apart otherwise (pad 4).
constexpr int pad_kcontig(Prec p) { return p == Prec::Bf16x3 ? 8 : 4; }
constexpr int pad_kstrided(Prec p) { return p == Prec::Bf16x3 ? 4 : 8; }
// Workspace: ≤ ~98 KB per token for the 27B (header), within the memory plan's allowance for
// op temporaries (half the activations, ~109 KB per token); the cap only splits very long
// batches into segments.
constexpr size_t kWorkspaceBytes = size_t(1) << 30;
size_t& workspace_bytes() {  // kWorkspaceBytes; the GPU test lowers it to run many segments
  static size_t b = kWorkspaceBytes;
  return b;
}

// ---- shared-memory views and the warp-tiled product ----
// k pairs for the bf16 fragments: A's along its columns, B's along its rows (where those are
// contiguous, one 8-byte load: c, r even and ld even).
struct RowMajor {  // element (r, c) at p[r·ld + c]
  const float* p;
  int ld;
  __device__ float operator()(int r, int c) const { return p[r * ld + c]; }
  __device__ float2 col_pair(int r, int c) const { return *reinterpret_cast<const float2*>(p + r * ld + c); }
  __device__ float2 row_pair(int r, int c) const { return make_float2(p[r * ld + c], p[(r + 1) * ld + c]); }
};
struct ColMajor {  // element (r, c) at p[c·ld + r]: a row-major matrix read transposed
  const float* p;
  int ld;
  __device__ float operator()(int r, int c) const { return p[c * ld + r]; }
  __device__ float2 col_pair(int r, int c) const { return make_float2(p[c * ld + r], p[(c + 1) * ld + r]); }
  __device__ float2 row_pair(int r, int c) const { return *reinterpret_cast<const float2*>(p + c * ld + r); }
};

// x = big + small with big rounded to tf32 (10 mantissa bits); small is exact in f32 and the
// mma truncates it to tf32, an error of ≤ 2^-21 |x|.
[[maybe_unused]] __device__ __forceinline__ void split_tf32(float x, uint32_t& big, uint32_t& small) {
  const uint32_t b = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
  big = b;
  small = __float_as_uint(x - __uint_as_float(b));
}
__device__ __forceinline__ uint32_t to_tf32(float x) { return (__float_as_uint(x) + 0x1000u) & 0xffffe000u; }

// (x.x, x.y) = hi + lo, both rounded to bf16 and packed in pairs (x.x in the low half, the
// lower k index, as the mma fragments want): |x − hi − lo| ≤ 2^-18 |x|.
__device__ __forceinline__ void split_bf16x2(float2 x, uint32_t& hi, uint32_t& lo) {
  split2<__nv_bfloat16>(x.x, x.y, hi, lo);
}

// C[M × N] += A·B over the block's 8 warps: warp w owns an (16·MT) × (8·NT) tile of C in the
// m16n8 accumulator layout (lane: g = lane/4, t = lane%4; element e of tile (mt, nt) is
// row 16mt + g + 8(e/2), column 8nt + 2t + e%2 of the warp tile).
template <int M, int N, int MT, int NT, Prec P>
struct Acc {
  static constexpr int WN = N / (8 * NT);
  static_assert(M % (16 * MT) == 0 && N % (8 * NT) == 0 && (M / (16 * MT)) * WN == kWarps, "one tile per warp");
  float c[MT][NT][4];
  int m0, n0, g, t;

  __device__ Acc() {
    const int w = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
    m0 = (w / WN) * 16 * MT;
    n0 = (w % WN) * 8 * NT;
    g = lane >> 2;
    t = lane & 3;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) c[i][j][e] = 0.0f;
  }

  // f(row, col, element&) for each element this thread holds
  template <class F>
  __device__ void each(F f) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) f(m0 + 16 * i + g + 8 * (e >> 1), n0 + 8 * j + 2 * t + (e & 1), c[i][j][e]);
  }
  // f(row, col, pair&) for each pair of adjacent columns (col even) this thread holds
  template <class F>
  __device__ void each_pair(F f) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float2 v = make_float2(c[i][j][2 * h], c[i][j][2 * h + 1]);
          f(m0 + 16 * i + g + 8 * h, n0 + 8 * j + 2 * t, v);
          c[i][j][2 * h] = v.x;
          c[i][j][2 * h + 1] = v.y;
        }
  }

  // += A(:, 0..k_end) · B(0..k_end, :); k_end a multiple of 16
  template <class AV, class BV>
  __device__ void mma(const AV& A, const BV& B, int k_end) {
    if constexpr (P == Prec::Bf16x3) {
      for (int k0 = 0; k0 < k_end; k0 += 16) step_bf16x3(A, B, k0);
    } else {
      for (int k0 = 0; k0 < k_end; k0 += 8) step_k8(A, B, k0);
    }
  }

  template <class AV, class BV>
  __device__ __forceinline__ void step_bf16x3(const AV& A, const BV& B, int k0) {
    uint32_t ah[MT][4], al[MT][4], bh[NT][2], bl[NT][2];
    const int k = k0 + 2 * t;
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      const int r = m0 + 16 * i + g;
      split_bf16x2(A.col_pair(r, k), ah[i][0], al[i][0]);
      split_bf16x2(A.col_pair(r + 8, k), ah[i][1], al[i][1]);
      split_bf16x2(A.col_pair(r, k + 8), ah[i][2], al[i][2]);
      split_bf16x2(A.col_pair(r + 8, k + 8), ah[i][3], al[i][3]);
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int col = n0 + 8 * j + g;
      split_bf16x2(B.row_pair(k, col), bh[j][0], bl[j][0]);
      split_bf16x2(B.row_pair(k + 8, col), bh[j][1], bl[j][1]);
    }
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j) {  // the small terms first
        mma16816<__nv_bfloat16>(c[i][j], al[i], bh[j]);
        mma16816<__nv_bfloat16>(c[i][j], ah[i], bl[j]);
        mma16816<__nv_bfloat16>(c[i][j], ah[i], bh[j]);
      }
  }

  template <class AV, class BV>
  __device__ __forceinline__ void step_k8(const AV& A, const BV& B, int k0) {
    if constexpr (P == Prec::Simt) {
#pragma unroll
      for (int k = k0; k < k0 + 8; ++k) {
        float a[MT][2], b[NT][2];
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          a[i][0] = A(m0 + 16 * i + g, k);
          a[i][1] = A(m0 + 16 * i + g + 8, k);
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          b[j][0] = B(k, n0 + 8 * j + 2 * t);
          b[j][1] = B(k, n0 + 8 * j + 2 * t + 1);
        }
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
          for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) c[i][j][e] = fmaf(a[i][e >> 1], b[j][e & 1], c[i][j][e]);
      }
    } else if constexpr (P == Prec::Tf32) {
      uint32_t ab[MT][4], bb[NT][2];
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const int r = m0 + 16 * i + g;
        ab[i][0] = to_tf32(A(r, k0 + t));
        ab[i][1] = to_tf32(A(r + 8, k0 + t));
        ab[i][2] = to_tf32(A(r, k0 + t + 4));
        ab[i][3] = to_tf32(A(r + 8, k0 + t + 4));
      }
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int col = n0 + 8 * j + g;
        bb[j][0] = to_tf32(B(k0 + t, col));
        bb[j][1] = to_tf32(B(k0 + t + 4, col));
      }
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) mma_tf32(c[i][j], ab[i], bb[j]);
    } else {
      uint32_t ab[MT][4], as[MT][4], bb[NT][2], bs[NT][2];
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const int r = m0 + 16 * i + g;
        split_tf32(A(r, k0 + t), ab[i][0], as[i][0]);
        split_tf32(A(r + 8, k0 + t), ab[i][1], as[i][1]);
        split_tf32(A(r, k0 + t + 4), ab[i][2], as[i][2]);
        split_tf32(A(r + 8, k0 + t + 4), ab[i][3], as[i][3]);
      }
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int col = n0 + 8 * j + g;
        split_tf32(B(k0 + t, col), bb[j][0], bs[j][0]);
        split_tf32(B(k0 + t + 4, col), bb[j][1], bs[j][1]);
      }
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) {  // the small terms first
          mma_tf32(c[i][j], as[i], bb[j]);
          mma_tf32(c[i][j], ab[i], bs[j]);
          mma_tf32(c[i][j], ab[i], bb[j]);
        }
    }
  }
};

// ---- async copies ----
// 16 bytes of floats; an invalid copy zero-fills without reading (rows past the sequence).
__device__ __forceinline__ void cp_async16_or_zero(float* dst, const float* src, bool valid) {
  cp_async16_fill(smem_addr(dst), src, valid ? 16 : 0);
}
// BYTES (a multiple of 16) from global memory to the shared address dst by a block of NT
// threads, 16 bytes a copy; unrolled, 32-bit shared addresses (the fused scan issues ~6700
// copies per chunk step, in its sequential loop).
template <size_t BYTES, int NT>
__device__ __forceinline__ void copy_async(uint32_t dst, const void* src) {
  constexpr int N = int(BYTES / 16);
  const char* s = static_cast<const char*>(src);
#pragma unroll
  for (int i = 0; i < (N + NT - 1) / NT; ++i) {
    const int e = int(threadIdx.x) + i * NT;
    if (N % NT == 0 || e < N)
      cp_async16(dst + 16u * uint32_t(e), s + 16 * e);
  }
}

// ---- the kernels ----
struct ChunkArgs {
  const float *qn, *kn, *v, *g, *beta;  // q̂ (scaled), k̂ [T, Hk, dk]; v [T, Hv, dv]; g, β [T, Hv]
  StateRef state;                       // [slots, Hv, dk, dv] (a bf16 one is rounded at each launch's end)
  float* out;                           // [T, Hv, dv]
  const SeqRun* runs;
  int nruns, min_count;  // runs with count ≥ min_count are chunked
  int Hk, Hv;
  int64_t seg0, seg1;  // this launch's chunks, numbered over the chunked runs in order
  // split form's workspace per (chunk − seg0, head): W, U/V', S_c, γ
  float *w, *u, *sc, *gam;
  // fused form's records (see FragRecords): per (chunk − seg0, value head) and (…, key head)
  uint4 *wf, *kf;
  uint2 *qf, *pf;
  float4* uf;
  float* gt;
};

__device__ __forceinline__ int64_t chunks_of(int count) { return (int64_t(count) + kC - 1) / kC; }

// The chunks of run blockIdx.x (r) that this launch scans: run-relative [begin, end), and the
// run's first chunk number over the chunked runs (base).
struct RunChunks {
  int64_t base;
  int begin, end;
};
__device__ __forceinline__ RunChunks run_chunks(const ChunkArgs& a, const SeqRun& r) {
  int64_t base = 0;
  for (int i = 0; i < int(blockIdx.x); ++i)
    if (a.runs[i].count >= a.min_count) base += chunks_of(a.runs[i].count);
  const int64_t nc = chunks_of(r.count), lo = a.seg0 - base, hi = a.seg1 - base;
  return {base, int(lo > 0 ? lo : 0), int(hi < nc ? hi : nc)};
}

// The run and chunk index of chunk `gc` (numbered over the chunked runs in order). Called by
// the whole block; the first warp scans the run table 32 runs at a time (a batch may hold
// hundreds of one-token decode runs next to a prefill).
__device__ bool find_chunk(const ChunkArgs& a, int64_t gc, SeqRun& run, int& c) {
  __shared__ int found[2];
  if (threadIdx.x < 32) {
    const int lane = int(threadIdx.x);
    int base = 0, fr = -1, fc = 0;
    for (int i0 = 0; i0 < a.nruns && fr < 0; i0 += 32) {
      const int i = i0 + lane;
      const int cnt = i < a.nruns ? a.runs[i].count : 0;
      const int nc = cnt >= a.min_count ? int(chunks_of(cnt)) : 0;
      int incl = nc;  // inclusive prefix sum over the lanes
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
      }
      const int first = base + incl - nc;
      const unsigned hit = __ballot_sync(0xffffffffu, nc > 0 && gc >= first && gc < first + nc);
      if (hit) {
        const int src = __ffs(int(hit)) - 1;
        fr = i0 + src;
        fc = int(gc - __shfl_sync(0xffffffffu, first, src));
      }
      base += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) {
      found[0] = fr;
      found[1] = fc;
    }
  }
  __syncthreads();
  if (found[0] < 0) return false;
  run = a.runs[found[0]];
  c = found[1];
  return true;
}

// Where a block of the per-chunk kernels works: chunk a.seg0 + blockIdx.x, value head blockIdx.y.
struct ChunkSite {
  SeqRun r;
  int c, n, h, kh;            // the run's chunk, its token rows (≤ 64), the value head and its key head
  int64_t row0, head, khead;  // the chunk's first token row; its slot per value head and per key head
};

__device__ bool locate_chunk(const ChunkArgs& a, ChunkSite& at) {
  const int64_t gcl = blockIdx.x;
  if (!find_chunk(a, a.seg0 + gcl, at.r, at.c)) return false;
  at.h = int(blockIdx.y);
  at.kh = at.h / (a.Hv / a.Hk);
  at.n = min(kC, at.r.count - at.c * kC);
  at.row0 = int64_t(at.r.begin) + int64_t(at.c) * kC;
  at.head = gcl * a.Hv + at.h;
  at.khead = gcl * a.Hk + at.kh;
  return true;
}

// γ's prefix sum over the chunk, serial in the CPU's order (every later e^{γ} sees the same γ);
// the caller synchronises the block before and after.
__device__ void cumulate_gamma(float* gs) {
  if (threadIdx.x != 0) return;
  float v[kC], acc = 0;  // loads first (independent), then the dependent adds
#pragma unroll
  for (int i = 0; i < kC; ++i) v[i] = gs[i];
#pragma unroll
  for (int i = 0; i < kC; ++i) gs[i] = acc += v[i];
}

// Rows [0, n) of a chunk of q̂, k̂ (heads H, head hh) or v (Hv, h) into smem rows of stride
// ld (a multiple of 4), rows n..63 zero-filled; asynchronous (cp.async, the caller commits and
// waits): all of a thread's loads are in flight at once. (Plain loads stored to shared memory
// went one round trip per row group: the compiler cannot move a load above a store it may alias.)
template <int D>
__device__ void load_rows_async(float* dst, int ld, const float* src, int64_t row0, int n, int H, int hh) {
  for (int e = int(threadIdx.x); e < kC * D / 4; e += kThreads) {
    const int i = e / (D / 4), x = (e % (D / 4)) * 4;
    const bool ok = i < n;  // padding rows: zero-filled (the source row is only a valid address)
    cp_async16_or_zero(dst + i * ld + x, src + ((row0 + (ok ? i : 0)) * H + hh) * D + x, ok);
  }
}

// The prepare kernels' start: T's identity (invert_unit_lower's entry state) and the chunk's
// gates γ (before cumulate_gamma) and β for value head h, zero past its n tokens.
template <int LA>
__device__ __forceinline__ void start_prepare(const ChunkArgs& a, int64_t row0, int n, int h, float* Ts, float* gs,
                                              float* bs) {
  const int tid = int(threadIdx.x);
  for (int e = tid; e < kC * LA; e += kThreads) Ts[e] = e / LA == e % LA ? 1.0f : 0.0f;
  if (tid < kC) {
    gs[tid] = tid < n ? a.g[(row0 + tid) * a.Hv + h] : 0.0f;
    bs[tid] = tid < n ? a.beta[(row0 + tid) * a.Hv + h] : 0.0f;
  }
}
// Row i of a [64][ld] tile of D columns times f(i): β e^γ k̂ for W's operand, β v for U's.
template <int D, typename F>
__device__ __forceinline__ void scale_rows(float* X, int ld, F f) {
  for (int e = int(threadIdx.x); e < kC * D; e += kThreads) {
    const int i = e / D, x = e % D;
    X[i * ld + x] *= f(i);
  }
}

// T = (I − A)⁻¹ for the strictly lower A [64][LA] into Ts (which holds I on entry), in 16×16
// blocks. The four diagonal blocks by forward substitution, one warp each (row i of T − I:
// X_ij = A_ij + Σ_{j<m<i} A_im X_mj, two lanes per column); then the off-diagonal blocks by
// distance from the diagonal: T_IJ = T_II·Σ_{J≤M<I} A_IM T_MJ. f32 SIMT: the step that the
// carried state is most sensitive to. Ys: [3][16][16] scratch. Called by the whole block;
// ends with a barrier (and its first barrier orders the caller's earlier shared writes).
template <int LA>
__device__ void invert_unit_lower(const float* As, float* Ts, float* Ys) {
  const int tid = int(threadIdx.x), w = tid >> 5, lane = tid & 31;
  if (w < 4) {
    const int o = 16 * w, j = lane & 15, p = lane >> 4;
    for (int i = 1; i < 16; ++i) {
      float s = 0;
      if (j < i)
        for (int m = j + 1 + p; m < i; m += 2) s += As[(o + i) * LA + o + m] * Ts[(o + m) * LA + o + j];
      s += __shfl_xor_sync(0xffffffffu, s, 16);
      if (j < i && p == 0) Ts[(o + i) * LA + o + j] = As[(o + i) * LA + o + j] + s;
      __syncwarp();
    }
  }
  __syncthreads();
  const int r = tid >> 4, cc = tid & 15;
  for (int d = 1; d < 4; ++d) {
    for (int J = 0; J + d < 4; ++J) {  // Y = Σ_{J≤M<I} A_IM T_MJ: columns 16J..16I of A's row
      const int I = J + d;
      float y = 0;
      for (int x = 16 * J; x < 16 * I; ++x) y += As[(16 * I + r) * LA + x] * Ts[x * LA + 16 * J + cc];
      Ys[J * 256 + r * 16 + cc] = y;
    }
    __syncthreads();
    for (int J = 0; J + d < 4; ++J) {  // T_IJ = T_II · Y
      const int I = J + d;
      float s = 0;
      for (int m = 0; m < 16; ++m) s += Ts[(16 * I + r) * LA + 16 * I + m] * Ys[J * 256 + m * 16 + cc];
      Ts[(16 * I + r) * LA + 16 * J + cc] = s;
    }
    __syncthreads();
  }
}

template <int DK, int DV>
struct PrepLayout {
  // K̂ is read k-contiguous as A and Bᵀ, and k-strided as B in W (2-way conflicts, accepted);
  // V k-strided as B; T (in the LA rows) k-contiguous as A
  static constexpr int LK = DK + pad_kcontig(kPrecPrepare), LV = DV + pad_kstrided(kPrecPrepare),
                       LA = kC + pad_kcontig(kPrecPrepare);
  static constexpr size_t bytes = (size_t(kC) * (LK + LV + 2 * LA) + 2 * kC + 3 * 256) * sizeof(float);
};

template <int DK, int DV>
__global__ void __launch_bounds__(kThreads, 2) chunk_prepare_kernel(ChunkArgs a) {
  using L = PrepLayout<DK, DV>;
  extern __shared__ float4 smem4[];
  float* Ks = reinterpret_cast<float*>(smem4);  // [64][LK] k̂, then β e^γ k̂
  float* Vs = Ks + kC * L::LK;                  // [64][LV] v, then β v
  float* As = Vs + kC * L::LV;                  // [64][LA] A (strictly lower)
  float* Ts = As + kC * L::LA;                  // [64][LA] T = (I − A)⁻¹
  float* gs = Ts + kC * L::LA;                  // [64] γ
  float* bs = gs + kC;                          // [64] β
  float* Ys = bs + kC;                          // [3][16][16] blocks of the inverse in progress
  ChunkSite at;
  if (!locate_chunk(a, at)) return;
  const auto& [r, c, n, h, kh, row0, head, khead] = at;
  const int tid = int(threadIdx.x);

  load_rows_async<DK>(Ks, L::LK, a.kn, row0, n, a.Hk, kh);
  load_rows_async<DV>(Vs, L::LV, a.v, row0, n, a.Hv, h);
  cp_async_commit();
  start_prepare<L::LA>(a, row0, n, h, Ts, gs, bs);
  cp_async_wait<0>();
  __syncthreads();
  cumulate_gamma(gs);
  __syncthreads();
  if (tid < kC) a.gam[head * kC + tid] = gs[tid];

  {  // A_ij = −β_i (k̂_i·k̂_j) e^{γ_i−γ_j} for j < i (warp tiles wholly above the diagonal skip the product)
    Acc<kC, kC, 2, 2, kPrecPrepare> acc;
    if (acc.n0 < acc.m0 + 32) acc.mma(RowMajor{Ks, L::LK}, ColMajor{Ks, L::LK}, DK);
    acc.each([&](int i, int j, float& s) {
      As[i * L::LA + j] = j < i ? -(bs[i] * s) * expf(gs[i] - gs[j]) : 0.0f;
    });
  }
  __syncthreads();
  // The W and U operands (nothing reads Ks or Vs during the substitution below).
  scale_rows<DK>(Ks, L::LK, [&](int i) { return bs[i] * expf(gs[i]); });
  scale_rows<DV>(Vs, L::LV, [&](int i) { return bs[i]; });
  invert_unit_lower<L::LA>(As, Ts, Ys);
  {  // W = T·(β e^γ K̂); T is lower triangular, so a warp's rows need columns < m0 + 32 only
    Acc<kC, DK, 2, DK / 32, kPrecPrepare> acc;
    acc.mma(RowMajor{Ts, L::LA}, RowMajor{Ks, L::LK}, acc.m0 + 32);
    float* W = a.w + head * kC * DK;
    acc.each_pair([&](int i, int x, float2& s) { *reinterpret_cast<float2*>(W + i * DK + x) = s; });
  }
  {  // U = T·(β V)
    Acc<kC, DV, 2, DV / 32, kPrecPrepare> acc;
    acc.mma(RowMajor{Ts, L::LA}, RowMajor{Vs, L::LV}, acc.m0 + 32);
    float* U = a.u + head * kC * DV;
    acc.each_pair([&](int i, int x, float2& s) { *reinterpret_cast<float2*>(U + i * DV + x) = s; });
  }
}

template <int DK, int DV>
struct ScanLayout {
  // W: A row-major (k-contiguous); K̂: A read transposed, and S, V': B row-major (k-strided)
  static constexpr int LW = DK + pad_kcontig(kPrecState), LKt = DK + pad_kstrided(kPrecState),
                       LN = kNB + pad_kstrided(kPrecState);
  static constexpr size_t bytes = (size_t(kC) * (LW + LKt + 2 * LN) + size_t(DK) * LN + 2 * kC) * sizeof(float);
};

template <int DK, int DV>
__global__ void __launch_bounds__(kThreads, 2) chunk_state_kernel(ChunkArgs a) {
  using L = ScanLayout<DK, DV>;
  const SeqRun r = a.runs[blockIdx.x];
  if (r.count < a.min_count) return;
  const RunChunks rc = run_chunks(a, r);
  if (rc.begin >= rc.end) return;
  const int64_t base = rc.base;
  const int c_begin = rc.begin, c_end = rc.end;

  extern __shared__ float4 smem4[];
  float* Ws = reinterpret_cast<float*>(smem4);  // [64][LW] W of the chunk
  float* Kt = Ws + kC * L::LW;                   // [64][LKt] k̂ of the chunk
  float* Us = Kt + kC * L::LKt;                  // [64][LN] U, this block's columns
  float* Vn = Us + kC * L::LN;                   // [64][LN] V' ⊙ e^{γ_last − γ}
  float* Ss = Vn + kC * L::LN;                   // [DK][LN] S before the chunk
  float* gs = Ss + DK * L::LN;                   // [2][64] γ, double-buffered with W/U
  const int h = int(blockIdx.y), kh = h / (a.Hv / a.Hk), col0 = int(blockIdx.z) * kNB, tid = int(threadIdx.x);
  const int64_t S = (int64_t(r.slot) * a.Hv + h) * DK * DV + col0;  // row x at element S + x·DV
  auto head_of = [&](int c) { return (base + c - a.seg0) * a.Hv + h; };

  auto issue_wu = [&](int c) {
    const int64_t hd = head_of(c);
    const float* W = a.w + hd * kC * DK;
    for (int e = tid; e < kC * DK / 4; e += kThreads) {
      const int i = e / (DK / 4), x = (e % (DK / 4)) * 4;
      cp_async16(Ws + i * L::LW + x, W + i * DK + x);
    }
    const float* U = a.u + hd * kC * DV + col0;
    for (int e = tid; e < kC * kNB / 4; e += kThreads) {
      const int i = e / (kNB / 4), x = (e % (kNB / 4)) * 4;
      cp_async16(Us + i * L::LN + x, U + i * DV + x);
    }
    if (tid < kC / 4) cp_async16(gs + (c & 1) * kC + tid * 4, a.gam + hd * kC + tid * 4);
  };
  auto issue_k = [&](int c) {
    const int64_t row0 = int64_t(r.begin) + int64_t(c) * kC;
    const int n = min(kC, r.count - c * kC);
    for (int e = tid; e < kC * DK / 4; e += kThreads) {
      const int i = e / (DK / 4), x = (e % (DK / 4)) * 4;
      const bool ok = i < n;  // padding rows are zero-filled (the source row is only a valid address)
      cp_async16_or_zero(Kt + i * L::LKt + x, a.kn + ((row0 + (ok ? i : 0)) * a.Hk + kh) * DK + x, ok);
    }
  };

  Acc<DK, kNB, DK / 64, 2, kPrecState> st;  // the state slice S[:, col0 .. col0+32)
  st.each_pair([&](int x, int y, float2& s) { s = a.state.load2(S + int64_t(x) * DV + y); });
  issue_wu(c_begin);
  cp_async_commit();
  issue_k(c_begin);
  cp_async_commit();
  for (int c = c_begin; c < c_end; ++c) {
    const int64_t hd = head_of(c);
    const float* gam = gs + (c & 1) * kC;
    st.each_pair([&](int x, int y, float2& s) { *reinterpret_cast<float2*>(Ss + x * L::LN + y) = s; });
    cp_async_wait<1>();  // W, U, γ of chunk c (k̂ of chunk c may still be in flight)
    __syncthreads();
    float* Sc = a.sc + hd * DK * DV + col0;
    for (int e = tid; e < DK * kNB / 4; e += kThreads) {
      const int x = e / (kNB / 4), y = (e % (kNB / 4)) * 4;
      *reinterpret_cast<float4*>(Sc + x * DV + y) = *reinterpret_cast<const float4*>(Ss + x * L::LN + y);
    }
    {  // V' = U − W·S (to the workspace for the output kernel, and decayed to smem for the update)
      Acc<kC, kNB, 1, 2, kPrecState> acc;
      acc.mma(RowMajor{Ws, L::LW}, RowMajor{Ss, L::LN}, DK);
      const float gl = gam[kC - 1];
      float* U = a.u + hd * kC * DV + col0;
      acc.each_pair([&](int i, int y, float2& s) {
        const float2 u = *reinterpret_cast<const float2*>(Us + i * L::LN + y);
        const float2 vn = make_float2(u.x - s.x, u.y - s.y);
        const float e = expf(gl - gam[i]);
        *reinterpret_cast<float2*>(U + i * DV + y) = vn;
        *reinterpret_cast<float2*>(Vn + i * L::LN + y) = make_float2(vn.x * e, vn.y * e);
      });
    }
    __syncthreads();
    if (c + 1 < c_end) issue_wu(c + 1);
    cp_async_commit();
    cp_async_wait<1>();  // k̂ of chunk c (W, U of the next chunk may still be in flight)
    __syncthreads();
    const float el = expf(gam[kC - 1]);
    st.each([&](int, int, float& s) { s *= el; });
    st.mma(ColMajor{Kt, L::LKt}, RowMajor{Vn, L::LN}, kC);  // S += K̂ᵀ·(e^{γ_last−γ} V')
    __syncthreads();
    if (c + 1 < c_end) issue_k(c + 1);
    cp_async_commit();
  }
  st.each_pair([&](int x, int y, float2& s) { a.state.store2(S + int64_t(x) * DV + y, s); });
}

template <int DK, int DV>
struct OutLayout {
  // Q̂, P: A row-major, K̂: Bᵀ (k-contiguous); S_c / V' tiles of 32 rows: B row-major (k-strided)
  // Three tile buffers: two loads in flight while one tile is multiplied (a block is mostly
  // waiting on those loads; 2 blocks of ~101 KB per SM at d 128).
  static constexpr int LQ = DK + pad_kcontig(kPrecOutput), LP = kC + pad_kcontig(kPrecOutput),
                       LB = DV + pad_kstrided(kPrecOutput), TB = 32, NB = 3;
  static constexpr int KB = kC * LQ > NB * TB * LB ? kC * LQ : NB * TB * LB;  // K̂, later the B tiles
  static constexpr size_t bytes = (size_t(kC) * LQ + KB + size_t(kC) * LP + kC) * sizeof(float);
};

template <int DK, int DV>
__global__ void __launch_bounds__(kThreads, 2) chunk_output_kernel(ChunkArgs a) {
  using L = OutLayout<DK, DV>;
  extern __shared__ float4 smem4[];
  float* Qs = reinterpret_cast<float*>(smem4);  // [64][LQ] q̂, then q̂ e^γ
  float* Ks = Qs + kC * L::LQ;                   // [64][LQ] k̂
  float* Bt = Ks;                                // [NB][TB][LB] after P: tiles of S_c and V'
  float* Ps = Ks + L::KB;                        // [64][LP] tril(Q̂K̂ᵀ ⊙ e^{γ_i−γ_j})
  float* gs = Ps + kC * L::LP;                   // [64] γ
  ChunkSite at;
  if (!locate_chunk(a, at)) return;
  const auto& [r, c, n, h, kh, row0, head, khead] = at;
  const int tid = int(threadIdx.x);

  load_rows_async<DK>(Qs, L::LQ, a.qn, row0, n, a.Hk, kh);
  load_rows_async<DK>(Ks, L::LQ, a.kn, row0, n, a.Hk, kh);
  cp_async_commit();
  if (tid < kC) gs[tid] = a.gam[head * kC + tid];
  cp_async_wait<0>();
  __syncthreads();
  {
    Acc<kC, kC, 2, 2, kPrecOutput> acc;
    if (acc.n0 < acc.m0 + 32) acc.mma(RowMajor{Qs, L::LQ}, ColMajor{Ks, L::LQ}, DK);
    acc.each([&](int i, int j, float& s) { Ps[i * L::LP + j] = j <= i ? s * expf(gs[i] - gs[j]) : 0.0f; });
  }
  __syncthreads();
  constexpr int kTilesS = DK / L::TB, kTiles = kTilesS + kC / L::TB;
  static_assert(kTiles >= 2 && L::NB == 3, "two tiles issued ahead");
  const float* Sc = a.sc + head * DK * DV;
  const float* Vn = a.u + head * kC * DV;
  auto issue_tile = [&](int t) {
    const float* src = t < kTilesS ? Sc + int64_t(t) * L::TB * DV : Vn + int64_t(t - kTilesS) * L::TB * DV;
    float* dst = Bt + (t % L::NB) * L::TB * L::LB;
    for (int e = tid; e < L::TB * DV / 4; e += kThreads) {
      const int k = e / (DV / 4), y = (e % (DV / 4)) * 4;
      cp_async16(dst + k * L::LB + y, src + k * DV + y);
    }
  };
  issue_tile(0);
  cp_async_commit();
  issue_tile(1);
  cp_async_commit();
  for (int e = tid; e < kC * DK; e += kThreads) {
    const int i = e / DK, x = e % DK;
    Qs[i * L::LQ + x] *= expf(gs[i]);
  }
  Acc<kC, DV, 2, DV / 32, kPrecOutput> acc;  // O = [Q̂ e^γ | P] · [S_c ; V'], 32 rows of the right side at a time
  for (int t = 0; t < kTiles; ++t) {
    if (t + 2 < kTiles) issue_tile(t + 2);  // into the buffer of tile t − 1, released by the last sync
    cp_async_commit();
    cp_async_wait<2>();  // tile t (t + 1 and t + 2 may be in flight)
    __syncthreads();
    const RowMajor B{Bt + (t % L::NB) * L::TB * L::LB, L::LB};
    if (t < kTilesS)
      acc.mma(RowMajor{Qs + t * L::TB, L::LQ}, B, L::TB);
    else if ((t - kTilesS) * L::TB < acc.m0 + 32)  // P is lower triangular: skip its zero blocks
      acc.mma(RowMajor{Ps + (t - kTilesS) * L::TB, L::LP}, B, L::TB);
    __syncthreads();
  }
  acc.each_pair([&](int i, int y, float2& s) {
    if (i < n) *reinterpret_cast<float2*>(a.out + ((row0 + i) * a.Hv + h) * DV + y) = s;
  });
}

// ---- the fused form: records in mma-fragment order, then one scan kernel that also writes O ----
//
// chunk_prep_frag_kernel writes, per chunk, the operands of the scan's products in the order
// its warps read them as mma B fragments (g = lane/4, t = lane%4; "pair(a, b)": a in the low
// half, the lower k index): one 8- or 16-byte shared load per lane and fragment, no conversions
// in the sequential kernel. Per (chunk, value head):
//  Wf [DK/16][8][32] uint4: −W split bf16 hi/lo, B(k = key, n = token) of V'ᵀ = Uᵀ + Sᵀ(−W)ᵀ;
//     tile (kk, j), lane: {hi b0, hi b1, lo b0, lo b1}, b0 = pair(−W(8j+g, 16kk+2t), −W(8j+g, 16kk+2t+1)),
//     b1 the same at keys + 8
//  Pf [4][8][32] uint2: P = tril(q̂k̂ᵀ ⊙ e^{γ_i−γ_j}) in f16, B(k = token j, n = token i) of V'ᵀPᵀ;
//     {b0, b1}, b0 = pair(P(8n+g, 16kk+2t), P(8n+g, 16kk+2t+1)), b1 at j + 8
//  Uf [DV/16][8][32] float4: U in the accumulator layout of V'ᵀ (16 value columns × 8 tokens a
//     tile): {U(8j+2t, 16cg+g), U(8j+2t+1, 16cg+g), U(8j+2t, 16cg+g+8), U(8j+2t+1, 16cg+g+8)}
//  Gt [132] f32: e^{γ_i} (64), e^{γ_last−γ_i} (64), e^{γ_last}, 3 zeros
// and per (chunk, key head), by the first value head of the group:
//  Kf [4][DK/8][32] uint4: k̂ split bf16 hi/lo, B(k = token, n = key) of Sᵀ += (V'ᵀD)K̂;
//     b0 = pair(k̂(16kk+2t, 8j+g), k̂(16kk+2t+1, 8j+g)), b1 at tokens + 8
//  Qf [DK/16][8][32] uint2: q̂ in f16, B(k = key, n = token) of Sᵀq̂ᵀ;
//     b0 = pair(q̂(8j+g, 16kk+2t), q̂(8j+g, 16kk+2t+1)), b1 at keys + 8
template <int DK, int DV>
struct FragRecords {  // sizes in their own units (uint4, uint2, float4, float)
  static constexpr int64_t W = 16 * DK, P = 4 * 8 * 32, U = 16 * DV, G = 2 * kC + 4, K = 16 * DK, Q = 16 * DK;
  static constexpr int64_t value_bytes = W * 16 + P * 8 + U * 16 + G * 4, key_bytes = K * 16 + Q * 8;
};

template <int DK, int DV>
struct PrepFragLayout {
  // [K̂; Q̂] (128 rows) is the Gram product's A (k-contiguous) and K̂ its Bᵀ; K̂ then B of W
  // (k-strided, 2-way conflicts); v reuses q̂'s rows with its own pad (B of U, read transposed as A)
  static constexpr int LK = DK + pad_kcontig(kPrecPrepare), LV = DV + pad_kstrided(kPrecPrepare),
                       LA = kC + pad_kcontig(kPrecPrepare);
  static_assert(LV <= LK, "v takes q̂'s rows");
  static constexpr size_t bytes = (size_t(2 * kC) * LK + size_t(2 * kC) * LA + 2 * kC + 3 * 256) * sizeof(float);
};

// Kf and Qf of a key head from k̂, q̂ in shared memory (rows of stride ld).
template <int DK>
__device__ void write_key_frags(const float* Ks, const float* Qs, int ld, uint4* kf, uint2* qf) {
  for (int e = int(threadIdx.x); e < 16 * DK; e += kThreads) {
    const int ln = e & 31, tile = e >> 5, gg = ln >> 2, tt = ln & 3;
    {
      const int kk = tile / (DK / 8), x = 8 * (tile % (DK / 8)) + gg, r0 = 16 * kk + 2 * tt;
      uint32_t h0, l0, h1, l1;
      split_bf16x2(make_float2(Ks[r0 * ld + x], Ks[(r0 + 1) * ld + x]), h0, l0);
      split_bf16x2(make_float2(Ks[(r0 + 8) * ld + x], Ks[(r0 + 9) * ld + x]), h1, l1);
      kf[e] = make_uint4(h0, h1, l0, l1);
    }
    {
      const int kk = tile / 8, i = 8 * (tile % 8) + gg, x0 = 16 * kk + 2 * tt;
      const float2 q0 = *reinterpret_cast<const float2*>(Qs + i * ld + x0);
      const float2 q1 = *reinterpret_cast<const float2*>(Qs + i * ld + x0 + 8);
      qf[e] = make_uint2(pack2<__half>(q0.x, q0.y), pack2<__half>(q1.x, q1.y));
    }
  }
}

// The prepare of the fused form: the split form's prepare (same products, same precision) plus
// P, with every result written as FragRecords.
template <int DK, int DV>
__global__ void __launch_bounds__(kThreads, 2) chunk_prep_frag_kernel(ChunkArgs a) {
  using L = PrepFragLayout<DK, DV>;
  using R = FragRecords<DK, DV>;
  extern __shared__ float4 smem4[];
  float* Ks = reinterpret_cast<float*>(smem4);  // [64][LK] k̂, then β e^γ k̂
  float* Qs = Ks + kC * L::LK;                  // [64][LK] q̂ (rows 64..127 of the Gram product's A)
  float* Vs = Qs;                               // [64][LV] v, then β v (after the Gram product)
  float* As = Qs + kC * L::LK;                  // [64][LA] A (strictly lower)
  float* Ts = As + kC * L::LA;                  // [64][LA] T = (I − A)⁻¹
  float* gs = Ts + kC * L::LA;                  // [64] γ
  float* bs = gs + kC;                          // [64] β
  float* Ys = bs + kC;                          // [3][16][16] blocks of the inverse in progress
  ChunkSite at;
  if (!locate_chunk(a, at)) return;
  const auto& [r, c, n, h, kh, row0, head, khead] = at;
  const int ratio = a.Hv / a.Hk, tid = int(threadIdx.x), lane = tid & 31;

  load_rows_async<DK>(Ks, L::LK, a.kn, row0, n, a.Hk, kh);
  load_rows_async<DK>(Qs, L::LK, a.qn, row0, n, a.Hk, kh);
  cp_async_commit();
  start_prepare<L::LA>(a, row0, n, h, Ts, gs, bs);
  __syncthreads();
  cumulate_gamma(gs);
  __syncthreads();
  if (tid < kC) {  // Gt: the scan's per-token factors
    float* G = a.gt + head * R::G;
    G[tid] = expf(gs[tid]);
    G[kC + tid] = expf(gs[kC - 1] - gs[tid]);
    if (tid < 4) G[2 * kC + tid] = tid == 0 ? expf(gs[kC - 1]) : 0.0f;
  }
  cp_async_wait<0>();
  __syncthreads();
  if (h == kh * ratio) write_key_frags<DK>(Ks, Qs, L::LK, a.kf + khead * R::K, a.qf + khead * R::Q);

  {  // [K̂; Q̂]·K̂ᵀ: rows 0..63 give A_ij = −β_i (k̂_i·k̂_j) e^{γ_i−γ_j} (j < i), rows 64..127
     // P_ij = (q̂_i·k̂_j) e^{γ_i−γ_j} (j ≤ i); warp tiles wholly above the diagonal skip the product
    Acc<2 * kC, kC, 2, 4, kPrecPrepare> acc;
    if (acc.n0 <= (acc.m0 & (kC - 1))) acc.mma(RowMajor{Ks, L::LK}, ColMajor{Ks, L::LK}, DK);
    if (acc.m0 < kC) {
      acc.each([&](int i, int j, float& s) {
        As[i * L::LA + j] = j < i ? -(bs[i] * s) * expf(gs[i] - gs[j]) : 0.0f;
      });
    } else {
      uint2* P = a.pf + head * R::P;
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int i = acc.m0 - kC + 16 * mi + acc.g + 8 * hh;
          auto p = [&](int j, float s) { return j <= i ? s * expf(gs[i] - gs[j]) : 0.0f; };
#pragma unroll
          for (int nj = 0; nj < 4; nj += 2) {  // n-tiles nj, nj + 1: columns j0.., j0 + 8..
            const int j0 = acc.n0 + 8 * nj + 2 * acc.t;
            const float* c0 = acc.c[mi][nj];
            const float* c1 = acc.c[mi][nj + 1];
            P[(((acc.n0 + 8 * nj) / 16) * 8 + i / 8) * 32 + lane] =
                make_uint2(pack2<__half>(p(j0, c0[2 * hh]), p(j0 + 1, c0[2 * hh + 1])),
                           pack2<__half>(p(j0 + 8, c1[2 * hh]), p(j0 + 9, c1[2 * hh + 1])));
          }
        }
    }
  }
  __syncthreads();  // A complete; q̂ (and, for the key head's writer, k̂ unscaled) no longer read
  load_rows_async<DV>(Vs, L::LV, a.v, row0, n, a.Hv, h);
  cp_async_commit();
  scale_rows<DK>(Ks, L::LK, [&](int i) { return bs[i] * expf(gs[i]); });
  invert_unit_lower<L::LA>(As, Ts, Ys);
  {  // W = T·(β e^γ K̂) → Wf as −W; T is lower triangular, so a warp's rows need columns < m0 + 32 only
    constexpr int NT = DK / 32;
    Acc<kC, DK, 2, NT, kPrecPrepare> acc;
    acc.mma(RowMajor{Ts, L::LA}, RowMajor{Ks, L::LK}, acc.m0 + 32);
    uint4* W = a.wf + head * R::W;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int i = acc.m0 + 16 * mi + acc.g + 8 * hh;
#pragma unroll
        for (int nj = 0; nj < NT; nj += 2) {  // keys n0 + 8nj + 2t.. (b0) and + 8 (b1)
          uint32_t h0, l0, h1, l1;
          split_bf16x2(make_float2(-acc.c[mi][nj][2 * hh], -acc.c[mi][nj][2 * hh + 1]), h0, l0);
          split_bf16x2(make_float2(-acc.c[mi][nj + 1][2 * hh], -acc.c[mi][nj + 1][2 * hh + 1]), h1, l1);
          W[(((acc.n0 + 8 * nj) / 16) * 8 + i / 8) * 32 + lane] = make_uint4(h0, h1, l0, l1);
        }
      }
  }
  cp_async_wait<0>();
  __syncthreads();
  scale_rows<DV>(Vs, L::LV, [&](int i) { return bs[i]; });
  __syncthreads();
  {  // Uᵀ = (β V)ᵀ·Tᵀ (value columns × tokens): each accumulator tile is one Uf float4 per lane;
     // T lower triangular: a warp's tokens n0.. need columns of T below n0 + 32 only
    constexpr int MT = DV / 64;
    Acc<DV, kC, MT, 4, kPrecPrepare> acc;
    acc.mma(ColMajor{Vs, L::LV}, ColMajor{Ts, L::LA}, acc.n0 + 32);
    float4* U = a.uf + head * R::U;
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int nj = 0; nj < 4; ++nj) {
        const float* cc = acc.c[mi][nj];
        U[(((acc.m0 + 16 * mi) / 16) * 8 + (acc.n0 + 8 * nj) / 8) * 32 + lane] =
            make_float4(cc[0], cc[1], cc[2], cc[3]);
      }
  }
}

// The fused scan: grid (runs, Hv, DV/64), 4 warps; warp w owns value columns cw .. cw+15 of
// the head's state as Sᵀ (16 × DK) in m16n8 accumulators, which are also the A fragments of
// the next products (an accumulator pair of adjacent n8 tiles is an m16k16 A fragment), so a
// warp never exchanges state with another; the block shares only the chunk records, loaded
// (cp.async) STAGES − 1 chunks ahead. Per chunk, in registers:
//   V'ᵀ = Uᵀ + Sᵀ(−W)ᵀ                    bf16 hi/lo, 3 mma per k16 (feeds the state)
//   Oᵀ  = e^γ ⊙ (Sᵀq̂ᵀ) + V'ᵀPᵀ → out    f16 (2^-11 per operand as tf32; not carried)
//   Sᵀ  = e^{γ_last} Sᵀ + (V'ᵀD)K̂        bf16 hi/lo, D = diag(e^{γ_last−γ})
// f16 operands assume |S|, |V'| < 65504 (the delta rule keeps the state of the order of v).
// Per warp and chunk (DK 128): 192 + 64 + ≤ 32 + 192 mma and ~100 KB of shared loads (B
// fragments, shared by the warps); per block one chunk record, ~105 KB.
constexpr int kScanWarps = 4;
constexpr int kScanCols = 16 * kScanWarps;

template <int DK, int DV>
struct FusedLayout {  // one stage, in bytes: the records of a chunk as the block reads them
  using R = FragRecords<DK, DV>;
  static constexpr size_t W = R::W * 16, K = R::K * 16, Q = R::Q * 8, P = R::P * 8, U = kScanWarps * 8 * 32 * 16,
                          G = R::G * 4;
  static constexpr size_t oW = 0, oK = oW + W, oQ = oK + K, oP = oQ + Q, oU = oP + P, oG = oU + U, stage = oG + G;
  static_assert(stage % 16 == 0 && oG % 16 == 0, "16-byte copies");
};

template <int DK, int DV, int STAGES>
__global__ void __launch_bounds__(32 * kScanWarps, 1) chunk_scan_fused_kernel(ChunkArgs a) {
  using L = FusedLayout<DK, DV>;
  using R = FragRecords<DK, DV>;
  constexpr int KT = DK / 8;  // n8 tiles of Sᵀ (keys)
  const SeqRun r = a.runs[blockIdx.x];
  if (r.count < a.min_count) return;
  const RunChunks rc = run_chunks(a, r);
  if (rc.begin >= rc.end) return;
  const int64_t base = rc.base;
  const int c_begin = rc.begin, c_end = rc.end;

  extern __shared__ float4 smem4[];
  unsigned char* sm = reinterpret_cast<unsigned char*>(smem4);
  const int h = int(blockIdx.y), kh = h / (a.Hv / a.Hk), tid = int(threadIdx.x);
  const int w = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int col0 = int(blockIdx.z) * kScanCols, cw = col0 + 16 * w;
  const int64_t S = (int64_t(r.slot) * a.Hv + h) * DK * DV;  // in elements

  const uint32_t sm_addr = smem_addr(sm);
  auto issue = [&](int c, int stage) {
    constexpr int NT = 32 * kScanWarps;
    const int64_t hd = (base + c - a.seg0) * a.Hv + h, kd = (base + c - a.seg0) * a.Hk + kh;
    const uint32_t d = sm_addr + uint32_t(stage) * uint32_t(L::stage);
    copy_async<L::W, NT>(d + uint32_t(L::oW), a.wf + hd * R::W);
    copy_async<L::K, NT>(d + uint32_t(L::oK), a.kf + kd * R::K);
    copy_async<L::Q, NT>(d + uint32_t(L::oQ), a.qf + kd * R::Q);
    copy_async<L::P, NT>(d + uint32_t(L::oP), a.pf + hd * R::P);
    copy_async<L::U, NT>(d + uint32_t(L::oU), a.uf + hd * R::U + (col0 / 16) * (8 * 32));
    copy_async<L::G, NT>(d + uint32_t(L::oG), a.gt + hd * R::G);
  };

  // Sᵀ tile j: s[j][e] = S(key 8j + 2t + e%2, column cw + g + 8(e/2))
  float s[KT][4];
#pragma unroll
  for (int j = 0; j < KT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = a.state.load(S + int64_t(8 * j + 2 * t + (e & 1)) * DV + cw + g + 8 * (e >> 1));
#pragma unroll
  for (int i = 0; i < STAGES; ++i) {
    if (c_begin + i < c_end) issue(c_begin + i, i);
    cp_async_commit();
  }
  for (int c = c_begin; c < c_end; ++c) {
    const int stage = (c - c_begin) % STAGES;
    cp_async_wait<STAGES - 1>();  // chunk c's records (later chunks' may be in flight)
    __syncthreads();
    const unsigned char* st = sm + size_t(stage) * L::stage;
    const uint4* Wf = reinterpret_cast<const uint4*>(st + L::oW);
    const uint4* Kf = reinterpret_cast<const uint4*>(st + L::oK);
    const uint2* Qf = reinterpret_cast<const uint2*>(st + L::oQ);
    const uint2* Pf = reinterpret_cast<const uint2*>(st + L::oP);
    const float4* Uf = reinterpret_cast<const float4*>(st + L::oU) + w * (8 * 32);
    const float* G = reinterpret_cast<const float*>(st + L::oG);

    float v[8][4], x[8][4];  // V'ᵀ and Oᵀ tiles j: (column cw + g + 8(e/2), token 8j + 2t + e%2)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float4 u = Uf[j * 32 + lane];
      v[j][0] = u.x, v[j][1] = u.y, v[j][2] = u.z, v[j][3] = u.w;
      x[j][0] = x[j][1] = x[j][2] = x[j][3] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < DK / 16; ++kk) {  // keys 16kk..16kk+15: A = Sᵀ tiles 2kk, 2kk + 1
      uint32_t ah[4], al[4], af[4];
      split_bf16x2(make_float2(s[2 * kk][0], s[2 * kk][1]), ah[0], al[0]);
      split_bf16x2(make_float2(s[2 * kk][2], s[2 * kk][3]), ah[1], al[1]);
      split_bf16x2(make_float2(s[2 * kk + 1][0], s[2 * kk + 1][1]), ah[2], al[2]);
      split_bf16x2(make_float2(s[2 * kk + 1][2], s[2 * kk + 1][3]), ah[3], al[3]);
      af[0] = pack2<__half>(s[2 * kk][0], s[2 * kk][1]);
      af[1] = pack2<__half>(s[2 * kk][2], s[2 * kk][3]);
      af[2] = pack2<__half>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      af[3] = pack2<__half>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint4 wb = Wf[(kk * 8 + j) * 32 + lane];
        const uint32_t bh[2] = {wb.x, wb.y}, bl[2] = {wb.z, wb.w};
        mma16816<__nv_bfloat16>(v[j], al, bh);  // the small terms first
        mma16816<__nv_bfloat16>(v[j], ah, bl);
        mma16816<__nv_bfloat16>(v[j], ah, bh);
        const uint2 qb = Qf[(kk * 8 + j) * 32 + lane];
        const uint32_t bq[2] = {qb.x, qb.y};
        mma16816<__half>(x[j], af, bq);
      }
    }
    // Oᵀ = e^γ ⊙ Sᵀq̂ᵀ + V'ᵀPᵀ (P lower triangular: k-step kk reaches token tiles n ≥ 2kk only)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) x[j][e] *= G[8 * j + 2 * t + (e & 1)];
#pragma unroll
    for (int kk = 0; kk < kC / 16; ++kk) {
      const uint32_t av[4] = {pack2<__half>(v[2 * kk][0], v[2 * kk][1]), pack2<__half>(v[2 * kk][2], v[2 * kk][3]),
                              pack2<__half>(v[2 * kk + 1][0], v[2 * kk + 1][1]),
                              pack2<__half>(v[2 * kk + 1][2], v[2 * kk + 1][3])};
#pragma unroll
      for (int nn = 2 * kk; nn < 8; ++nn) {
        const uint2 pb = Pf[(kk * 8 + nn) * 32 + lane];
        const uint32_t bp[2] = {pb.x, pb.y};
        mma16816<__half>(x[nn], av, bp);
      }
    }
    {
      const int n = min(kC, r.count - c * kC);
      float* O = a.out + ((int64_t(r.begin) + int64_t(c) * kC) * a.Hv + h) * DV + cw + g;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 8 * j + 2 * t + (e & 1);
          if (i < n) O[int64_t(i) * a.Hv * DV + 8 * (e >> 1)] = x[j][e];
        }
    }
    // Sᵀ ← e^{γ_last} Sᵀ + (V'ᵀD)·K̂
    const float el = G[2 * kC];
#pragma unroll
    for (int j = 0; j < KT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] *= el;
#pragma unroll
    for (int kk = 0; kk < kC / 16; ++kk) {  // tokens 16kk..16kk+15: A = (V'ᵀD) tiles 2kk, 2kk + 1
      const float* D = G + kC + 16 * kk + 2 * t;
      const float d0 = D[0], d1 = D[1], d8 = D[8], d9 = D[9];
      uint32_t ah[4], al[4];
      split_bf16x2(make_float2(v[2 * kk][0] * d0, v[2 * kk][1] * d1), ah[0], al[0]);
      split_bf16x2(make_float2(v[2 * kk][2] * d0, v[2 * kk][3] * d1), ah[1], al[1]);
      split_bf16x2(make_float2(v[2 * kk + 1][0] * d8, v[2 * kk + 1][1] * d9), ah[2], al[2]);
      split_bf16x2(make_float2(v[2 * kk + 1][2] * d8, v[2 * kk + 1][3] * d9), ah[3], al[3]);
#pragma unroll
      for (int j = 0; j < KT; ++j) {
        const uint4 kb = Kf[(kk * KT + j) * 32 + lane];
        const uint32_t bh[2] = {kb.x, kb.y}, bl[2] = {kb.z, kb.w};
        mma16816<__nv_bfloat16>(s[j], al, bh);
        mma16816<__nv_bfloat16>(s[j], ah, bl);
        mma16816<__nv_bfloat16>(s[j], ah, bh);
      }
    }
    __syncthreads();  // every warp is done with this stage
    if (c + STAGES < c_end) issue(c + STAGES, stage);
    cp_async_commit();
  }
#pragma unroll
  for (int j = 0; j < KT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) a.state.store(S + int64_t(8 * j + 2 * t + (e & 1)) * DV + cw + g + 8 * (e >> 1), s[j][e]);
}

// Which form runs: the fused one wherever its kernels fit the device's shared memory (two
// chunk records in flight where they fit, else one), else the split one.
// QWEN36_DELTA_CHUNKED=split|fused (or the test hook) prefers one where it fits.
enum class Form { Auto = 0, Split = 1, Fused = 2 };
Form& preferred_form() {
  static Form f = [] {
    const char* e = std::getenv("QWEN36_DELTA_CHUNKED");
    if (e && std::string_view(e) == "split") return Form::Split;
    if (e && std::string_view(e) == "fused") return Form::Fused;
    return Form::Auto;
  }();
  return f;
}

struct DeviceFit {
  bool split = false, fused = false;
  int stages = 1;  // the fused scan's chunk records in shared memory
};
template <int DK, int DV>
const DeviceFit& device_fit() {
  static const DeviceFit fit = [] {
    DeviceFit f;
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
      return f;
    const size_t lim = size_t(optin), stage = FusedLayout<DK, DV>::stage;
    f.split = lim >= std::max({PrepLayout<DK, DV>::bytes, ScanLayout<DK, DV>::bytes, OutLayout<DK, DV>::bytes});
    f.fused = lim >= PrepFragLayout<DK, DV>::bytes && lim >= stage;
    f.stages = lim >= 2 * stage ? 2 : 1;
    return f;
  }();
  return fit;
}

// Test instrumentation (delta_rule_chunked_timing): events around the kernels of each segment
// (prepare, scan, output; the fused form's output time is in its scan), read back at once (a
// sync per segment; never while recording).
struct KernelTiming {
  bool on = false;
  float ms[3] = {0, 0, 0};
  int calls = 0;
  cudaEvent_t ev[4] = {};
};
KernelTiming& timing() {
  static KernelTiming t;
  return t;
}
struct SegmentTimer {
  Ctx& c;
  bool timed = timing().on && !c.capturing;
  void mark(int i) const {
    if (timed) CUDA_CHECK(cudaEventRecord(timing().ev[i], c.stream));
  }
  void collect() const {
    if (!timed) return;
    KernelTiming& tm = timing();
    CUDA_CHECK(cudaEventSynchronize(tm.ev[3]));
    for (int i = 0; i < 3; ++i) {
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, tm.ev[i], tm.ev[i + 1]));
      tm.ms[i] += ms;
    }
  }
};

template <int DK, int DV>
void run_split(Ctx& c, ChunkArgs a, int64_t total) {
  static std::atomic<uint64_t> attr_set{0};  // per instantiation and device (the limit is per function)
  once_per_device(attr_set, [] {
    CUDA_CHECK(cudaFuncSetAttribute(chunk_prepare_kernel<DK, DV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(PrepLayout<DK, DV>::bytes)));
    CUDA_CHECK(cudaFuncSetAttribute(chunk_state_kernel<DK, DV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(ScanLayout<DK, DV>::bytes)));
    CUDA_CHECK(cudaFuncSetAttribute(chunk_output_kernel<DK, DV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(OutLayout<DK, DV>::bytes)));
  });
  const int64_t per_chunk = int64_t(a.Hv) * (kC * DK + kC * DV + DK * DV + kC);  // floats
  const int64_t seg = std::max<int64_t>(1, int64_t(workspace_bytes() / sizeof(float)) / per_chunk);
  const int64_t cap = std::min(total, seg);
  Temp<float> w(c, size_t(cap * a.Hv * kC * DK)), u(c, size_t(cap * a.Hv * kC * DV)),
      sc(c, size_t(cap * a.Hv * DK * DV)), gam(c, size_t(cap * a.Hv * kC));
  a.w = w.get();
  a.u = u.get();
  a.sc = sc.get();
  a.gam = gam.get();
  const SegmentTimer tm{c};
  for (int64_t s0 = 0; s0 < total; s0 += seg) {
    a.seg0 = s0;
    a.seg1 = std::min(total, s0 + seg);
    const dim3 chunks_grid(unsigned(a.seg1 - s0), unsigned(a.Hv));
    tm.mark(0);
    chunk_prepare_kernel<DK, DV><<<chunks_grid, kThreads, PrepLayout<DK, DV>::bytes, c.stream>>>(a);
    CUDA_LAUNCH_CHECK();
    tm.mark(1);
    const dim3 scan_grid(unsigned(a.nruns), unsigned(a.Hv), unsigned(DV / kNB));
    chunk_state_kernel<DK, DV><<<scan_grid, kThreads, ScanLayout<DK, DV>::bytes, c.stream>>>(a);
    CUDA_LAUNCH_CHECK();
    tm.mark(2);
    chunk_output_kernel<DK, DV><<<chunks_grid, kThreads, OutLayout<DK, DV>::bytes, c.stream>>>(a);
    CUDA_LAUNCH_CHECK();
    tm.mark(3);
    tm.collect();
  }
}

template <int DK, int DV>
void run_fused(Ctx& c, ChunkArgs a, int64_t total) {
  using R = FragRecords<DK, DV>;
  using L = FusedLayout<DK, DV>;
  static_assert(DV % kScanCols == 0, "whole scan blocks per head");
  const int stages = device_fit<DK, DV>().stages;
  static std::atomic<uint64_t> attr_set{0};  // per device
  once_per_device(attr_set, [stages] {
    CUDA_CHECK(cudaFuncSetAttribute(chunk_prep_frag_kernel<DK, DV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(PrepFragLayout<DK, DV>::bytes)));
    CUDA_CHECK(cudaFuncSetAttribute(chunk_scan_fused_kernel<DK, DV, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(L::stage)));
    if (stages >= 2)
      CUDA_CHECK(cudaFuncSetAttribute(chunk_scan_fused_kernel<DK, DV, 2>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, int(2 * L::stage)));
  });
  const int64_t per_chunk = a.Hv * R::value_bytes + a.Hk * R::key_bytes;
  const int64_t seg = std::max<int64_t>(1, int64_t(workspace_bytes()) / per_chunk);
  const int64_t cap = std::min(total, seg);
  Temp<uint4> wf(c, size_t(cap * a.Hv * R::W)), kf(c, size_t(cap * a.Hk * R::K));
  Temp<uint2> qf(c, size_t(cap * a.Hk * R::Q)), pf(c, size_t(cap * a.Hv * R::P));
  Temp<float4> uf(c, size_t(cap * a.Hv * R::U));
  Temp<float> gt(c, size_t(cap * a.Hv * R::G));
  a.wf = wf.get();
  a.kf = kf.get();
  a.qf = qf.get();
  a.pf = pf.get();
  a.uf = uf.get();
  a.gt = gt.get();
  const SegmentTimer tm{c};
  for (int64_t s0 = 0; s0 < total; s0 += seg) {
    a.seg0 = s0;
    a.seg1 = std::min(total, s0 + seg);
    tm.mark(0);
    chunk_prep_frag_kernel<DK, DV>
        <<<dim3(unsigned(a.seg1 - s0), unsigned(a.Hv)), kThreads, PrepFragLayout<DK, DV>::bytes, c.stream>>>(a);
    CUDA_LAUNCH_CHECK();
    tm.mark(1);
    const dim3 scan_grid(unsigned(a.nruns), unsigned(a.Hv), unsigned(DV / kScanCols));
    if (stages >= 2)
      chunk_scan_fused_kernel<DK, DV, 2><<<scan_grid, 32 * kScanWarps, 2 * L::stage, c.stream>>>(a);
    else
      chunk_scan_fused_kernel<DK, DV, 1><<<scan_grid, 32 * kScanWarps, L::stage, c.stream>>>(a);
    CUDA_LAUNCH_CHECK();
    tm.mark(2);
    tm.mark(3);
    tm.collect();
  }
}

template <int DK, int DV>
bool supported() {
  const DeviceFit& f = device_fit<DK, DV>();
  return f.split || f.fused;
}

template <int DK, int DV>
void run(Ctx& c, const ChunkArgs& a, std::span<const SeqRun> runs) {
  int64_t total = 0;
  for (const SeqRun& r : runs)
    if (r.count >= a.min_count) total += (int64_t(r.count) + kC - 1) / kC;
  if (total == 0) return;
  const DeviceFit& f = device_fit<DK, DV>();
  const bool fused = f.fused && !(preferred_form() == Form::Split && f.split);
  if (fused)
    run_fused<DK, DV>(c, a, total);
  else
    run_split<DK, DV>(c, a, total);
  if (timing().on && !c.capturing) ++timing().calls;
}

}  // namespace

// Declared (without a header) in cuda_deltanet.cu, the dispatcher.
bool delta_rule_chunked_supported(int64_t dk, int64_t dv) {
  if (dk == 128 && dv == 128) return supported<128, 128>();
  if (dk == 64 && dv == 64) return supported<64, 64>();
  return false;
}

// Test instrumentation, declared by the GPU test (no header).
void delta_rule_chunked_timing(bool on) {
  KernelTiming& t = timing();
  if (on && !t.ev[0])
    for (cudaEvent_t& e : t.ev) CUDA_CHECK(cudaEventCreate(&e));
  t.on = on;
  t.calls = 0;
  t.ms[0] = t.ms[1] = t.ms[2] = 0;
}
void delta_rule_chunked_times(float ms[3], int* calls) {
  const KernelTiming& t = timing();
  for (int i = 0; i < 3; ++i) ms[i] = t.ms[i];
  *calls = t.calls;
}
// 0: the default (fused where it fits), 1: the split form, 2: the fused form (where it fits)
void delta_rule_chunked_form(int form) { preferred_form() = Form(form); }
// the workspace cap in bytes (0: the default), so that batches run in segments of few chunks
void delta_rule_chunked_workspace(size_t bytes) { workspace_bytes() = bytes ? bytes : kWorkspaceBytes; }

void delta_rule_chunked(Ctx& c, const float* qn, const float* kn, const float* v, const float* g, const float* beta,
                        StateRef state, float* out, std::span<const SeqRun> runs, const SeqRun* dev_runs,
                        int min_count, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv) {
  ChunkArgs a{};
  a.qn = qn, a.kn = kn, a.v = v, a.g = g, a.beta = beta, a.state = state, a.out = out;
  a.runs = dev_runs, a.nruns = int(runs.size()), a.min_count = min_count, a.Hk = int(Hk), a.Hv = int(Hv);
  if (dk == 128 && dv == 128)
    run<128, 128>(c, a, runs);
  else if (dk == 64 && dv == 64)
    run<64, 64>(c, a, runs);
  else
    fail("delta_rule_chunked: head dims {} / {} not supported", dk, dv);
}

}  // namespace qwen36::cuda
