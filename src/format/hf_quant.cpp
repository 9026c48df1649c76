// Quantized Hugging Face checkpoints: detection (config.json / hf_quant_config.json) and the
// exact conversion of each stored layout into the internal blocks of quant/hf_blocks.h.
// Layouts (shapes in torch order, N = out_features, K = in_features, G = group size):
//   AWQ gemm   qweight i32 [K, N/8] packed along N, nibble i = column ORDER[i] (0,2,4,6,1,3,5,7);
//              qzeros i32 [K/G, N/8] packed the same way; scales f16 [K/G, N]; w = (q - z) s
//   GPTQ       qweight i32 [K/8, N] packed along K (k = 8r + i at bits 4i); qzeros i32
//              [K/G, N/8] packed along N; scales f16 [K/G, N]; g_idx i32 [K] (group of row k);
//              w = (q - (z + 1)) s for v1 ("gptq"), (q - z) s for v2
//   compressed-tensors pack-quantized: weight_packed i32 [N, K/8] packed along K, stored q + 8;
//              weight_scale [N, K/G]; weight_zero_point i32 [N/8, K/G] packed along N, stored
//              zp + 8 (asymmetric only); weight_shape i64 [2]; w = (q - zp) s
//   FP8        weight e4m3 [N, K]; weight_scale_inv f32 [N/bn, K/128] (multiplied, despite the name)
//   NVFP4      weight / weight_packed u8 [N, K/2] (element 2i low nibble); weight_scale e4m3
//              [N, K/16]; modelopt weight_scale_2 f32 (multiplied), compressed-tensors
//              weight_global_scale f32 (divided: we multiply by 1/global computed in f32, as vLLM)
#include "format/hf_quant.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/error.h"
#include "core/log.h"
#include "format/safetensors.h"
#include "format/weight_convert.h"
#include "model/weights.h"
#include "quant/hf_blocks.h"

namespace qwen36 {

namespace {

using json = nlohmann::json;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

std::string str_field(const json& j, const char* key, const std::string& dflt = "") {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : dflt;
}
int64_t int_field(const json& j, const char* key, int64_t dflt) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : dflt;
}
bool bool_field(const json& j, const char* key, bool dflt) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : dflt;
}

[[noreturn]] void unsupported(const std::string& fmt_name, const std::string& what) {
  fail("{} checkpoint: {} is not supported", fmt_name, what);
}

void check_bits(const std::string& f, int64_t bits) {
  if (bits != 4) unsupported(f, fmt::format("bits={} (only 4-bit weights)", bits));
}

void check_group(const std::string& f, int64_t g) {
  if (g != -1 && (g <= 0 || g % 32 != 0))
    unsupported(f, fmt::format("group_size={} (multiples of 32, or -1 for per-channel)", g));
}

HfQuant parse_awq(const json& q) {
  HfQuant h;
  h.format = HfQuantFormat::Awq;
  check_bits("awq", int_field(q, "bits", int_field(q, "w_bit", 4)));
  h.group_size = int_field(q, "group_size", int_field(q, "q_group_size", 128));
  check_group("awq", h.group_size);
  const std::string version = lower(str_field(q, "version", "gemm"));
  if (version != "gemm") unsupported("awq", fmt::format("version \"{}\" (only the gemm layout)", version));
  if (!bool_field(q, "zero_point", true)) unsupported("awq", "zero_point=false");
  return h;
}

HfQuant parse_gptq(const json& q) {
  HfQuant h;
  h.format = HfQuantFormat::Gptq;
  check_bits("gptq", int_field(q, "bits", 4));
  h.group_size = int_field(q, "group_size", 128);
  check_group("gptq", h.group_size);
  h.desc_act = bool_field(q, "desc_act", false);
  h.symmetric = bool_field(q, "sym", true);
  std::string cf = lower(str_field(q, "checkpoint_format", str_field(q, "format", "gptq")));
  if (cf == "gptq") {
    h.zero_offset = 1;
  } else if (cf == "gptq_v2") {
    h.zero_offset = 0;
  } else {
    unsupported("gptq", fmt::format("checkpoint_format \"{}\" (gptq or gptq_v2)", cf));
  }
  return h;
}

