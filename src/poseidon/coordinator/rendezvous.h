// Rendezvous: how nodes find each other and agree on the information book.
//
// Protocol (one round, every step bounded by a timeout):
//   1. Rank 0 hosts the Coordinator on MASTER_ADDR:MASTER_PORT (a ROUTER).
//   2. Every node (rank 0 too) binds its own data endpoint, then sends JOIN
//      {rank, world size, role, data endpoint, model, settings} from a DEALER.
//   3. The coordinator validates each JOIN as it arrives (rank in range, not a
//      duplicate, same world size) and, once all ranks are in, checks that
//      every node has the same model (naming the first differing layer and the
//      ranks) and settings. It then sends the book, with a fresh random job
//      id, to every node; or one JOIN_ERROR with the reason to every node.
//   4. A fatal error (mismatch) ends the rendezvous for everyone at once; a
//      missing rank ends it after the timeout with "waited 30 s for ranks 2,3
//      to join coordinator at host:port".
//   The coordinator keeps running after the book goes out and answers late
//   joiners with an error, until its owner (rank 0's node) stops.
#pragma once

#include <zmq.hpp>

#include <chrono>
#include <string>

#include "poseidon/common/ranks.h"
#include "poseidon/coordinator/book.h"
#include "poseidon/transport/security.h"

namespace poseidon {

struct JoinRequest {
  int rank = 0;
  int worldSize = 1;
  Role role = Role::kBoth;
  std::string endpoint;
  ModelDesc model;
  JobSettings settings;
};

std::vector<uint8_t> encodeJoin(const JoinRequest& req);
JoinRequest decodeJoin(const void* data, size_t size);  // throws ProtocolError

struct RendezvousOptions {
  std::string masterAddr = "127.0.0.1";
  int masterPort = 29500;
  std::chrono::milliseconds timeout{30000};
  const CurveKeys* curve = nullptr;  // job membership; must match the coordinator's
};

// Sends JOIN and waits for the book. Throws the coordinator's error message
// (Error), or TimeoutError when the coordinator does not answer.
InformationBook joinJob(zmq::context_t& ctx, const RendezvousOptions& opts, const JoinRequest& req);

}  // namespace poseidon
