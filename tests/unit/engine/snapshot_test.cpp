// State snapshots (model/state_snapshot.h) and the snapshot cache (engine/snapshot_cache.h):
// a slot restored from a snapshot continues exactly as the slot it was saved from.

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/snapshot_cache.h"
#include "model/presets.h"
#include "model/qwen36.h"
#include "model/random_weights.h"
#include "model/state_snapshot.h"

namespace qwen36 {
namespace {

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937 rng{uint32_t(seed)};
  std::uniform_int_distribution<int32_t> d(0, int32_t(vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = d(rng);
  return t;
}

class SnapshotTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    backend_ = make_cpu_backend(1);
    ModelConfig c = model_preset("tiny-dense", 4);  // 3 DeltaNet layers + 1 attention layer
    c.vocab_size = 512;
    c.validate();
    model_ = std::make_unique<Model>(make_random_weights(c, DType::F32, 7, /*with_mtp=*/true), *backend_);
  }
  std::vector<float> prefill(ModelState& st, std::span<const int32_t> toks, int32_t pos0, int32_t slot) {
    std::vector<float> logits(size_t(model_->config().vocab_size));
    model_->forward(ForwardBatch::single(toks, pos0, slot), st, logits.data());
    return logits;
  }
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
};

// Slot 0 reads 48 tokens, is saved, then reads 24 more; slot 1 restored from the snapshot
// reads the same 24: the logits agree bit for bit (the same ops on the same state), and so do
// two further decode steps. Both tiers, and every KV cache type (fp8 keeps per-row scales).
TEST_P(SnapshotTest, RestoredSlotContinuesBitIdentically) {
  const DType kv = GetParam();
  const ModelConfig& c = model_->config();
  const std::vector<int32_t> toks = random_tokens(74, c.vocab_size, 3);
  const std::span<const int32_t> all(toks);
  for (bool host : {false, true}) {
    ModelState st(*backend_, c, 3, 128, true, kv);
    prefill(st, all.first(48), 0, 0);
    const StateSnapshot snap = save_snapshot(*backend_, st, 0, 48, host);
    EXPECT_EQ(snap.on_host(), host);
    EXPECT_EQ(snap.bytes, snapshot_bytes(st, 48));
    const std::vector<float> want = prefill(st, all.subspan(48, 24), 48, 0);
    // Slot 1 holds another sequence first: the restore must overwrite all of it.
    const std::vector<int32_t> other = random_tokens(60, c.vocab_size, 9);
    prefill(st, other, 0, 1);
    restore_snapshot(*backend_, snap, st, 1);
    const std::vector<float> got = prefill(st, all.subspan(48, 24), 48, 1);
    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
        << dtype_name(kv) << (host ? " host" : " device") << ": prefill logits differ";
    for (int i = 0; i < 2; ++i) {
      const std::vector<float> a = prefill(st, all.subspan(72 + size_t(i), 1), 72 + i, 0);
      const std::vector<float> b = prefill(st, all.subspan(72 + size_t(i), 1), 72 + i, 1);
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "decode step " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(KvTypes, SnapshotTest,
                         ::testing::Values(DType::F32, DType::BF16, DType::F8_E4M3, DType::Q8_0, DType::Q4_0),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

TEST_F(SnapshotTest, RejectsAMismatchedState) {
  const ModelConfig& c = model_->config();
  ModelState a(*backend_, c, 2, 64, true, DType::F32), b(*backend_, c, 2, 64, false, DType::F32);
  const StateSnapshot snap = save_snapshot(*backend_, a, 0, 16, true);
  EXPECT_THROW(restore_snapshot(*backend_, snap, b, 0), Error);  // no MTP cache in b
  EXPECT_THROW(save_snapshot(*backend_, a, 2, 16, true), Error);  // no slot 2
  EXPECT_THROW(save_snapshot(*backend_, a, 0, 65, true), Error);  // beyond the capacity
}

// A snapshot stand-in of `bytes` bytes in host RAM (the cache only reads bytes and the tier).
StateSnapshot fake(size_t bytes, int64_t positions) {
  StateSnapshot s;
  s.positions = positions;
  s.bytes = bytes;
  s.host = HostBuffer(bytes);
  return s;
}

std::vector<int32_t> iota_tokens(int n, int start = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(SnapshotCache, FindsTheLongestProperPrefixAtIntervalMultiples) {
  SnapshotCache cache({.interval = 4, .device_bytes = 0, .host_bytes = 1000});
  const std::vector<int32_t> p = iota_tokens(13);
  EXPECT_FALSE(cache.wants(std::span(p).first(6)));  // not a multiple of 4
  ASSERT_TRUE(cache.wants(std::span(p).first(4)));
  cache.insert(iota_tokens(4), fake(10, 4));
  cache.insert(iota_tokens(8), fake(10, 8));
  EXPECT_FALSE(cache.wants(std::span(p).first(8)));  // held already
  const StateSnapshot* s = cache.find(p, 0);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->positions, 8);
  EXPECT_EQ(cache.find(p, 8), nullptr);                      // nothing longer than 8
  EXPECT_EQ(cache.find(std::span(p).first(8), 0)->positions, 4);  // proper prefixes only
  std::vector<int32_t> other = p;
  other[5] = 99;  // differs inside the second checkpoint
  EXPECT_EQ(cache.find(other, 0)->positions, 4);
  other[0] = 99;
  EXPECT_EQ(cache.find(other, 0), nullptr);
  const SnapshotCacheStats st = cache.stats();
  EXPECT_EQ(st.entries, 2);
  EXPECT_EQ(st.lookups, 5u);
  EXPECT_EQ(st.hits, 3u);
}

TEST(SnapshotCache, EvictsLeastRecentlyUsedWithinItsBudget) {
  SnapshotCache cache({.interval = 2, .device_bytes = 0, .host_bytes = 30});
  for (int i = 0; i < 3; ++i) cache.insert(iota_tokens(2, 10 * i), fake(10, 2));
  ASSERT_NE(cache.find(iota_tokens(3, 0), 0), nullptr);  // touch the first: the second is now oldest
  cache.insert(iota_tokens(2, 30), fake(10, 2));
  EXPECT_NE(cache.find(iota_tokens(3, 0), 0), nullptr);
  EXPECT_EQ(cache.find(iota_tokens(3, 10), 0), nullptr);
  EXPECT_NE(cache.find(iota_tokens(3, 20), 0), nullptr);
  EXPECT_EQ(cache.stats().evicted, 1u);
  EXPECT_EQ(cache.stats().host_bytes, 30u);
  EXPECT_EQ(cache.placement(31), std::nullopt);
  EXPECT_EQ(cache.placement(30), std::optional<bool>(true));
  EXPECT_THROW(cache.insert(iota_tokens(2, 40), fake(31, 2)), Error);
}

TEST(SnapshotCache, DisabledWithoutBudgetOrInterval) {
  SnapshotCache none({.interval = 4, .device_bytes = 0, .host_bytes = 0});
  EXPECT_FALSE(none.enabled());
  EXPECT_FALSE(none.wants(iota_tokens(4)));
  EXPECT_EQ(none.find(iota_tokens(9), 0), nullptr);
  SnapshotCache off({.interval = 0, .device_bytes = 100, .host_bytes = 0});
  EXPECT_FALSE(off.enabled());
}

}  // namespace
}  // namespace qwen36
