#include "cli/common.h"

#include <spdlog/spdlog.h>

#include <fstream>

#include "core/error.h"
#include "format/model_loader.h"
#include "model/presets.h"
#include "model/random_weights.h"

namespace qwen36::cli {

namespace {
std::unique_ptr<Backend> make_backend(const std::string& backend, int threads) {
  QWEN36_CHECK(backend == "cpu", "backend \"{}\" is not available in this build (available: cpu)", backend);
  return make_cpu_backend(threads);
}
}  // namespace

LoadedModel load_default_model(const std::string& backend, int threads) {
  spdlog::warn("no -m given: using the built-in small RANDOM model (untrained weights, output is gibberish)");
  LoadedModel lm;
  lm.backend = make_backend(backend, threads);
  ModelWeights w = make_random_weights(model_preset("tiny-dense"), DType::BF16, /*seed=*/36);
  spdlog::info("model: {}", w.config.summary());
  lm.model = std::make_unique<Model>(std::move(w), *lm.backend);
  return lm;
}

LoadedModel load_model(const std::string& path, const std::string& backend, int threads) {
  LoadedModel lm;
  lm.backend = make_backend(backend, threads);
  ModelWeights w = load_model_weights(path);
  spdlog::info("model: {}", w.config.summary());
  lm.model = std::make_unique<Model>(std::move(w), *lm.backend);
  return lm;
}

std::vector<int32_t> read_i32_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  QWEN36_CHECK(in.good(), "cannot open {}", path);
  const auto size = in.tellg();
  QWEN36_CHECK(size % 4 == 0, "{}: size {} is not a whole number of int32 values", path, int64_t(size));
  std::vector<int32_t> v(size_t(size) / 4);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), size);
  QWEN36_CHECK(in.good(), "error reading {}", path);
  return v;
}

}  // namespace qwen36::cli
