// Mixture of experts on the CPU: softmax → top-k → renormalise routing, and the routed
// SwiGLU experts. Tokens are grouped by expert so each expert's weights are read once per
// batch rather than once per token.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <numeric>
#include <string_view>
#include <vector>

#include <fmt/ranges.h>
#include <omp.h>

#include "backend/cpu/cpu_moe_pass.h"
#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "core/portable_exp.h"
#include "quant/cpu_dot.h"
#include "quant/cpu_dot_exact.h"
#include "quant/cpu_dot_g32.h"

namespace qwen36::cpu {

void moe_route(const Tensor& logits, int64_t k, bool renorm, Tensor& weights, Tensor& ids) {
  const int64_t E = logits.cols(), T = logits.rows();
  QWEN36_CHECK(k > 0 && k <= E && weights.numel() == T * k && ids.numel() == T * k && ids.dtype == DType::I32,
               "moe_route: logits {} top-{} into {} / {}", logits.shape_str(), k, weights.shape_str(), ids.shape_str());
  std::vector<float> p(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits.as<const float>() + t * E;
    const float mx = *std::max_element(l, l + E);
    float sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += p[size_t(e)] = std::exp(l[e] - mx);
    for (auto& x : p) x /= sum;
    // Highest probability first; ties go to the lower expert id.
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return p[size_t(a)] > p[size_t(b)] || (p[size_t(a)] == p[size_t(b)] && a < b);
    });
    float top = 0;
    for (int64_t j = 0; j < k; ++j) top += p[size_t(order[size_t(j)])];
    for (int64_t j = 0; j < k; ++j) {
      ids.as<int32_t>()[t * k + j] = order[size_t(j)];
      weights.as<float>()[t * k + j] = renorm ? p[size_t(order[size_t(j)])] / top : p[size_t(order[size_t(j)])];
    }
  }
}

void moe_local_ids(Tensor& ids, int64_t e0, int64_t n) {
  QWEN36_CHECK(ids.dtype == DType::I32 && e0 >= 0 && n >= 1, "moe_local_ids: {} experts {}..+{}", ids.shape_str(), e0, n);
  int32_t* p = ids.as<int32_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) p[i] = p[i] >= e0 && p[i] < e0 + n ? int32_t(p[i] - e0) : -1;
}

namespace {

// The routed (token, weight) pairs, grouped by expert in ascending expert order (tokens
// ascending within an expert): pairs off[e] .. off[e + 1] − 1 go to expert e. Id −1 (an expert
// another rank holds: moe_local_ids) makes no pair.
struct Pairs {
  std::vector<int64_t> off, tok;
  std::vector<float> w;
};
Pairs route_pairs(const Tensor& weights, const Tensor& ids, int64_t E) {
  const int64_t T = ids.rows(), k = ids.cols();
  Pairs p;
  p.off.assign(size_t(E + 1), 0);
  for (int64_t i = 0; i < T * k; ++i) {
    const int32_t e = ids.as<const int32_t>()[i];
    QWEN36_CHECK(e >= -1 && e < E, "moe_experts: expert id {} out of range", e);
    if (e >= 0) ++p.off[size_t(e) + 1];
  }
  for (int64_t e = 0; e < E; ++e) p.off[size_t(e + 1)] += p.off[size_t(e)];
  std::vector<int64_t> fill(p.off.begin(), p.off.end() - 1);
  p.tok.resize(size_t(p.off.back()));
  p.w.resize(size_t(p.off.back()));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ids.as<const int32_t>()[t * k + j];
      if (e < 0) continue;
      const int64_t q = fill[size_t(e)]++;
      p.tok[size_t(q)] = t;
      p.w[size_t(q)] = weights.as<const float>()[t * k + j];
    }
  return p;
}

