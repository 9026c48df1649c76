#include "cli/common.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "engine/scheduler.h"
#include "format/lora.h"
#include "format/model_loader.h"
#include "model/expert_placement.h"
#include "model/presets.h"
#include "model/random_weights.h"
#include "text/tokenizer.h"
#ifdef QWEN36_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace qwen36::cli {

namespace {
std::unique_ptr<Backend> make_backend(const std::string& backend, int threads) {
#ifdef QWEN36_HAVE_CUDA
  if (backend == "cuda") return make_cuda_backend();
  QWEN36_CHECK(backend == "cpu", "backend \"{}\" is not available in this build (available: cpu, cuda)", backend);
#else
  QWEN36_CHECK(backend == "cpu", "backend \"{}\" is not available in this build (available: cpu)", backend);
#endif
  return make_cpu_backend(threads);
}
}  // namespace

std::string default_model_path() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("QWEN36_DEFAULT_MODEL"); env && *env) return env;
  const fs::path shipped = fs::path(QWEN36_SOURCE_DIR) / "models" / "qwen36-small-code-q8_0.gguf";
  return fs::exists(shipped) ? shipped.string() : "";
}

void add_lora_options(CLI::App* cmd, LoraOptions& o) {
  cmd->add_option("--lora", o.paths,
                  "PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors), merged into the "
                  "weights at load; repeatable. Only bf16 / f16 / f32 weights take one (merge before quantizing)")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--lora-scaled", o.scaled, "PATH SCALE: --lora with its product scaled (repeatable)")
      ->type_size(2)
      ->type_name("PATH SCALE");
}

void merge_lora_options(ModelWeights& w, const LoraOptions& o) {
  for (const std::string& p : o.paths) merge_lora(w, load_lora_adapter(p), 1.0f);
  QWEN36_CHECK(o.scaled.size() % 2 == 0, "--lora-scaled takes a path and a scale");
  for (size_t i = 0; i < o.scaled.size(); i += 2) {
    const std::string& text = o.scaled[i + 1];
    char* end = nullptr;
    const float scale = std::strtof(text.c_str(), &end);
    QWEN36_CHECK(!text.empty() && end == text.c_str() + text.size() && std::isfinite(scale),
                 "--lora-scaled {} {}: the scale is not a number", o.scaled[i], text);
    merge_lora(w, load_lora_adapter(o.scaled[i]), scale);
  }
}

std::string model_identity(const std::string& path, const LoraOptions& lora) {
  namespace fs = std::filesystem;
  auto file_id = [](const fs::path& f) {
    std::error_code ec;
    const auto size = fs::file_size(f, ec);
    const auto time = fs::last_write_time(f, ec).time_since_epoch().count();
    return fmt::format("{} {} {}", f.filename().string(), ec ? 0 : size, ec ? 0 : time);
  };
  auto dir_id = [&](const fs::path& d, std::string_view ext) {
    std::vector<std::string> files;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(d, ec))
      if (e.path().extension() == ext) files.push_back(file_id(e.path()));
    std::sort(files.begin(), files.end());
    return fmt::format("{}", fmt::join(files, ", "));
  };
  const std::string model = path.empty() ? default_model_path() : path;
  std::string id = model.empty()                ? std::string("built-in random tiny-dense")
                   : fs::is_directory(model)    ? dir_id(model, ".safetensors")
                                                : file_id(model);
  for (const std::string& p : lora.paths) id += "; lora " + dir_id(p, ".safetensors");
  for (size_t i = 0; i + 1 < lora.scaled.size(); i += 2)
    id += "; lora " + dir_id(lora.scaled[i], ".safetensors") + " x " + lora.scaled[i + 1];
  return id;
}

