// Flash attention for prefill on tensor cores (mma.sync m16n8k16 → f32, sm_80+): causal GQA
// softmax attention of a run's query rows over its slot's KV cache (f32, bf16, fp8, q8_0 or
// q4_0), after the new keys were appended (cuda_attention.cu appends and dispatches here).
//
// Design. A block (4 warps) owns a tile of 64 query rows of one kv head's group: the run's
// rows are numbered R = j·G + g (token j of the run, query head g of the group), so the G
// heads sharing a K/V tile use it from shared memory once (GQA reuse), and a tile covers
// 64/G consecutive positions, which keeps the causal diagonal narrow. Each warp owns 16 rows.
// Per 64-key tile: S = Q·Kᵀ (Q and K from shared memory through ldmatrix), the online
// softmax in f32 on the accumulators (exp2 with log2(e) folded into the scale), P rounded to
// the tile type E and reused as the A operand of O += P·V (V through ldmatrix.trans). O stays
// in registers (head_dim/8 × 4 floats per thread; 128 for hd 256, which is what limits the
// block to 64 rows and 4 warps). Shared memory: Q, K and V tiles of 64 × (hd + 8) E; the
// 8-element pad shifts consecutive rows by 16 bytes so ldmatrix's 8 row reads hit distinct
// banks. hd 256: 99 KB, so two blocks per SM on sm_80/90, one on sm_86/89/120.
// Tile types: bf16 for f32 and bf16 caches; f16 for fp8 / q8_0 / q4_0, whose values are exact
// in f16 or defined as f16(d·q) (backend/kv_cache.h), so the tiles hold the cached values.
// Pipelining: V of a tile loads while S is computed and K of the next tile while the softmax
// and P·V run, with cp.async for bf16 and the quantised kinds. A quantised tile is copied raw
// into the tail of its own f16 tile rows (row r's RB bytes at bytes 2·hd − RB .. 2·hd of tile
// row r, its fp8 scale in the row's pad, which ldmatrix never reads) and, once landed,
// dequantised in place (convert_tile: each warp reads its rows' raw bytes into registers,
// then overwrites the rows with f16): every cached value is converted once per block, the
// loads overlap compute as for bf16, and no shared memory is added (two blocks per SM stay).
// f32 caches are converted on the way in with plain loads (no overlap within a block, the
// other block covers it). q8_0/q4_0: the caller passes q already rotated and rotates the
// output back (kv_cache.h). Tiles are issued heaviest (latest positions) first, all kv heads
// of a tile together, so the causal tail does not straggle.
#include <cstdint>

#include "backend/cuda/cuda_attention_common.cuh"

