// The DFlash drafter's forward pass against the backend contract (see dflash.h for the
// model, the context projection and the block causality). Shapes: T = block rows of the
// batch (blocks · B), H = hidden, nh / nkv = query / key-value heads, hd = head_dim.
#include "model/dflash.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/qwen36.h"
#include "model/random_weights.h"

namespace qwen36 {

namespace {

// Activations of one call, each its own backend allocation (the drafter's passes are few
// and small next to the target's; a device backend would want a reused workspace).
class Arena {
 public:
  explicit Arena(Backend& b) : b_(b) {}
  Tensor f32(std::initializer_list<int64_t> shape) {
    Tensor t(nullptr, DType::F32, shape);
    bufs_.push_back(b_.alloc(t.nbytes()));
    t.data = bufs_.back()->data();
    return t;
  }

 private:
  Backend& b_;
  std::vector<std::unique_ptr<DeviceBuffer>> bufs_;
};

void expect_shape(const Tensor& t, std::initializer_list<int64_t> dims, const std::string& name) {
  bool ok = !t.empty() && t.ndim == int(dims.size());
  std::string want;
  int i = 0;
  for (int64_t d : dims) {
    ok = ok && t.dim(i++) == d;
    if (!want.empty()) want += ", ";
    want += std::to_string(d);
  }
  QWEN36_CHECK(ok, "DFlash drafter: tensor {} is {}, expected [{}]", name, t.empty() ? "missing" : t.shape_str(), want);
}

void expect_f32_vector(const Tensor& t, int64_t n, const std::string& name) {
  expect_shape(t, {n}, name);
  QWEN36_CHECK(t.dtype == DType::F32, "DFlash drafter: tensor {} must be f32 (converted at load)", name);
}

}  // namespace

void DFlashConfig::validate() const {
  QWEN36_CHECK(hidden_size > 0 && n_layers > 0 && n_heads > 0 && n_kv_heads > 0 && head_dim > 0 &&
                   intermediate_size > 0,
               "DFlash config: hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim "
               "and intermediate_size must be positive");
  QWEN36_CHECK(n_heads % n_kv_heads == 0, "DFlash config: num_attention_heads {} is not a multiple of num_key_value_heads {}",
               n_heads, n_kv_heads);
  QWEN36_CHECK(head_dim % 2 == 0, "DFlash config: head_dim {} must be even (RoPE)", head_dim);
  QWEN36_CHECK(int64_t(sliding.size()) == n_layers, "DFlash config: layer_types has {} entries for {} layers",
               sliding.size(), n_layers);
  const bool any_sliding = std::find(sliding.begin(), sliding.end(), true) != sliding.end();
  QWEN36_CHECK(!any_sliding || sliding_window > 0, "DFlash config: sliding_attention layers need a positive sliding_window");
  QWEN36_CHECK(!target_layer_ids.empty(), "DFlash config: target_layer_ids is empty");
  for (size_t i = 0; i < target_layer_ids.size(); ++i)
    QWEN36_CHECK(target_layer_ids[i] >= 0 && (i == 0 || target_layer_ids[i] > target_layer_ids[i - 1]),
                 "DFlash config: target_layer_ids must be increasing non-negative layer indices");
  QWEN36_CHECK(block_size >= 2 && block_size <= 17, "DFlash config: block_size {} is outside 2..17 (at most 16 drafts)",
               block_size);
  QWEN36_CHECK(mask_token_id >= 0, "DFlash config: mask_token_id is missing");
  QWEN36_CHECK(rope_theta > 0 && rms_norm_eps > 0, "DFlash config: rope_theta and rms_norm_eps must be positive");
}

std::string DFlashConfig::summary() const {
  int64_t n_sliding = 0;
  for (bool s : sliding) n_sliding += s;
  std::string ids;
  for (int32_t i : target_layer_ids) {
    if (!ids.empty()) ids += ",";
    ids += std::to_string(i);
  }
  return fmt::format("DFlash drafter: {} layers ({} sliding, window {}), hidden {}, heads {}/{}x{}, ffn {}, block {}, "
                     "mask {}, target layers [{}]",
                     n_layers, n_sliding, sliding_window, hidden_size, n_heads, n_kv_heads, head_dim,
                     intermediate_size, block_size, mask_token_id, ids);
}

DFlashModel::DFlashModel(DFlashWeights w, const Model& target, Backend& backend, int32_t slots, int64_t capacity,
                         DFlashOptions opts)
    : w_(std::move(w)), target_(target), b_(backend), opts_(opts), slots_(slots), capacity_(capacity) {
  const DFlashConfig& c = w_.config;
  const ModelConfig& tc = target.config();
  c.validate();
  const int64_t H = c.hidden_size, q_rows = c.n_heads * c.head_dim, kv_rows = c.n_kv_heads * c.head_dim;
  QWEN36_CHECK(H == tc.hidden_size, "DFlash drafter: hidden_size {} differs from the target's {} (it uses the target's "
               "embedding and lm_head)", H, tc.hidden_size);
  QWEN36_CHECK(c.target_layer_ids.back() < tc.n_layers, "DFlash drafter: target layer {} does not exist (the target has {})",
               c.target_layer_ids.back(), tc.n_layers);
  QWEN36_CHECK(c.mask_token_id < tc.vocab_size, "DFlash drafter: mask_token_id {} is outside the target vocabulary ({})",
               c.mask_token_id, tc.vocab_size);
  block_ = opts.block_size > 0 ? opts.block_size : c.block_size;
  QWEN36_CHECK(block_ >= 2 && block_ <= 17, "DFlash: block size {} is outside 2..17 (at most 16 drafts)", block_);
  QWEN36_CHECK(slots > 0 && capacity > block_, "DFlash: {} slots of {} positions", slots, capacity);

  expect_shape(w_.fc, {H, feature_width()}, "fc.weight");
  expect_f32_vector(w_.hidden_norm, H, "hidden_norm.weight");
  expect_f32_vector(w_.norm, H, "norm.weight");
  QWEN36_CHECK(int64_t(w_.layers.size()) == c.n_layers, "DFlash drafter: {} layers loaded, config says {}",
               w_.layers.size(), c.n_layers);
  for (size_t i = 0; i < w_.layers.size(); ++i) {
    const DFlashLayer& l = w_.layers[i];
    const std::string p = fmt::format("layers.{}.", i);
    expect_f32_vector(l.input_norm, H, p + "input_layernorm.weight");
    expect_f32_vector(l.post_attention_norm, H, p + "post_attention_layernorm.weight");
    expect_shape(l.q_proj, {q_rows, H}, p + "self_attn.q_proj.weight");
    expect_shape(l.k_proj, {kv_rows, H}, p + "self_attn.k_proj.weight");
    expect_shape(l.v_proj, {kv_rows, H}, p + "self_attn.v_proj.weight");
    expect_shape(l.o_proj, {H, q_rows}, p + "self_attn.o_proj.weight");
    expect_f32_vector(l.q_norm, c.head_dim, p + "self_attn.q_norm.weight");
    expect_f32_vector(l.k_norm, c.head_dim, p + "self_attn.k_norm.weight");
    expect_shape(l.mlp.gate_proj, {c.intermediate_size, H}, p + "mlp.gate_proj.weight");
    expect_shape(l.mlp.up_proj, {c.intermediate_size, H}, p + "mlp.up_proj.weight");
    expect_shape(l.mlp.down_proj, {H, c.intermediate_size}, p + "mlp.down_proj.weight");
  }

  // A device backend gets its own copy of every weight (the target's prepare_weights is one
  // model per backend); the CPU backend reads the host views in place.
  if (b_.name() != "cpu") {
    auto upload = [&](Tensor& x) {
      std::unique_ptr<DeviceBuffer> buf = b_.alloc(x.nbytes());
      Tensor d = x;
      d.data = buf->data();
      b_.copy_from_host(x.data, d);
      x = d;
      buffers_.push_back(std::move(buf));
    };
    for (Tensor* x : {&w_.fc, &w_.hidden_norm, &w_.norm}) upload(*x);
    for (DFlashLayer& l : w_.layers)
      for (Tensor* x : {&l.input_norm, &l.post_attention_norm, &l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.q_norm,
                        &l.k_norm, &l.mlp.gate_proj, &l.mlp.up_proj, &l.mlp.down_proj})
        upload(*x);
  }
  for (int64_t i = 0; i < c.n_layers; ++i) {
    for (auto* cache : {&k_cache_, &v_cache_}) {
      Tensor t(nullptr, DType::F32, {slots, capacity, c.n_kv_heads, c.head_dim});
      buffers_.push_back(b_.alloc(t.nbytes()));
      t.data = buffers_.back()->data();
      cache->push_back(t);
    }
  }
}

int64_t DFlashModel::vocab_size() const { return target_.config().vocab_size; }

size_t DFlashModel::cache_bytes() const {
  size_t n = 0;
  for (const Tensor& t : k_cache_) n += 2 * t.nbytes();
  return n;
}

void DFlashModel::write_kv(int64_t layer, const Tensor& k, const Tensor& v, int32_t slot, int32_t pos0, int64_t row0,
                           int64_t n) {
  const int64_t row = w_.config.n_kv_heads * w_.config.head_dim;
  const std::pair<const Tensor*, Tensor*> parts[] = {{&k, &k_cache_[size_t(layer)]}, {&v, &v_cache_[size_t(layer)]}};
  for (const auto& [src, cache] : parts) {
    const Tensor from(src->as<float>() + row0 * row, DType::F32, {n, row});
    Tensor to(cache->as<float>() + (int64_t(slot) * capacity_ + pos0) * row, DType::F32, {n, row});
    b_.copy(from, to);
  }
}

void DFlashModel::add_context(int32_t slot, int32_t pos0, std::span<const float> features) {
  const DFlashConfig& c = w_.config;
  const int64_t F = feature_width(), H = c.hidden_size, nkv = c.n_kv_heads, hd = c.head_dim;
  const int64_t n = int64_t(features.size()) / F;
  QWEN36_CHECK(int64_t(features.size()) == n * F, "DFlash: {} context values are not rows of {}", features.size(), F);
  QWEN36_CHECK(slot >= 0 && slot < slots_, "DFlash: slot {} out of range", slot);
  QWEN36_CHECK(pos0 >= 0 && pos0 + n + block_ <= capacity_, "DFlash: context positions {}..{} (and a block) exceed {}",
               pos0, pos0 + n - 1, capacity_);
  constexpr int64_t kChunk = 256;  // bounds the activations of a long prompt
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t m = std::min(kChunk, n - c0);
    Arena a(b_);
    Tensor f = a.f32({m, F}), th = a.f32({m, H});
    b_.copy_from_host(features.data() + c0 * F, f);
    b_.matmul(f, w_.fc, th);
    b_.rms_norm(th, w_.hidden_norm, c.rms_norm_eps, th);
    const SeqRun run{slot, pos0 + int32_t(c0), 0, int32_t(m)};
    Tensor k = a.f32({m, nkv, hd}), v = a.f32({m, nkv, hd});
    for (int64_t i = 0; i < c.n_layers; ++i) {
      const DFlashLayer& l = w_.layers[size_t(i)];
      const Tensor* ws[] = {&l.k_proj, &l.v_proj};
      Tensor* outs[] = {&k, &v};
      b_.matmul_multi(th, ws, outs);  // the context rows skip input_layernorm (reference)
      b_.rms_norm(k, l.k_norm, c.rms_norm_eps, k);
      b_.rope(k, std::span(&run, 1), hd, c.rope_theta);
      write_kv(i, k, v, slot, run.pos0, 0, m);
    }
  }
}