HfQuant parse_compressed(const json& q) {
  const std::string top_format = str_field(q, "format", "");
  const json* groups = q.contains("config_groups") && q["config_groups"].is_object() ? &q["config_groups"] : nullptr;
  if (!groups || groups->empty()) unsupported("compressed-tensors", "a quantization_config without config_groups");
  HfQuant h;
  bool first = true;
  for (const auto& [name, g] : groups->items()) {
    const std::string f = str_field(g, "format", top_format);
    const json w = g.contains("weights") ? g["weights"] : json();
    if (!w.is_object()) unsupported("compressed-tensors", fmt::format("config group {} without weights", name));
    const json& act = g.contains("input_activations") ? g["input_activations"] : json();
    HfQuant x;
    const std::string type = str_field(w, "type", "int");
    const std::string strategy = str_field(w, "strategy", "");
    check_bits("compressed-tensors", int_field(w, "num_bits", 0));
    if (f == "pack-quantized") {
      x.format = HfQuantFormat::CompressedInt4;
      if (type != "int") unsupported("compressed-tensors", fmt::format("pack-quantized type \"{}\"", type));
      if (!act.is_null()) unsupported("compressed-tensors", "pack-quantized with quantized input_activations");
      x.symmetric = bool_field(w, "symmetric", true);
      if (strategy == "group") {
        x.group_size = int_field(w, "group_size", 0);
        check_group("compressed-tensors", x.group_size);
      } else if (strategy == "channel") {
        x.group_size = -1;
      } else {
        unsupported("compressed-tensors", fmt::format("pack-quantized strategy \"{}\" (group or channel)", strategy));
      }
    } else if (f == "nvfp4-pack-quantized") {
      x.format = HfQuantFormat::CompressedNvfp4;
      if (type != "float" || int_field(w, "group_size", 16) != 16)
        unsupported("compressed-tensors", "nvfp4 weights other than float, group_size 16");
      x.group_size = 16;
    } else {
      unsupported("compressed-tensors", fmt::format("format \"{}\" (pack-quantized, nvfp4-pack-quantized)", f));
    }
    if (first) {
      h = x;
      first = false;
    } else if (x.format != h.format || x.group_size != h.group_size || x.symmetric != h.symmetric) {
      unsupported("compressed-tensors", "config_groups with different weight schemes");
    }
  }
  return h;
}

HfQuant parse_fp8(const json& q) {
  HfQuant h;
  h.format = HfQuantFormat::Fp8Block;
  const std::string fmt_name = lower(str_field(q, "fmt", "e4m3"));
  if (fmt_name != "e4m3") unsupported("fp8", fmt::format("fmt \"{}\" (only e4m3)", fmt_name));
  const auto it = q.find("weight_block_size");
  if (it == q.end() || it->is_null()) unsupported("fp8", "per-tensor scaling (no weight_block_size)");
  if (!it->is_array() || it->size() != 2 || !(*it)[0].is_number_integer() || !(*it)[1].is_number_integer())
    unsupported("fp8", "weight_block_size that is not [rows, cols]");
  h.block_n = (*it)[0].get<int64_t>();
  if ((*it)[1].get<int64_t>() != 128 || h.block_n <= 0)
    unsupported("fp8", fmt::format("weight_block_size {} (columns must be 128)", it->dump()));
  return h;
}

