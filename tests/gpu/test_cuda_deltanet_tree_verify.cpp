// The fused tree verify pass (Backend::deltanet_verify_tree on CUDA) against the fused chain
// verify pass (test_cuda_deltanet_verify.cpp checks that one against the CPU composition): for
// every leaf of a tree, the chain verify of the leaf's root path, from the same states, gives
// bit for bit the tree's outputs of the path's tokens, and saves bit for bit the same g and β
// (the same kernels' arithmetic); the tree's saved raw inputs are its rows, exactly; its conv and
// recurrent states are only read. Trees: random (23 tokens), a chain, a star, a lone root; the
// 27B and dk = 64 head shapes; f32 and bf16 recurrent states; run directly, and recorded once
// and replayed for other trees of the same size (set_batch_trees' tables).
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/tree_ops.h"
#include "core/error.h"
#include "deltanet_test_util.h"
#include "gpu_test_util.h"

namespace qwen36::gputest {
namespace {

class CudaDeltaNetTreeVerify : public CudaTest {};

constexpr int64_t kSlots = 3, kSave = 24;
constexpr int32_t kSlot = 2;

// A tree's pass: its inputs on the host, the states it reads, and what the op wrote.
struct TreeCase {
  const DecodeShape& s;
  DType state_type;
  HostT conv, st, mixed, z, a, b;
};
TreeCase make_case(std::mt19937& rng, const DecodeShape& s, DType state_type, int64_t T) {
  const int64_t C = 2 * s.Hk * s.dk + s.Hv * s.dv;
  return {s,
          state_type,
          random_t(rng, DType::F32, {kSlots, C, kConvK - 1}),
          random_t(rng, state_type, {kSlots, s.Hv, s.dk, s.dv}, -0.5f, 0.5f),
          random_t(rng, DType::F32, {T, C}),
          random_t(rng, DType::F32, {T, s.Hv, s.dv}),
          random_t(rng, DType::F32, {T, s.Hv}, -3.0f, 3.0f),
          random_t(rng, DType::F32, {T, s.Hv}, -3.0f, 3.0f)};
}

// The device side of one pass: inputs uploaded, outputs and saved-input buffers (zeros).
struct DevPass {
  DevT conv, st, mixed, z, a, b, out, ci, gi, bi;
  DevPass(Backend& gpu, const TreeCase& c, const HostT& mixed_rows, const HostT& z_rows, const HostT& a_rows,
          const HostT& b_rows) {
    const DecodeShape& s = c.s;
    const int64_t T = mixed_rows.t.rows(), C = mixed_rows.t.cols();
    conv = upload(gpu, c.conv), st = upload(gpu, c.st), mixed = upload(gpu, mixed_rows), z = upload(gpu, z_rows);
    a = upload(gpu, a_rows), b = upload(gpu, b_rows), out = upload(gpu, HostT(DType::F32, {T, s.Hv, s.dv}));
    ci = upload(gpu, HostT(DType::F32, {kSlots, kSave, C}));
    gi = upload(gpu, HostT(DType::F32, {kSlots, kSave, s.Hv}));
    bi = upload(gpu, HostT(DType::F32, {kSlots, kSave, s.Hv}));
  }
};

// rows `rows` of h (f32, any rank: rows of its first dimension) as a new tensor
HostT gather(const HostT& h, const std::vector<int32_t>& rows) {
  const int64_t per = h.t.numel() / h.t.dim(0);
  HostT g(DType::F32, {int64_t(rows.size()), per});
  g.t.ndim = h.t.ndim, g.t.shape = h.t.shape, g.t.shape[0] = int64_t(rows.size());  // h's shape
  for (size_t i = 0; i < rows.size(); ++i)
    std::copy_n(h.t.as<const float>() + rows[i] * per, per, g.f() + int64_t(i) * per);
  return g;
}

// floats [i·per, (i + 1)·per) of v
std::vector<float> row_of(const std::vector<float>& v, int64_t i, int64_t per) {
  return std::vector<float>(v.begin() + i * per, v.begin() + (i + 1) * per);
}

// The tree op's results against each leaf path's chain verify (see the header).
void check_against_chains(Backend& gpu, const TreeCase& c, const DeltaNetWeights& dw, const SeqRun& run,
                          const std::vector<int32_t>& parent, const DevPass& tree, const std::string& what) {
  const DecodeShape& s = c.s;
  const int64_t C = c.mixed.t.cols(), HD = s.Hv * s.dv;
  const std::vector<float> out = download(gpu, tree.out.t), ci = download(gpu, tree.ci.t);
  const std::vector<float> gi = download(gpu, tree.gi.t), bi = download(gpu, tree.bi.t);
  const int64_t slot_c = kSlot * kSave, slot_h = kSlot * kSave;
  for (int32_t j = 0; j < run.count; ++j)
    EXPECT_EQ(row_of(ci, slot_c + j, C), row_of(c.mixed.floats(), run.begin + j, C)) << what << ": saved input " << j;
  const tree_ops::Paths paths = tree_ops::leaf_paths(run, parent);
  for (size_t li = 0; li < paths.runs.size(); ++li) {
    const SeqRun& pr = paths.runs[li];
    const std::vector<int32_t> rows(paths.rows.begin() + pr.begin, paths.rows.begin() + pr.begin + pr.count);
    DevPass chain(gpu, c, gather(c.mixed, rows), gather(c.z, rows), gather(c.a, rows), gather(c.b, rows));
    const std::vector<SeqRun> vr{{kSlot, run.pos0, 0, pr.count}};
    ASSERT_TRUE(gpu.deltanet_verify(chain.mixed.t, chain.z.t, chain.a.t, chain.b.t, dw, kEps, chain.conv.t, chain.st.t,
                                    vr, vr, chain.ci.t, chain.gi.t, chain.bi.t, chain.out.t));
    const std::vector<float> cout = download(gpu, chain.out.t), cg = download(gpu, chain.gi.t),
                             cb = download(gpu, chain.bi.t);
    for (int32_t t = 0; t < pr.count; ++t) {
      const int32_t j = rows[size_t(t)] - run.begin;
      EXPECT_EQ(row_of(out, run.begin + j, HD), row_of(cout, t, HD)) << what << ": leaf " << li << ", token " << j;
      EXPECT_EQ(row_of(gi, slot_h + j, s.Hv), row_of(cg, slot_h + t, s.Hv)) << what << ": saved g of " << j;
      EXPECT_EQ(row_of(bi, slot_h + j, s.Hv), row_of(cb, slot_h + t, s.Hv)) << what << ": saved beta of " << j;
    }
  }
}

std::vector<std::vector<int32_t>> trees_of(std::mt19937& rng, int32_t n) {
  std::vector<std::vector<int32_t>> t(3, std::vector<int32_t>(size_t(n), -1));
  for (int32_t i = 1; i < n; ++i) {
    t[0][size_t(i)] = int32_t(rng() % uint32_t(i));  // random
    t[1][size_t(i)] = i - 1;                         // a chain
    t[2][size_t(i)] = 0;                             // a star
  }
  return t;
}

TEST_F(CudaDeltaNetTreeVerify, EachPathIsItsChainVerifyBitForBit) {
  for (const DecodeShape* s : {&kDec27B, &kDecD64})
    for (DType state_type : {DType::F32, DType::BF16})
      for (int32_t n : {23, 1}) {
        const DecodeWeights w(*gpu_, rng_, *s);
        const DeltaNetWeights dw = w.dev();
        const SeqRun run{kSlot, 40, 0, n};
        for (const std::vector<int32_t>& parent : trees_of(rng_, n)) {
          const TreeCase c = make_case(rng_, *s, state_type, n);
          DevPass tree(*gpu_, c, c.mixed, c.z, c.a, c.b);
          ASSERT_TRUE(gpu_->deltanet_verify_tree(tree.mixed.t, tree.z.t, tree.a.t, tree.b.t, dw, kEps, tree.conv.t,
                                                 tree.st.t, run, parent, tree.ci.t, tree.gi.t, tree.bi.t, tree.out.t))
              << s->name << ": the CUDA backend did not fuse the tree verify pass";
          const std::string what = std::string(s->name) + ", " + std::string(dtype_name(state_type)) + " state, " +
                                   std::to_string(n) + " tokens";
          EXPECT_EQ(download(*gpu_, tree.conv.t), c.conv.floats()) << what << ": conv states";
          HostT st_now = c.st;
          gpu_->copy_to_host(tree.st.t, st_now.t.data);
          EXPECT_EQ(st_now.bytes, c.st.bytes) << what << ": recurrent states";
          check_against_chains(*gpu_, c, dw, run, parent, tree, what);
          if (n == 1) break;  // (one tree of one token)
        }
      }
}

// One recording of the op for a tree of 23 tokens, replayed after set_batch_trees with each of
// three trees of that size: each replay bit for bit the op run directly on that tree.
TEST_F(CudaDeltaNetTreeVerify, RecordedServesEveryTreeOfItsSize) {
  const DecodeShape& s = kDec27B;
  const int32_t n = 23;
  const DecodeWeights w(*gpu_, rng_, s);
  const DeltaNetWeights dw = w.dev();
  const SeqRun run{kSlot, 40, 0, n};
  const TreeCase c = make_case(rng_, s, DType::F32, n);
  const std::vector<std::vector<int32_t>> trees = trees_of(rng_, n);
  const std::vector<int32_t> tokens(size_t(n), 0);
  const std::vector<SeqRun> runs{run};
  DevPass rec(*gpu_, c, c.mixed, c.z, c.a, c.b);
  auto set_tables = [&](const std::vector<int32_t>& parent) {
    gpu_->set_batch(tokens, runs, {});
    const std::span<const int32_t> p[] = {parent};
    gpu_->set_batch_trees(runs, p);
  };
  set_tables(trees[0]);
  if (!gpu_->begin_capture()) GTEST_SKIP() << "the backend does not record (QWEN36_PROFILE set?)";
  const bool taken = gpu_->deltanet_verify_tree(rec.mixed.t, rec.z.t, rec.a.t, rec.b.t, dw, kEps, rec.conv.t, rec.st.t,
                                                run, trees[0], rec.ci.t, rec.gi.t, rec.bi.t, rec.out.t);
  ASSERT_TRUE(gpu_->end_capture(0x7e5eed, true)) << "the tree verify op could not be recorded";
  ASSERT_TRUE(taken);
  for (size_t ti : {1, 0, 2}) {
    set_tables(trees[ti]);
    ASSERT_TRUE(gpu_->replay(0x7e5eed));
    gpu_->set_batch({}, {}, {});  // the direct run below uploads its own tables
    DevPass direct(*gpu_, c, c.mixed, c.z, c.a, c.b);
    ASSERT_TRUE(gpu_->deltanet_verify_tree(direct.mixed.t, direct.z.t, direct.a.t, direct.b.t, dw, kEps,
                                           direct.conv.t, direct.st.t, run, trees[ti], direct.ci.t, direct.gi.t,
                                           direct.bi.t, direct.out.t));
    const std::string what = "tree " + std::to_string(ti);
    EXPECT_EQ(download(*gpu_, rec.out.t), download(*gpu_, direct.out.t)) << what << ": outputs";
    EXPECT_EQ(download(*gpu_, rec.gi.t), download(*gpu_, direct.gi.t)) << what << ": saved g";
    EXPECT_EQ(download(*gpu_, rec.ci.t), download(*gpu_, direct.ci.t)) << what << ": saved inputs";
  }
  gpu_->drop_recordings();
}

// A malformed tree is refused before anything runs.
TEST_F(CudaDeltaNetTreeVerify, RefusesAMalformedTree) {
  const DecodeShape& s = kDecD64;
  const DecodeWeights w(*gpu_, rng_, s);
  const int32_t n = 6;
  const TreeCase c = make_case(rng_, s, DType::F32, n);
  DevPass d(*gpu_, c, c.mixed, c.z, c.a, c.b);
  std::vector<int32_t> bad = trees_of(rng_, n)[1];
  bad[3] = 4;  // a parent after its child
  EXPECT_THROW(gpu_->deltanet_verify_tree(d.mixed.t, d.z.t, d.a.t, d.b.t, w.dev(), kEps, d.conv.t, d.st.t,
                                          {kSlot, 0, 0, n}, bad, d.ci.t, d.gi.t, d.bi.t, d.out.t),
               Error);
  EXPECT_EQ(download(*gpu_, d.out.t), std::vector<float>(size_t(n * s.Hv * s.dv), 0.0f));
  EXPECT_EQ(download(*gpu_, d.ci.t), std::vector<float>(size_t(kSlots * kSave * d.mixed.t.cols()), 0.0f));
}

}  // namespace
}  // namespace qwen36::gputest