LoadedModel load_default_model(const std::string& backend, int threads, const OffloadOptions& offload,
                               const LoraOptions& lora) {
  if (const std::string path = default_model_path(); !path.empty()) {
    spdlog::info("no -m given: using the built-in small model {} (a 50M-parameter toy trained on Python code)",
                 path);
    return load_model(path, backend, threads, offload, lora);
  }
  spdlog::warn("no -m given and no shipped model found: using a small RANDOM model (output is gibberish)");
  LoadedModel lm;
  lm.backend = make_backend(backend, threads);
  ModelWeights w = make_random_weights(model_preset("tiny-dense"), DType::BF16, /*seed=*/36);
  merge_lora_options(w, lora);
  spdlog::info("model: {}", w.config.summary());
  lm.model = make_model(std::move(w), *lm.backend, offload, threads);
  return lm;
}

void add_offload_options(CLI::App* cmd, OffloadOptions& o) {
  cmd->add_option("--n-cpu-moe", o.placement.n_cpu_moe,
                  "keep the routed experts of the first N MoE layers in host memory and run them on the CPU "
                  "(alias -ncmoe); frees device memory for batch and context");
  cmd->add_flag("--cpu-moe", o.placement.cpu_moe, "routed experts of every MoE layer on the CPU (alias -cmoe)");
  cmd->add_option("--override-tensor", o.placement.override_tensor,
                  "REGEX=DEVICE (alias -ot; DEVICE cpu or cuda; repeatable, or joined with ','): routed-expert "
                  "tensors whose GGUF (blk.N.ffn_gate_exps.weight) or HF (model.layers.N.mlp.experts.gate_proj.weight) "
                  "name matches go there, a layer's experts together; e.g. -ot exps=cpu, -ot 'blk\\.[0-9]\\.=cpu'. "
                  "Rules beat --n-cpu-moe; other tensors always stay on the main backend")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--gpu-mem", o.gpu_mem,
                  "device memory budget, e.g. 24GiB or 16G: weights, caches and activations must fit in it "
                  "(emulates a smaller card)");
  cmd->add_flag("--fit", o.fit,
                "choose the smallest --n-cpu-moe whose device weights, caches and activations fit the device "
                "(or --gpu-mem)");
}

std::unique_ptr<Model> make_model(ModelWeights w, Backend& backend, const OffloadOptions& o, int host_threads) {
  const ModelConfig& c = w.config;
  PlacementOptions po = o.placement;
  const size_t cap = o.gpu_mem.empty() ? 0 : parse_byte_size(o.gpu_mem, "--gpu-mem");
  const size_t free_b = memory_for_weights(backend, w);
  const size_t budget = cap && free_b ? std::min(cap, free_b) : cap ? cap : free_b;
  QWEN36_CHECK(!o.fit || budget > 0, "--fit: the {} backend reports no device memory; give --gpu-mem", backend.name());
  if (budget > 0 && c.moe) {
    const size_t total = w.total_bytes(), plan = plan_memory(c, o.plan).total();
    const std::vector<size_t> experts = expert_bytes_per_layer(w);
    const ExpertPlacement asked = resolve_expert_placement(c, po);
    const WeightSplit split = split_weights(total, experts, asked.host);
    const auto gib = [](size_t b) { return double(b) / double(size_t(1) << 30); };
    if (o.fit || split.device + plan > budget) {
      const int32_t n = fit_n_cpu_moe(budget, total, experts, plan);
      QWEN36_CHECK(n >= 0,
                   "the model does not fit {:.2f} GiB of device memory even with every routed expert on the host: "
                   "{:.2f} GiB of other weights + {:.2f} GiB of caches and activations ({})",
                   gib(budget), gib(total - split_weights(total, experts, std::vector<bool>(experts.size(), true)).host),
                   gib(plan), plan_memory(c, o.plan).describe());
      QWEN36_CHECK(o.fit, "the model needs {:.2f} GiB of device memory ({:.2f} GiB of weights on the device + {:.2f} GiB "
                   "of caches and activations) but {:.2f} GiB is available: --n-cpu-moe {} fits (or use --fit)",
                   gib(split.device + plan), gib(split.device), gib(plan), gib(budget), n);
      spdlog::info("--fit: --n-cpu-moe {} (routed experts of the first {} of {} layers on the host) fits {:.2f} GiB",
                   n, n, c.n_layers, gib(budget));
      po = PlacementOptions{};
      po.n_cpu_moe = n;
    }
    const WeightSplit s = split_weights(total, experts, resolve_expert_placement(c, po).host);
    if (cap) set_device_budget(cap - std::min(cap, s.device));
  } else if (cap) {
    const size_t total = w.total_bytes();
    QWEN36_CHECK(total <= cap, "the weights need {:.2f} GiB but --gpu-mem is {:.2f} GiB", double(total) / (1 << 30),
                 double(cap) / (1 << 30));
    set_device_budget(cap - total);
  }
  const ExpertPlacement p = resolve_expert_placement(c, po);
  if (p.any()) spdlog::info("expert offload: {}", p.describe());
  return std::make_unique<Model>(std::move(w), backend, p, host_threads);
}