HfQuant parse_modelopt(const json& cfg) {
  // hf_quant_config.json nests the fields under "quantization"; config.json has them flat.
  const json& q = cfg.contains("quantization") && cfg["quantization"].is_object() ? cfg["quantization"] : cfg;
  const std::string algo = str_field(q, "quant_algo", "");
  if (algo != "NVFP4" && algo != "W4A16_NVFP4")
    unsupported("modelopt", fmt::format("quant_algo \"{}\" (NVFP4, W4A16_NVFP4)", algo));
  if (int_field(q, "group_size", 16) != 16)
    unsupported("modelopt", fmt::format("group_size={} (16)", int_field(q, "group_size", 16)));
  HfQuant h;
  h.format = HfQuantFormat::ModeloptNvfp4;
  h.group_size = 16;
  return h;
}

json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  json j = json::parse(in, nullptr, false);
  QWEN36_CHECK(!j.is_discarded() && j.is_object(), "{}: invalid JSON", p.string());
  return j;
}

// ---- tensor access ----

const Tensor& need(const SafetensorsSet& st, const std::string& name, const char* what) {
  const Tensor* t = st.find(name);
  QWEN36_CHECK(t, "{} checkpoint: missing tensor {}", what, name);
  return *t;
}

void expect_shape(const Tensor& t, const std::string& name, DType dt, std::initializer_list<int64_t> want) {
  Tensor e(nullptr, dt, want);
  bool ok = t.dtype == dt && t.ndim == int(want.size());
  int i = 0;
  for (int64_t d : want) ok = ok && t.dim(i++) == d;
  QWEN36_CHECK(ok, "tensor {} is {}, expected {}", name, t.shape_str(), e.shape_str());
}

int32_t i32_at(const Tensor& t, int64_t i) {
  int32_t v;
  std::memcpy(&v, static_cast<const std::byte*>(t.data) + 4 * i, 4);
  return v;
}
uint32_t u32_at(const Tensor& t, int64_t i) { return uint32_t(i32_at(t, i)); }

struct Scale16 {
  uint16_t bits;
  uint8_t kind;  // 0 f16, 1 bf16
};

// A stored scale as the 16 bits the block keeps: f16/bf16 as they are, f32 only when it is
// exactly an f16 or a bf16 value (otherwise the block could not reproduce it).
Scale16 scale16(const Tensor& t, int64_t i, const std::string& name) {
  const uint16_t* h = t.as<const uint16_t>();
  if (t.dtype == DType::F16) return {h[i], 0};
  if (t.dtype == DType::BF16) return {h[i], 1};
  QWEN36_CHECK(t.dtype == DType::F32, "tensor {}: scales of dtype {} (f16, bf16, f32)", name, dtype_name(t.dtype));
  const float f = t.as<const float>()[i];
  const uint16_t a = f32_to_f16(f), b = f32_to_bf16(f);
  if (std::bit_cast<uint32_t>(f16_to_f32(a)) == std::bit_cast<uint32_t>(f)) return {a, 0};
  if (std::bit_cast<uint32_t>(bf16_to_f32(b)) == std::bit_cast<uint32_t>(f)) return {b, 1};
  fail("tensor {}: f32 scale {} is neither an f16 nor a bf16 value", name, f);
}

template <typename B>
Tensor alloc_blocks(ModelWeights& w, DType dt, int64_t N, int64_t K, B*& blocks) {
  auto buf = std::make_shared<HostBuffer>(size_t(N) * dtype_row_bytes(dt, K));
  blocks = reinterpret_cast<B*>(buf->data());
  w.storage.push_back(buf);
  return Tensor(buf->data(), dt, {N, K});
}

// The parts of a W4 layout the block builder reads: code(n, k) in 0..15, zero(n, g) as the
// effective integer zero, scale(n, g), and group(k).
struct W4Source {
  int64_t N = 0, K = 0, groups = 0;
  std::function<int(int64_t, int64_t)> code;
  std::function<int(int64_t, int64_t)> zero;
  std::function<Scale16(int64_t, int64_t)> scale;
  std::vector<int32_t> g_idx;  // empty: group of k is k / G
  int64_t G = 0;
};

