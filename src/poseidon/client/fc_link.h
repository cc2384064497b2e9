// FcLink: merged FC over the transport (Omnivore section V-A; docs/omnivore.md).
// The FC layers live on the FC server (kFcServerRank), which runs them for
// every worker's round; FcChannel (client/fc_channel.h) holds the mailboxes,
// this class moves the payloads between ranks and turns a wait that runs out
// into the job's error.
//
// Threads: exchange() on a worker's user thread; nextRequest() and
// sendReply() on the FC server's own thread; onForward/onBackward on the
// receive loop; wake() from whoever records the job's failure.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <vector>

#include "poseidon/client/fc_channel.h"
#include "poseidon/common/sticky_error.h"
#include "poseidon/transport/van.h"

namespace poseidon {

class FcLink {
 public:
  // fail records the job's failure (Node::fail); throwIfFailed rethrows it (Node::throwIfFailed).
  FcLink(Van& van, int rank, int worldSize, bool isWorker, const StickyError& error,
         std::function<void(std::exception_ptr)> fail, std::function<void()> throwIfFailed,
         std::chrono::milliseconds waitTimeout);

  // Worker: sends its round's fc-forward payload to the FC server and returns the fc-backward
  // payload (TimeoutError after the job's timeout, naming the FC server; or the job's error).
  std::vector<uint8_t> exchange(int64_t round, std::vector<uint8_t> request);
  // The FC server's own thread: the next request, waiting up to `wait` (false: none came).
  bool nextRequest(FcChannel::Request* out, std::chrono::milliseconds wait);
  void sendReply(int dest, int64_t round, const std::vector<uint8_t>& reply);

  // Receive loop: ProtocolError for a message this rank must not get.
  void onForward(Message& msg);
  void onBackward(Message& msg);
  void wake() { channel_.wake(); }

 private:
  Van& van_;
  const int rank_;
  const bool isWorker_;
  std::function<void(std::exception_ptr)> fail_;
  std::function<void()> throwIfFailed_;
  const std::chrono::milliseconds waitTimeout_;
  FcChannel channel_;
};

}  // namespace poseidon
