#include "poseidon/wire/frame.h"

#include <gtest/gtest.h>

#include <random>

#include "poseidon/common/bytes.h"

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