// The routed experts' matrices all multiply 8-bit activations (GGUF block types), gate and up
// one activation type and down one: the fused pass below applies. Otherwise (bf16 / f32 / HF
// experts, or mixed activation types) each expert goes through matmul.
bool integer_experts(std::span<const MlpWeights> experts, const Pairs& p, DType& act_in, DType& act_mid) {
  act_in = act_mid = DType::F32;
  for (size_t e = 0; e < experts.size(); ++e) {
    if (p.off[e] == p.off[e + 1]) continue;
    const MlpWeights& m = experts[e];
    const DType gi = dot_activation_type(m.gate_proj.dtype), ui = dot_activation_type(m.up_proj.dtype),
                di = dot_activation_type(m.down_proj.dtype);
    if (!dtype_is_quantized(m.gate_proj.dtype) || !dtype_is_quantized(m.down_proj.dtype) || gi == DType::F32 ||
        di == DType::F32 || ui != gi || (act_in != DType::F32 && (gi != act_in || di != act_mid)))
      return false;
    act_in = gi, act_mid = di;
  }
  return act_in != DType::F32;
}

// An environment switch: its value, one of `allowed` (the first when unset).
std::string_view env_choice(const char* name, std::initializer_list<std::string_view> allowed) {
  const char* e = std::getenv(name);
  const std::string_view v = e && *e ? e : *allowed.begin();
  QWEN36_CHECK(std::find(allowed.begin(), allowed.end(), v) != allowed.end(), "{}=\"{}\": expected one of {}", name,
               v, fmt::join(allowed, ", "));
  return v;
}

// QWEN36_MOE_CPU_ACT=q8 gives routed experts the CPU's own Q8_K / Q8_0 activations (llama.cpp's
// form: one integer sum per 256 values, fewer float operations per weight row) instead of the
// CUDA backend's per-32 ones (=device, the default); host-placed experts of expert offload then
// differ from the GPU's kernels by the activation rounding (~5e-3 of an output) rather than
// not at all.
bool device_activations() {
  static const bool device = env_choice("QWEN36_MOE_CPU_ACT", {"device", "q8"}) == "device";
  return device;
}

// QWEN36_MOE_EXACT=0 leaves the exact path (cpu_dot_exact.h) for dot_row_g32's own summation
// order (and expert offload for its other path: model/expert_offload.cpp). Read at every pass
// (~0.1 µs), so that tests can compare the two paths in one process.
bool exact_enabled() { return env_choice("QWEN36_MOE_EXACT", {"1", "0"}) == "1"; }

// Whether all three matrices of every routed expert (one that some pair goes to) are of a type
// `supported` takes.
bool routed_experts_are(std::span<const MlpWeights> experts, const Pairs& p, bool (*supported)(DType)) {
  for (size_t e = 0; e < experts.size(); ++e) {
    const MlpWeights& m = experts[e];
    if (p.off[e] != p.off[e + 1] &&
        !(supported(m.gate_proj.dtype) && supported(m.up_proj.dtype) && supported(m.down_proj.dtype)))
      return false;
  }
  return true;
}

// Whether every routed expert's matrices have a kernel against the CUDA backend's per-32
// activations (cpu_dot_g32.h), D and I multiples of 256.
bool g32_experts(std::span<const MlpWeights> experts, const Pairs& p, int64_t D, int64_t I) {
  return D % 256 == 0 && I % 256 == 0 && device_activations() && routed_experts_are(experts, p, dot_g32_supported);
}

// Whether every routed expert's matrices are of a type the GPU tiles (cpu_dot_exact.h).
bool exact_experts(std::span<const MlpWeights> experts, const Pairs& p) {
  return exact_enabled() && routed_experts_are(experts, p, dot_exact_supported);
}

