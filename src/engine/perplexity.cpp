#include "engine/perplexity.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "model/qwen36.h"

namespace qwen36 {

static_assert(std::endian::native == std::endian::little, "the KLD base file is written in host byte order");

namespace {

constexpr char kMagic[8] = {'Q', 'W', 'E', 'N', '3', '6', 'K', 'L'};
constexpr uint32_t kVersion = 1;
constexpr int64_t kHeaderBytes = 64;
constexpr uint32_t kMaxVocab = 1u << 24;
constexpr uint32_t kMaxCtx = 1u << 20;

void check_target(int32_t target, size_t vocab) {
  QWEN36_CHECK(target >= 0 && size_t(target) < vocab, "token id {} is outside the vocabulary (0..{})", target,
               vocab - 1);
}

// Log of the probability mass of the ids where mask[i] == 0; -inf when there are none.
float rest_logprob(std::span<const float> logits, double lse, const std::vector<uint8_t>& mask) {
  double rest = 0;
  bool any = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (mask[i]) continue;
    any = true;
    rest += std::exp(double(row_logprob(logits[i], lse)));
  }
  if (!any) return -std::numeric_limits<float>::infinity();
  return rest > 0 ? float(std::log(rest)) : -std::numeric_limits<float>::max();
}

template <typename T>
void put(std::ofstream& out, const T& v) {
  out.write(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
void put_array(std::ofstream& out, const std::vector<T>& v) {
  out.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(T)));
}

}  // namespace

ChunkPlan plan_chunks(int64_t n_tokens, int64_t n_ctx, int64_t max_chunks) {
  QWEN36_CHECK(n_ctx >= 4 && n_ctx <= int64_t(kMaxCtx), "context size {} must be between 4 and {}", n_ctx, kMaxCtx);
  QWEN36_CHECK(n_tokens >= n_ctx, "the text has {} tokens: at least one chunk of {} (-c) is needed", n_tokens, n_ctx);
  ChunkPlan p;
  p.n_ctx = n_ctx;
  p.n_chunks = n_tokens / n_ctx;
  if (max_chunks > 0) p.n_chunks = std::min(p.n_chunks, max_chunks);
  p.first = n_ctx / 2;
  return p;
}

double log_sum_exp(std::span<const float> row) {
  QWEN36_CHECK(!row.empty(), "empty logits row");
  const float mx = *std::max_element(row.begin(), row.end());
  QWEN36_CHECK(std::isfinite(mx), "logits row is not finite (max {})", mx);
  double s = 0;
  for (float x : row) s += std::exp(double(x) - double(mx));
  return double(mx) + std::log(s);
}

RowScore score_row(std::span<const float> logits, int32_t target) {
  check_target(target, logits.size());
  const double lse = log_sum_exp(logits);
  RowScore r;
  r.argmax = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  r.nll = -double(row_logprob(logits[size_t(target)], lse));
  r.p_target = std::exp(-r.nll);
  return r;
}

double MeanAccumulator::error() const {
  if (n_ < 2) return 0.0;
  const double m = mean();
  const double var = std::max(0.0, sum2_ / double(n_) - m * m);
  return std::sqrt(var / double(n_ - 1));
}

KldRecord make_kld_record(std::span<const float> logits, int32_t target, int32_t top_k) {
  check_target(target, logits.size());
  QWEN36_CHECK(top_k >= 1, "top-k {} must be at least 1", top_k);
  const double lse = log_sum_exp(logits);
  const size_t k = std::min(size_t(top_k), logits.size());
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(k), ids.end(), [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  });
  KldRecord r;
  r.target_logprob = row_logprob(logits[size_t(target)], lse);
  r.top_ids.assign(ids.begin(), ids.begin() + std::ptrdiff_t(k));
  r.top_logprobs.resize(k);
  std::vector<uint8_t> mask(logits.size(), 0);
  for (size_t i = 0; i < k; ++i) {
    r.top_logprobs[i] = row_logprob(logits[size_t(r.top_ids[i])], lse);
    mask[size_t(r.top_ids[i])] = 1;
  }
  r.rest_logprob = rest_logprob(logits, lse, mask);
  return r;
}

