// The options of one rank of a job whose ranks are threads of this test process (each with its own
// node and sockets, meeting at 127.0.0.1:port).
#pragma once

#include <chrono>
#include <cstdint>

#include "poseidon/torch/distributed.h"

namespace poseidon::testing {

inline pt::DistributedOptions threadRankOptions(int rank, int ranks, int port, int64_t batch,
                                                std::chrono::milliseconds timeout = std::chrono::milliseconds(20000)) {
  pt::DistributedOptions o;
  o.node.rank = rank;
  o.node.worldSize = ranks;
  o.node.masterPort = port;
  o.node.timeout = timeout;
  o.node.settings.batch = batch;
  return o;
}

}  // namespace poseidon::testing
