// Liveness, IterationBarrier and StickyError on their own (no sockets, no threads but the test's).
#include "poseidon/client/liveness.h"

#include <gtest/gtest.h>

#include <future>

#include "expect_error.h"
#include "poseidon/client/iteration_barrier.h"
#include "poseidon/common/sticky_error.h"
#include "poseidon/wire/messages.h"

namespace poseidon {
namespace {

using std::chrono::milliseconds;

FrameHeader from(FrameHeader h, int sender) {
  h.sender = static_cast<uint32_t>(sender);
  return h;
}

TEST(Liveness, ReportsEachSilentPeerOnceWithItsLastIteration) {
  const auto t0 = Liveness::Clock::now();
  Liveness l(3, 0, milliseconds(3000), milliseconds(0), 10, t0);
  EXPECT_EQ(l.heartbeat(), milliseconds(500));  // timeout / 6
  l.heard(from(wire::heartbeat(12), 1), t0 + milliseconds(1000));
  l.heard(from(wire::psPush(0, 13, 0), 2), t0 + milliseconds(2000));
  l.heard(from(wire::barrier(99), 2), t0 + milliseconds(2500));  // a barrier's fields are no iteration
  EXPECT_TRUE(l.lostPeers(t0 + milliseconds(4000)).empty());
  auto lost = l.lostPeers(t0 + milliseconds(4001));
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].rank, 1);
  EXPECT_EQ(lost[0].silent, milliseconds(3001));
  EXPECT_EQ(lost[0].lastIteration, 12);
  EXPECT_TRUE(l.departed(1));
  EXPECT_TRUE(l.lostPeers(t0 + milliseconds(9000)).size() == 1u);  // rank 2 now; rank 1 not again
  EXPECT_TRUE(l.lostPeers(t0 + milliseconds(20000)).empty());
}

TEST(Liveness, APeerThatSaidByeIsNeverLost) {
  const auto t0 = Liveness::Clock::now();
  Liveness l(2, 1, milliseconds(600), milliseconds(0), 0, t0);
  EXPECT_EQ(l.heartbeat(), milliseconds(100));
  l.heard(from(wire::bye(5), 0), t0);
  EXPECT_TRUE(l.departed(0));
  EXPECT_TRUE(l.lostPeers(t0 + std::chrono::hours(1)).empty());
}

TEST(Liveness, HeartbeatIsDueOncePerPeriod) {
  const auto t0 = Liveness::Clock::now();
  Liveness l(2, 0, milliseconds(30000), milliseconds(0), 0, t0);
  EXPECT_EQ(l.heartbeat(), milliseconds(1000));  // capped at 1 s
  EXPECT_TRUE(l.heartbeatDue(t0));
  EXPECT_FALSE(l.heartbeatDue(t0 + milliseconds(999)));
  EXPECT_TRUE(l.heartbeatDue(t0 + milliseconds(1000)));
  EXPECT_EQ(Liveness::heartbeatFor(milliseconds(60)), milliseconds(50));  // at least 50 ms
}

TEST(IterationBarrier, OpensWhenEveryLayerIsDone) {
  StickyError error;
  IterationBarrier b(3, error);
  b.begin(7);
  EXPECT_EQ(b.wait(milliseconds(1)), (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(b.layerDone(2, 7));
  EXPECT_FALSE(b.layerDone(2, 7));  // twice
  EXPECT_FALSE(b.layerDone(0, 8));  // another iteration
  EXPECT_FALSE(b.layerDone(5, 7));  // no such layer
  EXPECT_EQ(b.wait(milliseconds(1)), (std::vector<int>{0, 1}));
  EXPECT_ERROR_CONTAINS(b.begin(8), InvalidArgument, "beginIteration(8) before waitIteration() finished iteration 7");
  auto waiter = std::async(std::launch::async, [&] { return b.wait(milliseconds(60000)); });
  EXPECT_TRUE(b.layerDone(0, 7));
  EXPECT_TRUE(b.layerDone(1, 7));
  EXPECT_TRUE(waiter.get().empty());
  b.begin(8);
}

// waitLayer: one layer at a time, in any order, while the others are still pending.
TEST(IterationBarrier, WaitLayerReturnsOnceThatLayerIsDone) {
  StickyError error;
  IterationBarrier b(3, error);
  b.begin(4);
  EXPECT_FALSE(b.waitLayer(0, milliseconds(1)));  // pending: the timeout passes
  EXPECT_FALSE(b.isDone(0));
  auto waiter = std::async(std::launch::async, [&] { return b.waitLayer(0, milliseconds(600000)); });
  EXPECT_TRUE(b.layerDone(2, 4));  // another layer does not wake it for good
  EXPECT_TRUE(b.layerDone(0, 4));
  EXPECT_TRUE(waiter.get());
  EXPECT_TRUE(b.isDone(0));
  EXPECT_TRUE(b.waitLayer(2, milliseconds(1)));
  EXPECT_FALSE(b.waitLayer(1, milliseconds(1)));
  EXPECT_ERROR_CONTAINS(b.waitLayer(3, milliseconds(1)), InvalidArgument, "waitLayer: layer 3 outside 0..2");
  EXPECT_ERROR_CONTAINS(b.begin(5), InvalidArgument, "before waitIteration() finished iteration 4");
  EXPECT_TRUE(b.layerDone(1, 4));
  b.begin(5);  // every layer in: the next iteration may start
  EXPECT_FALSE(b.isDone(0));
  EXPECT_TRUE(error.set(std::make_exception_ptr(AbortedError("peer 2 failed"))));
  b.wake();
  EXPECT_ERROR_CONTAINS(b.waitLayer(1, milliseconds(600000)), AbortedError, "peer 2 failed");
}

TEST(IterationBarrier, AFailureWakesTheWaiterWithItsType) {
  StickyError error;
  IterationBarrier b(1, error);
  b.begin(0);
  auto waiter = std::async(std::launch::async, [&] { b.wait(milliseconds(600000)); });
  EXPECT_TRUE(error.set(std::make_exception_ptr(TimeoutError("first"))));
  EXPECT_FALSE(error.set(std::make_exception_ptr(AbortedError("second"))));  // the first one stays
  b.wake();
  EXPECT_ERROR_CONTAINS(waiter.get(), TimeoutError, "first");
  EXPECT_ERROR_CONTAINS(error.check(), TimeoutError, "first");
  EXPECT_EQ(error.message(), "first");
}

// A wait's length as the timeouts say it: the node waits the timeout plus two heartbeats (so that a
// lost peer is named first), 6666 ms for a 5 s timeout, which its messages said as "6.666 s".
TEST(Liveness, AWaitIsSaidToATenthOfASecond) {
  const milliseconds timeout(5000);
  EXPECT_EQ(secondsText(timeout + 2 * Liveness::heartbeatFor(timeout)), "6.7 s");
  EXPECT_EQ(secondsText(milliseconds(30000)), "30 s");
  EXPECT_EQ(secondsText(milliseconds(1500)), "1.5 s");
  EXPECT_EQ(secondsText(milliseconds(1949)), "1.9 s");
  EXPECT_EQ(secondsText(milliseconds(1950)), "2 s");
  EXPECT_EQ(secondsText(milliseconds(99)), "99 ms");
  EXPECT_EQ(secondsText(milliseconds(100)), "0.1 s");
}

}  // namespace
}  // namespace poseidon