namespace qwen36::cuda {

namespace {

constexpr int kBM = 64;  // query rows per block
constexpr int kBN = 64;  // keys per K/V tile
constexpr int kThreads = 128;
constexpr int kTileInts = 2;  // per tile: its run (an index into the runs) and row0 (see flash_attention)

template <int D>
constexpr size_t smem_bytes() {
  return size_t(kBM + 2 * kBN) * size_t(D + 8) * 2;  // bf16 or f16 tiles
}

// Rows p0 .. p0 + 63 of one kv head's cached rows (row p at base + p·rstride bytes; fp8 row
// scales at sc[p]) into a [64][D + 8] tile of E; rows past pmax are zero (never read from the
// cache: they may be beyond the capacity or hold a previous sequence's values, and a NaN
// there would survive the 0 weight). Quantised kinds: only the raw copies are issued here
// (rows past pmax skipped); convert_tile finishes the tile once they have landed.
template <int D, KvKind K>
__host__ __device__ constexpr int raw_offset() {  // bytes into a tile row where its raw cached row is copied
  return 2 * D - kv_row_bytes(K, D);
}
template <int D, KvKind K, typename E>
__device__ __forceinline__ void load_kv_tile(E* dst, const uint8_t* base, int64_t rstride, int p0, int pmax,
                                             const float* sc) {
  constexpr int S = D + 8;
  if constexpr (K == KvKind::BF16) {
    constexpr int C = D / 8;  // 16-byte chunks per row
    for (int i = threadIdx.x; i < kBN * C; i += kThreads) {
      const int r = i / C, c = i % C, p = p0 + r;
      E* d = dst + r * S + c * 8;
      if (p <= pmax)
        cp_async<16>(d, base + int64_t(p) * rstride + c * 16);
      else
        *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
  } else if constexpr (K == KvKind::F32) {
    constexpr int C = D / 4;  // float4s per row
    for (int i = threadIdx.x; i < kBN * C; i += kThreads) {
      const int r = i / C, c = i % C, p = p0 + r;
      const float4 x = p <= pmax ? __ldg(reinterpret_cast<const float4*>(base + int64_t(p) * rstride + c * 16))
                                 : make_float4(0, 0, 0, 0);
      store4<E>(dst + r * S + c * 4, x);
    }
  } else {
    constexpr int RB = kv_row_bytes(K, D), CW = RB % 16 == 0 ? 16 : RB % 8 == 0 ? 8 : 4, CPR = RB / CW;
    unsigned char* t = reinterpret_cast<unsigned char*>(dst);
    for (int i = threadIdx.x; i < kBN * CPR; i += kThreads) {
      const int r = i / CPR, c = i % CPR, p = p0 + r;
      if (p <= pmax) cp_async<CW>(t + r * S * 2 + raw_offset<D, K>() + c * CW, base + int64_t(p) * rstride + c * CW);
    }
    if constexpr (K == KvKind::F8)
      for (int r = threadIdx.x; r < kBN; r += kThreads)
        if (p0 + r <= pmax) cp_async<4>(t + r * S * 2 + 2 * D, sc + p0 + r);
  }
}

// Quantised kinds: tile rows' raw bytes (landed, visible to the block) → f16 values in place.
// Warp w owns rows 16w .. 16w + 15 (so a row is read and rewritten by one warp: reads, then
// __syncwarp, then writes); a lane converts one 8-value chunk per row (dequant8).
template <int D, KvKind K>
__device__ __forceinline__ void convert_tile(__half* tile, int p0, int pmax) {
  constexpr int S = D + 8, C = D / 8, RPI = 32 / C;  // chunks per row, rows per warp pass
  constexpr int ROWS = kBN / (kThreads / 32), PASSES = ROWS / RPI;
  constexpr int B = D == 64 ? 4 : 2;  // passes read before their writes (registers: O is live)
  static_assert(PASSES % B == 0);
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31);
  const int c = lane % C, rsub = lane / C;
#pragma unroll
  for (int g = 0; g < PASSES; g += B) {
    uint4 x[B];
#pragma unroll
    for (int b = 0; b < B; ++b) {
      const int r = warp * ROWS + (g + b) * RPI + rsub;
      const unsigned char* row = reinterpret_cast<const unsigned char*>(tile + r * S);
      x[b] = make_uint4(0, 0, 0, 0);
      if (p0 + r <= pmax)
        x[b] = dequant8<K>(row + raw_offset<D, K>(), c,
                           K == KvKind::F8 ? fp8_row_mult(*reinterpret_cast<const float*>(row + 2 * D))
                                           : __float2half2_rn(1.0f));
    }
    __syncwarp();  // the rows' raw bytes are all read before any lane overwrites them
#pragma unroll
    for (int b = 0; b < B; ++b) {
      const int r = warp * ROWS + (g + b) * RPI + rsub;
      *reinterpret_cast<uint4*>(tile + r * S + c * 8) = x[b];
    }
  }
}

template <int D, KvKind K>
__global__ void __launch_bounds__(kThreads)
    flash_attention_kernel(const float* __restrict__ q, const uint8_t* __restrict__ kc, const uint8_t* __restrict__ vc,
                           const float* __restrict__ ksc, const float* __restrict__ vsc,
                           const int32_t* __restrict__ tiles, const SeqRun* __restrict__ runs,
                           float* __restrict__ out, int H, int KVH, int64_t cap, float scale_log2) {
  using E = std::conditional_t<kv_quantized(K), __half, __nv_bfloat16>;
  constexpr int S = D + 8;  // shared row stride, E elements
  constexpr int KS = D / 16;  // k-steps of S = Q·Kᵀ
  constexpr int ND = D / 8;   // n-blocks of O
  extern __shared__ __align__(16) unsigned char smem_raw[];
  E* qs = reinterpret_cast<E*>(smem_raw);
  E* ks = qs + kBM * S;
  E* vs = ks + kBN * S;

  // Block b: tile b / KVH, kv head b % KVH (all kv heads of the heaviest tiles go first).
  const int32_t* tile = tiles + int64_t(blockIdx.x / KVH) * kTileInts;
  const SeqRun run = runs[tile[0]];
  const int slot = run.slot, pos0 = run.pos0, begin = run.begin, count = run.count, row0 = tile[1];
  const int kvh = int(blockIdx.x % KVH), G = H / KVH, nrows = count * G;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gid = lane >> 2, tig = lane & 3;  // mma fragment coordinates: row group, thread in group

  // Q tile, rounded to E; rows past the run are zero (their outputs are not written).
  for (int i = threadIdx.x; i < kBM * (D / 4); i += kThreads) {
    const int r = i / (D / 4), c = i % (D / 4), R = row0 + r;
    float4 x = make_float4(0, 0, 0, 0);
    if (R < nrows)
      x = __ldg(reinterpret_cast<const float4*>(q + ((int64_t(begin) + R / G) * H + int64_t(kvh) * G + R % G) * D +
                                                c * 4));
    store4<E>(qs + r * S + c * 4, x);
  }

  // Causal range: the tile's rows sit at positions min_pos .. max_pos; keys 0 .. max_pos.
  const int max_pos = pos0 + min(count - 1, (row0 + kBM - 1) / G), min_pos = pos0 + row0 / G;
  const int n_kv = max_pos / kBN + 1;
  constexpr int RB = kv_row_bytes(K, D);  // bytes of a cached row
  const int64_t rstride = int64_t(KVH) * RB;
  const uint8_t* kbase = kc + int64_t(slot) * cap * rstride + int64_t(kvh) * RB;
  const uint8_t* vbase = vc + int64_t(slot) * cap * rstride + int64_t(kvh) * RB;
  const int64_t sbase = (int64_t(slot) * KVH + kvh) * cap;  // fp8 row scales [slots, KVH, cap]
  const float* kscale = ksc ? ksc + sbase : nullptr;
  const float* vscale = vsc ? vsc + sbase : nullptr;

  // This thread's two accumulator rows (gid and gid + 8 of the warp's 16) and their positions
  // (rows past the run take the last position: finite softmax, output dropped).
  const int ra = row0 + warp * 16 + gid, rb = ra + 8;
  const int qpos_a = pos0 + min(ra / G, count - 1), qpos_b = pos0 + min(rb / G, count - 1);

  float o[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0, l_b = 0;  // running max (log2 units), partial sums

  // ldmatrix lane addresses (bytes). A operand (Q, row-major 16×16): matrices rows 0-7/8-15 ×
  // cols 0-7/8-15 in the order a0..a3. B operand from K ([key][d] = column-major B): two
  // n-blocks of 8 keys × k 0-7/8-15. B from V ([key][d] = row-major B): .trans, keys 0-7/8-15
  // × two 8-wide d-blocks.
  const uint32_t q_lane = smem_addr(qs) + uint32_t(((warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * S + (lane >> 4) * 8) * 2);
  const uint32_t k_lane = smem_addr(ks) + uint32_t((((lane & 7) + (lane >> 4) * 8) * S + ((lane >> 3) & 1) * 8) * 2);
  const uint32_t v_lane = smem_addr(vs) + uint32_t((((lane & 7) + ((lane >> 3) & 1) * 8) * S + (lane >> 4) * 8) * 2);

  load_kv_tile<D, K>(ks, kbase, rstride, 0, max_pos, kscale);
  cp_async_commit();
  for (int it = 0; it < n_kv; ++it) {
    const int kv0 = it * kBN;
    load_kv_tile<D, K>(vs, vbase, rstride, kv0, max_pos, vscale);
    cp_async_commit();
    cp_async_wait<1>();  // K tile `it` (the V tile just issued may still be in flight)
    __syncthreads();
    if constexpr (kv_quantized(K)) {
      convert_tile<D, K>(ks, kv0, max_pos);
      __syncthreads();
    }

    float s[kBN / 8][4];
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      uint32_t a[4];
      ldsm_x4(a, q_lane + kk * 32);
#pragma unroll
      for (int np = 0; np < kBN / 16; ++np) {
        uint32_t b[4];
        ldsm_x4(b, k_lane + uint32_t(np * 16 * S * 2 + kk * 32));
        mma16816<E>(s[2 * np], a, b[0], b[1]);
        mma16816<E>(s[2 * np + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with this K tile
    if (it + 1 < n_kv) load_kv_tile<D, K>(ks, kbase, rstride, kv0 + kBN, max_pos, kscale);
    cp_async_commit();  // (possibly empty: keeps the group count uniform for the waits)

    // Online softmax. Row a = accumulator elements 0, 1; row b = 2, 3; key of element e of
    // n-block n: kv0 + 8n + 2·tig + (e & 1). Only tiles reaching past min_pos need the mask.
    const bool mask = kv0 + kBN - 1 > min_pos;
    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[n][e] * scale_log2;
        if (mask && kv0 + 8 * n + 2 * tig + (e & 1) > (e < 2 ? qpos_a : qpos_b)) v = -INFINITY;
        s[n][e] = v;
        if (e < 2)
          mx_a = fmaxf(mx_a, v);
        else
          mx_b = fmaxf(mx_b, v);
      }
    mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 1));
    mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 2));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 1));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 2));
    // Key 0 is in tile 0 and visible to every row, so the running max is finite from then on.
    const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
    const float corr_a = exp2f(m_a - mn_a), corr_b = exp2f(m_b - mn_b);
    m_a = mn_a;
    m_b = mn_b;
    float sum_a = 0, sum_b = 0;
    uint32_t p[kBN / 16][4];  // P as the A operand of P·V, per 16-key step
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n) {
      const float p0 = exp2f(s[n][0] - mn_a), p1 = exp2f(s[n][1] - mn_a);
      const float p2 = exp2f(s[n][2] - mn_b), p3 = exp2f(s[n][3] - mn_b);
      sum_a += p0 + p1;
      sum_b += p2 + p3;
      // C layout of n-blocks 2k, 2k+1 == A layout of k-step k: {a0, a1} from n-block 2k
      // (rows a, b), {a2, a3} from n-block 2k + 1.
      p[n / 2][(n & 1) * 2 + 0] = pack2<E>(p0, p1);
      p[n / 2][(n & 1) * 2 + 1] = pack2<E>(p2, p3);
    }
    l_a = l_a * corr_a + sum_a;
    l_b = l_b * corr_b + sum_b;