// Runs a pass's phases on an OpenMP team, a barrier between phases. Items go one at a time: a
// one-token pass has only ~10 gate / up items a thread, and in fours the last ones left threads
// idle. (With more threads than free cores the barriers stall: 2 threads on a busy 2-core
// machine took 27 ms where one took 1.3; hence never more than omp_get_max_threads.)
void run_on_team(MoePass& pass) {
  const int threads = int(std::clamp<int64_t>(pass.useful_threads(), 1, omp_get_max_threads()));
#pragma omp parallel num_threads(threads)
  for (int phase = 0; phase < MoePass::kPhases; ++phase) {
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < pass.items(phase); ++it) pass.run(phase, it);
  }
}

}  // namespace

std::unique_ptr<MoePass> MoePass::make(const Tensor& x, const Tensor& weights, const Tensor& ids,
                                       std::span<const MlpWeights> experts, Tensor& out) {
  return make(x, weights, ids, experts, out, /*rows=*/false);
}

std::unique_ptr<MoePass> MoePass::make(const Tensor& x, const Tensor& weights, const Tensor& ids,
                                       std::span<const MlpWeights> experts, Tensor& out, bool rows) {
  const int64_t D = x.cols(), T = x.rows(), E = int64_t(experts.size());
  Pairs p = route_pairs(weights, ids, E);
  DType act_in, act_mid;
  if (p.tok.empty() || !integer_experts(experts, p, act_in, act_mid)) return nullptr;
  std::unique_ptr<MoePass> m(new MoePass());
  int64_t I = -1;  // every routed expert's intermediate size (the first one's)
  for (int64_t e = 0; e < E; ++e) {
    if (p.off[size_t(e)] == p.off[size_t(e) + 1]) continue;
    const MlpWeights& w = experts[size_t(e)];
    if (I < 0) I = w.gate_proj.rows();
    QWEN36_CHECK(w.gate_proj.rows() == I && w.up_proj.rows() == I && w.gate_proj.cols() == D &&
                     w.down_proj.rows() == D && w.down_proj.cols() == I,
                 "moe_experts: expert {} is {} / {} / {} for hidden {}", e, w.gate_proj.shape_str(),
                 w.up_proj.shape_str(), w.down_proj.shape_str(), D);
    for (int64_t r = 0; r < I; r += kRows) m->mid_items_.emplace_back(e, r);
    for (int64_t r = 0; r < D; r += kRows) m->out_items_.emplace_back(e, r);
  }
  const int64_t P = int64_t(p.tok.size());
  m->experts_ = experts;
  m->x_ = x.as<const float>();
  m->out_ = out.as<float>();
  m->T_ = T, m->D_ = D, m->I_ = I, m->dots_ = P * (2 * I + D);
  m->act_in_ = act_in, m->act_mid_ = act_mid;
  m->g32_ = g32_experts(experts, p, D, I);
  m->exact_ = m->g32_ && exact_experts(experts, p);
  if (rows && !m->exact_) return nullptr;
  m->rows_ = rows;
  m->xrow_ = m->g32_ ? g32_row_bytes(D) : dtype_row_bytes(act_in, D);
  m->arow_ = m->g32_ ? g32_row_bytes(I) : dtype_row_bytes(act_mid, I);
  m->xq_.resize(size_t(T) * m->xrow_);
  m->aq_.resize(size_t(P) * m->arow_);
  m->gate_.resize(size_t(P * I)), m->up_.resize(size_t(P * I));
  if (!rows) m->y_.resize(size_t(P * D));  // rows: down writes into out
  // A token's pairs: in ascending expert order (the pair list is expert-major), or on the exact
  // path in routing order, as the GPU's down kernel adds them (pair q of (t, j) found as
  // route_pairs numbered it: tokens ascending within an expert).
  m->tok_off_.assign(size_t(T + 1), 0);
  m->tok_pairs_.resize(size_t(P));
  for (int64_t q = 0; q < P; ++q) ++m->tok_off_[size_t(p.tok[size_t(q)]) + 1];
  for (int64_t t = 0; t < T; ++t) m->tok_off_[size_t(t + 1)] += m->tok_off_[size_t(t)];
  if (m->exact_) {
    std::vector<int64_t> next(p.off.begin(), p.off.end() - 1);
    const int64_t k = ids.cols();
    m->row_of_.resize(size_t(P));
    for (int64_t t = 0, i = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j)
        if (const int32_t e = ids.as<const int32_t>()[t * k + j]; e >= 0) {
          const int64_t q = next[size_t(e)]++;
          m->tok_pairs_[size_t(i++)] = q;
          m->row_of_[size_t(q)] = t * k + j;
        }
  } else {
    std::vector<int64_t> fill(m->tok_off_.begin(), m->tok_off_.end() - 1);
    for (int64_t q = 0; q < P; ++q) m->tok_pairs_[size_t(fill[size_t(p.tok[size_t(q)])]++)] = q;
  }
  m->off_ = std::move(p.off), m->tok_ = std::move(p.tok), m->w_ = std::move(p.w);
  const int64_t n[kPhases] = {T, int64_t(m->mid_items_.size()), P, int64_t(m->out_items_.size()), rows ? 0 : T};
  std::copy(n, n + kPhases, m->n_items_);
  return m;
}

