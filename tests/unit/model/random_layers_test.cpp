// model/random_layers.h names each matrix it asks a builder for; the device builder
// (backend/cuda/cuda_random.cu) types a synthetic quantized model by those names, looked up in
// the GGUF plan of the same preset (random_model_plan). A name or shape the plan lacks would
// fail only there, on a GPU; here every one is checked against the plan on the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <string>
#include <vector>

#include "model/presets.h"
#include "model/random_layers.h"
#include "model/random_quant_weights.h"

namespace qwen36 {
namespace {

// A builder that makes no data, recording each matrix's name (as the device builder resolves it:
// global first, then within the current layer) and shape.
struct RecordingBuilder {
  const std::map<std::string, std::vector<int64_t>>& plan;
  std::string prefix;
  std::vector<std::string> missing, wrong_shape;
  int matrices = 0;

  Tensor matrix(const std::string& name, std::initializer_list<int64_t> shape, float) {
    ++matrices;
    auto it = plan.find(name);
    if (it == plan.end()) it = plan.find(prefix + name);
    if (it == plan.end()) {
      missing.push_back(prefix + name);
    } else {
      // Routed experts are one stacked [E, rows, cols] tensor in GGUF; the builder asks for
      // each expert's [rows, cols].
      std::vector<int64_t> want(shape);
      const std::vector<int64_t>& got = it->second;
      const std::vector<int64_t> tail(got.end() - std::min(got.size(), want.size()), got.end());
      if (tail != want || (got.size() != want.size() && name.find("_exps") == std::string::npos))
        wrong_shape.push_back(it->first);
    }
    return Tensor(nullptr, DType::F32, shape);
  }
  Tensor f32(std::initializer_list<int64_t> shape, float, float) { return Tensor(nullptr, DType::F32, shape); }
  void set_layer(int64_t i) { prefix = "blk." + std::to_string(i) + "."; }
};

class RandomLayers : public ::testing::TestWithParam<const char*> {};

TEST_P(RandomLayers, EveryMatrixIsInTheGgufPlanWithItsShape) {
  const ModelConfig c = model_preset(GetParam(), /*layers=*/8);
  const ModelPlan plan = random_model_plan(c, 1, "qwen36-random");
  std::map<std::string, std::vector<int64_t>> by_name;
  for (const TensorSource& t : plan.tensors) by_name[t.name] = t.shape;
  RecordingBuilder b{by_name, "", {}, {}, 0};
  ModelWeights w;
  random_model::tensors(b, w, c, 1.0f, /*with_mtp=*/true, /*gguf=*/true);
  EXPECT_TRUE(b.missing.empty()) << b.missing.size() << " not in the plan, the first " << b.missing.front();
  EXPECT_TRUE(b.wrong_shape.empty()) << b.wrong_shape.size() << " of another shape, the first " << b.wrong_shape.front();
  // Per layer at least the projections and the MLP (or router and experts), and the MTP head.
  EXPECT_GT(b.matrices, 8 * 6);
  ASSERT_EQ(w.layers.size(), size_t(c.n_layers));
  EXPECT_EQ(w.mtp.has_value(), c.mtp_layers > 0);
}

INSTANTIATE_TEST_SUITE_P(Presets, RandomLayers, ::testing::Values("qwen3.6-27b", "qwen3.6-35b-a3b"),
                         [](const auto& param_info) {
                           std::string s = param_info.param;
                           for (char& ch : s)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

}  // namespace
}  // namespace qwen36
