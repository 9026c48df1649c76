// -tp / --tensor-split for the commands that load one model, and the loading itself.
#include "cli/tp_cli.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdlib>

#include "core/error.h"
#include "engine/tp_runner.h"
#include "format/model_loader.h"
#include "model/presets.h"
#include "model/random_quant_weights.h"
#include "model/random_weights.h"
#include "quant/mix_rules.h"
#ifdef QWEN36_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace qwen36::cli {

void add_tp_options(CLI::App* cmd, TpCliOptions& o) {
  CLI::Option* tp = cmd->add_option("--tensor-parallel", o.ranks,
                  "Tensor parallelism over N devices (alias -tp; cuda: GPUs 0..N-1 over NCCL; cpu: N ranks as "
                  "threads, for tests)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--tensor-split", o.split,
                  "With -tp: share of heads / columns per rank, e.g. 3,1 for a card with 3x the memory (default even)");
  cmd->add_flag("--expert-parallel", o.expert_parallel,
                "With -tp on an MoE model: each rank holds whole routed experts (a share of them) instead of a "
                "share of every expert's columns; the shared expert stays on rank 0")
      ->needs(tp);
}

namespace {

DType plain_dtype(const std::string& t) {
  return t == "bf16" ? DType::BF16 : t == "f16" ? DType::F16 : t == "f32" ? DType::F32 : DType::I32;
}

// One rank's random shard, generated on its device (cuda) or the host.
ModelWeights random_shard(const TpWeightsSource& src, const ModelConfig& shard, uint64_t seed, bool cuda) {
  const DType dt = plain_dtype(src.type);
#ifdef QWEN36_HAVE_CUDA
  if (cuda) return dt == DType::I32 ? make_random_quant_weights_cuda(shard, src.type, seed)
                                    : make_random_weights_cuda(shard, dt, seed);
#else
  (void)cuda;
#endif
  if (dt != DType::I32) return make_random_weights(shard, dt, seed);
  const auto mix = parse_quant_mix(src.type);
  QWEN36_CHECK(mix, "--type {} is not bf16, f16, f32 or a quantization mix", src.type);
  return make_random_quant_weights(shard, *mix, seed);
}

}  // namespace

std::unique_ptr<Model> load_tp_model(const TpCliOptions& tp, const TpWeightsSource& src, Backend& backend0,
                                     const std::string& backend, int threads, std::string* name) {
  TpOptions opts;
  opts.ranks = tp.ranks;
  opts.expert_parallel = tp.expert_parallel;
  if (!tp.split.empty()) opts.split = parse_tensor_split(tp.split);
  auto make_backend = [&](int rank) { return make_rank_backend(backend, rank, threads); };
  std::unique_ptr<Model> m;
  if (!src.synthetic.empty() && src.per_rank_random) {
    const ModelConfig cfg = model_preset(src.synthetic, src.layers);
    // Quantized synthetic matrices: split the intermediate sizes in whole 256-element blocks
    // (the K-quant / IQ4 block; a multiple of the 32 of Q8_0 / Q4_0).
    const int64_t col_block = plain_dtype(src.type) == DType::I32 ? 256 : 1;
    const bool cuda = backend == "cuda";
    // Every rank draws with the same seed (the replicated tensors generated first, like the
    // embedding, come out alike); the values are not those of the unsplit model, the work is.
    m = make_tp_model(cfg, opts, col_block, backend0, make_backend, [&](const TpShard&, const ModelConfig& sc) {
      return random_shard(src, sc, src.seed, cuda);
    });
    if (name) *name = fmt::format("{} {} (synthetic, random per rank)", src.synthetic, src.type);
  } else {
    ModelWeights full;
    if (!src.synthetic.empty()) {
      const DType dt = plain_dtype(src.type);
      QWEN36_CHECK(dt != DType::I32, "-tp with a host-generated synthetic model takes bf16, f16 or f32");
      full = make_random_weights(model_preset(src.synthetic, src.layers), dt, src.seed);
    } else {
      full = load_model_weights(src.model);
    }
    spdlog::info("model: {}", full.config.summary());
    m = make_tp_model(full, opts, backend0, make_backend);
    if (name)
      *name = src.synthetic.empty() ? src.model : fmt::format("{} {} (synthetic, random)", src.synthetic, src.type);
  }
  if (!m) {  // a follower process of a multi-process launch: process 0 has finished
    spdlog::info("tensor parallel: process 0 shut the group down");
    std::exit(0);
  }
  if (name)
    *name += fmt::format(" [tensor parallel {}{}{}{}]", tp.ranks, tp.expert_parallel ? ", expert parallel" : "",
                         tp.split.empty() ? "" : ", split ", tp.split);
  return m;
}

std::unique_ptr<Model> load_tp_bench_model(const TpCliOptions& tp, const TpWeightsSource& src,
                                           std::unique_ptr<Backend>& backend, const std::string& backend_name,
                                           int threads, std::string* name) {
  if (const int d = tp_first_local_device(tp.ranks); d != 0) backend = make_rank_backend(backend_name, d, threads);
  return load_tp_model(tp, src, *backend, backend_name, threads, name);
}

LoadedModel load_tp_command_model(const TpCliOptions& tp, const std::string& model, const std::string& backend,
                                  int threads, const OffloadOptions& offload) {
  QWEN36_CHECK(offload.placement.empty() && offload.gpu_mem.empty() && !offload.fit,
               "expert offload (--n-cpu-moe, -ot, --gpu-mem, --fit) does not run with -tp yet");
  TpWeightsSource src;
  src.model = model.empty() ? default_model_path() : model;
  if (src.model.empty()) src.synthetic = "tiny-dense", src.seed = 36;  // load_default_model's random model
  LoadedModel lm;
  lm.backend = make_rank_backend(backend, tp_first_local_device(tp.ranks), threads);
  lm.model = load_tp_model(tp, src, *lm.backend, backend, threads);
  return lm;
}

}  // namespace qwen36::cli