RowComparison compare_row(const KldRecord& base, std::span<const float> logits, int32_t target) {
  check_target(target, logits.size());
  QWEN36_CHECK(!base.top_ids.empty() && base.top_ids.size() == base.top_logprobs.size(), "malformed KLD record");
  const double lse = log_sum_exp(logits);
  std::vector<uint8_t> mask(logits.size(), 0);
  RowComparison c;
  double kld = 0;
  for (size_t i = 0; i < base.top_ids.size(); ++i) {
    const auto id = size_t(base.top_ids[i]);
    QWEN36_CHECK(id < logits.size(), "reference token id {} is outside the vocabulary (0..{})", id,
                 logits.size() - 1);
    mask[id] = 1;
    const double lp = base.top_logprobs[i];
    const double lq = row_logprob(logits[id], lse);
    kld += std::exp(lp) * (lp - lq);
  }
  if (std::isfinite(base.rest_logprob)) {
    const double lp = base.rest_logprob;
    const double lq = rest_logprob(logits, lse, mask);
    kld += std::exp(lp) * (lp - lq);
  }
  c.kld = kld;
  c.nll = -double(row_logprob(logits[size_t(target)], lse));
  c.p_current = std::exp(-c.nll);
  c.p_base = std::exp(double(base.target_logprob));
  const auto argmax = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  c.same_top = argmax == base.top_ids[0];
  return c;
}

void KldBase::save(const std::string& path) const {
  QWEN36_CHECK(vocab > 0 && top_k >= 1 && top_k <= vocab, "KLD base: bad vocab {} / top-k {}", vocab, top_k);
  QWEN36_CHECK(tokens.size() == size_t(plan.n_chunks * plan.n_ctx), "KLD base: {} tokens for {} chunks of {}",
               tokens.size(), plan.n_chunks, plan.n_ctx);
  QWEN36_CHECK(records.size() == size_t(plan.n_scored()), "KLD base: {} records, expected {}", records.size(),
               plan.n_scored());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  QWEN36_CHECK(out.good(), "cannot write {}", path);
  out.write(kMagic, sizeof kMagic);
  put(out, kVersion);
  put(out, uint32_t(vocab));
  put(out, uint32_t(plan.n_ctx));
  put(out, uint32_t(plan.n_chunks));
  put(out, uint32_t(top_k));
  put(out, uint32_t(plan.first));
  const char zeros[32] = {};
  out.write(zeros, sizeof zeros);
  put_array(out, tokens);
  for (const KldRecord& r : records) {
    QWEN36_CHECK(r.top_ids.size() == size_t(top_k) && r.top_logprobs.size() == size_t(top_k),
                 "KLD base: a record has {} entries, expected {}", r.top_ids.size(), top_k);
    put(out, r.target_logprob);
    put(out, r.rest_logprob);
    put_array(out, r.top_ids);
    put_array(out, r.top_logprobs);
  }
  out.flush();
  QWEN36_CHECK(out.good(), "error writing {}", path);
}

