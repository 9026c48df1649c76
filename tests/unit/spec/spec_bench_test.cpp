// `qwen36 bench --spec` and `--speculative-config`: simulated acceptance reproduces the requested
// conditional per-position rates (binomial bounds) through the real draft / verify / commit
// path; a rejection forced at every position still yields plain greedy output (so the commit
// of the one-token prefix is right); a real (non-simulated) spec bench run equals plain greedy
// at batch 1 and 3 with MTP, n-gram and the repeat stand-in; the JSON config parser accepts
// good and names the key of bad input; a CLI smoke test of bench / run / serve through the
// built binary, and run's speculative flags reaching the generator (greedy output unchanged by
// --spec / --speculative-config, k and adaptivity as asked) and serve's checks of them (skipped
// when the binary is not built).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "engine/spec/spec_bench.h"
#include "common/cli_error.h"
#include "common/run_command.h"
#include "spec_test_util.h"

namespace qwen36 {
namespace {

std::vector<std::vector<int32_t>> random_prompts(int n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> p;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> t(size_t(2 + 3 * i));
    for (auto& x : t) x = int32_t(rng() % uint32_t(vocab));
    p.push_back(t);
  }
  return p;
}

std::vector<int32_t> plain_greedy(Model& m, Backend& be, const std::vector<int32_t>& prompt, int32_t max_tokens) {
  ModelState st(be, m.config(), 1, 1024, false);
  GenerateOptions g;
  g.max_tokens = max_tokens;
  g.sampling = SamplingParams::greedy();
  return generate(m, st, prompt, g).tokens;
}

class SpecBench : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = make_cpu_backend(1);
    model_ = test::random_model(*backend_, 512, 41);
  }
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
};

TEST_F(SpecBench, SimulatedAcceptanceReproducesPerPositionRates) {
  const std::vector<double> p = {0.9, 0.6, 0.3};
  const auto prompts = random_prompts(4, 512, 3);
  ModelState st(*backend_, model_->config(), 4, 1024, true);
  SpecOptions so;
  so.draft_n = 3;
  SimulatedAcceptance sim(p);
  so.accept_override = sim.callback();
  auto drafter = make_drafter(SpecMethod::Mtp, *model_, st, so.ngram);
  const SpecBenchRun run = spec_bench_run(*model_, st, prompts, 500, so, drafter.get());
  for (const SpecResult& r : run.results) EXPECT_EQ(r.gen.tokens.size(), 500u);
  uint64_t hits = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    // Conditional rate at i: hits / trials, trials = rounds that reached position i. Fixed
    // seed, so deterministic; 4.5 binomial standard deviations keep a correct engine inside.
    ASSERT_GT(sim.trials[i], 100u) << "position " << i;
    const double rate = double(sim.hits[i]) / double(sim.trials[i]);
    const double sd = std::sqrt(p[i] * (1 - p[i]) / double(sim.trials[i]));
    EXPECT_NEAR(rate, p[i], 4.5 * sd) << "position " << i << ", " << sim.trials[i] << " trials";
    hits += sim.hits[i];
    std::printf("position %zu: requested %.2f, measured %.3f over %llu trials\n", i + 1, p[i], rate,
                (unsigned long long)sim.trials[i]);
  }
  // Every accepted draft went through the metrics (and so through the commit).
  EXPECT_EQ(run.metrics.accepted, hits);
  // Mean accepted length 1 + p1 + p1 p2 + p1 p2 p3 = 2.602 (rounds cut short at the end of a
  // sequence pull it down slightly).
  const double expect = 1 + 0.9 + 0.9 * 0.6 + 0.9 * 0.6 * 0.3;
  std::printf("mean accepted length %.3f (expected %.3f), %lld target passes\n", run.metrics.mean_accepted_length(),
              expect, (long long)run.target_passes);
  EXPECT_NEAR(run.metrics.mean_accepted_length(), expect, 0.15);
  EXPECT_GT(run.tok_s(), 0);
}

