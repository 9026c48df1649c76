// cuda::ScratchStack (backend/cuda/scratch_stack.h): the CUDA backend's op temporaries. The
// bookkeeping is plain C++, tested here over host memory standing in for the device buffer.
#include "backend/cuda/scratch_stack.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace qwen36::cuda {
namespace {

constexpr size_t kCounterBytes = size_t(ScratchStack::kCounters) * sizeof(int);

struct Buffer {
  explicit Buffer(size_t bytes) : mem(bytes) { stack.init(mem.data(), mem.size()); }
  size_t offset(const void* p) const { return size_t(static_cast<const uint8_t*>(p) - mem.data()); }
  std::vector<uint8_t> mem;
  ScratchStack stack;
};

TEST(ScratchStack, HandsOutAlignedBlocksAboveTheCounters) {
  Buffer b(kCounterBytes + 4096);
  EXPECT_EQ(static_cast<void*>(b.stack.counters()), static_cast<void*>(b.mem.data()));
  void* p = b.stack.take(1);
  void* q = b.stack.take(300);
  ASSERT_NE(p, nullptr);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(b.offset(p), kCounterBytes);
  EXPECT_EQ(b.offset(q), kCounterBytes + 256);  // 1 byte rounds up to 256
  EXPECT_EQ(b.stack.take(4096), nullptr) << "3328 bytes are left";
  EXPECT_NE(b.stack.take(3328), nullptr);
}

TEST(ScratchStack, RequestsThatDoNotFitAreRefused) {
  Buffer b(kCounterBytes + 1024);
  EXPECT_EQ(b.stack.take(1025), nullptr);
  void* p = b.stack.take(1024);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(b.stack.take(1), nullptr);
  EXPECT_TRUE(b.stack.give(p));
  EXPECT_EQ(b.stack.take(1024), p) << "a freed top is reused";
}

TEST(ScratchStack, OutOfOrderReleaseFreesOnceTheTopGoes) {
  Buffer b(kCounterBytes + 4 * 256);
  void* a = b.stack.take(256);
  void* c = b.stack.take(256);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(b.stack.give(a));  // below c: held until c goes
  void* d = b.stack.take(256);
  EXPECT_EQ(b.offset(d), kCounterBytes + 512) << "a's bytes must not be handed out while c sits above them";
  EXPECT_TRUE(b.stack.give(d));
  EXPECT_TRUE(b.stack.give(c));
  EXPECT_EQ(b.stack.take(256), a) << "with c and d gone, the stack shrinks past a too";
}

TEST(ScratchStack, ForeignPointersAndTooSmallBuffersFallBack) {
  Buffer b(kCounterBytes + 256);
  int elsewhere = 0;
  EXPECT_FALSE(b.stack.give(&elsewhere));
  Buffer tiny(kCounterBytes / 2);  // smaller than its own counters: unusable
  EXPECT_EQ(tiny.stack.take(16), nullptr);
  ScratchStack none;
  EXPECT_EQ(none.take(16), nullptr);
  EXPECT_FALSE(none.give(&elsewhere));
}

}  // namespace
}  // namespace qwen36::cuda
