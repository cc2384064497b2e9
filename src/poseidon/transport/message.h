// One message as the transport delivers it: the validated header, the
// payload, and where it came from.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <zmq.hpp>

#include "poseidon/wire/frame.h"

namespace poseidon {

struct Message {
  FrameHeader header;
  zmq::message_t payload;
  std::string peer;  // remote address for logs ("127.0.0.1" or "loopback")
  const uint8_t* data() const { return static_cast<const uint8_t*>(payload.data()); }
  size_t size() const { return payload.size(); }
};

}  // namespace poseidon
