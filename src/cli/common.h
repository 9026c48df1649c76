#pragma once
// defines: helpers shared by subcommands (loading a model onto a backend, reading id files)

#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/sampler.h"
#include "engine/spec/spec_generate.h"
#include "model/memory_plan.h"
#include "model/qwen36.h"
#include "text/chat_template.h"

namespace qwen36 {
struct SchedulerOptions;
namespace text {
class Tokenizer;
}
}  // namespace qwen36

namespace qwen36::cli {

struct LoadedModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};

// Expert offload (model/expert_placement.h): --n-cpu-moe/-ncmoe, --cpu-moe/-cmoe,
// --override-tensor/-ot, --gpu-mem, --fit.
struct OffloadOptions {
  PlacementOptions placement;
  std::string gpu_mem;  // "" or a size: the device budget (emulates a smaller card)
  bool fit = false;     // choose the smallest --n-cpu-moe that fits
  // What the command will ask of the memory plan, so that --fit leaves room for it.
  MemoryRequest plan;
};
void add_offload_options(CLI::App* cmd, OffloadOptions& o);

// The Model over `w` on `backend` with the routed-expert placement `o` asks for. With a
// device budget (--gpu-mem, or the backend's free memory), the weights left on the device
// plus o.plan must fit: --fit chooses the smallest --n-cpu-moe that does (and says which);
// without --fit a model that does not fit is refused, naming that N. --gpu-mem also caps
// what check_memory_plan allows the caches (set_device_budget). host_threads: the CPU
// backend that runs host-placed experts (0: all cores).
std::unique_ptr<Model> make_model(ModelWeights w, Backend& backend, const OffloadOptions& o, int host_threads = 0);

// --lora PATH (repeatable) and --lora-scaled PATH SCALE: PEFT LoRA adapters merged into the
// weights at load (format/lora.h), as llama.cpp's flags name them.
struct LoraOptions {
  std::vector<std::string> paths;
  std::vector<std::string> scaled;  // PATH, SCALE, PATH, SCALE, ...
  bool empty() const { return paths.empty() && scaled.empty(); }
};
void add_lora_options(CLI::App* cmd, LoraOptions& o);
// Loads and merges every adapter `o` names, in order.
void merge_lora_options(ModelWeights& w, const LoraOptions& o);

// What names the weights a model path (and its adapters) loads, for files of saved states: the
// checkpoint's files with their sizes and modification times ("" for the built-in model).
std::string model_identity(const std::string& path, const LoraOptions& lora = {});

// backend: "cpu" or "cuda" (an Error when this build has no CUDA backend).
LoadedModel load_model(const std::string& path, const std::string& backend, int threads = 0,
                       const OffloadOptions& offload = {}, const LoraOptions& lora = {});

// The built-in default model: models/qwen36-small-code-q8_0.gguf of this checkout (trained by
// tools/train, see models/README.md; $QWEN36_DEFAULT_MODEL overrides), or, where that file
// is absent, a small RANDOM model generated in memory (it says so when loaded).
std::string default_model_path();  // "" when there is none
LoadedModel load_default_model(const std::string& backend, int threads = 0, const OffloadOptions& offload = {},
                               const LoraOptions& lora = {});

std::vector<int32_t> read_i32_file(const std::string& path);

// Where the tokenizer for a model lives: `explicit_path` if given, else $QWEN36_TOKENIZER,
// else the model itself (a GGUF, or a directory holding tokenizer.json); for the built-in
// default model (model_path empty) the shipped GGUF, else the Qwen3 tokenizer fetched by
// scripts/fetch-tokenizer.sh.
// Returns "" when none is found.
std::string resolve_tokenizer(const std::string& explicit_path, const std::string& model_path);

// The model's chat template: `template_file` (--chat-template-file, a Jinja file) when given,
// else the one the tokenizer's path carries (ChatTemplate::find: a GGUF's own, a checkpoint's
// tokenizer_config.json or chat_template.jinja); null when there is none.
std::unique_ptr<ChatTemplate> load_chat_template(const std::string& tok_path, const std::string& template_file);

