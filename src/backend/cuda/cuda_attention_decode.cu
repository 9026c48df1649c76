// Tensor-core decode attention: single-token rows (decode, short verify chunks) over bf16,
// fp8, q8_0 and q4_0 KV caches. cuda_attention.cu appends the keys and dispatches here.
//
// Design. A block serves one (token, kv head, split): the G ≤ 8 query heads of the group over
// positions [p_begin, p_end) of the token's context. Each warp is an independent flash
// decoder over every nwarps-th step of 16 positions, with its own ring of cp.async stages in
// shared memory (no block barrier in the loop): K and V rows stream in raw, two to five steps
// ahead. Decode reads each cached byte once for ~3 FLOP, so bandwidth is the limit once the
// per-position work is on tensor cores and the per-byte work is small.
// Per step: S = Q·Kᵀ with Q as the mma A operand, rows 0-7 the heads' q rounded to E and rows
// 8-15 the rounding residuals, so rows 0-7 plus 8-15 give q·k to f32 accuracy; K as B. Online
// softmax on the accumulators (exp2, log2 e folded into the scale; one max per head and
// step; the output is rescaled only in steps where some head's max moved). The output is
// accumulated transposed, Oᵀ[hd × 8] += Vᵀ·Pᵀ: V is the A operand, and P's accumulator layout
// is exactly the B operand's, so P stays in registers (split into E hi + lo as well). Oᵀ is
// hd/4 floats per thread. At hd 256 a step is 32 + 32 mma per warp.
// bf16: the stage rows are the tiles, read by ldmatrix. Quantised kinds (fp8 1, q8_0 1.06,
// q4_0 0.56 bytes per value): the stage holds the raw rows and each thread builds its mma
// fragments from them in registers (DecodeFrag, cuda_attention_common.cuh: per-format dim
// orders that make every load one conflict-free piece). What limited the earlier version of
// this kernel on quantised caches was the per-step instruction stream of 4 lone warps per SM
// (dequantise into an f16 tile, store it, ldmatrix it back): these kinds now run 8 warps per
// block (two per scheduler) with about 2 instructions per value, and fp8 K rows skip the row
// scale (folded into the f32 scores).
// The warps' (max, sum, output) merge through shared memory; with several splits a merge
// kernel combines the splits. q8_0/q4_0: q is rotated on load and the output rotated back
// (kv_cache.h). The split count fills the SMs (one block per SM: shared memory) from the
// batch shape and the capacity alone; each block derives its range from the device-side
// position, so the op records into a CUDA graph that replays at other positions.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_attention_common.cuh"

