// The compute groups' payloads (docs/omnivore.md, docs/wire.md), written and read only here. A
// pair's floats travel as the sender's own memory (scatter-gather parts, no copy); the trailer after
// them is encoded here, and every reader checks the whole length against the layout first:
//   kModelInit, kStateReply   W (n floats), V (n floats), one clock (int64) per group
//   kPullReply                W (n floats), the pair's version (int64)
//   kGroupPush                the gradient (n floats), the learning rate (float32)
// Integers and the learning rate are little-endian (common/bytes.h); the floats are the sender's
// own bytes, sent in place as every data message's are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace poseidon::wire {

std::vector<uint8_t> encodeClocks(const std::vector<int64_t>& clocks);  // model init, state reply
std::vector<uint8_t> encodeVersion(int64_t version);                    // pull reply
std::vector<uint8_t> encodeLearningRate(float lr);                      // group push

// Views into a received payload. The float pointers are into the message (not aligned for float:
// copy with memcpy).
struct ModelStateView {
  const uint8_t* w = nullptr;
  const uint8_t* v = nullptr;
  std::vector<int64_t> clocks;
};
struct PullReplyView {
  const uint8_t* w = nullptr;
  int64_t version = 0;
};
struct GroupPushView {
  const uint8_t* gradient = nullptr;
  float lr = 0;
};

// `floats`: the pair's length n; `what` names the message in the error ("model init for layer 3
// pair 1"). Throw ProtocolError "<what> has <size> bytes" when the size is not the layout's.
ModelStateView decodeModelState(const uint8_t* data, size_t size, size_t floats, size_t groups,
                                const std::string& what);
PullReplyView decodePullReply(const uint8_t* data, size_t size, size_t floats, const std::string& what);
GroupPushView decodeGroupPush(const uint8_t* data, size_t size, size_t floats, const std::string& what);

}  // namespace poseidon::wire
