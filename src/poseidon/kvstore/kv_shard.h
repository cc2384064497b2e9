// One server shard of the KV store (paper section 4.1).
//
// The shard owns the KV pairs that the layout (core/kv_layout.h) places on it.
// Per pair and per iteration it keeps a round: the contributions pushed by the
// workers and a counter. When the counter reaches P1 the round is complete
// and the shard returns the sum, which the node sends back to every worker
// (each divides by P1 for the mean the framework expects).
//
// Summation order is fixed: contributions are added in worker-index order
// (early arrivals wait in a side buffer), so the aggregate is bit-identical
// from run to run, whatever order the network delivered the pushes in.
//
// Pushes for a future iteration (a fast worker already in t+1 while this
// pair's round t is still open) open their own round; they are never mixed
// into round t. Pushes for an iteration that is already complete, too far in
// the future, for a pair this shard does not own, with the wrong length, or
// duplicated, are rejected with ProtocolError and change nothing.
//
// Threads: owned by the node's receive loop; not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "poseidon/coordinator/book.h"

namespace poseidon {

class KvShard {
 public:
  // How many iterations ahead of the last completed round a push may be.
  static constexpr int64_t kMaxAhead = 2;

  KvShard(const InformationBook& book, int shard);

  struct Completed {
    int layer = 0;
    int pair = 0;
    int64_t iteration = 0;
    std::vector<float> sum;
  };

  // Accepts one push (payload: the pair's floats, little-endian IEEE).
  // Returns the aggregate when this push completes the round.
  std::optional<Completed> push(int senderRank, int layer, int pair, int64_t iteration, const uint8_t* data,
                                size_t bytes);

  int shard() const { return shard_; }
  int64_t pairsOwned() const { return static_cast<int64_t>(pairs_.size()); }
  int64_t bytesOwned() const;
  // Rounds still open (diagnostics).
  std::vector<std::string> openRounds() const;

 private:
  struct Round {
    std::vector<float> sum;
    int next = 0;  // next worker index to add
    std::map<int, std::vector<float>> early;
    std::vector<bool> got;
    int count = 0;
  };
  struct PairState {
    const KvPair* pair = nullptr;
    int64_t completed = 0;  // last completed iteration
    std::map<int64_t, Round> rounds;
  };
  static uint64_t key(int layer, int pair) { return (static_cast<uint64_t>(layer) << 32) | static_cast<uint32_t>(pair); }

  const InformationBook& book_;
  int shard_;
  std::map<uint64_t, PairState> pairs_;
};

}  // namespace poseidon