namespace qwen36::cuda {

namespace {

constexpr int kKeys = 16;     // positions per warp step (the k of the P·V mma)
constexpr int kHeads = 8;     // query heads per kv head served (the n of the P·V mma)
constexpr int kMaxWarps = 8;
constexpr int kMaxSplits = 128;
constexpr int kMinSplitPositions = 256;  // at full capacity, no split is shorter than this
constexpr int kFacCols = kMaxWarps + 2;  // the merge's static table per head: each warp's weight, L, M
constexpr size_t kStaticSmem = size_t(kHeads) * kFacCols * sizeof(float);

template <int D, KvKind K>
struct Cfg {
  using E = std::conditional_t<K == KvKind::BF16, __nv_bfloat16, __half>;
  using St = DecodeStage<D, K>;
  using F = DecodeFrag<D, K>;
  static constexpr int TS = D + 8;                   // bf16 tile row stride (elements): rows 16 bytes apart in banks
  static constexpr int kQBytes = kHeads * D * 4;     // q rows (f32), later the output rows
  static constexpr int kMergeBytes = (2 * kHeads + kHeads * D) * 4;  // per warp: m, l, O [head][dim]
  // bf16 stages are twice the bytes: 4 warps × 3 stages fill the shared memory. Quantised:
  // 8 warps (the per-value work needs two warps per scheduler to hide its latencies).
  static constexpr int kWarps = K == KvKind::BF16 ? 4 : 8;
  static constexpr int kPreferredStages = K == KvKind::Q4 ? 6 : 3;
  __host__ __device__ static constexpr size_t warp_bytes(int nst) {
    const size_t b = size_t(nst) * St::kBytes;
    return b > size_t(kMergeBytes) ? b : size_t(kMergeBytes);
  }
  __host__ __device__ static constexpr size_t block_bytes(int nst, int nwarps) { return kQBytes + size_t(nwarps) * warp_bytes(nst); }
};

template <int N>
__device__ __forceinline__ void zero_bytes(void* p) {
  if constexpr (N == 16)
    *reinterpret_cast<uint4*>(p) = make_uint4(0, 0, 0, 0);
  else if constexpr (N == 8)
    *reinterpret_cast<uint2*>(p) = make_uint2(0, 0);
  else
    *reinterpret_cast<uint32_t*>(p) = 0;
}

// part (splits > 1): per (block x, kv head, split) [G] max (log2 units), [G] sum, [G, D]
// unnormalised output; else the output goes to out.
template <int D, KvKind K>
__global__ void __launch_bounds__(kMaxWarps * 32, 1)
    decode_tc_kernel(const float* __restrict__ q, const uint8_t* __restrict__ kc, const uint8_t* __restrict__ vc,
                     const float* __restrict__ ksc, const float* __restrict__ vsc, const int32_t* tslot,
                     const int32_t* tpos, const int32_t* tlist, float* __restrict__ out, float* __restrict__ part, int H,
                     int KVH, int64_t cap, float scale_log2, float hscale, int nst, TreeMask tree, int early_rows) {
  using C = Cfg<D, K>;
  using E = typename C::E;
  using St = typename C::St;
  using F = typename C::F;
  constexpr int NPL = D / 32, KS = D / 16;
  extern __shared__ __align__(16) unsigned char smem[];

  // Programmatically dependent: q and the cache rows come from the kernels before. early_rows > 0
  // (attention_decode_tc's caller: the launch before this one released it only after its own
  // wait, and appended at most early_rows rows a token): q and the rows before a token's last
  // early_rows were complete when this launch started, so q is staged and those rows' first
  // stages requested before the wait.
  const bool early = early_rows > 0;
  if (!early) {
    griddep_wait();
    griddep_trigger();  // after the wait: a dependent's early reads reach back no further than this kernel
  }
  const int t = tlist ? tlist[blockIdx.x] : int(blockIdx.x);
  const int kvh = int(blockIdx.y), split = int(blockIdx.z), nsplit = int(gridDim.z), G = H / KVH;
  const int slot = tslot[t];
  if (slot < 0) return;
  const TreeView tv = tree_view(tree, t);
  // This split's positions: 0 .. pos cut into nsplit chunks of a multiple of 64. Trailing
  // splits may be empty; they report (max −∞, sum 0) to the merge.
  const int n = tpos[t] + 1;
  const int chunk = ((n + nsplit - 1) / nsplit + 63) & ~63;
  const int p_begin = min(n, split * chunk), p_end = min(n, p_begin + chunk);
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31), nwarps = int(blockDim.x >> 5);
  const int gid = lane >> 2, tig = lane & 3;  // mma fragment coordinates: row group, thread in group
  float* qs = reinterpret_cast<float*>(smem);
  const size_t wbytes = C::warp_bytes(nst);
  unsigned char* wbase = smem + C::kQBytes + size_t(warp) * wbytes;

  // q of the group's heads (rotated for q8_0/q4_0); rows G .. 7 zero.
  for (int g = warp; g < kHeads; g += nwarps) {
    float x[NPL];
    const float* src = q + (int64_t(t) * H + int64_t(kvh) * G + g) * D + lane * NPL;
#pragma unroll
    for (int i = 0; i < NPL; ++i) x[i] = g < G ? src[i] : 0.0f;
    if constexpr (kv_rotated(K)) warp_hadamard<NPL>(x, lane, hscale);
#pragma unroll
    for (int i = 0; i < NPL; ++i) qs[g * D + lane * NPL + i] = x[i];
  }
  __syncthreads();
  // A fragments per k-step kk: a0/a2 = q of head gid at the dims F::q_dims pairs with the K
  // values (E), a1/a3 = the residuals as rows gid + 8.
  uint32_t qf[KS][4];
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) {
    int d[4];
    F::q_dims(kk, tig, d);
    const float* r = qs + gid * D;
    split2<E>(r[d[0]], r[d[1]], qf[kk][0], qf[kk][1]);
    split2<E>(r[d[2]], r[d[3]], qf[kk][2], qf[kk][3]);
  }

