#include "cli/bench_model.h"

#include <fmt/format.h>
#include <omp.h>
#include <spdlog/spdlog.h>

#include <chrono>

#include "core/error.h"
#include "format/model_loader.h"
#include "model/presets.h"
#include "model/qwen36.h"
#include "model/random_quant_weights.h"
#include "model/random_weights.h"
#include "quant/mix_rules.h"
#ifdef QWEN36_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace qwen36::cli {

BenchDevice make_bench_device(const std::string& backend, int threads, [[maybe_unused]] const std::string& command) {
  BenchDevice d;
  d.cuda = backend == "cuda";
#ifdef QWEN36_HAVE_CUDA
  if (d.cuda) {
    d.backend = make_cuda_backend();
    d.name = cuda_device_name();
  }
#else
  QWEN36_CHECK(!d.cuda, "{}: this build has no CUDA backend", command);
#endif
  if (!d.cuda) {
    d.backend = make_cpu_backend(threads);
    d.name = fmt::format("CPU, {} threads", omp_get_max_threads());
  }
  return d;
}

BenchWeights load_bench_weights(const BenchWeightsOptions& o, bool cuda, const std::string& command) {
  QWEN36_CHECK(o.model.empty() != o.synthetic.empty(), "{}: give exactly one of -m MODEL or --synthetic PRESET",
               command);
  BenchWeights r;
  ModelWeights& w = r.weights;
  if (!o.synthetic.empty()) {
    const DType dt = o.type == "bf16" ? DType::BF16 : o.type == "f16" ? DType::F16 : o.type == "f32" ? DType::F32
                                                                                                     : DType::I32;
    const ModelConfig cfg = model_preset(o.synthetic, o.layers);
    if (dt == DType::I32) {  // block-quantized: a mix (CPU, CUDA), one block type or an HF type (CUDA)
#ifdef QWEN36_HAVE_CUDA
      if (cuda) w = make_random_quant_weights_cuda(cfg, o.type, 42, o.with_mtp);
#endif
      if (!cuda) {
        const auto mix = parse_quant_mix(o.type);
        QWEN36_CHECK(mix,
                     "{}: --type {} is not bf16, f16, f32 or a quantization mix (q8_0, q6_k, q5_k_m, q4_k_m, ...); "
                     "block types and the Hugging Face types (awq, w4g32, nvfp4, fp8) need --backend cuda",
                     command, o.type);
        w = make_random_quant_weights(cfg, *mix, 42);
      }
    } else {
#ifdef QWEN36_HAVE_CUDA
      w = cuda ? make_random_weights_cuda(cfg, dt, 42, o.with_mtp) : make_random_weights(cfg, dt, 42, o.with_mtp);
#else
      w = make_random_weights(cfg, dt, 42, o.with_mtp);
#endif
    }
    r.name = fmt::format("{} {} (synthetic, random)", o.synthetic, o.type);
  } else {
    w = load_model_weights(o.model);
    r.name = o.model;
  }
  r.bytes = w.total_bytes();
  return r;
}

BenchDFlash load_bench_dflash(const std::string& path, const Model& target, Backend& backend, int32_t slots,
                              int64_t capacity, int32_t block_size, int32_t top_k) {
  BenchDFlash r;
  DFlashOptions opts;
  opts.block_size = block_size;
  if (!path.empty()) {
    r.drafter = load_dflash_drafter(path, target, backend, slots, capacity, opts, top_k);
    r.label = "dflash " + path;
    return r;
  }
  const DFlashConfig cfg = synthetic_dflash_config(target.config(), block_size > 0 ? block_size : 16);
  const auto t0 = std::chrono::steady_clock::now();
  DFlashWeights w = make_random_dflash_weights(cfg, DType::BF16, 4242);
  size_t bytes = w.fc.nbytes();
  for (const DFlashLayer& l : w.layers)
    for (const Tensor* x : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.mlp.gate_proj, &l.mlp.up_proj, &l.mlp.down_proj})
      bytes += x->nbytes();
  const double gen_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.drafter = std::make_unique<DFlashDrafter>(target, std::move(w), backend, slots, capacity, opts, top_k);
  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("{} (random, {:.2f} GiB bf16: generated on the host in {:.1f} s, ready on the {} backend after {:.1f} s; "
               "drafter K/V caches {:.1f} MiB)",
               cfg.summary(), double(bytes) / double(1 << 30), gen_s, backend.name(), total_s,
               double(r.drafter->model().cache_bytes()) / double(1 << 20));
  r.label = fmt::format("dflash random {}-layer drafter", cfg.n_layers);
  return r;
}

}  // namespace qwen36::cli
