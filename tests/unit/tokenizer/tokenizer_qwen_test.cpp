// The real Qwen3 tokenizer (fetched by scripts/fetch-tokenizer.sh into .models/, not committed):
// known ids, round trips over the corpus, streaming, speed, the CLI, and golden ids written by
// tools/golden_tokenizer.py with Hugging Face `tokenizers`. Everything here skips, saying why,
// when the tokenizer or the golden files are absent.
#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace qwen36::text {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;

fs::path data_dir() { return fs::path(QWEN36_TEST_DATA) / "tokenizer"; }

fs::path tokenizer_path() {
  if (const char* env = std::getenv("QWEN36_TOKENIZER")) return env;
  return fs::path(QWEN36_TEST_DATA) / ".." / ".." / ".models" / "qwen3-tokenizer" / "tokenizer.json";
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Ids read_ids(const fs::path& p) {
  const std::string b = read_file(p);
  Ids ids(b.size() / 4);
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t u = 0;
    for (size_t k = 0; k < 4; ++k) u |= static_cast<uint32_t>(static_cast<uint8_t>(b[i * 4 + k])) << (8 * k);
    ids[i] = static_cast<int32_t>(u);
  }
  return ids;
}

std::vector<fs::path> corpus_files() {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(data_dir() / "corpus"))
    if (e.path().extension() == ".txt") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

class QwenTokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(tokenizer_path())) return;
    tok_ = std::make_unique<Tokenizer>(Tokenizer::from_file(tokenizer_path().string()));
    TokenizerSpec spec = Tokenizer::spec_from_json(read_file(tokenizer_path()));
    spec.pattern = pattern_for_pre("qwen35");
    tok35_ = std::make_unique<Tokenizer>(spec);
  }
  static void TearDownTestSuite() {
    tok_.reset();
    tok35_.reset();
  }
  void SetUp() override {
    if (!tok_)
      GTEST_SKIP() << "Qwen3 tokenizer not found at " << tokenizer_path()
                   << "; run scripts/fetch-tokenizer.sh (or set QWEN36_TOKENIZER)";
  }
  static std::unique_ptr<Tokenizer> tok_;
  static std::unique_ptr<Tokenizer> tok35_;  // same vocabulary, Qwen3.5/3.6 regex
};
std::unique_ptr<Tokenizer> QwenTokenizer::tok_;
std::unique_ptr<Tokenizer> QwenTokenizer::tok35_;

TEST_F(QwenTokenizer, KnownIds) {
  // Hand-checked against the vocabulary: "Hello" 9707, "Ġworld" 1879, "!" 0, specials
  // from the added_tokens table.
  EXPECT_EQ(tok_->encode("Hello world!"), Ids({9707, 1879, 0}));
  EXPECT_EQ(tok_->token_id("<|endoftext|>"), 151643);
  EXPECT_EQ(tok_->token_id("<|im_start|>"), 151644);
  EXPECT_EQ(tok_->token_id("<|im_end|>"), 151645);
  EXPECT_EQ(tok_->encode("<|im_start|>user\n"), Ids({151644, 872, 198}));
  EXPECT_EQ(tok_->token_text(1879), "\xC4\xA0world");
  EXPECT_TRUE(tok_->is_special(151645));
  EXPECT_FALSE(tok_->is_special(9707));
  EXPECT_EQ(tok_->encode("12345"), Ids({16, 17, 18, 19, 20}));  // digits one by one
}

TEST_F(QwenTokenizer, SpecialTokensAsPlainText) {
  const std::string text = "a<|im_end|>b";
  const Ids parsed = tok_->encode(text);
  const Ids plain = tok_->encode(text, /*parse_special=*/false);
  EXPECT_NE(std::find(parsed.begin(), parsed.end(), 151645), parsed.end());
  EXPECT_EQ(std::find(plain.begin(), plain.end(), 151645), plain.end());
  EXPECT_GT(plain.size(), parsed.size());
  EXPECT_EQ(tok_->decode(plain), text);
  EXPECT_EQ(tok_->decode(parsed, /*skip_special=*/true), "ab");
  // <think> is an added token but not a special one: it matches either way and survives
  // skip_special, as in HF.
  EXPECT_EQ(tok_->encode("<think>", false), Ids({151667}));
  EXPECT_EQ(tok_->decode(Ids({151667, 151645}), /*skip_special=*/true), "<think>");
}

