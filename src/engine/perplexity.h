#pragma once
// defines: perplexity and KL-divergence evaluation with llama-perplexity semantics:
//          ChunkPlan, score_row, MeanAccumulator, KldRecord / KldBase (the base-logits file),
//          compare_row, KldStats, run_perplexity, model_chunk_logits
//
// Semantics (as llama-perplexity): the token stream is cut into chunks of n_ctx tokens (a
// tail shorter than n_ctx is dropped); each chunk is evaluated from an empty state; row j of
// a chunk predicts token j+1 and only rows first = n_ctx/2 .. n_ctx-2 are scored, so every
// scored prediction has at least n_ctx/2 tokens of context. PPL = exp(mean NLL) over all
// scored rows, its error = PPL × standard error of the mean NLL.
//
// KL divergence: a first run with the reference model saves, per scored row, its top-K
// log-probabilities (K = --kl-top-k, ids and values), the log of the probability mass outside
// them, and the log-probability of the actual next token, plus the token stream (file format
// below). A second run with another model computes, per row,
//   KLD = sum_{i in topK} p_i (log p_i - log q_i) + p_rest (log p_rest - log q_rest)
// which is the exact KL(P||Q) when K >= vocab, and otherwise the KL of the distributions with
// the tokens outside the reference's top K merged into one bucket (a lower bound of the full
// KL; the bucket holds little mass for a trained model and K = 1024).
//
// KldBase file (all little-endian):
//   header, 64 bytes: char magic[8] = "QWEN36KL"; u32 version = 1; u32 vocab; u32 n_ctx;
//                     u32 n_chunks; u32 top_k (K, <= vocab); u32 first (= n_ctx/2);
//                     32 bytes of zeros
//   i32 tokens[n_chunks * n_ctx]           the evaluated stream, chunk after chunk
//   records[n_chunks * (n_ctx - 1 - first)], in chunk then row order, each 8 + 8K bytes:
//     f32 target_logprob   log p(actual next token)
//     f32 rest_logprob     log of the mass outside the top K (-inf when K = vocab)
//     i32 ids[K]           top-K token ids, by descending probability (ties: lower id first)
//     f32 logprobs[K]      their log-probabilities
// Size: 248320-token vocab, K = 1024, 4096 scored rows -> 33.6 MB (full f16 rows: 2 GB).
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace qwen36 {

class Model;

struct ChunkPlan {
  int64_t n_ctx = 0;     // tokens per chunk
  int64_t n_chunks = 0;  // chunks evaluated
  int64_t first = 0;     // first scored row of a chunk (n_ctx / 2)
  int64_t scored_per_chunk() const { return n_ctx - 1 - first; }
  int64_t n_scored() const { return n_chunks * scored_per_chunk(); }
};

// n_ctx >= 4; max_chunks <= 0 means all. Error when the text has fewer than n_ctx tokens.
ChunkPlan plan_chunks(int64_t n_tokens, int64_t n_ctx, int64_t max_chunks);

// log(sum exp(row)), computed in double around the row's maximum.
double log_sum_exp(std::span<const float> row);

// One row's log-probability of `id`: float(logit - lse). The single definition shared by the
// saving and the comparing run, so identical logits give bit-identical log-probabilities.
inline float row_logprob(float logit, double lse) { return float(double(logit) - lse); }

struct RowScore {
  double nll = 0;       // -log p(target)
  double p_target = 0;  // p(target)
  int32_t argmax = 0;   // most likely token (lowest id among ties)
};
RowScore score_row(std::span<const float> logits, int32_t target);

// Mean and its standard error, sqrt((E[x^2] - E[x]^2) / (n - 1)), as llama-perplexity reports.
class MeanAccumulator {
 public:
  void add(double x) {
    sum_ += x;
    sum2_ += x * x;
    ++n_;
  }
  int64_t count() const { return n_; }
  double mean() const { return n_ ? sum_ / double(n_) : 0.0; }
  double error() const;  // 0 for fewer than 2 values

 private:
  double sum_ = 0, sum2_ = 0;
  int64_t n_ = 0;
};

// The reference model's summary of one scored row.
struct KldRecord {
  float target_logprob = 0;
  float rest_logprob = 0;  // -inf when the top K covers the vocabulary
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
};
// top_k is clamped to the vocabulary size.
KldRecord make_kld_record(std::span<const float> logits, int32_t target, int32_t top_k);

struct RowComparison {
  double kld = 0;           // see the header comment
  double nll = 0;           // -log q(target) of the current model
  double p_base = 0;        // p(target) of the reference
  double p_current = 0;     // q(target)
  bool same_top = false;    // current argmax == reference argmax
};
RowComparison compare_row(const KldRecord& base, std::span<const float> logits, int32_t target);

// The reference run: token stream and per-row records (format in the header comment).
struct KldBase {
  int32_t vocab = 0;
  ChunkPlan plan;
  int32_t top_k = 0;
  std::vector<int32_t> tokens;      // plan.n_chunks * plan.n_ctx
  std::vector<KldRecord> records;   // plan.n_scored()

  void save(const std::string& path) const;
  // Validates every field and the exact file size; Error naming the file otherwise.
  static KldBase load(const std::string& path);
};

class KldStats {
 public:
  void add(const RowComparison& c, double nll_base);
  struct Summary {
    int64_t n = 0;
    double kld_mean = 0, kld_err = 0;
    double kld_min = 0, kld_median = 0, kld_p90 = 0, kld_p95 = 0, kld_p99 = 0, kld_max = 0;
    double top1_pct = 0, top1_err_pct = 0;  // same argmax, % ± binomial standard error
    double ppl_base = 0, ppl_base_err = 0, ppl_current = 0, ppl_current_err = 0;
    double ln_ppl_ratio = 0, ln_ppl_ratio_err = 0;  // mean of nll_current - nll_base
    double dp_mean = 0, dp_err = 0, dp_rms = 0;     // Δp = q(target) - p(target)
  };
  Summary summary() const;

 private:
  std::vector<double> kld_;
  MeanAccumulator kld_acc_, nll_base_, nll_cur_, ln_ratio_, dp_;
  double dp2_ = 0;
  int64_t same_top_ = 0;
};

// Percentile q in [0, 1] of `v` (sorted in place), linear between closest ranks; 0 if empty.
double percentile(std::vector<double>& v, double q);

// Logits of rows first_row .. first_row + n_rows - 1 of `chunk`, evaluated from an empty
// state, written to out [n_rows × vocab].
using ChunkLogitsFn =
    std::function<void(std::span<const int32_t> chunk, int64_t first_row, int64_t n_rows, float* out)>;

// The forward pass of `model` (any backend), one fresh ModelState per chunk.
// kv_type: the attention cache; state_type: the DeltaNet recurrent state; ubatch > 0: the chunk
// runs as forwards of at most ubatch tokens carrying the state between them (1: every token a
// decode step, the way generation reads the caches and the state), 0: one forward per chunk.
ChunkLogitsFn model_chunk_logits(Model& model, DType kv_type = DType::F32, DType state_type = DType::F32,
                                 int64_t ubatch = 0);

struct PerplexityResult {
  ChunkPlan plan;
  std::vector<double> chunk_ppl;  // exp(mean NLL) of each chunk's scored rows
  MeanAccumulator nll;            // over all scored rows
  std::optional<KldStats> kld;    // set when comparing against a base
  double ppl() const;
  double ppl_error() const;
};

struct PerplexityJob {
  std::span<const int32_t> tokens;  // ignored when `compare` is set (its tokens are used)
  ChunkPlan plan;                   // ignored when `compare` is set
  int32_t vocab = 0;                // of the evaluated model
  KldBase* save = nullptr;          // filled with the reference records when set
  int32_t save_top_k = 1024;
  const KldBase* compare = nullptr; // compare against this reference when set
  // Called after each chunk with the results so far and the chunk's index.
  std::function<void(const PerplexityResult&, int64_t chunk)> on_chunk;
};

PerplexityResult run_perplexity(const ChunkLogitsFn& eval, const PerplexityJob& job);

}  // namespace qwen36
