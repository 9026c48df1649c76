// Tensor-parallel sharding: the plan (which heads and columns each rank holds) and the
// slicing of host weights into one rank's ModelWeights. Row ranges stay views of the
// checkpoint's memory; column ranges and multi-range row sets are copied, whole quantization
// blocks at a time (a block never straddles two ranks).
#include "model/tp_shard.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>

#include "core/error.h"

namespace qwen36 {

namespace {

using Range = std::pair<int64_t, int64_t>;  // [first, first + count)

// Consecutive ranges of `units` units, rank r ending at round(units · cumsum(w)_r / Σw).
std::vector<Range> apportion(const char* what, int64_t units, std::span<const double> w, bool even) {
  const int n = int(w.size());
  if (even)
    QWEN36_CHECK(units % n == 0, "tensor parallel: {} ({}) cannot be split evenly over {} ranks (see --tensor-split)",
                 what, units, n);
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  std::vector<Range> out;
  double cum = 0;
  int64_t prev = 0;
  for (int r = 0; r < n; ++r) {
    cum += w[size_t(r)];
    const int64_t end = r + 1 == n ? units : std::llround(double(units) * cum / total);
    QWEN36_CHECK(end > prev, "tensor parallel: the split leaves rank {} no {} ({} in all)", r, what, units);
    out.push_back({prev, end - prev});
    prev = end;
  }
  return out;
}

// Builds one rank's tensors from the full host weights.
class Slicer {
 public:
  explicit Slicer(ModelWeights& out) : out_(out) {}

  // A device-tiled matrix (made by the CUDA backend's prepare_weights) has no separable rows.
  static void check_layout(const Tensor& t) {
    QWEN36_CHECK(!dtype_is_tiled(t.dtype), "tensor parallel: a {} matrix cannot be sharded (shard before the "
                 "backend prepares the weights)", dtype_name(t.dtype));
  }

  // Rows [r0, r0 + n) of dimension 0: a view.
  Tensor rows(const Tensor& t, int64_t r0, int64_t n) const {
    check_layout(t);
    QWEN36_CHECK(r0 >= 0 && n > 0 && r0 + n <= t.dim(0), "tensor parallel: rows [{}, {}) of {}", r0, r0 + n,
                 t.shape_str());
    const size_t per = t.nbytes() / size_t(t.dim(0));
    int64_t dims[kMaxDims];
    for (int i = 0; i < t.ndim; ++i) dims[i] = t.dim(i);
    dims[0] = n;
    return Tensor(static_cast<std::byte*>(t.data) + size_t(r0) * per, t.dtype, dims, t.ndim);
  }

  // Several row ranges of a 2-D tensor, concatenated: a copy.
  Tensor gather_rows(const Tensor& t, std::span<const Range> ranges) {
    int64_t n = 0;
    for (const auto& [r0, cnt] : ranges) n += cnt;
    Tensor out = alloc(t.dtype, n, t.cols());
    std::byte* dst = static_cast<std::byte*>(out.data);
    for (const auto& [r0, cnt] : ranges) {
      const Tensor part = rows(t, r0, cnt);
      std::memcpy(dst, part.data, part.nbytes());
      dst += part.nbytes();
    }
    return out;
  }

  // Rows [r0, r0 + n) of a 2-D tensor followed by zero rows up to `total` rows: a copy (a zero
  // block of every format used here decodes to zeros).
  Tensor rows_padded(const Tensor& t, int64_t r0, int64_t n, int64_t total) {
    const Tensor part = rows(t, r0, n);
    if (total == n) return part;
    QWEN36_CHECK(t.ndim == 2 && total > n, "tensor parallel: {} rows of {} padded to {}", n, t.shape_str(), total);
    Tensor out = alloc(t.dtype, total, t.cols());
    std::memcpy(out.data, part.data, part.nbytes());
    std::memset(static_cast<std::byte*>(out.data) + part.nbytes(), 0, out.nbytes() - part.nbytes());
    return out;
  }

