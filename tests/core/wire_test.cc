#include "poseidon/wire/frame.h"

#include <gtest/gtest.h>

#include <random>

#include "poseidon/common/bytes.h"
#include "poseidon/wire/messages.h"

namespace poseidon {
namespace {

TEST(Wire, HeaderRoundTrip) {
  FrameHeader h;
  h.type = MsgType::kSfbFactors;
  h.job = 0x1122334455667788ull;
  h.sender = 7;
  h.layer = 19;
  h.iteration = -3;
  h.pair = 4;
  h.aux = 32;
  h.payloadBytes = 12345;
  uint8_t buf[kHeaderBytes];
  encodeHeader(h, buf);
  EXPECT_EQ(buf[0], 'P');
  EXPECT_EQ(buf[1], 'S');
  EXPECT_EQ(buf[2], 'D');
  EXPECT_EQ(buf[3], 'N');
  FrameHeader d;
  ASSERT_EQ(decodeHeader(buf, sizeof buf, 1 << 20, &d), "");
  EXPECT_EQ(d.type, MsgType::kSfbFactors);
  EXPECT_EQ(d.job, h.job);
  EXPECT_EQ(d.sender, 7u);
  EXPECT_EQ(d.layer, 19u);
  EXPECT_EQ(d.iteration, -3);
  EXPECT_EQ(d.pair, 4u);
  EXPECT_EQ(d.aux, 32u);
  EXPECT_EQ(d.payloadBytes, 12345u);
}

TEST(Wire, EachBuilderPutsItsFieldsWhereItsReaderFindsThem) {
  FrameHeader f = wire::sfbFactors(3, 41, 32);
  EXPECT_EQ(f.type, MsgType::kSfbFactors);
  EXPECT_EQ(f.layer, 3u);
  EXPECT_EQ(f.iteration, 41);
  EXPECT_EQ(wire::factorRows(f), 32);
  EXPECT_EQ(wire::trafficLayer(f), 3);
  FrameHeader p = wire::psPush(2, 7, 5);
  EXPECT_EQ(p.type, MsgType::kPsPush);
  EXPECT_EQ(p.pair, 5u);
  EXPECT_EQ(wire::psAggregate(2, 7, 5).type, MsgType::kPsAggregate);
  EXPECT_EQ(wire::adamAggregate(2, 7, 5).pair, 5u);
  EXPECT_EQ(wire::factorRows(wire::adamFactors(1, 0, 9)), 9);
  wire::BroadcastChunk c{12, 1000000, 3, 4};
  FrameHeader b = wire::broadcastChunk(c);
  EXPECT_EQ(b.type, MsgType::kBroadcast);
  wire::BroadcastChunk d = wire::broadcastChunkOf(b);
  EXPECT_EQ(d.sequence, 12u);
  EXPECT_EQ(d.totalFloats, 1000000);
  EXPECT_EQ(d.index, 3u);
  EXPECT_EQ(d.count, 4u);
  EXPECT_EQ(wire::collectiveSequence(b), 12u);
  EXPECT_EQ(wire::collectiveSequence(wire::barrier(13)), 13u);
  // Collectives and control belong to no layer, whatever their fields hold.
  EXPECT_EQ(wire::trafficLayer(b), -1);
  EXPECT_EQ(wire::trafficLayer(wire::barrier(0)), -1);
  EXPECT_EQ(wire::trafficLayer(wire::heartbeat(5)), -1);
  EXPECT_EQ(wire::heartbeat(5).iteration, 5);
  EXPECT_TRUE(wire::reportsSenderIteration(MsgType::kHeartbeat));
  EXPECT_FALSE(wire::reportsSenderIteration(MsgType::kBroadcast));
  EXPECT_EQ(wire::join(4).sender, 4u);
  EXPECT_EQ(wire::book(99).job, 99u);
  EXPECT_EQ(wire::joinError().type, MsgType::kJoinError);
}

TEST(Wire, RejectsBadHeaders) {
  FrameHeader h;
  h.type = MsgType::kPsPush;
  uint8_t buf[kHeaderBytes];
  encodeHeader(h, buf);
  FrameHeader d;
  EXPECT_NE(decodeHeader(buf, kHeaderBytes - 1, 100, &d).find("header frame of 47 bytes"), std::string::npos);
  uint8_t bad[kHeaderBytes];
  std::copy(buf, buf + kHeaderBytes, bad);
  bad[0] = 'X';
  EXPECT_NE(decodeHeader(bad, kHeaderBytes, 100, &d).find("bad magic"), std::string::npos);
  std::copy(buf, buf + kHeaderBytes, bad);
  bad[4] = 9;
  EXPECT_NE(decodeHeader(bad, kHeaderBytes, 100, &d).find("wire version 9"), std::string::npos);
  std::copy(buf, buf + kHeaderBytes, bad);
  bad[6] = 99;
  EXPECT_NE(decodeHeader(bad, kHeaderBytes, 100, &d).find("unknown message type 99"), std::string::npos);
  h.payloadBytes = 101;
  encodeHeader(h, buf);
  EXPECT_NE(decodeHeader(buf, kHeaderBytes, 100, &d).find("exceeds the limit"), std::string::npos);
}

TEST(Wire, RandomBytesNeverDecodeAsValidUnlessMagicMatches) {
  std::mt19937 rng(1);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    uint8_t buf[kHeaderBytes];
    for (auto& b : buf) b = static_cast<uint8_t>(rng());
    FrameHeader d;
    accepted += decodeHeader(buf, sizeof buf, 1 << 20, &d).empty();
  }
  EXPECT_EQ(accepted, 0);
}

TEST(Bytes, ReaderBoundsChecked) {
  ByteWriter w;
  w.u32(5);
  w.str("hello");
  w.u64(1);
  auto bytes = w.take();
  ByteReader r(bytes.data(), bytes.size());
  EXPECT_EQ(r.u32(), 5u);
  EXPECT_EQ(r.str(), "hello");
  EXPECT_EQ(r.u64(), 1u);
  EXPECT_NO_THROW(r.expectEnd());
  EXPECT_THROW(r.u8(), ProtocolError);
  ByteReader shortStr(bytes.data() + 4, 6);  // length 5 but only 2 bytes follow
  EXPECT_THROW(shortStr.str(), ProtocolError);
  ByteReader limited(bytes.data() + 4, 9);
  EXPECT_THROW(limited.str(3), ProtocolError);
}

}  // namespace
}  // namespace poseidon
