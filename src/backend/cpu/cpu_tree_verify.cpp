// Tree verification on the CPU (cpu_ops.h): every token of a tree-shaped verify run computed
// as the last token of its root path, run as a chain through the chain ops. Outputs are
// therefore exactly what decoding each path would give (the definition), at Σ depth tokens of
// work: the reference that a device backend's one-pass tree kernels are tested against.
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"

namespace qwen36::cpu {

std::vector<int32_t> tree_depths(std::span<const int32_t> parent) {
  std::vector<int32_t> depth(parent.size(), 0);
  for (size_t i = 0; i < parent.size(); ++i) {
    const int32_t p = parent[i];
    if (i == 0) {
      QWEN36_CHECK(p == -1, "tree verify: token 0 is the root (parent −1), not a child of {}", p);
      continue;
    }
    QWEN36_CHECK(p >= 0 && size_t(p) < i, "tree verify: token {}'s parent {} is not an earlier token", i, p);
    depth[i] = depth[size_t(p)] + 1;
  }
  return depth;
}

namespace {

// Token i's root path (indices within the run), root first.
std::vector<int32_t> root_path(std::span<const int32_t> parent, int32_t i) {
  std::vector<int32_t> path;
  for (int32_t j = i; j >= 0; j = parent[size_t(j)]) path.push_back(j);
  return {path.rbegin(), path.rend()};
}

// Rows run.begin + path[j] of t (f32, any rank: a row is everything but the first dimension),
// copied into buf and viewed as a tensor of path.size() rows.
Tensor gather(const Tensor& t, const SeqRun& run, std::span<const int32_t> path, std::vector<float>& buf) {
  QWEN36_CHECK(t.dtype == DType::F32, "tree verify: {} must be f32", t.shape_str());
  const int64_t per = t.numel() / t.dim(0);
  buf.resize(size_t(int64_t(path.size()) * per));
  for (size_t j = 0; j < path.size(); ++j)
    std::memcpy(buf.data() + int64_t(j) * per, t.as<const float>() + int64_t(run.begin + path[j]) * per,
                size_t(per) * sizeof(float));
  Tensor v = t;
  v.data = buf.data();
  v.shape[0] = int64_t(path.size());
  return v;
}

// Row `row` of src's rows (of `per` floats) into row run.begin + i of dst.
void put_row(const Tensor& src, int64_t row, Tensor& dst, const SeqRun& run, int32_t i) {
  const int64_t per = dst.numel() / dst.dim(0);
  std::memcpy(dst.as<float>() + int64_t(run.begin + i) * per, src.as<const float>() + row * per,
              size_t(per) * sizeof(float));
}

void check_run(const SeqRun& run, std::span<const int32_t> parent) {
  QWEN36_CHECK(run.count >= 1 && size_t(run.count) == parent.size(), "tree verify: {} tokens, {} parents", run.count,
               parent.size());
  tree_depths(parent);
}

}  // namespace

void rope_tree(Tensor& x, const SeqRun& run, std::span<const int32_t> parent, int64_t rotary_dim, float theta) {
  check_run(run, parent);
  const std::vector<int32_t> depth = tree_depths(parent);
  std::vector<SeqRun> one(size_t(run.count));
  for (int32_t i = 0; i < run.count; ++i) one[size_t(i)] = {run.slot, run.pos0 + depth[size_t(i)], run.begin + i, 1};
  rope(x, one, rotary_dim, theta);
}

void attention_tree(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache,
                    const SeqRun& run, std::span<const int32_t> parent, float scale, Tensor& out) {
  check_run(run, parent);
  std::vector<float> qb, kb, vb, ob;
  for (int32_t i = 0; i < run.count; ++i) {
    // The path as a chain at positions pos0 .. pos0 + depth: its K/V overwrite those cache rows
    // (the last layout is written below), and its last token's output is token i's.
    const std::vector<int32_t> path = root_path(parent, i);
    const Tensor pq = gather(q, run, path, qb), pk = gather(k, run, path, kb), pv = gather(v, run, path, vb);
    ob.resize(size_t(pq.numel()));
    Tensor po = pq;
    po.data = ob.data();
    const SeqRun chain{run.slot, run.pos0, 0, int32_t(path.size())};
    attention(pq, pk, pv, k_cache, v_cache, std::span(&chain, 1), scale, po);
    put_row(po, int64_t(path.size()) - 1, out, run, i);
  }
  // Every token's K/V at row pos0 + i: the run as a chain (outputs discarded).
  std::vector<float> discard(size_t(out.numel()));
  Tensor scratch = out;
  scratch.data = discard.data();
  attention(q, k, v, k_cache, v_cache, std::span(&run, 1), scale, scratch);
}

void causal_conv1d_silu_tree_readonly(Tensor& x, const Tensor& w, const Tensor& conv_state, const SeqRun& run,
                                      std::span<const int32_t> parent) {
  check_run(run, parent);
  // Every path reads the inputs, so the outputs go to x only once all are computed.
  std::vector<float> xb, res(size_t(x.numel() / x.dim(0) * run.count));
  Tensor outs = x;
  outs.data = res.data();
  outs.shape[0] = run.count;
  const SeqRun at0{0, 0, 0, run.count};
  for (int32_t i = 0; i < run.count; ++i) {
    const std::vector<int32_t> path = root_path(parent, i);
    Tensor px = gather(x, run, path, xb);
    const SeqRun chain{run.slot, run.pos0, 0, int32_t(path.size())};
    causal_conv1d_silu_readonly(px, w, conv_state, std::span(&chain, 1));
    put_row(px, int64_t(path.size()) - 1, outs, at0, i);
  }
  for (int32_t i = 0; i < run.count; ++i) put_row(outs, i, x, run, i);
}

void gated_delta_rule_tree_readonly(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                   const Tensor& beta, const Tensor& state, const SeqRun& run,
                                   std::span<const int32_t> parent, Tensor& out) {
  check_run(run, parent);
  std::vector<float> qb, kb, vb, gb, bb, ob;
  for (int32_t i = 0; i < run.count; ++i) {
    const std::vector<int32_t> path = root_path(parent, i);
    const Tensor pq = gather(q, run, path, qb), pk = gather(k, run, path, kb), pv = gather(v, run, path, vb),
                 pg = gather(g, run, path, gb), pb = gather(beta, run, path, bb);
    Tensor po = gather(out, run, path, ob);  // shape and room; overwritten
    const SeqRun chain{run.slot, run.pos0, 0, int32_t(path.size())};
    gated_delta_rule_readonly(pq, pk, pv, pg, pb, state, std::span(&chain, 1), po);
    put_row(po, int64_t(path.size()) - 1, out, run, i);
  }
}

}  // namespace qwen36::cpu
