// Lossless speculative decoding: greedy output with MTP drafts (k = 1..5), n-gram drafts and
// an oracle drafter equals plain generate() token for token, at batch 1 and at batch 8 with
// mixed prompts (some sequences not drafting), on the golden fixtures with real MTP weights
// (dense-mtp, moe-mtp) and on random tiny models with MTP. Acceptance figures are printed;
// every MTP head here is random, so they say nothing about real acceptance.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "engine/spec/mtp_drafter.h"
#include "engine/spec/spec_generate.h"
#include "format/model_loader.h"
#include "spec_test_util.h"

namespace qwen36 {
namespace {

namespace fs = std::filesystem;

struct Case {
  std::string name;
  std::function<std::unique_ptr<Model>(Backend&)> make;
};

std::vector<Case> cases() {
  std::vector<Case> c;
  for (const char* f : {"dense-mtp", "moe-mtp"})
    c.push_back({f, [f](Backend& b) {
                   return std::make_unique<Model>(load_model_weights((fs::path(QWEN36_TEST_DATA) / "golden" / f).string()), b);
                 }});
  c.push_back({"random-dense", [](Backend& b) { return test::random_model(b, 512, 31); }});
  c.push_back({"random-moe", [](Backend& b) { return test::random_model(b, 512, 32, true); }});
  return c;
}

// Prompts of several lengths; some repeat themselves, so n-gram lookup finds matches.
std::vector<std::vector<int32_t>> prompts(int64_t vocab) {
  std::vector<std::vector<int32_t>> p;
  std::mt19937 rng(5);
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> t;
    const int n = 3 + 5 * i;
    for (int j = 0; j < n; ++j) t.push_back(i % 2 && j >= 6 ? t[size_t(j - 6)] : int32_t(rng() % uint32_t(vocab)));
    p.push_back(t);
  }
  return p;
}

GenerateOptions greedy_opts(int32_t max_tokens) {
  GenerateOptions g;
  g.max_tokens = max_tokens;
  g.sampling = SamplingParams::greedy();
  return g;
}

class Lossless : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    backend_ = make_cpu_backend(1);
    model_ = GetParam().make(*backend_);
    ASSERT_TRUE(model_->has_mtp());
    for (const auto& p : prompts(model_->config().vocab_size)) {
      ModelState st(*backend_, model_->config(), 1, kCtx, false);
      refs_.push_back(generate(*model_, st, p, greedy_opts(kMax)).tokens);
    }
  }
  static constexpr int64_t kCtx = 128;
  static constexpr int32_t kMax = 40;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::vector<std::vector<int32_t>> refs_;  // greedy generate() output per prompt
};

TEST_P(Lossless, BatchOneMtpAndNgramEqualPlainGreedy) {
  const auto ps = prompts(model_->config().vocab_size);
  for (SpecMethod method : {SpecMethod::Mtp, SpecMethod::Ngram}) {
    for (int32_t k = 1; k <= 5; ++k) {
      SpecMetrics total;
      for (size_t i = 0; i < ps.size(); ++i) {
        ModelState st(*backend_, model_->config(), 2, kCtx, true);
        SpecOptions spec;
        spec.method = method;
        spec.draft_n = k;
        spec.adaptive = k == 5;  // the adaptive schedule must be just as lossless
        const SpecResult r = spec_generate(*model_, st, ps[i], greedy_opts(kMax), spec, {}, /*slot=*/1);
        EXPECT_EQ(r.gen.tokens, refs_[i]) << spec_method_name(method) << " k=" << k << " prompt " << i;
        total.merge(r.metrics);
      }
      std::printf("[ %s ] %s k=%d: %s\n", GetParam().name.c_str(), spec_method_name(method), k,
                  total.summary().c_str());
      if (method == SpecMethod::Mtp) {
        EXPECT_GT(total.drafted, 0u);
      }
    }
  }
}

// Structured output (a JSON object; a GBNF grammar) with MTP and n-gram drafts equals constrained
// generate(): each verify row is masked for the drafts before it, so a refused draft is just rejected.
TEST_P(Lossless, ConstrainedMtpAndNgramEqualConstrainedGreedy) {
  const int32_t V = int32_t(model_->config().vocab_size);
  auto trie = std::make_shared<const TokenTrie>(test::json_piece_vocab(V));
  OutputConstraint object, grammar;
  object.schema = text::JsonSchema::any_object();
  grammar.grammar = text::Grammar::parse(R"(root ::= "[" item ("," item)* "]"
item ::= "true" | "null" | [0-9]+ | "\"" [a-z]* "\"")");
  const auto ps = prompts(V);
  for (size_t i = 0; i < 4; ++i) {
    const OutputConstraint& oc = i < 3 ? object : grammar;
    GenerateOptions g = greedy_opts(kMax);
    g.stop_ids = {V - 1};
    TokenConstraint ref_c(trie, oc, g.stop_ids);
    g.constraint = &ref_c;
    ModelState st(*backend_, model_->config(), 1, kCtx, false);
    const GenerateResult ref = generate(*model_, st, ps[i], g);
    ASSERT_FALSE(ref.tokens.empty());
    for (SpecMethod method : {SpecMethod::Mtp, SpecMethod::Ngram}) {
      TokenConstraint c(trie, oc, g.stop_ids);
      g.constraint = &c;
      ModelState ss(*backend_, model_->config(), 2, kCtx, true);
      SpecOptions spec;
      spec.method = method;
      spec.draft_n = 3;
      const SpecResult r = spec_generate(*model_, ss, ps[i], g, spec, {}, /*slot=*/1);
      EXPECT_EQ(r.gen.tokens, ref.tokens) << spec_method_name(method) << " prompt " << i;
      EXPECT_EQ(r.gen.stop_reason, ref.stop_reason) << spec_method_name(method) << " prompt " << i;
    }
  }
}