// Attention of the block rows of layer `layer`: causal within the block, or non-causal (every
// row sees the whole block). The backend's attention op is causal and appends the rows' K/V;
// non-causal rows are run as one-token runs at the block's last position, each passing that
// position's own K/V (identical rewrites), after the whole block's K/V has been written.
void DFlashModel::attend(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v,
                         std::span<const DFlashBlock> blocks, Tensor& out) {
  const DFlashConfig& c = w_.config;
  const bool sliding = c.sliding[size_t(layer)];
  const bool causal = sliding && opts_.sliding_causal;
  const int64_t B = block_, nh = c.n_heads, nkv = c.n_kv_heads, hd = c.head_dim, T = q.dim(0);
  const float scale = 1.0f / std::sqrt(float(hd));
  Tensor& kc = k_cache_[size_t(layer)];
  Tensor& vc = v_cache_[size_t(layer)];

  Arena a(b_);
  Tensor k_run = k, v_run = v;  // the K/V each run appends
  if (!causal) {
    std::vector<int32_t> last;
    for (size_t i = 0; i < blocks.size(); ++i) {
      write_kv(layer, k, v, blocks[i].slot, blocks[i].pos, int64_t(i) * B, B);
      for (int64_t j = 0; j < B; ++j) last.push_back(int32_t(int64_t(i) * B + B - 1));
    }
    k_run = a.f32({T, nkv, hd});
    v_run = a.f32({T, nkv, hd});
    Tensor k2(k.data, DType::F32, {T, nkv * hd}), v2(v.data, DType::F32, {T, nkv * hd});
    Tensor kr2(k_run.data, DType::F32, {T, nkv * hd}), vr2(v_run.data, DType::F32, {T, nkv * hd});
    b_.get_rows(k2, last, kr2);
    b_.get_rows(v2, last, vr2);
  }
  // Runs of one block in a cache whose position 0 is the block's `lo`.
  auto block_runs = [&](const DFlashBlock& bl, int32_t slot, int32_t lo, int32_t begin) {
    std::vector<SeqRun> runs;
    if (causal) {
      runs.push_back({slot, bl.pos - lo, begin, int32_t(B)});
    } else {
      for (int32_t j = 0; j < B; ++j) runs.push_back({slot, bl.pos + int32_t(B) - 1 - lo, begin + j, 1});
    }
    return runs;
  };
  auto window_lo = [&](const DFlashBlock& bl) {
    return sliding ? int32_t(std::clamp<int64_t>(bl.pos + B - c.sliding_window, 0, bl.pos)) : 0;
  };
  const bool windowed = std::any_of(blocks.begin(), blocks.end(), [&](const DFlashBlock& bl) { return window_lo(bl) > 0; });
  if (!windowed) {
    std::vector<SeqRun> runs;
    for (size_t i = 0; i < blocks.size(); ++i) {
      const auto r = block_runs(blocks[i], blocks[i].slot, 0, int32_t(int64_t(i) * B));
      runs.insert(runs.end(), r.begin(), r.end());
    }
    b_.attention(q, k_run, v_run, kc, vc, runs, scale, out);
    return;
  }
  // Past the window: block by block, on a view of the slot's cache that starts at the window.
  const int64_t row = nkv * hd;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const DFlashBlock& bl = blocks[i];
    const int32_t lo = window_lo(bl);
    const int64_t r0 = int64_t(i) * B;
    auto rows = [&](const Tensor& x, int64_t heads) {
      return Tensor(x.as<float>() + r0 * heads * hd, DType::F32, {B, heads, hd});
    };
    const Tensor qi = rows(q, nh), ki = rows(k_run, nkv), vi = rows(v_run, nkv);
    Tensor oi = rows(out, nh);
    Tensor kv(kc.as<float>() + (int64_t(bl.slot) * capacity_ + lo) * row, DType::F32, {1, capacity_ - lo, nkv, hd});
    Tensor vv(vc.as<float>() + (int64_t(bl.slot) * capacity_ + lo) * row, DType::F32, {1, capacity_ - lo, nkv, hd});
    b_.attention(qi, ki, vi, kv, vv, block_runs(bl, 0, lo, 0), scale, oi);
  }
}