  const int nsteps = p_end > p_begin ? (p_end - p_begin + kKeys - 1) / kKeys : 0;
  const int my_steps = nsteps > warp ? (nsteps - warp + nwarps - 1) / nwarps : 0;
  const int64_t rstride = int64_t(KVH) * St::RB;
  const uint8_t* kb = kc + int64_t(slot) * cap * rstride + int64_t(kvh) * St::RB;
  const uint8_t* vb = vc + int64_t(slot) * cap * rstride + int64_t(kvh) * St::RB;
  const int64_t sbase = (int64_t(slot) * KVH + kvh) * cap;  // fp8 row scales [slots, KVH, cap]

  // Stage of step j: K rows, V rows (row r = position p0 + r; past p_end zero), fp8 scales.
  auto issue = [&](int j) {
    const int p0 = p_begin + (warp + j * nwarps) * kKeys;
    unsigned char* st = wbase + (j % nst) * St::kBytes;
    constexpr int N = kKeys * St::CPR;  // chunks of K (and of V)
#pragma unroll
    for (int which = 0; which < 2; ++which) {
      const uint8_t* base = (which ? vb : kb) + int64_t(p0) * rstride;
#pragma unroll
      for (int it = 0; it < (N + 31) / 32; ++it) {
        const int i = lane + 32 * it;
        if (N % 32 == 0 || i < N) {
          const int r = i / St::CPR, cc = i - r * St::CPR;
          unsigned char* d = st + St::chunk_off(which * kKeys + r, cc);
          if (p0 + r < p_end)
            cp_async<St::CW>(d, base + r * rstride + cc * St::CW);
          else
            zero_bytes<St::CW>(d);
        }
      }
    }
    if constexpr (K == KvKind::F8) {  // lanes 0-15: K scales, 16-31: V scales
      float* sdst = reinterpret_cast<float*>(st + St::kScaleOff) + lane;
      const int p = p0 + (lane & 15);
      if (p < p_end)
        cp_async<4>(sdst, (lane < 16 ? ksc : vsc) + sbase + p);
      else
        *sdst = 0.0f;
    }
  };
  int s0 = 0;  // stages requested before the wait: whole steps of old rows, in order
  if (early) {
    const int old_end = n - early_rows;
    for (; s0 + 1 < nst && s0 < my_steps; ++s0) {
      const int p0 = p_begin + (warp + s0 * nwarps) * kKeys;
      if (min(p0 + kKeys, p_end) > old_end) break;
      issue(s0);
      cp_async_commit();
    }
    griddep_wait();
    griddep_trigger();
  }
  for (int s = s0; s + 1 < nst; ++s) {
    if (s < my_steps) issue(s);
    cp_async_commit();  // (possibly empty: keeps the group count uniform for the waits)
  }