int64_t group_of(const W4Source& s, int64_t k) { return s.g_idx.empty() ? k / s.G : s.g_idx[size_t(k)]; }

// Block length L whose blocks each lie in one group (32 or 128), or 0 when none does.
int w4_block_len(const W4Source& s) {
  for (int L : {128, 32}) {
    if (s.K % L) continue;
    bool ok = true;
    for (int64_t b = 0; ok && b < s.K / L; ++b)
      for (int64_t k = b * L + 1; ok && k < (b + 1) * L; ++k) ok = group_of(s, k) == group_of(s, b * L);
    if (ok) return L;
  }
  return 0;
}

template <typename B, int L>
void fill_w4(const W4Source& s, B* out) {
  const int64_t nb = s.K / L;
  std::vector<int32_t> bg(static_cast<size_t>(nb));
  for (int64_t b = 0; b < nb; ++b) bg[size_t(b)] = int32_t(group_of(s, b * L));
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t b = 0; b < nb; ++b) {
      B& blk = out[n * nb + b];
      const int64_t g = bg[size_t(b)];
      const Scale16 sc = s.scale(n, g);
      blk.s = sc.bits;
      blk.kind = sc.kind;
      blk.z = uint8_t(s.zero(n, g));
      for (int j = 0; j < L / 2; ++j)
        blk.qs[j] = uint8_t(s.code(n, b * L + j) | (s.code(n, b * L + j + L / 2) << 4));
    }
}

Tensor build_w4(ModelWeights& w, const W4Source& s, const std::string& module, const char* what) {
  for (int64_t g : s.g_idx)
    QWEN36_CHECK(g >= 0 && g < s.groups, "{} checkpoint: {}.g_idx holds group {} of {}", what, module, g, s.groups);
  const int L = w4_block_len(s);
  if (L == 128) {
    BlockW4G128* b;
    Tensor t = alloc_blocks(w, DType::W4_G128, s.N, s.K, b);
    fill_w4<BlockW4G128, 128>(s, b);
    return t;
  }
  if (L == 32) {
    BlockW4G32* b;
    Tensor t = alloc_blocks(w, DType::W4_G32, s.N, s.K, b);
    fill_w4<BlockW4G32, 32>(s, b);
    return t;
  }
  QWEN36_CHECK(!s.g_idx.empty() || s.K % 32 == 0, "{} checkpoint: {}: in_features {} is not a multiple of 32", what,
               module, s.K);
  // Act-order (g_idx mixing groups inside every 32 columns): no block carries one group, so
  // the weights are stored dequantized, exactly (w = s (q - z) in f32), at 32 bits each.
  // One line per module at debug level; the loader warns once with the count (a checkpoint
  // quantized with act-order has this on every Linear).
  spdlog::debug("{}: act-order g_idx mixes groups within 32 columns; stored dequantized as f32", module);
  auto buf = std::make_shared<HostBuffer>(size_t(s.N * s.K) * 4);
  float* y = reinterpret_cast<float*>(buf->data());
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t k = 0; k < s.K; ++k) {
      const int64_t g = group_of(s, k);
      const Scale16 sc = s.scale(n, g);
      y[n * s.K + k] = w4_scale(sc.bits, sc.kind) * float(s.code(n, k) - s.zero(n, g));
    }
  w.storage.push_back(buf);
  return Tensor(buf->data(), DType::F32, {s.N, s.K});
}

std::vector<int32_t> read_g_idx(const Tensor& t, const std::string& name, int64_t K) {
  expect_shape(t, name, DType::I32, {K});
  std::vector<int32_t> v(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) v[size_t(k)] = i32_at(t, k);
  return v;
}

int64_t groups_for(int64_t K, int64_t G) { return G == -1 ? 1 : (K + G - 1) / G; }

// AWQ: column n of a packed word sits in nibble kAwqNibble[n % 8].
constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

