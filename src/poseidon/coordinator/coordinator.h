// Coordinator: rank 0's rendezvous service (paper section 4.1). It collects
// every node's JOIN, checks that they describe one job (world size, model,
// settings), and hands each the same information book with a fresh job id.
// The protocol, both sides, is described in coordinator/rendezvous.h; the
// client side is joinJob() there.
#pragma once

#include <zmq.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "poseidon/transport/security.h"

namespace poseidon {

class Coordinator {
 public:
  // Binds tcp://host:port at once (throws IoError if the port is taken) and
  // starts the coordinator thread.
  // portChosen: the user set the port (MASTER_PORT, --master-port), which the
  // error for a port in use takes into account.
  Coordinator(zmq::context_t& ctx, const std::string& host, int port, int worldSize,
              std::chrono::milliseconds timeout, const CurveKeys* curve = nullptr, bool portChosen = false);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  std::string address() const { return address_; }  // "host:port"

 private:
  void run();
  zmq::context_t& ctx_;
  std::string address_;
  int worldSize_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<zmq::socket_t> socket_;
  std::unique_ptr<HandshakeMonitor> monitor_;  // with a job secret
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace poseidon
