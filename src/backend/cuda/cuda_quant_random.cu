// Random GGUF blocks on the device, for synthetic quantized models (qwen36 bench --synthetic
// --type q4_k_m): cuda_random.cu asks for each quantized matrix through quant_random_fill.
// Also random blocks of the Hugging Face checkpoint types (--type awq, nvfp4, fp8;
// quant/hf_blocks.h) through hf_random_fill.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_quant_blocks.cuh"
#include "backend/cuda/cuda_quant_hf.cuh"
#include "quant/hf_blocks.h"

namespace qwen36::cuda {

namespace {

// ---- random blocks (synthetic models) ----

__device__ __forceinline__ uint64_t hash64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ void put_f16(uint8_t* p, float v) {
  *reinterpret_cast<uint16_t*>(p) = __half_as_ushort(__float2half_rn(v));
}

// Random quants, then scales chosen so values have standard deviation ≈ sigma and mean ≈ 0
// (the choices of model/random_quant_weights.cpp, which has no IQ4_XS or 32-block generators):
// y = d · sc · (q − centre), d = sigma / (std of q · mean sc).
template <DType D>
__global__ void random_blocks_kernel(uint8_t* __restrict__ dst, int64_t nb, float sigma, uint64_t seed) {
  using Q = QType<D>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < nb; i += int64_t(gridDim.x) * blockDim.x) {
    uint8_t* p = dst + size_t(i) * Q::kBytes;
    const uint64_t key = seed + uint64_t(i) * 0x9e3779b97f4a7c15ull;
    uint16_t* h = reinterpret_cast<uint16_t*>(p);  // blocks are 2-byte aligned
    for (int j = 0; j < Q::kBytes / 2; j += 4) {
      const uint64_t r = hash64(key + uint64_t(j));
      for (int k = 0; k < 4 && j + k < Q::kBytes / 2; ++k) h[j + k] = uint16_t(r >> (16 * k));
    }
    const uint64_t r = hash64(key ^ 0x5851f42d4c957f2dull);
    if constexpr (D == DType::Q8_0) {
      for (int j = 2; j < 34; ++j) p[j] = p[j] == 0x80 ? uint8_t(0x81) : p[j];  // no −128
      put_f16(p, sigma / 73.6f);
    } else if constexpr (D == DType::Q4_0 || D == DType::Q5_0) {
      put_f16(p, sigma / (D == DType::Q4_0 ? 4.61f : 9.23f));
    } else if constexpr (D == DType::Q4_1 || D == DType::Q5_1) {
      const float d = sigma / (D == DType::Q4_1 ? 4.61f : 9.23f);
      put_f16(p, d);
      put_f16(p + 2, -d * (D == DType::Q4_1 ? 7.5f : 15.5f));
    } else if constexpr (D == DType::Q4_K || D == DType::Q5_K) {
      const bool five = D == DType::Q5_K;
      const float dd = sigma / ((five ? 9.23f : 4.61f) * 47.5f);
      put_f16(p, dd);
      put_f16(p + 2, dd * (five ? 15.5f : 7.5f));  // with m == sc: y = dd · sc · (q − centre)
      for (int j = 4; j < 16; ++j) p[j] = 0;
      for (int j = 0; j < 8; ++j) {
        const int sc = 32 + int((r >> (5 * j)) & 31);
        pack_k_scale_min(p + 4, j, sc, sc);
      }
    } else if constexpr (D == DType::Q6_K) {
      for (int j = 0; j < 16; ++j) p[192 + j] = uint8_t(16 + ((r >> (3 * j)) & 31) + ((r >> 50) & 15));
      put_f16(p + 208, sigma / (18.5f * 39.5f));
    } else {  // IQ4_XS: ls − 32 in 8..31, the grid's standard deviation is 67.2
      uint32_t lo = 0, hi = 0;
      for (int ib = 0; ib < 8; ++ib) {
        const int ls = 40 + int(((r >> (5 * ib)) & 31) % 24);
        lo |= uint32_t(ls & 15) << (4 * ib);
        hi |= uint32_t(ls >> 4) << (2 * ib);
      }
      put_f16(p, sigma / (67.2f * 19.5f));
      *reinterpret_cast<uint16_t*>(p + 2) = uint16_t(hi);
      *reinterpret_cast<uint16_t*>(p + 4) = uint16_t(lo);
      *reinterpret_cast<uint16_t*>(p + 6) = uint16_t(lo >> 16);
    }
  }
}

// Random HF blocks with values of standard deviation ≈ sigma and mean ≈ 0, as a checkpoint
// would hold them: uniform codes, scales near sigma / (std of the codes).
//  - W4 (AWQ-like): codes 0..15 (std 4.61), zero 8, f16 scale sigma/4.61 · [0.75, 1.25).
//  - NVFP4: uniform E2M1 codes (std 2.93), group scales e4m3 in [0.5, 1.875] (mean 1.08),
//    global scale sigma / (2.93 · 1.08).
//  - F8_B128: e4m3 codes with exponents 5..8 (|values| in [0.25, 3.75], std ≈ 1.69, no NaN),
//    block scale sigma / 1.69.
template <typename B>
__global__ void random_hf_blocks_kernel(B* __restrict__ dst, int64_t nb, float sigma, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < nb; i += int64_t(gridDim.x) * blockDim.x) {
    B& b = dst[i];
    const uint64_t key = seed + uint64_t(i) * 0x9e3779b97f4a7c15ull;
    const uint64_t r = hash64(key ^ 0x5851f42d4c957f2dull);
    if constexpr (std::is_same_v<B, BlockW4G32> || std::is_same_v<B, BlockW4G128>) {
      for (int j = 0; j < int(sizeof(b.qs)); j += 8) {
        const uint64_t q = hash64(key + uint64_t(j));
        for (int k = 0; k < 8; ++k) b.qs[j + k] = uint8_t(q >> (8 * k));
      }
      b.s = __half_as_ushort(__float2half_rn(sigma / 4.61f * (0.75f + 0.5f * float(r & 255) / 256.0f)));
      b.z = 8;
      b.kind = 0;
    } else if constexpr (std::is_same_v<B, BlockNvfp4B64>) {
      for (int j = 0; j < 32; j += 8) {
        const uint64_t q = hash64(key + uint64_t(j));
        for (int k = 0; k < 8; ++k) b.qs[j + k] = uint8_t(q >> (8 * k));
      }
      for (int k = 0; k < 4; ++k) b.s[k] = uint8_t(0x30 + ((r >> (4 * k)) & 15));  // exponents 6, 7
      b.g = sigma / (2.93f * 1.08f);
    } else {
      for (int j = 0; j < 128; j += 8) {
        const uint64_t q = hash64(key + uint64_t(j));
        for (int k = 0; k < 8; ++k) {
          const uint32_t v = uint32_t(q >> (8 * k));
          b.q[j + k] = uint8_t((v & 0x80u) | ((5u + ((v >> 3) & 3u)) << 3) | (v & 7u));
        }
      }
      b.d = sigma / 1.69f;
    }
  }
}

}  // namespace

