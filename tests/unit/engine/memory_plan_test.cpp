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