Tensor load_awq(ModelWeights& w, const SafetensorsSet& st, const HfQuant& q, const std::string& m) {
  const Tensor& qw = need(st, m + ".qweight", "awq");
  QWEN36_CHECK(qw.dtype == DType::I32 && qw.ndim == 2, "tensor {}.qweight is {}, expected [K, N/8] i32", m,
               qw.shape_str());
  W4Source s;
  s.K = qw.dim(0);
  s.N = qw.dim(1) * 8;
  s.G = q.group_size == -1 ? s.K : q.group_size;
  s.groups = groups_for(s.K, q.group_size);
  const Tensor& qz = need(st, m + ".qzeros", "awq");
  const Tensor& sc = need(st, m + ".scales", "awq");
  expect_shape(qz, m + ".qzeros", DType::I32, {s.groups, s.N / 8});
  QWEN36_CHECK(sc.ndim == 2 && sc.dim(0) == s.groups && sc.dim(1) == s.N, "tensor {}.scales is {}, expected [{}, {}]",
               m, sc.shape_str(), s.groups, s.N);
  const int64_t N8 = s.N / 8, N = s.N;
  s.code = [&qw, N8](int64_t n, int64_t k) { return int(u32_at(qw, k * N8 + n / 8) >> (4 * kAwqNibble[n % 8]) & 15); };
  s.zero = [&qz, N8](int64_t n, int64_t g) { return int(u32_at(qz, g * N8 + n / 8) >> (4 * kAwqNibble[n % 8]) & 15); };
  s.scale = [&sc, N, m](int64_t n, int64_t g) { return scale16(sc, g * N + n, m + ".scales"); };
  return build_w4(w, s, m, "awq");
}

Tensor load_gptq(ModelWeights& w, const SafetensorsSet& st, const HfQuant& q, const std::string& m) {
  const Tensor& qw = need(st, m + ".qweight", "gptq");
  QWEN36_CHECK(qw.dtype == DType::I32 && qw.ndim == 2, "tensor {}.qweight is {}, expected [K/8, N] i32", m,
               qw.shape_str());
  W4Source s;
  s.K = qw.dim(0) * 8;
  s.N = qw.dim(1);
  s.G = q.group_size == -1 ? s.K : q.group_size;
  s.groups = groups_for(s.K, q.group_size);
  const Tensor& qz = need(st, m + ".qzeros", "gptq");
  const Tensor& sc = need(st, m + ".scales", "gptq");
  QWEN36_CHECK(s.N % 8 == 0, "gptq checkpoint: {}: out_features {} is not a multiple of 8", m, s.N);
  expect_shape(qz, m + ".qzeros", DType::I32, {s.groups, s.N / 8});
  QWEN36_CHECK(sc.ndim == 2 && sc.dim(0) == s.groups && sc.dim(1) == s.N, "tensor {}.scales is {}, expected [{}, {}]",
               m, sc.shape_str(), s.groups, s.N);
  if (const Tensor* gi = st.find(m + ".g_idx")) {
    s.g_idx = read_g_idx(*gi, m + ".g_idx", s.K);
  } else {
    QWEN36_CHECK(!q.desc_act, "gptq checkpoint: desc_act=true but {}.g_idx is missing", m);
  }
  const int64_t N8 = s.N / 8, N = s.N;
  const int off = q.zero_offset;
  s.code = [&qw, N](int64_t n, int64_t k) { return int(u32_at(qw, (k / 8) * N + n) >> (4 * (k % 8)) & 15); };
  s.zero = [&qz, N8, off](int64_t n, int64_t g) { return int(u32_at(qz, g * N8 + n / 8) >> (4 * (n % 8)) & 15) + off; };
  s.scale = [&sc, N, m](int64_t n, int64_t g) { return scale16(sc, g * N + n, m + ".scales"); };
  return build_w4(w, s, m, "gptq");
}