void hf_random_fill(DType t, void* dst, int64_t n, float sigma, uint64_t seed) {
  const int64_t nb = n / dtype_block_elems(t);
  if (nb == 0) return;
  const int blocks = int(std::min<int64_t>(blocks_for(nb, 256), int64_t(dev_info().sms) * 16));
  switch (t) {
    case DType::W4_G32: random_hf_blocks_kernel<<<blocks, 256>>>(static_cast<BlockW4G32*>(dst), nb, sigma, seed); break;
    case DType::W4_G128: random_hf_blocks_kernel<<<blocks, 256>>>(static_cast<BlockW4G128*>(dst), nb, sigma, seed); break;
    case DType::F8_B128: random_hf_blocks_kernel<<<blocks, 256>>>(static_cast<BlockF8B128*>(dst), nb, sigma, seed); break;
    case DType::NVFP4_B64: random_hf_blocks_kernel<<<blocks, 256>>>(static_cast<BlockNvfp4B64*>(dst), nb, sigma, seed); break;
    default: fail("random weights: {} is not a Hugging Face block type", dtype_name(t));
  }
  CUDA_LAUNCH_CHECK();
}

void quant_random_fill(DType t, void* dst, int64_t n, float sigma, uint64_t seed) {
  if (hf_quant_supported(t)) return hf_random_fill(t, dst, n, sigma, seed);
  const bool ok = with_quant_type(t, [&](auto dt) {
    constexpr DType D = decltype(dt)::value;
    const int64_t nb = n / QType<D>::kElems;
    if (nb == 0) return;
    const int blocks = int(std::min<int64_t>(blocks_for(nb, 256), int64_t(dev_info().sms) * 16));
    random_blocks_kernel<D><<<blocks, 256>>>(static_cast<uint8_t*>(dst), nb, sigma, seed);
    CUDA_LAUNCH_CHECK();
  });
  QWEN36_CHECK(ok, "random weights: no device generator for {}", dtype_name(t));
}

}  // namespace qwen36::cuda