LoadedModel load_model(const std::string& path, const std::string& backend, int threads, const OffloadOptions& offload,
                       const LoraOptions& lora) {
  LoadedModel lm;
  lm.backend = make_backend(backend, threads);
  ModelWeights w = load_model_weights(path);
  merge_lora_options(w, lora);
  spdlog::info("model: {}", w.config.summary());
  lm.model = make_model(std::move(w), *lm.backend, offload, threads);
  return lm;
}

std::string resolve_tokenizer(const std::string& explicit_path, const std::string& model_path) {
  namespace fs = std::filesystem;
  if (!explicit_path.empty()) return explicit_path;
  if (const char* env = std::getenv("QWEN36_TOKENIZER"); env && *env) return env;
  if (!model_path.empty()) {
    if (fs::is_directory(model_path) && fs::exists(fs::path(model_path) / "tokenizer.json")) return model_path;
    if (model_path.ends_with(".gguf")) return model_path;  // GGUF models carry their tokenizer
    return "";
  }
  if (const std::string dflt = default_model_path(); !dflt.empty()) return dflt;  // carries its tokenizer
  const fs::path fetched = fs::path(QWEN36_SOURCE_DIR) / ".models" / "qwen3-tokenizer";
  return fs::exists(fetched / "tokenizer.json") ? fetched.string() : "";
}

std::unique_ptr<ChatTemplate> load_chat_template(const std::string& tok_path, const std::string& template_file) {
  if (!template_file.empty())
    return std::make_unique<ChatTemplate>(with_context("--chat-template-file", [&] {
      return ChatTemplate::from_file(template_file, tok_path);
    }));
  std::optional<ChatTemplate> t = ChatTemplate::find(tok_path);
  return t ? std::make_unique<ChatTemplate>(std::move(*t)) : nullptr;
}

#ifdef QWEN36_HAVE_PCRE2  // the tokenizer is built with PCRE2
std::function<std::string(int32_t)> token_text_of(const text::Tokenizer& tok) {
  return [&tok](int32_t id) { return tok.piece(id); };
}

std::vector<int32_t> chat_stop_ids(const ModelConfig& c, const text::Tokenizer& tok) {
  std::vector<int32_t> ids = c.eos_token_ids;
  for (const char* s : {"<|im_end|>", "<|endoftext|>"})
    if (int32_t id = tok.token_id(s); id >= 0) ids.push_back(id);
  return ids;
}
#endif

