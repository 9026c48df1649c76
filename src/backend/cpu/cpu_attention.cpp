// Gated full attention on the CPU: q/gate split, partial NeoX RoPE, causal GQA attention
// over a per-slot KV cache of f32 or bf16 elements, or of the quantised formats of
// backend/kv_cache.h (fp8 e4m3, q8_0, q4_0): those encode each new (position, kv head) row
// on append and decode the run's history to f32 on read (q8_0/q4_0 rotate q before the
// scores and the output back after P·V, see kv_cache.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/kv_cache.h"
#include "core/error.h"

namespace qwen36::cpu {

void split_q_gate(const Tensor& qg, Tensor& q, Tensor& gate) {
  const int64_t hd = q.cols();
  const int64_t rows = q.numel() / hd;  // T * heads
  QWEN36_CHECK(qg.numel() == 2 * q.numel() && gate.numel() == q.numel(), "split_q_gate: {} → {} + {}",
               qg.shape_str(), q.shape_str(), gate.shape_str());
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = qg.as<const float>() + r * 2 * hd;
    std::memcpy(q.as<float>() + r * hd, src, size_t(hd) * sizeof(float));
    std::memcpy(gate.as<float>() + r * hd, src + hd, size_t(hd) * sizeof(float));
  }
}

void rope(Tensor& x, std::span<const SeqRun> runs, int64_t rotary_dim, float theta) {
  QWEN36_CHECK(x.ndim == 3, "rope: expected [T, heads, head_dim], got {}", x.shape_str());
  const int64_t heads = x.dim(1), hd = x.dim(2), half = rotary_dim / 2;
  QWEN36_CHECK(rotary_dim % 2 == 0 && rotary_dim <= hd, "rope: rotary_dim {} vs head_dim {}", rotary_dim, hd);
  // Frequencies in f32 as the reference computes them: inv_freq[i] = 1 / theta^(2i / rotary_dim).
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[size_t(i)] = 1.0f / std::pow(theta, float(2 * i) / float(rotary_dim));
  std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  for (const SeqRun& run : runs) {
    for (int32_t j = 0; j < run.count; ++j) {
      const float pos = float(run.pos0 + j);
      for (int64_t i = 0; i < half; ++i) {
        const float f = pos * inv_freq[size_t(i)];
        cs[size_t(i)] = std::cos(f);
        sn[size_t(i)] = std::sin(f);
      }
      float* row = x.as<float>() + int64_t(run.begin + j) * heads * hd;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = row + h * hd;
        for (int64_t i = 0; i < half; ++i) {
          const float a = v[i], b = v[i + half];
          v[i] = a * cs[size_t(i)] - b * sn[size_t(i)];
          v[i + half] = b * cs[size_t(i)] + a * sn[size_t(i)];
        }
      }
    }
  }
}

namespace {

// K/V cache element access: f32 caches are copied exactly, bf16 caches round to nearest even
// on append and widen on read (the CUDA kernels store and read the same values).
inline void store_row(float* dst, const float* src, int64_t n) { std::memcpy(dst, src, size_t(n) * sizeof(float)); }
inline void store_row(uint16_t* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}
inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const uint16_t* p, int64_t i) { return bf16_to_f32(p[i]); }

// o = Σ_p softmax_p(scale · q·k_p) · v_p over positions p < n_ctx, where k_p = kb + p·stride and
// v_p = vb + p·stride are rows of hd cache elements; scores has room for n_ctx values.
template <typename CT>
void attend(const float* qv, const CT* kb, const CT* vb, int64_t stride, int64_t n_ctx, int64_t hd, float scale,
            float* scores, float* o) {
  float mx = -INFINITY;
  for (int64_t p = 0; p < n_ctx; ++p) {
    const CT* kv = kb + p * stride;
    float s = 0;
    for (int64_t d = 0; d < hd; ++d) s += qv[d] * load(kv, d);
    s *= scale;
    scores[p] = s;
    mx = std::max(mx, s);
  }
  float sum = 0;
  for (int64_t p = 0; p < n_ctx; ++p) sum += scores[p] = std::exp(scores[p] - mx);
  const float inv = 1.0f / sum;
  std::fill(o, o + hd, 0.0f);
  for (int64_t p = 0; p < n_ctx; ++p) {
    const float wgt = scores[p] * inv;
    const CT* vv = vb + p * stride;
    for (int64_t d = 0; d < hd; ++d) o[d] += wgt * load(vv, d);
  }
}

