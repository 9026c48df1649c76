// `qwen36 bench --spec dflash` through the built binary (skipped when it is not built): a random
// drafter of the published layout for the tiny-dense target (8 layers: target layers 1..5)
// drafts real blocks, the target verifies and commits them, the accept decisions are
// simulated; every spec line says "simulated" and --simulate-accept-length L reports the
// per-position probability that gives mean accepted length L. Also the pure helper: the
// synthetic drafter config of the 27B target is the published one.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>

#include "common/run_command.h"
#include "model/dflash.h"
#include "model/presets.h"

namespace qwen36 {
namespace {

TEST(DFlashSynthetic, PublishedShapeFor27B) {
  const DFlashConfig c = synthetic_dflash_config(model_preset("qwen3.6-27b", 0));
  EXPECT_EQ(c.hidden_size, 5120);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 32);
  EXPECT_EQ(c.n_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.intermediate_size, 17408);
  EXPECT_EQ(c.target_layer_ids, (std::vector<int32_t>{1, 16, 31, 46, 61}));
  EXPECT_EQ(c.sliding, (std::vector<bool>{true, true, true, true, false}));
  EXPECT_EQ(c.sliding_window, 2048);
  EXPECT_EQ(c.block_size, 16);
  EXPECT_EQ(c.mask_token_id, 248070);
  const DFlashConfig m = synthetic_dflash_config(model_preset("qwen3.6-35b-a3b", 0));
  EXPECT_EQ(m.target_layer_ids, (std::vector<int32_t>{1, 10, 19, 28, 37}));
  EXPECT_EQ(m.n_layers, 8);
  const DFlashConfig t = synthetic_dflash_config(model_preset("tiny-dense", 0));
  EXPECT_EQ(t.target_layer_ids, (std::vector<int32_t>{1, 2, 3, 4, 5}));
  // Weights: the right shapes, reproducible for a seed.
  const DFlashWeights a = make_random_dflash_weights(t, DType::BF16, 5), b = make_random_dflash_weights(t, DType::BF16, 5);
  ASSERT_EQ(a.layers.size(), 5u);
  EXPECT_EQ(a.fc.dim(1), 5 * 256);
  EXPECT_EQ(a.layers[0].q_proj.dtype, DType::BF16);
  EXPECT_EQ(std::memcmp(a.layers[4].mlp.down_proj.data, b.layers[4].mlp.down_proj.data, a.layers[4].mlp.down_proj.nbytes()), 0);
}

TEST(DFlashBenchCli, SimulatedLinesAreLabelled) {
  if (!std::filesystem::exists(QWEN36_BIN)) GTEST_SKIP() << "qwen36 binary not built";
  int status = -1;
  const std::string base = std::string(QWEN36_BIN) +
                           " bench --synthetic tiny-dense --type q8_0 -t 1 -p '' -n 24 -r 1 --spec dflash --block-size 8"
                           " --spec-draft-n 3,7";
  const std::string out = test::run_command(base + " --simulate-accept-length 3 -o json 2>/dev/null", &status);
  ASSERT_EQ(status, 0) << out;
  const auto rows = nlohmann::json::parse(out);
  int spec_rows = 0;
  for (const auto& r : rows) {
    if (!r.contains("spec_k") || r["spec_k"].get<int64_t>() == 0) {
      EXPECT_FALSE(r["simulated"].get<bool>()) << r["test"];
      continue;
    }
    ++spec_rows;
    const std::string test = r["test"].get<std::string>();
    EXPECT_TRUE(r["simulated"].get<bool>());
    EXPECT_NE(test.find("simulated accept length 3 = acceptance"), std::string::npos) << test;
    EXPECT_NE(test.find("drafts: dflash random 5-layer drafter, block 8"), std::string::npos) << test;
    EXPECT_EQ(r["drafter"].get<std::string>(), "dflash");
    EXPECT_EQ(r["simulated_accept_length"].get<double>(), 3.0);
    // 1 + p + ... + p^k = 3 for the reported p.
    const double p = r["simulated_acceptance"][0].get<double>();
    double len = 1, pw = 1;
    for (int64_t i = 0; i < r["spec_k"].get<int64_t>(); ++i) len += (pw *= p);
    EXPECT_NEAR(len, 3.0, 1e-6);
    EXPECT_GE(r["mean_accepted_length"].get<double>(), 1.0);
    EXPECT_GT(r["speedup"].get<double>(), 0.0);
  }
  EXPECT_EQ(spec_rows, 2);
  // The markdown table says simulated; a p-vector works too (exactly 3 tokens a round at k = 3).
  const std::string md = test::run_command(base + " --simulate-acceptance 1,1,0 2>&1", &status);
  ASSERT_EQ(status, 0) << md;
  EXPECT_NE(md.find("| tg24 spec dflash k=3 (simulated acceptance 1,1,0; drafts: dflash random 5-layer drafter, block 8) | 1 | 3 |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("SIMULATED acceptance"), std::string::npos) << md;
  // A length a round cannot reach, and a k past the block, fail in one line before loading.
  std::string bad = test::run_command(base + " --simulate-accept-length 5 2>&1", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(bad.find("--simulate-accept-length 5 is outside 1 .. k + 1 = 4"), std::string::npos) << bad;
  bad = test::run_command(std::string(QWEN36_BIN) + " bench --synthetic tiny-dense --spec dflash --block-size 4 "
                          "--spec-draft-n 4 2>&1", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(bad.find("a DFlash block of 4 drafts at most 3"), std::string::npos) << bad;
}

// --tree-budget: DDTree rounds; simulated acceptance walks down most-probable children (the
// p-vector 1,1,0 accepts at most 2 drafts a round, fewer where the tree is shallower) and every
// line names the budget and says simulated. Without --spec dflash the flag is refused.
TEST(DFlashBenchCli, TreeLinesNameTheirBudget) {
  if (!std::filesystem::exists(QWEN36_BIN)) GTEST_SKIP() << "qwen36 binary not built";
  int status = -1;
  const std::string base = std::string(QWEN36_BIN) + " bench --synthetic tiny-dense --type q8_0 -t 1 -p '' -n 16 -r 1";
  const std::string out = test::run_command(
      base + " --spec dflash --block-size 8 --spec-draft-n 7 --tree-budget 6 --simulate-acceptance 1,1,0 -o json 2>/dev/null",
      &status);
  ASSERT_EQ(status, 0) << out;
  int tree_rows = 0;
  for (const auto& r : nlohmann::json::parse(out)) {
    if (!r.contains("spec_k") || r["spec_k"].get<int64_t>() == 0) continue;
    ++tree_rows;
    const std::string test = r["test"].get<std::string>();
    EXPECT_NE(test.find("block 8, tree budget 6"), std::string::npos) << test;
    EXPECT_TRUE(r["simulated"].get<bool>());
    EXPECT_GE(r["mean_accepted_length"].get<double>(), 1.0);
    EXPECT_LE(r["mean_accepted_length"].get<double>(), 3.0);
  }
  EXPECT_EQ(tree_rows, 1);
  const std::string bad = test::run_command(base + " --spec mtp --tree-budget 6 2>&1", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(bad.find("--tree-budget needs --spec dflash"), std::string::npos) << bad;
}

}  // namespace
}  // namespace qwen36
