#pragma once
// defines: random_model_plan, synthetic_vocab, gen_model_file, make_random_quant_weights
//
// Full-size random checkpoints for speed work, in any file type, without quantizing floats:
// block types are generated directly (random quants with bounded scales, so dequantized
// matrices behave like ~N(0, 1/fan_in) and no NaN/Inf can appear), a 27B Q4_K_M takes
// seconds per GB instead of hours. Values come from a counter-based generator keyed by
// (seed, tensor, row), so a file and an in-memory model of the same preset/type/seed are
// identical and generation order or chunking never changes them.

#include <cstdint>
#include <string>

#include "format/gguf_convert.h"
#include "model/weights.h"
#include "quant/mix_rules.h"

namespace qwen36 {

// A small byte-level BPE vocabulary (256 byte tokens, a few merges, <|endoftext|>,
// <|im_start|>, <|im_end|>), padded with unused [PAD] tokens to vocab_size.
GgufVocab synthetic_vocab(int64_t vocab_size);

// Every tensor of `c` in GGUF form with random generators, metadata and synthetic tokenizer.
ModelPlan random_model_plan(const ModelConfig& c, uint64_t seed, const std::string& name);

// Streams a random model to `path` in `mix` (types chosen by llama.cpp's rules). Returns the
// file size.
uint64_t gen_model_file(const ModelConfig& c, QuantMix mix, const std::string& path, uint64_t seed,
                        bool progress = true);

// The same model in host memory (no file): what benchmarks use.
ModelWeights make_random_quant_weights(const ModelConfig& c, QuantMix mix, uint64_t seed);

}  // namespace qwen36
