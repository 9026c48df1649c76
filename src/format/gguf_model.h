#pragma once
// defines: load_gguf_model (a qwen35 / qwen35moe GGUF file → the canonical ModelWeights)
//
// GGUF files as llama.cpp's converter writes them: norms with +1 baked in, ssm_a =
// −exp(A_log) (both already the canonical form), and the DeltaNet value heads stored *tiled*
// over key heads ([k0v0, k1v0, ..., k0v1, ...]) instead of grouped by key head. The tiling is
// undone at load for every tensor whose rows (or elements) are per value head — a row
// permutation, valid for any block-quantized type. The columns of ssm_out cannot be permuted
// when a quantization block straddles two heads, so out_proj keeps the file's order and
// DeltaNetWeights::out_proj_heads tells the model how to order its input heads.

#include <string>

#include "model/weights.h"

namespace qwen36 {

ModelWeights load_gguf_model(const std::string& path);

}  // namespace qwen36