#pragma unroll
    for (int n = 0; n < ND; ++n) {
      o[n][0] *= corr_a;
      o[n][1] *= corr_a;
      o[n][2] *= corr_b;
      o[n][3] *= corr_b;
    }

    cp_async_wait<1>();  // V tile `it` (the next K tile may still be in flight)
    __syncthreads();
    if constexpr (kv_quantized(K)) {
      convert_tile<D, K>(vs, kv0, max_pos);
      __syncthreads();
    }
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk)
#pragma unroll
      for (int dp = 0; dp < ND / 2; ++dp) {
        uint32_t b[4];
        ldsm_x4_trans(b, v_lane + uint32_t(kk * 16 * S * 2 + dp * 32));
        mma16816<E>(o[2 * dp], p[kk], b[0], b[1]);
        mma16816<E>(o[2 * dp + 1], p[kk], b[2], b[3]);
      }
    __syncthreads();  // every warp is done with this V tile before the next one lands
  }

  // The 4 threads of a row group hold partial sums of the same rows.
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
  const float inv_a = 1.0f / l_a, inv_b = 1.0f / l_b;
  if (ra < nrows) {
    float* dst = out + ((int64_t(begin) + ra / G) * H + int64_t(kvh) * G + ra % G) * D + 2 * tig;
#pragma unroll
    for (int n = 0; n < ND; ++n)
      *reinterpret_cast<float2*>(dst + 8 * n) = make_float2(o[n][0] * inv_a, o[n][1] * inv_a);
  }
  if (rb < nrows) {
    float* dst = out + ((int64_t(begin) + rb / G) * H + int64_t(kvh) * G + rb % G) * D + 2 * tig;
#pragma unroll
    for (int n = 0; n < ND; ++n)
      *reinterpret_cast<float2*>(dst + 8 * n) = make_float2(o[n][2] * inv_b, o[n][3] * inv_b);
  }
}

