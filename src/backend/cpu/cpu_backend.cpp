// The CPU backend: host memory and the reference ops of backend/cpu/cpu_ops.h.
#include <omp.h>

#include <cstring>
#include <limits>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"

namespace qwen36 {

namespace {

class HostDeviceBuffer final : public DeviceBuffer {
 public:
  explicit HostDeviceBuffer(size_t bytes) : buf_(bytes) {}
  void* data() const override { return buf_.data(); }
  size_t size() const override { return buf_.size(); }

 private:
  HostBuffer buf_;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) {
    if (threads > 0) omp_set_num_threads(threads);
  }
  std::string name() const override { return "cpu"; }

  std::unique_ptr<DeviceBuffer> alloc(size_t bytes) override { return std::make_unique<HostDeviceBuffer>(bytes); }
  void copy_to_host(const Tensor& src, void* dst) override { std::memcpy(dst, src.data, src.nbytes()); }
  void copy_from_host(const void* src, Tensor& dst) override { std::memcpy(dst.data, src, dst.nbytes()); }
  // Backend memory is host memory: an upload is a copy done at once (pin_host_memory: the default).
  void upload(const void* src, void* dst, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void fill_zero(Tensor& t) override { std::memset(t.data, 0, t.nbytes()); }
  void copy(const Tensor& src, Tensor& dst) override {
    QWEN36_CHECK(src.dtype == dst.dtype && src.numel() == dst.numel(), "copy: {} → {}", src.shape_str(),
                 dst.shape_str());
    std::memcpy(dst.data, src.data, src.nbytes());
  }
  void copy_cols(const Tensor& src, int64_t src_col0, Tensor& dst, int64_t dst_col0, int64_t width) override {
    cpu::copy_cols(src, src_col0, dst, dst_col0, width);
  }
  void get_rows(const Tensor& src, std::span<const int32_t> rows, Tensor& dst) override {
    cpu::get_rows(src, rows, dst);
  }
  void prepare_weights(ModelWeights&) override {}  // the CPU reads weights where they are mapped

  void embed(const Tensor& table, std::span<const int32_t> ids, Tensor& out) override { cpu::embed(table, ids, out); }
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override { cpu::rms_norm(x, w, eps, out); }
  void gated_rms_norm(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Tensor& out) override {
    cpu::gated_rms_norm(x, z, w, eps, out);
  }
  void add(Tensor& y, const Tensor& x) override { cpu::add(y, x); }
  void add_rms_norm(Tensor& y, const Tensor& delta, const Tensor& w, float eps, Tensor& out) override {
    cpu::add_rms_norm_into(y, delta, y, w, eps, out);
  }
  void add_rms_norm_into(const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w, float eps,
                         Tensor& out) override {
    cpu::add_rms_norm_into(y, delta, y_out, w, eps, out);
  }
  void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) override { cpu::swiglu(gate, up, out); }
  void sigmoid_mul(Tensor& x, const Tensor& gate) override { cpu::sigmoid_mul(x, gate); }
  void add_sigmoid_scaled(Tensor& y, const Tensor& x, const Tensor& s) override { cpu::add_sigmoid_scaled(y, x, s); }
  void matmul(const Tensor& x, const Tensor& w, Tensor& out) override { cpu::matmul(x, w, out); }
  void split_q_gate(const Tensor& qg, Tensor& q, Tensor& gate) override { cpu::split_q_gate(qg, q, gate); }
  void rope(Tensor& x, std::span<const SeqRun> runs, int64_t rotary_dim, float theta) override {
    cpu::rope(x, runs, rotary_dim, theta);
  }
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache,
                 std::span<const SeqRun> runs, float scale, Tensor& out) override {
    cpu::attention(q, k, v, k_cache, v_cache, runs, scale, out);
  }
  void causal_conv1d_silu(Tensor& x, const Tensor& w, Tensor& conv_state, std::span<const SeqRun> runs) override {
    cpu::causal_conv1d_silu(x, w, conv_state, runs);
  }
  void deltanet_gates(const Tensor& a, const Tensor& b, const Tensor& a_neg_exp, const Tensor& dt_bias, Tensor& g,
                      Tensor& beta) override {
    cpu::deltanet_gates(a, b, a_neg_exp, dt_bias, g, beta);
  }
  void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                        Tensor& state, std::span<const SeqRun> runs, Tensor& out, DeltaRuleMode mode) override {
    cpu::gated_delta_rule(q, k, v, g, beta, state, runs, out, mode);
  }
  void causal_conv1d_silu_readonly(Tensor& x, const Tensor& w, const Tensor& conv_state,
                                   std::span<const SeqRun> runs) override {
    cpu::causal_conv1d_silu_readonly(x, w, conv_state, runs);
  }
  void gated_delta_rule_readonly(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                 const Tensor& beta, const Tensor& state, std::span<const SeqRun> runs,
                                 Tensor& out) override {
    cpu::gated_delta_rule_readonly(q, k, v, g, beta, state, runs, out);
  }

  void moe_local_ids(Tensor& ids, int64_t e0, int64_t n) override { cpu::moe_local_ids(ids, e0, n); }
  void moe_route(const Tensor& logits, int64_t k, bool renorm, Tensor& weights, Tensor& ids) override {
    cpu::moe_route(logits, k, renorm, weights, ids);
  }
  void moe_experts(const Tensor& x, const Tensor& weights, const Tensor& ids, std::span<const MlpWeights> experts,
                   Tensor& out) override {
    cpu::moe_experts(x, weights, ids, experts, out);
  }
  bool moe_expert_rows(const Tensor& x, const Tensor& ids, std::span<const MlpWeights> experts, Tensor& rows) override {
    return cpu::moe_expert_rows(x, ids, experts, rows);
  }
  void moe_combine_rows(const Tensor& rows, const Tensor& weights, const Tensor& ids, int64_t E, const Tensor* sh_row,
                        const Tensor* s, Tensor& out) override {
    cpu::moe_combine_rows(rows, weights, ids, E, sh_row, s, out);
  }
  // cpu::moe_experts sums rows so (MoePass's exact path) at any size.
  int64_t moe_row_pairs() const override { return std::numeric_limits<int64_t>::max(); }
  void sample_candidates(Tensor& logits, std::span<const SampleRowParams> rows, std::span<const PenaltyEntry> penalties,
                         int32_t k, int32_t* ids, float* vals, float* stats) override {
    cpu::sample_candidates(logits, rows, penalties, k, ids, vals, stats);
  }
  void argmax_rows(const Tensor& logits, Tensor& ids) override { cpu::argmax_rows(logits, ids); }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(threads); }

}  // namespace qwen36
