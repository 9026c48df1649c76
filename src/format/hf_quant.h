#pragma once
// defines: HfQuantFormat, HfQuant (how a Hugging Face checkpoint is quantized), read_hf_quant,
//          load_hf_quant_linear
//
// Detection reads config.json's quantization_config.quant_method (awq, gptq, compressed-tensors,
// fp8, modelopt) or hf_quant_config.json (modelopt). Any other method, and any option of a
// known method that is not handled (AWQ GEMV/exllama layouts, bits != 4, FP8 without 128-wide
// blocks, ...), fails at load with one line naming the format and the option.
//
// Which Linear layers are quantized is read from the tensors themselves: a module stored with
// qweight / weight_packed / an FP8 or packed-FP4 weight is converted, every other module (the
// checkpoint's modules_to_not_convert / ignore / exclude_modules: lm_head, embeddings, MTP,
// routers, the tiny GDN a/b projections, ...) is an ordinary float tensor and loads as such.
//
// Conversions (exact: every checkpoint bit is kept, dequantization formulas in quant/hf_blocks.h):
//   awq, gptq, compressed-tensors pack-quantized  → W4_G128 (groups of 128k) or W4_G32 (32, 64)
//   gptq / compressed-tensors with act-order g_idx that mixes groups inside a 32-block → F32
//   fp8 (weight_block_size [*, 128])              → F8_B128
//   modelopt NVFP4, compressed-tensors nvfp4      → NVFP4_B64

#include <string>

#include "core/tensor.h"

namespace qwen36 {

struct ModelWeights;
class SafetensorsSet;

enum class HfQuantFormat { None, Awq, Gptq, CompressedInt4, CompressedNvfp4, Fp8Block, ModeloptNvfp4 };

struct HfQuant {
  HfQuantFormat format = HfQuantFormat::None;
  int64_t group_size = 128;  // W4 formats; -1 = one group per row (per-channel)
  bool symmetric = false;    // compressed-tensors int4: zero point 8 and no weight_zero_point
  int zero_offset = 0;       // added to stored zeros: 1 for GPTQ v1 ("gptq"), 0 for v2
  bool desc_act = false;     // GPTQ: g_idx must be present
  int64_t block_n = 128;     // FP8: rows per weight_scale_inv entry (columns: always 128)

  bool quantized() const { return format != HfQuantFormat::None; }
  std::string describe() const;  // e.g. "gptq v1 4-bit group 128 (desc_act)"
};

// Reads dir/config.json and dir/hf_quant_config.json. Format None when neither declares a
// quantization; throws a one-line Error for an unsupported method or option.
HfQuant read_hf_quant(const std::string& dir);

// When `module` (a Linear's name without ".weight", e.g. "model.layers.0.mlp.up_proj") is
// stored quantized in `st`, converts it into an internal block type (storage added to
// w.storage), sets `out` to the {out_features, in_features} matrix and returns true. Returns
// false when the module is stored as a plain float tensor. A module GPTQ quantized with an
// act-order g_idx that mixes groups inside 32 columns comes back as exact f32 weights. Throws a one-line Error for a
// missing companion tensor (qzeros, scales, ...) or an inconsistent shape.
bool load_hf_quant_linear(ModelWeights& w, const SafetensorsSet& st, const HfQuant& q, const std::string& module,
                          Tensor& out);

// The name of the first internal HF block type (quant/hf_blocks.h) among w's matrices, or ""
// when there is none.
std::string hf_block_dtype_in(const ModelWeights& w);

}  // namespace qwen36
