// One server shard of the KV store (paper section 4.1).
//
// The shard owns the KV pairs that the layout (core/kv_layout.h) places on it.
// Per pair and per iteration it keeps a round: the contributions pushed by the
// workers and a counter. When the counter reaches P1 the round is complete
// and the shard returns the sum, which the node sends back to every worker
// (each divides by the number of contributions for the mean).
//
// Summation order is fixed: contributions are added in worker-index order
// (early arrivals wait in a side buffer), so the aggregate is bit-identical
// from run to run, whatever order the network delivered the pushes in.
//
// Pushes for a future iteration (a fast worker already in t+1 while this
// pair's round t is still open) open their own round; they are never mixed
// into round t. Pushes for a pair this shard does not own, with the wrong
// length, too far in the future, or duplicated, are rejected with
// ProtocolError and change nothing.
//
// Straggler mode (JobSettings::dropStragglers = D > 0): once a round has
// P1 - D contributions it waits at most stragglerTimeoutMs for the rest, then
// expire() completes it with what it has (the result carries the contributor
// set; workers divide by its size, an unbiased mean of what was received).
// A push for a round that already completed is a straggler's late
// contribution: discarded and counted per sender, never mixed into a later
// round. Without straggler mode such a push is a protocol error.
//
// Threads: owned by the node's receive loop; not thread-safe, but push() of different pairs may run
// at once (kvstore/server.h says when the node does that).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "poseidon/common/work_charger.h"
#include "poseidon/coordinator/book.h"
#include "poseidon/wire/precision.h"

namespace poseidon {

// A shard's work on one in-order push: the first contribution decoded into the sum, each later one
// decoded a block at a time and added in place (one pass over the payload and the sum, no
// temporary of the pair's size). bench/device.h measures the rate the bench charges with it.
void accumulateContribution(std::vector<float>& sum, bool& started, const uint8_t* data, int64_t length,
                            WirePrecision wire);

class KvShard {
 public:
  // How many iterations ahead of the last completed round a push may be.
  static constexpr int64_t kMaxAhead = 2;
  using Clock = std::chrono::steady_clock;

  // charger: the bench's charge for the sums (common/work_charger.h); null: none. Not owned.
  KvShard(const InformationBook& book, int shard, WorkCharger* charger = nullptr);

  struct Completed {
    int layer = 0;
    int pair = 0;
    int64_t iteration = 0;
    std::vector<float> sum;
    std::vector<bool> contributors;  // by worker index
  };

  // Accepts one push (payload: the pair's floats in the job's wire precision,
  // JobSettings::wire; summed in fp32 whatever the wire).
  // Returns the aggregate when this push completes the round. `gap` is the
  // sender's count of iterations since this layer's previous PS round
  // (wire::psPush): a push whose iteration minus gap is the pair's last
  // completed round is its next round even after a stretch of SFB rounds.
  std::optional<Completed> push(int senderRank, int layer, int pair, int64_t iteration, const uint8_t* data,
                                size_t bytes, Clock::time_point now = Clock::now(), int64_t gap = 0);
  // Straggler mode: completes the rounds whose straggler deadline has passed.
  std::vector<Completed> expire(Clock::time_point now);

  int shard() const { return shard_; }
  int64_t pairsOwned() const { return static_cast<int64_t>(pairs_.size()); }
  int64_t bytesOwned() const;
  // Rounds still open (diagnostics).
  std::vector<std::string> openRounds() const;

 private:
  struct Round {
    std::vector<float> sum;
    bool started = false;  // sum holds at least one contribution
    int next = 0;          // next worker index to add in order
    std::map<int, std::vector<float>> early;
    std::vector<bool> got;
    int count = 0;
    std::optional<Clock::time_point> deadline;
  };
  struct PairState {
    const KvPair* pair = nullptr;
    int64_t completed = 0;  // last completed iteration
    std::map<int64_t, Round> rounds;
  };
  static uint64_t key(int layer, int pair) { return (static_cast<uint64_t>(layer) << 32) | static_cast<uint32_t>(pair); }
  Completed finish(PairState& st, int64_t iteration);

  const InformationBook& book_;
  int shard_;
  WorkCharger* charger_;
  std::map<uint64_t, PairState> pairs_;
};

}  // namespace poseidon