TEST_F(QwenTokenizer, RoundTripIsNfcOfTheCorpus) {
  for (const fs::path& f : corpus_files()) {
    const std::string text = read_file(f);
    for (const Tokenizer* t : {tok_.get(), tok35_.get()}) {
      const Ids ids = t->encode(text);
      ASSERT_FALSE(ids.empty()) << f;
      EXPECT_EQ(t->decode(ids), nfc(text)) << f;
    }
  }
}

TEST_F(QwenTokenizer, StreamDecoderNeverEmitsBrokenUtf8) {
  for (const fs::path& f : corpus_files()) {
    const Ids ids = tok_->encode(read_file(f));
    StreamDecoder dec(*tok_);
    std::string joined;
    for (int32_t id : ids) {
      const std::string piece = dec.push(id);
      ASSERT_TRUE(is_valid_utf8(piece)) << f << " id " << id;
      joined += piece;
    }
    joined += dec.flush();
    EXPECT_EQ(joined, tok_->decode(ids)) << f;
  }
  // Random ids split characters anywhere, and often leave them unfinished for good.
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> pick(0, 151642);
  for (int round = 0; round < 200; ++round) {
    Ids ids(50);
    for (int32_t& id : ids) id = pick(rng);
    StreamDecoder dec(*tok_);
    std::string joined;
    for (int32_t id : ids) {
      const std::string piece = dec.push(id);
      ASSERT_TRUE(is_valid_utf8(piece));
      joined += piece;
    }
    joined += dec.flush();
    ASSERT_EQ(joined, tok_->decode(ids));
  }
}

// CPU time of this thread: on a shared, busy machine wall time says more about the neighbours.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