template <int D>
bool fits_device(Ctx&) {
  static const bool ok = [] {
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
      return false;
    return size_t(optin) >= smem_bytes<D>();
  }();
  return ok;
}

struct Args {
  const float* q;
  const void *kc, *vc;
  const float *ksc, *vsc;
  const int32_t* tiles;
  const SeqRun* runs;
  int n_tiles, H, KVH;
  int64_t cap;
  float scale;
  float* out;
};

template <int D, KvKind K>
void launch(Ctx& c, const Args& a) {
  auto kernel = flash_attention_kernel<D, K>;
  static std::atomic<uint64_t> attr_set{0};  // per instantiation and device (the limit is per function)
  once_per_device(attr_set, [&] {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes<D>())));
  });
  const unsigned grid = static_cast<unsigned>(int64_t(a.n_tiles) * a.KVH);
  kernel<<<grid, kThreads, smem_bytes<D>(), c.stream>>>(a.q, static_cast<const uint8_t*>(a.kc),
                                                        static_cast<const uint8_t*>(a.vc), a.ksc, a.vsc, a.tiles, a.runs, a.out,
                                                        a.H, a.KVH, a.cap, a.scale * 1.4426950408889634f);
  CUDA_LAUNCH_CHECK();
}

template <int D>
void launch_kind(Ctx& c, KvKind kind, const Args& a) {
  switch (kind) {
    case KvKind::F32: launch<D, KvKind::F32>(c, a); break;
    case KvKind::BF16: launch<D, KvKind::BF16>(c, a); break;
    case KvKind::F8: launch<D, KvKind::F8>(c, a); break;
    case KvKind::Q8: launch<D, KvKind::Q8>(c, a); break;
    case KvKind::Q4: launch<D, KvKind::Q4>(c, a); break;
  }
}

}  // namespace

