// Liveness: which peers are alive, by what was last heard from them
// (docs/reliability.md). No I/O: the node's receive loop reports every
// inbound frame with heard(), asks heartbeatDue() whether to send its own
// heartbeat, and lostPeers() which peers have been silent for longer than the
// timeout (each reported once). A peer that said bye has left cleanly and is
// never reported lost.
//
// Threads: the receive loop only.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "poseidon/wire/frame.h"

namespace poseidon {

class Liveness {
 public:
  using Clock = std::chrono::steady_clock;

  // heartbeat 0 picks the default for the timeout (heartbeatFor).
  Liveness(int worldSize, int self, std::chrono::milliseconds timeout, std::chrono::milliseconds heartbeat,
           int64_t startIteration, Clock::time_point now);

  // min(1 s, timeout / 6), at least 50 ms: a lost peer is noticed within the
  // timeout plus a heartbeat or two.
  static std::chrono::milliseconds heartbeatFor(std::chrono::milliseconds timeout);
  std::chrono::milliseconds heartbeat() const { return heartbeat_; }

  void heard(const FrameHeader& h, Clock::time_point now);
  // True once per heartbeat period.
  bool heartbeatDue(Clock::time_point now);

  struct Lost {
    int rank = 0;
    std::chrono::milliseconds silent{0};
    int64_t lastIteration = 0;  // the last iteration it reported
  };
  // Peers silent for longer than the timeout; each is reported once.
  std::vector<Lost> lostPeers(Clock::time_point now);
  // Said bye, or already reported lost: nothing more is expected from it.
  bool departed(int rank) const { return departed_.at(static_cast<size_t>(rank)); }

 private:
  int self_;
  std::chrono::milliseconds timeout_, heartbeat_;
  std::vector<Clock::time_point> lastHeard_;
  std::vector<int64_t> lastIteration_;
  std::vector<bool> departed_;
  Clock::time_point nextHeartbeat_;
};

}  // namespace poseidon
