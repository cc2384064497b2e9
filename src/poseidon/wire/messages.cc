#include "poseidon/wire/messages.h"

#include <cstdint>

#include "poseidon/wire/message_table.h"

namespace poseidon::wire {

namespace {
FrameHeader make(MsgType type, int layer = 0, int64_t iteration = 0, int pair = 0, int64_t aux = 0) {
  FrameHeader h;
  h.type = type;
  h.layer = static_cast<uint32_t>(layer);
  h.iteration = iteration;
  h.pair = static_cast<uint32_t>(pair);
  h.aux = static_cast<uint32_t>(aux);
  return h;
}
}  // namespace

FrameHeader join(int rank) {
  FrameHeader h = make(MsgType::kJoin);
  h.sender = static_cast<uint32_t>(rank);
  return h;
}

FrameHeader book(uint64_t job) {
  FrameHeader h = make(MsgType::kBook);
  h.job = job;
  return h;
}

FrameHeader joinError(bool timedOut) {
  FrameHeader h = make(MsgType::kJoinError);
  h.aux = timedOut ? 1 : 0;
  return h;
}

bool joinTimedOut(const FrameHeader& h) { return h.aux == 1; }

FrameHeader psPush(int layer, int64_t iteration, int pair, int64_t gap) {
  // A gap that does not fit the field is sent as unknown.
  return make(MsgType::kPsPush, layer, iteration, pair, gap > 0 && gap <= UINT32_MAX ? gap : 0);
}

int64_t psGap(const FrameHeader& h) { return h.aux; }

FrameHeader psAggregate(int layer, int64_t iteration, int pair) {
  return make(MsgType::kPsAggregate, layer, iteration, pair);
}

FrameHeader sfbFactors(int layer, int64_t iteration, int64_t rows) {
  return make(MsgType::kSfbFactors, layer, iteration, 0, rows);
}

FrameHeader localPush(int layer, int64_t iteration, int chunk, int64_t rows) {
  return make(MsgType::kLocalPush, layer, iteration, chunk, rows);
}

FrameHeader localResult(int layer, int64_t iteration, int chunk) {
  return make(MsgType::kLocalResult, layer, iteration, chunk);
}

FrameHeader localFactors(int layer, int64_t iteration, int chunk, int64_t rows) {
  return make(MsgType::kLocalFactors, layer, iteration, chunk, rows);
}

FrameHeader adamFactors(int layer, int64_t iteration, int64_t rows) {
  return make(MsgType::kAdamFactors, layer, iteration, 0, rows);
}

FrameHeader adamAggregate(int layer, int64_t iteration, int pair) {
  return make(MsgType::kAdamAggregate, layer, iteration, pair);
}

FrameHeader sfbNotice(int layer, int64_t iteration) { return make(MsgType::kSfbNotice, layer, iteration); }

FrameHeader sfbDecision(int layer, int64_t iteration) { return make(MsgType::kSfbDecision, layer, iteration); }

FrameHeader groupPush(int layer, int64_t round, int pair) { return make(MsgType::kGroupPush, layer, round, pair); }
FrameHeader pull(int layer, int64_t round, int pair) { return make(MsgType::kPull, layer, round, pair); }
FrameHeader pullReply(int layer, int64_t round, int pair) { return make(MsgType::kPullReply, layer, round, pair); }
FrameHeader modelInit(int layer, int pair, int64_t version) { return make(MsgType::kModelInit, layer, version, pair); }
FrameHeader stateRequest() { return make(MsgType::kStateRequest); }
FrameHeader stateReply(int layer, int pair, int64_t version) { return make(MsgType::kStateReply, layer, version, pair); }
FrameHeader fcForward(int64_t round) { return make(MsgType::kFcForward, 0, round); }
FrameHeader fcBackward(int64_t round) { return make(MsgType::kFcBackward, 0, round); }

FrameHeader broadcastChunk(const BroadcastChunk& c) {
  FrameHeader h = make(MsgType::kBroadcast);
  h.layer = c.sequence;
  h.iteration = c.totalFloats;
  h.pair = c.index;
  h.aux = c.count;
  return h;
}

BroadcastChunk broadcastChunkOf(const FrameHeader& h) {
  BroadcastChunk c;
  c.sequence = h.layer;
  c.totalFloats = h.iteration;
  c.index = h.pair;
  c.count = h.aux;
  return c;
}

FrameHeader barrier(uint32_t sequence, int64_t finishedAt) {
  FrameHeader h = make(MsgType::kBarrier);
  h.layer = sequence;
  if (finishedAt >= 0) {
    h.iteration = finishedAt;
    h.aux = 1;
  }
  return h;
}

uint32_t collectiveSequence(const FrameHeader& h) { return h.layer; }

int64_t barrierFinishedAt(const FrameHeader& h) { return h.aux == 1 && h.iteration >= 0 ? h.iteration : -1; }

FrameHeader heartbeat(int64_t iteration) { return make(MsgType::kHeartbeat, 0, iteration); }
FrameHeader abort(int64_t iteration) { return make(MsgType::kAbort, 0, iteration); }
FrameHeader bye(int64_t iteration) { return make(MsgType::kBye, 0, iteration); }

int64_t factorRows(const FrameHeader& h) { return h.aux; }

bool isRoundData(MsgType type) { return messageInfo(type).sendClass == SendClass::kRound; }

int trafficLayer(const FrameHeader& h) { return messageInfo(h.type).layerTraffic ? static_cast<int>(h.layer) : -1; }

bool reportsSenderIteration(MsgType type) { return messageInfo(type).reportsSenderIteration; }

}  // namespace poseidon::wire