template <typename CT>
void attention_cache(const Tensor& q, const Tensor& k, const Tensor& v, CT* kc, CT* vc, int64_t cap,
                     std::span<const SeqRun> runs, float scale, Tensor& out) {
  const int64_t H = q.dim(1), hd = q.dim(2), KVH = k.dim(1);
  const int64_t group = H / KVH, row = KVH * hd;

  // Append the new keys/values first, so each query sees its own position.
  for (const SeqRun& r : runs)
    for (int32_t j = 0; j < r.count; ++j) {
      const int64_t dst = (int64_t(r.slot) * cap + r.pos0 + j) * row;
      store_row(kc + dst, k.as<const float>() + int64_t(r.begin + j) * row, row);
      store_row(vc + dst, v.as<const float>() + int64_t(r.begin + j) * row, row);
    }

  for (const SeqRun& r : runs) {
    const CT* kbase = kc + int64_t(r.slot) * cap * row;
    const CT* vbase = vc + int64_t(r.slot) * cap * row;
#pragma omp parallel
    {
      std::vector<float> scores(size_t(r.pos0 + r.count));
#pragma omp for collapse(2) schedule(dynamic, 1)
      for (int32_t j = 0; j < r.count; ++j) {
        for (int64_t h = 0; h < H; ++h) {
          const int64_t n_ctx = r.pos0 + j + 1;  // causal: positions 0..pos
          const float* qv = q.as<const float>() + (int64_t(r.begin + j) * H + h) * hd;
          const int64_t kvh = h / group;
          attend(qv, kbase + kvh * hd, vbase + kvh * hd, row, n_ctx, hd, scale, scores.data(),
                 out.as<float>() + (int64_t(r.begin + j) * H + h) * hd);
        }
      }
    }
  }
}

// Quantised caches. Each run's history is decoded once per kv head into f32 rows (the values
// the CUDA kernels read), then attention runs as above over them.
void attention_quantized(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache,
                         std::span<const SeqRun> runs, float scale, Tensor& out) {
  const DType t = k_cache.dtype;
  const int64_t H = q.dim(1), hd = q.dim(2), KVH = k.dim(1), group = H / KVH;
  const int64_t slots = k_cache.dim(0), cap = k_cache.dim(1);
  const size_t rb = dtype_row_bytes(t, hd), soff = kv_scale_offset(t, slots, cap, KVH, hd);
  const bool rot = kv_cache_rotated(t);
  auto row_at = [&](Tensor& c, int64_t slot, int64_t p, int64_t h) {
    return c.as<uint8_t>() + size_t((slot * cap + p) * KVH + h) * rb;
  };
  auto scale_at = [&](Tensor& c, int64_t slot, int64_t p, int64_t h) {
    return reinterpret_cast<float*>(c.as<uint8_t>() + soff) + (slot * KVH + h) * cap + p;
  };
  float unused = 0;
  std::vector<float> tmp(static_cast<size_t>(hd), 0.0f);
  for (const SeqRun& r : runs)
    for (int32_t j = 0; j < r.count; ++j)
      for (int64_t h = 0; h < KVH; ++h) {
        const int64_t src = (int64_t(r.begin + j) * KVH + h) * hd;
        const bool f8 = t == DType::F8_E4M3;
        kv_encode_row(t, k.as<const float>() + src, hd, row_at(k_cache, r.slot, r.pos0 + j, h),
                      f8 ? scale_at(k_cache, r.slot, r.pos0 + j, h) : &unused, tmp.data());
        kv_encode_row(t, v.as<const float>() + src, hd, row_at(v_cache, r.slot, r.pos0 + j, h),
                      f8 ? scale_at(v_cache, r.slot, r.pos0 + j, h) : &unused, tmp.data());
      }

  for (const SeqRun& r : runs) {
    if (r.count == 0) continue;
    const int64_t n = r.pos0 + r.count;
    std::vector<float> kf(static_cast<size_t>(n * hd)), vf(static_cast<size_t>(n * hd));
    for (int64_t kvh = 0; kvh < KVH; ++kvh) {
#pragma omp parallel for schedule(static)
      for (int64_t p = 0; p < n; ++p) {
        const bool f8 = t == DType::F8_E4M3;
        kv_decode_row(t, row_at(k_cache, r.slot, p, kvh), f8 ? *scale_at(k_cache, r.slot, p, kvh) : 1.0f, hd,
                      kf.data() + p * hd);
        kv_decode_row(t, row_at(v_cache, r.slot, p, kvh), f8 ? *scale_at(v_cache, r.slot, p, kvh) : 1.0f, hd,
                      vf.data() + p * hd);
      }
#pragma omp parallel
      {
        std::vector<float> scores(static_cast<size_t>(n)), qv(static_cast<size_t>(hd)), o(static_cast<size_t>(hd));
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int32_t j = 0; j < r.count; ++j) {
          for (int64_t g = 0; g < group; ++g) {
            const int64_t h = kvh * group + g, n_ctx = r.pos0 + j + 1;
            std::memcpy(qv.data(), q.as<const float>() + (int64_t(r.begin + j) * H + h) * hd, size_t(hd) * 4);
            if (rot) kv_hadamard(qv.data(), hd);
            attend(qv.data(), kf.data(), vf.data(), hd, n_ctx, hd, scale, scores.data(), o.data());
            if (rot) kv_hadamard(o.data(), hd);
            std::memcpy(out.as<float>() + (int64_t(r.begin + j) * H + h) * hd, o.data(), size_t(hd) * 4);
          }
        }
      }
    }
  }
}

}  // namespace

