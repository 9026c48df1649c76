// The memory planner: its sizes follow the model's shapes, and a run that cannot fit is
// refused with a message naming the part that is too large and the flag that shrinks it.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/memory_plan.h"
#include "model/presets.h"

namespace qwen36 {
namespace {

constexpr size_t kGiB = size_t(1) << 30;

TEST(MemoryPlan, SizesFollowTheShapes) {
  const ModelConfig c = model_preset("qwen3.6-27b");
  MemoryRequest r;
  r.slots = 2;
  r.ctx = 32768;
  r.kv_type = DType::BF16;
  const MemoryPlan p = plan_memory(c, r);
  // 16 attention layers × K and V × 4 kv heads × 256 dims × 2 bytes per position and sequence
  EXPECT_EQ(p.kv, size_t(16) * 2 * 4 * 256 * 2 * 32768 * 2);
  // 48 DeltaNet layers × (conv 10240 × 3 + state 48 × 128 × 128) f32 per sequence
  EXPECT_EQ(p.state, size_t(48) * (10240 * 3 + 48 * 128 * 128) * 4 * 2);
  r.kv_type = DType::F32;
  EXPECT_EQ(plan_memory(c, r).kv, 2 * p.kv);
  r.batch_tokens *= 2;
  EXPECT_GT(plan_memory(c, r).activations, p.activations);
}

// --state-type bf16: the recurrent state takes 2 bytes an element instead of 4; the conv state
// stays f32.
TEST(MemoryPlan, Bf16StateHalvesTheRecurrentPart) {
  for (const char* preset : {"qwen3.6-27b", "qwen3.6-35b-a3b"}) {
    const ModelConfig c = model_preset(preset);
    MemoryRequest r;
    r.slots = 3;
    const MemoryPlan f32 = plan_memory(c, r);
    size_t conv = 0, recurrent = 0;  // f32 bytes of all slots
    for (LayerKind k : c.layer_kinds)
      if (k == LayerKind::LinearAttention) {
        conv += size_t(c.conv_dim() * (c.conv_kernel - 1)) * 4 * size_t(r.slots);
        recurrent += size_t(c.linear_v_heads * c.linear_k_dim * c.linear_v_dim) * 4 * size_t(r.slots);
      }
    ASSERT_GT(recurrent, 0u) << preset;
    EXPECT_EQ(f32.state, conv + recurrent) << preset;
    r.state_type = DType::BF16;
    const MemoryPlan bf16 = plan_memory(c, r);
    EXPECT_EQ(bf16.state, f32.state - recurrent / 2) << preset;
    EXPECT_EQ(bf16.kv, f32.kv) << preset;
    EXPECT_EQ(bf16.activations, f32.activations) << preset;
  }
}

TEST(MemoryPlan, RefusesWhatDoesNotFitAndNamesTheFlag) {
  const ModelConfig c = model_preset("qwen3.6-27b");
  MemoryRequest r;
  r.slots = 8;
  r.ctx = 262144;
  r.kv_type = DType::BF16;
  const MemoryPlan p = plan_memory(c, r);
  EXPECT_NO_THROW(check_memory_plan(p.total() + 1, "cuda", c, r));
  try {
    check_memory_plan(10 * kGiB, "cuda", c, r);
    FAIL() << "a " << p.describe() << " plan fitted in 10 GiB";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("KV cache"), std::string::npos) << m;
    EXPECT_NE(m.find("--ctx-size"), std::string::npos) << m;
    EXPECT_NE(m.find("--parallel"), std::string::npos) << m;
    EXPECT_NE(m.find("short"), std::string::npos) << m;
  }
  r.ctx = 4096;
  r.slots = 1;
  r.batch_tokens = 1 << 20;  // a million-token forward pass: the activations are the problem
  try {
    check_memory_plan(10 * kGiB, "cuda", c, r);
    FAIL() << "fitted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--batch-size"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace qwen36