// Every draft refused: each round emits the target's own token at row 0 and commits one
// position, so the output must be plain greedy (drafts were run through the target and then
// rolled back).
TEST_F(SpecBench, SimulatedRejectionEverywhereKeepsGreedyOutput) {
  const auto prompts = random_prompts(3, 512, 4);
  ModelState st(*backend_, model_->config(), 3, 1024, true);
  SpecOptions so;
  so.draft_n = 4;
  SimulatedAcceptance sim({0.0});
  so.accept_override = sim.callback();
  RepeatDrafter drafter;
  const SpecBenchRun run = spec_bench_run(*model_, st, prompts, 40, so, &drafter);
  for (size_t b = 0; b < prompts.size(); ++b)
    EXPECT_EQ(run.results[b].gen.tokens, plain_greedy(*model_, *backend_, prompts[b], 40)) << "prompt " << b;
  EXPECT_EQ(run.metrics.accepted, 0u);
  EXPECT_GT(run.metrics.rounds, 0u);
}

TEST_F(SpecBench, RealSpecBenchRunEqualsPlainGreedy) {
  for (int B : {1, 3}) {
    const auto prompts = random_prompts(B, 512, 5 + uint32_t(B));
    std::vector<std::vector<int32_t>> refs;
    for (const auto& p : prompts) refs.push_back(plain_greedy(*model_, *backend_, p, 48));
    for (int which = 0; which < 3; ++which) {
      ModelState st(*backend_, model_->config(), B, 1024, true);
      SpecOptions so;
      so.draft_n = 3;
      std::unique_ptr<Drafter> d = which == 0   ? make_drafter(SpecMethod::Mtp, *model_, st, so.ngram)
                                   : which == 1 ? make_drafter(SpecMethod::Ngram, *model_, st, so.ngram)
                                                : std::make_unique<RepeatDrafter>();
      const SpecBenchRun run = spec_bench_run(*model_, st, prompts, 48, so, d.get());
      for (int b = 0; b < B; ++b)
        EXPECT_EQ(run.results[size_t(b)].gen.tokens, refs[size_t(b)]) << d->name() << ", batch " << B << ", seq " << b;
    }
  }
}

TEST(SpeculativeConfig, ParsesGoodInput) {
  SpecOptions o = parse_speculative_config(R"({"method":"mtp","num_speculative_tokens":5})");
  EXPECT_EQ(o.method, SpecMethod::Mtp);
  EXPECT_EQ(o.draft_n, 5);
  o = parse_speculative_config(R"({"method":"ngram","num_speculative_tokens":2,"prompt_lookup_max":6,"prompt_lookup_min":2})");
  EXPECT_EQ(o.method, SpecMethod::Ngram);
  EXPECT_EQ(o.draft_n, 2);
  EXPECT_EQ(o.ngram.max_n, 6);
  EXPECT_EQ(o.ngram.min_n, 2);
  o = parse_speculative_config(R"({"method":"none"})");
  EXPECT_EQ(o.method, SpecMethod::None);
  EXPECT_EQ(parse_speculative_config(R"({"method":"mtp"})").draft_n, 3);  // the default k
}

