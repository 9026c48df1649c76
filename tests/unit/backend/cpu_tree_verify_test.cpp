// Tree verification's reference semantics (DDTree, issue 9): the Backend's tree ops
// (backend/tree_ops.h) on the CPU backend. On random trees every token's output equals decoding
// its root path one token at a time with the plain ops on copies of the sequence's state and KV
// cache (independent of the read-only chain ops the tree ops are built from), the sequence's
// DeltaNet state is only read, token i's K/V land in cache row pos0 + i; a chain-shaped tree is
// exactly the chain ops; malformed trees are refused.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/tree_ops.h"
#include "core/error.h"
#include "cpu_ops_test_util.h"

namespace qwen36::cpu {
namespace {

using test::f32;
using test::Rng;

// The tree ops under test: the Backend defaults (backend/tree_ops.h) on the CPU backend.
Backend& cpu_backend() {
  static const std::unique_ptr<Backend> b = make_cpu_backend(1);
  return *b;
}

// Shapes: 2 slots, the tree in slot 1 after pos0 = 5 context positions, batch rows from 2 on
// (rows 0-1 belong to another run and must not be touched).
constexpr int64_t kSlots = 2, kCap = 32, kH = 4, kKVH = 2, kHd = 8, kC = 6, kConvK = 4, kHk = 2, kHv = 4, kDk = 8,
                  kDv = 8;
constexpr int32_t kSlot = 1, kPos0 = 5, kBegin = 2;

std::vector<int32_t> random_tree(Rng& r, int32_t n) {
  std::vector<int32_t> p(size_t(n), -1);
  for (int32_t i = 1; i < n; ++i) p[size_t(i)] = int32_t(r.below(i));
  return p;
}

std::vector<int32_t> path_to(const std::vector<int32_t>& parent, int32_t i) {
  std::vector<int32_t> path;
  for (int32_t j = i; j >= 0; j = parent[size_t(j)]) path.insert(path.begin(), j);
  return path;
}

struct Inputs {
  int32_t T;
  std::vector<float> q, k, v, kc, vc, x, conv_w, conv_state, dq, dk, dv, g, beta, ssm;
  explicit Inputs(Rng& r, int32_t n) : T(kBegin + n) {
    q = r.vec(size_t(T * kH * kHd)), k = r.vec(size_t(T * kKVH * kHd)), v = r.vec(size_t(T * kKVH * kHd));
    kc = r.vec(size_t(kSlots * kCap * kKVH * kHd)), vc = r.vec(size_t(kSlots * kCap * kKVH * kHd));
    x = r.vec(size_t(T * kC)), conv_w = r.vec(size_t(kC * kConvK)), conv_state = r.vec(size_t(kSlots * kC * (kConvK - 1)));
    dq = r.vec(size_t(T * kHk * kDk)), dk = r.vec(size_t(T * kHk * kDk)), dv = r.vec(size_t(T * kHv * kDv));
    g = r.vec(size_t(T * kHv), -1.0f, 0.0f), beta = r.vec(size_t(T * kHv), 0.0f, 1.0f);
    ssm = r.vec(size_t(kSlots * kHv * kDk * kDv), -0.5f, 0.5f);
  }
};

// Tensors over an Inputs' storage, and room for the attention and delta-rule outputs.
struct Views {
  std::vector<float> ao, dout;
  Tensor q, k, v, kc, vc, x, w, cs, dq, dk, dv, g, beta, ssm, attn_out, delta_out;
  explicit Views(Inputs& in, float fill = 0.0f)
      : ao(size_t(in.T * kH * kHd), fill), dout(size_t(in.T * kHv * kDv), fill) {
    q = f32(in.q, {in.T, kH, kHd}), k = f32(in.k, {in.T, kKVH, kHd}), v = f32(in.v, {in.T, kKVH, kHd});
    kc = f32(in.kc, {kSlots, kCap, kKVH, kHd}), vc = f32(in.vc, {kSlots, kCap, kKVH, kHd});
    x = f32(in.x, {in.T, kC}), w = f32(in.conv_w, {kC, kConvK}), cs = f32(in.conv_state, {kSlots, kC, kConvK - 1});
    dq = f32(in.dq, {in.T, kHk, kDk}), dk = f32(in.dk, {in.T, kHk, kDk}), dv = f32(in.dv, {in.T, kHv, kDv});
    g = f32(in.g, {in.T, kHv}), beta = f32(in.beta, {in.T, kHv}), ssm = f32(in.ssm, {kSlots, kHv, kDk, kDv});
    attn_out = f32(ao, {in.T, kH, kHd}), delta_out = f32(dout, {in.T, kHv, kDv});
  }
};

// Token i of the run decoded as its path's last step, one plain-op call per path token.
struct PathDecode {
  std::vector<float> attn, conv, delta;  // [H·hd], [C], [Hv·dv]
};
PathDecode decode_path(Inputs in, const std::vector<int32_t>& path) {  // by value: private caches and state
  PathDecode d;
  Views t(in);
  for (size_t j = 0; j < path.size(); ++j) {
    const SeqRun one{kSlot, kPos0 + int32_t(j), kBegin + path[j], 1};
    attention(t.q, t.k, t.v, t.kc, t.vc, std::span(&one, 1), 0.35f, t.attn_out);
    causal_conv1d_silu(t.x, t.w, t.cs, std::span(&one, 1));
    gated_delta_rule(t.dq, t.dk, t.dv, t.g, t.beta, t.ssm, std::span(&one, 1), t.delta_out, DeltaRuleMode::Recurrent);
  }
  const int64_t row = kBegin + path.back();
  d.attn.assign(t.ao.begin() + row * kH * kHd, t.ao.begin() + (row + 1) * kH * kHd);
  d.conv.assign(in.x.begin() + row * kC, in.x.begin() + (row + 1) * kC);
  d.delta.assign(t.dout.begin() + row * kHv * kDv, t.dout.begin() + (row + 1) * kHv * kDv);
  return d;
}

std::vector<float> row_of(const std::vector<float>& v, int64_t row, int64_t per) {
  return {v.begin() + row * per, v.begin() + (row + 1) * per};
}

TEST(CpuTreeVerify, EveryTokenIsItsRootPathDecoded) {
  for (const uint64_t seed : {1, 2, 3}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng r(seed);
    const int32_t n = 12;
    const std::vector<int32_t> parent = random_tree(r, n);
    Inputs in(r, n);
    const Inputs before = in;
    const SeqRun run{kSlot, kPos0, kBegin, n};
    Views t(in, 7.0f);
    tree_ops::attention(cpu_backend(), t.q, t.k, t.v, t.kc, t.vc, run, parent, 0.35f, t.attn_out);
    tree_ops::conv1d_silu_readonly(cpu_backend(), t.x, t.w, t.cs, run, parent);
    tree_ops::delta_rule_readonly(cpu_backend(), t.dq, t.dk, t.dv, t.g, t.beta, t.ssm, run, parent, t.delta_out);
    const std::vector<float>&ao = t.ao, &dout = t.dout;

    for (int32_t i = 0; i < n; ++i) {
      const PathDecode want = decode_path(before, path_to(parent, i));
      EXPECT_EQ(row_of(ao, kBegin + i, kH * kHd), want.attn) << "attention, token " << i;
      EXPECT_EQ(row_of(in.x, kBegin + i, kC), want.conv) << "conv, token " << i;
      EXPECT_EQ(row_of(dout, kBegin + i, kHv * kDv), want.delta) << "delta rule, token " << i;
      // Token i's K/V in cache row pos0 + i of its slot (an f32 cache stores them exactly).
      const int64_t kv = kKVH * kHd, at = (int64_t(kSlot) * kCap + kPos0 + i) * kv;
      EXPECT_EQ(std::vector<float>(in.kc.begin() + at, in.kc.begin() + at + kv), row_of(in.k, kBegin + i, kv));
      EXPECT_EQ(std::vector<float>(in.vc.begin() + at, in.vc.begin() + at + kv), row_of(in.v, kBegin + i, kv));
    }
    // Read-only state; other rows, slots and cache positions untouched.
    EXPECT_EQ(in.conv_state, before.conv_state);
    EXPECT_EQ(in.ssm, before.ssm);
    for (int64_t row = 0; row < kBegin; ++row) {
      EXPECT_EQ(row_of(in.x, row, kC), row_of(before.x, row, kC));
      EXPECT_EQ(row_of(ao, row, kH * kHd), std::vector<float>(size_t(kH * kHd), 7.0f));
    }
    const int64_t kv = kKVH * kHd;
    for (int64_t p = 0; p < kCap; ++p)
      for (int64_t s = 0; s < kSlots; ++s) {
        if (s == kSlot && p >= kPos0 && p < kPos0 + n) continue;
        EXPECT_EQ(row_of(in.kc, s * kCap + p, kv), row_of(before.kc, s * kCap + p, kv)) << "slot " << s << " row " << p;
      }
  }
}

// A chain (parent i − 1) is an ordinary verify run: the tree ops are the chain ops, bit for bit.
TEST(CpuTreeVerify, ChainIsTheChainOps) {
  Rng r(9);
  const int32_t n = 7;
  std::vector<int32_t> parent(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) parent[size_t(i)] = i - 1;
  Inputs a(r, n);
  Inputs b = a;
  const SeqRun run{kSlot, kPos0, kBegin, n};
  auto ops = [&](Inputs& in, bool tree) {
    Views t(in);
    if (tree) {
      tree_ops::rope(cpu_backend(), t.q, run, parent, kHd, 1e4f);
      tree_ops::attention(cpu_backend(), t.q, t.k, t.v, t.kc, t.vc, run, parent, 0.35f, t.attn_out);
      tree_ops::conv1d_silu_readonly(cpu_backend(), t.x, t.w, t.cs, run, parent);
      tree_ops::delta_rule_readonly(cpu_backend(), t.dq, t.dk, t.dv, t.g, t.beta, t.ssm, run, parent, t.delta_out);
    } else {
      rope(t.q, std::span(&run, 1), kHd, 1e4f);
      attention(t.q, t.k, t.v, t.kc, t.vc, std::span(&run, 1), 0.35f, t.attn_out);
      causal_conv1d_silu_readonly(t.x, t.w, t.cs, std::span(&run, 1));
      gated_delta_rule_readonly(t.dq, t.dk, t.dv, t.g, t.beta, t.ssm, std::span(&run, 1), t.delta_out);
    }
    return std::vector<std::vector<float>>{in.q, t.ao, in.kc, in.vc, in.x, t.dout};
  };
  EXPECT_EQ(ops(a, true), ops(b, false));
}

// RoPE puts token i at pos0 + depth(i): each row rotated as a one-token run there.
TEST(CpuTreeVerify, RopeAtDepth) {
  Rng r(4);
  const std::vector<int32_t> parent{-1, 0, 0, 1, 3, 2};
  const std::vector<int32_t> depth = tree_depths(parent);
  EXPECT_EQ(depth, (std::vector<int32_t>{0, 1, 1, 2, 3, 2}));
  const int32_t n = int32_t(parent.size()), T = kBegin + n;
  std::vector<float> a = r.vec(size_t(T * kH * kHd)), b = a;
  Tensor ta = f32(a, {T, kH, kHd}), tb = f32(b, {T, kH, kHd});
  tree_ops::rope(cpu_backend(), ta, SeqRun{kSlot, kPos0, kBegin, n}, parent, 6, 1e4f);
  for (int32_t i = 0; i < n; ++i) {
    const SeqRun one{kSlot, kPos0 + depth[size_t(i)], kBegin + i, 1};
    rope(tb, std::span(&one, 1), 6, 1e4f);
  }
  EXPECT_EQ(a, b);
}

TEST(CpuTreeVerify, MalformedTreesAreRefused) {
  EXPECT_THROW(tree_depths(std::vector<int32_t>{0, 0}), Error);       // the root has a parent
  EXPECT_THROW(tree_depths(std::vector<int32_t>{-1, -1}), Error);     // a second root
  EXPECT_THROW(tree_depths(std::vector<int32_t>{-1, 2, 0}), Error);   // a parent after its child
  EXPECT_THROW(tree_depths(std::vector<int32_t>{-1, 1}), Error);      // its own parent
  Rng r(5);
  Inputs in(r, 3);
  Tensor x = f32(in.x, {in.T, kC}), w = f32(in.conv_w, {kC, kConvK});
  const Tensor cs = f32(in.conv_state, {kSlots, kC, kConvK - 1});
  EXPECT_THROW(tree_ops::conv1d_silu_readonly(cpu_backend(), x, w, cs, SeqRun{kSlot, kPos0, kBegin, 3}, std::vector<int32_t>{-1, 0}),
               Error);  // fewer parents than tokens
}

// A tree commit's row moves (Backend::compact_rows, the default every backend is checked
// against): row j of each tensor becomes the original row from[j] (from[j] ≥ j: moving in order
// never reads a row already overwritten), the rows past the path stay; bad paths are refused
// before anything moves.
TEST(CpuTreeVerify, CompactRowsMovesThePathToTheFront) {
  const std::vector<int32_t> from{0, 2, 3, 3, 7, 9};
  std::vector<float> a(12 * 5), b(12 * 1);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = float(-int(i));
  const std::vector<float> a0 = a, b0 = b;
  std::vector<Tensor> ts{f32(a, {12, 5}), f32(b, {12, 1})};
  cpu_backend().compact_rows(ts, from);
  for (int64_t r = 0; r < 12; ++r) {
    const int64_t src = r < int64_t(from.size()) ? from[size_t(r)] : r;
    for (int64_t c = 0; c < 5; ++c) EXPECT_EQ(a[size_t(r * 5 + c)], a0[size_t(src * 5 + c)]) << r << "," << c;
    EXPECT_EQ(b[size_t(r)], b0[size_t(src)]) << r;
  }
  std::vector<Tensor> one{f32(a, {12, 5})};
  const std::vector<float> before = a;
  EXPECT_THROW(cpu_backend().compact_rows(one, std::vector<int32_t>{0, 0}), Error);   // a row from before it
  EXPECT_THROW(cpu_backend().compact_rows(one, std::vector<int32_t>{0, 12}), Error);  // past the rows
  EXPECT_EQ(a, before);
}

}  // namespace
}  // namespace qwen36::cpu
