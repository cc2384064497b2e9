#include "poseidon/wire/frame.h"

#include "poseidon/common/bytes.h"
#include "poseidon/common/error.h"
#include "poseidon/wire/message_table.h"

namespace poseidon {

const char* msgTypeName(MsgType t) {
  const wire::MessageInfo* m = wire::findMessage(static_cast<uint16_t>(t));
  return m ? m->name : "unknown";
}

bool isKnownMsgType(uint16_t t) { return wire::findMessage(t) != nullptr; }

void encodeHeader(const FrameHeader& h, uint8_t out[kHeaderBytes]) {
  ByteWriter w;
  w.u32(h.magic);
  w.u16(h.version);
  w.u16(static_cast<uint16_t>(h.type));
  w.u64(h.job);
  w.u32(h.sender);
  w.u32(h.layer);
  w.i64(h.iteration);
  w.u32(h.pair);
  w.u32(h.aux);
  w.u64(h.payloadBytes);
  const auto& b = w.bytes();
  std::copy(b.begin(), b.end(), out);
}

std::string decodeHeader(const void* data, size_t size, uint64_t maxPayloadBytes, FrameHeader* out) {
  if (size != kHeaderBytes) return strCat("header frame of ", size, " bytes (expected ", kHeaderBytes, ")");
  ByteReader r(data, size);
  FrameHeader h;
  h.magic = r.u32();
  if (h.magic != kWireMagic) return strCat("bad magic 0x", std::hex, h.magic);
  h.version = r.u16();
  if (h.version != kWireVersion) {
    return strCat("wire version ", h.version, " not supported (this build speaks ", kWireVersion, ")");
  }
  uint16_t type = r.u16();
  if (!isKnownMsgType(type)) return strCat("unknown message type ", type);
  h.type = static_cast<MsgType>(type);
  h.job = r.u64();
  h.sender = r.u32();
  h.layer = r.u32();
  h.iteration = r.i64();
  h.pair = r.u32();
  h.aux = r.u32();
  h.payloadBytes = r.u64();
  if (h.payloadBytes > maxPayloadBytes) {
    return strCat("payload of ", h.payloadBytes, " bytes exceeds the limit of ", maxPayloadBytes);
  }
  *out = h;
  return {};
}

std::string describe(const FrameHeader& h) {
  const char* iteration = wire::messageInfo(h.type).iteration;  // what the field means for this type
  return strCat(msgTypeName(h.type), " from rank ", h.sender, " layer ", h.layer, " ",
                *iteration ? iteration : "iteration field", " ", h.iteration, " pair ", h.pair, " (", h.payloadBytes,
                " bytes)");
}

}  // namespace poseidon