  // Column ranges of a 2-D matrix, concatenated: a copy. Adjacent ranges are merged first;
  // each merged range must be whole blocks of the matrix's dtype.
  Tensor cols(const std::string& name, const Tensor& t, std::vector<Range> ranges) {
    QWEN36_CHECK(t.ndim == 2, "tensor parallel: {} {} is not a matrix", name, t.shape_str());
    check_layout(t);
    std::vector<Range> merged;
    for (const Range& r : ranges) {
      if (!merged.empty() && merged.back().first + merged.back().second == r.first)
        merged.back().second += r.second;
      else
        merged.push_back(r);
    }
    const int64_t be = dtype_block_elems(t.dtype);
    int64_t width = 0;
    for (const auto& [c0, n] : merged) {
      QWEN36_CHECK(c0 >= 0 && c0 + n <= t.cols(), "tensor parallel: columns [{}, {}) of {} {}", c0, c0 + n, name,
                   t.shape_str());
      QWEN36_CHECK(c0 % be == 0 && n % be == 0,
                   "tensor parallel: {} ({}) would be split inside a {}-element block (columns [{}, {})); use "
                   "another split or an unquantized model",
                   name, dtype_name(t.dtype), be, c0, c0 + n);
      width += n;
    }
    Tensor out = alloc(t.dtype, t.rows(), width);
    for (int64_t r = 0; r < t.rows(); ++r) {
      std::byte* dst = static_cast<std::byte*>(out.data) + size_t(r) * out.row_bytes();
      for (const auto& [c0, n] : merged) {
        const size_t w = dtype_row_bytes(t.dtype, n);
        std::memcpy(dst, t.row(r) + dtype_row_bytes(t.dtype, c0), w);
        dst += w;
      }
    }
    return out;
  }