int flash_attention_tile_rows() { return kBM; }

bool flash_attention_supported(Ctx& c, int64_t hd) {
  switch (hd) {
    case 64: return fits_device<64>(c);
    case 128: return fits_device<128>(c);
    case 256: return fits_device<256>(c);
    default: return false;
  }
}

// tiles: n_tiles × {run, row0} on the device: rows [row0, row0 + 64) of runs[run]'s count·G
// rows, R = token·G + head in group (the runs read on the device, so a recorded step's tiles are
// fixed by its run lengths alone). q, out
// [T, H, hd] f32; caches [slots, cap, KVH, hd] holding this batch's keys already; all
// 16-byte aligned.
void flash_attention(Ctx& c, const float* q, const void* kc, const void* vc, const float* ksc, const float* vsc,
                     KvKind kind, const int32_t* tiles, const SeqRun* runs, int n_tiles, int H, int KVH, int hd,
                     int64_t cap, float scale, float* out) {
  if (n_tiles == 0) return;
  const Args a{q, kc, vc, ksc, vsc, tiles, runs, n_tiles, H, KVH, cap, scale, out};
  switch (hd) {
    case 64: launch_kind<64>(c, kind, a); break;
    case 128: launch_kind<128>(c, kind, a); break;
    case 256: launch_kind<256>(c, kind, a); break;
    default: fail("flash_attention: head_dim {} not supported (64, 128, 256)", hd);
  }
}

}  // namespace qwen36::cuda
