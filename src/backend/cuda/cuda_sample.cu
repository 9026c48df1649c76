// CUDA Backend::sample_candidates (semantics: backend/backend.h): the penalties in place, then
// per row the k largest logits (ties to the lower id), the (k+1)-th, and max / Σexp of
// logits / T. About 2·k + 3 words per row reach the host instead of the row's V logits (1 MB
// at V = 248320), and the engine's Sampler draws from them (engine/sampler.h).
//
// Design: three launches on the backend's stream, then one small copy to the host.
//   1. penalties: a block per row over its entries (skipped when there are none). Bit-exact
//      with the host's penalised_logit: explicit _rn intrinsics, so nvcc cannot contract.
//   2. chunks: grid S × R. Each block loads one chunk of a row once into registers
//      (512 threads × 32 items ≤ 16384 logits) as order-preserving 32-bit keys, accumulates the
//      chunk's (max, Σexp) of x = logit / T online, and selects its q = k+1 largest keys with a
//      4-pass 8-bit radix select: a shared histogram per pass (lanes of equal digit add once
//      through __match_any_sync: logits share few sign/exponent digits, so plain atomics
//      would serialise), warp 0 finds the digit holding the q-th key with a lane scan. Items
//      above the threshold key are gathered in any order; items equal to it are taken lowest
//      index first (an ordered block scan, only when there are more than needed). The q
//      winners are bitonic-sorted in shared memory by (key, lower id first).
//   3. merge: a block per row runs the same selection over its chunks' S·q winners. Laid out
//      chunk by chunk, each chunk's list sorted, equal keys appear in increasing id order, so
//      "lowest index first" is still "lowest id first". It writes [k ids | k logits | max,
//      Σexp, next] and combines the chunks' (max, Σexp) pairs.
// Logits written out are re-read from the row at the winning ids: copies, bit for bit (−0
// included, which the keys merge with +0 because the host compares them equal).
//
// Chunk count S ≈ sqrt(V / q) makes a chunk (V / S logits) and the merge (S·q winners) about
// the same work, so one row (b1) spreads over ~60 blocks and the merge block is no longer
// than a chunk block; S is lowered to keep R·S near 4 blocks per SM (many rows, or greedy's
// q = 2), and bounded so that a chunk fits a block (≤ 16384: S ≥ 16 at V = 248320), holds
// ≥ q logits, and the merge input fits a block. Expected cost (reasoned, not measured): each
// block is latency-bound, ~50 barriers (4 radix passes, a ≤ 512-entry bitonic sort) over ≤ 32
// register-resident items per thread, a few µs; V = 248320 logits are read once (1 MB per row,
// ~0.3 µs at HBM speed). So b1 ≈ two launches of one wave plus the copy (~20-30 µs), b16 ~4
// waves, b64 (16 chunks a row, ~8 waves of full chunks) perhaps 50-100 µs, against copying
// 1 MB per row to the host and a host argmax today. Not recordable (the penalty tables change
// every step): Model::decode_step calls it after replaying the recorded step.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cuda/cuda_ops.cuh"