MemoryRequest scheduler_memory(const SchedulerOptions& so, int64_t extra_rows) {
  MemoryRequest mem;
  mem.slots = so.slots;
  mem.ctx = so.context;
  mem.batch_tokens = so.max_batch_tokens;
  mem.output_rows = so.slots;
  if (so.spec.method != SpecMethod::None) {
    // Every decode row is an output row when verifying; drafts stay within the step budget.
    const int64_t per_seq = std::max(so.spec.draft_n, so.spec.tree_budget) + 1;  // a chain's rows, or a tree's
    mem.output_rows = std::min<int64_t>(int64_t(so.slots) * per_seq, int64_t(so.slots) + so.max_batch_tokens);
    mem.mtp = so.spec.method == SpecMethod::Mtp;
  }
  mem.output_rows += extra_rows;
  mem.kv_type = so.kv_type;
  mem.state_type = so.state_type;
  return mem;
}

std::vector<int32_t> read_i32_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  QWEN36_CHECK(in.good(), "cannot open {}", path);
  const auto size = in.tellg();
  QWEN36_CHECK(size % 4 == 0, "{}: size {} is not a whole number of int32 values", path, int64_t(size));
  std::vector<int32_t> v(size_t(size) / 4);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), size);
  QWEN36_CHECK(in.good(), "error reading {}", path);
  return v;
}

void add_cache_type_options(CLI::App* cmd, CacheTypes& t) {
  cmd->add_option("--cache-type-k", t.k, "KV cache type for K (alias -ctk): auto (bf16 on cuda, f32 on cpu), f32, bf16, fp8, q8_0, q4_0")
      ->capture_default_str();
  cmd->add_option("--cache-type-v", t.v, "KV cache type for V (alias -ctv), as --cache-type-k")->capture_default_str();
  cmd->add_option("--state-type", t.state,
                  "DeltaNet recurrent state element type: f32 (default, exact) or bf16 (half the state memory and the "
                  "state bytes each decode step moves; the recurrence still computes in f32, the state is rounded to "
                  "bf16 when stored)")
      ->capture_default_str();
}

DType resolve_cache_type(const CacheTypes& t, const Backend& backend) {
  auto one = [&](const std::string& s, const char* flag) {
    if (s == "auto") return backend.name() == "cpu" ? DType::F32 : DType::BF16;
    if (s == "f32") return DType::F32;
    if (s == "bf16") return DType::BF16;
    if (s == "fp8" || s == "f8_e4m3") return DType::F8_E4M3;  // formats: backend/kv_cache.h
    if (s == "q8_0") return DType::Q8_0;
    if (s == "q4_0") return DType::Q4_0;
    if (s == "f16")
      fail("{} {}: this KV cache type is not implemented yet (supported: auto, f32, bf16, fp8, q8_0, q4_0)", flag, s);
    fail("{} {}: unknown KV cache type (supported: auto, f32, bf16, fp8, q8_0, q4_0)", flag, s);
  };
  const DType k = one(t.k, "--cache-type-k"), v = one(t.v, "--cache-type-v");
  QWEN36_CHECK(k == v, "--cache-type-k {} and --cache-type-v {} differ; different K and V types are not supported yet",
               t.k, t.v);
  return k;
}

DType resolve_state_type(const CacheTypes& t) {
  if (t.state == "f32") return DType::F32;
  if (t.state == "bf16") return DType::BF16;
  fail("--state-type {}: unknown DeltaNet state type (supported: f32, bf16)", t.state);
}

SpecOptions spec_cli_options(const SpecCliOptions& o) {
  SpecOptions spec = no_speculation();
  if (!o.speculative_config.empty()) {
    spec = parse_speculative_config(o.speculative_config);
  } else if (o.method != "none") {
    spec.method = parse_spec_method(o.method);
    spec.draft_n = o.draft_n;
  }
  spec.adaptive = o.adaptive;
  if (!o.draft_model.empty()) spec.draft_model = o.draft_model;
  if (o.block_size) spec.dflash.block_size = o.block_size;
  spec.tree_budget = o.tree_budget;
  spec.dflash.sliding_causal = o.dflash_sliding_causal;
  return spec;
}