KldBase KldBase::load(const std::string& path) {
  return with_context(path, [&] {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    QWEN36_CHECK(in.good(), "cannot open the KLD base file");
    const auto file_size = int64_t(in.tellg());
    in.seekg(0);
    QWEN36_CHECK(file_size >= kHeaderBytes, "not a KLD base file ({} bytes, shorter than its header)", file_size);
    char header[kHeaderBytes];
    in.read(header, kHeaderBytes);
    QWEN36_CHECK(in.good(), "cannot read the header");
    QWEN36_CHECK(std::memcmp(header, kMagic, sizeof kMagic) == 0, "not a KLD base file (bad magic)");
    uint32_t f[6];
    std::memcpy(f, header + 8, sizeof f);
    QWEN36_CHECK(f[0] == kVersion, "KLD base version {} is not supported (expected {})", f[0], kVersion);
    const uint32_t vocab = f[1], n_ctx = f[2], n_chunks = f[3], top_k = f[4], first = f[5];
    QWEN36_CHECK(vocab >= 1 && vocab <= kMaxVocab, "vocabulary size {} out of range", vocab);
    QWEN36_CHECK(n_ctx >= 4 && n_ctx <= kMaxCtx, "context size {} out of range", n_ctx);
    QWEN36_CHECK(first == n_ctx / 2, "first scored row {} is not n_ctx/2 = {}", first, n_ctx / 2);
    QWEN36_CHECK(top_k >= 1 && top_k <= vocab, "top-k {} out of range 1..{}", top_k, vocab);
    QWEN36_CHECK(n_chunks >= 1, "no chunks");
    for (int i = 32; i < kHeaderBytes; ++i) QWEN36_CHECK(header[i] == 0, "reserved header bytes are not zero");
    // Every quantity below is bounded by the caps above, so int64 cannot overflow.
    KldBase b;
    b.vocab = int32_t(vocab);
    b.top_k = int32_t(top_k);
    b.plan = ChunkPlan{int64_t(n_ctx), int64_t(n_chunks), int64_t(first)};
    const int64_t record_bytes = 8 + 8 * int64_t(top_k);
    const int64_t body = file_size - kHeaderBytes;
    QWEN36_CHECK(int64_t(n_chunks) <= body / (4 * int64_t(n_ctx)), "file too short for {} chunks of {}", n_chunks,
                 n_ctx);
    const int64_t n_tokens = int64_t(n_chunks) * n_ctx;
    const int64_t n_records = b.plan.n_scored();
    QWEN36_CHECK(n_records <= (body - 4 * n_tokens) / record_bytes, "file too short for {} records", n_records);
    const int64_t expected = kHeaderBytes + 4 * n_tokens + n_records * record_bytes;
    QWEN36_CHECK(file_size == expected, "file size {} does not match its header (expected {})", file_size, expected);
    b.tokens.resize(size_t(n_tokens));
    in.read(reinterpret_cast<char*>(b.tokens.data()), std::streamsize(4 * n_tokens));
    QWEN36_CHECK(in.good(), "cannot read the tokens");
    for (int32_t t : b.tokens) QWEN36_CHECK(t >= 0 && uint32_t(t) < vocab, "token id {} outside the vocabulary", t);
    b.records.resize(size_t(n_records));
    for (KldRecord& r : b.records) {
      in.read(reinterpret_cast<char*>(&r.target_logprob), 4);
      in.read(reinterpret_cast<char*>(&r.rest_logprob), 4);
      r.top_ids.resize(top_k);
      r.top_logprobs.resize(top_k);
      in.read(reinterpret_cast<char*>(r.top_ids.data()), std::streamsize(4 * top_k));
      in.read(reinterpret_cast<char*>(r.top_logprobs.data()), std::streamsize(4 * top_k));
      QWEN36_CHECK(in.good(), "cannot read the records");
      QWEN36_CHECK(std::isfinite(r.target_logprob) && r.target_logprob <= 0, "bad target log-probability {}",
                   r.target_logprob);
      QWEN36_CHECK(r.rest_logprob <= 0 && !std::isnan(r.rest_logprob), "bad rest log-probability {}", r.rest_logprob);
      for (uint32_t i = 0; i < top_k; ++i) {
        QWEN36_CHECK(r.top_ids[i] >= 0 && uint32_t(r.top_ids[i]) < vocab, "record token id {} outside the vocabulary",
                     r.top_ids[i]);
        QWEN36_CHECK(std::isfinite(r.top_logprobs[i]) && r.top_logprobs[i] <= 0, "bad log-probability {}",
                     r.top_logprobs[i]);
      }
    }
    return b;
  });
}

double percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double pos = std::clamp(q, 0.0, 1.0) * double(v.size() - 1);
  const auto lo = size_t(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - double(lo)) * (v[hi] - v[lo]);
}

void KldStats::add(const RowComparison& c, double nll_base) {
  kld_.push_back(c.kld);
  kld_acc_.add(c.kld);
  nll_base_.add(nll_base);
  nll_cur_.add(c.nll);
  ln_ratio_.add(c.nll - nll_base);
  const double dp = c.p_current - c.p_base;
  dp_.add(dp);
  dp2_ += dp * dp;
  same_top_ += c.same_top ? 1 : 0;
}

KldStats::Summary KldStats::summary() const {
  Summary s;
  s.n = kld_acc_.count();
  if (s.n == 0) return s;
  s.kld_mean = kld_acc_.mean();
  s.kld_err = kld_acc_.error();
  std::vector<double> v = kld_;
  s.kld_min = percentile(v, 0.0);
  s.kld_median = percentile(v, 0.5);
  s.kld_p90 = percentile(v, 0.90);
  s.kld_p95 = percentile(v, 0.95);
  s.kld_p99 = percentile(v, 0.99);
  s.kld_max = percentile(v, 1.0);
  const double p = double(same_top_) / double(s.n);
  s.top1_pct = 100.0 * p;
  s.top1_err_pct = s.n > 1 ? 100.0 * std::sqrt(p * (1 - p) / double(s.n - 1)) : 0.0;
  s.ppl_base = std::exp(nll_base_.mean());
  s.ppl_base_err = s.ppl_base * nll_base_.error();
  s.ppl_current = std::exp(nll_cur_.mean());
  s.ppl_current_err = s.ppl_current * nll_cur_.error();
  s.ln_ppl_ratio = ln_ratio_.mean();
  s.ln_ppl_ratio_err = ln_ratio_.error();
  s.dp_mean = dp_.mean();
  s.dp_err = dp_.error();
  s.dp_rms = std::sqrt(dp2_ / double(s.n));
  return s;
}