namespace qwen36::cuda {
namespace {

constexpr int kThreads = 512, kWarps = kThreads / 32, kItems = 32;
constexpr int kChunkMax = kThreads * kItems;  // items one block selects from
constexpr int kSortMax = 512;                 // ≥ the largest q rounded up to a power of two
static_assert(kMaxSampleCandidates + 1 <= kSortMax && kSortMax <= kThreads, "one sort element per thread");

// Unsigned order of the float order; −0 and +0 map to one key (they compare equal).
__device__ __forceinline__ uint32_t order_key(float v) {
  uint32_t b = __float_as_uint(v);
  if ((b << 1) == 0) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
// Sort key of a selected item: larger key first, then the lower id.
__device__ __forceinline__ unsigned long long pack(uint32_t key, int32_t id) {
  return (static_cast<unsigned long long>(key) << 32) | static_cast<unsigned long long>(~static_cast<uint32_t>(id));
}
__device__ __forceinline__ int32_t unpack_id(unsigned long long p) { return int32_t(~static_cast<uint32_t>(p)); }

// (m, s) ← the (max, Σ exp(x − max)) of the union of two sets; m = −inf is the empty set.
__device__ __forceinline__ void lse_combine(float& m, float& s, float m2, float s2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) {
    m = m2, s = s2;
    return;
  }
  const float M = fmaxf(m, m2);
  s = s * expf(m - M) + s2 * expf(m2 - M);
  m = M;
}

struct SelectShared {
  uint32_t hist[256];
  uint32_t warp_count[kWarps];
  unsigned long long sel[kSortMax];
  uint32_t prefix, need, eq_count, n_gt, n_eq;
};

// The q largest of the block's items (item i = j·kThreads + tid has key[j]; items ≥ n are
// absent), ties to the lower item index, left in s.sel[0, q) sorted by pack() descending.
// id_of(i): the item's id, increasing with i among items of equal key.
template <typename IdOf>
__device__ void block_select(const uint32_t (&key)[kItems], int n, int q, IdOf id_of, SelectShared& s) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  uint32_t prefix = 0, mask = 0;
  uint32_t need = uint32_t(q);  // how many of the items matching prefix are still to be taken
#pragma unroll 1
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = tid; b < 256; b += kThreads) s.hist[b] = 0;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const bool in = j * kThreads + tid < n && (key[j] & mask) == prefix;
      const uint32_t digit = (key[j] >> shift) & 255u;
      const unsigned active = __ballot_sync(0xffffffffu, in);
      if (in) {
        const unsigned same = __match_any_sync(active, digit);
        if (lane == __ffs(same) - 1) atomicAdd(&s.hist[digit], uint32_t(__popc(same)));
      }
    }
    __syncthreads();
    if (warp == 0) {  // lane L holds bins 255 − 8L − m (m = 0..7): lane order is bin order, descending
      uint32_t h[8], sum = 0;
#pragma unroll
      for (int m = 0; m < 8; ++m) sum += h[m] = s.hist[255 - 8 * lane - m];
      uint32_t incl = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const uint32_t v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      // at least `need` items match the prefix, so some lane reaches it
      const int hit = __ffs(__ballot_sync(0xffffffffu, incl >= need)) - 1;
      if (lane == hit) {
        uint32_t cum = incl - sum;
#pragma unroll
        for (int m = 0; m < 8; ++m) {
          if (cum + h[m] >= need) {
            s.prefix = prefix | (uint32_t(255 - 8 * lane - m) << shift);
            s.need = need - cum;
            s.eq_count = h[m];
            break;
          }
          cum += h[m];
        }
      }
    }
    __syncthreads();
    prefix = s.prefix, need = s.need, mask |= 255u << shift;
  }
  // prefix is now the q-th largest key t: the items above it, plus `need` of those equal to it
  const uint32_t t = prefix, eq_count = s.eq_count;
  const int above = q - int(need);
  if (tid == 0) s.n_gt = 0, s.n_eq = 0;
  __syncthreads();
  const bool ordered = eq_count > need;  // more ties than places: lowest index first
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int i = j * kThreads + tid;
    if (i >= n) continue;
    if (key[j] > t) {
      s.sel[atomicAdd(&s.n_gt, 1u)] = pack(key[j], id_of(i));
    } else if (key[j] == t && !ordered) {
      s.sel[above + int(atomicAdd(&s.n_eq, 1u))] = pack(key[j], id_of(i));
    }
  }
  if (ordered) {  // block-uniform branch: a scan of the equal items tile by tile, in index order
    uint32_t base = 0;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int i = j * kThreads + tid;
      const bool eq = i < n && key[j] == t;
      const unsigned b = __ballot_sync(0xffffffffu, eq);
      if (lane == 0) s.warp_count[warp] = uint32_t(__popc(b));
      __syncthreads();
      uint32_t before = 0, total = 0;
      for (int w = 0; w < kWarps; ++w) {
        const uint32_t c = s.warp_count[w];
        before += w < warp ? c : 0;
        total += c;
      }
      const uint32_t rank = base + before + uint32_t(__popc(b & ((1u << lane) - 1u)));
      if (eq && rank < need) s.sel[above + int(rank)] = pack(key[j], id_of(i));
      base += total;
      __syncthreads();  // warp_count is rewritten by the next tile
    }
  }
  // bitonic sort of s.sel[0, P), descending; padding (0) sorts last: no real item packs to 0
  int P = 2;
  while (P < q) P <<= 1;
  for (int i = q + tid; i < P; i += kThreads) s.sel[i] = 0;
  __syncthreads();
  for (int size = 2; size <= P; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      const int i = tid, j = tid ^ stride;
      if (i < P && j > i) {
        const unsigned long long a = s.sel[i], b = s.sel[j];
        const bool desc = (i & size) == 0;
        if (desc ? a < b : a > b) s.sel[i] = b, s.sel[j] = a;
      }
      __syncthreads();
    }
  }
}

