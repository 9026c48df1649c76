#include "backend/tree_ops.h"

#include <memory>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"

namespace qwen36 {

namespace tree_ops {

namespace {

// Token i's root path (indices within the run), root first.
std::vector<int32_t> root_path(std::span<const int32_t> parent, int32_t i) {
  std::vector<int32_t> path;
  for (int32_t j = i; j >= 0; j = parent[size_t(j)]) path.push_back(j);
  return {path.rbegin(), path.rend()};
}

// Backend memory for `rows` rows shaped like t's (f32), and a tensor over it.
struct Rows {
  std::unique_ptr<DeviceBuffer> buf;
  Tensor t;
  Rows(Backend& b, const Tensor& like, int64_t rows) {
    QWEN36_CHECK(like.dtype == DType::F32, "tree verify: {} must be f32", like.shape_str());
    const int64_t per = like.numel() / like.dim(0);
    buf = b.alloc(size_t(rows * per) * sizeof(float));
    t = like;
    t.data = buf->data();
    t.shape[0] = rows;
  }
};

// One row of t (f32, rows along dim 0) as a [1, per] tensor.
Tensor row(const Tensor& t, int64_t r) {
  const int64_t per = t.numel() / t.dim(0);
  return Tensor(static_cast<float*>(t.data) + r * per, DType::F32, {1, per});
}

// Rows `rows` of src into a new tensor of rows.size() rows.
Rows gather_rows(Backend& b, const Tensor& src, std::span<const int32_t> rows) {
  Rows out(b, src, int64_t(rows.size()));
  const int64_t per = src.numel() / src.dim(0);
  const Tensor from(src.data, DType::F32, {src.dim(0), per});
  Tensor to(out.t.data, DType::F32, {int64_t(rows.size()), per});
  b.get_rows(from, rows, to);
  return out;
}

// Rows run.begin + path[j] of src into a new tensor of path.size() rows.
Rows gather(Backend& b, const Tensor& src, const SeqRun& run, std::span<const int32_t> path) {
  std::vector<int32_t> rows(path.size());
  for (size_t j = 0; j < path.size(); ++j) rows[j] = run.begin + path[j];
  return gather_rows(b, src, rows);
}

}  // namespace

Paths leaf_paths(const SeqRun& run, std::span<const int32_t> parent) {
  std::vector<bool> has_child(parent.size(), false);
  for (int32_t pa : parent)
    if (pa >= 0) has_child[size_t(pa)] = true;
  Paths p;
  p.last.assign(parent.size(), -1);
  for (int32_t i = 0; i < run.count; ++i) {
    if (has_child[size_t(i)]) continue;
    const std::vector<int32_t> path = root_path(parent, i);
    p.runs.push_back({run.slot, run.pos0, int32_t(p.rows.size()), int32_t(path.size())});
    for (int32_t j : path) {
      if (p.last[size_t(j)] < 0) p.last[size_t(j)] = int32_t(p.rows.size());
      p.rows.push_back(run.begin + j);
    }
  }
  return p;
}

namespace {

// Rows `rows` of src (f32) into dst's rows [begin, begin + rows.size()).
void scatter_last(Backend& b, const Tensor& src, std::span<const int32_t> rows, Tensor& dst, int32_t begin) {
  const int64_t per = src.numel() / src.dim(0);
  const Tensor from(src.data, DType::F32, {src.dim(0), per});
  Tensor to(static_cast<float*>(dst.data) + int64_t(begin) * per, DType::F32, {int64_t(rows.size()), per});
  b.get_rows(from, rows, to);
}

}  // namespace

void rope(Backend& b, Tensor& x, const SeqRun& run, std::span<const int32_t> parent, int64_t rotary_dim, float theta) {
  check_tree(run, parent);
  const std::vector<int32_t> depth = cpu::tree_depths(parent);
  std::vector<SeqRun> one(size_t(run.count));
  for (int32_t i = 0; i < run.count; ++i) one[size_t(i)] = {run.slot, run.pos0 + depth[size_t(i)], run.begin + i, 1};
  b.rope(x, one, rotary_dim, theta);
}

void attention(Backend& b, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache,
               const SeqRun& run, std::span<const int32_t> parent, float scale, Tensor& out) {
  check_tree(run, parent);
  for (int32_t i = 0; i < run.count; ++i) {
    // The path as a chain at positions pos0 .. pos0 + depth (its K/V overwrite those rows; the
    // final layout is written below); its last token's output is token i's.
    const std::vector<int32_t> path = root_path(parent, i);
    const Rows pq = gather(b, q, run, path), pk = gather(b, k, run, path), pv = gather(b, v, run, path);
    Rows po(b, q, int64_t(path.size()));
    const SeqRun chain{run.slot, run.pos0, 0, int32_t(path.size())};
    b.attention(pq.t, pk.t, pv.t, k_cache, v_cache, std::span(&chain, 1), scale, po.t);
    Tensor dst = row(out, run.begin + i);
    b.copy(row(po.t, int64_t(path.size()) - 1), dst);
  }
  Rows scratch(b, out, out.dim(0));  // every token's K/V at row pos0 + i: the run as a chain
  b.attention(q, k, v, k_cache, v_cache, std::span(&run, 1), scale, scratch.t);
}

void conv1d_silu_readonly(Backend& b, Tensor& x, const Tensor& w, const Tensor& conv_state, const SeqRun& run,
                          std::span<const int32_t> parent) {
  check_tree(run, parent);
  const Paths p = leaf_paths(run, parent);
  Rows px = gather_rows(b, x, p.rows);  // every path reads x's inputs: the outputs go to x at the end
  b.causal_conv1d_silu_readonly(px.t, w, conv_state, p.runs);
  scatter_last(b, px.t, p.last, x, run.begin);
}

void delta_rule_readonly(Backend& b, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                         const Tensor& beta, const Tensor& state, const SeqRun& run, std::span<const int32_t> parent,
                         Tensor& out) {
  check_tree(run, parent);
  const Paths p = leaf_paths(run, parent);
  const Rows pq = gather_rows(b, q, p.rows), pk = gather_rows(b, k, p.rows), pv = gather_rows(b, v, p.rows),
             pg = gather_rows(b, g, p.rows), pb = gather_rows(b, beta, p.rows);
  Rows po(b, out, int64_t(p.rows.size()));
  b.gated_delta_rule_readonly(pq.t, pk.t, pv.t, pg.t, pb.t, state, p.runs, po.t);
  scatter_last(b, po.t, p.last, out, run.begin);
}

void check_tree(const SeqRun& run, std::span<const int32_t> parent) {
  QWEN36_CHECK(run.count >= 1 && size_t(run.count) == parent.size(), "tree verify: {} tokens, {} parents", run.count,
               parent.size());
  cpu::tree_depths(parent);  // the tree's form
}

void check_compaction(std::span<const Tensor> ts, std::span<const int32_t> from) {
  for (const Tensor& t : ts) {
    QWEN36_CHECK(t.ndim >= 1 && t.dim(0) >= int64_t(from.size()), "compact_rows: {} rows of {}", from.size(),
                 t.shape_str());
    for (size_t j = 0; j < from.size(); ++j)
      QWEN36_CHECK(from[j] >= int32_t(j) && from[j] < t.dim(0), "compact_rows: row {} from row {} of {}", j, from[j],
                   t.shape_str());
  }
}

}  // namespace tree_ops

void Backend::compact_rows(std::span<Tensor> ts, std::span<const int32_t> from) {
  tree_ops::check_compaction(ts, from);
  for (Tensor& t : ts) {
    const int64_t row = int64_t(t.nbytes()) / t.dim(0);
    auto* base = static_cast<std::byte*>(t.data);
    for (size_t j = 0; j < from.size(); ++j) {
      if (from[j] == int32_t(j)) continue;
      const Tensor src(base + from[j] * row, DType::U8, {row});
      Tensor dst(base + int64_t(j) * row, DType::U8, {row});
      copy(src, dst);
    }
  }
}

// The Backend defaults: the composition above.
void Backend::rope_tree(Tensor& x, const SeqRun& run, std::span<const int32_t> parent, int64_t rotary_dim,
                        float theta) {
  tree_ops::rope(*this, x, run, parent, rotary_dim, theta);
}
void Backend::attention_tree(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache,
                             const SeqRun& run, std::span<const int32_t> parent, float scale, Tensor& out) {
  tree_ops::attention(*this, q, k, v, k_cache, v_cache, run, parent, scale, out);
}
void Backend::causal_conv1d_silu_tree_readonly(Tensor& x, const Tensor& w, const Tensor& conv_state, const SeqRun& run,
                                               std::span<const int32_t> parent) {
  tree_ops::conv1d_silu_readonly(*this, x, w, conv_state, run, parent);
}
void Backend::gated_delta_rule_tree_readonly(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                             const Tensor& beta, const Tensor& state, const SeqRun& run,
                                             std::span<const int32_t> parent, Tensor& out) {
  tree_ops::delta_rule_readonly(*this, q, k, v, g, beta, state, run, parent, out);
}

}  // namespace qwen36