void DFlashModel::draft(std::span<const DFlashBlock> blocks, float* logits) {
  pass(blocks, [&](Tensor& out) { b_.copy_to_host(out, logits); });
}

void DFlashModel::draft_argmax(std::span<const DFlashBlock> blocks, int32_t* best) {
  pass(blocks, [&](Tensor& out) {
    const size_t n = size_t(out.rows());
    const std::vector<SampleRowParams> greedy(n);  // temperature 0, no penalties
    std::vector<float> vals(n), stats(3 * n);
    b_.sample_candidates(out, greedy, {}, 1, best, vals.data(), stats.data());
  });
}

void DFlashModel::draft_topk(std::span<const DFlashBlock> blocks, int32_t k, int32_t* ids, float* probs) {
  pass(blocks, [&](Tensor& out) {
    const size_t n = size_t(out.rows());
    const std::vector<SampleRowParams> greedy(n);  // temperature 0: stats of the logits themselves
    std::vector<float> stats(3 * n);
    b_.sample_candidates(out, greedy, {}, k, ids, probs, stats.data());
    for (size_t r = 0; r < n; ++r)  // the candidates' logits → softmax probabilities
      for (size_t j = 0; j < size_t(k); ++j) {
        float& p = probs[r * size_t(k) + j];
        p = std::exp(p - stats[3 * r]) / stats[3 * r + 1];
      }
  });
}

