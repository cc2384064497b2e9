// The priority scheduler of the links (VanOptions::sendWindowBytes > 0; docs/scheduling.md): the
// Van's send() queues a built message here instead of handing it to ZeroMQ, and one sender thread,
// the only user of the DEALERs then, hands ZeroMQ the most urgent queued message whose peer can take
// one: control first, then data of an earlier iteration, then of a lower layer, FIFO within a
// layer. A message larger than the window is queued as fragments of the window's size
// (transport/fragments.h), so an urgent one can pass between them (P3's slicing).
//
// Locks: mutex_ guards the queues, the wake socket's sending end and the sender's state; nothing
// else is locked while it is held but the DEALERs, which only the sender thread uses.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "poseidon/wire/frame.h"

namespace poseidon {

class PriorityScheduler {
 public:
  // The scheduling rank of a message (smaller goes first): control and collectives before
  // everything, then a BSP round's data by (iteration, layer): a node that is ahead must not delay
  // the slower nodes' current iteration with its next one. Compute-group messages keep one class.
  using Priority = std::pair<int64_t, int64_t>;
  static Priority priorityOf(const FrameHeader& header);

  // `links[d]`: the DEALER to rank d (null for this rank) for d < ranks, and with urgent connections
  // (VanOptions::urgentLayers) links[ranks + d] the urgent one to rank d (ranks 0: links.size()).
  // Each takes one message into its pipe (SNDHWM 1) and its send buffer into the kernel (the Van's
  // choice, Van::kernelSendWindow); `windowBytes` is the fragments' size. enqueue()'s
  // `dest` is a link's index. Starts the sender thread.
  PriorityScheduler(zmq::context_t& ctx, std::vector<zmq::socket_t*> links, size_t windowBytes, size_t ranks = 0);
  ~PriorityScheduler();
  PriorityScheduler(const PriorityScheduler&) = delete;
  PriorityScheduler& operator=(const PriorityScheduler&) = delete;

  // Queues a built message to rank `dest` (whole, or in fragments). Thread-safe. Throws IoError once
  // stopped or after the sender failed.
  void enqueue(int dest, const FrameHeader& header, zmq::message_t head, zmq::message_t body);
  // The sender hands over what is queued until `stopBy` (a queue to a dead peer never empties),
  // then its thread ends. Later enqueue()s throw. Idempotent.
  void stop(std::chrono::steady_clock::time_point stopBy);

  // Messages (fragments) queued, not yet handed to ZeroMQ; waitQueuedAtMost waits until at most n
  // are (false: the timeout passed).
  size_t queued();
  bool waitQueuedAtMost(size_t n, std::chrono::milliseconds timeout);
  // Tests: while held, the sender hands nothing over (messages queue up) but the first
  // `letThrough` queued entries.
  void hold(bool hold, size_t letThrough);

 private:
  struct Queued {
    Priority priority;
    uint64_t seq = 0;
    FrameHeader header;
    zmq::message_t head, body, fragment;  // fragment: empty for a whole message
  };
  struct Later {  // the min-heap order: lower priority first, then FIFO
    bool operator()(const std::unique_ptr<Queued>& a, const std::unique_ptr<Queued>& b) const {
      return a->priority != b->priority ? a->priority > b->priority : a->seq > b->seq;
    }
  };
  void senderLoop();
  void senderLoopBody();
  // Hands ZeroMQ what it takes, most urgent first; marks peers that took none.
  void pumpLocked();
  void wakeLocked();

  std::vector<zmq::socket_t*> links_;
  const size_t windowBytes_;
  const size_t ranks_;  // links_[ranks_ + d]: the urgent connection to rank d
  std::mutex mutex_;
  std::condition_variable handedOver_;                        // the sender handed something to ZeroMQ
  std::vector<std::vector<std::unique_ptr<Queued>>> queues_;  // per peer, a heap by Later
  std::vector<bool> blocked_;                                 // the peer's pipe was full; wait for POLLOUT
  size_t queued_ = 0;
  uint64_t nextSeq_ = 0;
  std::atomic<uint64_t> nextFragmentId_{0};  // taken before the lock: fragments are cut outside it
  bool stopping_ = false;
  std::chrono::steady_clock::time_point stopBy_{};  // with stopping_: give up on the queues then
  std::string sendError_;                           // the sender's first failure; later enqueue()s throw it
  bool held_ = false;
  size_t letThrough_ = 0;
  zmq::socket_t wakeIn_, wakeOut_;  // inproc PAIR: an enqueue() wakes the sender's poll
  std::thread sender_;
};

}  // namespace poseidon
