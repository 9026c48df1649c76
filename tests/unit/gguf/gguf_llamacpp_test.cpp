// GGUF files written by llama.cpp's converter and llama-quantize (tests/data/llamacpp-gguf)
// load with the expected metadata, tensor names, types and shapes.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "format/gguf.h"
#include "gguf_test_util.h"

namespace qwen36 {
namespace {

const std::string kDir = std::string(QWEN36_TEST_DATA) + "/llamacpp-gguf/";

nlohmann::json load_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  return nlohmann::json::parse(in);
}

std::string upper(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = char(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

struct Case {
  std::string name;  // dense-a / moe-a
  std::string type;  // bf16 / q8_0 / q6_k / q4_k_m
};

class LlamaCppFixture : public ::testing::TestWithParam<Case> {};

TEST_P(LlamaCppFixture, LoadsWithTheTypesLlamaCppReports) {
  const Case c = GetParam();
  const GgufFile f(kDir + c.name + "/model-" + c.type + ".gguf");
  const auto meta = load_json(kDir + c.name + "/llamacpp.json");
  const auto config = load_json(kDir + c.name + "/config.json");
  const bool moe = c.name == "moe-a";
  const std::string arch = moe ? "qwen35moe" : "qwen35";

  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.get_str("general.architecture"), arch);
  EXPECT_EQ(f.get_u32(arch + ".block_count"), config["num_hidden_layers"].get<uint32_t>());
  EXPECT_EQ(f.get_u32(arch + ".embedding_length"), config["hidden_size"].get<uint32_t>());
  EXPECT_EQ(f.get_u32(arch + ".attention.head_count"), config["num_attention_heads"].get<uint32_t>());
  EXPECT_EQ(f.get_u32(arch + ".attention.head_count_kv"), config["num_key_value_heads"].get<uint32_t>());
  EXPECT_EQ(f.get_u32(arch + ".ssm.group_count"), config["linear_num_key_heads"].get<uint32_t>());
  EXPECT_EQ(f.get_u32(arch + ".ssm.time_step_rank"), config["linear_num_value_heads"].get<uint32_t>());
  EXPECT_FLOAT_EQ(f.get_f32(arch + ".rope.freq_base"), 1e7f);
  EXPECT_FLOAT_EQ(f.get_f32(arch + ".attention.layer_norm_rms_epsilon"), 1e-6f);
  EXPECT_EQ(f.get_arr_i32(arch + ".rope.dimension_sections"), (std::vector<int32_t>{11, 11, 10, 0}));
  if (moe) {
    EXPECT_EQ(f.get_u32(arch + ".expert_count"), 4u);
    EXPECT_EQ(f.get_u32(arch + ".expert_used_count"), 2u);
  }
  EXPECT_EQ(f.get_str("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_str("tokenizer.ggml.pre"), "qwen35");
  const auto& tokens = f.get_arr_str("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 128u);
  EXPECT_EQ(tokens[127], "<|endoftext|>");
  EXPECT_EQ(f.get_arr_str("tokenizer.ggml.merges").size(), 2u);
  EXPECT_EQ(f.get_arr_i32("tokenizer.ggml.token_type").size(), 128u);
  EXPECT_EQ(f.get_u32("tokenizer.ggml.eos_token_id"), 127u);
  EXPECT_FALSE(f.get_bool("tokenizer.ggml.add_bos_token"));

  // Every tensor llama.cpp lists, with its type; nothing else.
  const auto& types = meta["tensor_types"][c.type];
  ASSERT_EQ(f.tensors().size(), types.size());
  for (const auto& [name, type] : types.items()) {
    SCOPED_TRACE(name);
    const GgufTensorInfo& ti = f.tensor_info(name);
    EXPECT_EQ(upper(ggml_type_name(ti.ggml_type)), type.get<std::string>());
  }
  // Shapes in torch order; ne keeps the file's innermost-first order.
  const int64_t h = config["hidden_size"].get<int64_t>();
  const auto& emb = f.tensor_info("token_embd.weight");
  EXPECT_EQ(emb.tensor.dim(0), 128);
  EXPECT_EQ(emb.tensor.dim(1), h);
  EXPECT_EQ(emb.ne[0], h);
  EXPECT_EQ(emb.ne[1], 128);
  const auto& qkv = f.tensor_info("blk.0.attn_qkv.weight");  // ne {256, 512} per the README
  EXPECT_EQ(qkv.ne[0], 256);
  EXPECT_EQ(qkv.ne[1], 512);
  EXPECT_EQ(qkv.tensor.shape_str().substr(0, 10), "[512, 256]");
  if (moe) {
    const auto& exps = f.tensor_info("blk.0.ffn_gate_exps.weight");  // ne {256, 256, 4}
    EXPECT_EQ(exps.tensor.ndim, 3);
    EXPECT_EQ(exps.tensor.dim(0), 4);
  }
  // The norm weights hold weight + 1 (README): close to 1 on average, so a wrong data offset shows.
  const auto& norm = f.tensor_info("output_norm.weight");
  ASSERT_EQ(norm.tensor.dtype, DType::F32);
  double mean = 0;
  for (int64_t i = 0; i < h; ++i) mean += norm.tensor.as<float>()[i];
  EXPECT_NEAR(mean / double(h), 1.0, 0.1);
  EXPECT_GT(test::exercise_gguf(f), 0u);

  // The declared size in llamacpp.json matches the file.
  if (meta["quantize"].contains(c.type)) {
    EXPECT_EQ(f.file_size(), meta["quantize"][c.type]["size_bytes"].get<size_t>());
  }
}

INSTANTIATE_TEST_SUITE_P(All, LlamaCppFixture,
                         ::testing::Values(Case{"dense-a", "bf16"}, Case{"dense-a", "q8_0"}, Case{"dense-a", "q6_k"},
                                           Case{"dense-a", "q4_k_m"}, Case{"moe-a", "bf16"}, Case{"moe-a", "q8_0"},
                                           Case{"moe-a", "q6_k"}, Case{"moe-a", "q4_k_m"}),
                         [](const auto& param_info) {
                           std::string n = param_info.param.name + "_" + param_info.param.type;
                           for (auto& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace qwen36
