#pragma once
// defines: helpers shared by subcommands (loading a model onto a backend, reading id files)

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/qwen36.h"

namespace qwen36::cli {

struct LoadedModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};

// backend: "cpu" or "cuda" (an Error when this build has no CUDA backend).
LoadedModel load_model(const std::string& path, const std::string& backend, int threads = 0);

std::vector<int32_t> read_i32_file(const std::string& path);

}  // namespace qwen36::cli
