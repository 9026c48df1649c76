// Tree verification at model level (DDTree, ForwardBatch::verify_trees, SpecCommit::path) on
// the CPU: one verify pass over a draft tree gives every node the logits of decoding its root
// path token by token, reads the DeltaNet state without advancing it, and committing one root
// path leaves the sequence — DeltaNet state and KV rows — where decoding that path leaves it:
// the next token's logits agree. Dense (3 DeltaNet + 1 attention layer) and MoE.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "spec_test_util.h"

namespace qwen36 {
namespace {

// A tree of 8 drafts after the pending token (node 0): depths 0 1 1 2 2 2 3 3.
const std::vector<int32_t> kParent = {-1, 0, 0, 1, 1, 2, 4, 3};
const std::vector<int32_t> kTokens = {42, 7, 190, 7, 33, 250, 1, 64};
const std::vector<int32_t> kPrompt = {3, 17, 99, 4, 250, 17, 8};

std::vector<int32_t> root_path(int32_t i) {
  std::vector<int32_t> p;
  for (int32_t j = i; j >= 0; j = kParent[size_t(j)]) p.insert(p.begin(), j);
  return p;
}

float max_diff(const float* a, const float* b, int64_t n) {
  float w = 0;
  for (int64_t i = 0; i < n; ++i) w = std::max(w, std::abs(a[i] - b[i]));
  return w;
}

std::vector<float> deltanet_state(const Model& m, ModelState& s) {
  std::vector<float> out;
  for (int64_t i = 0; i < m.config().n_layers; ++i) {
    if (m.config().layer_kinds[size_t(i)] == LayerKind::FullAttention) continue;
    for (Tensor* t : {&s.conv_state(i), &s.recurrent_state(i)}) out.insert(out.end(), t->as<float>(), t->as<float>() + t->numel());
  }
  return out;
}

// The prompt, then `tokens` decoded one at a time (one slot, KV cache type kv); the last
// step's logits.
std::vector<float> decoded(Model& m, Backend& be, const std::vector<int32_t>& tokens, DType kv,
                           ModelState* keep = nullptr) {
  ModelState own(be, m.config(), 1, 64, false, kv);
  ModelState& st = keep ? *keep : own;
  std::vector<float> logits(static_cast<size_t>(m.config().vocab_size));
  m.forward(ForwardBatch::single(kPrompt, 0, 0), st, logits.data());
  for (size_t j = 0; j < tokens.size(); ++j)
    m.forward(ForwardBatch::single(std::span(&tokens[j], 1), int32_t(kPrompt.size() + j), 0), st, logits.data());
  return logits;
}

// Every KV cache type: the commit moves quantized rows (and fp8's per-row scales) as stored.
TEST(TreeVerify, EveryNodeIsItsRootPathDecodedAndTheCommitLandsOnThePath) {
  std::vector<std::pair<bool, DType>> cases;  // (MoE, KV cache type)
  for (const bool moe : {false, true})
    for (const DType kv : {DType::F32, DType::BF16, DType::Q8_0, DType::F8_E4M3}) cases.emplace_back(moe, kv);
  for (const auto& [moe, kv] : cases) {
    SCOPED_TRACE(std::string(moe ? "moe" : "dense") + ", KV " + std::string(dtype_name(kv)));
    auto be = make_cpu_backend(1);
    auto model = test::random_model(*be, 256, moe ? 5 : 4, moe);
    const int64_t V = model->config().vocab_size;
    const int32_t n = int32_t(kTokens.size()), P = int32_t(kPrompt.size());
    ModelState st(*be, model->config(), 1, 64, false, kv);
    st.enable_speculation(n);
    model->forward(ForwardBatch::single(kPrompt, 0, 0), st, nullptr);

    ForwardBatch verify;
    verify.tokens = kTokens;
    verify.runs = {{0, P, 0, n}};
    verify.verify_runs = {0};
    verify.verify_trees = {kParent};
    for (int32_t i = 0; i < n; ++i) verify.output_rows.push_back(i);
    std::vector<float> vlogits(size_t(n * V));
    const std::vector<float> before = deltanet_state(*model, st);
    model->forward(verify, st, vlogits.data());
    EXPECT_EQ(deltanet_state(*model, st), before) << "tree verify must not advance the DeltaNet state";

    for (int32_t i = 0; i < n; ++i) {
      std::vector<int32_t> toks;
      for (int32_t j : root_path(i)) toks.push_back(kTokens[size_t(j)]);
      const std::vector<float> want = decoded(*model, *be, toks, kv);
      // Matmul rounding differs between an 8-token and a 1-token batch in the last bits.
      EXPECT_LE(max_diff(vlogits.data() + size_t(i) * size_t(V), want.data(), V), 1e-4f) << "node " << i;
    }

    // Accept the path to node 6 (tokens 0, 1, 4, 6 of the run) and decode one more token.
    SpecCommit cm{0, 4, P, 0};
    std::vector<int32_t> accepted;
    for (int32_t j : root_path(6)) cm.path |= uint64_t(1) << j, accepted.push_back(kTokens[size_t(j)]);
    EXPECT_EQ(cm.path_tokens(), (std::vector<int32_t>{0, 1, 4, 6}));
    model->commit_speculative(st, std::span(&cm, 1));
    ModelState ref(*be, model->config(), 1, 64, false, kv);
    decoded(*model, *be, accepted, kv, &ref);
    EXPECT_LE(max_diff(deltanet_state(*model, st).data(), deltanet_state(*model, ref).data(), int64_t(before.size())),
              1e-5f);
    const int32_t next = 99;
    std::vector<float> got(static_cast<size_t>(V)), want(static_cast<size_t>(V));
    model->forward(ForwardBatch::single(std::span(&next, 1), P + 4, 0), st, got.data());
    model->forward(ForwardBatch::single(std::span(&next, 1), P + 4, 0), ref, want.data());
    EXPECT_LE(max_diff(got.data(), want.data(), V), 1e-4f) << "the token after the accepted path";
  }
}

// Tree verify passes of one size and several shapes at one place, repeated: from a shape's
// second sight they take Model's decode step (recorded on a device backend; here its ops run as
// they are), whose logits must be those of the ordinary pass (hidden rows asked for keep a pass
// out of the decode step), bit for bit.
TEST(TreeVerify, DecodeStepPassesEqualTheOrdinaryPass) {
  auto be = make_cpu_backend(1);
  auto model = test::random_model(*be, 256, 4, false);
  const int64_t V = model->config().vocab_size;
  const int32_t n = int32_t(kParent.size()), P = int32_t(kPrompt.size());
  const std::vector<std::vector<int32_t>> trees = {kParent, {-1, 0, 1, 2, 3, 4, 5, 6}, {-1, 0, 0, 0, 0, 0, 0, 0}};
  ModelState a(*be, model->config(), 1, 64, false), b(*be, model->config(), 1, 64, false);
  for (ModelState* st : {&a, &b}) {
    st->enable_speculation(n);
    model->forward(ForwardBatch::single(kPrompt, 0, 0), *st, nullptr);
  }
  for (size_t k = 0; k < 3 * trees.size(); ++k) {
    ForwardBatch v;
    for (int32_t j = 0; j < n; ++j) v.tokens.push_back(int32_t((int64_t(k) * 31 + j * 7 + 1) % V));
    v.runs = {{0, P, 0, n}};
    v.verify_runs = {0};
    v.verify_trees = {trees[k % trees.size()]};
    for (int32_t j = 0; j < n; ++j) v.output_rows.push_back(j);
    std::vector<float> got(size_t(n * V)), want(size_t(n * V));
    model->forward(v, a, got.data());
    v.hidden_rows = v.output_rows;
    model->forward(v, b, want.data());
    EXPECT_EQ(max_diff(got.data(), want.data(), n * V), 0.0f) << "pass " << k;
  }
}

TEST(TreeVerify, MalformedTreesAndPathsAreRefused) {
  auto be = make_cpu_backend(1);
  auto model = test::random_model(*be, 64, 1);
  ModelState st(*be, model->config(), 1, 32, false);
  st.enable_speculation(4);
  ForwardBatch b = ForwardBatch::single(std::vector<int32_t>{1, 2, 3}, 0, 0);
  b.verify_runs = {0};
  b.verify_trees = {{-1, 0}};  // two parents for three tokens
  EXPECT_THROW(model->forward(b, st, nullptr), Error);
  b.verify_trees = {{-1, 2, 0}};  // a parent after its child
  EXPECT_THROW(model->forward(b, st, nullptr), std::exception);
  SpecCommit cm{0, 2, 0, 0b110};  // no root
  EXPECT_THROW(model->commit_speculative(st, std::span(&cm, 1)), Error);
  cm = {0, 3, 0, 0b011};  // 2 tokens for keep 3
  EXPECT_THROW(model->commit_speculative(st, std::span(&cm, 1)), Error);
}

}  // namespace
}  // namespace qwen36