// Drafts the known greedy continuation but corrupts one draft every other round, so long
// accepted runs, full acceptance with a bonus token and rejections at every depth all occur.
class OracleDrafter final : public Drafter {
 public:
  OracleDrafter(const std::vector<std::vector<int32_t>>& prompts, const std::vector<std::vector<int32_t>>& refs)
      : prompts_(prompts), refs_(refs) {}
  const char* name() const override { return "oracle"; }
  void propose(std::span<DraftRequest> reqs) override {
    for (DraftRequest& r : reqs) {
      const auto& prompt = prompts_[size_t(r.slot)];
      const auto& ref = refs_[size_t(r.slot)];
      const size_t done = r.history.size() - prompt.size();  // emitted so far
      r.tokens.clear();
      for (int32_t i = 0; i < r.k && done + size_t(i) < ref.size(); ++i) r.tokens.push_back(ref[done + size_t(i)]);
      if (++round_ % 2 == 0 && !r.tokens.empty()) {
        const size_t at = round_ / 2 % r.tokens.size();
        r.tokens[at] = (r.tokens[at] + 1) % 7;
      }
    }
  }

 private:
  const std::vector<std::vector<int32_t>>& prompts_;
  const std::vector<std::vector<int32_t>>& refs_;
  size_t round_ = 0;
};

TEST_P(Lossless, BatchEightMixedEqualsPlainGreedy) {
  const auto ps = prompts(model_->config().vocab_size);
  for (const char* which : {"mtp", "ngram", "oracle"}) {
    ModelState st(*backend_, model_->config(), 8, kCtx, true);
    std::vector<SpecSequence> seqs;
    for (int32_t i = 0; i < 8; ++i) {
      SpecSequence s{ps[size_t(i)], greedy_opts(kMax), i, /*draft=*/i % 3 != 2, {}};
      seqs.push_back(s);
    }
    SpecOptions spec;
    spec.draft_n = 4;
    std::unique_ptr<Drafter> drafter;
    if (std::string(which) == "oracle")
      drafter = std::make_unique<OracleDrafter>(ps, refs_);
    else
      drafter = make_drafter(parse_spec_method(which), *model_, st, spec.ngram);
    const auto res = spec_generate_batch(*model_, st, seqs, spec, drafter.get());
    SpecMetrics total;
    for (size_t i = 0; i < res.size(); ++i) {
      EXPECT_EQ(res[i].gen.tokens, refs_[i]) << which << " sequence " << i;
      if (i % 3 == 2) {
        EXPECT_EQ(res[i].metrics.drafted, 0u);
      }
      total.merge(res[i].metrics);
    }
    std::printf("[ %s ] batch 8 %s k=4: %s\n", GetParam().name.c_str(), which, total.summary().c_str());
    if (std::string(which) == "oracle") {
      EXPECT_GT(total.accepted, total.drafted / 2);
    }
  }
}

// Stop ids, max_tokens edge cases and a full context end the same way as generate().
TEST_P(Lossless, StopsLikeGenerate) {
  const auto p = prompts(model_->config().vocab_size)[3];
  const auto& ref = refs_[3];
  struct Variant {
    int32_t max_tokens;
    int64_t ctx;
    std::vector<int32_t> stop;
  };
  const std::vector<Variant> variants = {
      {0, kCtx, {}}, {1, kCtx, {}}, {2, kCtx, {}}, {kMax, kCtx, {ref[7]}}, {kMax, int64_t(p.size()) + 9, {}}};
  for (const Variant& v : variants) {
    GenerateOptions g = greedy_opts(v.max_tokens);
    g.stop_ids = v.stop;
    ModelState s0(*backend_, model_->config(), 1, v.ctx, false);
    const GenerateResult want = generate(*model_, s0, p, g);
    for (SpecMethod m : {SpecMethod::Mtp, SpecMethod::Ngram}) {
      ModelState s1(*backend_, model_->config(), 1, v.ctx, true);
      SpecOptions spec;
      spec.method = m;
      spec.draft_n = 3;
      const SpecResult got = spec_generate(*model_, s1, p, g, spec);
      EXPECT_EQ(got.gen.tokens, want.tokens) << spec_method_name(m) << " max " << v.max_tokens << " ctx " << v.ctx;
      EXPECT_EQ(got.gen.stop_reason, want.stop_reason) << spec_method_name(m) << " max " << v.max_tokens;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Lossless, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           std::string s = i.param.name;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace qwen36
