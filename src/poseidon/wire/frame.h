// Poseidon's wire format.
//
// A message is two ZeroMQ frames: a fixed 48-byte header and a payload
// (possibly empty). All integers little-endian:
//
//   offset size field
//   0      4    magic        'PSDN' (0x4E445350)
//   4      2    version      kWireVersion
//   6      2    type         MsgType
//   8      8    job          job id chosen by the coordinator (0 before the book)
//   16     4    sender       sender's rank
//   20     4    layer        layer index (or 0)
//   24     8    iteration    training iteration (signed)
//   32     4    pair         KV pair index within the layer (or 0)
//   36     4    aux          type-specific: SFB rows K, broadcast chunk, ...
//   40     8    payloadBytes length of the payload frame
//
// decodeHeader() validates everything that can be checked without context
// (size, magic, version, known type, payload bound); the receiver validates
// the rest (sender rank, layer, pair, iteration window, payload length for
// that pair) before anything is stored. A bad frame is dropped and logged,
// never fatal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace poseidon {

constexpr uint32_t kWireMagic = 0x4E445350;  // "PSDN" in little-endian bytes
constexpr uint16_t kWireVersion = 1;
constexpr size_t kHeaderBytes = 48;
constexpr uint64_t kDefaultMaxPayloadBytes = 1ull << 30;

enum class MsgType : uint16_t {
  // rendezvous (coordinator endpoint)
  kJoin = 1,       // node -> coordinator: who I am, my model
  kBook = 2,       // coordinator -> node: the information book
  kJoinError = 3,  // coordinator -> node: why the job cannot start
  // parameter server
  kPsPush = 10,       // worker -> shard: gradient slice of one KV pair
  kPsAggregate = 11,  // shard -> worker: summed slice, once P1 pushes arrived
  // sufficient-factor broadcasting
  kSfbFactors = 20,  // worker -> worker: U (K x M) then V (K x N)
  // Project Adam's scheme (benchmark baseline only)
  kAdamFactors = 21,    // worker -> the layer's one server: U then V
  kAdamAggregate = 22,  // that server -> worker: one KV pair of the summed full matrix
  // straggler mode: agreeing on an SFB round's contributors
  kSfbNotice = 23,    // worker -> the layer's keeper: my factors are out
  kSfbDecision = 24,  // keeper -> every worker: the contributor mask
  // compute-group mode: the shards hold the model (kvstore/model_shard.h)
  kGroupPush = 50,     // worker -> shard: its gradient of one KV pair for its group's round
  kPull = 51,          // worker -> shard: the pair's parameters, please, for its group's round
  kPullReply = 52,     // shard -> worker: the pair's parameters and version
  kModelInit = 53,     // first worker -> shard: a pair's starting state (parameters, momentum, clocks)
  kStateRequest = 54,  // first worker -> shard: every pair's state, please (checkpoints)
  kStateReply = 55,    // shard -> first worker: one pair's state (laid out as model-init)
  // merged FC (client/fc_channel.h): the FC layers on one FC server, model-parallel
  kFcForward = 56,   // worker -> FC server: its conv output and labels for its round
  kFcBackward = 57,  // FC server -> worker: the loss and its gradient w.r.t. that output

  kLocalPush = 60,     // a machine's member -> its leader: one chunk of its gradient or factors
  kLocalResult = 61,   // leader -> its members: one chunk of the layer's mean gradient
  kLocalFactors = 62,  // leader -> its members: one chunk of every worker's factors, stacked (SFB)
  // collectives and control (data endpoint)
  kBroadcast = 30,  // root -> all: chunk of a broadcast buffer
  kBarrier = 31,    // all -> all: reached a named barrier
  kHeartbeat = 40,
  kAbort = 41,  // a node failed; payload is the reason
  kBye = 42,    // a node is done and will not send again
};

const char* msgTypeName(MsgType t);
bool isKnownMsgType(uint16_t t);

struct FrameHeader {
  uint32_t magic = kWireMagic;
  uint16_t version = kWireVersion;
  MsgType type = MsgType::kHeartbeat;
  uint64_t job = 0;
  uint32_t sender = 0;
  uint32_t layer = 0;
  int64_t iteration = 0;
  uint32_t pair = 0;
  uint32_t aux = 0;
  uint64_t payloadBytes = 0;
};

void encodeHeader(const FrameHeader& h, uint8_t out[kHeaderBytes]);

// Returns an empty string on success, otherwise why the header is invalid.
// Checks: size == kHeaderBytes, magic, version, known type,
// payloadBytes <= maxPayloadBytes.
std::string decodeHeader(const void* data, size_t size, uint64_t maxPayloadBytes, FrameHeader* out);

std::string describe(const FrameHeader& h);  // for logs

}  // namespace poseidon