Tensor load_compressed_int4(ModelWeights& w, const SafetensorsSet& st, const HfQuant& q, const std::string& m) {
  const char* what = "compressed-tensors";
  const Tensor& wp = need(st, m + ".weight_packed", what);
  QWEN36_CHECK(wp.dtype == DType::I32 && wp.ndim == 2, "tensor {}.weight_packed is {}, expected [N, K/8] i32", m,
               wp.shape_str());
  W4Source s;
  s.N = wp.dim(0);
  s.K = wp.dim(1) * 8;
  if (const Tensor* ws = st.find(m + ".weight_shape")) {
    QWEN36_CHECK(ws->dtype == DType::I64 && ws->numel() == 2, "tensor {}.weight_shape is {}, expected [2] i64", m,
                 ws->shape_str());
    int64_t shape[2];
    std::memcpy(shape, ws->data, 16);
    QWEN36_CHECK(shape[0] == s.N && shape[1] == s.K, "{} checkpoint: {}.weight_shape [{}, {}] does not match "
                 "weight_packed {}", what, m, shape[0], shape[1], wp.shape_str());
  }
  s.G = q.group_size == -1 ? s.K : q.group_size;
  s.groups = groups_for(s.K, q.group_size);
  const Tensor& sc = need(st, m + ".weight_scale", what);
  QWEN36_CHECK(sc.ndim == 2 && sc.dim(0) == s.N && sc.dim(1) == s.groups,
               "tensor {}.weight_scale is {}, expected [{}, {}]", m, sc.shape_str(), s.N, s.groups);
  if (const Tensor* gi = st.find(m + ".weight_g_idx")) s.g_idx = read_g_idx(*gi, m + ".weight_g_idx", s.K);
  const int64_t K8 = s.K / 8, NG = s.groups;
  s.code = [&wp, K8](int64_t n, int64_t k) { return int(u32_at(wp, n * K8 + k / 8) >> (4 * (k % 8)) & 15); };
  s.scale = [&sc, NG, m](int64_t n, int64_t g) { return scale16(sc, n * NG + g, m + ".weight_scale"); };
  if (q.symmetric) {
    s.zero = [](int64_t, int64_t) { return 8; };
  } else {
    const Tensor& zp = need(st, m + ".weight_zero_point", what);
    expect_shape(zp, m + ".weight_zero_point", DType::I32, {(s.N + 7) / 8, s.groups});
    s.zero = [&zp, NG](int64_t n, int64_t g) { return int(u32_at(zp, (n / 8) * NG + g) >> (4 * (n % 8)) & 15); };
  }
  return build_w4(w, s, m, what);
}

Tensor load_fp8(ModelWeights& w, const SafetensorsSet& st, const HfQuant& q, const std::string& m,
                const Tensor& weight) {
  const int64_t N = weight.dim(0), K = weight.dim(1);
  QWEN36_CHECK(K % 128 == 0, "fp8 checkpoint: {}: in_features {} is not a multiple of 128", m, K);
  const Tensor& si = need(st, m + ".weight_scale_inv", "fp8");
  const int64_t sn = (N + q.block_n - 1) / q.block_n, sk = K / 128;
  QWEN36_CHECK(si.ndim == 2 && si.dim(0) == sn && si.dim(1) == sk,
               "tensor {}.weight_scale_inv is {}, expected [{}, {}]", m, si.shape_str(), sn, sk);
  BlockF8B128* b;
  Tensor t = alloc_blocks(w, DType::F8_B128, N, K, b);
  const auto* codes = weight.as<const uint8_t>();
  with_context(m + ".weight_scale_inv", [&] {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < sk; ++j) {
        b[n * sk + j].d = tensor_get_f32(si, (n / q.block_n) * sk + j);
        std::memcpy(b[n * sk + j].q, codes + n * K + j * 128, 128);
      }
  });
  return t;
}

