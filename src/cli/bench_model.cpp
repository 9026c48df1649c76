#include "cli/bench_model.h"

#include <fmt/format.h>
#include <omp.h>

#include "core/error.h"
#include "format/model_loader.h"
#include "model/presets.h"
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
    if (dt == DType::I32) {  // block-quantized: a mix (CPU, CUDA) or one block type (CUDA)
#ifdef QWEN36_HAVE_CUDA
      if (cuda) w = make_random_quant_weights_cuda(cfg, o.type, 42);
#endif
      if (!cuda) {
        const auto mix = parse_quant_mix(o.type);
        QWEN36_CHECK(mix, "{}: --type {} is not bf16, f16, f32 or a quantization mix (q8_0, q6_k, q5_k_m, q4_k_m, ...)",
                     command, o.type);
        w = make_random_quant_weights(cfg, *mix, 42);
      }
    } else {
#ifdef QWEN36_HAVE_CUDA
      w = cuda ? make_random_weights_cuda(cfg, dt, 42) : make_random_weights(cfg, dt, 42, o.with_mtp);
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

}  // namespace qwen36::cli
