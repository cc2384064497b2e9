// Project Adam's server side (the benchmark's traffic-balance baseline, not
// part of Poseidon's hybrid scheme): the server that holds a whole FC layer
// collects every worker's sufficient factors for an iteration, rebuilds the
// summed gradient with one GEMM, and the node sends the full matrix back to
// every worker in KV-pair-sized pieces. All of a layer's traffic meets on one
// server, which is what makes Adam's load unbalanced.
//
// Threads: owned by the node's receive loop; not thread-safe.
#pragma once

#include <map>
#include <optional>
#include <vector>
#include <zmq.hpp>

#include "poseidon/common/work_charger.h"
#include "poseidon/coordinator/book.h"
#include "poseidon/sfb/sufficient_factors.h"

namespace poseidon {

class AdamServer {
 public:
  // charger: the bench's charge for the reconstruction (common/work_charger.h); null: none. Not owned.
  AdamServer(const InformationBook& book, int shard, WorkCharger* charger = nullptr);

  struct Completed {
    int layer = 0;
    int64_t iteration = 0;
    std::vector<float> sum;  // weight then bias, summed over workers
  };
  // How many iterations ahead of the layer's last completed round factors may be (as KvShard).
  static constexpr int64_t kMaxAhead = 2;
  // Validates and stores one worker's factors (ProtocolError if they do not fit).
  std::optional<Completed> push(int senderRank, int layer, int64_t iteration, int64_t rows, zmq::message_t&& payload);

 private:
  struct Round {
    std::vector<zmq::message_t> factors;
    std::vector<int64_t> rows;
    std::vector<bool> got;
    int count = 0;
  };
  const InformationBook& book_;
  int shard_;
  WorkCharger* charger_;
  std::map<std::pair<int, int64_t>, Round> rounds_;
  std::map<int, int64_t> completed_;  // per layer: last completed iteration
  FactorScratch scratch_;
};

}  // namespace poseidon