  float m = -INFINITY, l = 0;  // head gid: running max (log2 units), this thread's share of the sum
  float o[KS][4];              // Oᵀ: m-tile mt, rows F::v_dim(mt, gid | gid + 8); c0/c2 head 2·tig, c1/c3 head 2·tig + 1
#pragma unroll
  for (int mt = 0; mt < KS; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0;
  // bf16 ldmatrix lane offset (bytes), the same for both operands: lanes 0-7 rows 0-7 / dims
  // 0-7, 8-15 rows 0-7 / dims 8-15, 16-23 rows 8-15 / dims 0-7, 24-31 rows 8-15 / dims 8-15. For
  // K (non-trans) these are the B fragments of keys 0-7 (b0, b1) and 8-15 (b2, b3); for V
  // (.trans) the A fragment of Vᵀ (dims as rows, keys as k).
  const uint32_t lane_off = uint32_t((((lane & 7) + (lane >> 4) * 8) * C::TS + ((lane >> 3) & 1) * 8) * 2);

  for (int j = 0; j < my_steps; ++j) {
    if (j + nst - 1 < my_steps) issue(j + nst - 1);
    cp_async_commit();
    cp_async_wait_dyn(nst - 1);  // step j's group has landed (this lane's copies)
    __syncwarp();                // ... and every lane's
    const unsigned char* st = wbase + (j % nst) * St::kBytes;
    const int p0 = p_begin + (warp + j * nwarps) * kKeys;

    // S = Q·Kᵀ; even and odd k-steps in separate accumulators (shorter mma chains):
    // acc[kk & 1][tile], tile 0 = keys 0-7, 1 = keys 8-15.
    float acc[2][2][4] = {};
    if constexpr (K == KvKind::BF16) {
      const uint32_t ka = smem_addr(st) + lane_off;
#pragma unroll
      for (int kk = 0; kk < KS; ++kk) {
        uint32_t b[4];
        ldsm_x4(b, ka + kk * 32);
        mma16816<E>(acc[kk & 1][0], qf[kk], b[0], b[1]);
        mma16816<E>(acc[kk & 1][1], qf[kk], b[2], b[3]);
      }
    } else {
#pragma unroll
      for (int u = 0; u < KS / F::KU; ++u) {
        uint32_t b[F::KU][2][2];
        F::k_unit(st, lane, u, b);
#pragma unroll
        for (int jj = 0; jj < F::KU; ++jj) {
          const int kk = F::KU * u + jj;
          mma16816<E>(acc[kk & 1][0], qf[kk], b[jj][0][0], b[jj][0][1]);
          mma16816<E>(acc[kk & 1][1], qf[kk], b[jj][1][0], b[jj][1][1]);
        }
      }
    }
    // Head gid's scores at keys p0 + 2·tig, + 1, p0 + 8 + 2·tig, + 1: row gid (q) plus row
    // gid + 8 (its residual); fp8: times the keys' row scales.
    float kf[4];
    F::k_score_mult(st, lane, kf);
    float sc[4], mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int h = i >> 1, e = i & 1;
      const float s = ((acc[0][h][e] + acc[0][h][e + 2]) + (acc[1][h][e] + acc[1][h][e + 2])) * kf[i];
      const int key = p0 + h * 8 + 2 * tig + e;
      sc[i] = key < p_end && tree_visible(tv, key) ? s * scale_log2 : -INFINITY;
      mx = fmaxf(mx, sc[i]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // Finite unless a tree mask hid every key so far (the same keys for every head: uniform).
    const float mn = fmaxf(m, mx);
    if (mn == -INFINITY) {
      __syncwarp();  // as at the end of a step: every lane is done with this stage
      continue;
    }
    const float corr = exp2f(m - mn);
    m = mn;
    float p[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = exp2f(sc[i] - mn);
    l = l * corr + ((p[0] + p[1]) + (p[2] + p[3]));
    // This thread's output columns are heads 2·tig and 2·tig + 1, whose rescale factors live
    // in the quads of lanes 8·tig and 8·tig + 4. Most steps move no max: skip (warp-uniform).
    if (__any_sync(0xffffffffu, corr != 1.0f)) {
      const float ca = __shfl_sync(0xffffffffu, corr, 8 * tig), cb = __shfl_sync(0xffffffffu, corr, 8 * tig + 4);
#pragma unroll
      for (int mt = 0; mt < KS; ++mt) {
        o[mt][0] *= ca;
        o[mt][1] *= cb;
        o[mt][2] *= ca;
        o[mt][3] *= cb;
      }
    }
    // Pᵀ as the B operand: b0 = keys 2·tig, + 1 of head gid, b1 = keys 8 + 2·tig, + 1.
    uint32_t ph0, pl0, ph1, pl1;
    split2<E>(p[0], p[1], ph0, pl0);
    split2<E>(p[2], p[3], ph1, pl1);
    if constexpr (K == KvKind::BF16) {
      const uint32_t va = smem_addr(st + kKeys * St::SRB) + lane_off;
#pragma unroll
      for (int mt = 0; mt < KS; ++mt) {
        uint32_t a[4];
        ldsm_x4_trans(a, va + mt * 32);
        mma16816<E>(o[mt], a, ph0, ph1);
        mma16816<E>(o[mt], a, pl0, pl1);
      }
    } else {
      uint32_t vm[2];
      F::v_mult(st, lane, vm);
#pragma unroll
      for (int u = 0; u < KS / F::VU; ++u) {
        uint32_t a[F::VU][4];
        F::v_unit(st, lane, u, vm, a);
#pragma unroll
        for (int jj = 0; jj < F::VU; ++jj) {
          const int mt = F::unit_mt(u, jj);
          mma16816<E>(o[mt], a[jj], ph0, ph1);
          mma16816<E>(o[mt], a[jj], pl0, pl1);
        }
      }
    }
    __syncwarp();  // every lane is done with this stage before it is refilled
  }
  cp_async_wait<0>();
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);

  // Merge the warps (their scratch reuses their stage memory).
  __syncthreads();
  {
    float* mw = reinterpret_cast<float*>(wbase);  // [8] m, [8] l, [8][D] output
    if (tig == 0) {
      mw[gid] = m;
      mw[kHeads + gid] = l;
    }
    float* ow = mw + 2 * kHeads;
#pragma unroll
    for (int mt = 0; mt < KS; ++mt) {
      const int d0 = F::v_dim(mt, gid), d1 = F::v_dim(mt, gid + 8);
      ow[(2 * tig) * D + d0] = o[mt][0];
      ow[(2 * tig + 1) * D + d0] = o[mt][1];
      ow[(2 * tig) * D + d1] = o[mt][2];
      ow[(2 * tig + 1) * D + d1] = o[mt][3];
    }
  }
  __syncthreads();
  // Each head's weight per warp, f = 2^(m_w − M) (0 for a warp without positions), its sum L and
  // max M, once per head (they were recomputed for every output: ~60% of a short context's
  // instructions, ncu); the outputs then take a load and an FFMA per warp, the same products
  // summed in the same order.
  __shared__ float fac[kHeads][kFacCols];  // [g][w] f, [g][nwarps] L, [g][nwarps + 1] M
  if (int(threadIdx.x) < G) {
    const int g = int(threadIdx.x);
    float M = -INFINITY;
    for (int w = 0; w < nwarps; ++w) M = fmaxf(M, reinterpret_cast<const float*>(smem + C::kQBytes + w * wbytes)[g]);
    float L = 0;
    for (int w = 0; w < nwarps; ++w) {
      const float* pw = reinterpret_cast<const float*>(smem + C::kQBytes + w * wbytes);
      const float f = pw[g] == -INFINITY ? 0.0f : exp2f(pw[g] - M);
      fac[g][w] = f;
      L += pw[kHeads + g] * f;
    }
    fac[g][nwarps] = L;
    fac[g][nwarps + 1] = M;
  }
  __syncthreads();
  const bool single = nsplit == 1;
  float* pp = single ? nullptr : part + ((int64_t(blockIdx.x) * KVH + kvh) * nsplit + split) * int64_t(G) * (D + 2);
  for (int i = int(threadIdx.x); i < G * D; i += int(blockDim.x)) {
    const int g = i / D, d = i % D;
    const float L = fac[g][nwarps], M = fac[g][nwarps + 1];
    float O = 0;
    for (int w = 0; w < nwarps; ++w)
      O += reinterpret_cast<const float*>(smem + C::kQBytes + w * wbytes)[2 * kHeads + g * D + d] * fac[g][w];
    if (!single) {
      if (d == 0) {
        pp[g] = M;
        pp[G + g] = L;
      }
      pp[2 * G + i] = O;
    } else if (kv_rotated(K)) {
      qs[i] = O / L;
    } else {
      out[(int64_t(t) * H + int64_t(kvh) * G) * D + i] = O / L;
    }
  }
  if constexpr (kv_rotated(K)) {
    if (single) {  // rotate the output rows back
      __syncthreads();
      for (int g = warp; g < G; g += nwarps) {
        float x[NPL];
#pragma unroll
        for (int i = 0; i < NPL; ++i) x[i] = qs[g * D + lane * NPL + i];
        warp_hadamard<NPL>(x, lane, hscale);
        float* dst = out + (int64_t(t) * H + int64_t(kvh) * G + g) * D + lane * NPL;
#pragma unroll
        for (int i = 0; i < NPL; ++i) dst[i] = x[i];
      }
    }
  }
}

// Combines the splits of decode_tc_kernel: block (its x, kv head, head g), one thread per
// dim; rotates q8_0/q4_0 outputs back.
template <int D, bool kRot>
__global__ void __launch_bounds__(D)
    decode_tc_merge_kernel(const float* __restrict__ part, const int32_t* tslot, const int32_t* tlist,
                           float* __restrict__ out, int H, int KVH, int nsplit, float hscale) {
  const int t = tlist ? tlist[blockIdx.x] : int(blockIdx.x);
  if (tslot[t] < 0) return;
  const int kvh = int(blockIdx.y), g = int(blockIdx.z), G = H / KVH, d = int(threadIdx.x);
  const int64_t stride = int64_t(G) * (D + 2);
  const float* pb = part + (int64_t(blockIdx.x) * KVH + kvh) * nsplit * stride;
  __shared__ float w[kMaxSplits];
  __shared__ float buf[D];
  __shared__ float Ls;
  if (threadIdx.x < 32) {
    float M = -INFINITY;
    for (int s = d; s < nsplit; s += 32) M = fmaxf(M, pb[s * stride + g]);
    M = warp_max(M);
    float L = 0;
    for (int s = d; s < nsplit; s += 32) {
      const float ms = pb[s * stride + g];
      const float f = ms == -INFINITY ? 0.0f : exp2f(ms - M);  // an empty split
      w[s] = f;
      L += pb[s * stride + G + g] * f;
    }
    L = warp_sum(L);
    if (d == 0) Ls = L;
  }
  __syncthreads();
  float O = 0;
#pragma unroll 8
  for (int s = 0; s < nsplit; ++s) O += w[s] * pb[s * stride + 2 * G + g * D + d];
  float r = O / Ls;
  if constexpr (kRot) {
    buf[d] = r;
    for (int h = 1; h < D; h <<= 1) {
      __syncthreads();
      const float a = buf[d], b = buf[d ^ h];
      __syncthreads();
      buf[d] = (d & h) ? b - a : a + b;
    }
    __syncthreads();
    r = buf[d] * hscale;
  }
  out[(int64_t(t) * H + int64_t(kvh) * G + g) * D + d] = r;
}

// Splits for `blocks` (token, kv head) rows: one wave of resident blocks in all, no split
// shorter than kMinSplitPositions at full capacity.
int tc_splits(int64_t blocks, int64_t cap, int per_sm) {
  const int64_t want = int64_t(dev_info().sms) * per_sm / std::max<int64_t>(blocks, 1);
  const int64_t limit = std::max<int64_t>(1, cap / kMinSplitPositions);
  return int(std::clamp<int64_t>(want, 1, std::min<int64_t>(kMaxSplits, limit)));
}

template <int D, KvKind K>
void launch(Ctx& c, const float* q, const void* kc, const void* vc, const float* ksc, const float* vsc,
            const int32_t* tslot, const int32_t* tpos, const int32_t* tlist, int64_t n_tok, int H, int KVH,
            int64_t cap, float scale, float hscale, float* out, TreeMask tree, int early_rows) {
  using C = Cfg<D, K>;
  auto kernel = decode_tc_kernel<D, K>;
  struct Plan {
    int nst, nwarps, per_sm;
    size_t smem;
  };
  // Stages and warps that fit the device's shared memory (on sm_90: bf16 4 warps × 3 stages,
  // fp8 / q8_0 8 × 3, q4_0 8 × 6).
  static const Plan plan = [&] {
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    Plan p{C::kPreferredStages, C::kWarps, 1, 0};
    const size_t room = size_t(optin) - kStaticSmem;  // the dynamic part's share
    while (C::block_bytes(p.nst, p.nwarps) > room && p.nst > 2) --p.nst;
    while (C::block_bytes(p.nst, p.nwarps) > room && p.nwarps > 1) --p.nwarps;
    p.smem = C::block_bytes(p.nst, p.nwarps);
    QWEN36_CHECK(p.smem <= room, "attention decode: {} bytes of shared memory needed, the device has {}",
                 p.smem + kStaticSmem, optin);
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(p.smem)));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&p.per_sm, kernel, p.nwarps * 32, p.smem));
    p.per_sm = std::max(p.per_sm, 1);
    return p;
  }();
  // The plan is the first device's (alike GPUs); the limit must be raised on every device.
  static std::atomic<uint64_t> attr_set{0};
  once_per_device(attr_set, [&] {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(plan.smem)));
  });
  const int G = H / KVH;
  const int nsplit = tc_splits(n_tok * KVH, cap, plan.per_sm);
  Temp<float> part(c, nsplit > 1 ? size_t(n_tok * KVH * nsplit) * size_t(G) * size_t(D + 2) : 0);
  const dim3 grid(static_cast<unsigned>(n_tok), static_cast<unsigned>(KVH), static_cast<unsigned>(nsplit));
  launch_pdl(kernel, grid, dim3(plan.nwarps * 32), plan.smem, c.stream, q, static_cast<const uint8_t*>(kc),
             static_cast<const uint8_t*>(vc), ksc, vsc, tslot, tpos, tlist, out, part.get(), H, KVH, cap,
             scale * 1.4426950408889634f, hscale, plan.nst, tree, early_rows);
  CUDA_LAUNCH_CHECK();
  if (nsplit > 1) {
    const dim3 mgrid(static_cast<unsigned>(n_tok), static_cast<unsigned>(KVH), static_cast<unsigned>(G));
    decode_tc_merge_kernel<D, kv_rotated(K)>
        <<<mgrid, D, 0, c.stream>>>(part.get(), tslot, tlist, out, H, KVH, nsplit, hscale);
    CUDA_LAUNCH_CHECK();
  }
}

