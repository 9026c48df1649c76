// cpu::HostPool runs a cpu::MoePass to the same bits as cpu::moe_experts (OpenMP), pass after
// pass, with the submitting thread busy elsewhere or joining at once, and after its workers
// have gone to sleep.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_moe_pass.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/host_pool.h"
#include "core/error.h"
#include "cpu_ops_test_util.h"
#include "quant/quant.h"

namespace qwen36 {
namespace {

using test::quant_experts;
using test::QuantExperts;
using test::Rng;

TEST(HostPool, PassesMatchOpenMpBitwise) {
  Rng r(83);
  const int64_t E = 8, D = 256, I = 512, k = 3;
  const QuantExperts q = quant_experts(r, E, D, I);
  cpu::HostPool pool(3);
  for (int round = 0; round < 6; ++round) {
    const int64_t T = round % 3 == 2 ? 5 : 1;
    auto x = r.vec(size_t(T * D), -2, 2);
    std::vector<int32_t> ids(size_t(T * k));
    for (int64_t i = 0; i < T * k; ++i) ids[size_t(i)] = int32_t((7 * i + 3 * round) % E);
    std::vector<float> rw = r.vec(size_t(T * k), 0.05f, 1.0f), want(size_t(T * D), NAN), got(size_t(T * D), NAN);
    Tensor tx = test::f32(x, {T, D}), trw = test::f32(rw, {T, k}), tids = test::i32(ids, {T, k}),
           tw = test::f32(want, {T, D}), tg = test::f32(got, {T, D});
    cpu::moe_experts(tx, trw, tids, q.mlp, tw);
    const std::unique_ptr<cpu::MoePass> pass = cpu::MoePass::make(tx, trw, tids, q.mlp, tg);
    ASSERT_NE(pass, nullptr);
    pool.submit(*pass);
    EXPECT_TRUE(pool.busy());
    // The caller away for a while (the workers alone finish the pass), or joining at once.
    if (round % 2 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(3));
    pool.join();
    EXPECT_FALSE(pool.busy());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "round " << round;
    // Long enough for the workers to stop spinning and sleep before the next pass.
    if (round == 3)
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(3 * cpu::HostPool::kIdleSpinMs));
  }
  pool.join();  // nothing in flight: a no-op
}

// A pass of rows (MoePass::make_rows: expert offload's exact path) has no sums; its last item
// of the down phase raises the signal, and its rows are moe_expert_rows' bitwise.
TEST(HostPool, RowPassesRaiseTheSignalAndMatchOpenMp) {
  Rng r(89);
  const int64_t E = 8, D = 256, I = 512, k = 3;
  const QuantExperts q = quant_experts(r, E, D, I);
  cpu::HostPool pool(2);
  std::atomic<uint64_t> signal{0};
  for (uint64_t round = 1; round <= 3; ++round) {
    const int64_t T = round == 2 ? 4 : 1;
    auto x = r.vec(size_t(T * D), -2, 2);
    std::vector<int32_t> ids(size_t(T * k));
    for (int64_t i = 0; i < T * k; ++i) ids[size_t(i)] = int32_t((5 * i + int64_t(round)) % E);
    std::vector<float> want(size_t(T * k * D), NAN), got(size_t(T * k * D), NAN);
    Tensor tx = test::f32(x, {T, D}), tids = test::i32(ids, {T, k}), tw = test::f32(want, {T * k, D}),
           tg = test::f32(got, {T * k, D});
    ASSERT_TRUE(cpu::moe_expert_rows(tx, tids, q.mlp, tw));
    const std::unique_ptr<cpu::MoePass> pass = cpu::MoePass::make_rows(tx, tids, q.mlp, tg);
    ASSERT_NE(pass, nullptr);
    EXPECT_EQ(pass->items(cpu::MoePass::kPhases - 1), 0);
    pool.submit(*pass, &signal, round);
    for (int spins = 0; signal.load() != round && spins < 2000; ++spins) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(signal.load(), round) << "the pass did not raise the signal";
    pool.join();
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "round " << round;
  }
}

// Not this path: bf16 experts (moe_experts' per-expert matmuls), and bad ids are refused.
TEST(HostPool, MoePassRefusesOtherExpertsAndBadIds) {
  Rng r(5);
  const int64_t D = 256, I = 512;
  QuantExperts q = quant_experts(r, 2, D, I);
  auto x = r.vec(size_t(D), -1, 1);
  std::vector<float> rw = {0.5f, 0.5f}, out(static_cast<size_t>(D));
  std::vector<int32_t> ids = {0, 1};
  Tensor tx = test::f32(x, {1, D}), trw = test::f32(rw, {1, 2}), tids = test::i32(ids, {1, 2}),
         to = test::f32(out, {1, D});
  EXPECT_NE(cpu::MoePass::make(tx, trw, tids, q.mlp, to), nullptr);
  ids[1] = 2;
  EXPECT_THROW(cpu::MoePass::make(tx, trw, tids, q.mlp, to), Error);
  ids[1] = 1;
  std::vector<uint16_t> bf(size_t(I * D), 0);
  q.mlp[1].gate_proj = Tensor(bf.data(), DType::BF16, {I, D});
  EXPECT_EQ(cpu::MoePass::make(tx, trw, tids, q.mlp, to), nullptr);
}

}  // namespace
}  // namespace qwen36
