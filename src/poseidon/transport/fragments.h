// Fragments of one message (priority scheduling, docs/scheduling.md): a message larger than the
// send window travels as several [header][slice][where] messages, `where` being 16 bytes: the
// sender's message id and the slice's offset (u64 each, little-endian). The scheduler cuts
// (transport/scheduler.cc); the Reassembler puts them together again on the receive thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <zmq.hpp>

#include "poseidon/wire/frame.h"

namespace poseidon {

constexpr size_t kFragmentBytes = 16;
zmq::message_t encodeFragmentWhere(uint64_t id, uint64_t offset);

// Receive thread only.
class Reassembler {
 public:
  static constexpr size_t kMaxPartials = 4096;  // open fragmented messages, over every sender
  // One fragment of the message `h` (already validated as a header). Returns true with *payload set
  // when it completed its message; false when more are to come, or with *why set when the fragment
  // is refused (the message it belonged to is dropped).
  bool add(const FrameHeader& h, zmq::message_t& chunk, const zmq::message_t& where, zmq::message_t* payload,
           std::string* why);

 private:
  struct Partial {
    FrameHeader header;
    zmq::message_t payload;
    uint64_t received = 0;
  };
  std::map<std::pair<uint32_t, uint64_t>, Partial> partials_;  // (sender, message id)
};

}  // namespace poseidon
