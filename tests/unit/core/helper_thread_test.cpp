// HelperThread: jobs run one at a time on its own thread, after its init; wait() returns once
// the job has, and rethrows what the job (or the init) threw.
#include "core/helper_thread.h"

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"

namespace qwen36 {
namespace {

TEST(HelperThread, JobsRunInOrderOnItsThreadAfterInit) {
  std::thread::id init_thread, caller = std::this_thread::get_id();
  std::vector<std::thread::id> job_threads;
  std::vector<int> order;
  HelperThread h([&] { init_thread = std::this_thread::get_id(); });
  for (int i = 0; i < 100; ++i) {
    h.post([&, i] {
      if (i % 10 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));  // wait() must sleep too
      job_threads.push_back(std::this_thread::get_id());
      order.push_back(i);
    });
    h.wait();
    ASSERT_EQ(order.size(), size_t(i) + 1) << "wait() returned before job " << i << " did";
  }
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[size_t(i)], i);
  EXPECT_NE(init_thread, caller);
  for (const std::thread::id t : job_threads) EXPECT_EQ(t, init_thread);
  h.wait();  // nothing posted: returns at once
}

TEST(HelperThread, WaitRethrowsAndTheThreadGoesOn) {
  HelperThread h;
  h.post([] { throw std::runtime_error("job failed"); });
  EXPECT_THROW(
      {
        try {
          h.wait();
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "job failed");
          throw;
        }
      },
      std::runtime_error);
  int ran = 0;
  h.post([&] { ran = 1; });
  h.wait();
  EXPECT_EQ(ran, 1);
}

TEST(HelperThread, AFailedInitComesOutOfTheFirstWait) {
  HelperThread h([] { throw Error("no device"); });
  int ran = 0;
  h.post([&] { ran = 1; });
  EXPECT_THROW(h.wait(), Error);
  EXPECT_EQ(ran, 0) << "the job of a failed init ran";
  h.post([&] { ran = 2; });
  h.wait();
  EXPECT_EQ(ran, 2);
}

TEST(HelperThread, PostingTwiceWithoutWaitIsRefused) {
  HelperThread h;
  std::atomic<bool> release{false};
  h.post([&] {
    while (!release.load()) std::this_thread::yield();
  });
  EXPECT_THROW(h.post([] {}), Error);
  release = true;
  h.wait();
}

TEST(HelperThread, DestructionWaitsForAnUnwaitedJob) {
  std::atomic<int> ran{0};
  {
    HelperThread h;
    h.post([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      ran = 1;
    });
  }
  EXPECT_EQ(ran.load(), 1);
}

}  // namespace
}  // namespace qwen36