TEST(SpeculativeConfig, BadInputNamesTheKey) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"method":"mtp","model":"x"})", "\"model\""},
      {R"({"method":"eagle"})", "\"method\""},
      {R"({"method":3})", "\"method\""},
      {R"({"num_speculative_tokens":3})", "\"method\" is missing"},
      {R"({"method":"mtp","num_speculative_tokens":0})", "\"num_speculative_tokens\""},
      {R"({"method":"mtp","num_speculative_tokens":17})", "\"num_speculative_tokens\""},
      {R"({"method":"mtp","num_speculative_tokens":"3"})", "\"num_speculative_tokens\""},
      {R"({"method":"mtp","num_speculative_tokens":2.5})", "\"num_speculative_tokens\""},
      {R"({"method":"mtp","prompt_lookup_max":4})", "\"prompt_lookup_max\""},
      {R"({"method":"ngram","prompt_lookup_min":5,"prompt_lookup_max":3})", "\"prompt_lookup_min\""},
      {R"({"method":"ngram","prompt_lookup_max":0})", "\"prompt_lookup_max\""},
      {R"(["mtp"])", "JSON object"},
      {R"({"method":"mtp")", "not valid JSON"},
  };
  for (const auto& [json, want] : bad) {
    try {
      parse_speculative_config(json);
      ADD_FAILURE() << json << " was accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("--speculative-config"), std::string::npos) << msg;
      EXPECT_NE(msg.find(want), std::string::npos) << json << " -> " << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
}


TEST(SpecBenchCli, SimulatedLinesAreLabelled) {
  if (!std::filesystem::exists(QWEN36_BIN)) GTEST_SKIP() << "qwen36 binary not built";
  int status = -1;
  const std::string base = std::string(QWEN36_BIN) +
                           " bench --synthetic tiny-dense --type q8_0 -t 1 -p '' -n 24 -r 1 --spec mtp --spec-draft-n 1,3";
  const std::string out = test::run_command(base + " --simulate-acceptance 0.9,0.5 -o json 2>&1", &status);
  ASSERT_EQ(status, 0) << out;
  const auto rows = nlohmann::json::parse(out);
  int spec_rows = 0;
  for (const auto& r : rows) {
    if (!r.contains("spec_k") || r["spec_k"].get<int64_t>() == 0) {  // plain tg and the baseline: real
      EXPECT_FALSE(r["simulated"].get<bool>()) << r["test"];
      continue;
    }
    ++spec_rows;
    EXPECT_TRUE(r["simulated"].get<bool>());
    EXPECT_NE(r["test"].get<std::string>().find("(simulated acceptance 0.9,0.5; drafts: mtp head)"), std::string::npos)
        << r["test"];
    EXPECT_GE(r["mean_accepted_length"].get<double>(), 1.0);
    EXPECT_GT(r["speedup"].get<double>(), 0.0);
  }
  EXPECT_EQ(spec_rows, 2);
  const std::string md = test::run_command(base + " --simulate-acceptance 0.9,0.5 2>&1", &status);
  ASSERT_EQ(status, 0) << md;
  EXPECT_NE(md.find("| tg24 spec mtp k=3 (simulated acceptance 0.9,0.5; drafts: mtp head) |"), std::string::npos) << md;
  EXPECT_NE(md.find("mean accepted length"), std::string::npos) << md;
  // Real drafting on the same synthetic model (it has a random MTP head).
  const std::string real = test::run_command(base + " -o json 2>&1", &status);
  ASSERT_EQ(status, 0) << real;
  EXPECT_EQ(real.find("simulated acceptance"), std::string::npos);
}

// `-n 0` / `-p 0` run no such test, as llama-bench's; a negative length is a one-line error.
TEST(BenchCli, ZeroLengthRunsNoTest) {
  if (!std::filesystem::exists(QWEN36_BIN)) GTEST_SKIP() << "qwen36 binary not built";
  int status = -1;
  const std::string base = std::string(QWEN36_BIN) + " bench --synthetic tiny-dense --type q8_0 -t 1 -r 1 -o json";
  std::string out = test::run_command(base + " -p 16 -n 0 2>/dev/null", &status);
  ASSERT_EQ(status, 0) << out;
  auto rows = nlohmann::json::parse(out);
  ASSERT_EQ(rows.size(), 1u) << out;
  EXPECT_EQ(rows[0]["test"].get<std::string>(), "pp16");
  out = test::run_command(base + " -p 0 -n 8 2>/dev/null", &status);
  ASSERT_EQ(status, 0) << out;
  rows = nlohmann::json::parse(out);
  ASSERT_EQ(rows.size(), 1u) << out;
  EXPECT_EQ(rows[0]["test"].get<std::string>(), "tg8");
  out = test::run_command(base + " -p 16 -n -4 2>&1", &status);
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(out.find("-n takes lengths ≥ 0"), std::string::npos) << out;
}

// bench's and run's comma lists (cli/common.h, parse_int_list): an item that is not one whole
// integer, or a batch outside 1..4096, is a one-line error naming the flag, before anything loads.
TEST(BenchCli, BadListItemsAreOneLineErrors) {
  if (!std::filesystem::exists(QWEN36_BIN)) GTEST_SKIP() << "qwen36 binary not built";
  const std::pair<const char*, const char*> cases[] = {
      {" bench --synthetic tiny-dense -b 4x", "-b: \"4x\" is not an integer"},
      {" bench --synthetic tiny-dense -b 0", "-b 0 is outside 1..4096"},
      {" bench --synthetic tiny-dense -p 16,abc", "-p: \"abc\" is not an integer"},
      {" bench --synthetic tiny-dense --spec mtp --spec-draft-n 2,,3", "--spec-draft-n: \"\" is not an integer"},
      {" run --tokens 1,2.5", "--tokens: \"2.5\" is not an integer"},
  };
  for (const auto& [args, what] : cases)
    EXPECT_EQ(test::cli_error_mismatch(std::string(QWEN36_BIN) + args, what), "") << args;
  int status = -1;  // blanks around items are fine
  const std::string out = test::run_command(std::string(QWEN36_BIN) + " run --tokens ' 1, 2 ,3' -n 2 -t 1 2>&1", &status);
  EXPECT_EQ(status, 0) << out;
}

TEST(SpecBenchCli, ConfigErrorsAreOneLine) {
  if (!std::filesystem::exists(QWEN36_BIN)) GTEST_SKIP() << "qwen36 binary not built";
  int status = -1;
  std::string out = test::run_command(std::string(QWEN36_BIN) +
                                " run --tokens 1,2 --speculative-config '{\"method\":\"mtp\",\"draft_model\":1}' 2>&1",
                            &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("unknown key \"draft_model\""), std::string::npos) << out;
  // serve runs speculative decoding; a bad config still fails before anything loads.
  out = test::run_command(
      std::string(QWEN36_BIN) + " serve --speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":0}' 2>&1",
      &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("\"num_speculative_tokens\" must be an integer in 1..16"), std::string::npos) << out;
}

