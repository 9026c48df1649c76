#pragma once
// defines: StateRef, a DeltaNet recurrent state of f32 or bf16 elements as the DeltaNet kernels
//          read and write it (cuda_deltanet.cu, cuda_delta_chunked.cu). Included by .cu only.

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/cuda_ops.cuh"

namespace qwen36::cuda {

// A DeltaNet recurrent state [slots, Hv, dk, dv] of f32 or bf16 elements (model/state.h: a bf16
// state is widened exactly when read and rounded to nearest even when written). Kernels load it
// at their start and store it at their end, so a runtime flag serves both element types without
// doubling their instantiations. Indices count elements.
struct StateRef {
  void* p = nullptr;
  bool bf16 = false;
  __device__ __forceinline__ float4 load4(int64_t i) const {
    if (!bf16) return *reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
    const uint2 w = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(p) + i);
    return make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xFFFF0000u), __uint_as_float(w.y << 16),
                       __uint_as_float(w.y & 0xFFFF0000u));
  }
  __device__ __forceinline__ void store4(int64_t i, const float4& v) const {
    if (!bf16) {
      *reinterpret_cast<float4*>(static_cast<float*>(p) + i) = v;
      return;
    }
    const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
    *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(p) + i) =
        make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
  }
  __device__ __forceinline__ float2 load2(int64_t i) const {
    if (!bf16) return *reinterpret_cast<const float2*>(static_cast<const float*>(p) + i);
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(static_cast<const __nv_bfloat16*>(p) + i));
  }
  __device__ __forceinline__ void store2(int64_t i, const float2& v) const {
    if (!bf16)
      *reinterpret_cast<float2*>(static_cast<float*>(p) + i) = v;
    else
      *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p) + i) = __float22bfloat162_rn(v);
  }
  __device__ __forceinline__ float load(int64_t i) const {
    return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]) : static_cast<const float*>(p)[i];
  }
  __device__ __forceinline__ void store(int64_t i, float v) const {
    if (bf16)
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
    else
      static_cast<float*>(p)[i] = v;
  }
  // What a store and a load give back: v itself, or v rounded to bf16.
  __device__ __forceinline__ float stored(float v) const { return bf16 ? __bfloat162float(__float2bfloat16_rn(v)) : v; }
};
// The state tensor's StateRef; fails unless it is f32 or bf16.
StateRef state_ref(const Tensor& state);

}  // namespace qwen36::cuda