template <int D>
void launch_kind(Ctx& c, KvKind kind, const float* q, const void* kc, const void* vc, const float* ksc,
                 const float* vsc, const int32_t* tslot, const int32_t* tpos, const int32_t* tlist, int64_t n_tok,
                 int H, int KVH, int64_t cap, float scale, float hscale, float* out, TreeMask tree, int early_rows) {
  switch (kind) {
    case KvKind::BF16:
      launch<D, KvKind::BF16>(c, q, kc, vc, ksc, vsc, tslot, tpos, tlist, n_tok, H, KVH, cap, scale, hscale, out,
                                   tree, early_rows);
      break;
    case KvKind::F8:
      launch<D, KvKind::F8>(c, q, kc, vc, ksc, vsc, tslot, tpos, tlist, n_tok, H, KVH, cap, scale, hscale, out,
                                   tree, early_rows);
      break;
    case KvKind::Q8:
      launch<D, KvKind::Q8>(c, q, kc, vc, ksc, vsc, tslot, tpos, tlist, n_tok, H, KVH, cap, scale, hscale, out,
                                   tree, early_rows);
      break;
    case KvKind::Q4:
      launch<D, KvKind::Q4>(c, q, kc, vc, ksc, vsc, tslot, tpos, tlist, n_tok, H, KVH, cap, scale, hscale, out,
                                   tree, early_rows);
      break;
    case KvKind::F32: fail("attention decode: f32 caches take the CUDA-core kernel");
  }
}

}  // namespace

