#pragma once
// defines: gguf_metadata_for_config, GgufVocab, set_tokenizer_metadata, plan_from_hf,
//          convert_hf_to_gguf
//
// HF checkpoint → GGUF laid out exactly as llama.cpp's convert_hf_to_gguf.py writes the
// qwen35 / qwen35moe architectures (names, KV keys and types, F32 small tensors, alignment 32):
//  - +1 baked into every zero-centred norm (not the DeltaNet ssm_norm); ssm_a = −exp(A_log);
//  - DeltaNet value heads moved from HF's grouped-by-key-head order to llama.cpp's tiled order
//    in the V rows of attn_qkv, the rows of attn_gate / ssm_alpha / ssm_beta, ssm_a, ssm_dt.bias,
//    the V channels of ssm_conv1d and the columns of ssm_out;
//  - routed experts (fused 3-D or one tensor per expert) stacked as ffn_{gate,up,down}_exps;
//  - mtp.* becomes block n_layers (blk.L.nextn.* plus the regular layer names).

#include <string>
#include <vector>

#include "format/gguf_plan.h"
#include "model/config.h"

namespace qwen36 {

// The architecture KVs (general.* and {qwen35,qwen35moe}.*) for a config, in the converter's
// order. file_type is llama.cpp's LLAMA_FTYPE (BF16 = 32, ...).
GgufMetadata gguf_metadata_for_config(const ModelConfig& c, const std::string& name, uint32_t file_type);

// A gpt2-type BPE vocabulary as GGUF stores it.
struct GgufVocab {
  std::vector<std::string> tokens;      // [vocab_size], "[PAD<i>]" for holes
  std::vector<int32_t> token_types;     // 1 normal, 3 control, 4 user-defined, 5 unused
  std::vector<std::string> merges;      // "left right"
  std::string pre = "qwen35";           // tokenizer.ggml.pre
  int32_t eos = -1, bos = -1, pad = -1;
  std::string chat_template;            // empty: none
};
void set_tokenizer_metadata(GgufMetadata& m, const GgufVocab& v);

// The vocabulary of an HF directory's tokenizer.json (+ tokenizer_config.json for special ids
// and the chat template), padded to vocab_size. Needs the tokenizer (PCRE2 build).
GgufVocab vocab_from_hf_dir(const std::string& dir, int64_t vocab_size);

// Every tensor of the checkpoint in GGUF form; matrices have natural type `matrix_type`
// (BF16, F16 or F32), the small tensors F32. Includes the tokenizer when the directory has one.
ModelPlan plan_from_hf(const std::string& dir, DType matrix_type);

// `qwen36 convert`: returns the written file size.
uint64_t convert_hf_to_gguf(const std::string& dir, const std::string& out, DType matrix_type, bool progress = true);

}  // namespace qwen36