Tensor load_nvfp4(ModelWeights& w, const SafetensorsSet& st, const std::string& m, const Tensor& packed,
                  bool compressed) {
  const char* what = compressed ? "compressed-tensors nvfp4" : "modelopt nvfp4";
  const int64_t N = packed.dim(0), K = packed.dim(1) * 2;
  QWEN36_CHECK(K % 64 == 0, "{} checkpoint: {}: in_features {} is not a multiple of 64", what, m, K);
  const Tensor& sc = need(st, m + ".weight_scale", what);
  QWEN36_CHECK((sc.dtype == DType::F8_E4M3 || sc.dtype == DType::U8) && sc.ndim == 2 && sc.dim(0) == N &&
                   sc.dim(1) == K / 16,
               "tensor {}.weight_scale is {}, expected [{}, {}] f8_e4m3", m, sc.shape_str(), N, K / 16);
  const std::string gname = m + (compressed ? ".weight_global_scale" : ".weight_scale_2");
  const Tensor& gt = need(st, gname, what);
  QWEN36_CHECK(gt.numel() == 1, "tensor {} is {}, expected one value", gname, gt.shape_str());
  const float stored = with_context(gname, [&] { return tensor_get_f32(gt, 0); });
  // compressed-tensors divides by its global scale; the reciprocal is taken once, in f32.
  const float g = compressed ? 1.0f / stored : stored;
  BlockNvfp4B64* b;
  Tensor t = alloc_blocks(w, DType::NVFP4_B64, N, K, b);
  const auto* codes = packed.as<const uint8_t>();
  const auto* scales = sc.as<const uint8_t>();
  const int64_t nb = K / 64;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < nb; ++j) {
      BlockNvfp4B64& blk = b[n * nb + j];
      blk.g = g;
      std::memcpy(blk.s, scales + n * (K / 16) + 4 * j, 4);
      std::memcpy(blk.qs, codes + n * (K / 2) + 32 * j, 32);
    }
  return t;
}

}  // namespace

std::string hf_block_dtype_in(const ModelWeights& w) {
  std::vector<const Tensor*> v{&w.embed_tokens, &w.lm_head};
  auto mlp = [&](const MlpWeights& m) { v.insert(v.end(), {&m.gate_proj, &m.up_proj, &m.down_proj}); };
  auto layer = [&](const LayerWeights& l) {
    v.insert(v.end(), {&l.attn.q_proj, &l.attn.k_proj, &l.attn.v_proj, &l.attn.o_proj, &l.deltanet.in_proj_qkv,
                       &l.deltanet.in_proj_z, &l.deltanet.in_proj_b, &l.deltanet.in_proj_a, &l.deltanet.out_proj,
                       &l.moe.router, &l.moe.shared_gate});
    mlp(l.mlp);
    mlp(l.moe.shared);
    for (const auto& e : l.moe.experts) mlp(e);
  };
  for (const auto& l : w.layers) layer(l);
  if (w.mtp) {
    v.push_back(&w.mtp->fc);
    layer(w.mtp->layer);
  }
  for (const Tensor* t : v)
    if (!t->empty() && dtype_is_hf_block(t->dtype)) return std::string(dtype_name(t->dtype));
  return "";
}

std::string HfQuant::describe() const {
  const std::string g = group_size == -1 ? "per-channel" : fmt::format("group {}", group_size);
  switch (format) {
    case HfQuantFormat::None: return "none";
    case HfQuantFormat::Awq: return "awq 4-bit " + g;
    case HfQuantFormat::Gptq:
      return fmt::format("gptq {} 4-bit {}{}", zero_offset ? "v1" : "v2", g, desc_act ? " desc_act" : "");
    case HfQuantFormat::CompressedInt4:
      return fmt::format("compressed-tensors pack-quantized 4-bit {} {}", g, symmetric ? "symmetric" : "asymmetric");
    case HfQuantFormat::CompressedNvfp4: return "compressed-tensors nvfp4";
    case HfQuantFormat::Fp8Block: return fmt::format("fp8 e4m3 blocks [{}, 128]", block_n);
    case HfQuantFormat::ModeloptNvfp4: return "modelopt nvfp4";
  }
  return "?";
}