void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache,
               std::span<const SeqRun> runs, float scale, Tensor& out) {
  QWEN36_CHECK(q.ndim == 3 && k.ndim == 3 && k_cache.ndim == 4, "attention: bad ranks q {} k {} cache {}",
               q.shape_str(), k.shape_str(), k_cache.shape_str());
  const int64_t H = q.dim(1), hd = q.dim(2), KVH = k.dim(1);
  const int64_t slots = k_cache.dim(0), cap = k_cache.dim(1);
  QWEN36_CHECK(k_cache.dim(2) == KVH && k_cache.dim(3) == hd && H % KVH == 0, "attention: cache {} for k {}",
               k_cache.shape_str(), k.shape_str());
  QWEN36_CHECK(k_cache.dtype == v_cache.dtype && kv_cache_type_supported(k_cache.dtype),
               "attention: KV cache types {} / {} are not supported (f32, bf16, f8_e4m3, q8_0, q4_0; both the same)",
               dtype_name(k_cache.dtype), dtype_name(v_cache.dtype));
  QWEN36_CHECK(kv_cache_head_dim_ok(k_cache.dtype, hd), "attention: a {} KV cache needs a power-of-two head_dim ≥ 32, not {}",
               dtype_name(k_cache.dtype), hd);
  for (const SeqRun& r : runs) {
    QWEN36_CHECK(r.slot >= 0 && r.slot < slots, "attention: slot {} out of range", r.slot);
    QWEN36_CHECK(r.pos0 >= 0 && r.pos0 + r.count <= cap, "attention: positions {}..{} exceed the cache capacity {}",
                 r.pos0, r.pos0 + r.count - 1, cap);
  }
  if (kv_cache_quantized(k_cache.dtype))
    attention_quantized(q, k, v, k_cache, v_cache, runs, scale, out);
  else if (k_cache.dtype == DType::BF16)
    attention_cache(q, k, v, k_cache.as<uint16_t>(), v_cache.as<uint16_t>(), cap, runs, scale, out);
  else
    attention_cache(q, k, v, k_cache.as<float>(), v_cache.as<float>(), cap, runs, scale, out);
}

}  // namespace qwen36::cpu
