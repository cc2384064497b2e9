#include "poseidon/client/liveness.h"

#include <algorithm>

#include "poseidon/wire/messages.h"

namespace poseidon {

Liveness::Liveness(int worldSize, int self, std::chrono::milliseconds timeout, std::chrono::milliseconds heartbeat,
                   int64_t startIteration, Clock::time_point now)
    : self_(self),
      timeout_(timeout),
      heartbeat_(heartbeat.count() > 0 ? heartbeat : heartbeatFor(timeout)),
      lastHeard_(static_cast<size_t>(worldSize), now),
      lastIteration_(static_cast<size_t>(worldSize), startIteration),
      departed_(static_cast<size_t>(worldSize), false),
      nextHeartbeat_(now) {}

std::chrono::milliseconds Liveness::heartbeatFor(std::chrono::milliseconds timeout) {
  return std::max(std::chrono::milliseconds(50), std::min(std::chrono::milliseconds(1000), timeout / 6));
}

void Liveness::heard(const FrameHeader& h, Clock::time_point now) {
  const size_t sender = h.sender;
  if (sender >= lastHeard_.size()) return;
  lastHeard_[sender] = now;
  if (wire::reportsSenderIteration(h.type)) lastIteration_[sender] = h.iteration;
  if (h.type == MsgType::kBye) departed_[sender] = true;
}

bool Liveness::heartbeatDue(Clock::time_point now) {
  if (now < nextHeartbeat_) return false;
  nextHeartbeat_ = now + heartbeat_;
  return true;
}

std::vector<Liveness::Lost> Liveness::lostPeers(Clock::time_point now) {
  std::vector<Lost> lost;
  for (size_t r = 0; r < lastHeard_.size(); ++r) {
    if (static_cast<int>(r) == self_ || departed_[r]) continue;
    auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - lastHeard_[r]);
    if (silent > timeout_) {
      lost.push_back({static_cast<int>(r), silent, lastIteration_[r]});
      departed_[r] = true;  // report each lost peer once
    }
  }
  return lost;
}

}  // namespace poseidon
