#pragma once
// defines: QuantMix (the file types `qwen36 quantize` / `gen-model` make), parse_quant_mix,
//          quant_mix_name, quant_mix_llama_ftype, MixTensor, choose_tensor_types,
//          order_like_llama_quantize
//
// llama-quantize does not give every tensor the file type's base type: it keeps 1-D tensors,
// norms, routers and conv taps as they are, gives output.weight more bits, and in the _M mixes
// bumps a "use_more_bits" subset of the attention-V-like and ffn_down tensors to Q6_K. Files
// must match llama.cpp's per-tensor choices (tests compare against llama-quantize's output),
// so these rules follow its logic (src/llama-quant.cpp, learned from reading it) for the
// mixes implemented here. Rules for types we do not make (IQ*, Q2/Q3) are left out.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace qwen36 {

enum class QuantMix { F32, F16, BF16, Q8_0, Q6_K, Q5_K_M, Q5_K_S, Q4_K_M, Q4_K_S };

// "Q4_K_M", "q4_k_m", "bf16", ... (case-insensitive); nullopt when unknown.
std::optional<QuantMix> parse_quant_mix(std::string_view s);
std::string quant_mix_name(QuantMix m);  // "Q4_K_M"
// llama.cpp's LLAMA_FTYPE value written as general.file_type (Q4_K_M = 15, BF16 = 32, ...).
uint32_t quant_mix_llama_ftype(QuantMix m);

// One tensor as the rules see it.
struct MixTensor {
  std::string name;            // GGUF name, e.g. "blk.3.attn_v.weight"
  std::vector<int64_t> shape;  // torch order (outermost first); shape.back() is the row length
  DType dtype;                 // its current (source) type: kept when the tensor is not quantized
};

// Model facts the rules depend on.
struct MixModelInfo {
  int64_t n_expert = 0;     // {arch}.expert_count (0 for dense)
  int64_t n_layer_all = 0;  // {arch}.block_count (MTP layers included)
};

// The type of every tensor, index-aligned with `tensors`, which must be in the order
// llama-quantize visits them (see order_like_llama_quantize): some rules count tensors.
// Float mixes (F32/F16/BF16) convert every quantizable tensor to that type.
std::vector<DType> choose_tensor_types(QuantMix mix, const std::vector<MixTensor>& tensors, const MixModelInfo& info);

// llama.cpp's model loader keeps tensors in a map ordered by (block number, name), with
// non-block tensors (block -1) first; llama-quantize writes them in that order.
// Returns the permutation: result[k] = index of the k-th tensor to write.
std::vector<size_t> order_like_llama_quantize(const std::vector<std::string>& names);

}  // namespace qwen36
