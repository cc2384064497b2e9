#include "poseidon/wire/frame.h"

#include "poseidon/common/bytes.h"
#include "poseidon/common/error.h"

namespace poseidon {

const char* msgTypeName(MsgType t) {
  switch (t) {
    case MsgType::kJoin: return "join";
    case MsgType::kBook: return "book";
    case MsgType::kJoinError: return "join-error";
    case MsgType::kPsPush: return "ps-push";
    case MsgType::kPsAggregate: return "ps-aggregate";
    case MsgType::kSfbFactors: return "sfb-factors";
    case MsgType::kAdamFactors: return "adam-factors";
    case MsgType::kAdamAggregate: return "adam-aggregate";
    case MsgType::kSfbNotice: return "sfb-notice";
    case MsgType::kSfbDecision: return "sfb-decision";
    case MsgType::kGroupPush: return "group-push";
    case MsgType::kPull: return "pull";
    case MsgType::kPullReply: return "pull-reply";
    case MsgType::kModelInit: return "model-init";
    case MsgType::kStateRequest: return "state-request";
    case MsgType::kStateReply: return "state-reply";
    case MsgType::kFcForward: return "fc-forward";
    case MsgType::kFcBackward: return "fc-backward";
    case MsgType::kBroadcast: return "broadcast";
    case MsgType::kBarrier: return "barrier";
    case MsgType::kHeartbeat: return "heartbeat";
    case MsgType::kAbort: return "abort";
    case MsgType::kBye: return "bye";
  }
  return "unknown";
}

bool isKnownMsgType(uint16_t t) {
  switch (static_cast<MsgType>(t)) {
    case MsgType::kJoin:
    case MsgType::kBook:
    case MsgType::kJoinError:
    case MsgType::kPsPush:
    case MsgType::kPsAggregate:
    case MsgType::kSfbFactors:
    case MsgType::kAdamFactors:
    case MsgType::kAdamAggregate:
    case MsgType::kSfbNotice:
    case MsgType::kSfbDecision:
    case MsgType::kGroupPush:
    case MsgType::kPull:
    case MsgType::kPullReply:
    case MsgType::kModelInit:
    case MsgType::kStateRequest:
    case MsgType::kStateReply:
    case MsgType::kFcForward:
    case MsgType::kFcBackward:
    case MsgType::kBroadcast:
    case MsgType::kBarrier:
    case MsgType::kHeartbeat:
    case MsgType::kAbort:
    case MsgType::kBye:
      return true;
  }
  return false;
}

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
  return strCat(msgTypeName(h.type), " from rank ", h.sender, " layer ", h.layer, " iteration ", h.iteration,
                " pair ", h.pair, " (", h.payloadBytes, " bytes)");
}

}  // namespace poseidon