// Block-wide (max, Σexp) combine; the result is valid in thread 0.
__device__ void block_lse(float& m, float& s) {
  __shared__ float sm[kWarps], ss[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    lse_combine(m, s, m2, s2);
  }
  if (lane == 0) sm[warp] = m, ss[warp] = s;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < kWarps; ++w) lse_combine(m, s, sm[w], ss[w]);
}

__global__ void penalty_kernel(float* logits, int64_t V, const SampleRowParams* rows, const PenaltyEntry* pens) {
  const SampleRowParams p = rows[blockIdx.x];
  float* row = logits + int64_t(blockIdx.x) * V;
  for (int e = threadIdx.x; e < p.penalty_count; e += blockDim.x) {
    const PenaltyEntry pe = pens[p.penalty_begin + e];
    if (pe.token < 0 || pe.token >= V) continue;
    float l = row[pe.token];
    if (p.repetition_penalty != 1.0f)
      l = l > 0 ? __fdiv_rn(l, p.repetition_penalty) : __fmul_rn(l, p.repetition_penalty);
    row[pe.token] = __fsub_rn(l, __fmaf_rn(p.frequency_penalty, float(pe.count), p.presence_penalty));
  }
}

__global__ void __launch_bounds__(kThreads) chunk_kernel(const float* logits, int64_t V, int S, int q,
                                                         const SampleRowParams* rows, float* win_val,
                                                         int32_t* win_id, float2* part) {
  __shared__ SelectShared s;
  const int r = blockIdx.y, c = blockIdx.x, tid = threadIdx.x;
  const int64_t c0 = int64_t(c) * V / S, c1 = int64_t(c + 1) * V / S;
  const int n = int(c1 - c0);
  const float* row = logits + int64_t(r) * V;
  float T = rows[r].temperature;
  if (!(T > 0)) T = 1.0f;
  uint32_t key[kItems];
  float m = -INFINITY, sum = 0;
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int i = j * kThreads + tid;
    key[j] = 0;
    if (i < n) {
      const float l = row[c0 + i];
      key[j] = order_key(l);
      const float x = __fdiv_rn(l, T);  // the host's logit / T, bit for bit
      if (x > m) {
        sum = sum * expf(m - x) + 1.0f;
        m = x;
      } else if (x > -INFINITY) {
        sum += expf(x - m);
      }
    }
  }
  block_lse(m, sum);
  if (tid == 0) part[int64_t(r) * S + c] = make_float2(m, sum);
  block_select(key, n, q, [&](int i) { return int32_t(c0 + i); }, s);
  const int64_t o = (int64_t(r) * S + c) * q;
  for (int j = tid; j < q; j += kThreads) {
    const int32_t id = unpack_id(s.sel[j]);
    win_id[o + j] = id;
    win_val[o + j] = row[id];
  }
}

__global__ void __launch_bounds__(kThreads) merge_kernel(const float* logits, int64_t V, int S, int q, int k,
                                                         const float* win_val, const int32_t* win_id,
                                                         const float2* part, uint32_t* out) {
  __shared__ SelectShared s;
  const int r = blockIdx.x, tid = threadIdx.x, n = S * q;
  const float* wv = win_val + int64_t(r) * n;
  const int32_t* wi = win_id + int64_t(r) * n;
  const float* row = logits + int64_t(r) * V;
  uint32_t key[kItems];
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int i = j * kThreads + tid;
    key[j] = i < n ? order_key(wv[i]) : 0;
  }
  block_select(key, n, q, [&](int i) { return wi[i]; }, s);
  uint32_t* o = out + int64_t(r) * (2 * k + 3);
  for (int j = tid; j < k; j += kThreads) {
    const int32_t id = unpack_id(s.sel[j]);
    o[j] = uint32_t(id);
    o[k + j] = __float_as_uint(row[id]);
  }
  if (tid == 0) {
    float m = -INFINITY, sum = 0;
    for (int c = 0; c < S; ++c) lse_combine(m, sum, part[int64_t(r) * S + c].x, part[int64_t(r) * S + c].y);
    o[2 * k] = __float_as_uint(m);
    o[2 * k + 1] = __float_as_uint(sum);
    o[2 * k + 2] = __float_as_uint(q > k ? row[unpack_id(s.sel[k])] : -INFINITY);
  }
}

}  // namespace