void DFlashModel::pass(std::span<const DFlashBlock> blocks, const std::function<void(Tensor&)>& take) {
  const DFlashConfig& c = w_.config;
  const ModelWeights& tw = target_.weights();
  const int64_t nb = int64_t(blocks.size()), B = block_, T = nb * B, H = c.hidden_size, nh = c.n_heads,
                nkv = c.n_kv_heads, hd = c.head_dim, V = target_.config().vocab_size;
  if (nb == 0) return;
  std::vector<int32_t> ids(size_t(T), c.mask_token_id);
  std::vector<SeqRun> runs;
  for (int64_t i = 0; i < nb; ++i) {
    const DFlashBlock& bl = blocks[size_t(i)];
    QWEN36_CHECK(bl.slot >= 0 && bl.slot < slots_, "DFlash: slot {} out of range", bl.slot);
    QWEN36_CHECK(bl.pos >= 0 && bl.pos + B <= capacity_, "DFlash: a block at {} exceeds the capacity {}", bl.pos, capacity_);
    QWEN36_CHECK(bl.anchor >= 0 && bl.anchor < V, "DFlash: anchor token {} outside the vocabulary", bl.anchor);
    ids[size_t(i * B)] = bl.anchor;
    runs.push_back({bl.slot, bl.pos, int32_t(i * B), int32_t(B)});
  }
  Arena a(b_);
  Tensor x = a.f32({T, H}), xn = a.f32({T, H}), y = a.f32({T, H});
  Tensor q = a.f32({T, nh, hd}), k = a.f32({T, nkv, hd}), v = a.f32({T, nkv, hd}), o = a.f32({T, nh, hd});
  Tensor g = a.f32({T, c.intermediate_size}), u = a.f32({T, c.intermediate_size});
  b_.embed(tw.embed_tokens, ids, x);
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const DFlashLayer& l = w_.layers[size_t(i)];
    b_.rms_norm(x, l.input_norm, c.rms_norm_eps, xn);
    const Tensor* ws[] = {&l.q_proj, &l.k_proj, &l.v_proj};
    Tensor* outs[] = {&q, &k, &v};
    b_.matmul_multi(xn, ws, outs);
    b_.rms_norm(q, l.q_norm, c.rms_norm_eps, q);
    b_.rms_norm(k, l.k_norm, c.rms_norm_eps, k);
    b_.rope(q, runs, hd, c.rope_theta);
    b_.rope(k, runs, hd, c.rope_theta);
    attend(i, q, k, v, blocks, o);
    const Tensor o2(o.data, DType::F32, {T, nh * hd});
    b_.matmul(o2, l.o_proj, y);
    b_.add(x, y);
    b_.rms_norm(x, l.post_attention_norm, c.rms_norm_eps, xn);
    b_.mlp(xn, l.mlp, g, u, y);
    b_.add(x, y);
  }
  std::vector<int32_t> rows;  // block positions 1 .. B − 1: the masked ones
  for (int64_t i = 0; i < nb; ++i)
    for (int64_t j = 1; j < B; ++j) rows.push_back(int32_t(i * B + j));
  const int64_t n = int64_t(rows.size());
  Tensor sel = a.f32({n, H}), out = a.f32({n, V});
  b_.get_rows(x, rows, sel);
  b_.rms_norm(sel, w_.norm, c.rms_norm_eps, sel);
  b_.matmul(sel, tw.lm_head, out);
  take(out);
}