 private:
  Tensor alloc(DType t, int64_t rows, int64_t cols) {
    auto buf = std::make_shared<HostBuffer>(size_t(rows) * dtype_row_bytes(t, cols));
    out_.storage.push_back(buf);
    return Tensor(buf->data(), t, {rows, cols});
  }
  ModelWeights& out_;
};

MlpWeights shard_mlp(const MlpWeights& m, int64_t f0, int64_t fn, Slicer& sl, const std::string& name) {
  MlpWeights o;
  o.gate_proj = sl.rows(m.gate_proj, f0, fn);
  o.up_proj = sl.rows(m.up_proj, f0, fn);
  o.down_proj = sl.cols(name + "down_proj", m.down_proj, {{f0, fn}});
  return o;
}

// c: the full model's config, sc: the shard's (shard_config).
LayerWeights shard_layer(const ModelConfig& c, const ModelConfig& sc, const LayerWeights& l, const TpShard& s,
                         Slicer& sl, const std::string& p) {
  LayerWeights o;
  o.kind = l.kind;
  o.input_norm = l.input_norm;
  o.post_attention_norm = l.post_attention_norm;
  if (l.kind == LayerKind::FullAttention) {
    const AttentionWeights& a = l.attn;
    const int64_t hd = c.head_dim, q_rows = c.attn_output_gate ? 2 * hd : hd;  // per head [q | gate]
    o.attn.q_proj = sl.rows(a.q_proj, s.q_head0 * q_rows, s.q_heads * q_rows);
    o.attn.k_proj = sl.rows(a.k_proj, s.kv_head0 * hd, s.kv_heads * hd);
    o.attn.v_proj = sl.rows(a.v_proj, s.kv_head0 * hd, s.kv_heads * hd);
    o.attn.o_proj = sl.cols(p + "self_attn.o_proj", a.o_proj, {{s.q_head0 * hd, s.q_heads * hd}});
    o.attn.q_norm = a.q_norm;
    o.attn.k_norm = a.k_norm;
  } else {
    const DeltaNetWeights& d = l.deltanet;
    const int64_t Hk = c.linear_k_heads, dk = c.linear_k_dim, dv = c.linear_v_dim,
                  G = c.linear_v_heads / c.linear_k_heads;  // value heads per key head
    const int64_t v0 = s.k_head0 * G, vn = s.k_heads * G;
    // conv channels (and in_proj_qkv rows) are [q (Hk·dk) | k (Hk·dk) | v (Hv·dv)]
    const Range qkv[] = {{s.k_head0 * dk, s.k_heads * dk}, {Hk * dk + s.k_head0 * dk, s.k_heads * dk},
                         {2 * Hk * dk + v0 * dv, vn * dv}};
    DeltaNetWeights& od = o.deltanet;
    od.in_proj_qkv = sl.gather_rows(d.in_proj_qkv, qkv);
    od.conv1d = sl.gather_rows(d.conv1d, qkv);
    od.in_proj_z = sl.rows(d.in_proj_z, v0 * dv, vn * dv);
    od.in_proj_b = sl.rows_padded(d.in_proj_b, v0, vn, sc.gate_rows());
    od.in_proj_a = sl.rows_padded(d.in_proj_a, v0, vn, sc.gate_rows());
    od.dt_bias = sl.rows(d.dt_bias, v0, vn);
    od.a_neg_exp = sl.rows(d.a_neg_exp, v0, vn);
    od.norm = d.norm;
    if (d.out_proj_heads.empty()) {
      od.out_proj = sl.cols(p + "linear_attn.out_proj", d.out_proj, {{v0 * dv, vn * dv}});
    } else {  // column block q holds head out_proj_heads[q]: keep this rank's blocks, in order
      std::vector<Range> ranges;
      bool identity = true;
      for (size_t q = 0; q < d.out_proj_heads.size(); ++q) {
        const int32_t h = d.out_proj_heads[q];
        if (h < v0 || h >= v0 + vn) continue;
        identity = identity && h - v0 == int64_t(od.out_proj_heads.size());
        od.out_proj_heads.push_back(int32_t(h - v0));
        ranges.push_back({int64_t(q) * dv, dv});
      }
      od.out_proj = sl.cols(p + "linear_attn.out_proj", d.out_proj, ranges);
      if (identity) od.out_proj_heads.clear();
    }
  }
  if (c.moe) {
    o.moe.router = l.moe.router;
    if (s.shared > 0) o.moe.shared_gate = l.moe.shared_gate;
    if (s.experts)  // expert parallelism: whole experts, views of the full ones
      o.moe.experts.assign(l.moe.experts.begin() + s.expert0, l.moe.experts.begin() + s.expert0 + s.experts);
    else
      for (size_t e = 0; e < l.moe.experts.size(); ++e)
        o.moe.experts.push_back(
            shard_mlp(l.moe.experts[e], s.moe0, s.moe, sl, p + "mlp.experts." + std::to_string(e) + "."));
    if (!l.moe.shared.gate_proj.empty() && s.shared > 0)
      o.moe.shared = shard_mlp(l.moe.shared, s.shared0, s.shared, sl, p + "mlp.shared_expert.");
  } else {
    o.mlp = shard_mlp(l.mlp, s.ffn0, s.ffn, sl, p + "mlp.");
  }
  return o;
}

}  // namespace

std::vector<TpShard> plan_tensor_parallel(const ModelConfig& c, int ranks, std::span<const double> ratios,
                                          int64_t col_block, bool expert_parallel) {
  QWEN36_CHECK(ranks >= 1 && ranks <= 64, "tensor parallel: {} ranks is out of range (1..64)", ranks);
  QWEN36_CHECK(col_block >= 1, "tensor parallel: column block {} must be positive", col_block);
  const bool even = ratios.empty();
  std::vector<double> w(size_t(ranks), 1.0);
  if (!even) {
    QWEN36_CHECK(int(ratios.size()) == ranks, "--tensor-split has {} values for {} ranks", ratios.size(), ranks);
    for (double r : ratios) QWEN36_CHECK(r > 0 && std::isfinite(r), "--tensor-split: {} is not a positive ratio", r);
    w.assign(ratios.begin(), ratios.end());
  }
  std::vector<TpShard> out(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    out[size_t(r)].rank = r;
    out[size_t(r)].ranks = ranks;
  }

  if (c.n_full_attention_layers() > 0 || c.mtp_layers > 0) {
    const int64_t nh = c.n_heads, nkv = c.n_kv_heads, g = nh / nkv;
    if (even && ranks > nkv) {  // more ranks than kv heads: each kv head serves ranks/nkv ranks
      QWEN36_CHECK(ranks % nkv == 0 && nh % ranks == 0,
                   "tensor parallel: {} attention heads with {} kv heads cannot be split over {} ranks", nh, nkv,
                   ranks);
      const int64_t per = nh / ranks, rep = ranks / nkv;
      for (int r = 0; r < ranks; ++r) {
        TpShard& s = out[size_t(r)];
        s.q_head0 = r * per, s.q_heads = per;
        s.kv_head0 = r / rep, s.kv_heads = 1;
      }
    } else {
      const auto kv = apportion("attention kv heads", nkv, w, even);
      for (int r = 0; r < ranks; ++r) {
        TpShard& s = out[size_t(r)];
        s.kv_head0 = kv[size_t(r)].first, s.kv_heads = kv[size_t(r)].second;
        s.q_head0 = s.kv_head0 * g, s.q_heads = s.kv_heads * g;
      }
    }
  }
  if (c.n_linear_layers() > 0) {
    const auto k = apportion("DeltaNet key heads", c.linear_k_heads, w, even);
    for (int r = 0; r < ranks; ++r) std::tie(out[size_t(r)].k_head0, out[size_t(r)].k_heads) = k[size_t(r)];
  }
  // Intermediate dimensions in whole column blocks.
  auto split_cols = [&](const char* what, int64_t n, int64_t TpShard::*first, int64_t TpShard::*count) {
    QWEN36_CHECK(n % col_block == 0, "tensor parallel: {} ({}) is not a whole number of {}-element blocks", what, n,
                 col_block);
    const auto parts = apportion(what, n / col_block, w, even);
    for (int r = 0; r < ranks; ++r) {
      out[size_t(r)].*first = parts[size_t(r)].first * col_block;
      out[size_t(r)].*count = parts[size_t(r)].second * col_block;
    }
  };
  QWEN36_CHECK(!expert_parallel || c.moe, "--expert-parallel: the model has no routed experts");
  QWEN36_CHECK(c.n_local_experts() == c.n_experts, "tensor parallel: the model already holds only some of its experts");
  if (c.moe && expert_parallel) {
    const auto ex = apportion("routed experts", c.n_experts, w, even);
    for (int r = 0; r < ranks; ++r) {
      TpShard& s = out[size_t(r)];
      std::tie(s.expert0, s.experts) = ex[size_t(r)];
      s.moe0 = 0, s.moe = c.moe_intermediate_size;
      // The shared expert whole on rank 0: it costs one routed expert's work, and its columns
      // need not split into whole blocks (the 35B-A3B's 512 over 4 ranks would be 128).
      s.shared0 = 0, s.shared = r == 0 ? c.shared_expert_intermediate_size : 0;
    }
  } else if (c.moe) {
    split_cols("moe_intermediate_size", c.moe_intermediate_size, &TpShard::moe0, &TpShard::moe);
    if (c.shared_expert_intermediate_size > 0)
      split_cols("shared_expert_intermediate_size", c.shared_expert_intermediate_size, &TpShard::shared0,
                 &TpShard::shared);
  } else {
    split_cols("intermediate_size", c.intermediate_size, &TpShard::ffn0, &TpShard::ffn);
  }
  return out;
}

ModelConfig shard_config(const ModelConfig& c, const TpShard& s) {
  ModelConfig o = c;
  if (c.n_full_attention_layers() > 0 || c.mtp_layers > 0) o.n_heads = s.q_heads, o.n_kv_heads = s.kv_heads;
  if (c.n_linear_layers() > 0) {
    o.linear_v_heads = s.k_heads * (c.linear_v_heads / c.linear_k_heads);
    o.linear_k_heads = s.k_heads;
    o.linear_gate_rows = (o.linear_v_heads + 15) / 16 * 16;  // whole 16-row tiles (ModelConfig)
  }
  if (c.moe) {
    o.moe_intermediate_size = s.moe;
    if (s.experts) o.expert0 = s.expert0, o.local_experts = s.experts;
    if (c.shared_expert_intermediate_size > 0) o.shared_expert_intermediate_size = s.shared;
  } else {
    o.intermediate_size = s.ffn;
  }
  o.validate();
  return o;
}

ModelWeights shard_weights(const ModelWeights& w, const TpShard& s) {
  const ModelConfig& c = w.config;
  ModelWeights o;
  o.config = shard_config(c, s);
  o.storage = w.storage;
  o.embed_tokens = w.embed_tokens;
  o.final_norm = w.final_norm;
  o.lm_head = w.lm_head;
  Slicer sl(o);
  for (size_t i = 0; i < w.layers.size(); ++i)
    o.layers.push_back(shard_layer(c, o.config, w.layers[i], s, sl, "layers." + std::to_string(i) + "."));
  if (w.mtp) {
    const MtpWeights& m = *w.mtp;
    o.mtp = MtpWeights{m.fc, m.pre_fc_norm_embedding, m.pre_fc_norm_hidden, m.norm,
                       shard_layer(c, o.config, m.layer, s, sl, "mtp.layers.0.")};
  }
  return o;
}

int64_t column_block(const ModelWeights& w) {
  int64_t b = 1;
  auto see = [&](const Tensor& t) {
    if (!t.empty()) b = std::max(b, dtype_block_elems(t.dtype));
  };
  auto layer = [&](const LayerWeights& l) {
    see(l.attn.o_proj);
    see(l.deltanet.out_proj);
    see(l.mlp.down_proj);
    see(l.moe.shared.down_proj);
    for (const MlpWeights& e : l.moe.experts) see(e.down_proj);
  };
  for (const LayerWeights& l : w.layers) layer(l);
  if (w.mtp) layer(w.mtp->layer);
  return b;
}

}  // namespace qwen36