TEST_F(QwenTokenizer, EncodeSpeed) {
  // Mixed text: the whole corpus, repeated to about 8 MB. A fresh tokenizer shows the cold
  // figure (empty pre-token cache) on the first pass.
  std::string corpus;
  for (const fs::path& f : corpus_files()) corpus += read_file(f);
  std::string big;
  while (big.size() < (8u << 20)) big += corpus;
  const Tokenizer fresh = Tokenizer::from_file(tokenizer_path().string());
  auto time_encode = [&](const std::string& text, size_t* n_ids) {
    const auto t0 = std::chrono::steady_clock::now();
    *n_ids = fresh.encode(text).size();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  size_t n_cold = 0, n_big = 0;
  const double cold = time_encode(corpus, &n_cold);
  const double warm = time_encode(big, &n_big);
  const double mb = static_cast<double>(big.size()) / 1e6;
  const double c0 = thread_cpu_seconds();
  fresh.encode(big);
  const double cpu = thread_cpu_seconds() - c0;
  std::printf("[ speed    ] cold corpus: %.1f KB in %.2f ms = %.1f MB/s; 8 MB mixed: %.1f MB/s wall, "
              "%.1f MB/s of CPU time (%.2f bytes/token)\n",
              static_cast<double>(corpus.size()) / 1e3, cold * 1e3,
              static_cast<double>(corpus.size()) / 1e6 / cold, mb / warm, mb / cpu,
              static_cast<double>(big.size()) / static_cast<double>(n_big));
  // Any large UTF-8 file (say, a mix of source code, prose and web pages in many languages)
  // gives a figure less flattered by the repeated corpus.
  if (const char* bench = std::getenv("QWEN36_TOKENIZER_BENCH_FILE")) {
    const std::string text = read_file(bench);
    const Tokenizer cold_tok = Tokenizer::from_file(tokenizer_path().string());
    const auto t0 = std::chrono::steady_clock::now();
    const double cpu0 = thread_cpu_seconds();
    const size_t n = cold_tok.encode(text).size();
    const double c = thread_cpu_seconds() - cpu0;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double mbytes = static_cast<double>(text.size()) / 1e6;
    std::printf("[ speed    ] %s: %.1f MB, %zu tokens: %.1f MB/s wall, %.1f MB/s of CPU time\n",
                bench, mbytes, n, mbytes / s, mbytes / c);
  }
  EXPECT_GT(n_big, n_cold);
  EXPECT_GT(mb / warm, 0.5);  // far below the 5 MB/s goal: only catches pathologies
}

// Compares against golden ids from HF `tokenizers` (tools/golden_tokenizer.py).
void compare_golden(const Tokenizer& tok, const std::string& suffix) {
  const fs::path golden = data_dir() / "golden";
  size_t compared = 0, identical = 0;
  for (const fs::path& f : corpus_files()) {
    const fs::path g = golden / (f.stem().string() + suffix + ".ids.i32");
    if (!fs::exists(g)) continue;
    const Ids want = read_ids(g);
    const Ids got = tok.encode(read_file(f));
    ++compared;
    if (got == want) {
      ++identical;
      continue;
    }
    size_t i = 0;
    while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
    auto show = [&](const Ids& ids) {
      std::string s;
      for (size_t k = i; k < std::min(ids.size(), i + 6); ++k)
        s += std::to_string(ids[k]) + "'" + tok.token_text(ids[k]) + "' ";
      return s;
    };
    ADD_FAILURE() << f.filename() << suffix << ": first difference at id " << i << " of "
                  << want.size() << "\n  want: " << show(want) << "\n  got:  " << show(got);
  }
  if (compared == 0)
    GTEST_SKIP() << "no golden ids in " << golden << "; produce them with "
                 << "tools/golden_tokenizer.py on a machine with HF tokenizers";
  std::printf("[ golden   ] %zu of %zu corpus files identical to HF tokenizers\n", identical, compared);
}

TEST_F(QwenTokenizer, GoldenIdsQwen3Pattern) { compare_golden(*tok_, ""); }
TEST_F(QwenTokenizer, GoldenIdsQwen35Pattern) { compare_golden(*tok35_, ".qwen35"); }

int run(const std::string& cmd) { return std::system(cmd.c_str()); }

TEST_F(QwenTokenizer, CliTokenizeDetokenizeRoundTrip) {
  const fs::path tmp = fs::temp_directory_path() / "qwen36_tok_cli";
  fs::create_directories(tmp);
  const fs::path in = data_dir() / "corpus" / "special_tokens.txt";
  const std::string bin = QWEN36_BIN;
  const std::string tk = tokenizer_path().parent_path().string();  // a model dir works too
  ASSERT_EQ(run(bin + " tokenize --tokenizer '" + tk + "' --in '" + in.string() + "' --out '" +
                (tmp / "ids.i32").string() + "'"), 0);
  EXPECT_EQ(read_ids(tmp / "ids.i32"), tok_->encode(read_file(in)));
  ASSERT_EQ(run(bin + " detokenize --tokenizer '" + tokenizer_path().string() + "' --in '" +
                (tmp / "ids.i32").string() + "' > '" + (tmp / "out.txt").string() + "'"), 0);
  EXPECT_EQ(read_file(tmp / "out.txt"), read_file(in));
  // Errors: one line, non-zero exit.
  std::ofstream(tmp / "bad.i32", std::ios::binary) << "abc";
  EXPECT_NE(run(bin + " detokenize --tokenizer '" + tk + "' --in '" + (tmp / "bad.i32").string() +
                "' 2> '" + (tmp / "err.txt").string() + "'"), 0);
  EXPECT_NE(read_file(tmp / "err.txt").find("multiple of 4"), std::string::npos);
  EXPECT_NE(run(bin + " tokenize --tokenizer missing-model.gguf --in '" + in.string() + "' --out '" +
                (tmp / "o.i32").string() + "' 2> '" + (tmp / "err.txt").string() + "'"), 0);
  EXPECT_NE(read_file(tmp / "err.txt").find("missing-model.gguf"), std::string::npos);
  fs::remove_all(tmp);
}

}  // namespace
}  // namespace qwen36::text