DFlashConfig synthetic_dflash_config(const ModelConfig& t, int32_t block_size) {
  DFlashConfig c;
  c.hidden_size = t.hidden_size;
  c.vocab_size = t.vocab_size;
  c.rms_norm_eps = 1e-6f;
  c.rope_theta = 1e7f;
  c.block_size = block_size;
  c.mask_token_id = int32_t(std::min<int64_t>(248070, t.vocab_size - 1));
  int64_t n_ids = 5;
  if (t.hidden_size == 5120 && t.n_layers == 64) {  // Qwen3.6-27B-DFlash
    c.n_layers = 5, c.n_heads = 32, c.n_kv_heads = 8, c.head_dim = 128, c.intermediate_size = 17408;
  } else if (t.hidden_size == 2048 && t.n_layers == 40) {  // Qwen3.6-35B-A3B-DFlash, April revision
    c.n_layers = 8, c.n_heads = 32, c.n_kv_heads = 4, c.head_dim = 128, c.intermediate_size = 6144;
  } else {
    c.n_layers = 5, c.n_heads = t.n_heads, c.n_kv_heads = t.n_kv_heads, c.head_dim = t.head_dim;
    c.intermediate_size = t.intermediate_size > 0 ? t.intermediate_size : 3 * t.hidden_size;
  }
  c.sliding.assign(size_t(c.n_layers), false);
  if (c.n_layers == 5) {
    for (int i = 0; i < 4; ++i) c.sliding[size_t(i)] = true;
    c.sliding_window = 2048;
  }
  if (t.n_layers >= 8) {  // 1 .. L − 3 evenly: [1, 16, 31, 46, 61] of 64, [1, 10, 19, 28, 37] of 40
    for (int64_t i = 0; i < n_ids; ++i) c.target_layer_ids.push_back(int32_t(1 + i * (t.n_layers - 4) / (n_ids - 1)));
  } else {
    n_ids = std::min<int64_t>(n_ids, t.n_layers);
    for (int64_t i = 0; i < n_ids; ++i) c.target_layer_ids.push_back(int32_t(i));
  }
  c.validate();
  return c;
}

