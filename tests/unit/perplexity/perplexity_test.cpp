// Perplexity and KL divergence (engine/perplexity.h, `qwen36 perplexity`):
//  - PPL of a golden fixture equals exp(mean NLL) computed directly from all-row forward
//    logits (what `qwen36 logits` writes), chunk by chunk, second half of each chunk;
//  - KLD of a model against itself is exactly 0 with 100% top-1 agreement;
//  - KLD between llama.cpp's bf16 and Q8_0 files of dense-a is > 0 and finite, and the top-K
//    bucketed KLD is a lower bound of the exact one;
//  - base file save/load round trip and its size; corrupted files, bad sizes and ids rejected;
//  - the CLI end to end (save, compare, errors).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/perplexity.h"
#include "format/model_loader.h"
#include "model/qwen36.h"

namespace qwen36 {
namespace {

namespace fs = std::filesystem;

const fs::path kData = QWEN36_TEST_DATA;

fs::path tmp_dir() {
  const fs::path d = fs::path(::testing::TempDir()) / "qwen36_perplexity_test";
  fs::create_directories(d);
  return d;
}

std::vector<int32_t> random_tokens(size_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

struct Loaded {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};
Loaded load(const fs::path& p) {
  Loaded l;
  l.backend = make_cpu_backend();
  l.model = std::make_unique<Model>(load_model_weights(p.string()), *l.backend);
  return l;
}

// All rows' logits of one sequence from an empty state, as `qwen36 logits` computes them.
std::vector<float> all_logits(Model& m, std::span<const int32_t> tokens) {
  ModelState st(m.backend(), m.config(), 1, int64_t(tokens.size()), false);
  std::vector<float> out(tokens.size() * size_t(m.config().vocab_size));
  m.forward(ForwardBatch::single(tokens, 0, 0, true), st, out.data());
  return out;
}

TEST(PerplexityMath, MeanPercentileAndRowScore) {
  MeanAccumulator a;
  for (double x : {1.0, 2.0, 3.0, 4.0}) a.add(x);
  EXPECT_DOUBLE_EQ(a.mean(), 2.5);
  // population variance 1.25, / (n - 1) -> sqrt(1.25 / 3)
  EXPECT_NEAR(a.error(), std::sqrt(1.25 / 3.0), 1e-12);
  std::vector<double> v = {5, 1, 4, 2, 3};
  EXPECT_DOUBLE_EQ(percentile(v, 0.5), 3.0);
  EXPECT_DOUBLE_EQ(percentile(v, 1.0), 5.0);
  EXPECT_DOUBLE_EQ(percentile(v, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(percentile(v, 0.9), 4.6);
  const std::vector<float> row = {0.0f, std::log(3.0f), 0.0f};  // p = 0.2, 0.6, 0.2
  const RowScore s = score_row(row, 0);
  EXPECT_NEAR(s.p_target, 0.2, 1e-6);
  EXPECT_NEAR(s.nll, -std::log(0.2), 1e-6);
  EXPECT_EQ(s.argmax, 1);
  const ChunkPlan p = plan_chunks(100, 32, 0);
  EXPECT_EQ(p.n_chunks, 3);
  EXPECT_EQ(p.first, 16);
  EXPECT_EQ(p.scored_per_chunk(), 15);
  EXPECT_EQ(plan_chunks(100, 32, 2).n_chunks, 2);
}

TEST(PerplexityMath, TopKRecordBucketsTheRest) {
  // p = [0.5, 0.25, 0.2, 0.05]; q = uniform. Exact KL = sum p log(4p).
  const std::vector<float> lp = {std::log(0.5f), std::log(0.25f), std::log(0.2f), std::log(0.05f)};
  const std::vector<float> lq = {0, 0, 0, 0};
  double exact = 0;
  for (double p : {0.5, 0.25, 0.2, 0.05}) exact += p * std::log(4 * p);
  const KldRecord full = make_kld_record(lp, 2, 4);
  EXPECT_FALSE(std::isfinite(full.rest_logprob));
  EXPECT_NEAR(compare_row(full, lq, 2).kld, exact, 1e-6);
  const KldRecord top2 = make_kld_record(lp, 2, 2);
  EXPECT_EQ(top2.top_ids, (std::vector<int32_t>{0, 1}));
  EXPECT_NEAR(std::exp(double(top2.rest_logprob)), 0.25, 1e-6);
  // bucket: 0.5 log 2 + 0.25 log 1 + 0.25 log(0.25 / 0.5)
  const double bucketed = 0.5 * std::log(2.0) + 0.25 * std::log(0.5);
  EXPECT_NEAR(compare_row(top2, lq, 2).kld, bucketed, 1e-6);
  EXPECT_LT(bucketed, exact);
}

class GoldenPerplexity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { m_ = new Loaded(load(kData / "golden" / "dense-gqa")); }
  static void TearDownTestSuite() {
    delete m_;
    m_ = nullptr;
  }
  static Loaded* m_;
};
Loaded* GoldenPerplexity::m_ = nullptr;

TEST_F(GoldenPerplexity, PplEqualsExpMeanNllOfForwardLogits) {
  Model& model = *m_->model;
  const int32_t V = int32_t(model.config().vocab_size);
  const std::vector<int32_t> tokens = random_tokens(3 * 32 + 7, V, 1234);  // 3 chunks, a dropped tail
  PerplexityJob job;
  job.tokens = tokens;
  job.plan = plan_chunks(int64_t(tokens.size()), 32, 0);
  job.vocab = V;
  const PerplexityResult r = run_perplexity(model_chunk_logits(model), job);
  ASSERT_EQ(r.chunk_ppl.size(), 3u);
  EXPECT_EQ(r.nll.count(), 3 * 15);

  double total = 0;
  int64_t n = 0;
  for (int c = 0; c < 3; ++c) {
    const std::span<const int32_t> chunk(tokens.data() + c * 32, 32);
    const std::vector<float> lg = all_logits(model, chunk);
    double chunk_sum = 0;
    for (int j = 16; j <= 30; ++j) {
      const float* row = lg.data() + size_t(j) * size_t(V);
      double mx = row[0];
      for (int i = 1; i < V; ++i) mx = std::max(mx, double(row[i]));
      double s = 0;
      for (int i = 0; i < V; ++i) s += std::exp(double(row[i]) - mx);
      const double nll = mx + std::log(s) - double(row[chunk[size_t(j) + 1]]);
      chunk_sum += nll;
      total += nll;
      ++n;
    }
    EXPECT_NEAR(r.chunk_ppl[size_t(c)], std::exp(chunk_sum / 15), 1e-5 * r.chunk_ppl[size_t(c)]) << "chunk " << c;
  }
  const double direct = std::exp(total / double(n));
  EXPECT_NEAR(r.ppl(), direct, 1e-5 * direct);
  EXPECT_GT(r.ppl_error(), 0);
  EXPECT_TRUE(std::isfinite(r.ppl_error()));
  // A random-weight model on random tokens: PPL is of the order of the vocabulary.
  EXPECT_GT(r.ppl(), 1.0);
}

// Saves a KLD base of `tokens` (chunks of n_ctx, top-k kept) with base_fn, then compares fn
// against it: the two runs' results.
struct KldRun {
  KldBase base;
  PerplexityResult saved, compared;
};
KldRun kld_run(const std::vector<int32_t>& tokens, int64_t n_ctx, int32_t vocab, int32_t top_k,
               const ChunkLogitsFn& base_fn, const ChunkLogitsFn& fn) {
  KldRun r;
  PerplexityJob save;
  save.tokens = tokens;
  save.plan = plan_chunks(int64_t(tokens.size()), n_ctx, 0);
  save.vocab = vocab;
  save.save = &r.base;
  save.save_top_k = top_k;
  r.saved = run_perplexity(base_fn, save);
  PerplexityJob cmp;
  cmp.vocab = vocab;
  cmp.compare = &r.base;
  r.compared = run_perplexity(fn, cmp);
  return r;
}

TEST_F(GoldenPerplexity, KldAgainstItselfIsZero) {
  Model& model = *m_->model;
  const int32_t V = int32_t(model.config().vocab_size);
  const std::vector<int32_t> tokens = random_tokens(2 * 24, V, 99);
  for (int32_t k : {V, 16}) {
    const KldRun run = kld_run(tokens, 24, V, k, model_chunk_logits(model), model_chunk_logits(model));
    const PerplexityResult &r0 = run.saved, &r1 = run.compared;
    ASSERT_EQ(run.base.records.size(), size_t(2 * 11));
    ASSERT_TRUE(r1.kld.has_value());
    const KldStats::Summary s = r1.kld->summary();
    EXPECT_EQ(s.n, 22);
    EXPECT_EQ(s.kld_mean, 0.0) << "top-k " << k;
    EXPECT_EQ(s.kld_max, 0.0);
    EXPECT_EQ(s.top1_pct, 100.0);
    EXPECT_EQ(s.dp_mean, 0.0);
    EXPECT_NEAR(s.ppl_base, r0.ppl(), 1e-9 * r0.ppl());
    EXPECT_NEAR(s.ppl_current, r0.ppl(), 1e-9 * r0.ppl());
    EXPECT_NEAR(r1.ppl(), r0.ppl(), 1e-9 * r0.ppl());
  }
}

// Chunks run as forwards of ubatch tokens (the state carried between them) score the same text:
// ubatch 1 (decode steps: the recurrent form) and 5 within the f32 bound of one forward per chunk
// (the chunked form; logits ~1e-4 apart give a KLD of ~1e-8, 1e-6 allowed). A bf16 DeltaNet
// state: stored once, at the end of a one-forward chunk, it is never read back (KLD exactly 0);
// stored after every decode step it costs a small, nonzero KLD (the figure README and
// bench/RESULTS.md report for a real model).
TEST_F(GoldenPerplexity, UbatchAndBf16State) {
  Model& model = *m_->model;
  const int32_t V = int32_t(model.config().vocab_size);
  const std::vector<int32_t> tokens = random_tokens(2 * 32, V, 7);
  auto kld_of = [&](const ChunkLogitsFn& base_fn, const ChunkLogitsFn& fn) {
    return kld_run(tokens, 32, V, V, base_fn, fn).compared.kld->summary();
  };
  const KldStats::Summary steps = kld_of(model_chunk_logits(model), model_chunk_logits(model, DType::F32, DType::F32, 1));
  EXPECT_LT(steps.kld_max, 1e-6) << "decode steps against one forward per chunk";
  const KldStats::Summary pieces = kld_of(model_chunk_logits(model), model_chunk_logits(model, DType::F32, DType::F32, 5));
  EXPECT_LT(pieces.kld_max, 1e-6) << "forwards of 5 tokens against one forward per chunk";
  const KldStats::Summary once = kld_of(model_chunk_logits(model), model_chunk_logits(model, DType::F32, DType::BF16));
  EXPECT_EQ(once.kld_max, 0.0) << "a bf16 state stored only at the end of each chunk";
  const KldStats::Summary decode = kld_of(model_chunk_logits(model, DType::F32, DType::F32, 1),
                                          model_chunk_logits(model, DType::F32, DType::BF16, 1));
  EXPECT_GT(decode.kld_mean, 0.0) << "a bf16 state rounded after every decode step";
  EXPECT_LT(decode.kld_mean, 1e-3);
}

TEST(Perplexity, KldBf16VsQ8IsPositiveAndFinite) {
  const fs::path dir = kData / "llamacpp-gguf" / "dense-a";
  Loaded bf16 = load(dir / "model-bf16.gguf");
  Loaded q8 = load(dir / "model-q8_0.gguf");
  const int32_t V = int32_t(bf16.model->config().vocab_size);
  std::vector<int32_t> tokens(80);
  std::ifstream(dir / "tokens.i32", std::ios::binary).read(reinterpret_cast<char*>(tokens.data()), 320);
  KldBase full, top8;
  for (auto [base, k] : {std::pair{&full, V}, std::pair{&top8, 8}}) {
    PerplexityJob save;
    save.tokens = tokens;
    save.plan = plan_chunks(80, 40, 0);
    save.vocab = V;
    save.save = base;
    save.save_top_k = k;
    run_perplexity(model_chunk_logits(*bf16.model), save);
  }
  PerplexityJob cmp;
  cmp.vocab = V;
  cmp.compare = &full;
  const KldStats::Summary s = run_perplexity(model_chunk_logits(*q8.model), cmp).kld->summary();
  cmp.compare = &top8;
  const KldStats::Summary s8 = run_perplexity(model_chunk_logits(*q8.model), cmp).kld->summary();
  EXPECT_EQ(s.n, 2 * 19);
  EXPECT_GT(s.kld_mean, 0.0);
  EXPECT_TRUE(std::isfinite(s.kld_mean) && std::isfinite(s.kld_max) && std::isfinite(s.kld_err));
  EXPECT_GE(s.kld_max, s.kld_p99);
  EXPECT_GE(s.kld_p99, s.kld_median);
  EXPECT_GE(s.kld_median, s.kld_min);
  EXPECT_GE(s.kld_min, 0.0);
  EXPECT_GT(s.top1_pct, 0.0);
  EXPECT_LE(s.top1_pct, 100.0);
  EXPECT_NE(s.ppl_current, s.ppl_base);
  // Merging the tail into one bucket can only lose divergence (log-sum inequality).
  EXPECT_GT(s8.kld_mean, 0.0);
  EXPECT_LE(s8.kld_mean, s.kld_mean * (1 + 1e-9));
  EXPECT_EQ(s8.top1_pct, s.top1_pct);
  EXPECT_DOUBLE_EQ(s8.ppl_base, s.ppl_base);
}

KldBase small_base() {
  KldBase b;
  b.vocab = 10;
  b.top_k = 3;
  b.plan = plan_chunks(16, 8, 0);  // 2 chunks, 3 rows each
  b.tokens = random_tokens(16, 10, 5);
  std::mt19937 rng(7);
  std::normal_distribution<float> d;
  for (int i = 0; i < 6; ++i) {
    std::vector<float> row(10);
    for (auto& x : row) x = d(rng);
    b.records.push_back(make_kld_record(row, b.tokens[size_t(i)], 3));
  }
  return b;
}

TEST(KldBaseFile, RoundTripAndSize) {
  const KldBase b = small_base();
  const std::string path = (tmp_dir() / "round.kld").string();
  b.save(path);
  EXPECT_EQ(fs::file_size(path), 64u + 4u * 16u + 6u * (8u + 8u * 3u));
  const KldBase l = KldBase::load(path);
  EXPECT_EQ(l.vocab, 10);
  EXPECT_EQ(l.top_k, 3);
  EXPECT_EQ(l.plan.n_ctx, 8);
  EXPECT_EQ(l.plan.n_chunks, 2);
  EXPECT_EQ(l.plan.first, 4);
  EXPECT_EQ(l.tokens, b.tokens);
  ASSERT_EQ(l.records.size(), b.records.size());
  for (size_t i = 0; i < l.records.size(); ++i) {
    EXPECT_EQ(l.records[i].top_ids, b.records[i].top_ids);
    EXPECT_EQ(l.records[i].top_logprobs, b.records[i].top_logprobs);
    EXPECT_EQ(l.records[i].target_logprob, b.records[i].target_logprob);
    EXPECT_EQ(l.records[i].rest_logprob, b.records[i].rest_logprob);
  }
}

std::string file_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
void write_bytes(const std::string& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

void expect_load_error(const std::string& bytes, const std::string& what) {
  const std::string p = (tmp_dir() / "bad.kld").string();
  write_bytes(p, bytes);
  try {
    KldBase::load(p);
    ADD_FAILURE() << "loaded a corrupted file: " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(KldBaseFile, CorruptedFilesAreRejected) {
  const std::string path = (tmp_dir() / "good.kld").string();
  small_base().save(path);
  const std::string good = file_bytes(path);
  auto patched = [&](size_t off, uint32_t v) {
    std::string s = good;
    std::memcpy(s.data() + off, &v, 4);
    return s;
  };
  expect_load_error(good.substr(0, 10), "shorter than its header");
  expect_load_error("XXXXXXXX" + good.substr(8), "bad magic");
  expect_load_error(patched(8, 2), "version 2");
  expect_load_error(patched(12, 0), "vocabulary size 0");
  expect_load_error(patched(16, 2), "context size 2");
  expect_load_error(patched(20, 1000000), "too short");
  expect_load_error(patched(24, 11), "top-k 11");
  expect_load_error(patched(28, 3), "first scored row");
  expect_load_error(patched(40, 1), "reserved");
  expect_load_error(good.substr(0, good.size() - 1), "too short");
  expect_load_error(good + "x", "does not match");
  expect_load_error(patched(64, 10), "token id 10");
  expect_load_error(patched(64 + 64 + 8, uint32_t(-1)), "record token id -1");
  const float pos = 1.0f;
  uint32_t bits;
  std::memcpy(&bits, &pos, 4);
  expect_load_error(patched(64 + 64, bits), "bad target log-probability");
  expect_load_error(std::string(), "shorter than its header");
  EXPECT_THROW(KldBase::load((tmp_dir() / "missing.kld").string()), Error);
}

TEST(Perplexity, BadInputErrors) {
  EXPECT_THROW(plan_chunks(10, 16, 0), Error);  // fewer tokens than one chunk
  EXPECT_THROW(plan_chunks(100, 3, 0), Error);  // context too small
  const std::vector<float> row = {0.f, 1.f};
  EXPECT_THROW(score_row(row, 2), Error);
  EXPECT_THROW(score_row(row, -1), Error);
  EXPECT_THROW(make_kld_record(row, 0, 0), Error);
  const std::vector<float> nan_row = {NAN, NAN};
  EXPECT_THROW(score_row(nan_row, 0), Error);

  // Vocabulary mismatch between the base and the model, and tokens outside the vocabulary.
  const KldBase b = small_base();
  auto never = [](std::span<const int32_t>, int64_t, int64_t, float*) { FAIL() << "evaluated"; };
  PerplexityJob cmp;
  cmp.vocab = 11;
  cmp.compare = &b;
  EXPECT_THROW(run_perplexity(never, cmp), Error);
  const std::vector<int32_t> tokens = {0, 1, 2, 50, 4, 5, 6, 7};
  PerplexityJob job;
  job.tokens = tokens;
  job.plan = plan_chunks(8, 8, 0);
  job.vocab = 10;
  EXPECT_THROW(run_perplexity(never, job), Error);
}

int run_cli(const std::string& args, const std::string& out_file) {
  const std::string cmd = std::string(QWEN36_BIN) + " " + args + " > " + out_file + " 2>&1";
  return std::system(cmd.c_str());
}

TEST(PerplexityCli, SaveCompareAndErrors) {
  const fs::path d = tmp_dir();
  const std::string model = (kData / "golden" / "dense-gqa").string();
  const std::string toks = (d / "cli.i32").string();
  const std::vector<int32_t> t = random_tokens(64, 256, 3);
  std::ofstream(toks, std::ios::binary).write(reinterpret_cast<const char*>(t.data()), 64 * 4);
  const std::string base = (d / "cli.kld").string();
  const std::string log = (d / "cli.log").string();
  ASSERT_EQ(run_cli("perplexity -m " + model + " --tokens-file " + toks + " -c 32 --kl-divergence-base " + base, log),
            0)
      << file_bytes(log);
  EXPECT_NE(file_bytes(log).find("Final estimate: PPL = "), std::string::npos) << file_bytes(log);
  EXPECT_EQ(KldBase::load(base).records.size(), 2u * 15u);
  ASSERT_EQ(run_cli("perplexity -m " + model + " --kl-divergence --kl-divergence-base " + base, log), 0)
      << file_bytes(log);
  const std::string out = file_bytes(log);
  EXPECT_NE(out.find("Mean KLD           :   0.000000 +/- 0.000000"), std::string::npos) << out;
  EXPECT_NE(out.find("Same top p         :  100.0000 %"), std::string::npos) << out;
  EXPECT_NE(run_cli("perplexity -m " + model + " --kl-divergence", log), 0);
  EXPECT_NE(file_bytes(log).find("--kl-divergence-base"), std::string::npos) << file_bytes(log);
  EXPECT_NE(run_cli("perplexity -m " + model + " --tokens-file " + toks + " -c 128", log), 0);
  EXPECT_NE(file_bytes(log).find("at least one chunk"), std::string::npos) << file_bytes(log);
}

}  // namespace
}  // namespace qwen36
