#pragma once
// defines: cpu::MoePass, one pass of GGUF-quantized routed experts as phases of independent
// items, so that any team of threads can run it — OpenMP (cpu::moe_experts) or the spinning
// workers of expert offload's decode pipeline (cpu::HostPool) — with the same bits either way.
// Activations are quantized as the CUDA backend's int8 expert kernels quantize them (per 32,
// cpu_dot_g32.h) where the experts' types allow. Experts of the types the GPU tiles (Q4_K,
// Q6_K, Q8_0) then go through the exact twin of its tiled kernels (cpu_dot_exact.h: the same
// f32 operations in the same order, SiLU by silu_portable, a token's pairs summed in routing
// order), so that experts expert offload places on the host compute bit for bit what the GPU
// would have; Q5_K experts compute it up to f32 summation order. Otherwise (or with
// QWEN36_MOE_CPU_ACT=q8) the CPU's own Q8_0 / Q8_K activations (cpu_dot.h).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace qwen36::cpu {

class MoePass {
 public:
  // Phases, each done before the next starts: x quantized (an item a token), gate / up rows
  // (16 rows of one expert an item), SwiGLU and its quantization (an item a routed pair), down
  // rows, each token's weighted sum (an item a token; in routing order on the exact path, else
  // in ascending expert order).
  static constexpr int kPhases = 5;

  // nullptr when the pass does not take this path: experts not all 8-bit-activation GGUF
  // blocks of one activation type (bf16 / f32 / HF experts: moe_experts' per-expert matmuls),
  // or no routed pair (every chosen expert another rank's). Validates ids and shapes (throws).
  // x, weights, ids and out must outlive the pass; weights and ids are read here only.
  static std::unique_ptr<MoePass> make(const Tensor& x, const Tensor& weights, const Tensor& ids,
                                       std::span<const MlpWeights> experts, Tensor& out);
  // The pass of Backend::moe_expert_rows: rows [T·k, D] gets each pair's down row, unweighted
  // (row t·k + j for ids[t, j] ≥ 0), no sums. Only on the exact path: nullptr otherwise.
  static std::unique_ptr<MoePass> make_rows(const Tensor& x, const Tensor& ids, std::span<const MlpWeights> experts,
                                            Tensor& rows);

  // Whether passes over these experts take the exact path (make_rows applies): every matrix
  // of a type cpu_dot_exact.h computes, sizes multiples of 256, QWEN36_MOE_CPU_ACT not q8,
  // QWEN36_MOE_EXACT not 0.
  static bool exact_for(std::span<const MlpWeights> experts);

  int64_t items(int phase) const { return n_items_[size_t(phase)]; }
  void run(int phase, int64_t item) noexcept;
  // The team size worth waking: ~768 row dots (~40 µs on one AVX-512 core for 35B-A3B rows)
  // a thread, so a decode pass's 5 host experts (15,360 dots) may use 20 threads. A decode pass
  // only streams the routed weights and wants every core's share of the memory bandwidth: on
  // the H200 machine's 16-core host, touched memory read at 59 GB/s with 12 threads, 77 with 16.
  int64_t useful_threads() const { return dots_ / 768; }

 private:
  MoePass() = default;
  // make, and with rows make_rows (out is then the rows; nullptr off the exact path).
  static std::unique_ptr<MoePass> make(const Tensor& x, const Tensor& weights, const Tensor& ids,
                                       std::span<const MlpWeights> experts, Tensor& out, bool rows);
  void quantize(DType act, const float* x, std::byte* dst, int64_t n) const noexcept;
  float dot(DType weight, const void* wrow, const std::byte* act, int64_t n) const noexcept;
  void gate_up(int64_t item) noexcept;
  void mid(int64_t pair) noexcept;
  void down(int64_t item) noexcept;
  void sum(int64_t token) noexcept;

  static constexpr int64_t kRows = 16;
  std::span<const MlpWeights> experts_;
  const float* x_ = nullptr;
  float* out_ = nullptr;
  int64_t T_ = 0, D_ = 0, I_ = 0, dots_ = 0;
  DType act_in_ = DType::F32, act_mid_ = DType::F32;
  bool g32_ = false;    // per-32 activations (cpu_dot_g32.h) instead of act_in_ / act_mid_
  bool exact_ = false;  // and the tiled kernels' arithmetic (cpu_dot_exact.h)
  bool rows_ = false;   // make_rows: out_ is [T·k, D], pair q's row at row_of_[q]
  std::vector<int64_t> row_of_;
  size_t xrow_ = 0, arow_ = 0;
  // The routed (token, weight) pairs grouped by expert: pairs off_[e] .. off_[e + 1] − 1.
  std::vector<int64_t> off_, tok_;
  std::vector<float> w_;
  std::vector<int64_t> tok_off_, tok_pairs_;  // a token's pairs, in the order sum() adds them
  std::vector<std::pair<int64_t, int64_t>> mid_items_, out_items_;  // (expert, first row)
  std::vector<std::byte> xq_, aq_;
  std::vector<float> gate_, up_, y_;
  int64_t n_items_[kPhases] = {};
};

}  // namespace qwen36::cpu