DFlashWeights make_random_dflash_weights(const DFlashConfig& c, DType matrix_dtype, uint64_t seed) {
  QWEN36_CHECK(matrix_dtype == DType::BF16 || matrix_dtype == DType::F16 || matrix_dtype == DType::F32,
               "random DFlash drafter: matrices must be bf16, f16 or f32");
  c.validate();
  DFlashWeights w;
  w.config = c;
  uint64_t counter = 0;
  auto make = [&](DType dt, std::initializer_list<int64_t> shape, auto gen) {
    return random_host_tensor(w.storage, dt, shape, seed * 1000003ull + counter++, gen);
  };
  auto matrix = [&](int64_t rows, int64_t cols) {
    const float sd = 1.0f / std::sqrt(float(cols));
    return make(matrix_dtype, {rows, cols}, [sd](SplitMix64& r) { return r.normal() * sd; });
  };
  auto norm = [&](int64_t n) {
    return make(DType::F32, {n}, [](SplitMix64& r) { return 1.0f + (r.uniform() * 2 - 1) * 0.1f; });
  };
  const int64_t H = c.hidden_size, q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  w.fc = matrix(H, int64_t(c.target_layer_ids.size()) * H);
  w.hidden_norm = norm(H);
  w.norm = norm(H);
  for (int64_t i = 0; i < c.n_layers; ++i) {
    DFlashLayer l;
    l.input_norm = norm(H);
    l.post_attention_norm = norm(H);
    l.q_proj = matrix(q, H);
    l.k_proj = matrix(kv, H);
    l.v_proj = matrix(kv, H);
    l.o_proj = matrix(H, q);
    l.q_norm = norm(c.head_dim);
    l.k_norm = norm(c.head_dim);
    l.mlp.gate_proj = matrix(c.intermediate_size, H);
    l.mlp.up_proj = matrix(c.intermediate_size, H);
    l.mlp.down_proj = matrix(H, c.intermediate_size);
    w.layers.push_back(l);
  }
  return w;
}

}  // namespace qwen36
