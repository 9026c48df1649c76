#pragma once
// defines: helpers shared by subcommands (loading a model onto a backend, reading id files)

#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/sampler.h"
#include "model/qwen36.h"

namespace qwen36::cli {

struct LoadedModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};

// backend: "cpu" or "cuda" (an Error when this build has no CUDA backend).
LoadedModel load_model(const std::string& path, const std::string& backend, int threads = 0);

// The built-in default model. Until a trained small model ships, this is a small RANDOM
// checkpoint (tiny-dense preset, generated in memory, fixed seed); it says so when loaded.
LoadedModel load_default_model(const std::string& backend, int threads = 0);

std::vector<int32_t> read_i32_file(const std::string& path);

// Where the tokenizer for a model lives: `explicit_path` if given, else $QWEN36_TOKENIZER,
// else the model directory when it holds a tokenizer.json, else (for the built-in default
// model, model_path empty) the Qwen3 tokenizer fetched by scripts/fetch-tokenizer.sh.
// Returns "" when none is found.
std::string resolve_tokenizer(const std::string& explicit_path, const std::string& model_path);

// --temp, --top-k, ... for subcommands that sample.
void add_sampling_options(CLI::App* cmd, SamplingParams& s);

}  // namespace qwen36::cli
