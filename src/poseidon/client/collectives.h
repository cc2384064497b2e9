// Collectives over the data endpoints: broadcast (rank 0's initial
// parameters, small all-sums built from it) and barrier (finish). Every rank
// makes the same collective calls in the same order; a sequence number per
// call keeps their messages apart (wire::collectiveSequence).
//
// Messages arrive on the receive loop before or after the user's thread asks
// for them, so they wait in a mailbox keyed by (type, sequence).
//
// Threads: broadcast() and barrier() on the user's thread (one at a time);
// deliver() on the receive loop; wake() from whoever records the job's
// failure. mutex_ is a leaf lock; sends happen without it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "poseidon/client/layer_buffer.h"
#include "poseidon/common/sticky_error.h"
#include "poseidon/coordinator/book.h"
#include "poseidon/transport/van.h"

namespace poseidon {

class Collectives {
 public:
  // `fail` records the job's failure (and wakes this object); `timeout`
  // bounds every wait.
  Collectives(Van& van, const InformationBook& book, int rank, const StickyError& error,
              std::function<void(std::exception_ptr)> fail, std::chrono::milliseconds timeout);

  // Receive loop: a broadcast chunk or barrier message. ProtocolError when the
  // mailbox overflows (a peer flooding us).
  void deliver(Message&& msg);
  // Copies root's buffer into every other rank's buffer (same size on all),
  // in chunks of the KV pair size.
  void broadcast(int root, LayerBuffer buffer);
  // throughOwnLoop: this rank also sends itself the barrier message (through the Van's loopback, in
  // order after what it sent itself before) and waits for it, so it leaves the barrier only after its
  // own receive loop has handled everything it sent itself before entering (Node::settleBarrier).
  // finishedAt: see wire::barrier (Node::finish).
  void barrier(bool throughOwnLoop = false, int64_t finishedAt = -1);
  // Sums a few numbers over all ranks (each rank broadcasts its own in turn; doubles travel bit
  // for bit). For counts and statistics, not gradients.
  std::vector<double> allSum(const std::vector<double>& mine);
  void wake();

 private:
  // Waits for `count` messages of this call; a timeout fails the job naming
  // the ranks that did not send.
  std::vector<Message> take(MsgType type, uint32_t sequence, size_t count, const char* what);

  Van& van_;
  const InformationBook& book_;
  const int rank_;
  const StickyError& error_;
  std::function<void(std::exception_ptr)> fail_;
  const std::chrono::milliseconds timeout_;
  uint32_t sequence_ = 0;  // user thread only
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::pair<MsgType, uint32_t>, std::vector<Message>> mail_;  // guarded by mutex_
};

}  // namespace poseidon
