// Reading one whole ZeroMQ multipart message.
#pragma once

#include <zmq.hpp>

#include <vector>

namespace poseidon {

// Reads one multipart message without blocking, keeping at most `keep`
// parts; the rest are read and dropped, so a malformed message from a peer is
// consumed whole and the next one starts clean. Empty when nothing waits.
inline std::vector<zmq::message_t> recvMultipart(zmq::socket_t& socket, size_t keep) {
  std::vector<zmq::message_t> parts;
  for (;;) {
    zmq::message_t m;
    if (!socket.recv(m, zmq::recv_flags::dontwait)) break;
    bool more = m.more();
    if (parts.size() < keep) parts.push_back(std::move(m));
    if (!more) break;
  }
  return parts;
}

}  // namespace poseidon
