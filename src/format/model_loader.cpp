#include "format/model_loader.h"

#include <filesystem>

#include "core/error.h"
#include "format/gguf_model.h"
#include "format/hf_loader.h"

namespace qwen36 {

ModelWeights load_model_weights(const std::string& path) {
  namespace fs = std::filesystem;
  QWEN36_CHECK(fs::exists(path), "model path {} does not exist", path);
  if (fs::is_directory(path)) return load_hf_checkpoint(path);
  if (path.ends_with(".gguf")) return load_gguf_model(path);
  fail("{}: not a model (expected a Hugging Face checkpoint directory or a .gguf file)", path);
}

}  // namespace qwen36