bool MoePass::exact_for(std::span<const MlpWeights> experts) {
  if (experts.empty() || !device_activations() || !exact_enabled()) return false;
  return std::all_of(experts.begin(), experts.end(), [&](const MlpWeights& m) {
    return dot_exact_supported(m.gate_proj.dtype) && dot_exact_supported(m.up_proj.dtype) &&
           dot_exact_supported(m.down_proj.dtype) && m.gate_proj.cols() % 256 == 0 && m.down_proj.cols() % 256 == 0;
  });
}

std::unique_ptr<MoePass> MoePass::make_rows(const Tensor& x, const Tensor& ids, std::span<const MlpWeights> experts,
                                            Tensor& rows) {
  const int64_t T = x.rows(), k = ids.cols();
  QWEN36_CHECK(rows.dtype == DType::F32 && rows.numel() == T * k * x.cols() && ids.rows() == T,
               "moe_expert_rows: x {} ids {} rows {}", x.shape_str(), ids.shape_str(), rows.shape_str());
  std::vector<float> ones(size_t(T * k), 1.0f);  // read by make only (the pairs' weights: unused here)
  const Tensor w(ones.data(), DType::F32, {T, k});
  return make(x, w, ids, experts, rows, /*rows=*/true);
}

void MoePass::run(int phase, int64_t item) noexcept {
  switch (phase) {
    case 0:
      return quantize(act_in_, x_ + item * D_, xq_.data() + size_t(item) * xrow_, D_);
    case 1:
      return gate_up(item);
    case 2:
      return mid(item);
    case 3:
      return down(item);
    default:
      return sum(item);
  }
}

void MoePass::quantize(DType act, const float* x, std::byte* dst, int64_t n) const noexcept {
  if (g32_)
    quantize_activation_g32(x, dst, n);
  else
    quantize_activation(act, x, dst, n);
}

float MoePass::dot(DType wt, const void* w, const std::byte* a, int64_t n) const noexcept {
  return g32_ ? dot_row_g32(wt, w, a, n) : dot_row(wt, w, a, n);
}

