#pragma once
// defines: the CPU reference implementations of every Backend operation, as free functions
// (qwen36::cpu::*). The CPU backend forwards to them; device tests compare against them.
// Shapes and semantics are documented once, in backend/backend.h.

#include <cmath>
#include <span>
#include <vector>

#include "backend/backend.h"

namespace qwen36::cpu {

void embed(const Tensor& table, std::span<const int32_t> ids, Tensor& out);
void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out);
void gated_rms_norm(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Tensor& out);
void add_rms_norm_into(const Tensor& y, const Tensor& delta, Tensor& y_out, const Tensor& w, float eps, Tensor& out);
void add(Tensor& y, const Tensor& x);
void copy_cols(const Tensor& src, int64_t src_col0, Tensor& dst, int64_t dst_col0, int64_t width);
void get_rows(const Tensor& src, std::span<const int32_t> rows, Tensor& dst);
void swiglu(const Tensor& gate, const Tensor& up, Tensor& out);
void sigmoid_mul(Tensor& x, const Tensor& gate);
void add_sigmoid_scaled(Tensor& y, const Tensor& x, const Tensor& s);

void matmul(const Tensor& x, const Tensor& w, Tensor& out);
// One weight row as f32 (any dtype the matmul accepts).
void weight_row_to_f32(const Tensor& w, int64_t row, float* out);

void split_q_gate(const Tensor& qg, Tensor& q, Tensor& gate);
void rope(Tensor& x, std::span<const SeqRun> runs, int64_t rotary_dim, float theta);
void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache,
               std::span<const SeqRun> runs, float scale, Tensor& out);

void causal_conv1d_silu(Tensor& x, const Tensor& w, Tensor& conv_state, std::span<const SeqRun> runs);
void deltanet_gates(const Tensor& a, const Tensor& b, const Tensor& a_neg_exp, const Tensor& dt_bias, Tensor& g,
                    Tensor& beta);
void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      Tensor& state, std::span<const SeqRun> runs, Tensor& out, DeltaRuleMode mode);
void causal_conv1d_silu_readonly(Tensor& x, const Tensor& w, const Tensor& conv_state, std::span<const SeqRun> runs);
void gated_delta_rule_readonly(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                               const Tensor& state, std::span<const SeqRun> runs, Tensor& out);

// A tree verify run's parents (Backend::rope_tree and the other tree ops): each token's depth,
// after checking the form (token 0 the only root, parents before children).
std::vector<int32_t> tree_depths(std::span<const int32_t> parent);

void moe_route(const Tensor& logits, int64_t k, bool renorm, Tensor& weights, Tensor& ids);
void moe_local_ids(Tensor& ids, int64_t e0, int64_t n);
void moe_experts(const Tensor& x, const Tensor& weights, const Tensor& ids, std::span<const MlpWeights> experts,
                 Tensor& out);
// Backend::moe_expert_rows (MoePass::make_rows: false where the exact path does not apply) and
// Backend::moe_combine_rows.
bool moe_expert_rows(const Tensor& x, const Tensor& ids, std::span<const MlpWeights> experts, Tensor& rows);
void moe_combine_rows(const Tensor& rows, const Tensor& weights, const Tensor& ids, int64_t E, const Tensor* sh_row,
                      const Tensor* s, Tensor& out);

void sample_candidates(Tensor& logits, std::span<const SampleRowParams> rows, std::span<const PenaltyEntry> penalties,
                       int32_t k, int32_t* ids, float* vals, float* stats);
void argmax_rows(const Tensor& logits, Tensor& ids);

// Scalar helpers shared by the CPU ops, matching torch's float32 definitions.
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }  // torch threshold 20

}  // namespace qwen36::cpu