void sample_candidates(Ctx& c, Tensor& logits, std::span<const SampleRowParams> rows,
                       std::span<const PenaltyEntry> penalties, int32_t k, int32_t* ids, float* vals, float* stats) {
  const int64_t R = logits.rows(), V = logits.cols();
  QWEN36_CHECK(logits.dtype == DType::F32 && int64_t(rows.size()) == R, "sample_candidates: logits {} for {} rows",
               logits.shape_str(), rows.size());
  QWEN36_CHECK(k >= 1 && k <= std::min<int64_t>(V, kMaxSampleCandidates), "sample_candidates: k {} for vocab {}", k, V);
  QWEN36_CHECK(!c.capturing, "sample_candidates cannot be recorded (its tables change every call)");
  for (const SampleRowParams& p : rows)
    QWEN36_CHECK(p.penalty_begin >= 0 && p.penalty_count >= 0 &&
                     size_t(p.penalty_begin) + size_t(p.penalty_count) <= penalties.size(),
                 "sample_candidates: a row names penalty entries past the list");
  if (R == 0) return;
  const int q = int(std::min<int64_t>(int64_t(k) + 1, V));
  const int64_t s_min = (V + kChunkMax - 1) / kChunkMax, s_max = std::min<int64_t>(V / q, kChunkMax / q);
  QWEN36_CHECK(s_min <= s_max, "sample_candidates: a vocabulary of {} is too large for k = {}", V, k);
  // Balance chunk and merge (S ≈ sqrt(V / q)), but keep the grid to ~4 waves: a block holds
  // an SM (~100 registers × 512 threads), and many rows (R = 64) or a tiny q (greedy, k = 1:
  // sqrt(V / 2) ≈ 350 chunks a row) would otherwise launch thousands of near-empty blocks.
  const int64_t s_fill = (4 * int64_t(dev_info().sms) + R - 1) / R;
  const int S = int(std::clamp<int64_t>(std::min<int64_t>(std::llround(std::sqrt(double(V) / q)), s_fill), s_min, s_max));

  Temp<SampleRowParams> d_rows(c, rows);
  float* l = logits.as<float>();
  if (!penalties.empty()) {
    Temp<PenaltyEntry> d_pens(c, penalties);
    penalty_kernel<<<unsigned(R), 128, 0, c.stream>>>(l, V, d_rows.get(), d_pens.get());
    CUDA_LAUNCH_CHECK();
  }
  const size_t wins = size_t(R) * size_t(S) * size_t(q), words = size_t(R) * size_t(2 * k + 3);
  Temp<float> win_val(c, wins);
  Temp<int32_t> win_id(c, wins);
  Temp<float2> part(c, size_t(R) * size_t(S));
  Temp<uint32_t> out(c, words);
  chunk_kernel<<<dim3(unsigned(S), unsigned(R)), kThreads, 0, c.stream>>>(l, V, S, q, d_rows.get(), win_val.get(),
                                                                          win_id.get(), part.get());
  CUDA_LAUNCH_CHECK();
  merge_kernel<<<unsigned(R), kThreads, 0, c.stream>>>(l, V, S, q, k, win_val.get(), win_id.get(), part.get(),
                                                      out.get());
  CUDA_LAUNCH_CHECK();
  std::vector<uint32_t> host(words);
  CUDA_CHECK(cudaMemcpyAsync(host.data(), out.get(), words * sizeof(uint32_t), cudaMemcpyDeviceToHost, c.stream));
  CUDA_CHECK(cudaStreamSynchronize(c.stream));
  for (int64_t r = 0; r < R; ++r) {
    const uint32_t* o = host.data() + r * (2 * k + 3);
    for (int j = 0; j < k; ++j) {
      ids[r * k + j] = int32_t(o[j]);
      std::memcpy(&vals[r * k + j], &o[k + j], sizeof(float));
    }
    std::memcpy(&stats[r * 3], &o[2 * k], 3 * sizeof(float));
  }
}

}  // namespace qwen36::cuda
