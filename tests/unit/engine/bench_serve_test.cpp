// `qwen36 bench-serve` through the built binary (skipped when it is not built), on the tiny
// synthetic model with the CPU backend: exact token totals (streams x gen per round, every
// request runs to --gen-tokens), ordered percentiles, the documented JSON keys, the markdown
// table (also with prompts prefilled over several steps), a bf16 DeltaNet state (--state-type),
// speculative streams with real and SIMULATED acceptance, and one-line errors with a non-zero
// exit for bad arguments.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/cli_error.h"
#include "common/run_command.h"

namespace qwen36 {
namespace {

const std::string kBase = std::string(QWEN36_BIN) + " bench-serve --synthetic tiny-dense --type f32 -t 1";

// Runs the binary; stdout returned, stderr into *err.
std::string run(const std::string& args, int* status, std::string* err) {
  return test::run_command(kBase + " " + args, status, err);
}

TEST(BenchServeCli, JsonTotalsAndPercentiles) {
  if (!std::filesystem::exists(QWEN36_BIN)) GTEST_SKIP() << "qwen36 binary not built";
  const int64_t gen = 6, prompt = 12, rounds = 3;
  int status = -1;
  std::string err;
  const std::string out = run("--streams 1,3 --prompt-tokens 12 --gen-tokens 6 --rounds 3 -o json", &status, &err);
  ASSERT_EQ(status, 0) << out << err;
  const auto rows = nlohmann::json::parse(out);
  ASSERT_EQ(rows.size(), 2u) << out;
  const int64_t want_streams[] = {1, 3};
  for (size_t i = 0; i < 2; ++i) {
    const auto& r = rows[i];
    for (const char* key : {"model", "backend", "device", "streams", "prompt_tokens", "gen_tokens", "context",
                            "kv_type", "state_type", "prefill_chunk", "batch_tokens", "rounds_counted", "requests",
                            "output_tokens", "wall_s", "output_tok_s", "prompt_tok_s", "decode_tok_s", "ttft_p50_ms",
                            "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "peak_batch", "steps", "per_round"})
      ASSERT_TRUE(r.contains(key)) << key << " missing in " << r.dump();
    const int64_t S = r["streams"].get<int64_t>();
    EXPECT_EQ(S, want_streams[i]);
    EXPECT_EQ(r["prompt_tokens"].get<int64_t>(), prompt);
    EXPECT_EQ(r["gen_tokens"].get<int64_t>(), gen);
    EXPECT_GE(r["context"].get<int64_t>(), prompt + gen);
    EXPECT_EQ(r["state_type"].get<std::string>(), "f32");  // the default --state-type
    EXPECT_EQ(r["prefill_chunk"].get<int64_t>(), 256);  // the CPU's default step (0 = the backend's)
    EXPECT_EQ(r["batch_tokens"].get<int64_t>(), 512);
    EXPECT_EQ(r["rounds_counted"].get<int64_t>(), rounds - 1);  // the first is a warm-up
    EXPECT_EQ(r["requests"].get<int64_t>(), S * (rounds - 1));
    EXPECT_EQ(r["output_tokens"].get<int64_t>(), S * gen * (rounds - 1));
    ASSERT_EQ(r["per_round"].size(), size_t(rounds));
    for (size_t k = 0; k < size_t(rounds); ++k) {
      EXPECT_EQ(r["per_round"][k]["output_tokens"].get<int64_t>(), S * gen) << "round " << k;
      EXPECT_EQ(r["per_round"][k]["warmup"].get<bool>(), k == 0);
    }
    EXPECT_LE(r["ttft_p50_ms"].get<double>(), r["ttft_p99_ms"].get<double>());
    EXPECT_LE(r["itl_p50_ms"].get<double>(), r["itl_p99_ms"].get<double>());
    EXPECT_GT(r["ttft_p50_ms"].get<double>(), 0);
    EXPECT_GT(r["output_tok_s"].get<double>(), 0);
    EXPECT_GT(r["prompt_tok_s"].get<double>(), 0);
    EXPECT_GT(r["decode_tok_s"].get<double>(), 0);
    // Every prompt fits the first step's budget, so all streams decode together.
    EXPECT_EQ(r["peak_batch"].get<int64_t>(), S);
    EXPECT_GE(r["steps"].get<int64_t>(), gen * (rounds - 1));
  }
  EXPECT_NE(err.find("round 1/3 (warm-up)"), std::string::npos) << err;  // progress on stderr
}

TEST(BenchServeCli, MarkdownWithStaggeredPrefill) {
  if (!std::filesystem::exists(QWEN36_BIN)) GTEST_SKIP() << "qwen36 binary not built";
  int status = -1;
  std::string err;
  // A 4-token chunk and a 6-token step budget: the three prompts are read over many steps,
  // interleaved with the decode of the streams that already started.
  const std::string out =
      run("--streams 3 --prompt-tokens 12 --gen-tokens 5 --rounds 1 --prefill-chunk 4 -b 6 -c 40", &status, &err);
  ASSERT_EQ(status, 0) << out << err;
  EXPECT_NE(out.find("device: CPU"), std::string::npos) << out;
  EXPECT_NE(out.find("context 40"), std::string::npos) << out;
  EXPECT_NE(out.find("| model | backend | streams | requests | output tokens |"), std::string::npos) << out;
  EXPECT_NE(out.find("| tiny-dense f32 (synthetic, random) | cpu | 3 | 3 | 15 |"), std::string::npos) << out;
}

// -tp 2 (two CPU ranks as threads): every stream's tokens come out, the model is named as
// tensor parallel.
TEST(BenchServeCli, TensorParallelTwoRanks) {
  if (!std::filesystem::exists(QWEN36_BIN)) GTEST_SKIP() << "qwen36 binary not built";
  int status = -1;
  std::string err;
  const std::string out = run("--streams 1,3 --prompt-tokens 8 --gen-tokens 4 --rounds 2 -tp 2 -o json", &status, &err);
  ASSERT_EQ(status, 0) << out << err;
  const auto rows = nlohmann::json::parse(out);
  ASSERT_EQ(rows.size(), 2u) << out;
  for (const auto& r : rows) {
    EXPECT_NE(r["model"].get<std::string>().find("[tensor parallel 2]"), std::string::npos) << r.dump();
    EXPECT_EQ(r["output_tokens"].get<int64_t>(), r["streams"].get<int64_t>() * 4);
  }
}

// --state-type bf16: the engine's DeltaNet state is bf16, and every stream still runs to the end.
TEST(BenchServeCli, Bf16State) {
  if (!std::filesystem::exists(QWEN36_BIN)) GTEST_SKIP() << "qwen36 binary not built";
  int status = -1;
  std::string err;
  const std::string out =
      run("--streams 2 --prompt-tokens 8 --gen-tokens 4 --rounds 1 --state-type bf16 -o json", &status, &err);
  ASSERT_EQ(status, 0) << out << err;
  const auto rows = nlohmann::json::parse(out);
  ASSERT_EQ(rows.size(), 1u) << out;
  EXPECT_EQ(rows[0]["state_type"].get<std::string>(), "bf16");
  EXPECT_EQ(rows[0]["kv_type"].get<std::string>(), "f32");  // --cache-type-k/-v are apart from it
  EXPECT_EQ(rows[0]["output_tokens"].get<int64_t>(), 2 * 4);
}

// --spec mtp (the tiny model's random MTP head): every stream still gets exactly --gen-tokens.
// With --simulate-acceptance 1 every draft is accepted, so a stream alone takes fewer steps than
// tokens and a verify pass commits more than one token; with 0 every draft is refused: exactly
// one token a pass. Each row names the method, says SIMULATED, and so does the markdown table.
TEST(BenchServeCli, SpeculativeStreamsSimulatedAndReal) {
  if (!std::filesystem::exists(QWEN36_BIN)) GTEST_SKIP() << "qwen36 binary not built";
  const int64_t gen = 12;
  const std::string common = "--streams 1,3 --prompt-tokens 8 --gen-tokens 12 --rounds 1 --spec mtp --spec-draft-n 3 -o json";
  for (const char* p : {"1", "0"}) {
    int status = -1;
    std::string err;
    const std::string out = run(common + " --simulate-acceptance " + p, &status, &err);
    ASSERT_EQ(status, 0) << out << err;
    const auto rows = nlohmann::json::parse(out);
    ASSERT_EQ(rows.size(), 2u) << out;
    for (const auto& r : rows) {
      const int64_t S = r["streams"].get<int64_t>();
      EXPECT_EQ(r["output_tokens"].get<int64_t>(), S * gen) << r.dump();
      EXPECT_TRUE(r["simulated"].get<bool>());
      EXPECT_EQ(r["spec"].get<std::string>(), std::string("mtp k=3 SIMULATED acceptance ") + p);
      EXPECT_GT(r["spec_rounds"].get<int64_t>(), 0) << r.dump();
      const double len = r["mean_accepted_length"].get<double>();
      if (std::string(p) == "0") {
        EXPECT_EQ(len, 1.0) << r.dump();
        EXPECT_EQ(r["acceptance_rate"].get<double>(), 0.0);
      } else {
        EXPECT_GT(len, 2.0) << r.dump();  // 4 a pass but where a stream's last tokens leave no room
        EXPECT_EQ(r["acceptance_rate"].get<double>(), 1.0);
        if (S == 1) {
          EXPECT_LT(r["steps"].get<int64_t>(), gen) << r.dump();
        }
      }
    }
  }
  // Real verification on the same weights: no SIMULATED label, the tokens all there.
  int status = -1;
  std::string err;
  std::string out = run(common, &status, &err);
  ASSERT_EQ(status, 0) << out << err;
  for (const auto& r : nlohmann::json::parse(out)) {
    EXPECT_FALSE(r["simulated"].get<bool>());
    EXPECT_EQ(r["spec"].get<std::string>(), "mtp k=3");
    EXPECT_EQ(r["output_tokens"].get<int64_t>(), r["streams"].get<int64_t>() * gen);
  }
  out = run("--streams 2 --prompt-tokens 8 --gen-tokens 6 --rounds 1 --spec mtp --simulate-acceptance 0.9,0.5",
            &status, &err);
  ASSERT_EQ(status, 0) << out << err;
  EXPECT_NE(out.find("the accept decisions are SIMULATED"), std::string::npos) << out;
  EXPECT_NE(out.find("| spec | accept len |"), std::string::npos) << out;
  EXPECT_NE(out.find("| mtp k=3 SIMULATED acceptance 0.9,0.5 |"), std::string::npos) << out;
}

TEST(BenchServeCli, BadArgumentsAreOneLineErrors) {
  if (!std::filesystem::exists(QWEN36_BIN)) GTEST_SKIP() << "qwen36 binary not built";
  const std::pair<const char*, const char*> cases[] = {
      {"--streams 0", "--streams"},
      {"--streams 2,x", "--streams"},
      {"--gen-tokens -3", "--gen-tokens"},
      {"--prompt-tokens 0", "--prompt-tokens"},
      {"--prompt-tokens 30 --gen-tokens 20 -c 40", "do not fit -c/--ctx-size 40"},
      {"--rounds 0", "--rounds"},
      {"--prefill-chunk -4", "--prefill-chunk -4 must be in 1..1048576 (0: default)"},
      {"-b 2000000", "-b/--batch-size 2000000 must be in 1..1048576 (0: default)"},
      {"--state-type f16", "--state-type f16: unknown DeltaNet state type (supported: f32, bf16)"},
      {"--simulate-acceptance 0.9", "--simulate-acceptance / --simulate-accept-length need --spec"},
      {"--spec mtp --simulate-acceptance 0.9,x", "--simulate-acceptance: \"x\" is not a number"},
      {"--spec mtp --simulate-acceptance 0.9,1.5", "--simulate-acceptance: 1.5 is not a probability in [0, 1]"},
      {"--streams 4,,8", "--streams: \"\" is not an integer"},
      {"--spec mtp --spec-draft-n 3 --simulate-accept-length 5", "--simulate-accept-length 5 is outside 1 .. k + 1 = 4"},
      {"--spec mtp --tree-budget 4", "apply to --spec dflash only"},
  };
  for (const auto& [args, what] : cases) EXPECT_EQ(test::cli_error_mismatch(kBase + " " + args, what), "") << args;
}

// serve takes the same step flags and checks them before anything loads (or binds).
TEST(BenchServeCli, ServeRefusesABadStepFirst) {
  if (!std::filesystem::exists(QWEN36_BIN)) GTEST_SKIP() << "qwen36 binary not built";
  int status = -1;
  const std::string out = test::run_command(std::string(QWEN36_BIN) + " serve --prefill-chunk -4 2>&1", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("--prefill-chunk -4 must be in 1..1048576 (0: default)"), std::string::npos) << out;
}

}  // namespace
}  // namespace qwen36
