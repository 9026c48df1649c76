// Structured output inside the continuous-batching scheduler (no HTTP), on the golden MTP
// fixture (vocab 128) with a vocabulary of JSON pieces given to its ids:
// - every request under a schema ends with a whole document of that schema ("stop" as soon as
//   its last byte is out), greedy and sampled, several at once;
// - json_object mode: the text is always a prefix of an object, and a whole one when it stops;
// - lossless with speculation: constrained greedy output with MTP, n-gram and a drafter that
//   proposes wrong (often forbidden) tokens equals the constrained output without speculation;
// - a constraint without the vocabulary is refused;
// - logit_bias forces and bans tokens, and a forced beginning (tool_choice) is taken, with and
//   without speculation.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "engine/scheduler.h"
#include "../unit/spec/spec_test_util.h"
#include "engine_test_util.h"

namespace qwen36 {
namespace {

using test::run_until_done;
using Json = nlohmann::ordered_json;
using namespace std::chrono_literals;

constexpr char kDenseMtp[] = "dense-mtp";

class EngineConstraintTest : public test::GoldenModelSuite<kDenseMtp> {
 protected:
  static int32_t vocab() { return int32_t(model_->config().vocab_size); }
  static int32_t stop() { return vocab() - 1; }
  static SchedulerOptions options(SpecMethod m = SpecMethod::None) {
    SchedulerOptions o;
    o.slots = 4;
    o.context = 256;
    o.prefill_chunk = 16;
    o.max_batch_tokens = 64;
    o.spec.method = m;
    o.spec.draft_n = 3;
    auto bytes = std::make_shared<std::vector<std::string>>(test::json_piece_vocab(vocab()));
    o.token_text = [bytes](int32_t t) { return (*bytes)[size_t(t)]; };
    o.vocab = std::make_shared<const TokenTrie>(*bytes);
    return o;
  }
  static RequestParams request(int seed, const std::shared_ptr<const text::JsonSchema>& schema, float temperature) {
    RequestParams p;
    for (int i = 0; i < 12; ++i) p.prompt.push_back((seed * 37 + i * 11 + i * i) % vocab());
    p.max_tokens = 100;
    p.stop_ids = {stop()};
    p.sampling = SamplingParams::greedy();
    p.sampling.temperature = temperature;
    p.sampling.seed = uint64_t(seed);
    p.constraint.schema = schema;
    return p;
  }
  static std::vector<RequestResult> run(Scheduler& s, const std::vector<RequestParams>& ps) {
    std::vector<std::shared_ptr<Request>> reqs;
    for (const RequestParams& p : ps) reqs.push_back(s.submit(p));
    run_until_done(s, reqs);
    std::vector<RequestResult> out;
    for (auto& r : reqs) out.push_back(wait_for_result(*r, 1000ms));
    return out;
  }
  static std::shared_ptr<const text::JsonSchema> schema() {
    return text::JsonSchema::compile(Json::parse(R"({
      "type": "object",
      "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}, "tag": {"enum": ["a", "b"]}},
      "required": ["ok", "n", "tag"]})"));
  }
};

void expect_schema_document(const RequestResult& r) {
  ASSERT_EQ(r.finish_reason, "stop") << r.text << " " << r.error;
  const Json j = Json::parse(r.text, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.text;
  std::vector<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"ok", "n", "tag"})) << r.text;
  EXPECT_TRUE(j["ok"].is_boolean()) << r.text;
  EXPECT_TRUE(j["n"].is_number_integer()) << r.text;
  EXPECT_TRUE(j["tag"] == "a" || j["tag"] == "b") << r.text;
}

TEST_F(EngineConstraintTest, EveryRequestEndsWithAWholeDocumentOfItsSchema) {
  Scheduler s(*model_, options());
  const auto results = run(s, {request(1, schema(), 0.0f), request(2, schema(), 1.0f), request(3, schema(), 1.5f),
                               request(4, schema(), 0.7f)});
  for (const RequestResult& r : results) expect_schema_document(r);
}

TEST_F(EngineConstraintTest, JsonObjectModeTextIsAlwaysAPrefixOfAnObject) {
  Scheduler s(*model_, options());
  std::vector<RequestParams> ps;
  for (int seed = 0; seed < 4; ++seed) {
    ps.push_back(request(seed, text::JsonSchema::any_object(), seed == 0 ? 0.0f : 1.0f));
    ps.back().max_tokens = 30;
  }
  for (const RequestResult& r : run(s, ps)) {
    text::JsonMatcher m(text::JsonSchema::any_object());
    EXPECT_TRUE(m.feed(r.text)) << r.text;
    if (r.finish_reason == "stop") {
      EXPECT_TRUE(m.finished()) << r.text;
      EXPECT_TRUE(Json::parse(r.text, nullptr, false).is_object()) << r.text;
    } else {
      EXPECT_EQ(r.finish_reason, "length") << r.error;
      EXPECT_EQ(r.tokens.size(), 30u);
    }
  }
}

// Proposes the given continuations, every other round with one token replaced by a forbidden
// one ('}' at the start, or a stray letter).
class WrongDrafter final : public Drafter {
 public:
  explicit WrongDrafter(std::map<std::vector<int32_t>, std::vector<int32_t>> refs) : refs_(std::move(refs)) {}
  const char* name() const override { return "wrong"; }
  void propose(std::span<DraftRequest> reqs) override {
    for (DraftRequest& r : reqs) {
      r.tokens.clear();
      for (const auto& [p, out] : refs_) {
        if (p.size() > r.history.size() || !std::equal(p.begin(), p.end(), r.history.begin())) continue;
        for (size_t i = r.history.size() - p.size(); i < out.size() && int32_t(r.tokens.size()) < r.k; ++i)
          r.tokens.push_back(out[i]);
      }
      if (++round_ % 2 == 0 && !r.tokens.empty()) r.tokens[round_ / 2 % r.tokens.size()] = round_ % 4 ? 1 : 40;
    }
  }

