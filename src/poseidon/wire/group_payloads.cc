#include "poseidon/wire/group_payloads.h"

#include "poseidon/common/bytes.h"
#include "poseidon/common/error.h"
#include "poseidon/wire/messages.h"

namespace poseidon::wire {

namespace {
void checkSize(size_t size, size_t expected, const std::string& what) {
  if (size != expected) throw ProtocolError(strCat(what, " has ", size, " bytes"));
}
}  // namespace

std::vector<uint8_t> encodeClocks(const std::vector<int64_t>& clocks) {
  ByteWriter w;
  for (int64_t c : clocks) w.i64(c);
  return w.take();
}

std::vector<uint8_t> encodeVersion(int64_t version) {
  ByteWriter w;
  w.i64(version);
  return w.take();
}

std::vector<uint8_t> encodeLearningRate(float lr) {
  ByteWriter w;
  w.f32(lr);
  return w.take();
}

ModelStateView decodeModelState(const uint8_t* data, size_t size, size_t floats, size_t groups,
                                const std::string& what) {
  const size_t floatBytes = floats * kFloatBytes;
  checkSize(size, 2 * floatBytes + groups * sizeof(int64_t), what);
  ModelStateView view;
  view.w = data;
  view.v = data + floatBytes;
  ByteReader r(data + 2 * floatBytes, groups * sizeof(int64_t));
  for (size_t g = 0; g < groups; ++g) view.clocks.push_back(r.i64());
  return view;
}

PullReplyView decodePullReply(const uint8_t* data, size_t size, size_t floats, const std::string& what) {
  const size_t floatBytes = floats * kFloatBytes;
  checkSize(size, floatBytes + sizeof(int64_t), what);
  ByteReader r(data + floatBytes, sizeof(int64_t));
  return {data, r.i64()};
}

GroupPushView decodeGroupPush(const uint8_t* data, size_t size, size_t floats, const std::string& what) {
  const size_t floatBytes = floats * kFloatBytes;
  checkSize(size, floatBytes + sizeof(float), what);
  ByteReader r(data + floatBytes, sizeof(float));
  return {data, r.f32()};
}

}  // namespace poseidon::wire
