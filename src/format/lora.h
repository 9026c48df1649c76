#pragma once
// defines: LoraAdapter, load_lora_adapter, merge_lora (a PEFT LoRA adapter added into the
//          model's weights at load: W ← W + scale · s · B·A, s = α / r, or α / √r with rsLoRA)
//
// Why merged: the forward pass (fused CUDA kernels, CUDA graphs, tiled quantized layouts)
// then runs unchanged at full speed. Its limits follow: one set of adapters for the whole
// process (no per-request adapters), and only weights stored as bf16 / f16 / f32 take one —
// a quantized matrix would have to be requantized, which loses what the adapter adds. Merge the
// adapter before quantizing for those (PEFT's merge_and_unload, then `qwen36 convert` /
// `quantize`).

#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/weights.h"

namespace qwen36 {

struct LoraAdapter {
  struct Pair {
    std::string module;  // the Hugging Face module, "model.layers.3.self_attn.q_proj"
    Tensor a, b;         // lora_A [r, in], lora_B [out, r]; bf16, f16 or f32
  };
  std::string path;
  float alpha = 0;
  bool rslora = false;  // use_rslora: s = α / √r
  std::vector<Pair> pairs;
  std::shared_ptr<const void> storage;  // what a and b view

  // s for a module of rank r (PEFT: lora_alpha / r, or / √r with use_rslora).
  float scaling(int64_t rank) const;
};

// A PEFT adapter directory: adapter_config.json (peft_type LORA) and adapter_model.safetensors.
// Throws Error naming what it cannot take: DoRA, fan_in_fan_out, biases, modules_to_save,
// alpha_pattern, embedding adapters, a lora_A without its lora_B.
LoraAdapter load_lora_adapter(const std::string& dir);

// Adds every pair's scale · s · B·A into its target matrix of `w` (new storage in w.storage; the
// checkpoint's own stays untouched). Every target is checked first — a module it does not know,
// a routed expert, a quantized or tied matrix, a shape that does not match — and nothing is
// changed unless all of them can be merged. Returns the number of matrices merged.
int merge_lora(ModelWeights& w, const LoraAdapter& adapter, float scale);

}  // namespace qwen36
