// The data endpoint's receive buffer (VanOptions::receiveBufferBytes): set
// before bind so that every accepted connection inherits it, and a small one
// still carries messages far larger than itself.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
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

// Past 8 peers the automatic receive buffer is seven eighths of the send window (P - 1 senders' windows
// wait in the receiver's port ahead of the next forward's first layers); a van told the job's size
// binds with it, since accepted connections keep the buffer the endpoint bound with.
TEST(VanWindow, PastEightPeersTheReceiveBufferIsSevenEighthsOfTheWindow) {
  zmq::context_t ctx;
  VanOptions o;
  o.sendWindowBytes = 9216;
  o.worldSize = 9;  // 8 peers: a window and a third
  EXPECT_EQ(Van::kernelReceiveBuffer(o), 12288);
  o.worldSize = 10;  // 9 peers
  EXPECT_EQ(Van::kernelReceiveBuffer(o), 8064);
  o.worldSize = 32;
  EXPECT_EQ(Van::kernelReceiveBuffer(o), 8064);
  Van many(ctx, o);
  EXPECT_EQ(many.receiveBufferBytes(), 8064);
  o.egressQueue = EgressQueue::kTos;  // told two-band: the same (a 16-core machine, bench/results/device-scale/)
  EXPECT_EQ(Van::kernelReceiveBuffer(o), 8064);
  o.worldSize = 9;
  EXPECT_EQ(Van::kernelReceiveBuffer(o), 12288);
  o.worldSize = 32;
  o.egressQueue = EgressQueue::kFifo;
  EXPECT_EQ(Van::kernelReceiveBuffer(o), 8064);
  o.sendWindowBytes = 0;  // FIFO links keep the OS's at any size
  EXPECT_EQ(Van::kernelReceiveBuffer(o), 0);
  o.sendWindowBytes = 9216;
  o.receiveBufferBytes = 16384;  // given: as given
  EXPECT_EQ(Van::kernelReceiveBuffer(o), 16384);
}

// The runtime's default send window (Van::defaultSendWindow): 1 MB, and 256 KB past 8 peers on nodes
// told their queue is two-band, where the switch port toward each receiver holds 31 windows ahead of the
// urgent layers (bench/results/device-scale/window/). Rule 1, files before it, was 1 MB everywhere.
TEST(VanWindow, TheDefaultWindowIsAQuarterPastEightPeersOnTwoBandNodes) {
  EXPECT_EQ(Van::defaultSendWindow(1, false), 1 << 20);
  EXPECT_EQ(Van::defaultSendWindow(31, false), 1 << 20);  // FIFO queue: 1 MB at any size
  EXPECT_EQ(Van::defaultSendWindow(8, true), 1 << 20);    // 9 nodes: still few
  EXPECT_EQ(Van::defaultSendWindow(9, true), 256 << 10);
  EXPECT_EQ(Van::defaultSendWindow(31, true), 256 << 10);
  EXPECT_EQ(Van::defaultSendWindow(31, true, 1), 1 << 20);  // the rule before 2026-12-06

  // -1 (VanOptions::kAutoSendWindow): the van takes it for its job's size and queue when constructed,
  // and its receive buffer follows (seven eighths of 256 KB past 8 peers).
  VanOptions o;
  o.sendWindowBytes = VanOptions::kAutoSendWindow;
  EXPECT_EQ(Van::sendWindowFor(o), 1 << 20);  // the job's size not known: few peers
  o.worldSize = 32;
  EXPECT_EQ(Van::sendWindowFor(o), 1 << 20);  // kAuto: the queue is not told
  o.egressQueue = EgressQueue::kTos;
  EXPECT_EQ(Van::sendWindowFor(o), 256 << 10);
  o.worldSize = 9;
  EXPECT_EQ(Van::sendWindowFor(o), 1 << 20);
  o.sendWindowBytes = 9216;  // chosen: as chosen
  EXPECT_EQ(Van::sendWindowFor(o), 9216);

  zmq::context_t ctx;
  o.sendWindowBytes = VanOptions::kAutoSendWindow;
  o.worldSize = 32;
  o.lingerMs = 0;
  Van many(ctx, o);
  EXPECT_EQ(many.receiveBufferBytes(), (256 << 10) * 7 / 8);
  std::vector<std::string> endpoints{many.endpoint()};
  for (int r = 1; r < 32; ++r) endpoints.push_back("tcp://127.0.0.1:1");
  many.connectPeers(0, endpoints, 7);
  EXPECT_EQ(many.sendBufferBytes(1), (256 << 10) * 31 / 8);  // a window for every 8 peers
  o.egressQueue = EgressQueue::kFifo;
  Van fifo(ctx, o);
  EXPECT_EQ(fifo.receiveBufferBytes(), (1 << 20) * 7 / 8);
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

// Each connection's kernel send buffer is a window for every VanOptions::peersPerSendWindow (8)
// peers, at least one: with many peers each round trip is longer, and a connection sends at most its
// buffer per round trip. Fragments keep the window's size.
TEST(VanWindow, EachConnectionGetsAWindowForEveryEightPeers) {
  VanOptions o;
  EXPECT_EQ(Van::kernelSendWindow(o, 31), 0);  // FIFO links: the OS's buffers
  o.sendWindowBytes = 8192;
  EXPECT_EQ(Van::kernelSendWindow(o, 1), 8192);
  EXPECT_EQ(Van::kernelSendWindow(o, 7), 8192);  // 8 nodes: one window
  EXPECT_EQ(Van::kernelSendWindow(o, 8), 8192);
  EXPECT_EQ(Van::kernelSendWindow(o, 15), 8192 * 15 / 8);  // 16 nodes: 15360
  EXPECT_EQ(Van::kernelSendWindow(o, 31), 8192 * 31 / 8);  // 32 nodes: 31744
  o.peersPerSendWindow = 0;
  EXPECT_EQ(Van::kernelSendWindow(o, 63), 8192);
  o.peersPerSendWindow = 1;  // no overflow past int: clamped
  o.sendWindowBytes = 1 << 30;
  EXPECT_EQ(Van::kernelSendWindow(o, 255), std::numeric_limits<int>::max());

  // On the sockets: a world of 33 (32 peers), nothing listening at the peers' addresses (ZeroMQ
  // connects in the background and sends nothing here).
  zmq::context_t ctx;
  o.sendWindowBytes = 8192;
  o.peersPerSendWindow = VanOptions::kDefaultPeersPerSendWindow;
  o.lingerMs = 0;
  Van a(ctx, o);
  std::vector<std::string> endpoints{a.endpoint()};
  for (int r = 1; r < 33; ++r) endpoints.push_back("tcp://127.0.0.1:1");
  a.connectPeers(0, endpoints, 7);
  EXPECT_EQ(a.sendBufferBytes(1), 8192 * 4);
  EXPECT_EQ(a.sendBufferBytes(32), 8192 * 4);
  Van few(ctx, o);
  few.connectPeers(0, {few.endpoint(), "tcp://127.0.0.1:1", "tcp://127.0.0.1:1"}, 7);
  EXPECT_EQ(few.sendBufferBytes(2), 8192);

  o.peersPerSendWindow = -1;
  EXPECT_THAT([&] { Van bad(ctx, o); },
              ThrowsMessage<InvalidArgument>(
                  HasSubstr("the peers per send window must be >= 0 (0: one window per connection), got -1")));
}

}  // namespace
}  // namespace poseidon