// A token's bytes for the scheduler's streamed text (SchedulerOptions::token_text): padded
// embedding rows past the tokenizer's vocabulary, and holes, have none. `tok` must outlive it.
std::function<std::string(int32_t)> token_text_of(const text::Tokenizer& tok);
// What ends a chat answer: the checkpoint's eos ids and Qwen's <|im_end|> / <|endoftext|> (an
// eos list, or a GGUF's single eos id, may name only one of them).
std::vector<int32_t> chat_stop_ids(const ModelConfig& c, const text::Tokenizer& tok);

// What a scheduler with these options asks of memory (check_memory_plan): its slots and context,
// its step budget, its output rows — one a slot, or with speculation every drafted row — plus
// `extra_rows` (the server's prompt_logprobs rows).
MemoryRequest scheduler_memory(const SchedulerOptions& so, int64_t extra_rows = 0);

// --cache-type-k/-ctk and --cache-type-v/-ctv: the attention KV cache element type;
// --state-type: the DeltaNet recurrent state's.
struct CacheTypes {
  std::string k = "auto", v = "auto";
  std::string state = "f32";
};
void add_cache_type_options(CLI::App* cmd, CacheTypes& t);
// "auto" is bf16 on a GPU backend (half the memory and read traffic) and f32 on the CPU (the
// exact reference). An Error names a type that is not supported.
DType resolve_cache_type(const CacheTypes& t, const Backend& backend);
// f32 or bf16 on every backend (no "auto": f32 is exact, bf16 rounds the state each step). An
// Error names a type that is not supported.
DType resolve_state_type(const CacheTypes& t);

// --temp, --top-k, ... for subcommands that sample.
void add_sampling_options(CLI::App* cmd, SamplingParams& s);

// Speculative decoding's flags, as `run` and `serve` take them (each with its own help texts).
struct SpecCliOptions {
  std::string method = "none";  // --spec: mtp, ngram, dflash or none
  int32_t draft_n = 3;          // --spec-draft-n
  std::string draft_model;      // dflash: the drafter checkpoint
  int32_t block_size = 0;       // dflash: 0 = the drafter's
  int32_t tree_budget = 0;      // dflash: DDTree drafts per round (0: the chain)
  bool dflash_sliding_causal = false;
  bool adaptive = false;
  std::string speculative_config;  // vLLM-style JSON; replaces --spec / --spec-draft-n
};
// The options the flags ask for: --speculative-config wins over --spec / --spec-draft-n (the
// parsers exclude mixing them); a bad method or JSON throws Error.
SpecOptions spec_cli_options(const SpecCliOptions& o);

// A comma-separated list of integers (bench's -p / -n / -b, --streams, --tokens):
// each item one whole number, blanks around it allowed; an empty or blank s is the empty list. An
// Error names flag and the first item that is not an integer (an empty one included).
std::vector<int64_t> parse_int_list(const std::string& s, const char* flag);

// Simulated acceptance (bench, bench-serve): --simulate-acceptance p1,p2,... as probabilities
// in [0, 1] (an Error names a bad item), and the one per-position probability p whose rounds of
// k drafts have the mean accepted length 1 + p + … + p^k = len (--simulate-accept-length; an
// Error where len is outside 1 .. k + 1).
std::vector<double> parse_accept_probs(const std::string& s);
double accept_prob_for_length(double len, int64_t k);

// The engine step of serve and bench-serve: -b/--batch-size (tokens a step, decode +
// prefill) and --prefill-chunk (prompt tokens a sequence a step), 0 = the backend's default.
// The CPU reads a few hundred tokens a second, so short steps keep every stream's tokens
// coming. On CUDA a step of 4,096 reads prompts at several times the rate of one of 512: 64
// streams of 512-token prompts on 35B-A3B Q4_K_M give 1,991 output t/s against 1,332 (TTFT p50
// 0.75 s against 2.0), 16 on the 27B 805 against 561, for an inter-token p99 of ~150 ms behind a
// step of prompts (8,192 adds ~1% more and doubles that p99; H100, bench/RESULTS.md session 49).
struct ServeStep {
  int64_t prefill_chunk = 0, batch_tokens = 0;
};
// `o` with its zeros replaced by `backend`'s defaults; an Error names a flag out of 1..2^20.
ServeStep resolve_serve_step(ServeStep o, const std::string& backend);
// The flags (help texts name both backends' defaults); `serve` adds its QWEN36_* names.
void add_serve_step_options(CLI::App* cmd, ServeStep& o);

}  // namespace qwen36::cli
