// SfbKeeper: agreement on who contributes to an SFB round when stragglers
// may be dropped (straggler mode only).
//
// Without a straggler, every worker rebuilds the gradient from all P1 factor
// sets and there is nothing to agree on. With straggler dropping, each worker
// would otherwise decide on its own which factors arrived in time, and
// replicas could diverge. So one node keeps each FC layer's rounds (the
// server holding the layer's first KV pair): every worker, as it broadcasts
// its factors, also sends the keeper a notice; the keeper decides the
// contributor set (all P1 at once, or the P1 - D or more it has when the
// straggler timeout expires) and sends that decision to every worker, which
// rebuilds from exactly those factors. A notice for a decided round is a
// straggler's late contribution: counted, and its factors ignored everywhere.
//
// Threads: owned by the node's receive loop; not thread-safe.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <vector>

#include "poseidon/coordinator/book.h"

namespace poseidon {

class SfbKeeper {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int64_t kMaxAhead = 2;

  SfbKeeper(const InformationBook& book, int shard);

  struct Decision {
    int layer = 0;
    int64_t iteration = 0;
    std::vector<bool> contributors;  // by worker index
  };
  std::optional<Decision> notice(int senderRank, int layer, int64_t iteration, Clock::time_point now = Clock::now());
  std::vector<Decision> expire(Clock::time_point now);

 private:
  struct Round {
    std::vector<bool> got;
    int count = 0;
    std::optional<Clock::time_point> deadline;
  };
  Decision decide(int layer, int64_t iteration);
  const InformationBook& book_;
  int shard_;
  std::map<std::pair<int, int64_t>, Round> rounds_;
  std::map<int, int64_t> completed_;  // per layer
};

}  // namespace poseidon