bool attention_decode_tc_supported(KvKind kind, int64_t hd, int64_t G) {
  return kind != KvKind::F32 && (hd == 64 || hd == 128 || hd == 256) && G >= 1 && G <= kHeads;
}

void attention_decode_tc(Ctx& c, const float* q, const void* kc, const void* vc, const float* ksc, const float* vsc,
                         KvKind kind, const int32_t* tslot, const int32_t* tpos, const int32_t* tlist, int64_t n_tok,
                         int H, int KVH, int hd, int64_t cap, float scale, float hscale, float* out,
                         TreeMask tree, int early_rows) {
  if (n_tok == 0) return;
  switch (hd) {
    case 64: launch_kind<64>(c, kind, q, kc, vc, ksc, vsc, tslot, tpos, tlist, n_tok, H, KVH, cap, scale, hscale, out, tree, early_rows); break;
    case 128: launch_kind<128>(c, kind, q, kc, vc, ksc, vsc, tslot, tpos, tlist, n_tok, H, KVH, cap, scale, hscale, out, tree, early_rows); break;
    case 256: launch_kind<256>(c, kind, q, kc, vc, ksc, vsc, tslot, tpos, tlist, n_tok, H, KVH, cap, scale, hscale, out, tree, early_rows); break;
    default: fail("attention decode: head_dim {} not supported (64, 128, 256)", hd);
  }
}

}  // namespace qwen36::cuda