HfQuant read_hf_quant(const std::string& dir) {
  namespace fs = std::filesystem;
  HfQuant h;
  const fs::path cfg = fs::path(dir) / "config.json";
  json q;
  if (fs::is_regular_file(cfg)) {
    const json j = read_json(cfg);
    if (j.contains("quantization_config") && !j["quantization_config"].is_null()) q = j["quantization_config"];
    else if (j.contains("text_config") && j["text_config"].is_object() && j["text_config"].contains("quantization_config"))
      q = j["text_config"]["quantization_config"];
  }
  const fs::path mo = fs::path(dir) / "hf_quant_config.json";
  if (q.is_null() && fs::is_regular_file(mo)) {
    const json j = read_json(mo);
    const std::string producer = j.contains("producer") && j["producer"].is_object() ? str_field(j["producer"], "name") : "";
    return with_context(mo.string(), [&] {
      if (producer != "modelopt") unsupported("hf_quant_config.json", fmt::format("producer \"{}\"", producer));
      return parse_modelopt(j);
    });
  }
  if (q.is_null()) return h;
  return with_context(cfg.string(), [&] {
    QWEN36_CHECK(q.is_object(), "quantization_config is not an object");
    const std::string method = lower(str_field(q, "quant_method", ""));
    if (method == "awq") return parse_awq(q);
    if (method == "gptq") return parse_gptq(q);
    if (method == "compressed-tensors" || method == "compressed_tensors") return parse_compressed(q);
    if (method == "fp8") return parse_fp8(q);
    if (method == "modelopt") return parse_modelopt(q);
    fail("quantization method \"{}\" is not supported (supported: awq, gptq, compressed-tensors, fp8, modelopt)",
         method.empty() ? "(missing quant_method)" : method);
  });
}

bool load_hf_quant_linear(ModelWeights& w, const SafetensorsSet& st, const HfQuant& q, const std::string& m,
                          Tensor& out) {
  const Tensor* weight = st.find(m + ".weight");
  switch (q.format) {
    case HfQuantFormat::None: return false;
    case HfQuantFormat::Awq:
      if (!st.find(m + ".qweight")) return false;
      out = load_awq(w, st, q, m);
      return true;
    case HfQuantFormat::Gptq:
      if (!st.find(m + ".qweight")) return false;
      out = load_gptq(w, st, q, m);
      return true;
    case HfQuantFormat::CompressedInt4:
      if (!st.find(m + ".weight_packed")) return false;
      out = load_compressed_int4(w, st, q, m);
      return true;
    case HfQuantFormat::CompressedNvfp4:
      if (const Tensor* p = st.find(m + ".weight_packed")) {
        QWEN36_CHECK(p->dtype == DType::U8 && p->ndim == 2, "tensor {}.weight_packed is {}, expected [N, K/2] u8", m,
                     p->shape_str());
        out = load_nvfp4(w, st, m, *p, true);
        return true;
      }
      return false;
    case HfQuantFormat::Fp8Block:
      if (!weight || weight->dtype != DType::F8_E4M3) return false;
      QWEN36_CHECK(weight->ndim == 2, "tensor {}.weight is {}, expected a matrix", m, weight->shape_str());
      out = load_fp8(w, st, q, m, *weight);
      return true;
    case HfQuantFormat::ModeloptNvfp4:
      if (!weight || weight->dtype != DType::U8) return false;
      QWEN36_CHECK(weight->ndim == 2, "tensor {}.weight is {}, expected a matrix", m, weight->shape_str());
      out = load_nvfp4(w, st, m, *weight, false);
      return true;
  }
  return false;
}

}  // namespace qwen36
