// The data endpoint's receive buffer (VanOptions::receiveBufferBytes): set
// before bind so that every accepted connection inherits it, and a small one
// still carries messages far larger than itself.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "poseidon/common/error.h"
#include "poseidon/transport/van.h"
#include "poseidon/wire/frame.h"

namespace poseidon {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(VanWindow, TheReceiveBufferIsSetOnTheDataEndpoint) {
  zmq::context_t ctx;
  VanOptions o;
  Van plain(ctx, o);
  EXPECT_EQ(plain.receiveBufferBytes(), -1);  // libzmq's "OS default"
  o.receiveBufferBytes = 16384;
  Van small(ctx, o);
  EXPECT_EQ(small.receiveBufferBytes(), 16384);
  o.receiveBufferBytes = -2;
  EXPECT_THAT([&] { Van bad(ctx, o); },
              ThrowsMessage<InvalidArgument>(
                  HasSubstr("the receive buffer must be >= -1 bytes (0: automatic, -1: the OS default), got -2")));
}

// With priority links the receive buffer defaults to the send window and a third (it bounds what
// each sender has in flight toward this node's port); FIFO links and -1 keep the OS's.
TEST(VanWindow, PriorityLinksGetTheSendWindowAndAThirdToReceive) {
  zmq::context_t ctx;
  VanOptions o;
  EXPECT_EQ(Van::kernelReceiveBuffer(o), 0);  // FIFO links: the OS's
  o.sendWindowBytes = 9216;
  EXPECT_EQ(Van::kernelReceiveBuffer(o), 12288);
  Van automatic(ctx, o);
  EXPECT_EQ(automatic.receiveBufferBytes(), 12288);
  o.receiveBufferBytes = VanOptions::kOsReceiveBuffer;
  EXPECT_EQ(Van::kernelReceiveBuffer(o), 0);
  Van os(ctx, o);
  EXPECT_EQ(os.receiveBufferBytes(), -1);
  o.receiveBufferBytes = 65536;  // given: as given, whatever the window
  Van given(ctx, o);
  EXPECT_EQ(given.receiveBufferBytes(), 65536);
}

TEST(VanWindow, ASmallWindowStillCarriesALargeMessage) {
  zmq::context_t ctx;
  VanOptions o;
  o.receiveBufferBytes = 4096;
  Van a(ctx, o), b(ctx, o);
  std::vector<std::string> endpoints{a.endpoint(), b.endpoint()};
  a.connectPeers(0, endpoints, 7);
  b.connectPeers(1, endpoints, 7);
  std::vector<uint8_t> payload(4 << 20);  // 4 MB through a 4 KB window
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 31 + 7);
  FrameHeader h;
  h.type = MsgType::kHeartbeat;
  a.send(1, h, payload.data(), payload.size());
  Message m;
  bool got = false;
  for (int i = 0; i < 100 && !got; ++i) got = b.poll(&m, 1000);  // up to 100 s on a loaded machine
  ASSERT_TRUE(got);
  EXPECT_EQ(m.header.sender, 0u);
  ASSERT_EQ(m.size(), payload.size());
  EXPECT_EQ(std::vector<uint8_t>(m.data(), m.data() + m.size()), payload);
}

// Past VanOptions::nodeSendWindows peers, each connection's kernel send buffer is its share of the
// node's windows (they all drain into one egress queue); fragments keep the window's size.
TEST(VanWindow, TheNodesSendWindowsAreSharedPastSixteenPeers) {
  VanOptions o;
  EXPECT_EQ(Van::kernelSendWindow(o, 31), 0);  // FIFO links: the OS's buffers
  o.sendWindowBytes = 8192;
  EXPECT_EQ(Van::kernelSendWindow(o, 1), 8192);
  EXPECT_EQ(Van::kernelSendWindow(o, 16), 8192);
  EXPECT_EQ(Van::kernelSendWindow(o, 20), 8192 * 16 / 20);  // 6553
  EXPECT_EQ(Van::kernelSendWindow(o, 31), 8192 * 16 / 31);  // 4228
  EXPECT_EQ(Van::kernelSendWindow(o, 63), Van::kMinSendWindow);
  o.nodeSendWindows = 0;
  EXPECT_EQ(Van::kernelSendWindow(o, 63), 8192);

  // On the sockets: a world of 33 (32 peers), nothing listening at the peers' addresses (ZeroMQ
  // connects in the background and sends nothing here).
  zmq::context_t ctx;
  o.nodeSendWindows = VanOptions::kDefaultNodeSendWindows;
  o.lingerMs = 0;
  Van a(ctx, o);
  std::vector<std::string> endpoints{a.endpoint()};
  for (int r = 1; r < 33; ++r) endpoints.push_back("tcp://127.0.0.1:1");
  a.connectPeers(0, endpoints, 7);
  EXPECT_EQ(a.sendBufferBytes(1), 4096);
  EXPECT_EQ(a.sendBufferBytes(32), 4096);
  Van few(ctx, o);
  few.connectPeers(0, {few.endpoint(), "tcp://127.0.0.1:1", "tcp://127.0.0.1:1"}, 7);
  EXPECT_EQ(few.sendBufferBytes(2), 8192);

  o.nodeSendWindows = -1;
  EXPECT_THAT([&] { Van bad(ctx, o); },
              ThrowsMessage<InvalidArgument>(HasSubstr("the node's send windows must be >= 0")));
}

}  // namespace
}  // namespace poseidon