void MoePass::gate_up(int64_t item) noexcept {
  const auto [e, r0] = mid_items_[size_t(item)];
  const MlpWeights& m = experts_[size_t(e)];
  if (exact_) {
    const int rows = int(std::min(kRows, I_ - r0));
    for (int64_t q = off_[size_t(e)]; q < off_[size_t(e) + 1]; ++q) {
      const auto* a = reinterpret_cast<const BlockQ8G32*>(xq_.data() + size_t(tok_[size_t(q)]) * xrow_);
      dot_rows_exact(m.gate_proj.dtype, m.gate_proj.row(r0), dtype_row_bytes(m.gate_proj.dtype, D_), rows, a, D_,
                     gate_.data() + q * I_ + r0);
      dot_rows_exact(m.up_proj.dtype, m.up_proj.row(r0), dtype_row_bytes(m.up_proj.dtype, D_), rows, a, D_,
                     up_.data() + q * I_ + r0);
    }
    return;
  }
  for (int64_t r = r0; r < std::min(r0 + kRows, I_); ++r)
    for (int64_t q = off_[size_t(e)]; q < off_[size_t(e) + 1]; ++q) {
      const std::byte* a = xq_.data() + size_t(tok_[size_t(q)]) * xrow_;
      gate_[size_t(q * I_ + r)] = dot(m.gate_proj.dtype, m.gate_proj.row(r), a, D_);
      up_[size_t(q * I_ + r)] = dot(m.up_proj.dtype, m.up_proj.row(r), a, D_);
    }
}

void MoePass::mid(int64_t q) noexcept {
  Tensor g(gate_.data() + q * I_, DType::F32, {1, I_});
  const Tensor u(up_.data() + q * I_, DType::F32, {1, I_});
  if (exact_) {
    float* gv = g.as<float>();
    for (int64_t i = 0; i < I_; ++i) gv[i] = silu_portable(gv[i]) * up_[size_t(q * I_ + i)];
  } else {
    swiglu(g, u, g);
  }
  quantize(act_mid_, g.as<const float>(), aq_.data() + size_t(q) * arow_, I_);
}

void MoePass::down(int64_t item) noexcept {
  const auto [e, r0] = out_items_[size_t(item)];
  const Tensor& w = experts_[size_t(e)].down_proj;
  if (exact_) {
    const int rows = int(std::min(kRows, D_ - r0));
    for (int64_t q = off_[size_t(e)]; q < off_[size_t(e) + 1]; ++q) {
      float* y = rows_ ? out_ + row_of_[size_t(q)] * D_ : y_.data() + q * D_;
      dot_rows_exact(w.dtype, w.row(r0), dtype_row_bytes(w.dtype, I_), rows,
                     reinterpret_cast<const BlockQ8G32*>(aq_.data() + size_t(q) * arow_), I_, y + r0);
    }
    return;
  }
  for (int64_t r = r0; r < std::min(r0 + kRows, D_); ++r)
    for (int64_t q = off_[size_t(e)]; q < off_[size_t(e) + 1]; ++q)
      y_[size_t(q * D_ + r)] = dot(w.dtype, w.row(r), aq_.data() + size_t(q) * arow_, I_);
}

// Each token's weighted sum is an explicit fused multiply-add (what -O3 made of `o += w * y`
// with FMA anyway), so a bitwise comparison does not depend on how a caller was compiled.
void MoePass::sum(int64_t t) noexcept {
  float* o = out_ + t * D_;
  std::fill(o, o + D_, 0.0f);
  for (int64_t i = tok_off_[size_t(t)]; i < tok_off_[size_t(t) + 1]; ++i) {
    const int64_t q = tok_pairs_[size_t(i)];
    const float wq = w_[size_t(q)];
    for (int64_t d = 0; d < D_; ++d) o[d] = std::fma(wq, y_[size_t(q * D_ + d)], o[d]);
  }
}

bool moe_expert_rows(const Tensor& x, const Tensor& ids, std::span<const MlpWeights> experts, Tensor& rows) {
  const std::unique_ptr<MoePass> pass = MoePass::make_rows(x, ids, experts, rows);
  if (!pass) return false;
  run_on_team(*pass);
  return true;
}