 private:
  std::map<std::vector<int32_t>, std::vector<int32_t>> refs_;
  size_t round_ = 0;
};

TEST_F(EngineConstraintTest, SpeculationIsLosslessUnderTheConstraint) {
  std::vector<RequestParams> ps;
  for (int seed = 0; seed < 4; ++seed) ps.push_back(request(seed, seed % 2 ? schema() : text::JsonSchema::any_object(), 0));
  Scheduler plain(*model_, options());
  const auto ref = run(plain, ps);
  std::map<std::vector<int32_t>, std::vector<int32_t>> refs;
  for (size_t i = 0; i < ps.size(); ++i) refs[ps[i].prompt] = ref[i].tokens;
  for (const char* which : {"mtp", "ngram", "wrong"}) {
    SchedulerOptions o = options(std::string(which) == "mtp" ? SpecMethod::Mtp : SpecMethod::Ngram);
    if (std::string(which) == "wrong")
      o.spec_drafter = [refs](Model&, ModelState&) { return std::make_unique<WrongDrafter>(refs); };
    Scheduler s(*model_, o);
    const auto got = run(s, ps);
    for (size_t i = 0; i < ps.size(); ++i) {
      EXPECT_EQ(got[i].tokens, ref[i].tokens) << which << " request " << i;
      EXPECT_EQ(got[i].finish_reason, ref[i].finish_reason) << which << " request " << i;
    }
    if (std::string(which) == "wrong") {
      EXPECT_GT(s.stats().spec.accepted, 0u) << "its right drafts are taken";
    }
  }
  for (size_t i = 1; i < ps.size(); i += 2) expect_schema_document(ref[i]);
}

// logit_bias: +100 makes a token every draw, −100 bans one, with and without speculation.
TEST_F(EngineConstraintTest, LogitBiasForcesAndBansTokens) {
  for (SpecMethod m : {SpecMethod::None, SpecMethod::Mtp, SpecMethod::Ngram}) {
    Scheduler s(*model_, options(m));
    RequestParams forced = request(1, nullptr, 0.0f), plain = request(2, nullptr, 0.0f);
    forced.max_tokens = plain.max_tokens = 16;
    forced.stop_ids = plain.stop_ids = {};  // every request runs its max_tokens
    forced.logit_bias = {{5, 100.0f}};
    const auto ref = run(s, {plain})[0].tokens;
    ASSERT_EQ(ref.size(), 16u);
    RequestParams banned = plain;
    banned.logit_bias = {{ref[0], -100.0f}, {ref[1], -100.0f}};
    RequestParams sampled = request(3, nullptr, 1.0f);
    sampled.max_tokens = 40;
    sampled.stop_ids = {};
    sampled.logit_bias = {{ref[0], -100.0f}};
    const auto got = run(s, {forced, banned, sampled});
    EXPECT_EQ(got[0].tokens, std::vector<int32_t>(16, 5)) << spec_method_name(m);
    for (int32_t t : got[1].tokens) EXPECT_TRUE(t != ref[0] && t != ref[1]) << spec_method_name(m);
    EXPECT_EQ(got[1].tokens.size(), 16u);
    for (int32_t t : got[2].tokens) EXPECT_NE(t, ref[0]) << spec_method_name(m);
  }
  Scheduler s(*model_, options());
  RequestParams bad = request(1, nullptr, 0.0f);
  bad.logit_bias = {{vocab(), 1.0f}};
  EXPECT_THROW(s.submit(bad), Error);
}

// A forced beginning (tool_choice): every answer begins with one of the alternatives, the same
// tokens with and without speculation.
TEST_F(EngineConstraintTest, ForcedBeginningWithAndWithoutSpeculation) {
  const std::vector<std::vector<int32_t>> alts = {{8, 15}, {8, 16, 17}};
  std::vector<RequestParams> ps;
  for (int seed = 0; seed < 3; ++seed) {
    ps.push_back(request(seed, nullptr, seed == 0 ? 0.0f : 1.0f));
    ps.back().constraint.forced = alts;
    ps.back().max_tokens = 12;
    ps.back().stop_ids = {};
  }
  std::vector<std::vector<int32_t>> ref;
  for (SpecMethod m : {SpecMethod::None, SpecMethod::Mtp, SpecMethod::Ngram}) {
    Scheduler s(*model_, options(m));
    const auto got = run(s, ps);
    for (size_t i = 0; i < got.size(); ++i) {
      const auto& t = got[i].tokens;
      ASSERT_EQ(t.size(), 12u) << got[i].error;
      EXPECT_TRUE(std::equal(alts[0].begin(), alts[0].end(), t.begin()) ||
                  std::equal(alts[1].begin(), alts[1].end(), t.begin()))
          << spec_method_name(m) << " request " << i;
      if (m == SpecMethod::None) {
        ref.push_back(t);
      } else if (i == 0) {  // greedy: lossless
        EXPECT_EQ(t, ref[i]) << spec_method_name(m);
      }
    }
  }
}

TEST_F(EngineConstraintTest, ConstraintWithoutTheVocabularyIsRefused) {
  SchedulerOptions o = options();
  o.vocab = nullptr;
  Scheduler s(*model_, o);
  EXPECT_THROW(s.submit(request(1, schema(), 0)), Error);
}

}  // namespace
}  // namespace qwen36
