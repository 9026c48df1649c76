// `qwen36 info` on a llama.cpp-made file: architecture, a summarised vocabulary array, tensor
// lines and totals. Skipped when the qwen36 binary has not been built.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "common/run_command.h"

namespace {


TEST(CmdInfo, PrintsMetadataTensorsAndTotals) {
  if (!std::filesystem::exists(QWEN36_BIN)) GTEST_SKIP() << "qwen36 binary not built";
  int status = -1;
  const std::string out =
      qwen36::test::run_command(std::string(QWEN36_BIN) + " info " + QWEN36_TEST_DATA + "/llamacpp-gguf/moe-a/model-q4_k_m.gguf", &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("architecture:  qwen35moe"), std::string::npos) << out;
  EXPECT_NE(out.find("qwen35moe.expert_count"), std::string::npos);
  EXPECT_NE(out.find("array[string][128]"), std::string::npos);
  EXPECT_NE(out.find("... 112 more"), std::string::npos);  // 16 of 128 tokens shown
  EXPECT_NE(out.find("blk.1.ffn_down_exps.weight"), std::string::npos);
  EXPECT_NE(out.find("[4, 256, 256]"), std::string::npos);  // torch order
  EXPECT_NE(out.find("{256, 256, 4}"), std::string::npos);  // GGUF order
  EXPECT_NE(out.find("all        37 tensors"), std::string::npos) << out;
}

TEST(CmdInfo, CorruptFileIsOneLineError) {
  if (!std::filesystem::exists(QWEN36_BIN)) GTEST_SKIP() << "qwen36 binary not built";
  int status = -1;
  const std::string out =
      qwen36::test::run_command(std::string(QWEN36_BIN) + " info " + QWEN36_TEST_DATA + "/llamacpp-gguf/dense-a/config.json 2>&1", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("error:"), std::string::npos) << out;
  EXPECT_NE(out.find("not a GGUF file"), std::string::npos) << out;
}

}  // namespace