void moe_combine_rows(const Tensor& rows, const Tensor& weights, const Tensor& ids, int64_t E, const Tensor* sh_row,
                      const Tensor* s, Tensor& out) {
  const int64_t T = ids.rows(), k = ids.cols(), D = out.cols();
  QWEN36_CHECK(rows.numel() == T * k * D && weights.numel() == T * k && out.numel() == T * D &&
                   (!sh_row || (s && sh_row->numel() == T * D && s->numel() == T)),
               "moe_combine_rows: rows {} weights {} ids {} out {}", rows.shape_str(), weights.shape_str(),
               ids.shape_str(), out.shape_str());
  for (int64_t t = 0; t < T; ++t) {
    float* o = out.as<float>() + t * D;
    std::fill(o, o + D, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids.as<const int32_t>()[t * k + j];
      if (e < 0 || e >= E) continue;
      const float w = weights.as<const float>()[t * k + j];
      const float* y = rows.as<const float>() + (t * k + j) * D;
      for (int64_t d = 0; d < D; ++d) o[d] = std::fma(w, y[d], o[d]);
    }
    if (sh_row) {
      const float g = 1.0f / (1.0f + std::exp(-s->as<const float>()[t]));
      const float* y = sh_row->as<const float>() + t * D;
      for (int64_t d = 0; d < D; ++d) o[d] = std::fma(g, y[d], o[d]);
    }
  }
}

// Every routed expert of the pass in one parallel region (run_on_team), MoePass's phases with a
// barrier between them, instead of three fork-joins per expert: with ~250 experts a pass and 32
// threads, the fork-joins took ~5 s per 35B-A3B layer for 64 tokens on the H200 host.
void moe_experts(const Tensor& x, const Tensor& weights, const Tensor& ids, std::span<const MlpWeights> experts,
                 Tensor& out) {
  const int64_t D = x.cols(), T = x.rows();
  QWEN36_CHECK(out.numel() == T * D && ids.rows() == T && weights.numel() == ids.numel() && ids.dtype == DType::I32,
               "moe_experts: x {} weights {} ids {} out {}", x.shape_str(), weights.shape_str(), ids.shape_str(),
               out.shape_str());
  if (const std::unique_ptr<MoePass> pass = MoePass::make(x, weights, ids, experts, out)) {
    run_on_team(*pass);
    return;
  }
  const Pairs p = route_pairs(weights, ids, int64_t(experts.size()));
  if (p.tok.empty()) {  // every chosen expert is another rank's (expert parallelism)
    std::fill(out.as<float>(), out.as<float>() + T * D, 0.0f);
    return;
  }
  std::fill(out.as<float>(), out.as<float>() + T * D, 0.0f);
  std::vector<float> xs, gate, up, act, y;
  // Ascending expert order, matching the reference's accumulation order.
  for (size_t e = 0; e < experts.size(); ++e) {
    const int64_t q0 = p.off[e], n = p.off[e + 1] - q0;
    if (n == 0) continue;
    const MlpWeights& m = experts[e];
    const int64_t I = m.gate_proj.rows();
    xs.resize(size_t(n * D));
    gate.resize(size_t(n * I));
    up.resize(size_t(n * I));
    act.resize(size_t(n * I));
    y.resize(size_t(n * D));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = p.tok[size_t(q0 + i)];
      std::copy(x.as<const float>() + t * D, x.as<const float>() + (t + 1) * D, xs.data() + i * D);
    }
    Tensor tx(xs.data(), DType::F32, {n, D}), tg(gate.data(), DType::F32, {n, I}), tu(up.data(), DType::F32, {n, I}),
        ta(act.data(), DType::F32, {n, I}), ty(y.data(), DType::F32, {n, D});
    matmul(tx, m.gate_proj, tg);
    matmul(tx, m.up_proj, tu);
    swiglu(tg, tu, ta);
    matmul(ta, m.down_proj, ty);
    for (int64_t i = 0; i < n; ++i) {
      const float w = p.w[size_t(q0 + i)];
      float* o = out.as<float>() + p.tok[size_t(q0 + i)] * D;
      for (int64_t d = 0; d < D; ++d) o[d] = std::fma(w, y[size_t(i * D + d)], o[d]);
    }
  }
}

}  // namespace qwen36::cpu
