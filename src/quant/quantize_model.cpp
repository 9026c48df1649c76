#include "quant/quantize_model.h"

#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "format/gguf_convert.h"
#include "quant/quant.h"

namespace qwen36 {

ModelPlan plan_from_gguf(const std::string& path) {
  auto f = std::make_shared<GgufFile>(path);
  ModelPlan plan;
  plan.keep_alive.push_back(f);
  plan.meta = GgufMetadata::from_file(*f);
  for (const GgufTensorInfo& info : f->tensors()) {
    TensorSource s;
    s.name = std::string(info.name);
    s.shape.assign(info.tensor.shape.begin(), info.tensor.shape.begin() + info.tensor.ndim);
    s.dtype = info.tensor.dtype;
    s.raw = info.tensor.data;
    const Tensor t = info.tensor;
    s.row_f32 = [t](int64_t r, float* dst) { dequantize_row(t.dtype, t.row(r), dst, t.cols()); };
    plan.tensors.push_back(std::move(s));
  }
  return plan;
}

ModelPlan plan_from_path(const std::string& path) {
  namespace fs = std::filesystem;
  QWEN36_CHECK(fs::exists(path), "{} does not exist", path);
  if (fs::is_directory(path)) return plan_from_hf(path, DType::BF16);
  return plan_from_gguf(path);
}

namespace {
int64_t meta_int(const GgufMetadata& m, const std::string& key) {
  const GgufMetadata::Entry* e = m.find(key);
  if (!e || e->type == GgufType::STRING || e->type == GgufType::ARRAY) return 0;
  int64_t v = 0;
  switch (e->type) {
    case GgufType::U32: { uint32_t x; std::memcpy(&x, e->bytes.data(), 4); v = x; break; }
    case GgufType::I32: { int32_t x; std::memcpy(&x, e->bytes.data(), 4); v = x; break; }
    case GgufType::U64: { uint64_t x; std::memcpy(&x, e->bytes.data(), 8); v = int64_t(x); break; }
    case GgufType::I64: { std::memcpy(&v, e->bytes.data(), 8); break; }
    default: break;
  }
  return v;
}
}  // namespace

MixModelInfo mix_model_info(const GgufMetadata& m) {
  const GgufMetadata::Entry* a = m.find("general.architecture");
  QWEN36_CHECK(a && a->type == GgufType::STRING, "no general.architecture in the metadata");
  const std::string arch = a->strs.at(0);
  return {meta_int(m, arch + ".expert_count"), meta_int(m, arch + ".block_count")};
}

std::vector<DType> choose_plan_types(ModelPlan& plan, QuantMix mix) {
  std::vector<std::string> names;
  for (const TensorSource& t : plan.tensors) names.push_back(t.name);
  std::vector<TensorSource> ordered;
  for (size_t i : order_like_llama_quantize(names)) ordered.push_back(std::move(plan.tensors[i]));
  plan.tensors = std::move(ordered);
  std::vector<MixTensor> mt;
  for (TensorSource& t : plan.tensors) {
    // The converter writes the shared-expert gate as ne {H, 1}; llama-quantize writes the
    // shape llama.cpp's model declares, ne {H}. Same bytes; match its output.
    if (t.name.ends_with("ffn_gate_inp_shexp.weight") && t.shape.size() == 2 && t.shape[0] == 1)
      t.shape = {t.shape[1]};
    mt.push_back({t.name, t.shape, t.dtype});
  }
  plan.meta.set_u32("general.quantization_version", 2);
  plan.meta.set_u32("general.file_type", quant_mix_llama_ftype(mix));
  return choose_tensor_types(mix, mt, mix_model_info(plan.meta));
}

uint64_t quantize_model(const std::string& in, const std::string& out, QuantMix mix, bool progress) {
  ModelPlan plan = plan_from_path(in);
  const std::vector<DType> types = choose_plan_types(plan, mix);
  return write_model_plan(plan, types, out, progress);
}

}  // namespace qwen36
