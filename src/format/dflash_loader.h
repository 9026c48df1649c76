#pragma once
// defines: parse_dflash_config (a z-lab DFlash drafter's config.json → DFlashConfig),
//          load_dflash_checkpoint (its directory → DFlashWeights)
//
// Both config schemas are read: the older one keeps `block_size` at the top level, the newer
// one moves it into `dflash_config`; `mask_token_id` and `target_layer_ids` sit in
// `dflash_config` (top-level copies are accepted). Without target_layer_ids the reference's
// default applies: num_hidden_layers ids spread evenly over target layers 1 .. L−3.
// Tensors: fc, hidden_norm, norm, layers.{i}.{input,post_attention}_layernorm,
// layers.{i}.self_attn.{q,k,v,o}_proj / {q,k}_norm, layers.{i}.mlp.{gate,up,down}_proj (an
// optional "model." prefix is accepted); an embed_tokens / lm_head in the file is ignored,
// the target's are used. GGUF drafters (general.architecture = dflash) are refused for now:
// their tensor naming is not established from public sources.

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "model/dflash.h"

namespace qwen36 {

// Throws a one-line Error naming the bad or missing key. The result is validated.
DFlashConfig parse_dflash_config(const nlohmann::json& j);
// `path`: the checkpoint directory (config.json + model.safetensors or shards), or a file in it.
DFlashWeights load_dflash_checkpoint(const std::string& path);

}  // namespace qwen36