ChunkLogitsFn model_chunk_logits(Model& model, DType kv_type, DType state_type, int64_t ubatch) {
  return [&model, kv_type, state_type, ubatch](std::span<const int32_t> chunk, int64_t first_row, int64_t n_rows,
                                               float* out) {
    const int64_t n = int64_t(chunk.size());
    QWEN36_CHECK(first_row >= 0 && n_rows >= 1 && first_row + n_rows <= n, "rows {}..{} outside a chunk of {}",
                 first_row, first_row + n_rows - 1, n);
    ModelState state(model.backend(), model.config(), 1, n, false, kv_type, state_type);
    const int64_t step = ubatch > 0 ? ubatch : n, vocab = model.config().vocab_size;
    for (int64_t p0 = 0; p0 < n; p0 += step) {
      const int64_t cnt = std::min(step, n - p0);
      ForwardBatch b;
      b.tokens.assign(chunk.begin() + p0, chunk.begin() + p0 + cnt);
      b.runs.push_back({0, int32_t(p0), 0, int32_t(cnt)});
      const int64_t lo = std::max(first_row, p0), hi = std::min(first_row + n_rows, p0 + cnt);  // scored rows here
      for (int64_t r = lo; r < hi; ++r) b.output_rows.push_back(int32_t(r - p0));
      model.forward(b, state, b.output_rows.empty() ? nullptr : out + (lo - first_row) * vocab);
    }
  };
}

double PerplexityResult::ppl() const { return std::exp(nll.mean()); }
double PerplexityResult::ppl_error() const { return ppl() * nll.error(); }

PerplexityResult run_perplexity(const ChunkLogitsFn& eval, const PerplexityJob& job) {
  QWEN36_CHECK(job.vocab >= 1, "vocabulary size {} must be positive", job.vocab);
  std::span<const int32_t> tokens = job.tokens;
  PerplexityResult res;
  res.plan = job.plan;
  if (job.compare) {
    QWEN36_CHECK(job.compare->vocab == job.vocab,
                 "the KLD base was saved from a model with {} tokens in its vocabulary, this model has {}",
                 job.compare->vocab, job.vocab);
    QWEN36_CHECK(job.save == nullptr, "cannot save and compare a KLD base in one run");
    tokens = job.compare->tokens;
    res.plan = job.compare->plan;
    res.kld.emplace();
  }
  const ChunkPlan& plan = res.plan;
  QWEN36_CHECK(plan.n_ctx >= 4 && plan.first == plan.n_ctx / 2 && plan.n_chunks >= 1 &&
                   int64_t(tokens.size()) >= plan.n_chunks * plan.n_ctx,
               "bad chunk plan: {} chunks of {} over {} tokens", plan.n_chunks, plan.n_ctx, tokens.size());
  for (int64_t i = 0; i < plan.n_chunks * plan.n_ctx; ++i) check_target(tokens[size_t(i)], size_t(job.vocab));
  if (job.save) {
    job.save->vocab = job.vocab;
    job.save->plan = plan;
    job.save->top_k = std::min(job.save_top_k, job.vocab);
    job.save->tokens.assign(tokens.begin(), tokens.begin() + std::ptrdiff_t(plan.n_chunks * plan.n_ctx));
    job.save->records.clear();
    job.save->records.reserve(size_t(plan.n_scored()));
  }
  const int64_t n_rows = plan.scored_per_chunk();
  const auto V = size_t(job.vocab);
  std::vector<float> logits(size_t(n_rows) * V);
  for (int64_t c = 0; c < plan.n_chunks; ++c) {
    const std::span<const int32_t> chunk = tokens.subspan(size_t(c * plan.n_ctx), size_t(plan.n_ctx));
    eval(chunk, plan.first, n_rows, logits.data());
    MeanAccumulator chunk_nll;
    for (int64_t r = 0; r < n_rows; ++r) {
      const std::span<const float> row(logits.data() + size_t(r) * V, V);
      const int32_t target = chunk[size_t(plan.first + r + 1)];
      double nll;
      if (job.compare) {
        const KldRecord& base = job.compare->records[size_t(c * n_rows + r)];
        const RowComparison cmp = compare_row(base, row, target);
        res.kld->add(cmp, -double(base.target_logprob));
        nll = cmp.nll;
      } else {
        nll = score_row(row, target).nll;
        if (job.save) job.save->records.push_back(make_kld_record(row, target, job.save->top_k));
      }
      chunk_nll.add(nll);
      res.nll.add(nll);
    }
    res.chunk_ppl.push_back(std::exp(chunk_nll.mean()));
    if (job.on_chunk) job.on_chunk(res, c);
  }
  return res;
}

}  // namespace qwen36
