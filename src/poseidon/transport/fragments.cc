#include "poseidon/transport/fragments.h"

#include <cstring>

#include "poseidon/common/bytes.h"
#include "poseidon/common/error.h"

namespace poseidon {

namespace {
// Whether two fragments' headers describe the same message.
bool sameMessage(const FrameHeader& a, const FrameHeader& b) {
  return a.type == b.type && a.layer == b.layer && a.iteration == b.iteration && a.pair == b.pair && a.aux == b.aux &&
         a.payloadBytes == b.payloadBytes;
}
}  // namespace

zmq::message_t encodeFragmentWhere(uint64_t id, uint64_t offset) {
  ByteWriter w;
  w.u64(id);
  w.u64(offset);
  const std::vector<uint8_t> bytes = w.take();
  return zmq::message_t(bytes.data(), bytes.size());
}

bool Reassembler::add(const FrameHeader& h, zmq::message_t& chunk, const zmq::message_t& where, zmq::message_t* payload,
                      std::string* why) {
  if (where.size() != kFragmentBytes) {
    *why = strCat("fragment frame of ", where.size(), " bytes (expected ", kFragmentBytes, ")");
    return false;
  }
  ByteReader r(where.data(), where.size());
  const uint64_t id = r.u64(), offset = r.u64();
  const auto key = std::make_pair(h.sender, id);
  auto it = partials_.find(key);
  // A connection is FIFO: a message's fragments arrive in order, the first at offset 0.
  const uint64_t expected = it == partials_.end() ? 0 : it->second.received;
  if (offset != expected)
    *why = strCat("fragment of message ", id, " at offset ", offset, ", expected ", expected);
  else if (chunk.size() == 0 || offset + chunk.size() > h.payloadBytes) {
    *why = strCat("fragment of ", chunk.size(), " bytes at offset ", offset, " of a ", h.payloadBytes, "-byte message");
  } else if (it == partials_.end() && partials_.size() >= kMaxPartials) {
    *why = strCat("more than ", kMaxPartials, " fragmented messages open at once");
  } else if (it != partials_.end() && !sameMessage(it->second.header, h)) {
    *why = strCat("fragment of message ", id, " with another header than its first");
  }
  if (!why->empty()) {
    if (it != partials_.end()) partials_.erase(it);
    return false;
  }
  if (it == partials_.end()) {
    Partial p;
    p.header = h;
    try {
      p.payload = zmq::message_t(h.payloadBytes);  // bounded by maxPayloadBytes (decodeHeader)
    } catch (const std::exception& e) {
      *why = strCat("no memory for a ", h.payloadBytes, "-byte fragmented message: ", e.what());
      return false;
    }
    it = partials_.emplace(key, std::move(p)).first;
  }
  Partial& p = it->second;
  std::memcpy(static_cast<uint8_t*>(p.payload.data()) + offset, chunk.data(), chunk.size());
  p.received += chunk.size();
  if (p.received < h.payloadBytes) return false;
  *payload = std::move(p.payload);
  partials_.erase(it);
  return true;
}

}  // namespace poseidon