namespace {
// The items of s between commas, blanks around each trimmed; none for a blank s.
std::vector<std::string_view> list_items(std::string_view s) {
  std::vector<std::string_view> items;
  if (s.find_first_not_of(" \t") == std::string_view::npos) return items;
  for (size_t at = 0;;) {
    const size_t comma = std::min(s.find(',', at), s.size());
    std::string_view item = s.substr(at, comma - at);
    const size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    items.push_back(b == std::string_view::npos ? std::string_view{} : item.substr(b, e - b + 1));
    if (comma == s.size()) return items;
    at = comma + 1;
  }
}

template <typename T>
std::vector<T> parse_list_of(const std::string& s, const char* flag, const char* what) {
  std::vector<T> v;
  for (std::string_view item : list_items(s)) {
    T x{};
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), x);
    QWEN36_CHECK(!item.empty() && ec == std::errc{} && end == item.data() + item.size(), "{}: \"{}\" is not {}",
                 flag, item, what);
    v.push_back(x);
  }
  return v;
}
}  // namespace

std::vector<int64_t> parse_int_list(const std::string& s, const char* flag) {
  return parse_list_of<int64_t>(s, flag, "an integer");
}

std::vector<double> parse_accept_probs(const std::string& s) {
  const std::vector<double> v = parse_list_of<double>(s, "--simulate-acceptance", "a number");
  QWEN36_CHECK(!v.empty(), "--simulate-acceptance: give one probability per draft position, e.g. 0.9,0.8,0.6");
  for (double p : v) QWEN36_CHECK(p >= 0 && p <= 1, "--simulate-acceptance: {} is not a probability in [0, 1]", p);
  return v;
}

// Bisection: the mean accepted length increases with p.
double accept_prob_for_length(double len, int64_t k) {
  QWEN36_CHECK(len >= 1 && len <= double(k) + 1,
               "--simulate-accept-length {} is outside 1 .. k + 1 = {} (k = {} drafts per round)", len, k + 1, k);
  auto f = [&](double p) {
    double sum = 1, pw = 1;
    for (int64_t i = 0; i < k; ++i) sum += (pw *= p);
    return sum;
  };
  double lo = 0, hi = 1;
  for (int it = 0; it < 60; ++it) (f(0.5 * (lo + hi)) < len ? lo : hi) = 0.5 * (lo + hi);
  return 0.5 * (lo + hi);
}

namespace {
constexpr ServeStep kCpuStep{.prefill_chunk = 256, .batch_tokens = 512};
constexpr ServeStep kCudaStep{.prefill_chunk = 512, .batch_tokens = 4096};
}  // namespace

ServeStep resolve_serve_step(ServeStep o, const std::string& backend) {
  const ServeStep d = backend == "cuda" ? kCudaStep : kCpuStep;
  if (o.prefill_chunk == 0) o.prefill_chunk = d.prefill_chunk;
  if (o.batch_tokens == 0) o.batch_tokens = d.batch_tokens;
  QWEN36_CHECK(o.prefill_chunk >= 1 && o.prefill_chunk <= (1 << 20), "--prefill-chunk {} must be in 1..{} (0: default)",
               o.prefill_chunk, 1 << 20);
  QWEN36_CHECK(o.batch_tokens >= 1 && o.batch_tokens <= (1 << 20), "-b/--batch-size {} must be in 1..{} (0: default)",
               o.batch_tokens, 1 << 20);
  return o;
}

void add_serve_step_options(CLI::App* cmd, ServeStep& o) {
  cmd->add_option("-b,--batch-size", o.batch_tokens,
                  fmt::format("Tokens per engine step, decode + prefill (0: {} on the CPU, {} on CUDA)",
                              kCpuStep.batch_tokens, kCudaStep.batch_tokens))
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", o.prefill_chunk,
                  fmt::format("Prompt tokens per sequence per step (0: {} on the CPU, {} on CUDA)",
                              kCpuStep.prefill_chunk, kCudaStep.prefill_chunk))
      ->capture_default_str();
}

}  // namespace qwen36::cli