// run's speculative flags (cli/common.h, spec_cli_options) on the built-in model: greedy output
// is the plain run's token for token, and the acceptance line names the method, k and adaptivity
// each flag asked for; serve refuses DFlash's flags without DFlash before loading anything.
TEST(SpecBenchCli, RunFlagsReachTheGenerator) {
  if (!std::filesystem::exists(QWEN36_BIN)) GTEST_SKIP() << "qwen36 binary not built";
  const std::string run = std::string(QWEN36_BIN) + " run --tokens 1,2,3 -n 16 --temp 0 -t 1";
  int status = -1;
  const std::string plain = test::run_command(run + " 2>/dev/null", &status);
  ASSERT_EQ(status, 0) << plain;
  ASSERT_FALSE(plain.empty());
  struct Case {
    std::string flags, line;
  };
  const Case cases[] = {
      {"--spec mtp", "speculative mtp, k = 3:"},
      {"--spec ngram --spec-draft-n 2", "speculative ngram, k = 2:"},
      {"--speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":2}'", "speculative mtp, k = 2:"},
      {"--spec mtp --spec-adaptive", "speculative mtp, k = 3 (adaptive):"},
  };
  for (const Case& c : cases) {  // one run a case: tokens on stdout, the acceptance line on stderr
    std::string err;
    const std::string out = test::run_command(run + " " + c.flags, &status, &err);
    EXPECT_EQ(status, 0) << c.flags;
    EXPECT_EQ(out, plain) << c.flags;
    EXPECT_NE(err.find(c.line), std::string::npos) << c.flags << "\n" << err;
  }
  const std::string serve = test::run_command(std::string(QWEN36_BIN) + " serve --spec mtp --block-size 4 2>&1", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(serve.find("apply to --spec dflash only"), std::string::npos) << serve;
}

}  // namespace
}  // namespace qwen36
